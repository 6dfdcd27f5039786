// bench_partition: first PipeDream's published VGG-16 profile on its 2x8 cluster
// (25 GB/s inside a server, 3.125 GB/s between), searched with PipeDream's tree
// alone and with stages that share servers (docs/planner.md); then the time to
// partition synthetic chains and DAGs of 100, 1,000 and 10,000 ops on 2x8, 16x8
// and 64x8 H100 servers (goal: 10,000 ops on 64x8 in under 2 s).
// Usage: bench_partition [--repeat N] [--max-layers L] [--vgg16 CSV] [--tree-only]
// (--tree-only: the synthetic cases without the device-range search)

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/Partitioner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

using namespace pipec::partition;

namespace {

/// A chain, or a transformer-like DAG: blocks of 10 ops where every op of a block
/// also reads the block input (the residual) and an occasional long skip.
CostTable synthetic(int n, bool dag, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.5, 1.5);
  CostTable t;
  t.ops.reserve(n);
  for (int i = 0; i < n; ++i) {
    OpCost op;
    op.name = "op" + std::to_string(i);
    op.type = i % 10 == 3 ? "MatMul" : "Add";
    double scale = i % 10 == 3 ? 20 : 1; // one heavy op per block
    op.forwardSeconds = 20e-6 * scale * unit(rng);
    op.backwardInputSeconds = op.forwardSeconds;
    op.backwardWeightSeconds = i % 10 == 3 ? op.forwardSeconds : 0;
    op.activationBytes = static_cast<int64_t>(8e6 * unit(rng));
    op.parameterBytes = i % 10 == 3 ? static_cast<int64_t>(2e7 * unit(rng)) : 0;
    op.optimizerStateBytes = 2 * op.parameterBytes;
    if (i > 0)
      op.producers.push_back("op" + std::to_string(i - 1));
    if (dag && i % 10 != 0 && i >= 10)
      op.producers.push_back("op" + std::to_string(i - i % 10 - 1)); // block input
    if (dag && i % 97 == 0 && i >= 50)
      op.producers.push_back("op" + std::to_string(i - 50)); // long skip
    std::sort(op.producers.begin(), op.producers.end());
    op.producers.erase(std::unique(op.producers.begin(), op.producers.end()), op.producers.end());
    t.ops.push_back(op);
  }
  return t;
}

/// One partition search, timed (best of `repeat`).
PartitionResult timedPartition(const CostTable &table, const Topology &topo, const PartitionOptions &options,
                               int repeat, double &seconds) {
  PartitionResult r;
  seconds = 1e30;
  for (int k = 0; k < repeat; ++k) {
    auto start = std::chrono::steady_clock::now();
    r = partition(table, topo, options);
    seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return r;
}

void printStages(const PartitionResult &r) {
  for (size_t k = 0; k < r.stages.size(); ++k) {
    const StagePlan &s = r.stages[k];
    std::printf("    stage %zu: ops %d..%d on %d device%s (ranks %d..%d)\n", k, s.firstOp, s.lastOp, s.replicas,
                s.replicas == 1 ? "" : "s", s.ranks.front(), s.ranks.back());
  }
}

/// PipeDream's VGG-16 profile (bench/partition/vgg16_pipedream.csv: its
/// per-layer times in ms and bytes, as a cost table) on 2 servers x 8 V100.
void vgg16Case(const std::string &csv, int repeat) {
  CostTable table = readCostTableCsvFile(csv);
  Topology topo = makeGpusTopology({2, 8}, *findDevicePreset("V100"), 25e9, 3.125e9);
  PartitionOptions options;
  options.memoryLimitBytes = -1; // PipeDream's comparison: time only
  std::printf("VGG-16 (PipeDream's profile, %zu layers) on 2x8, 25 GB/s in a server, 3.125 GB/s between\n",
              table.ops.size());
  for (bool ranges : {false, true}) {
    options.deviceRangeSearch = ranges;
    double seconds = 0;
    PartitionResult r = timedPartition(table, topo, options, repeat, seconds);
    std::printf("  %-44s %8.2f ms per micro-batch, search %.3f s\n",
                ranges ? "with stages that share servers:" : "PipeDream's hierarchical search:",
                r.timePerMicrobatch * 1e3, seconds);
    printStages(r);
  }
  std::printf("\n");
}

} // namespace

int main(int argc, char **argv) {
  int repeat = 1, maxLayers = PartitionOptions{}.maxLayers;
  bool deviceRanges = true;
  std::string vgg16 = PIPEC_BENCH_VGG16_CSV;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--max-layers") && i + 1 < argc)
      maxLayers = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--vgg16") && i + 1 < argc)
      vgg16 = argv[++i];
    else if (!std::strcmp(argv[i], "--tree-only"))
      deviceRanges = false;
    else {
      std::fprintf(stderr, "usage: bench_partition [--repeat N] [--max-layers L] [--vgg16 CSV] [--tree-only]\n");
      return 2;
    }
  }
  try {
    vgg16Case(vgg16, repeat);
  } catch (const Error &e) {
    std::fprintf(stderr, "bench_partition: %s\n", e.what());
    return 1;
  }
  // bound: total compute / devices, what perfect balance without communication would give
  std::printf("%-6s %7s %6s %7s %7s %8s %13s %11s %9s %10s\n", "graph", "ops", "gpus", "layers", "stages",
              "devices", "t/micro-batch", "bound", "speedup", "seconds");
  for (const char *shape : {"chain", "dag"})
    for (int n : {100, 1000, 10000})
      for (int servers : {2, 16, 64}) {
        CostTable table = synthetic(n, std::strcmp(shape, "dag") == 0, 42 + n);
        Topology topo = makeGpusTopology({servers, 8}, *findDevicePreset("H100"));
        PartitionOptions options;
        options.microbatches = 8;
        options.maxLayers = maxLayers;
        options.deviceRangeSearch = deviceRanges;
        double best = 1e30;
        PartitionResult r;
        try {
          r = timedPartition(table, topo, options, repeat, best);
        } catch (const Error &e) {
          std::printf("%-6s %7d %3dx8  error: %s\n", shape, n, servers, e.what());
          continue;
        }
        double compute = 0;
        for (const OpCost &op : table.ops)
          compute += op.computeSeconds();
        char speedup[32] = "n/a";
        if (r.dataParallelFits)
          std::snprintf(speedup, sizeof speedup, "%.2fx", r.speedupOverDataParallel);
        std::printf("%-6s %7d %3dx8 %7d %7zu %8d %10.3f ms %8.3f ms %9s %10.3f\n", shape, n, servers, r.layers,
                    r.stages.size(), r.devicesUsed, r.timePerMicrobatch * 1e3,
                    compute / topo.totalDevices() * 1e3, speedup, best);
        std::fflush(stdout);
      }
  return 0;
}
