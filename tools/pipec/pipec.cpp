// pipec: compiles an ONNX model into a pipeline-parallel training job.
#include "compiler/Driver/Compiler.h"
#include "compiler/Schedule/Schedule.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>

namespace cl = llvm::cl;

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // Subcommands that work without a model.
  if (argc > 1 && std::strcmp(argv[1], "schedule") == 0)
    return pipec::schedule::runScheduleCommand(argc - 1, argv + 1);

  cl::OptionCategory category("pipec options");
  cl::opt<std::string> input(cl::Positional, cl::desc("<model.onnx | model.onnxtext>"),
                             cl::Required, cl::cat(category));
  cl::opt<std::string> emit(
      "emit", cl::desc("Print the IR after this phase and stop (phases: nn)"),
      cl::value_desc("phase"), cl::cat(category));
  cl::opt<std::string> output("o", cl::desc("Output file for --emit (default: stdout)"),
                              cl::value_desc("file"), cl::init("-"), cl::cat(category));
  cl::opt<std::string> dumpIr(
      "dump-ir", cl::desc("Write the IR after every phase into this folder, numbered in order"),
      cl::value_desc("dir"), cl::cat(category));
  cl::list<std::string> inputShapes(
      "input-shape",
      cl::desc("Static shape of a model input with dynamic dimensions (repeatable)"),
      cl::value_desc("name=d0,d1,..."), cl::cat(category));
  cl::opt<int64_t> elide(
      "elide-constants",
      cl::desc("When printing IR, elide constants with more elements than this (0: never)"),
      cl::value_desc("n"), cl::init(0), cl::cat(category));
  cl::opt<bool> printLocations(
      "print-locations", cl::desc("Print the ONNX node each op comes from (its location)"),
      cl::cat(category));
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "pipec: compile an ONNX model into a pipeline-parallel training job\n\n"
      "  pipec schedule --help            explore pipeline schedules without a model\n"
      "  pipec model.onnx                 import and print a summary\n"
      "  pipec model.onnx --emit=nn       print the imported `nn` IR\n"
      "  pipec model.onnx --dump-ir DIR   write the IR after every phase into DIR\n");

  pipec::CompileOptions options;
  options.inputPath = input;
  options.outputPath = output;
  options.dumpIrDirectory = dumpIr;
  options.elideConstantsLargerThan = elide;
  options.printLocations = printLocations;
  if (!emit.empty()) {
    options.emit = pipec::parsePhase(emit);
    if (!options.emit) {
      llvm::errs() << "error: unknown phase '" << emit << "' for --emit (phases: nn)\n";
      return 1;
    }
  }
  for (const auto &text : inputShapes) {
    std::string error;
    if (!pipec::import::parseInputShape(text, options.importOptions, error)) {
      llvm::errs() << "error: " << error << "\n";
      return 1;
    }
  }
  return pipec::runCompiler(options, llvm::outs(), llvm::errs());
}
