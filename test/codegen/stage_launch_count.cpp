// Counts what a generated CUDA stage asks of the GPU per call, without a GPU:
// the stage is translated for the host emulation of test/kernels/cuda_emulation
// (cuda_launch_count.py builds it), whose fake CUDA runtime and cuBLAS /
// cuBLASLt count kernel launches, GEMMs, stream copies and memsets, and the
// calls after which the host waits for the device (pipec_emu_count).
//
//   stage_launch_count LIB [--json FILE]
//
// Calls forward, backward_input and backward_weight for micro-batches 0, 1
// and 2, then the optimizer step twice. The first call of each entry point
// also does the stage's one-time work (arena, uploaded constants, library
// workspaces); the later ones show the steady state. Prints one table row per
// call and, with --json, writes the same rows to FILE. Exits 2 when the
// library cannot be loaded, lacks the counters or a call fails; judging the
// counts is the caller's business.
#include "StageDriver.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using pipec::test::StageBuffers;
using pipec::test::StageLibrary;

namespace {

/// The emulation's counters, as pipec_emu_count names them.
constexpr const char *kCounterNames[] = {"kernels",    "cublas_gemms",   "cublaslt_matmuls", "memcpys",
                                         "memsets",    "host_syncs",     "graph_launches",   "graph_work",
                                         "cudnn_executes"};
constexpr int kCounters = sizeof kCounterNames / sizeof kCounterNames[0];

struct Counts {
  long value[kCounters] = {};
  long kernels() const { return value[0]; }
  long gemms() const { return value[1] + value[2]; }
  long copies() const { return value[3] + value[4]; }
  long hostSyncs() const { return value[5]; }
  /// cuDNN graph executions (flash attention): one launch each here, though
  /// cuDNN may run more than one kernel for one (docs/cuda-kernels.md).
  long cudnn() const { return value[8]; }
  /// Everything the stream runs: kernels, GEMMs, cuDNN calls, copies (in CUDA graphs or not).
  long launches() const { return kernels() + gemms() + cudnn() + copies(); }
  long graphLaunches() const { return value[6]; }
  /// What the host issues: graph launches, and the work outside graphs.
  long hostLaunches() const { return launches() - value[7] + graphLaunches(); }
};

struct Row {
  std::string entry;
  long call; // micro-batch index, or the optimizer step
  Counts counts;
};

} // namespace

int main(int argc, char **argv) {
  if (argc != 2 && !(argc == 4 && std::strcmp(argv[2], "--json") == 0)) {
    std::fprintf(stderr, "usage: stage_launch_count LIB [--json FILE]\n");
    return 2;
  }
  StageLibrary stage(argv[1]);
  auto count = reinterpret_cast<long (*)(const char *)>(dlsym(stage.handle, "pipec_emu_count"));
  if (!count) {
    std::fprintf(stderr,
                 "%s has no pipec_emu_count: not a CUDA stage compiled against the emulation "
                 "(test/kernels/cuda_emulation/inc/cuda_runtime.h)\n",
                 argv[1]);
    return 2;
  }
  auto countsNow = [&] {
    Counts now;
    for (int i = 0; i < kCounters; ++i) {
      now.value[i] = count(kCounterNames[i]);
      if (now.value[i] < 0) {
        std::fprintf(stderr, "%s: the emulation does not count \"%s\"\n", argv[1], kCounterNames[i]);
        std::exit(2);
      }
    }
    return now;
  };
  std::vector<Row> rows;
  // Runs one entry point and records what it issued.
  auto measured = [&](const char *entry, long call, auto &&run) {
    const Counts before = countsNow();
    run();
    const Counts after = countsNow();
    Row row{entry, call, {}};
    for (int i = 0; i < kCounters; ++i)
      row.counts.value[i] = after.value[i] - before.value[i];
    rows.push_back(row);
  };

  // Zeroed tensors are valid ones (token 0, label 0, finite weights); the
  // counts do not depend on the values.
  StageBuffers buffers(*stage.describe());
  buffers.call.seed = 7;
  for (long microbatch = 0; microbatch < 3; ++microbatch) {
    buffers.call.microbatch = microbatch;
    buffers.call.loss_scale = 1.0f / 3;
    measured("forward", microbatch, [&] { stage.run(stage.forward, buffers.call, "forward"); });
    measured("backward_input", microbatch, [&] { stage.run(stage.backwardInput, buffers.call, "backward_input"); });
    measured("backward_weight", microbatch, [&] { stage.run(stage.backwardWeight, buffers.call, "backward_weight"); });
  }
  for (long step = 1; step <= 2; ++step) {
    buffers.optimizer.step = step;
    measured("step", step, [&] { stage.run(stage.step, buffers.optimizer, "step"); });
  }

  std::printf("%-16s %-13s %8s %6s %6s %7s %9s %7s %7s %10s\n", "entry point", "call", "kernels", "GEMMs", "cuDNN",
              "copies", "launches", "graphs", "issued", "host syncs");
  for (const Row &row : rows)
    std::printf("%-16s %-13s %8ld %6ld %6ld %7ld %9ld %7ld %7ld %10ld\n", row.entry.c_str(),
                ((row.entry == "step" ? "step " : "micro-batch ") + std::to_string(row.call)).c_str(),
                row.counts.kernels(), row.counts.gemms(), row.counts.cudnn(), row.counts.copies(), row.counts.launches(),
                row.counts.graphLaunches(), row.counts.hostLaunches(), row.counts.hostSyncs());
  if (argc == 4) {
    FILE *json = std::fopen(argv[3], "w");
    if (!json) {
      std::perror(argv[3]);
      return 2;
    }
    std::fprintf(json, "[");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row &row = rows[i];
      std::fprintf(json, "%s\n {\"entry\": \"%s\", \"call\": %ld", i ? "," : "", row.entry.c_str(), row.call);
      for (int c = 0; c < kCounters; ++c)
        std::fprintf(json, ", \"%s\": %ld", kCounterNames[c], row.counts.value[c]);
      std::fprintf(json, ", \"gemms\": %ld, \"cudnn\": %ld, \"copies\": %ld, \"launches\": %ld, \"host_launches\": %ld}",
                   row.counts.gemms(), row.counts.cudnn(), row.counts.copies(), row.counts.launches(),
                   row.counts.hostLaunches());
    }
    std::fprintf(json, "\n]\n");
    std::fclose(json);
  }
  return 0;
}
