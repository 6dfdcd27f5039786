#ifndef PIPEC_TEST_PARTITION_TESTGRAPHS_H
#define PIPEC_TEST_PARTITION_TESTGRAPHS_H

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Topology.h"

#include <random>
#include <string>

namespace pipec::partition::testing {

/// A random DAG in topological order: every op reads its predecessor with
/// probability `chain` and a few random earlier ops (skip connections).
inline CostTable randomDag(std::mt19937_64 &rng, int n, double chain = 0.8) {
  std::uniform_real_distribution<double> unit(0, 1);
  CostTable t;
  for (int i = 0; i < n; ++i) {
    OpCost op;
    op.name = "op" + std::to_string(i);
    op.type = i % 3 == 0 ? "MatMul" : i % 3 == 1 ? "Add" : "Relu";
    // Some ops are free (reshapes): the DP must handle ties and zeros.
    bool free = unit(rng) < 0.15;
    op.forwardSeconds = free ? 0 : 1e-3 * (0.1 + unit(rng));
    op.backwardInputSeconds = free ? 0 : 1e-3 * unit(rng);
    op.backwardWeightSeconds = free ? 0 : 1e-3 * unit(rng);
    op.activationBytes = static_cast<int64_t>(1e6 * (0.1 + 4 * unit(rng)));
    op.parameterBytes = unit(rng) < 0.5 ? 0 : static_cast<int64_t>(1e8 * unit(rng));
    op.optimizerStateBytes = 2 * op.parameterBytes;
    for (int p = 0; p < i; ++p)
      if ((p == i - 1 && unit(rng) < chain) || unit(rng) < 0.2)
        op.producers.push_back("op" + std::to_string(p));
    t.ops.push_back(op);
  }
  return t;
}

/// A uniform chain: every op costs `seconds`, outputs `bytes`, holds `params`.
inline CostTable uniformChain(int n, double seconds, int64_t bytes, int64_t params) {
  CostTable t;
  for (int i = 0; i < n; ++i) {
    OpCost op;
    op.name = "op" + std::to_string(i);
    op.type = "Gemm";
    op.forwardSeconds = seconds / 3;
    op.backwardInputSeconds = seconds / 3;
    op.backwardWeightSeconds = seconds / 3;
    op.activationBytes = bytes;
    op.parameterBytes = params;
    op.optimizerStateBytes = 0;
    if (i > 0)
      op.producers.push_back("op" + std::to_string(i - 1));
    t.ops.push_back(op);
  }
  return t;
}

inline Topology flatTopology(int devices, double bandwidth, int64_t memory = int64_t(80) << 30) {
  Topology t;
  t.levels.push_back({devices, bandwidth, "nvlink"});
  t.deviceMemoryBytes = memory;
  t.device = "H100";
  return t;
}

} // namespace pipec::partition::testing

#endif
