// piperun: runs a pipec plan directory on MPI ranks.
//   mpirun -np R piperun PLAN_DIR [options]      (docs/runtime.md)
// The plan's runtime.target picks where buffers live and how tensors move:
// cpu: host memory + MPI; cuda: the rank's GPU (CudaDevice) + NCCL
// (NcclTransport), built when CUDA and NCCL were found (PIPEC_HAVE_CUDA).
#include "../src/Executor.h"
#include "../src/MpiTransport.h"
#ifdef PIPEC_HAVE_CUDA
#include "../src/CudaDevice.h"
#include "../src/NcclTransport.h"
#endif

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>

using namespace pipec::rt;

namespace {
const char *kUsage =
    "usage: mpirun -np R piperun PLAN_DIR [options]\n"
    "  --iters N            iterations (optimizer steps of m micro-batches) to reach; default 1\n"
    "  --data FILE          data set (docs/dataset-format.md); default: synthetic data from the plan\n"
    "  --log-every K        progress line every K iterations (default 1)\n"
    "  --checkpoint DIR     write checkpoints to DIR ...\n"
    "  --save-every K       ... every K iterations\n"
    "  --resume DIR         continue from a checkpoint (DIR or DIR/latest)\n"
    "  --export-weights DIR write the trained weights, one file per stage (docs/weights-format.md)\n"
    "  --trace FILE         measured timeline as a Chrome trace (merged on rank 0; target cpu)\n"
    "  --profile FILE       per-op times (pipec.profile/1) measured with the stages' op timers\n"
    "  --seed S             override runtime.seed (synthetic data, dropout)\n"
    "  --lr X --weight-decay X --momentum X --max-grad-norm X   override runtime.optimizer\n"
    "  --watchdog SECONDS   exit with an error naming the instruction if one takes longer\n"
    "  --quiet              no progress lines\n"
    "The plan's runtime.target picks the path: cpu (host memory, MPI) or cuda (one GPU\n"
    "per rank, chosen by node-local rank; NCCL between ranks; needs a piperun built\n"
    "with CUDA and NCCL). docs/runtime.md.\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

RunOptions parseArgs(int argc, char **argv) {
  RunOptions o;
  auto value = [&](int &i) -> std::string {
    if (i + 1 >= argc) throw UsageError(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int &i) -> double {
    const std::string flag = argv[i], v = value(i);
    char *end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end) throw UsageError(flag + ": \"" + v + "\" is not a number");
    return d;
  };
  auto integer = [&](int &i, long lo) -> long {
    const std::string flag = argv[i];
    const double d = number(i);
    if (d != (double)(long)d || d < lo) throw UsageError(flag + " needs an integer >= " + std::to_string(lo));
    return (long)d;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters") o.iters = (int)integer(i, 0);
    else if (a == "--data") o.dataFile = value(i);
    else if (a == "--log-every") o.logEvery = (int)integer(i, 1);
    else if (a == "--checkpoint") o.checkpointDir = value(i);
    else if (a == "--save-every") o.saveEvery = (int)integer(i, 1);
    else if (a == "--resume") o.resumeDir = value(i);
    else if (a == "--export-weights") o.exportDir = value(i);
    else if (a == "--trace") o.traceFile = value(i);
    else if (a == "--profile") o.profileFile = value(i);
    else if (a == "--seed") o.seed = (uint64_t)integer(i, 0), o.seedSet = true;
    else if (a == "--lr") o.lr = (float)number(i), o.lrSet = true;
    else if (a == "--weight-decay") o.weightDecay = (float)number(i), o.wdSet = true;
    else if (a == "--momentum") o.momentum = (float)number(i), o.momentumSet = true;
    else if (a == "--max-grad-norm") o.maxGradNorm = (float)number(i), o.clipSet = true;
    else if (a == "--watchdog") o.watchdogSeconds = number(i);
    else if (a == "--quiet") o.quiet = true;
    else if (a == "--help" || a == "-h") throw UsageError("");
    else if (!a.empty() && a[0] == '-') throw UsageError("unknown option " + a);
    else if (o.planDir.empty()) o.planDir = a;
    else throw UsageError("unexpected argument " + a);
  }
  if (o.planDir.empty()) throw UsageError("missing PLAN_DIR");
  if (!o.checkpointDir.empty() && o.saveEvery == 0) throw UsageError("--checkpoint needs --save-every K");
  if (o.checkpointDir.empty() && o.saveEvery) throw UsageError("--save-every needs --checkpoint DIR");
  return o;
}

// Start-up errors are agreed on by all ranks: each rank reports its own
// error (naming itself, the file and the reason), then every rank exits
// non-zero, so nothing waits for a rank that gave up.
bool agree(Control &control, const std::string &who, const std::string &error) {
  if (!error.empty()) std::fprintf(stderr, "piperun: %s: error: %s\n", who.c_str(), error.c_str()), std::fflush(stderr);
  const auto all = control.allgatherStrings(error);
  int failed = 0, first = -1;
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) ++failed, first = first < 0 ? (int)r : first;
  if (failed && control.rank() == 0)
    std::fprintf(stderr, "piperun: %d of %d ranks failed to start (first: rank %d); all ranks exit\n", failed,
                 control.size(), first);
  return failed == 0;
}

// The device and transport of the plan's target; throws Error (with the
// reason and the way out) when this piperun or this machine cannot run it.
void makeTarget(const Plan &plan, const RunOptions &opt, MpiControl &control, std::unique_ptr<Device> &device,
                std::unique_ptr<Transport> &transport) {
  if (plan.target == "cpu") {
    transport = std::make_unique<MpiTransport>(control);
    return;
  }
#ifndef PIPEC_HAVE_CUDA
  (void)opt, (void)device;
  throw Error(plan.planPath + ": runtime.target is \"cuda\", but this piperun was built without CUDA; rebuild with nvcc "
              "and NCCL present, or compile the model with --target cpu");
#else
  // Flags whose CPU meaning does not carry over to stream-ordered execution.
  if (!opt.traceFile.empty())
    throw Error("--trace times instructions on the host, which on the CUDA target only enqueues them; it is not "
                "supported with runtime.target \"cuda\" (use Nsight Systems: nsys profile mpirun ... piperun)");
  auto cuda = std::make_unique<CudaDevice>(control.localRank()); // the first CUDA call
  cuda->checkArchitectures(plan.cudaArch);
  transport = std::make_unique<NcclTransport>(control, *cuda);
  device = std::move(cuda);
#endif
}

void banner(const Plan &plan, const Device &device, const Transport &transport, int ranks) {
  std::string target = plan.target + " (" + plan.precision;
  if (plan.target == "cuda") {
    std::string archs;
    for (const std::string &a : plan.cudaArch) archs += (archs.empty() ? "" : ",") + a;
    if (!archs.empty()) target += ", " + archs;
    if (!plan.gpu.empty()) target += ", planned for " + plan.gpu;
  }
  target += ")";
  std::printf("piperun: %s: schedule %s, %d stage%s x %d chunk%s, %d micro-batches of %d, %d rank%s, target %s, "
              "transport %s%s\n",
              plan.dir.c_str(), plan.schedule.c_str(), plan.stages, plan.stages == 1 ? "" : "s", plan.chunks,
              plan.chunks == 1 ? "" : "s", plan.microbatches, plan.microbatchSize, ranks, ranks == 1 ? "" : "s",
              target.c_str(), transport.name(),
              device.host() ? "" : (", rank 0 on " + device.describe()).c_str());
  std::fflush(stdout);
}
} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    MpiControl control;
    const std::string rankName = "rank " + std::to_string(control.rank());
    RunOptions opt;
    std::string error;
    try {
      opt = parseArgs(argc, argv);
    } catch (const UsageError &e) {
      if (control.rank() == 0) {
        if (*e.what()) std::fprintf(stderr, "piperun: error: %s\n", e.what());
        std::fputs(kUsage, *e.what() ? stderr : stdout);
      }
      MPI_Finalize();
      return *e.what() ? 2 : 0;
    }
    // Destroyed in reverse: the executor's buffers, then the transport's
    // communicators, then the device (its streams).
    std::unique_ptr<Plan> plan;
    std::unique_ptr<Device> device; // null: the host device
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Executor> exec;
    try {
      plan = std::make_unique<Plan>(loadPlan(opt.planDir));
      makeTarget(*plan, opt, control, device, transport);
      exec = std::make_unique<Executor>(*plan, opt, control, *transport, device ? *device : hostDevice());
    } catch (const std::exception &e) {
      error = e.what();
    }
    std::string who = exec ? exec->who() : rankName;
    if (!agree(control, who, error)) status = 1;
    if (status == 0) {
      try {
        exec->checkNeighbours();
      } catch (const std::exception &e) {
        error = e.what();
      }
      if (!agree(control, who, error)) status = 1;
    }
    if (status == 0) {
      try {
        exec->connect(); // NCCL communicators (collective)
      } catch (const std::exception &e) {
        error = e.what();
      }
      if (!agree(control, who, error)) status = 1;
    }
    if (status == 0 && control.rank() == 0 && !opt.quiet)
      banner(*plan, device ? *device : hostDevice(), *transport, control.size());
    if (status == 0) {
      try {
        exec->run();
      } catch (const std::exception &e) {
        // Mid-run the other ranks may be blocked on this one: abort the job.
        std::fprintf(stderr, "piperun: %s: error: %s\n", who.c_str(), e.what());
        std::fflush(stderr);
        control.abort(1);
      }
    }
    exec.reset();
    transport.reset();
    device.reset();
  }
  MPI_Finalize();
  return status;
}
