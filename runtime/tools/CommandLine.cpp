#include "CommandLine.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <optional>

namespace pipec::rt {

namespace {
// The usage line names how the tool is started (piperun under mpirun).
class Formatter : public CLI::Formatter {
public:
  explicit Formatter(std::string usage) : usage_(std::move(usage)) {}
  std::string make_usage(const CLI::App *, std::string) const override { return usage_ + "\n"; }

private:
  std::string usage_;
};

// An option whose value goes through one of JobCheck.h's parsers (which
// throw Error naming the option and the value).
template <class Set>
CLI::Option *checked(CLI::App &app, const std::string &name, const std::string &type, const std::string &help, Set set) {
  return app.add_option_function<std::string>(name, [name, set](const std::string &v) { set(name, v); }, help)
      ->type_name(type);
}
} // namespace

CommandLine parseCommandLine(Tool tool, int argc, char **argv, RunOptions &o) {
  const bool piperun = tool == Tool::Piperun;
  CommandLine result;
  CLI::App app(piperun ? "piperun: runs a pipec plan directory on MPI ranks (docs/runtime.md)."
                       : "pipeseq: the single-process reference for piperun (docs/runtime.md, \"The reference "
                         "pipeseq\").",
               piperun ? "piperun" : "pipeseq");
  app.formatter(std::make_shared<Formatter>(
      piperun ? "usage: mpirun -np R piperun PLAN_DIR [options]"
              : "usage: pipeseq PLAN_DIR --iters N [options]"));
  app.get_formatter()->column_width(24);
  app.get_formatter()->label("REQUIRED", "");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast); // the last one counts

  auto count = [&](int &dst) {
    return [&dst](const std::string &name, const std::string &v) { dst = (int)parseCount(name, v, 1, kMaxIterations); };
  };
  auto real = [](std::optional<double> &dst) {
    return [&dst](const std::string &name, const std::string &v) { dst = parseReal(name, v); };
  };
  app.add_option("PLAN_DIR", o.planDir, "the plan directory pipec wrote")->required()->type_name("");
  checked(app, "--iters", "N",
          std::string("iterations (optimizer steps of m micro-batches) to reach; default 1\n(1 .. 1000000000") +
              (piperun ? "; --log-every and --save-every likewise)" : ")"),
          count(o.iters));
  app.add_option("--data", o.dataFile, "data set (docs/dataset-format.md); default: synthetic data from the plan")
      ->type_name("FILE");
  checked(app, "--data-dtype", "uint16|uint32",
          "--data is a token file: a flat array of these token ids, windows of the\nmodel's sequence length, "
          "labels shifted by one (a language model's plan)",
          [&o](const std::string &name, const std::string &v) {
            TokenDtype dtype;
            if (!parseChoice(v, dtype))
              throw Error(name + " \"" + v + "\": expected " + choiceNames<TokenDtype>(" or "));
            o.dataDtype = dtype;
          });
  app.add_option("--eval-data", o.evalDataFile,
                 "held-out data (as --data, and with --data-dtype a token file too): a mean\nvalidation loss, "
                 "forward only, without dropout, BatchNorm on its running statistics")
      ->type_name("FILE");
  checked(app, "--eval-every", "K", "validate every K iterations and at the end (default: at the end)",
          count(o.evalEvery));
  checked(app, "--eval-iters", "N",
          "rounds of m micro-batches per validation (default: the held-out set once)", count(o.evalIters));
  if (piperun) {
    checked(app, "--log-every", "K", "progress line every K iterations (default 1)", count(o.logEvery));
    app.add_option("--checkpoint", o.checkpointDir, "write checkpoints to DIR ...")->type_name("DIR");
    checked(app, "--save-every", "K", "... every K iterations", count(o.saveEvery));
  }
  app.add_option("--resume", o.resumeDir, "continue from a checkpoint (DIR or DIR/latest)")->type_name("DIR");
  app.add_option("--export-weights", o.exportDir,
                 "write the trained weights: DIR, one file per stage, or OUT.safetensors, one file keyed by\n"
                 "the ONNX initializer names (docs/weights-format.md)")
      ->type_name("DIR|FILE");
  if (piperun) {
    app.add_option("--trace", o.traceFile, "measured timeline as a Chrome trace (merged on rank 0; target cpu)")
        ->type_name("FILE");
    app.add_option("--profile", o.profileFile,
                   "per-op times (pipec.profile/1) measured with the stages' op timers")
        ->type_name("FILE");
  }
  checked(app, "--seed", "S", "override runtime.seed (synthetic data, dropout); an integer in [0, 2^64)",
          [&o](const std::string &name, const std::string &v) { o.seed = parseSeed(name, v), o.seedSet = true; });
  checked(app, "--lr", "X", "override runtime.optimizer's lr (>= 0)", real(o.optimizer.lr));
  checked(app, "--weight-decay", "X", "... its weight decay (>= 0)", real(o.optimizer.weightDecay));
  checked(app, "--momentum", "X", "... its momentum (in [0, 1))", real(o.optimizer.momentum));
  checked(app, "--max-grad-norm", "X", "... its max-grad-norm (>= 0, 0 = no clipping);\n"
                                       "NaN and inf refused, as in plan.json", real(o.optimizer.maxGradNorm));
  if (piperun)
    checked(app, "--watchdog", "SECONDS",
            "exit with an error naming the instruction and the rank it waits for if a\n"
            "rank makes no progress for that long; 0 turns it off. Default: 600 s during\n"
            "start-up, the first iteration and checkpoints, then max(60 s, 10x the\n"
            "slowest iteration)",
            [&o](const std::string &name, const std::string &v) {
              o.watchdogSeconds = parseReal(name, v);
              if (!std::isfinite(o.watchdogSeconds) || o.watchdogSeconds < 0)
                throw Error(name + ": \"" + v + "\" must be a number of seconds >= 0 (0: off)");
            });
  if (piperun)
    checked(app, "--threads", "N",
            "threads per rank for the CPU kernels (OpenBLAS and OpenMP loops; 1 .. 1024).\n"
            "Default: OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else the cores this\n"
            "rank may run on divided by the ranks of this node sharing them (at least 1).\n"
            "Results do not depend on it",
            [&result](const std::string &name, const std::string &v) {
              result.threads = (int)parseCount(name, v, 1, kMaxThreads);
            });
  app.add_flag("--allow-nonfinite", o.allowNonFinite,
               "keep training after a NaN/inf loss or gradient (default: stop, naming the\n"
               "iteration, micro-batch and stage)");
  if (piperun) {
    app.add_flag("--quiet", o.quiet, "no progress lines");
    app.add_flag("--no-cuda-graphs", o.noCudaGraphs,
                 "CUDA target: every kernel issued from the host instead of CUDA graphs of the\n"
                 "stage calls replayed (docs/cuda-codegen.md); the results are the same");
    app.footer("All ranks must run the same job: at start-up they compare plan.json, the schedule files, every\n"
               "stage's library and weights, the piperun executable and the options above (not --log-every,\n"
               "--quiet, --watchdog, --threads), and refuse to start when they differ.\n"
               "The plan's runtime.target picks the path: cpu (host memory, MPI) or cuda (GPU\n"
               "node-local rank mod the node's GPUs; NCCL between ranks on different GPUs, CUDA\n"
               "IPC or pinned host memory between ranks sharing one; needs a piperun built with\n"
               "CUDA and NCCL). docs/runtime.md.\n"
               "Environment: PIPEC_CUDNN_ATTENTION=0 runs the CUDA stages' attention on pipec's\n"
               "kernels instead of cuDNN's flash attention, PIPEC_CUDNN_CONV=0 the convolutions on\n"
               "pipec's im2col kernels instead of cuDNN's (diagnosis; docs/cuda-kernels.md).\n"
               "PIPEC_SAME_GPU_TRANSPORT=auto|ipc|staged: how ranks sharing a GPU move bundles\n"
               "(default auto: CUDA IPC where allowed, else host memory). PIPEC_NCCL_SAME_GPU=1:\n"
               "NCCL between every pair, ranks of one GPU too (testing NCCL on one GPU;\n"
               "docs/runtime.md, \"Ranks sharing a GPU\").");
  } else {
    app.footer("Options and hyper-parameters are checked by the same code as piperun's.");
  }

  result.help = app.help();
  try {
    app.parse(argc, argv);
    if (!o.checkpointDir.empty() && o.saveEvery == 0) throw Error("--checkpoint needs --save-every K");
    if (o.checkpointDir.empty() && o.saveEvery) throw Error("--save-every needs --checkpoint DIR");
  } catch (const CLI::CallForHelp &) {
    result.outcome = CommandLine::Help;
  } catch (const CLI::ParseError &e) {
    result.outcome = CommandLine::Invalid, result.error = e.what();
  } catch (const Error &e) {
    result.outcome = CommandLine::Invalid, result.error = e.what();
  }
  return result;
}

} // namespace pipec::rt
