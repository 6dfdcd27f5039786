#include "TestGraphs.h"

#include "analysis/Partition/Error.h"
#include "analysis/Partition/Partitioner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

using namespace pipec::partition;
using namespace pipec::partition::testing;

namespace {
PartitionOptions unlimited() {
  PartitionOptions o;
  o.memoryLimitBytes = -1;
  return o;
}

/// 1F1B-RR on 4 stages without replication: stage k has 4 - k micro-batches in flight.
PartitionOptions asyncFourStages() {
  PartitionOptions o = unlimited();
  o.asynchronous = true;
  o.allowReplication = false;
  o.forcedStages = 4;
  return o;
}
std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "no error";
}
} // namespace

TEST(CostModel, DagCutCountsEveryCrossingTensorOnce) {
  CostTable t = uniformChain(4, 1, 10, 0);
  t.ops[0].activationBytes = 100;
  t.ops[2].producers.push_back("op0"); // skip connection op0 → op2
  t.ops[3].producers.push_back("op0"); // and op0 → op3: still counted once per cut
  CostModel m(t, flatTopology(2, 1e9), unlimited());
  EXPECT_EQ(m.cutBytes(0), 100);      // op0
  EXPECT_EQ(m.cutBytes(1), 100 + 10); // op0 and op1
  EXPECT_EQ(m.cutBytes(2), 100 + 10); // op0 and op2
  EXPECT_EQ(m.cutBytes(3), 0);        // nothing after the last op
}

TEST(Partitioner, MemoryCountsKeptBytesAndCutsCountResults) {
  // Each op's 1000-byte result crosses the cut after it; the backward keeps 250
  // of them (saved_bytes): memory counts what is kept, the links what is sent.
  CostTable t = uniformChain(4, 1.0, 1000, 1000000);
  for (OpCost &op : t.ops)
    op.savedBytes = 250;
  PartitionOptions o = asyncFourStages();
  PartitionResult r = partition(t, flatTopology(4, 1e12), o);
  ASSERT_EQ(r.stages.size(), 4u);
  EXPECT_EQ(r.stages[0].inflight, 4);
  EXPECT_EQ(r.stages[0].activationBytes, 4 * 250);
  EXPECT_EQ(r.stages[3].activationBytes, 250);
  CostModel m(t, flatTopology(4, 1e12), o);
  EXPECT_EQ(m.cutBytes(0), 1000);
}

TEST(Partitioner, StraightPipelineBeatsDataParallelWhenWeightsAreHeavy) {
  // 4 ops of 1 s each with 1 GB of weights, 4 devices on 1 GB/s links. Data
  // parallelism all-reduces 4 GB: 2·3·4e9/1e9 = 24 s, so 24/4 = 6 s per
  // micro-batch; a 4-stage pipeline needs 1 s (+2 ns per cut).
  CostTable t = uniformChain(4, 1.0, 1, 1000000000);
  PartitionOptions o = unlimited();
  o.microbatches = 4;
  PartitionResult r = partition(t, flatTopology(4, 1e9), o);
  ASSERT_EQ(r.stages.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(r.stages[k].firstOp, k);
    EXPECT_EQ(r.stages[k].replicas, 1);
    EXPECT_EQ(r.stages[k].ranks, std::vector<int>{k});
    EXPECT_EQ(r.stages[k].inflight, 4 - k); // 1F1B, capped by 4 micro-batches
  }
  EXPECT_NEAR(r.timePerMicrobatch, 1.0, 1e-12);
  EXPECT_NEAR(r.dataParallelTimePerMicrobatch, 6.0, 1e-12);
  EXPECT_NEAR(r.speedupOverDataParallel, 6.0, 1e-9);
  // Flush: fill/drain (p-1)·t = 3 s (+ 3 cuts of 2 ns), mini-batch = 4·1 + 3.
  EXPECT_NEAR(r.bubbleSeconds, 3.0, 1e-8);
  EXPECT_NEAR(r.timePerMinibatch, 7.0, 1e-8);
  EXPECT_NEAR(r.bubbleFraction, 3.0 / 7.0, 1e-8);
  EXPECT_NEAR(r.throughput, 4.0 / 7.0, 1e-8);
  EXPECT_EQ(r.inflightMicrobatches, 4);
  EXPECT_NO_THROW(r.verify(t, flatTopology(4, 1e9)));
}

TEST(Partitioner, DataParallelWhenWeightsAreLight) {
  CostTable t = uniformChain(4, 1.0, 1000000000, 1000);
  PartitionResult r = partition(t, flatTopology(4, 1e9), unlimited());
  ASSERT_EQ(r.stages.size(), 1u);
  EXPECT_EQ(r.stages[0].replicas, 4);
  EXPECT_NEAR(r.timePerMicrobatch, 1.0, 1e-5);
  EXPECT_NEAR(r.speedupOverDataParallel, 1.0, 1e-12);
  EXPECT_EQ(r.bubbleSeconds, 0);
}

TEST(Partitioner, AsyncMemoryCountsStashedVersionsAndInflightActivations) {
  CostTable t = uniformChain(4, 1.0, 1000, 1000000);
  PartitionOptions o = asyncFourStages();
  PartitionResult r = partition(t, flatTopology(4, 1e12), o);
  ASSERT_EQ(r.stages.size(), 4u);
  // stage 0: 4 in flight → params, their gradients, 3 stashed versions, 4 activations
  EXPECT_EQ(r.stages[0].inflight, 4);
  EXPECT_EQ(r.stages[0].stashBytes, 3000000);
  EXPECT_EQ(r.stages[0].gradientBytes, 1000000);
  EXPECT_EQ(r.stages[0].activationBytes, 4000);
  EXPECT_EQ(r.stages[0].memoryBytes, 2 * 1000000 + 3000000 + 4000);
  EXPECT_EQ(r.stages[3].memoryBytes, 2 * 1000000 + 1000);
  // recompute keeps the stage input per micro-batch plus one working set
  o.recompute = true;
  PartitionResult rc = partition(t, flatTopology(4, 1e12), o);
  EXPECT_EQ(rc.stages[1].activationBytes, 3 * 1000 + 1000);
  EXPECT_EQ(rc.stages[0].activationBytes, 0 + 1000); // nothing enters stage 0
}

TEST(Partitioner, MemoryLimitForcesAPipeline) {
  // 4 ops of 1 GB weights + 2 GB optimizer state: 12 GB in all, 3 GB per op.
  CostTable t = uniformChain(4, 1.0, 1, 1000000000);
  for (OpCost &op : t.ops)
    op.optimizerStateBytes = 2000000000;
  PartitionOptions o;
  o.memoryLimitBytes = 6500000000; // two ops per device at most
  Topology topo = flatTopology(4, 1e15);
  PartitionResult r = partition(t, topo, o);
  for (const StagePlan &s : r.stages)
    EXPECT_LE(s.memoryBytes, 6500000000);
  EXPECT_FALSE(r.dataParallelFits);
  EXPECT_EQ(r.speedupOverDataParallel, 0);
  EXPECT_GE(r.stages.size(), 2u);
}

TEST(Partitioner, InfeasibleMemorySaysWhichStageNeedsHowMuchMore) {
  // each op: 0.5 GB of weights and 0.5 GB of their gradients
  CostTable t = uniformChain(4, 1.0, 1, 500000000);
  Topology topo = flatTopology(2, 1e9);
  PartitionOptions o;
  o.memoryLimitBytes = 1500000000; // each op fits, but 4 ops on 2 devices do not
  std::string e = errorOf([&] { partition(t, topo, o); });
  EXPECT_NE(e.find("no partition of the 4 ops over 2 devices fits in 1.4 GiB per device"), std::string::npos) << e;
  // the least any partition needs: two ops per device, 2 GB each
  EXPECT_NE(e.find("the least any partition needs is about 1.9 GiB per device (476.8 MiB more), in a partition "
                   "where stage 0 (ops 'op0'..'op1', 1 in flight) needs 1.9 GiB, 476.8 MiB more; stage 1 "
                   "(ops 'op2'..'op3', 1 in flight) needs 1.9 GiB, 476.8 MiB more"),
            std::string::npos) << e;
  // Unlimited, the DP would replicate everything (4 GB per device); the message must
  // not send the user after that much memory.
  CostTable light = t;
  for (OpCost &op : light.ops)
    op.activationBytes = 100;
  o.memoryLimitBytes = 1500000000;
  e = errorOf([&] { partition(light, topo, o); });
  EXPECT_NE(e.find("about 1.9 GiB per device"), std::string::npos) << e;
  o.memoryLimitBytes = 500000000; // a single op does not fit
  e = errorOf([&] { partition(t, topo, o); });
  EXPECT_NE(e.find("op 'op0' alone needs 953.7 MiB, 476.8 MiB more than the limit"), std::string::npos) << e;
}

TEST(Partitioner, ShortfallIsItsOwnErrorExplainedOnlyWhenAsked) {
  CostTable t = uniformChain(4, 1.0, 1, 500000000); // 1 GB per op with gradients
  Topology topo = flatTopology(2, 1e9);
  PartitionOptions o;
  o.memoryLimitBytes = 1500000000;
  EXPECT_THROW(partition(t, topo, o), MemoryShortfall);
  EXPECT_FALSE(partitionIfFits(t, topo, o).has_value());
  EXPECT_EQ(memoryShortfall(t, topo, o, false), "no partition of the 4 ops over 2 devices fits in 1.4 GiB per device");
  EXPECT_NE(memoryShortfall(t, topo, o, true).find("the least any partition needs"), std::string::npos);
  o.memoryLimitBytes = 2500000000;
  ASSERT_TRUE(partitionIfFits(t, topo, o).has_value());
  // Other errors are thrown as partition() throws them, not as a shortfall.
  o.forcedStages = 3;
  EXPECT_THROW(
      {
        try {
          partitionIfFits(t, topo, o);
        } catch (const MemoryShortfall &) {
          FAIL() << "a shortfall";
        }
      },
      Error);
}

TEST(Partitioner, ShortfallListsTheFourFullestStages) {
  // 12 ops on 12 devices without replication: each op fits alone with one
  // micro-batch in flight, but the first stages of a pipeline hold up to 12
  // in flight, so the least partition has many stages over the limit; the
  // message names the four fullest and counts the others.
  CostTable t = uniformChain(12, 1.0, 100000000, 100000000);
  Topology topo = flatTopology(12, 1e9);
  PartitionOptions o;
  o.allowReplication = false;
  o.microbatches = 64;
  o.memoryLimitBytes = 450000000;
  std::string e = errorOf([&] { partition(t, topo, o); });
  EXPECT_NE(e.find("the least any partition needs"), std::string::npos) << e;
  // "fits in X; the least ...", four stages, "; and N more stages"
  EXPECT_EQ(std::count(e.begin(), e.end(), ';'), 5) << e;
  EXPECT_NE(e.find("more stages over the limit"), std::string::npos) << e;
}

TEST(Partitioner, ForcedStagesAndNoReplication) {
  std::mt19937_64 rng(7);
  CostTable t = randomDag(rng, 20);
  Topology topo = makeGpusTopology({2, 4}, *findDevicePreset("A100"));
  for (int stages : {1, 3, 8}) {
    PartitionOptions o = unlimited();
    o.forcedStages = stages;
    PartitionResult r = partition(t, topo, o);
    EXPECT_EQ(static_cast<int>(r.stages.size()), stages);
    r.verify(t, topo);
  }
  PartitionOptions o = unlimited();
  o.allowReplication = false;
  PartitionResult r = partition(t, topo, o);
  for (const StagePlan &s : r.stages)
    EXPECT_EQ(s.replicas, 1);
  o.forcedStages = 9;
  EXPECT_EQ(errorOf([&] { partition(t, topo, o); }), "--stages 9: only 8 devices");
  o.forcedStages = 21;
  EXPECT_EQ(errorOf([&] { partition(t, topo, o); }), "--stages 21: only 8 devices");
  EXPECT_EQ(errorOf([&] { partition(t, makeGpusTopology({4, 8}, *findDevicePreset("A100")), o); }),
            "--stages 21: the graph has only 20 ops");
}

TEST(Partitioner, HierarchicalRanksAndReplicasPerLevel) {
  // Heavy weights on the slow network, light ones inside the server: the DP keeps
  // data parallelism inside servers and pipelines across them.
  CostTable t = uniformChain(8, 1.0, 1000, 100000000);
  Topology topo;
  topo.levels = {{4, 1e12, "nvlink"}, {2, 1e8, "network"}};
  topo.deviceMemoryBytes = int64_t(1) << 40;
  PartitionResult r = partition(t, topo, unlimited());
  r.verify(t, topo);
  for (const StagePlan &s : r.stages) {
    ASSERT_EQ(s.replicasPerLevel.size(), 2u);
    EXPECT_EQ(s.replicasPerLevel[1], 1) << "no stage should be replicated over the slow network";
    for (int rank : s.ranks)
      EXPECT_EQ(rank / 4, s.ranks[0] / 4) << "a stage stays in one server";
  }
  EXPECT_EQ(r.devicesUsed, 8);
  // the cut between servers goes over the network level
  int networkCuts = 0;
  for (const StagePlan &s : r.stages)
    networkCuts += s.sendLevel == 1;
  EXPECT_EQ(networkCuts, 1);
}

TEST(Partitioner, GroupingFindsLayerBoundariesAndKeepsTheOptimum) {
  // 12 blocks of 8 ops: inside a block two large tensors cross every cut (the op's
  // output and the block input held for the residual add); between blocks only
  // the small residual stream. Compute differs per block.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(0.5, 2);
  const int blocks = 12, perBlock = 8;
  CostTable t;
  for (int b = 0; b < blocks; ++b) {
    double scale = unit(rng);
    for (int k = 0; k < perBlock; ++k) {
      OpCost op;
      int i = b * perBlock + k;
      op.name = "b" + std::to_string(b) + "." + std::to_string(k);
      op.type = "MatMul";
      op.forwardSeconds = 1e-3 * scale * unit(rng);
      op.backwardInputSeconds = op.forwardSeconds;
      op.backwardWeightSeconds = op.forwardSeconds;
      op.activationBytes = k + 1 == perBlock ? 2000000 : 400000000;
      op.parameterBytes = 30000000;
      op.optimizerStateBytes = 60000000;
      if (i > 0)
        op.producers.push_back(t.ops[i - 1].name);
      if (k > 0 && b > 0)
        op.producers.push_back(t.ops[b * perBlock - 1].name); // block input, kept for the residual
      t.ops.push_back(op);
    }
  }
  for (const char *gpus : {"2x4", "4x4", "1x8"}) {
    Topology topo = makeGpusTopology(parseGpusSpec(gpus), *findDevicePreset("V100"));
    PartitionOptions exact = unlimited(), grouped = unlimited();
    exact.maxLayers = 1000;
    grouped.maxLayers = blocks;
    CostModel model(t, topo, grouped);
    std::vector<int> ends = groupIntoLayers(model, blocks);
    ASSERT_EQ(static_cast<int>(ends.size()), blocks);
    for (int b = 0; b < blocks; ++b)
      EXPECT_EQ(ends[b], b * perBlock + perBlock - 1);
    PartitionResult e = partition(t, topo, exact), g = partition(t, topo, grouped);
    EXPECT_EQ(e.layers, blocks * perBlock);
    EXPECT_EQ(g.layers, blocks);
    EXPECT_NEAR(g.timePerMicrobatch, e.timePerMicrobatch, 1e-9 * e.timePerMicrobatch) << gpus;
  }
}

TEST(Partitioner, GroupingOnlyRestrictsCuts) {
  // Grouped plans are plans of the ungrouped problem: never better than the optimum.
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 10; ++trial) {
    CostTable t = randomDag(rng, 40);
    Topology topo = makeGpusTopology({2, 2}, *findDevicePreset("H100"));
    PartitionOptions exact = unlimited(), grouped = unlimited();
    grouped.maxLayers = 10;
    PartitionResult e = partition(t, topo, exact), g = partition(t, topo, grouped);
    EXPECT_GE(g.timePerMicrobatch, e.timePerMicrobatch * (1 - 1e-12));
    CostModel model(t, topo, exact);
    EXPECT_NEAR(model.evaluate(g.tree), g.timePerMicrobatch, 1e-12 * g.timePerMicrobatch);
  }
}

TEST(EvaluatePartition, GivenStagesAndErrors) {
  CostTable t = uniformChain(8, 1.0, 1000, 1000);
  Topology topo = makeGpusTopology({2, 4}, *findDevicePreset("H100"));
  PartitionOptions o = unlimited();
  // Two stages of 4 devices: one per server, the cut crosses the network.
  PartitionResult r = evaluatePartition(t, topo, o, {{0, 3, 4, {}}, {4, 7, 4, {}}});
  EXPECT_FALSE(r.fromSearch);
  EXPECT_EQ(r.stages[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.stages[0].sendLevel, 1);
  EXPECT_NEAR(r.timePerMicrobatch, 1.0, 1e-6); // 4 s of compute over 4 replicas
  // Stage 0 on half of each server is also a valid hierarchy (replicated pipelines).
  PartitionResult h = evaluatePartition(t, topo, o, {{0, 3, 4, {0, 1, 4, 5}}, {4, 7, 4, {2, 3, 6, 7}}});
  EXPECT_EQ(h.stages[0].replicasPerLevel, (std::vector<int>{2, 2}));
  EXPECT_EQ(h.stages[0].sendLevel, 0);
  EXPECT_EQ(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 1, {}}, {5, 7, 1, {}}}); }),
            "partition: stage 1: ops 5..7 do not continue the previous stage (expected to start at op 4)");
  EXPECT_EQ(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 1, {}}}); }),
            "partition: the stages end at op 3 but the table has 8 ops");
  EXPECT_EQ(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 6, {}}, {4, 7, 6, {}}}); }),
            "partition: the stages need more than the 8 devices");
  // 2 + 6 devices: stage 1 shares server 0 with stage 0, which no hierarchy holds;
  // on consecutive ranks it is a pipeline of device ranges.
  PartitionResult shared = evaluatePartition(t, topo, o, {{0, 3, 2, {}}, {4, 7, 6, {}}});
  EXPECT_TRUE(shared.tree.deviceRanges);
  EXPECT_EQ(shared.stages[1].ranks, (std::vector<int>{2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(shared.stages[1].replicasPerLevel.empty());
  EXPECT_EQ(shared.stages[0].replicasPerLevel, (std::vector<int>{2, 1}));
  EXPECT_EQ(shared.stages[0].sendLevel, 1); // stage 1's replicas on server 1 receive over the network
  EXPECT_NO_THROW(shared.verify(t, topo));
  // Not consecutive and not a hierarchy: refused.
  EXPECT_NE(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 3, {0, 1, 4}}, {4, 7, 5, {2, 3, 5, 6, 7}}}); })
                .find("do not all hold the same stages"),
            std::string::npos);
  EXPECT_EQ(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 1, {0}}, {4, 7, 1, {0}}}); }),
            "partition: stage 1: rank 0 is out of range or used twice");
  o.memoryLimitBytes = 11500; // each stage: 4000 B of weights, 4000 of gradients, 4000 of activations
  EXPECT_EQ(errorOf([&] { evaluatePartition(t, topo, o, {{0, 3, 1, {}}, {4, 7, 1, {}}}); }),
            "the given partition does not fit in 11.2 KiB per device: stage 0 (ops 'op0'..'op3') needs "
            "11.7 KiB, 500 B more; stage 1 (ops 'op4'..'op7') needs 11.7 KiB, 500 B more");
}

TEST(Partitioner, ZeroCostTableGivesFiniteNumbers) {
  CostTable t = uniformChain(5, 0.0, 0, 0);
  Topology topo = makeGpusTopology({2, 2}, *findDevicePreset("V100"));
  PartitionResult r = partition(t, topo, PartitionOptions{});
  EXPECT_EQ(r.timePerMicrobatch, 0);
  EXPECT_EQ(r.throughput, 0);
  EXPECT_EQ(r.bubbleFraction, 0);
  EXPECT_EQ(r.speedupOverDataParallel, 1);
  EXPECT_NO_THROW(r.verify(t, topo));
}
