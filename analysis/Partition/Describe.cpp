// Between partition trees and flat plans: CostModel::describe() flattens a
// tree into the stage table a plan prints, treeFromStages() rebuilds the tree
// PipeDream's model needs from flat stages, and PartitionResult::verify()
// checks a flat plan (docs/partition.md).
#include "analysis/Partition/Partitioner.h"

#include "analysis/Partition/CostModelDetail.h"
#include "analysis/Partition/Error.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace pipec::partition {

using detail::innerOuterOf;

//===----------------------------------------------------------------------===//
// From a tree to flat stages
//===----------------------------------------------------------------------===//

namespace {

/// Bytes computed in double (memory of a stage, possibly with no limit) as an
/// int64 for the plan, saturating instead of overflowing.
int64_t bytesOf(double bytes) {
  constexpr double kMax = 9.0e18;
  return bytes >= kMax ? static_cast<int64_t>(kMax) : bytes <= 0 ? 0 : static_cast<int64_t>(bytes);
}

/// A device stage on ranks firstRank.. with f micro-batches in flight: its
/// compute and memory (communication is the caller's).
StagePlan deviceStagePlan(const CostModel &model, const TreeStage &st, int64_t firstRank, int f) {
  StagePlan plan;
  plan.firstOp = st.firstOp;
  plan.lastOp = st.lastOp;
  plan.replicas = st.replicas;
  for (int r = 0; r < st.replicas; ++r)
    plan.ranks.push_back(static_cast<int>(firstRank + r));
  plan.inflight = f;
  plan.computeSeconds = model.compute(st.firstOp, st.lastOp);
  plan.parameterBytes = bytesOf(model.parameters(st.firstOp, st.lastOp));
  plan.optimizerStateBytes = bytesOf(model.optimizerState(st.firstOp, st.lastOp));
  plan.gradientBytes = plan.parameterBytes;
  double mem = model.memory(st.firstOp, st.lastOp, plan.inflight);
  plan.stashBytes = model.options().asynchronous
                        ? bytesOf(static_cast<double>(plan.inflight - 1) * static_cast<double>(plan.parameterBytes))
                        : 0;
  plan.memoryBytes = bytesOf(mem);
  plan.activationBytes = bytesOf(mem - static_cast<double>(plan.parameterBytes) -
                                 static_cast<double>(plan.gradientBytes) - static_cast<double>(plan.optimizerStateBytes) -
                                 static_cast<double>(plan.stashBytes));
  return plan;
}

/// Workers a pipeline's stages use together.
int64_t workersOf(const std::vector<TreeStage> &stages) {
  int64_t workers = 0;
  for (const TreeStage &st : stages)
    workers += st.replicas;
  return workers;
}

/// Device-range stages (PartitionTree::deviceRanges) on consecutive ranks.
void flattenDeviceRanges(const CostModel &model, const std::vector<TreeStage> &stages, std::vector<StagePlan> &out) {
  const Topology &topo = model.topology();
  const int64_t devices = workersOf(stages);
  int64_t rank = 0;
  for (size_t q = 0; q < stages.size(); ++q) {
    const TreeStage &st = stages[q];
    int after = static_cast<int>(devices - rank - st.replicas);
    StagePlan plan = deviceStagePlan(model, st, rank, model.inflight(st.replicas, after, 0));
    std::vector<int64_t> touched = topo.workersTouched(rank, st.replicas);
    int64_t product = 1;
    for (int64_t c : touched)
      product *= c;
    if (product == st.replicas)
      plan.replicasPerLevel.assign(touched.begin(), touched.end());
    plan.allreduceSeconds = model.rangeAllreduceSeconds(model.parameters(st.firstOp, st.lastOp), rank, st.replicas);
    if (q + 1 < stages.size()) {
      plan.sendLevel = model.rangeCutLevel(rank, st.replicas, stages[q + 1].replicas);
      plan.sendBytes = model.cutBytes(st.lastOp);
      plan.sendSeconds = model.rangeCutTime(st.lastOp, rank, st.replicas, stages[q + 1].replicas);
    }
    out.push_back(std::move(plan));
    rank += st.replicas;
  }
}

/// Flattens a level's pipeline into device stages with ranks relative to the
/// component holding it ([0, devicesPerComponent(level))).
void flatten(const CostModel &model, int level, const std::vector<TreeStage> &stages, int64_t outer,
             std::vector<StagePlan> &out) {
  const Topology &topo = model.topology();
  int64_t workerSize = topo.devicesPerComponent(level - 1);
  const int64_t total = workersOf(stages);
  int64_t worker = 0;
  for (size_t q = 0; q < stages.size(); ++q) {
    const TreeStage &st = stages[q];
    int x = static_cast<int>(total - worker - st.replicas);
    size_t begin = out.size();
    if (level == 0) {
      StagePlan plan = deviceStagePlan(model, st, worker, model.inflight(st.replicas, x, outer));
      plan.replicasPerLevel = {st.replicas};
      out.push_back(std::move(plan));
    } else {
      int64_t innerOuter = innerOuterOf(x, st.replicas, outer, workerSize);
      std::vector<StagePlan> inner;
      flatten(model, level - 1, st.inner, innerOuter, inner);
      for (StagePlan &plan : inner) {
        std::vector<int> ranks;
        for (int r = 0; r < st.replicas; ++r)
          for (int rank : plan.ranks)
            ranks.push_back(static_cast<int>((worker + r) * workerSize + rank));
        plan.ranks = std::move(ranks);
        plan.replicas *= st.replicas;
        plan.replicasPerLevel.push_back(st.replicas);
        out.push_back(std::move(plan));
      }
    }
    // Gradients of this stage's weights are reduced over its replicas at this level.
    double bandwidth = topo.levels[level].bandwidthBytesPerSecond;
    for (size_t k = begin; k < out.size(); ++k)
      out[k].allreduceSeconds += 2.0 * (st.replicas - 1) / st.replicas *
                                 model.parameters(out[k].firstOp, out[k].lastOp) / bandwidth;
    if (q + 1 < stages.size()) {
      out.back().sendLevel = level;
      out.back().sendBytes = model.cutBytes(st.lastOp);
      out.back().sendSeconds = model.cutTime(level, st.lastOp);
    }
    worker += st.replicas;
  }
}

PartitionTree dataParallelTree(const CostModel &model) {
  const Topology &topo = model.topology();
  TreeStage stage{0, model.numOps() - 1, topo.levels[0].fanout, {}};
  for (size_t k = 1; k < topo.levels.size(); ++k)
    stage = TreeStage{0, model.numOps() - 1, topo.levels[k].fanout, {stage}};
  return PartitionTree{{stage}};
}

} // namespace

PartitionResult CostModel::describe(const PartitionTree &tree, bool fromSearch) const {
  PartitionResult result;
  result.tree = tree;
  result.fromSearch = fromSearch;
  result.microbatches = options_.microbatches;
  result.asynchronous = options_.asynchronous;
  result.recompute = options_.recompute;
  result.memoryLimitBytes = std::isinf(limit_) ? -1 : static_cast<int64_t>(limit_);
  result.timePerMicrobatch = evaluate(tree);
  if (tree.deviceRanges)
    flattenDeviceRanges(*this, tree.stages, result.stages);
  else
    flatten(*this, static_cast<int>(topology_.levels.size()) - 1, tree.stages, 0, result.stages);
  double fill = 0;
  for (const StagePlan &s : result.stages) {
    result.devicesUsed += s.replicas;
    fill += s.computeSeconds / s.replicas + s.sendSeconds;
  }
  result.inflightMicrobatches = result.stages.front().inflight;
  double steady = options_.microbatches * result.timePerMicrobatch;
  if (options_.asynchronous) {
    // 1F1B-RR never flushes: after the start-up every stage is busy.
    result.timePerMinibatch = steady;
  } else {
    // A flush drains the pipeline each mini-batch: the fill/drain is the sum of the
    // per-micro-batch stage times beyond the slowest one ((p-1)·t for p equal stages).
    result.bubbleSeconds = std::max(0.0, fill - result.timePerMicrobatch);
    result.timePerMinibatch = steady + result.bubbleSeconds;
    if (result.timePerMinibatch > 0)
      result.bubbleFraction = result.bubbleSeconds / result.timePerMinibatch;
  }
  // A table of zero costs predicts zero time: report throughput 0 ("unknown"), not infinity.
  if (result.timePerMinibatch > 0)
    result.throughput = options_.microbatches / result.timePerMinibatch;
  // Pure data parallelism replicates regardless of --no-replication or --stages.
  PartitionOptions dataParallel = options_;
  dataParallel.allowReplication = true;
  dataParallel.forcedStages = 0;
  result.dataParallelTimePerMicrobatch =
      CostModel(table_, topology_, dataParallel).evaluate(dataParallelTree(*this));
  result.dataParallelFits = std::isfinite(result.dataParallelTimePerMicrobatch);
  if (result.dataParallelFits && std::isfinite(result.timePerMicrobatch))
    result.speedupOverDataParallel = result.timePerMicrobatch > 0
                                         ? result.dataParallelTimePerMicrobatch / result.timePerMicrobatch
                                         : 1.0;
  return result;
}

//===----------------------------------------------------------------------===//
// From flat stages back to a tree
//===----------------------------------------------------------------------===//

PartitionTree treeFromStages(const Topology &topology, int numOps, std::vector<StageSpec> stages) {
  if (stages.empty())
    throw Error("partition: no stages");
  int64_t devices = topology.totalDevices();
  int next = 0, rank = 0;
  bool anyRanks = false, allRanks = true;
  for (const StageSpec &s : stages) {
    anyRanks = anyRanks || !s.ranks.empty();
    allRanks = allRanks && !s.ranks.empty();
  }
  if (anyRanks && !allRanks)
    throw Error("partition: give ranks for every stage or for none");
  std::vector<bool> taken(devices, false);
  for (size_t k = 0; k < stages.size(); ++k) {
    StageSpec &s = stages[k];
    std::string where = "partition: stage " + std::to_string(k);
    if (s.firstOp != next || s.lastOp < s.firstOp || s.lastOp >= numOps)
      throw Error(where + ": ops " + std::to_string(s.firstOp) + ".." + std::to_string(s.lastOp) +
                  " do not continue the previous stage (expected to start at op " + std::to_string(next) + ")");
    next = s.lastOp + 1;
    if (s.replicas < 1)
      throw Error(where + ": replicas must be at least 1");
    if (!anyRanks) {
      if (rank + s.replicas > devices)
        throw Error("partition: the stages need more than the " + std::to_string(devices) + " devices");
      for (int r = 0; r < s.replicas; ++r)
        s.ranks.push_back(rank++);
    }
    if (static_cast<int>(s.ranks.size()) != s.replicas)
      throw Error(where + ": " + std::to_string(s.replicas) + " replicas but " +
                  std::to_string(s.ranks.size()) + " ranks");
    for (int r : s.ranks) {
      if (r < 0 || r >= devices || taken[r])
        throw Error(where + ": rank " + std::to_string(r) + " is out of range or used twice");
      taken[r] = true;
    }
  }
  if (next != numOps)
    throw Error("partition: the stages end at op " + std::to_string(next - 1) + " but the table has " +
                std::to_string(numOps) + " ops");

  // Top-down: at level k, stages whose ranks share a level-k worker (a component of
  // level k-1) form one level-k stage, replicated over the workers it spans; every
  // one of those workers must hold the same inner pipeline.
  struct Local {
    int stage;
    std::vector<int64_t> ranks; // relative to the current component
  };
  std::function<std::vector<TreeStage>(int, const std::vector<Local> &)> build =
      [&](int level, const std::vector<Local> &list) -> std::vector<TreeStage> {
    std::vector<TreeStage> out;
    if (level == 0) {
      for (const Local &l : list)
        out.push_back(TreeStage{stages[l.stage].firstOp, stages[l.stage].lastOp,
                                static_cast<int>(l.ranks.size()), {}});
      return out;
    }
    int64_t size = topology.devicesPerComponent(level - 1);
    size_t q = 0;
    std::set<int64_t> seenWorkers;
    while (q < list.size()) {
      std::set<int64_t> workers;
      for (int64_t r : list[q].ranks)
        workers.insert(r / size);
      size_t end = q + 1;
      for (bool grew = true; grew;) {
        grew = false;
        for (; end < list.size(); ++end) {
          bool shares = false;
          for (int64_t r : list[end].ranks)
            shares = shares || workers.count(r / size);
          if (!shares)
            break;
          for (int64_t r : list[end].ranks)
            grew = workers.insert(r / size).second || grew;
        }
      }
      for (int64_t w : workers)
        if (!seenWorkers.insert(w).second)
          throw Error("partition: stages " + std::to_string(list[q].stage) +
                      " and earlier ones share a " + topology.levels[level].name +
                      " worker without being adjacent");
      // One inner list per worker; all must agree in stages and replica counts.
      std::vector<Local> first;
      bool firstSet = false;
      for (int64_t w : workers) {
        std::vector<Local> inner;
        for (size_t k = q; k < end; ++k) {
          Local l{list[k].stage, {}};
          for (int64_t r : list[k].ranks)
            if (r / size == w)
              l.ranks.push_back(r - w * size);
          if (!l.ranks.empty())
            inner.push_back(std::move(l));
        }
        bool same = inner.size() == first.size();
        for (size_t k = 0; same && k < inner.size(); ++k)
          same = inner[k].stage == first[k].stage && inner[k].ranks.size() == first[k].ranks.size();
        if (firstSet && !same)
          throw Error("partition: stage " + std::to_string(list[q].stage) + " spans " +
                      std::to_string(workers.size()) + " " + topology.levels[level].name +
                      " workers that do not all hold the same stages with the same replica counts; "
                      "PipeDream's hierarchical model cannot evaluate it (make stages that share a "
                      "server fill it, or replicate whole servers)");
        if (!firstSet) {
          first = std::move(inner);
          firstSet = true;
        }
      }
      TreeStage st{stages[list[q].stage].firstOp, stages[list[end - 1].stage].lastOp,
                   static_cast<int>(workers.size()), build(level - 1, first)};
      out.push_back(std::move(st));
      q = end;
    }
    return out;
  };
  std::vector<Local> top;
  for (size_t k = 0; k < stages.size(); ++k)
    top.push_back(Local{static_cast<int>(k), std::vector<int64_t>(stages[k].ranks.begin(), stages[k].ranks.end())});
  try {
    return PartitionTree{build(static_cast<int>(topology.levels.size()) - 1, top)};
  } catch (const Error &) {
    // Stages on consecutive ranks from 0, in order, are device ranges even where
    // no hierarchy holds them (stages that share a server).
    PartitionTree ranges{{}, true};
    int expected = 0;
    for (const StageSpec &s : stages) {
      for (int r : s.ranks)
        if (r != expected++)
          throw;
      ranges.stages.push_back(TreeStage{s.firstOp, s.lastOp, s.replicas, {}});
    }
    return ranges;
  }
}

//===----------------------------------------------------------------------===//
// verify
//===----------------------------------------------------------------------===//

void PartitionResult::verify(const CostTable &table, const Topology &topology) const {
  auto fail = [](const std::string &why) { throw Error("internal: partition result: " + why); };
  if (stages.empty())
    fail("no stages");
  int next = 0;
  std::vector<bool> taken(topology.totalDevices(), false);
  int used = 0;
  double lowerBound = 0;
  for (size_t k = 0; k < stages.size(); ++k) {
    const StagePlan &s = stages[k];
    if (s.firstOp != next || s.lastOp < s.firstOp)
      fail("stage " + std::to_string(k) + " does not continue the previous one");
    next = s.lastOp + 1;
    int product = 1;
    for (int r : s.replicasPerLevel)
      product *= r;
    bool sharesServer = tree.deviceRanges && s.replicasPerLevel.empty();
    if (s.replicas < 1 ||
        (!sharesServer && (product != s.replicas || s.replicasPerLevel.size() != topology.levels.size())))
      fail("stage " + std::to_string(k) + ": replicas per level do not multiply to its replicas");
    if (static_cast<int>(s.ranks.size()) != s.replicas)
      fail("stage " + std::to_string(k) + ": rank count differs from replicas");
    for (int r : s.ranks) {
      if (r < 0 || r >= static_cast<int>(taken.size()) || taken[r])
        fail("rank " + std::to_string(r) + " out of range or used twice");
      taken[r] = true;
    }
    used += s.replicas;
    if (memoryLimitBytes >= 0 && s.memoryBytes > memoryLimitBytes)
      fail("stage " + std::to_string(k) + " exceeds the memory limit");
    if (s.inflight < 1 || (!asynchronous && s.inflight > microbatches))
      fail("stage " + std::to_string(k) + ": in-flight count out of range");
    if ((k + 1 < stages.size()) != (s.sendLevel >= 0))
      fail("stage " + std::to_string(k) + ": cut level inconsistent");
    // The slowest stage bounds the time per micro-batch from below.
    lowerBound = std::max(lowerBound, std::max(s.computeSeconds / s.replicas, 0.0));
  }
  if (next != static_cast<int>(table.ops.size()))
    fail("stages do not cover every op");
  if (!opOrder.empty()) {
    if (opOrder.size() != table.ops.size())
      fail("the op order does not name every op");
    std::vector<int> position(table.ops.size(), -1);
    for (size_t k = 0; k < opOrder.size(); ++k) {
      if (opOrder[k] < 0 || opOrder[k] >= static_cast<int>(table.ops.size()) || position[opOrder[k]] >= 0)
        fail("the op order is not a permutation");
      position[opOrder[k]] = static_cast<int>(k);
    }
    std::vector<std::vector<int>> producers = table.producerIndices();
    for (size_t c = 0; c < producers.size(); ++c)
      for (int p : producers[c])
        if (position[p] > position[c])
          fail("the op order puts '" + table.ops[c].name + "' before its producer '" + table.ops[p].name + "'");
  }
  if (used != devicesUsed || used > topology.totalDevices())
    fail("device count inconsistent");
  if (!(timePerMicrobatch >= 0) || !std::isfinite(timePerMicrobatch))
    fail("time per micro-batch is not finite");
  if (timePerMicrobatch < lowerBound * (1 - 1e-12))
    fail("time per micro-batch below the slowest stage's compute");
  if (timePerMinibatch < microbatches * timePerMicrobatch * (1 - 1e-12))
    fail("time per mini-batch below micro-batches × time per micro-batch");
  if (bubbleFraction < 0 || bubbleFraction >= 1)
    fail("bubble fraction out of range");
}

} // namespace pipec::partition
