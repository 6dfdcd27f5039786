#include "compiler/Driver/Compiler.h"
#include "compiler/Driver/Registration.h"
#include "compiler/Driver/TrainingJob.h"
#include "compiler/Partition/CostTable.h"
#include "compiler/Partition/Error.h"
#include "compiler/Partition/Partitioner.h"
#include "compiler/Planner/Planner.h"
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
    // The file may live in a folder not created yet (e.g. inside --out DIR).
    std::error_code folderError;
    auto folder = std::filesystem::path(options.dumpCostsPath).parent_path();
    if (!folder.empty())
      std::filesystem::create_directories(folder, folderError);
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

  // The planner's joint search (docs/planner.md); plan.json is written
  // below, once the stages are built.
  planner::Plan plan;
  partition::Topology topology;
  try {
    planner::Request request;
    request.partition = options.partition;
    request.partition.outDir.clear();
    request.schedule = options.scheduleName;
    request.chunks = options.chunks;
    request.verticalSync = options.verticalSync;
    request.candidates = options.candidates;
    if (options.partition.options.asynchronous || options.scheduleName == "1f1b-rr")
      request.unsplittable = passes::tiedParameterRanges(*module);
    topology = request.partition.topology();
    plan = planner::plan(*table, request);
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
  const partition::PartitionResult &result = plan.chosen.partition;
  if (!options.emit) {
    if (options.partition.json) {
      outs << planner::planSummaryJson(*table, plan).dump(2) << "\n";
    } else {
      std::ostringstream text;
      planner::printPlan(text, *table, topology, plan);
      outs << text.str();
    }
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
    schedule::writeScheduleDir(plan.schedule, plan.simulated,
                               (std::filesystem::path(directory) / "schedule").string());
  } catch (const std::exception &error) {
    errs << "error: " << directory << ": " << error.what() << "\n";
    return 1;
  }
  nlohmann::json planFile = planner::planFileJson(*table, topology, plan);
  // With --json, standard output carries the one JSON document only.
  if (failed(writeTrainingJob(*module, options, result, planFile,
                              options.partition.json ? errs : outs, errs)))
    return 1;
  try {
    partition::writePlanFile(planFile, directory);
  } catch (const partition::Error &error) {
    errs << "error: " << error.what() << "\n";
    return 1;
  }
  return 0;
}

} // namespace pipec
