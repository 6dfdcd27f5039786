// What piperun measures while it runs (docs/runtime.md, "Traces and
// profiles"): --trace, each instruction's start and end, merged on rank 0
// into one Chrome trace; --profile, the stages' per-op times
// (docs/profile-json.md).
#pragma once

#include "Chunk.h"
#include "RunOptions.h"
#include "Transport.h"

#include <map>
#include <string>
#include <vector>

namespace pipec::rt {

class RunRecorder {
public:
  explicit RunRecorder(const RunOptions &opt) : traceFile_(opt.traceFile), profileFile_(opt.profileFile) {}

  static double now(); // seconds, monotonic

  // After the start-up barrier: trace times count from here.
  void start(int chunks);
  // Every iteration but a run's first (its warm-up) is profiled, unless it
  // is the only one.
  void beginIteration(int64_t it, int64_t first, int64_t iters);
  bool profiling() const { return profiling_; }
  void record(const Instr &in, int64_t iteration, double t0, double t1);
  // A stage call while profiling: its op timer adds here.
  void timeOps(pipec_call &c);
  void countForward(int chunk) { ++fwdCalls_[chunk]; }

  // Collective. Rank 0 writes the files of --trace and --profile (each when given).
  void write(Control &control, const Plan &plan, const Device &device, const std::vector<Chunk> &chunks,
             int scheduleRank, int stage, int replica);

private:
  struct TraceEvent {
    double t0, t1;
    Instr in;
    int64_t iteration;
  };
  struct OpTime {
    double f = 0, b = 0, w = 0;
  };
  static void onOpTime(void *user, const char *op, int32_t phase, double seconds);
  void writeTrace(Control &control, const Plan &plan, const std::vector<Chunk> &chunks, int scheduleRank, int stage,
                  int replica);
  void writeProfile(Control &control, const Plan &plan, const Device &device, int replica);

  const std::string traceFile_, profileFile_;
  double t0_ = 0;
  std::vector<TraceEvent> trace_;
  bool profiling_ = false;
  std::map<std::string, OpTime> opTimes_;
  std::vector<int64_t> fwdCalls_; // per chunk
};

} // namespace pipec::rt
