// pipec: compiles an ONNX model into a pipeline-parallel training job.
#include "PartitionOptions.h"
#include "ScheduleOptions.h"

#include "compiler/Driver/Compiler.h"
#include "compiler/Import/BatchNormFlag.h"
#include "analysis/Partition/Error.h"
#include "analysis/Schedule/Schedule.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <new>

namespace cl = llvm::cl;
using namespace pipec::tools;

namespace {
int runPipec(int argc, char **argv) {
  // One command line, three commands (llvm::cl subcommands): `pipec MODEL`
  // (the top level), `pipec partition` and `pipec schedule`. The topology and
  // partition flags are declared once for the top level and `pipec partition`
  // (PartitionOptions.cpp).
  registerPartitionOptions();
  registerScheduleOptions();
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
      cl::desc("Static shape of a model input with dynamic dimensions (repeatable)"),
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
  cl::opt<std::string> precision(
      "precision", cl::desc("Compute precision of matrix products: fp32, tf32 or bf16"),
      cl::init("fp32"), cl::cat(category));
  cl::opt<std::string> optimizer(
      "optimizer", cl::desc("Optimizer whose state counts in memory: adamw, sgd-momentum, sgd"),
      cl::init("adamw"), cl::cat(category));
  cl::opt<std::string> profile(
      "profile", cl::desc("Measured per-op times (docs/profile-json.md) overriding estimates"),
      cl::value_desc("profile.json"), cl::cat(category));
  cl::opt<std::string> dumpCosts(
      "dump-costs", cl::desc("Write the cost table, one row per op (docs/cost-table.md)"),
      cl::value_desc("costs.csv"), cl::cat(category));
  // The schedule families' names and chunk counts come from their table
  // (analysis/Schedule/Families.cpp); cl::desc keeps a pointer to the text.
  using pipec::schedule::ScheduleFamily;
  using pipec::schedule::scheduleFamilyNames;
  const std::string scheduleHelp =
      "Pipeline schedule: " + scheduleFamilyNames() +
      " (default: the planner picks among the synchronous ones; " +
      scheduleFamilyNames([](const ScheduleFamily &f) { return f.asynchronous; }, " or ") + " with --async)";
  std::string fixedChunks;
  for (const ScheduleFamily &f : pipec::schedule::scheduleFamilies())
    if (!f.anyChunks && f.chunks > 1)
      fixedChunks += (fixedChunks.empty() ? "" : ", ") + std::string(f.name) + ": " + std::to_string(f.chunks);
  const std::string chunksHelp =
      "Model chunks per rank for --schedule " +
      scheduleFamilyNames([](const ScheduleFamily &f) { return f.anyChunks; }, " or ") +
      (fixedChunks.empty() ? "" : " (" + fixedChunks + ")") +
      "; the model is split into ranks x chunks virtual stages";
  cl::opt<std::string> scheduleName("schedule", cl::desc(scheduleHelp), cl::value_desc("name"),
                                    cl::cat(category));
  cl::opt<std::string> loss(
      "loss",
      cl::desc("Loss appended to a model ending in logits: softmax-cross-entropy, mse, or auto "
               "(default: softmax-cross-entropy, or the model's own loss when its first output "
               "is a scalar)"),
      cl::init("auto"), cl::cat(category));
  cl::opt<double> learningRate("lr", cl::desc("Learning rate"), cl::init(1e-3), cl::cat(category));
  cl::opt<double> momentum("momentum", cl::desc("SGD momentum"), cl::init(0.0), cl::cat(category));
  cl::opt<double> weightDecay("weight-decay",
                              cl::desc("Weight decay (default: 0.01 for AdamW, 0 for SGD)"),
                              cl::init(-1.0), cl::cat(category));
  cl::opt<bool> verticalSync("vertical-sync",
                             cl::desc("With --async: every stage uses the weight version a "
                                      "micro-batch entered stage 0 with"),
                             cl::cat(category));
  cl::opt<bool> build("build", cl::desc("Compile the generated stages (with --out DIR)"),
                      cl::cat(category));
  cl::opt<unsigned> optLevel(
      "O", cl::Prefix,
      cl::desc("Stage code optimisation: -O0 one kernel call and one buffer per op; -O2 "
               "(default) GEMM canonicalisation, element-wise fusion and a static memory plan "
               "(docs/optimization.md)"),
      cl::value_desc("level"), cl::init(2), cl::cat(category));
  cl::opt<std::string> target(
      "target",
      cl::desc("Stage code: cpu (C++ on the CPU kernels) or cuda (CUDA C++ on cuBLAS and the "
               "CUDA kernels, NCCL between ranks)"),
      cl::init("cpu"), cl::cat(category));
  cl::opt<std::string> cudaArch(
      "cuda-arch",
      cl::desc("GPU architectures the CUDA stages are built for, comma-separated"),
      cl::value_desc("sm_80,sm_90"), cl::init("sm_80,sm_90"), cl::cat(category));
  cl::opt<uint64_t> seed("seed", cl::desc("Seed of dropout masks and synthetic data"),
                         cl::init(0), cl::cat(category));
  cl::opt<int> chunks("chunks", cl::desc(chunksHelp), cl::init(0), cl::cat(category));
  cl::opt<int> candidates(
      "candidates",
      cl::desc("Print the best N plans the planner evaluated, with their simulated times"),
      cl::value_desc("n"), cl::init(3), cl::cat(category));
  cl::opt<int> planRank(
      "plan-rank",
      cl::desc("Choose the K-th plan of the planner's ranking instead of the best (1); "
               "--candidates lists them"),
      cl::value_desc("k"), cl::init(1), cl::cat(category));
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
    return runPartitionSubcommand();
  if (scheduleSubcommand())
    return runScheduleSubcommand();

  try {
    readPartitionOptions(options.partition);
  } catch (const pipec::partition::Error &error) {
    llvm::errs() << "error: " << error.what() << "\n";
    return 2;
  }

  options.inputPath = input;
  options.outputPath = output;
  options.dumpIrDirectory = dumpIr;
  options.elideConstantsLargerThan = elide;
  options.printLocations = printLocations;
  options.precision = precision;
  options.optimizer = optimizer;
  options.profilePath = profile;
  options.dumpCostsPath = dumpCosts;
  options.scheduleName = scheduleName;
  options.chunks = chunks;
  options.candidates = candidates;
  options.planRank = planRank;
  options.loss = loss;
  options.learningRate = learningRate;
  options.momentum = momentum;
  options.weightDecay = weightDecay;
  options.verticalSync = verticalSync;
  options.build = build;
  if (optLevel != 0 && optLevel != 2) {
    llvm::errs() << "error: -O" << optLevel << ": the levels are -O0 and -O2\n";
    return 2;
  }
  options.optLevel = optLevel == 0 ? pipec::passes::OptLevel::O0 : pipec::passes::OptLevel::O2;
  options.seed = seed;
  options.target = target;
  options.cudaArchs.clear();
  for (llvm::StringRef rest = cudaArch; !rest.empty();) {
    auto [arch, tail] = rest.split(',');
    if (!arch.trim().empty())
      options.cudaArchs.push_back(arch.trim().str());
    rest = tail;
  }
  if (!emit.empty()) {
    options.emit = pipec::parsePhase(emit);
    if (!options.emit) {
      llvm::errs() << "error: unknown phase '" << emit
                   << "' for --emit (phases: " << pipec::passes::phaseNames() << ")\n";
      return 1;
    }
  }
  options.importOptions.freeze.assign(freeze.begin(), freeze.end());
  options.importOptions.batchNorm = batchNorm;
  for (const auto &text : inputShapes) {
    std::string error;
    if (!pipec::import::parseInputShape(text, options.importOptions, error)) {
      llvm::errs() << "error: " << error << "\n";
      return 1;
    }
  }
  if (!std::isfinite(learningRate) || !(learningRate > 0) || learningRate > 1e6) {
    llvm::errs() << "error: --lr " << llvm::format("%g", double(learningRate)) << ": must be positive, finite and at most 1e6\n";
    return 1;
  }
  if (!(momentum >= 0 && momentum < 1)) {
    llvm::errs() << "error: --momentum " << llvm::format("%g", double(momentum)) << ": must be in [0, 1)\n";
    return 1;
  }
  if (weightDecay != -1.0 && !(weightDecay >= 0 && weightDecay <= 1e6)) {
    llvm::errs() << "error: --weight-decay " << weightDecay << ": must be >= 0, finite and at most 1e6\n";
    return 1;
  }
  if (chunks < 0 || chunks > pipec::schedule::kMaxChunks) {
    llvm::errs() << "error: --chunks " << chunks << ": must be between 1 and "
                 << pipec::schedule::kMaxChunks << " (0: the schedule's default)\n";
    return 1;
  }
  if (candidates < 0 || candidates > 1000) {
    llvm::errs() << "error: --candidates " << candidates << ": must be between 0 and 1000\n";
    return 1;
  }
  if (planRank < 1 || planRank > 1000) {
    llvm::errs() << "error: --plan-rank " << planRank << ": must be between 1 and 1000\n";
    return 1;
  }
  if (elide < 0) {
    llvm::errs() << "error: --elide-constants " << elide << ": must be >= 0\n";
    return 1;
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
