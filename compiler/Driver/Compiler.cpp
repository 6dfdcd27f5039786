#include "compiler/Driver/Compiler.h"
#include "analysis/Settings/Declared.h"
#include "compiler/Driver/Registration.h"
#include "compiler/Driver/StageBuild.h"
#include "compiler/Driver/WriteJob.h"
#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/Partitioner.h"
#include "analysis/Planner/Planner.h"
#include "analysis/Partition/PlanJson.h"
#include "analysis/Schedule/Schedule.h"
#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"
#include "passes/Passes.h"
#include "runtime/include/pipec/conv_engines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
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

namespace {
mlir::OpPrintingFlags printingFlags(const CompileOptions &options) {
  mlir::OpPrintingFlags flags;
  if (options.elideConstantsLargerThan > 0)
    flags.elideLargeElementsAttrs(options.elideConstantsLargerThan);
  if (options.printLocations)
    flags.enableDebugInfo(/*enable=*/true, /*prettyForm=*/false).useLocalScope();
  return flags;
}

/// --dump-ir DIR: the imported IR as 00-nn.mlir, then the IR after every
/// pass of the pipeline as NN-<pass argument>.mlir, numbered in order.
class IrDumpFolder : public mlir::PassManager::IRPrinterConfig {
public:
  IrDumpFolder(std::string folder, mlir::OpPrintingFlags flags)
      // Every pass of the pipeline runs on the module: printing the op it ran
      // on prints the whole module.
      : IRPrinterConfig(/*printModuleScope=*/false, /*printAfterOnlyOnChange=*/false,
                        /*printAfterOnlyOnFailure=*/false, flags),
        folder(std::move(folder)) {}

  /// Creates the folder and writes the imported IR; errors go to `errs`.
  bool start(mlir::ModuleOp module, llvm::raw_ostream &errs) {
    if (auto error = llvm::sys::fs::create_directories(folder)) {
      errs << "error: cannot create --dump-ir folder '" << folder << "': " << error.message()
           << "\n";
      return false;
    }
    write("nn", [&](llvm::raw_ostream &out) { module->print(out, getOpPrintingFlags()); });
    return report(errs);
  }

  void printAfterIfEnabled(mlir::Pass *pass, mlir::Operation *, PrintCallbackFn print) override {
    write(pass->getArgument(), print);
  }

  /// Prints the first write error, if any; true when there was none.
  bool report(llvm::raw_ostream &errs) const {
    if (!firstError.empty())
      errs << "error: " << firstError << "\n";
    return firstError.empty();
  }

private:
  void write(llvm::StringRef name, llvm::function_ref<void(llvm::raw_ostream &)> print) {
    llvm::SmallString<256> path(folder);
    llvm::sys::path::append(path, llvm::formatv("{0:D2}-{1}.mlir", next++, name).str());
    std::error_code error;
    llvm::raw_fd_ostream file(path, error);
    if (error) {
      if (firstError.empty())
        firstError = "cannot write '" + path.str().str() + "': " + error.message();
      return;
    }
    print(file);
  }

  std::string folder;
  int next = 0;
  std::string firstError;
};

/// For CUDA stages, where the model's convolutions run (pipec/conv_engines.h
/// holds the rule the kernel library applies): cuDNN's graphs, or pipec's
/// kernels and why, the first few named. A shape cuDNN declines when the
/// run builds its plan is known only then; piperun names it on stderr.
void printConvolutionEngines(mlir::ModuleOp module, const CompileOptions &options, std::ostream &os) {
  if (options.job.target != Target::Cuda)
    return;
  const bool bf16 = options.costs.precision == Precision::BF16, f32 = options.costs.precision == Precision::F32;
  int64_t onCudnn = 0;
  std::map<std::string, std::vector<std::string>> fallbacks; // reason -> ONNX nodes
  // The stages' forward ops once outlined, else the model's (the model
  // function stays beside the stages).
  const bool outlined = !module.getOps<pipe::StageOp>().empty();
  module.walk([&](mlir::Operation *op) {
    // The model's convolutions: a Conv's forward or a ConvTranspose's
    // (nn.conv_input_grad); their gradients run where they do.
    if (!llvm::isa<nn::ConvOp, nn::ConvInputGradOp>(op) || (outlined && !op->getParentOfType<pipe::StageOp>()) ||
        pipe::phaseOf(op).value_or(pipe::Phase::Fwd) != pipe::Phase::Fwd)
      return;
    auto result = llvm::cast<mlir::RankedTensorType>(op->getResult(0).getType());
    auto input = llvm::cast<mlir::RankedTensorType>(op->getOperand(0).getType());
    const bool empty = result.getNumElements() == 0 || input.getNumElements() == 0;
    if (const char *why = conv_engines::staticFallback(result.getRank() - 2, bf16, f32, empty))
      fallbacks[why].push_back(nn::nodeName(op->getLoc()).value_or("?").str());
    else
      ++onCudnn;
  });
  if (onCudnn == 0 && fallbacks.empty())
    return;
  os << "convolutions: " << onCudnn << " on cuDNN's graphs"
     << (onCudnn && options.optLevel == passes::OptLevel::O2 ? ", channels-last" : "")
     << (onCudnn ? " (a shape cuDNN declines at run time runs on pipec's kernels; piperun names it)" : "");
  for (const auto &[why, nodes] : fallbacks) {
    os << "; " << nodes.size() << " on pipec's kernels: " << why << " (";
    for (size_t i = 0; i < nodes.size() && i < 3; ++i)
      os << (i ? ", " : "") << nodes[i];
    os << (nodes.size() > 3 ? ", ...)" : ")");
  }
  os << "\n";
}

/// What `pipec model.onnx` prints when no phase is asked for.
void printSummary(mlir::ModuleOp module, const std::string &path, llvm::raw_ostream &outs) {
  auto function = module.lookupSymbol<mlir::func::FuncOp>("forward");
  int64_t parameterElements = 0, parameters = 0, buffers = 0;
  std::vector<std::string> inputs;
  for (unsigned i = 0; i < function.getNumArguments(); ++i) {
    std::optional<nn::Role> role = nn::argumentRole(function, i);
    auto name = function.getArgAttrOfType<mlir::StringAttr>(i, nn::kNameAttrName).getValue();
    auto type = llvm::cast<mlir::RankedTensorType>(function.getArgument(i).getType());
    if (role == nn::Role::Param) {
      ++parameters;
      parameterElements += type.getNumElements();
    } else if (role == nn::Role::Buffer) {
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
  auto frozen = module->getAttrOfType<mlir::DictionaryAttr>(nn::kFrozenAttrName);
  outs << "pipec: imported " << path << "\n";
  outs << "  parameters: " << parameters << " tensors, " << parameterElements << " values";
  if (buffers)
    outs << " (+" << buffers << " buffers)";
  if (frozen && !frozen.empty()) {
    // Every floating initializer that is not trained, with the reason
    // (docs/importer.md: nothing is frozen without a message).
    outs << "\n  frozen: " << frozen.size() << " floating initializer(s), not trained:";
    for (const mlir::NamedAttribute &entry : frozen)
      outs << "\n    " << entry.getName().getValue() << ": "
           << llvm::cast<mlir::StringAttr>(entry.getValue()).getValue();
  }
  if (auto notes = module->getAttrOfType<mlir::ArrayAttr>(nn::kImportNotesAttrName))
    for (mlir::Attribute note : notes)
      outs << "\n  note: " << llvm::cast<mlir::StringAttr>(note).getValue();
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

/// A compile that does not print the summary still gives the importer's
/// notes and says which floating initializers it does not train (the
/// summary says why).
void printImportNotes(mlir::ModuleOp module, const std::string &path, llvm::raw_ostream &errs) {
  if (auto notes = module->getAttrOfType<mlir::ArrayAttr>(nn::kImportNotesAttrName))
    for (mlir::Attribute note : notes)
      errs << "pipec: note: " << path << ": " << llvm::cast<mlir::StringAttr>(note).getValue()
           << "\n";
  auto frozen = module->getAttrOfType<mlir::DictionaryAttr>(nn::kFrozenAttrName);
  if (!frozen || frozen.empty())
    return;
  errs << "pipec: note: " << frozen.size() << " floating initializer(s) of " << path
       << " are not trained:";
  size_t listed = 0;
  for (const mlir::NamedAttribute &entry : frozen)
    if (listed++ < 5)
      errs << (listed > 1 ? ", " : " ") << entry.getName().getValue();
  if (frozen.size() > 5)
    errs << " and " << frozen.size() - 5 << " more";
  errs << " (`pipec " << path << "` lists each with its reason)\n";
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

/// The pipeline's phase that a command line asks for: --emit's, else as far
/// as the outputs need (costs for --dump-costs, the plan to print it, the
/// stages to write --out DIR).
Phase lastPhase(const CompileOptions &options) {
  if (options.emit)
    return *options.emit;
  if (!options.partitionRequested())
    return Phase::Costs;
  return options.partition().outDir.empty() ? Phase::Partition : Phase::Optimized;
}

passes::PipelineConfig pipelineConfig(const CompileOptions &options,
                                      passes::PlanningResult *planning) {
  passes::PipelineConfig config;
  config.last = lastPhase(options);
  config.optLevel = options.optLevel;
  config.loss = options.loss;
  config.costs = options.costs;
  config.planning = options.planning;
  config.planning.partition.outDir.clear(); // plan.json is written once the stages are built
  config.planningResult = planning;
  config.optimizer = options.optimizer;
  config.memory.target = options.job.target;
  return config;
}

/// The planner's choice of the micro-batch size of a model whose batch
/// dimension is free (docs/planner.md, "The batch"): the model imported,
/// costed and planned at 1, 2, 4, ..., kMaxSearchedMicrobatchSize samples per
/// micro-batch (those dividing --batch-size), each on a context of its own;
/// the size whose plan has the lowest simulated time per sample (ties: the
/// smaller). Fills `tried` with every size and its result or why it has none.
mlir::FailureOr<int64_t> chooseMicrobatchSize(const CompileOptions &options,
                                              std::vector<plan::MicrobatchSizeTried> &tried,
                                              llvm::raw_ostream &errs) {
  std::optional<int64_t> best;
  double bestTime = 0;
  for (int64_t size = 1; size <= settings::kMaxSearchedMicrobatchSize; size *= 2) {
    const std::optional<int64_t> batchSize = options.planning.batchSize;
    if (batchSize && *batchSize % size != 0)
      continue;
    plan::MicrobatchSizeTried attempt;
    attempt.size = size;
    mlir::DialectRegistry registry;
    registerPipecDialects(registry);
    mlir::MLIRContext context(registry);
    context.loadAllAvailableDialects();
    std::string firstError;
    mlir::ScopedDiagnosticHandler diagnostics(&context, [&](mlir::Diagnostic &diagnostic) {
      if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error && firstError.empty())
        firstError = diagnostic.str();
      return mlir::success();
    });
    import::ImportOptions importOptions = options.importOptions;
    importOptions.microbatchSize = size;
    std::vector<std::string> errors;
    auto module = import::importOnnxModel(context, options.inputPath, importOptions, errors);
    passes::PlanningResult planning;
    if (!module) {
      attempt.rejection = errors.empty() ? std::string("the import failed") : errors.front();
    } else {
      mlir::PassManager manager(&context);
      passes::PipelineConfig config = pipelineConfig(options, &planning);
      config.last = Phase::Partition;
      // Sizes compare their best plans (the ranking --candidates prints);
      // --plan-rank chooses within the chosen size's ranking.
      config.planning.rank = 1;
      passes::buildPipecPipeline(manager, config);
      if (failed(manager.run(*module)))
        attempt.rejection = firstError.empty() ? std::string("the pipeline failed") : firstError;
    }
    if (attempt.rejection.empty()) {
      const planner::Candidate &chosen = planning.plan.chosen;
      attempt.samplesPerStep = size * chosen.microbatches;
      attempt.timePerSample = chosen.timePerMinibatch / static_cast<double>(*attempt.samplesPerStep);
      // Without --batch-size the samples per step stay within the default
      // bound (docs/planner.md, "The batch"): a size whose plan needs more
      // (its replicas' micro-batches) is only taken when every size does.
      if (!batchSize && *attempt.samplesPerStep > settings::kDefaultMaxBatchSize)
        attempt.rejection = "over the default " + std::to_string(settings::kDefaultMaxBatchSize) +
                            (" samples per step; " + settings::flag(settings::kBatchSize) + " N allows it");
    }
    tried.push_back(std::move(attempt));
    if (planning.noPlanFitsMemory) {
      // Memory per device does not fall as the micro-batch grows: the larger
      // sizes are not planned (each would cost a full search to refuse).
      for (int64_t larger = size * 2; larger <= settings::kMaxSearchedMicrobatchSize; larger *= 2)
        if (!batchSize || *batchSize % larger == 0)
          tried.push_back({larger, std::nullopt, std::nullopt,
                           "nothing fits in memory at size " + std::to_string(size) +
                               ", and a larger micro-batch needs more"});
      break;
    }
  }
  // The fastest size within the bound, else the fastest of all.
  for (bool withinBound : {true, false}) {
    for (const plan::MicrobatchSizeTried &attempt : tried)
      if (attempt.timePerSample && (!withinBound || attempt.rejection.empty()) &&
          (!best || *attempt.timePerSample < bestTime * (1 - 1e-9))) {
        best = attempt.size;
        bestTime = *attempt.timePerSample;
      }
    if (best)
      break;
  }
  if (!best) {
    // One reason for every size (an input with another free dimension, a
    // model the pipeline refuses) is said once.
    const bool sameReason = std::all_of(tried.begin(), tried.end(), [&](const plan::MicrobatchSizeTried &attempt) {
      return attempt.rejection == tried.front().rejection;
    });
    if (sameReason && !tried.empty()) {
      errs << "error: " << tried.front().rejection << "\n";
      return mlir::failure();
    }
    errs << "error: " << options.inputPath << ": the planner found no plan at any micro-batch size it tried:\n";
    for (const plan::MicrobatchSizeTried &attempt : tried)
      errs << "  " << attempt.size << ": " << attempt.rejection << "\n";
    return mlir::failure();
  }
  return *best;
}
} // namespace

void CompileOptions::bind(settings::Binder &b) {
  loss.bind(b);
  costs.bind(b);
  planning.bind(b);
  optimizer.bind(b);
  job.bind(b);
  b.onInteger(settings::kMicrobatchSize, [this](int64_t size) { importOptions.microbatchSize = size; });
  b.flag(settings::kEachCandidate, eachCandidate);
}

namespace {
/// --each-candidate writes one job per printed plan: it needs --out and a
/// topology, and chooses every rank itself.
mlir::LogicalResult checkEachCandidate(const CompileOptions &options, llvm::raw_ostream &errs) {
  if (!options.eachCandidate)
    return mlir::success();
  const std::string each = "error: " + settings::flag(settings::kEachCandidate);
  if (options.planning.rank)
    errs << each << " writes every printed plan; it takes no " << settings::flag(settings::kPlanRank) << "\n";
  else if (options.emit)
    errs << each << " writes jobs, not IR: not with --emit\n";
  else if (options.partition().outDir.empty() || !options.partitionRequested())
    errs << each << " needs " << settings::flag(settings::kOut) << " DIR and a topology ("
         << settings::flag(settings::kGpus) << " or " << settings::flag(settings::kCluster) << ")\n";
  else
    return mlir::success();
  return mlir::failure();
}
} // namespace

int runCompiler(const CompileOptions &given, llvm::raw_ostream &outs, llvm::raw_ostream &errs) {
  if (failed(checkTargetOptions(given.job, errs)) || failed(checkEachCandidate(given, errs)))
    return 1;
  // The micro-batch size: the export's, given, or the planner's choice
  // when the export leaves the batch dimension free. Its source is reported
  // only when it is not the export's (which plan.json's absent member
  // means), so that a job pipec-opt writes from the same module is the same
  // file (docs/layers.md).
  CompileOptions options = given;
  // A CPU job's ranks share their host's memory (docs/partition.md): the
  // plan it runs is checked against that, not the device preset's memory.
  partition::PartitionCliOptions &partition = options.planning.partition;
  if (options.job.target != Target::Cpu && partition.hostMemoryBytes) {
    errs << "error: " << settings::flag(settings::kHostMemory) << " is the memory of a host of CPU ranks; "
         << settings::flag(settings::kTarget) << " cuda plans against the device's (" << settings::flag(settings::kDevice)
         << ", " << settings::flag(settings::kMemoryLimit) << ")\n";
    return 1;
  }
  if (options.job.target == Target::Cpu && !partition.outDir.empty() && !partition.hostMemoryBytes) {
    partition.hostMemoryBytes = partition::detectHostMemoryBytes();
    partition.hostMemoryOrigin = "this machine's";
    if (!partition.hostMemoryBytes) {
      errs << "error: cannot read this machine's memory (/proc/meminfo) for its CPU ranks: give "
           << settings::flag(settings::kHostMemory) << " SIZE\n";
      return 1;
    }
  }
  if (options.importOptions.microbatchSize)
    options.planning.microbatchSizeSource = settings::flag(settings::kMicrobatchSize);
  mlir::DialectRegistry registry;
  registerPipecDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // Pass failures report through diagnostics: print them as errors (with
  // --each-candidate, naming the plan).
  std::string planLabel;
  mlir::ScopedDiagnosticHandler diagnostics(&context, [&](mlir::Diagnostic &diagnostic) {
    outs.flush();
    if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error)
      errs << "error: " << options.inputPath << planLabel << ": " << diagnostic.str() << "\n";
    return mlir::success();
  });

  std::vector<std::string> errors;
  auto importModel = [&] {
    errors.clear();
    return import::importOnnxModel(context, options.inputPath, options.importOptions, errors);
  };
  auto module = importModel();
  // The planner's micro-batch size: the model imported again at it.
  auto importAtChosenSize = [&] {
    mlir::FailureOr<int64_t> size = chooseMicrobatchSize(options, options.planning.microbatchSizesTried, errs);
    if (failed(size))
      return false;
    options.importOptions.microbatchSize = *size;
    options.planning.microbatchSizeSource = "the planner's choice";
    module = importModel();
    return true;
  };
  // A model with a free batch dimension does not import without a size:
  // only then is the file read for its inputs, and the sizes searched.
  if (!module && options.partitionRequested() && !options.importOptions.microbatchSize) {
    std::vector<std::string> probeErrors;
    if (import::batchDimensionIsFree(options.inputPath, options.importOptions, probeErrors).value_or(false) &&
        !importAtChosenSize())
      return 1;
  }
  // A static export with --batch-size: the global batch is the user's and
  // the micro-batch size the planner's, which re-specializes the export at
  // each size it tries (docs/planner.md, "The batch"). Without --batch-size
  // a static export keeps the batch it was traced with.
  const bool batchGivenByShape = std::any_of(
      options.importOptions.inputShapes.begin(), options.importOptions.inputShapes.end(),
      [](const auto &entry) { return !entry.second.empty() && entry.second[0] != import::kMicrobatchDimension; });
  if (module && options.partitionRequested() && !options.importOptions.microbatchSize &&
      options.planning.batchSize && !batchGivenByShape && !importAtChosenSize())
    return 1;
  if (!module) {
    for (const auto &error : errors)
      errs << "error: " << error << "\n";
    return 1;
  }
  std::unique_ptr<IrDumpFolder> dump;
  if (!options.dumpIrDirectory.empty()) {
    dump = std::make_unique<IrDumpFolder>(options.dumpIrDirectory, printingFlags(options));
    if (!dump->start(*module, errs))
      return 1;
  }
  if (options.emit == Phase::NN)
    return emitModule(options, *module, errs);
  bool wantCosts = options.emit || options.partitionRequested() || !options.costs.dumpCosts.empty();
  if (!wantCosts) {
    printSummary(*module, options.inputPath, outs);
    return 0;
  }
  if (options.emit && *options.emit > Phase::Costs && !options.partitionRequested()) {
    errs << "error: --emit=" << phaseName(*options.emit)
         << (" needs a topology: give " + settings::flag(settings::kGpus) + " NxG or " + settings::flag(settings::kCluster) + " FILE\n");
    return 1;
  }

  // The compilation proper: one pass pipeline (passes/Pipeline.h), with
  // --mlir-timing, --mlir-pass-statistics and --mlir-print-ir-* as given.
  passes::PlanningResult planning;
  mlir::PassManager manager(&context);
  if (failed(mlir::applyPassManagerCLOptions(manager)))
    return 1;
  mlir::applyDefaultTimingPassManagerCLOptions(manager);
  const IrDumpFolder *dumpFolder = dump.get(); // owned by the pass manager from here
  if (dump)
    manager.enableIRPrinting(std::move(dump));
  passes::buildPipecPipeline(manager, pipelineConfig(options, &planning));
  // --each-candidate: later plans start from the module as imported.
  mlir::OwningOpRef<mlir::ModuleOp> imported;
  if (options.eachCandidate) {
    imported = module->clone();
    planLabel = " (plan 1)";
  }
  bool passed = succeeded(manager.run(*module));
  // With --each-candidate, a plan past the search that fails is one of many.
  if ((dumpFolder && !dumpFolder->report(errs)) || (!passed && !(imported && planning.ranking)))
    return 1;
  if (options.emit)
    return emitModule(options, *module, errs);
  if (!options.partitionRequested()) {
    printSummary(*module, options.inputPath, outs);
    return 0;
  }

  // After the pipeline succeeded, so that an error stays the first line.
  printImportNotes(*module, options.inputPath, errs);
  const planner::Plan &plan = planning.plan;
  if (options.partition().json) {
    outs << planner::planSummaryJson(planning.table, plan).dump(2) << "\n";
  } else {
    std::ostringstream text;
    planner::printPlan(text, planning.table, planning.topology, plan);
    printConvolutionEngines(*module, options, text);
    outs << text.str();
  }
  if (options.partition().outDir.empty())
    return 0;

  // The job directory, from the module alone (WriteJob.h); with --json,
  // standard output carries the one JSON document only.
  llvm::raw_ostream &written = options.partition().json ? errs : outs;
  // The initial weights, read one tensor at a time as each stage's file is
  // written (never all of them at once: docs/weights-format.md).
  import::InitializerReader initialValues(options.inputPath);
  if (!initialValues.ok()) {
    for (const std::string &error : initialValues.errors())
      errs << "error: " << error << "\n";
    return 1;
  }
  if (!options.eachCandidate)
    return failed(writeJob(*module, options.partition().outDir, options.job, initialValues, written, errs));

  // --each-candidate: plan K of the one search, compiled on a fresh copy of
  // the imported module into DIR/plan-K (plan 1 is the module above).
  int exitCode = 0;
  for (size_t rank = 1; rank <= planning.plan.shown(); ++rank) {
    planLabel = " (plan " + std::to_string(rank) + ")";
    mlir::OwningOpRef<mlir::ModuleOp> copy;
    if (rank > 1) {
      copy = imported->clone();
      mlir::PassManager perPlan(&context);
      if (failed(mlir::applyPassManagerCLOptions(perPlan)))
        return 1;
      passes::PipelineConfig config = pipelineConfig(options, nullptr);
      config.planning.rank = static_cast<int>(rank);
      config.ranking = planning.ranking;
      passes::buildPipecPipeline(perPlan, config);
      passed = succeeded(perPlan.run(*copy));
    }
    const std::string directory = (std::filesystem::path(options.partition().outDir) /
                                   ("plan-" + std::to_string(rank))).string();
    if (!passed || failed(writeJob(copy ? *copy : *module, directory, options.job, initialValues, written, errs))) {
      errs << "error: " << options.inputPath << planLabel << ": does not compile; " << directory
           << " is not a job\n";
      exitCode = 1;
    }
  }
  return exitCode;
}

} // namespace pipec
