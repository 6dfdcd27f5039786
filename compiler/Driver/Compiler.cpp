#include "compiler/Driver/Compiler.h"
#include "compiler/Driver/Registration.h"
#include "compiler/Driver/TrainingJob.h"
#include "compiler/Partition/CostTable.h"
#include "compiler/Partition/Error.h"
#include "compiler/Partition/Partitioner.h"
#include "compiler/Partition/PlanJson.h"
#include "compiler/Schedule/Schedule.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace pipec {

static_assert(partition::kMaxMicrobatches == schedule::kMaxMicrobatches,
              "--microbatches has one bound for the partition and the schedule");

std::optional<Phase> parsePhase(const std::string &name) {
  for (Phase phase : {Phase::NN, Phase::Costs, Phase::Partition, Phase::Autodiff, Phase::Stages})
    if (name == phaseName(phase))
      return phase;
  return std::nullopt;
}

const char *phaseName(Phase phase) {
  switch (phase) {
  case Phase::NN: return "nn";
  case Phase::Costs: return "costs";
  case Phase::Partition: return "partition";
  case Phase::Autodiff: return "autodiff";
  case Phase::Stages: return "stages";
  }
  return "?";
}

namespace {
mlir::OpPrintingFlags printingFlags(const CompileOptions &options) {
  mlir::OpPrintingFlags flags;
  if (options.elideConstantsLargerThan > 0)
    flags.elideLargeElementsAttrs(options.elideConstantsLargerThan);
  if (options.printLocations)
    flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false).useLocalScope();
  return flags;
}

/// Writes the IR after a phase into the dump folder, numbered in order.
bool dumpIr(const CompileOptions &options, mlir::ModuleOp module, int index, const char *name,
            llvm::raw_ostream &errs) {
  if (options.dumpIrDirectory.empty())
    return true;
  if (auto error = llvm::sys::fs::create_directories(options.dumpIrDirectory)) {
    errs << "error: cannot create --dump-ir folder '" << options.dumpIrDirectory
         << "': " << error.message() << "\n";
    return false;
  }
  llvm::SmallString<256> path(options.dumpIrDirectory);
  llvm::sys::path::append(path, llvm::formatv("{0:D2}-{1}.mlir", index, name).str());
  std::error_code error;
  llvm::raw_fd_ostream file(path, error);
  if (error) {
    errs << "error: cannot write '" << path << "': " << error.message() << "\n";
    return false;
  }
  module->print(file, printingFlags(options));
  return true;
}

/// What `pipec model.onnx` prints when no phase is asked for.
void printSummary(mlir::ModuleOp module, const std::string &path, llvm::raw_ostream &outs) {
  auto function = module.lookupSymbol<mlir::func::FuncOp>("forward");
  int64_t parameterElements = 0, parameters = 0, buffers = 0;
  std::vector<std::string> inputs;
  for (unsigned i = 0; i < function.getNumArguments(); ++i) {
    auto role = function.getArgAttrOfType<mlir::StringAttr>(i, "nn.role").getValue();
    auto name = function.getArgAttrOfType<mlir::StringAttr>(i, "nn.name").getValue();
    auto type = llvm::cast<mlir::RankedTensorType>(function.getArgument(i).getType());
    if (role == "param") {
      ++parameters;
      parameterElements += type.getNumElements();
    } else if (role == "buffer") {
      ++buffers;
    } else {
      std::string text;
      llvm::raw_string_ostream stream(text);
      stream << name << ": " << type;
      inputs.push_back(text);
    }
  }
  std::map<std::string, int> histogram;
  int64_t total = 0;
  function.walk([&](mlir::Operation *op) {
    if (op->getDialect() && op->getDialect()->getNamespace() == "nn") {
      ++histogram[op->getName().getStringRef().str()];
      ++total;
    }
  });
  outs << "pipec: imported " << path << "\n";
  outs << "  parameters: " << parameters << " tensors, " << parameterElements << " values";
  if (buffers)
    outs << " (+" << buffers << " buffers)";
  outs << "\n  inputs:";
  for (const auto &input : inputs)
    outs << " " << input;
  outs << "\n  outputs:";
  for (mlir::Type type : function.getResultTypes())
    outs << " " << type;
  outs << "\n  ops: " << total << " (";
  bool first = true;
  for (const auto &[name, count] : histogram) {
    outs << (first ? "" : ", ") << name << " " << count;
    first = false;
  }
  outs << ")\n";
}
} // namespace

namespace {
/// Prints the IR of the last phase run (for --emit).
int emitModule(const CompileOptions &options, mlir::ModuleOp module, llvm::raw_ostream &errs) {
  std::error_code error;
  llvm::ToolOutputFile output(options.outputPath, error, llvm::sys::fs::OF_None);
  if (error) {
    errs << "error: cannot write '" << options.outputPath << "': " << error.message() << "\n";
    return 1;
  }
  module->print(output.os(), printingFlags(options));
  output.os() << "\n";
  output.keep();
  return 0;
}

std::string formatSeconds(double seconds) {
  if (seconds < 1e-3)
    return llvm::formatv("{0:F1} us", seconds * 1e6).str();
  if (seconds < 1)
    return llvm::formatv("{0:F2} ms", seconds * 1e3).str();
  return llvm::formatv("{0:F2} s", seconds).str();
}

/// The schedule problem of a partition: per-stage F, B and W are the sums
/// of the stage's op times, communication is the slowest boundary's one-way
/// transfer, activation memory is in units of the largest stage's
/// activations of one micro-batch (the zero-bubble paper's M_B).
schedule::Problem scheduleProblem(const partition::CostTable &table,
                                  const partition::PartitionResult &result, int chunks,
                                  bool vPlacement) {
  schedule::Problem problem;
  problem.stages = static_cast<int>(result.stages.size()) / chunks;
  problem.chunks = chunks;
  problem.microbatches = result.microbatches;
  problem.costF.clear();
  problem.costB.clear();
  problem.costW.clear();
  problem.activation.clear();
  problem.comm = 0;
  std::vector<double> activationBytes;
  for (const auto &stage : result.stages) {
    double forward = 0, backwardInput = 0, backwardWeight = 0, bytes = 0;
    for (int op = stage.firstOp; op <= stage.lastOp; ++op) {
      forward += table.ops[op].forwardSeconds;
      backwardInput += table.ops[op].backwardInputSeconds;
      backwardWeight += table.ops[op].backwardWeightSeconds;
      bytes += static_cast<double>(table.ops[op].activationBytes);
    }
    // The schedule library needs positive costs; a stage without weights
    // (no W) or without a backward still runs its (empty) instructions.
    constexpr double kEmptyWork = 1e-9;
    problem.replicas.push_back(stage.replicas);
    problem.costF.push_back(std::max(forward, kEmptyWork));
    problem.costB.push_back(std::max(backwardInput, kEmptyWork));
    problem.costW.push_back(std::max(backwardWeight, kEmptyWork));
    problem.comm = std::max(problem.comm, stage.sendSeconds / 2);
    problem.allreduceCost = std::max(problem.allreduceCost, stage.allreduceSeconds);
    activationBytes.push_back(bytes);
  }
  double unit = std::max(1.0, *std::max_element(activationBytes.begin(), activationBytes.end()));
  for (double bytes : activationBytes)
    problem.activation.push_back(bytes / unit);
  if (chunks > 1) {
    // The partition is in model order (virtual stage k); the schedule
    // library wants (stage, chunk) order: chunk c of rank s is virtual
    // stage c·p + s (interleaved) or, for the V, s then 2p-1-s.
    int p = problem.stages;
    auto reorder = [&](std::vector<double> &values) {
      std::vector<double> ordered(values.size());
      for (int stage = 0; stage < p; ++stage)
        for (int chunk = 0; chunk < chunks; ++chunk) {
          int virtualStage = vPlacement ? (chunk == 0 ? stage : 2 * p - 1 - stage)
                                        : chunk * p + stage;
          ordered[stage * chunks + chunk] = values[virtualStage];
        }
      values = ordered;
    };
    reorder(problem.costF);
    reorder(problem.costB);
    reorder(problem.costW);
    reorder(problem.activation);
    problem.replicas.assign(p, 1);
  }
  if (!result.recomputedStages.empty()) {
    // Per pipeline stage; with virtual stages, a rank recomputes all its
    // chunks when any of them does.
    problem.recompute.assign(problem.stages, 0);
    for (int stage : result.recomputedStages)
      problem.recompute[chunks > 1 ? stage % problem.stages : stage] = 1;
  }
  if (result.asynchronous)
    problem.inFlight = result.inflightMicrobatches;
  return problem;
}

mlir::LogicalResult estimateCosts(const CompileOptions &options, mlir::ModuleOp module) {
  mlir::PassManager manager(module.getContext());
  passes::EstimateCostsOptions costOptions;
  costOptions.device = options.partition.device;
  costOptions.precision = options.precision;
  costOptions.optimizer = options.optimizer;
  costOptions.profile = options.profilePath;
  manager.addPass(passes::createEstimateCosts(costOptions));
  return manager.run(module);
}
} // namespace

int runCompiler(const CompileOptions &options, llvm::raw_ostream &outs, llvm::raw_ostream &errs) {
  if (failed(checkTargetOptions(options, errs)))
    return 1;
  mlir::DialectRegistry registry;
  registerPipecDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // Pass failures report through diagnostics: print them as errors.
  mlir::ScopedDiagnosticHandler diagnostics(&context, [&](mlir::Diagnostic &diagnostic) {
    outs.flush();
    if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error)
      errs << "error: " << options.inputPath << ": " << diagnostic.str() << "\n";
    return mlir::success();
  });

  std::vector<std::string> errors;
  auto module = import::importOnnxModel(context, options.inputPath, options.importOptions, errors);
  if (!module) {
    for (const auto &error : errors)
      errs << "error: " << error << "\n";
    return 1;
  }
  if (!dumpIr(options, *module, 0, phaseName(Phase::NN), errs))
    return 1;
  if (options.emit == Phase::NN)
    return emitModule(options, *module, errs);

  bool wantCosts = options.emit || options.partitionRequested() || !options.dumpCostsPath.empty();
  if (!wantCosts) {
    printSummary(*module, options.inputPath, outs);
    return 0;
  }
  if (failed(appendLoss(*module, options)) || failed(estimateCosts(options, *module)))
    return 1;
  if (!dumpIr(options, *module, 1, phaseName(Phase::Costs), errs))
    return 1;
  auto table = passes::costTableFromModule(*module);
  if (failed(table))
    return 1;
  if (!options.dumpCostsPath.empty()) {
    std::ofstream csv(options.dumpCostsPath);
    if (!csv) {
      errs << "error: cannot write --dump-costs file '" << options.dumpCostsPath << "'\n";
      return 1;
    }
    partition::writeCostTableCsv(csv, *table);
  }
  if (options.emit == Phase::Costs)
    return emitModule(options, *module, errs);
  if (!options.partitionRequested()) {
    if (options.emit) {
      errs << "error: --emit=" << phaseName(*options.emit)
           << " needs a topology: give --gpus NxG or --cluster FILE\n";
      return 1;
    }
    printSummary(*module, options.inputPath, outs);
    return 0;
  }

  partition::PartitionResult result;
  nlohmann::json plan;
  schedule::Schedule generated;
  schedule::SimResult simulated;
  try {
    // plan.json is written below, once the schedule is known.
    partition::PartitionCliOptions partitionOptions = options.partition;
    partitionOptions.outDir.clear();
    std::string name = options.scheduleName.empty()
                           ? (options.partition.options.asynchronous ? "1f1b-rr" : "1f1b")
                           : options.scheduleName;
    int chunks = options.chunks ? options.chunks : (name == "zb-v" ? 2 : 1);
    bool vPlacement = name == "zb-v";
    int pipelineStages = 0;
    if (chunks > 1) {
      // Virtual stages: partition into p·v stages as if on p·v devices, then
      // place v of them on each of the p devices (docs/partition.md).
      if (name != "interleaved" && name != "zb-v")
        throw schedule::ScheduleError("--chunks " + std::to_string(chunks) +
                                      " needs --schedule interleaved or zb-v");
      if (vPlacement && chunks != 2)
        throw schedule::ScheduleError("zb-v places exactly 2 chunks per rank");
      pipelineStages = static_cast<int>(partitionOptions.topology().totalDevices());
      if (partitionOptions.options.forcedStages)
        pipelineStages = partitionOptions.options.forcedStages;
      if (chunks > schedule::kMaxChunks ||
          static_cast<int64_t>(pipelineStages) * chunks > partition::kMaxDevices)
        throw schedule::ScheduleError(
            "--chunks " + std::to_string(chunks) + " on " + std::to_string(pipelineStages) +
            " ranks: " + std::to_string(static_cast<int64_t>(pipelineStages) * chunks) +
            " virtual stages, over the limit of " + std::to_string(partition::kMaxDevices) +
            " (and at most " + std::to_string(schedule::kMaxChunks) + " chunks)");
      partitionOptions.gpus = "1x" + std::to_string(pipelineStages * chunks);
      partitionOptions.clusterFile.clear();
      partitionOptions.options.forcedStages = pipelineStages * chunks;
      partitionOptions.options.allowReplication = false;
    }
    std::ostringstream report;
    result = partition::runPartition(*table, partitionOptions, report);
    schedule::Problem problem = scheduleProblem(*table, result, chunks, vPlacement);
    problem.verticalSync = options.verticalSync && result.asynchronous;
    generated = schedule::generate(name, problem);
    if (chunks > 1) {
      report << "virtual stages: " << chunks << " chunks on each of " << pipelineStages
             << " ranks (" << (vPlacement ? "V placement: rank r runs stages r and "
                                          : "interleaved: rank r runs stages r, r+p, ...")
             << (vPlacement ? std::to_string(2 * pipelineStages - 1) + "-r" : std::string())
             << ")\n";
    }
    simulated = schedule::simulate(generated);
    double peak = *std::max_element(simulated.peakMemory.begin(), simulated.peakMemory.end());
    nlohmann::json scheduleJson = {
        {"name", name},
        {"chunks", chunks},
        {"microbatches", result.microbatches},
        {"makespan_s", simulated.makespan},
        {"bubble_flush", simulated.bubbleFlush},
        {"bubble_steady_state", simulated.bubbleSteady},
        {"bubble_over_ideal", simulated.bubbleOverIdeal},
        {"peak_activation_units", peak},
        {"rank_files", "schedule/rank_<rank>.json"},
    };
    if (!options.emit) {
      if (options.partition.json) {
        nlohmann::json summary = nlohmann::json::parse(report.str());
        summary["schedule"] = scheduleJson;
        outs << summary.dump(2) << "\n";
      } else {
        outs << report.str();
        for (const auto &stage : result.stages)
          if (result.microbatches % stage.replicas) {
            outs << llvm::formatv("note: {0} micro-batches do not divide among the {1} replicas "
                                  "of a stage: some replicas idle in each mini-batch (use a "
                                  "multiple of {1})\n",
                                  result.microbatches, stage.replicas)
                        .str();
            break;
          }
        outs << llvm::formatv("schedule {0}: {1} per mini-batch of {2} micro-batches (simulated), "
                              "bubble {3:P} flush-to-flush, {4:P} steady-state, peak activations "
                              "{5:F2} x one micro-batch of the largest stage\n",
                              name, formatSeconds(simulated.makespan),
                              result.microbatches, simulated.bubbleFlush,
                              simulated.bubbleSteady, peak)
                    .str();
      }
    }
    plan = partition::planToJson(*table, partitionOptions.topology(), result);
    plan["schedule"] = scheduleJson;
    if (chunks > 1) {
      // piperun reads one entry per rank position; the model-order stages
      // (virtual stages) stay under their own key.
      plan["virtual_stages"] = plan["stages"];
      nlohmann::json positions = nlohmann::json::array();
      for (int stage = 0; stage < pipelineStages; ++stage)
        positions.push_back({{"id", stage}, {"ranks", {stage}}});
      plan["stages"] = positions;
      plan["chunks"] = chunks;
      plan["placement"] = vPlacement ? "v" : "interleaved";
    }
  } catch (const partition::Error &error) {
    errs << "error: " << options.inputPath << ": " << error.what() << "\n";
    return 1;
  } catch (const schedule::ScheduleError &error) {
    errs << "error: " << options.inputPath << ": schedule: " << error.what() << "\n";
    return 1;
  } catch (const std::bad_alloc &) {
    errs << "error: " << options.inputPath << ": out of memory while planning\n";
    return 1;
  }
  passes::annotateStages(*module, *table, result);
  if (!dumpIr(options, *module, 2, phaseName(Phase::Partition), errs))
    return 1;
  if (options.emit == Phase::Partition)
    return emitModule(options, *module, errs);
  if (!options.emit && options.partition.outDir.empty())
    return 0;

  // The training program: loss, gradients, then one program per stage.
  if (failed(deriveTrainStep(*module, options)))
    return 1;
  if (!dumpIr(options, *module, 3, phaseName(Phase::Autodiff), errs))
    return 1;
  if (options.emit == Phase::Autodiff)
    return emitModule(options, *module, errs);
  if (failed(outlineStages(*module, options, result)))
    return 1;
  if (!dumpIr(options, *module, 4, phaseName(Phase::Stages), errs))
    return 1;
  if (options.emit == Phase::Stages)
    return emitModule(options, *module, errs);

  // The job directory: plan, schedule streams, stage code, initial weights.
  std::string directory = options.partition.outDir;
  try {
    // Streams are numbered by schedule rank (stage-major); piperun maps
    // them to MPI ranks through the plan's stages (docs/runtime.md).
    schedule::writeScheduleDir(generated, simulated,
                               (std::filesystem::path(directory) / "schedule").string());
  } catch (const std::exception &error) {
    errs << "error: " << directory << ": " << error.what() << "\n";
    return 1;
  }
  if (failed(writeTrainingJob(*module, options, result, plan, outs, errs)))
    return 1;
  partition::writePlanFile(plan, directory);
  return 0;
}

} // namespace pipec
