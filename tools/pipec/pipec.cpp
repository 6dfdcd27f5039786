// pipec: compiles an ONNX model into a pipeline-parallel training job.
#include "PartitionOptions.h"
#include "ScheduleOptions.h"

#include "compiler/Driver/Compiler.h"
#include "compiler/Import/BatchNormFlag.h"
#include "analysis/Settings/Settings.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <new>

namespace cl = llvm::cl;
using namespace pipec::tools;

namespace {
/// llvm::cl lets a subcommand's command line set the top level's options
/// too (`pipec partition --batch-size 64` parsed, and nothing read it): each
/// one given that the subcommand does not have is a usage error instead.
bool onlyOwnOptions(cl::SubCommand &sub) {
  bool ok = true;
  for (auto &[name, option] : cl::SubCommand::getTopLevel().OptionsMap)
    if (option->getNumOccurrences() > 0 && !sub.OptionsMap.count(name) && !option->Subs.contains(&cl::SubCommand::getAll()) &&
        !option->isPositional()) {
      llvm::errs() << "pipec " << sub.getName() << ": error: --" << name << " is an option of `pipec MODEL`, not of `pipec "
                   << sub.getName() << "` (see pipec " << sub.getName() << " --help)\n";
      ok = false;
    }
  return ok;
}

int runPipec(int argc, char **argv) {
  // One command line, three commands (llvm::cl subcommands): `pipec MODEL`
  // (the top level), `pipec partition` and `pipec schedule`. The settings
  // (analysis/Settings/Declared.h) become options through one binder per
  // command line (PartitionOptions.cpp, ScheduleOptions.cpp); the options
  // declared here are the top level's own.
  const char *overview = "pipec: compile an ONNX model into a pipeline-parallel training job\n";

  pipec::CompileOptions options;
  cl::OptionCategory category(
      "Compile options",
      "  pipec model.onnx                      import and print a summary\n"
      "  pipec model.onnx --gpus 2x8           plan: partition, schedule and\n"
      "                                        micro-batches chosen jointly\n"
      "  pipec model.onnx --emit=<phase>       print the IR after a phase\n"
      "  pipec model.onnx --dump-ir DIR        write the IR after every pass\n"
      "  pipec partition --help                partition a cost table alone\n"
      "  pipec schedule --help                 explore pipeline schedules");
  cl::opt<std::string> input(cl::Positional, cl::desc("<model.onnx | model.onnxtext>"),
                             cl::Required, cl::cat(category));
  registerPipecSettings(options, category);
  registerScheduleOptions();
  // cl::desc keeps a pointer: the text must outlive the option.
  const std::string emitHelp =
      std::string("Print the IR after this phase and stop (") + pipec::passes::phaseNames() + ")";
  cl::opt<std::string> emit(
      "emit",
      cl::desc(emitHelp),
      cl::value_desc("phase"), cl::cat(category));
  cl::opt<std::string> output("o", cl::desc("Output file for --emit (default: stdout)"),
                              cl::value_desc("file"), cl::init("-"), cl::cat(category));
  cl::opt<std::string> dumpIr(
      "dump-ir", cl::desc("Write the IR after import and after every pass into this folder, "
                          "numbered in order"),
      cl::value_desc("dir"), cl::cat(category));
  cl::list<std::string> inputShapes(
      "input-shape",
      cl::desc("Static shape of a model input with dynamic dimensions (repeatable); d0 may be b, the "
               "micro-batch size (--micro-batch-size, or the planner's choice)"),
      cl::value_desc("name=d0,d1,..."), cl::cat(category));
  cl::list<std::string> freeze(
      "freeze",
      cl::desc("Keep the parameters whose whole ONNX initializer name matches this regular "
               "expression constant (repeatable; the import summary lists them)"),
      cl::value_desc("regex"), cl::cat(category));
  cl::opt<pipec::import::BatchNormStatistics> batchNorm(
      "batchnorm", cl::desc(pipec::import::kBatchNormFlagHelp),
      pipec::import::batchNormFlagValues(), cl::init(pipec::import::BatchNormStatistics::Batch),
      cl::cat(category));
  cl::opt<int64_t> elide(
      "elide-constants",
      cl::desc("When printing IR, elide constants with more elements than this (0: never)"),
      cl::value_desc("n"), cl::init(0), cl::cat(category));
  cl::opt<bool> printLocations(
      "print-locations", cl::desc("Print the ONNX node each op comes from (its location)"),
      cl::cat(category));
  cl::opt<unsigned> optLevel(
      "O", cl::Prefix,
      cl::desc("Stage code optimisation: -O0 one kernel call and one buffer per op; -O2 "
               "(default) GEMM canonicalisation, element-wise fusion and a static memory plan "
               "(docs/optimization.md)"),
      cl::value_desc("level"), cl::init(2), cl::cat(category));
  // The pass manager's own options: --mlir-timing, --mlir-pass-statistics,
  // --mlir-print-ir-after-all and the rest, listed by --help under their category.
  cl::OptionCategory mlirCategory("MLIR pass manager options");
  mlir::registerPassManagerCLOptions();
  mlir::registerDefaultTimingManagerCLOptions();
  for (auto &entry : cl::getRegisteredOptions())
    if (entry.first.starts_with("mlir-"))
      entry.second->addCategory(mlirCategory);
  cl::HideUnrelatedOptions({&category, &partitionCategory(), &mlirCategory});
  // A malformed command line (an unknown option, a missing value) is a usage
  // error: llvm::cl's message and exit 2, in every subcommand.
  if (!cl::ParseCommandLineOptions(argc, argv, overview, &llvm::errs()))
    return 2;
  if (partitionSubcommand())
    return onlyOwnOptions(partitionSubcommand()) ? runPartitionSubcommand() : 2;
  if (scheduleSubcommand())
    return onlyOwnOptions(scheduleSubcommand()) ? runScheduleSubcommand() : 2;

  try {
    applyPipecSettings();
  } catch (const pipec::settings::SettingError &error) {
    llvm::errs() << "error: " << error.what() << "\n";
    return 2;
  }

  options.inputPath = input;
  options.outputPath = output;
  options.dumpIrDirectory = dumpIr;
  options.elideConstantsLargerThan = elide;
  options.printLocations = printLocations;
  if (optLevel != 0 && optLevel != 2) {
    llvm::errs() << "error: -O" << optLevel << ": the levels are -O0 and -O2\n";
    return 2;
  }
  options.optLevel = optLevel == 0 ? pipec::passes::OptLevel::O0 : pipec::passes::OptLevel::O2;
  if (!emit.empty()) {
    options.emit = pipec::parsePhase(emit);
    if (!options.emit) {
      llvm::errs() << "error: unknown phase '" << emit
                   << "' for --emit (phases: " << pipec::passes::phaseNames() << ")\n";
      return 2;
    }
  }
  options.importOptions.freeze.assign(freeze.begin(), freeze.end());
  options.importOptions.batchNorm = batchNorm;
  for (const auto &text : inputShapes) {
    std::string error;
    if (!pipec::import::parseInputShape(text, options.importOptions, error)) {
      llvm::errs() << "error: " << error << "\n";
      return 2;
    }
  }
  if (elide < 0) {
    llvm::errs() << "error: --elide-constants " << elide << ": must be >= 0\n";
    return 2;
  }
  return pipec::runCompiler(options, llvm::outs(), llvm::errs());
}
} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // Every error is a message and exit status 1, never an abort: the phases
  // report their own errors; this catches whatever escapes them.
  try {
    return runPipec(argc, argv);
  } catch (const std::bad_alloc &) {
    llvm::errs() << "error: out of memory\n";
  } catch (const std::exception &error) {
    llvm::errs() << "error: " << error.what() << "\n";
  }
  return 1;
}
