// piperun: runs a pipec plan directory on MPI ranks.
//   mpirun -np R piperun PLAN_DIR [options]      (docs/runtime.md)
// The plan's runtime.target picks where buffers live and how tensors move:
// cpu: host memory + MPI; cuda: the rank's GPU (CudaDevice) + NCCL
// (GpuTransport), built when CUDA and NCCL were found (PIPEC_HAVE_CUDA).
#include "CommandLine.h"
#include "../src/Executor.h"
#include "../src/JobCheck.h"
#include "pipec/input_file.h"
#include "../src/MpiTransport.h"
#ifdef PIPEC_HAVE_CUDA
#include "../src/CudaDevice.h"
#include "../src/GpuTransport.h"
#endif

#include <mpi.h>

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

using namespace pipec::rt;
using pipec::Target;

namespace {
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

// What this rank was started with, as digests all ranks compare
// (docs/runtime.md, "Job identity"). Also checks the hyper-parameters
// (throws Error naming the option or file and the value).
JobIdentity jobIdentity(const Plan &plan, const RunOptions &o) {
  namespace fs = std::filesystem;
  const OptimizerConfig opt = resolveOptimizer(plan, o.optimizer);

  JobIdentity id;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  addFile(id, "the piperun executable", "", ec ? std::string("/proc/self/exe") : exe.string(), "executable");
  addPlanFiles(id, plan);
  auto option = [&](const std::string &name, const std::string &value, const std::string &shown) {
    id[name] = {value, shown};
  };
  option("--iters", std::to_string(o.iters), "was started with --iters " + std::to_string(o.iters));
  const uint64_t seed = o.seedSet ? o.seed : plan.seed;
  option("the seed", std::to_string(seed),
         "runs with seed " + std::to_string(seed) + (o.seedSet ? " (--seed)" : " (plan.json runtime.seed)"));
  const struct { const char *name, *flag; float value; bool set; } hyper[] = {
      {"lr", "--lr", opt.lr, o.optimizer.lr.has_value()},
      {"weight decay", "--weight-decay", opt.weightDecay, o.optimizer.weightDecay.has_value()},
      {"momentum", "--momentum", opt.momentum, o.optimizer.momentum.has_value()},
      {"max grad norm", "--max-grad-norm", opt.maxGradNorm, o.optimizer.maxGradNorm.has_value()}};
  for (const auto &h : hyper)
    option(std::string("the ") + h.name, shortestText(h.value),
           std::string("runs with ") + h.name + " " + shortestText(h.value) +
               (h.set ? std::string(" (") + h.flag + ")" : std::string(" (plan.json)")));
  if (o.dataFile.empty())
    option("--data", "synthetic", "was started without --data (the plan's synthetic data)");
  else
    addFile(id, "--data", "--data", o.dataFile, "data set");
  option("--data-dtype", o.dataDtype ? choiceName(*o.dataDtype) : "none",
         o.dataDtype ? std::string("reads --data as a token file of ") + choiceName(*o.dataDtype) + " ids"
                     : "was started without --data-dtype");
  // Validations are collective: every rank runs them at the same iterations.
  if (o.evalDataFile.empty())
    option("--eval-data", "none", "was started without --eval-data");
  else
    addFile(id, "--eval-data", "--eval-data", o.evalDataFile, "held-out data set");
  option("--eval-every", std::to_string(o.evalEvery), "was started with --eval-every " + std::to_string(o.evalEvery));
  option("--eval-iters", std::to_string(o.evalIters), "was started with --eval-iters " + std::to_string(o.evalIters));
  if (o.resumeDir.empty()) {
    option("--resume", "none", "was started without --resume");
  } else {
    // The checkpoint it resumes from: its manifest (iteration, seed, plan
    // shape), found as loadCheckpoint finds it (DIR or DIR/latest).
    fs::path dir(o.resumeDir);
    if (!fs::exists(dir / "manifest.json")) {
      try {
        std::string name = pipec::io::readInputFile((dir / "latest").string(), "checkpoint pointer", 4096);
        while (!name.empty() && std::isspace((unsigned char)name.back())) name.pop_back();
        dir /= name;
      } catch (const pipec::io::InputError &) {
      }
    }
    addFile(id, "--resume", "--resume", (dir / "manifest.json").string(), "checkpoint manifest");
  }
  option("--checkpoint", o.checkpointDir.empty() ? "none" : o.checkpointDir + " every " + std::to_string(o.saveEvery),
         o.checkpointDir.empty() ? "was started without --checkpoint"
                                 : "was started with --checkpoint " + o.checkpointDir + " --save-every " +
                                       std::to_string(o.saveEvery));
  for (const auto &[flag, value] : {std::pair<const char *, const std::string &>{"--trace", o.traceFile},
                                    {"--profile", o.profileFile},
                                    {"--export-weights", o.exportDir}})
    option(flag, value.empty() ? "off" : "on",
           std::string(value.empty() ? "was started without " : "was started with ") + flag);
  option("--allow-nonfinite", o.allowNonFinite ? "on" : "off",
         std::string(o.allowNonFinite ? "was started with" : "was started without") + " --allow-nonfinite");
  return id;
}

// The first collective of the job: every rank sends its job identity (or
// its start-up error). Returns false, with the reasons printed, when any
// rank failed or the ranks disagree; then every rank exits 1.
bool agreeOnJob(Control &control, const std::string &who, const std::string &error, const JobIdentity &id) {
  using nlohmann::json;
  if (!error.empty()) std::fprintf(stderr, "piperun: %s: error: %s\n", who.c_str(), error.c_str()), std::fflush(stderr);
  const auto all = control.allgatherStrings(json{{"error", error}, {"identity", encodeIdentity(id)}}.dump());
  std::vector<std::string> identities;
  int failed = 0, first = -1;
  for (size_t r = 0; r < all.size(); ++r) {
    json j;
    try {
      j = json::parse(all[r]);
    } catch (const json::exception &) {
      j = json{{"error", "unreadable start-up message"}, {"identity", "{}"}};
    }
    if (!j.value("error", std::string()).empty()) ++failed, first = first < 0 ? (int)r : first;
    identities.push_back(j.value("identity", std::string("{}")));
  }
  if (failed) {
    if (control.rank() == 0)
      std::fprintf(stderr, "piperun: %d of %d ranks failed to start (first: rank %d); all ranks exit\n", failed,
                   control.size(), first);
    return false;
  }
  const std::string differ = compareIdentities(identities);
  if (differ.empty()) return true;
  if (control.rank() == 0) {
    std::string lines;
    for (size_t b = 0, e; b < differ.size(); b = e + 1) {
      e = differ.find('\n', b);
      if (e == std::string::npos) e = differ.size();
      lines += "piperun: error: job identity: " + differ.substr(b, e - b) + "\n";
    }
    std::fprintf(stderr, "%spiperun: the %d ranks were not started on the same job (a stale copy of the job directory "
                 "or different options?); all ranks exit\n",
                 lines.c_str(), control.size());
    std::fflush(stderr);
  }
  return false;
}

// The device and transport of the plan's target; throws Error (with the
// reason and the way out) when this piperun or this machine cannot run it.
void makeTarget(const Plan &plan, const RunOptions &opt, MpiControl &control, std::unique_ptr<Device> &device,
                std::unique_ptr<Transport> &transport) {
  if (plan.target == Target::Cpu) {
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
  transport = std::make_unique<GpuTransport>(control, *cuda);
  device = std::move(cuda);
#endif
}

// The threads of this rank's CPU kernels (docs/runtime.md, "Threads").
struct Threads {
  int count = 1;
  std::string why; // where the count came from, for the start-up line
};

// A thread count from the environment: a whole number in 1 .. kMaxThreads
// (OMP_NUM_THREADS may list one per nesting level: its first). 0 otherwise.
int threadsFromEnv(const char *name) {
  const char *text = std::getenv(name);
  if (!text || !*text) return 0;
  char *end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (end == text || (*end && *end != ',') || n < 1 || n > kMaxThreads) return 0;
  return (int)n;
}

// --threads N, else OMP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else the
// cores in this rank's affinity mask divided by the ranks on this node whose
// masks overlap it: ranks bound to their own cores (mpirun's default binding,
// --map-by slot:PE=n) get all of theirs, unbound ranks share the node's.
// Collective: every rank calls it, whatever it was given.
Threads chooseThreads(int given) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  const bool haveMask = sched_getaffinity(0, sizeof mine, &mine) == 0;
  if (!haveMask) CPU_ZERO(&mine);
  MPI_Comm node = MPI_COMM_NULL;
  int nodeSize = 1;
  std::vector<cpu_set_t> masks(1, mine);
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
      node != MPI_COMM_NULL) {
    MPI_Comm_size(node, &nodeSize);
    masks.resize((size_t)nodeSize);
    MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, masks.data(), (int)sizeof mine, MPI_BYTE, node);
    MPI_Comm_free(&node);
  }
  if (given > 0) return {given, "--threads"};
  for (const char *name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (int n = threadsFromEnv(name)) return {n, name};
  long cores = haveMask ? CPU_COUNT(&mine) : 0;
  int sharers = 0;
  if (cores > 0) {
    for (cpu_set_t &m : masks) {
      cpu_set_t both;
      CPU_AND(&both, &m, &mine);
      sharers += CPU_COUNT(&both) > 0;
    }
  } else { // no mask: the node's online cores, shared by all its ranks
    cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    sharers = nodeSize;
  }
  sharers = std::max(1, sharers);
  const int count = (int)std::max(1L, std::min<long>(cores / sharers, kMaxThreads));
  return {count, "default: " + std::to_string(cores) + " core" + (cores == 1 ? "" : "s") + " / " +
                     std::to_string(sharers) + " rank" + (sharers == 1 ? "" : "s") + " sharing them"};
}

// Before the stage libraries are loaded: the kernels' OpenMP runtime reads
// these when it starts (it is loaded with the first stage library, after
// this). The CPU kernels run every parallel loop, GEMM panels included, on
// OpenMP threads and keep OpenBLAS on one (docs/cpu-kernels.md, "Threads"):
// OPENBLAS_NUM_THREADS=1 spares its idle thread pool. libgomp's own wait
// policy stays (spin briefly, then sleep; it spins less by itself when a
// team has more threads than cores): OMP_WAIT_POLICY=PASSIVE made a small
// CNN 1.5x slower on 2 threads (docs/runtime.md, "Threads").
void exportThreads(int count) {
  setenv("OMP_NUM_THREADS", std::to_string(count).c_str(), 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
}

// After loading: set the count again through libgomp itself, in case it was
// already running before exportThreads (preloaded). The kernels run on this
// (the main) thread, whose OpenMP team size this sets.
void applyThreads(int count) {
  if (void *handle = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
    if (void *f = dlsym(handle, "omp_set_num_threads")) reinterpret_cast<void (*)(int)>(f)(count);
    dlclose(handle);
  }
}

void banner(const Plan &plan, const RunOptions &opt, const Device &device, const Transport &transport, int ranks,
            const Threads &threads) {
  std::string target = std::string(choiceName(plan.target)) + " (" + choiceName(plan.precision);
  if (plan.target == Target::Cuda) {
    std::string archs;
    for (const std::string &a : plan.cudaArch) archs += (archs.empty() ? "" : ",") + a;
    if (!archs.empty()) target += ", " + archs;
    if (!plan.gpu.empty()) target += ", planned for " + plan.gpu;
  }
  target += ")";
  // Where training samples come from (openDataSource): a CUDA rank
  // generates synthetic data on its device (docs/runtime.md, "Data read ahead").
  const std::string data = !opt.dataFile.empty()      ? opt.dataFile
                           : plan.dataFields.empty() ? std::string("none")
                           : device.host()           ? std::string("synthetic")
                                                     : std::string("synthetic, generated on the device");
  std::string cpu = std::to_string(threads.count) + (threads.count == 1 ? " thread" : " threads") + " per rank (" +
                    threads.why + ")";
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) < threads.count)
    cpu += " on " + std::to_string(CPU_COUNT(&mask)) + " core" + (CPU_COUNT(&mask) == 1 ? "" : "s") +
           " (rank 0's affinity; mpirun binds each rank to a core unless --bind-to none or --map-by slot:PE=N)";
  std::printf("piperun: %s: schedule %s, %d stage%s x %d chunk%s, %d micro-batches of %d, %d rank%s, target %s, "
              "transport %s%s, data %s, %s\n",
              plan.dir.c_str(), choiceName(plan.schedule), plan.stages, plan.stages == 1 ? "" : "s", plan.chunks,
              plan.chunks == 1 ? "" : "s", plan.microbatches, plan.microbatchSize, ranks, ranks == 1 ? "" : "s",
              target.c_str(), transport.name(),
              device.host() ? "" : (", rank 0 on " + device.describe()).c_str(), data.c_str(), cpu.c_str());
  // How each pair of ranks and each group talks (GPU ranks: NCCL between
  // GPUs, CUDA IPC or host memory between ranks that share one).
  std::istringstream routes(transport.routes());
  for (std::string line; std::getline(routes, line);) std::printf("piperun:   %s\n", line.c_str());
  std::fflush(stdout);
}
} // namespace

int main(int argc, char **argv) {
#ifdef PIPEC_HAVE_CUDA
  // Read once, when CUDA initializes, which MPI_Init may do (a CUDA-aware
  // MPI): the environment is set before it. CudaDevice explains the value.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
#endif
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    MpiControl control;
    const std::string rankName = "rank " + std::to_string(control.rank());
    RunOptions opt;
    std::string error;
    // The command line first, agreed by all ranks (an MPMD launch may give
    // ranks different ones): "" fine, "h" --help, "e..." an error.
    const CommandLine line = parseCommandLine(Tool::Piperun, argc, argv, opt);
    const std::string parsed = line.outcome == CommandLine::Invalid ? "e" + line.error
                               : line.outcome == CommandLine::Help  ? "h"
                                                                    : "";
    {
      bool anyError = false, anyHelp = false;
      for (const std::string &p : control.allgatherStrings(parsed))
        anyError |= !p.empty() && p[0] == 'e', anyHelp |= p == "h";
      if (anyError || anyHelp) {
        if (!parsed.empty() && parsed[0] == 'e')
          std::fprintf(stderr, "piperun: %serror: %s\n", control.rank() == 0 ? "" : (rankName + ": ").c_str(),
                       parsed.c_str() + 1);
        if (control.rank() == 0) std::fputs(line.help.c_str(), anyError ? stderr : stdout);
        MPI_Finalize();
        return anyError ? 2 : 0;
      }
    }
    // On from here (start-up collectives included) unless --watchdog 0.
    Watchdog watchdog(opt.watchdogSeconds);
    watchdog.setWho(rankName);
    // Not part of the job identity: results do not depend on it.
    watchdog.phase("start-up: choosing the thread count (MPI_Allgather of the node's affinity masks)");
    const Threads threads = chooseThreads(line.threads);
    exportThreads(threads.count);
    // Destroyed in reverse: the executor's buffers, then the transport's
    // communicators, then the device (its streams).
    std::unique_ptr<Plan> plan;
    std::unique_ptr<Device> device; // null: the host device
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Executor> exec;
    // Job identity before anything that could wait on another rank: every
    // rank checks its options and digests its files, and all compare.
    JobIdentity identity;
    watchdog.phase("start-up: reading the plan, then comparing the job identity with the other ranks (MPI_Allgather)");
    try {
      plan = std::make_unique<Plan>(loadPlan(opt.planDir));
      identity = jobIdentity(*plan, opt);
    } catch (const std::exception &e) {
      error = e.what();
    }
    if (!agreeOnJob(control, rankName, error, identity)) status = 1;
    if (status == 0) {
      watchdog.phase("start-up: loading the stage libraries, weights and data, then waiting for the other ranks "
                     "(MPI_Allgather)");
      try {
        makeTarget(*plan, opt, control, device, transport);
        exec = std::make_unique<Executor>(*plan, opt, control, *transport, device ? *device : hostDevice());
        applyThreads(threads.count);
        exec->setWatchdog(&watchdog);
        watchdog.setWho(exec->who());
      } catch (const std::exception &e) {
        error = e.what();
      }
      if (!agree(control, exec ? exec->who() : rankName, error)) status = 1;
    }
    const std::string who = exec ? exec->who() : rankName;
    // A start-up step every rank takes and then agrees on, so that one
    // rank's error ends them all. StrandedPeers ends the job at once: the
    // others wait where no agreement reaches them.
    auto agreedStep = [&](const char *phase, const std::function<void()> &step) {
      if (status != 0) return;
      watchdog.phase(phase);
      try {
        step();
      } catch (const StrandedPeers &e) {
        std::fprintf(stderr, "piperun: %s: error: %s; ending the job\n", who.c_str(), e.what());
        std::fflush(stderr);
        control.abort(1);
      } catch (const std::exception &e) {
        error = e.what();
      }
      if (!agree(control, who, error)) status = 1;
    };
    agreedStep("start-up: comparing neighbouring stages and transfer orders (MPI_Allgather)",
               [&] { exec->checkNeighbours(); });
    // Agreed on its own: a rank whose warm-up failed must not meet the
    // others' collectives in connect() with the agreement's.
    agreedStep("start-up: running each stage once (lazy initialization, before the first transfer)",
               [&] { exec->warmUp(); });
    agreedStep("start-up: creating the transport's communicators",
               [&] { exec->connect(); }); // NCCL communicators, same-GPU links (collective)
    if (status == 0 && control.rank() == 0 && !opt.quiet)
      banner(*plan, opt, device ? *device : hostDevice(), *transport, control.size(), threads);
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
