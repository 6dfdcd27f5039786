#include "compiler/Driver/Compiler.h"
#include "compiler/Driver/Registration.h"
#include "compiler/Partition/CostTable.h"
#include "compiler/Partition/Error.h"
#include "compiler/Partition/Partitioner.h"
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

#include <fstream>
#include <map>
#include <sstream>

namespace pipec {

std::optional<Phase> parsePhase(const std::string &name) {
  for (Phase phase : {Phase::NN, Phase::Costs, Phase::Partition})
    if (name == phaseName(phase))
      return phase;
  return std::nullopt;
}

const char *phaseName(Phase phase) {
  switch (phase) {
  case Phase::NN: return "nn";
  case Phase::Costs: return "costs";
  case Phase::Partition: return "partition";
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
  mlir::DialectRegistry registry;
  registerPipecDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  // Pass failures report through diagnostics: print them as errors.
  mlir::ScopedDiagnosticHandler diagnostics(&context, [&](mlir::Diagnostic &diagnostic) {
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
  if (failed(estimateCosts(options, *module)))
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
  try {
    std::ostringstream report;
    result = partition::runPartition(*table, options.partition, report);
    if (!options.emit)
      outs << report.str();
  } catch (const partition::Error &error) {
    errs << "error: " << options.inputPath << ": " << error.what() << "\n";
    return 1;
  }
  passes::annotateStages(*module, *table, result);
  if (!dumpIr(options, *module, 2, phaseName(Phase::Partition), errs))
    return 1;
  if (options.emit == Phase::Partition)
    return emitModule(options, *module, errs);
  return 0;
}

} // namespace pipec
