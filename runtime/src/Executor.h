// Runs one rank's instruction stream (docs/runtime.md, "How a rank executes").
#pragma once

#include "Plan.h"
#include "StageModel.h"
#include "Transport.h"
#include "Watchdog.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace pipec::rt {

struct RunOptions {
  std::string planDir;
  int iters = 1;         // total iterations (optimizer steps of a synchronous schedule); resume continues to it
  int logEvery = 1;
  std::string dataFile;  // empty: synthetic data from runtime.data
  std::string checkpointDir;
  int saveEvery = 0;
  std::string resumeDir;
  std::string traceFile, profileFile, exportDir;
  bool seedSet = false;
  uint64_t seed = 0;
  bool lrSet = false, wdSet = false, momentumSet = false, clipSet = false;
  double lr = 0, weightDecay = 0, momentum = 0, maxGradNorm = 0; // checked by resolveOptimizer (JobCheck.h)
  double watchdogSeconds = -1; // > 0: fixed limit, 0: off, < 0: the default policy (Watchdog.h)
  bool allowNonFinite = false;  // --allow-nonfinite: a NaN/inf loss or gradient does not stop training
  bool quiet = false;
};

// Every activation/gradient bundle starts with this header: the receiver
// checks that it got the micro-batch, iteration, direction, weight version
// and tensor layout it expected, so a schedule/plan mismatch is an error,
// never silently wrong numbers.
struct BundleHeader {
  uint64_t magic;
  int64_t iteration;
  int32_t mb, vs, kind, version; // vs: receiving virtual stage; kind 0 act, 1 grad
  uint64_t layoutHash;
  uint64_t bytes;
  uint64_t reserved[2];
};
static_assert(sizeof(BundleHeader) == 64, "the bundle header occupies the 64 bytes Layout reserves");

class Executor {
public:
  // `device` holds every buffer (the host for target cpu); a stream-ordered
  // transport (NCCL) needs a device that is not the host, and vice versa.
  Executor(const Plan &plan, const RunOptions &opt, Control &control, Transport &transport,
           Device &device = hostDevice());
  ~Executor();
  // Start-up checks that need every rank (neighbour layouts, the order of
  // transfers between each pair of ranks); throws Error.
  void checkNeighbours();
  // Collective: the transport's communicators (after checkNeighbours).
  void connect();
  void run();
  std::string who() const; // "rank 2 (stage 1, replica 0)"
  // The watchdog that watches run() (piperun's; it also watches start-up).
  void setWatchdog(Watchdog *w) { watchdog_ = w; }

private:
  struct Slot; // per (chunk, micro-batch) buffers
  struct Pin { int version; std::shared_ptr<Buffer> params; bool restored = false; };
  struct ChunkState {
    std::unique_ptr<StageModel> model;
    int vs = 0;
    std::map<int, Slot *> active;              // by micro-batch
    std::vector<std::unique_ptr<Slot>> slots;  // all slots ever made (free ones reused)
    std::vector<Slot *> freeSlots;
    std::vector<std::unique_ptr<Buffer>> freeWorkspaces;
    Buffer scratchWorkspace, scratchOutputs;   // FWD of a recomputed micro-batch, RECOMPUTE outputs
    std::map<int, Pin> pins;                   // STASH/RESTORE weight versions by micro-batch
    std::map<int, std::weak_ptr<Buffer>> versionCopies; // vertical sync: one copy per version
    std::vector<bool> recomputes;              // per micro-batch: a RECOMPUTE follows its FWD
    int64_t stepsAtIterationStart = 0;         // vertical-sync versions are relative to it
  };
  struct TraceEvent { double t0, t1; Instr in; int64_t iteration; };
  // CUDA target: a received bundle header on its way to the host, checked
  // once `event` completed (pollHeaders).
  struct PendingHeader {
    Event event = nullptr;
    char *host = nullptr; // 64 pinned bytes
    Instr in;
    int64_t iteration = 0;
    bool grad = false;
    int vs = 0;
    uint64_t layoutHash = 0;
    std::string context; // "schedule/rank_1.json #5 RECV_ACT mb=2 chunk=0 peer=0 (iteration 0)"
  };
  struct OpTime { double f = 0, b = 0, w = 0; };

  void iteration(int64_t it);
  void execute(const Instr &in, int64_t it);
  Slot &slot(int chunk, int mb, bool create);
  void maybeRelease(int chunk, Slot &s);
  std::unique_ptr<Buffer> takeWorkspace(int chunk);
  void loadData(int chunk, Slot &s, int mb, int64_t it);
  pipec_call callFor(int chunk, Slot &s, int mb, int64_t it, std::vector<void *> &params);
  void *paramsFor(int chunk, int mb);
  void compute(const Instr &in, int64_t it);
  void send(const Instr &in, int64_t it, bool grad);
  void recv(const Instr &in, int64_t it, bool grad);
  int tagOf(int mb, bool grad, int vsDest) const;
  std::string headerError(const BundleHeader &h, const Instr &in, int64_t it, bool grad, int vs, uint64_t layoutHash) const;
  void pollHeaders(bool block); // CUDA target: check the received headers that arrived (all of them when block)
  char *takePinnedHeader();
  Event takeEvent();
  void allreduceGrads();
  double finishGradients(); // scale by 1/count; returns the number of micro-batches
  void reduceTied();        // sum tied parameters' gradients over their holders
  void gradStats(double &sumSq, double &nonFinite); // replica 0's share of the global norm
  void clipForSyncStep();
  void step(int64_t it);
  void endIteration(int64_t it, double seconds);
  void saveCheckpoint(int64_t it);
  void loadCheckpoint(const std::string &dir);
  void writeTrace();
  void writeProfile();
  void exportWeights();
  [[noreturn]] void fail(const std::string &msg) const;
  // A non-finite loss or gradient: stops training (Error) unless --allow-nonfinite.
  void nonFinite(const std::string &what, int64_t it);
  // Which trained parameters of this rank have non-finite gradients ("" if none).
  std::string nonFiniteGradients();
  // The watchdog's message while iterating: the instruction and whom it waits for.
  std::string describeCurrent() const;
  static void onOpTime(void *user, const char *op, int32_t phase, double seconds);

  const Plan &plan_;
  RunOptions opt_;
  OptimizerConfig optimizer_;
  Control &control_;
  Transport &transport_;
  Device &device_;
  const bool gpu_; // device buffers, stream-ordered transport
  Connections connections_;
  std::vector<PendingHeader> pending_;
  std::vector<char *> freeHeaders_;
  std::vector<HostBuffer> headerBlocks_;
  std::vector<Event> freeEvents_, allEvents_;
  size_t currentIndex_ = 0; // of the instruction being executed
  int scheduleRank_ = 0, stage_ = 0, replica_ = 0, V_ = 1;
  uint64_t seed_ = 0;
  RankStream stream_;
  std::vector<ChunkState> chunks_;
  std::unique_ptr<io::DataSource> data_;
  std::vector<std::vector<int>> dataFieldIndex_; // per chunk: data-source field of each desc.data
  int64_t startIteration_ = 0;

  // Tied parameters this rank holds (runtime.tied): per entry of plan.tied
  // with a holder chunk here, its communicator group and the (chunk, param
  // index) of each copy on this rank (two with ZB-V placement).
  struct TiedHolding {
    int tied = 0, group = -1;
    std::vector<std::pair<int, int>> copies;
  };
  std::vector<TiedHolding> tied_;
  std::vector<std::vector<bool>> normSkip_; // per chunk: tied copies the norm counts at another holder

  // Gradient bookkeeping between steps.
  double mbSinceStep_ = 0, reducedCount_ = -1;
  std::vector<WeightSnapshot> preStep_; // SPEC_STEP: per chunk
  double validatedSumSq_ = 0, validatedNonFinite_ = 0;
  bool validated_ = false;
  int64_t rollbacks_ = 0, skippedSteps_ = 0;

  // Loss of the last stage, per iteration.
  double lossSum_ = 0, lossCount_ = 0;

  // Trace / profile.
  double t0_ = 0;
  std::vector<TraceEvent> trace_;
  bool profiling_ = false;
  std::map<std::string, OpTime> opTimes_;
  std::map<std::string, int> opChunk_;
  std::vector<int64_t> fwdCalls_;

  // Watchdog: reports the instruction a rank is stuck in, then exits.
  Watchdog *watchdog_ = nullptr;
  std::atomic<int64_t> watchIteration_{0}, watchIndex_{-1}; // -1: between iterations

  // Non-finite values (--allow-nonfinite): reported once when allowed.
  bool warnedNonFinite_ = false;
  double localNonFinite_ = 0; // SPEC_STEP: this rank's share of the non-finite count
};

} // namespace pipec::rt
