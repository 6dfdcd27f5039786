// CostModel: the numbers of design.md §2 for a cost table on a topology, and
// PipeDream's objective for a partition tree (docs/partition.md).
#include "analysis/Partition/Partitioner.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Partition/CostModelDetail.h"
#include "analysis/Partition/Error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace pipec::partition {

using detail::ceilDiv;
using detail::innerOuterOf;
using detail::kInf;

CostModel::CostModel(const CostTable &table, const Topology &topology, const PartitionOptions &options)
    : table_(table), topology_(topology), options_(options) {
  topology_.verify("topology");
  if (table.ops.empty())
    throw Error("cost table: no ops");
  validateCostTable(table, "cost table");
  if (options.microbatches < 1 || options.microbatches > kMaxMicrobatches)
    throw Error((settings::flag(settings::kMicrobatches) + " ") + std::to_string(options.microbatches) + ": must be between 1 and " +
                std::to_string(kMaxMicrobatches));
  if (options.forcedStages < 0 || options.forcedStages > kMaxDevices)
    throw Error((settings::flag(settings::kStages) + " ") + std::to_string(options.forcedStages) + ": must be between 1 and " +
                std::to_string(kMaxDevices));
  limit_ = options.memoryLimitBytes < 0   ? kInf
           : options.memoryLimitBytes > 0 ? static_cast<double>(options.memoryLimitBytes)
                                          : static_cast<double>(topology.stageMemoryBytes());
  size_t n = table.ops.size();
  computePrefix_.assign(n + 1, 0);
  paramPrefix_.assign(n + 1, 0);
  optPrefix_.assign(n + 1, 0);
  actPrefix_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const OpCost &op = table.ops[i];
    computePrefix_[i + 1] = computePrefix_[i] + op.computeSeconds();
    paramPrefix_[i + 1] = paramPrefix_[i] + static_cast<double>(op.parameterBytes);
    optPrefix_[i + 1] = optPrefix_[i] + static_cast<double>(op.optimizerStateBytes);
    actPrefix_[i + 1] = actPrefix_[i] + static_cast<double>(op.keptBytes());
  }
  // DAG cuts: op p's output crosses every cut s with p <= s < (its last reader).
  // A difference array sums each producing op's bytes once per cut, in O(ops + edges).
  std::vector<std::vector<int>> producers = table.producerIndices();
  std::vector<int> lastReader(n, -1);
  for (size_t c = 0; c < n; ++c)
    for (int p : producers[c])
      lastReader[p] = std::max(lastReader[p], static_cast<int>(c));
  std::vector<int64_t> delta(n + 1, 0);
  for (size_t p = 0; p < n; ++p)
    if (lastReader[p] > static_cast<int>(p)) {
      delta[p] += table.ops[p].activationBytes;
      delta[lastReader[p]] -= table.ops[p].activationBytes;
    }
  cutBytes_.assign(n, 0);
  int64_t running = 0;
  for (size_t s = 0; s < n; ++s)
    cutBytes_[s] = running += delta[s];
  forbiddenCut_.assign(n, 0);
  for (auto [first, last] : options.unsplittable)
    for (int s = std::max(0, first); s < last && s < static_cast<int>(n); ++s)
      forbiddenCut_[s] = 1;
}

int CostModel::inflight(int r, int x, int64_t outer) const {
  // PipeDream 1F1B keeps one micro-batch in flight per device from this stage to the
  // end of the pipeline, shared by the stage's replicas: ceil(D/R). Per replica of the
  // enclosing stages, `outer` = ceil(devices after them / their replication), so
  // ceil((r + x + outer)/r) equals ceil(D/R) of the flattened plan exactly
  // (ceil((a + ceil(y))/r) = ceil((a + y)/r) for integers a, r).
  int64_t f = ceilDiv(static_cast<int64_t>(r) + x + outer, r);
  if (!options_.asynchronous)
    f = std::min<int64_t>(f, options_.microbatches); // a flush bounds it by the mini-batch
  return static_cast<int>(std::min<int64_t>(f, 1 << 30));
}

double CostModel::memory(int i, int j, int f) const {
  return memoryOf(parameters(i, j), optimizerState(i, j), activations(i, j), static_cast<double>(cutBytes(i - 1)), f);
}

int CostModel::mostInflightFitting(double params, double optimizerStateBytes, double activationBytes,
                                   double inputBytes) const {
  auto memoryWith = [&](int f) { return memoryOf(params, optimizerStateBytes, activationBytes, inputBytes, f); };
  // memory is affine in the in-flight count f: the largest f that fits
  double m1 = memoryWith(1), slope = memoryWith(2) - m1;
  int f;
  if (m1 > limit_)
    f = 0;
  else if (slope <= 0 || std::isinf(limit_))
    f = std::numeric_limits<int>::max();
  else
    f = static_cast<int>(std::min(1.0 + std::floor((limit_ - m1) / slope), 2.0e9));
  // floor() can round across the limit: settle on the exact comparison
  while (f > 0 && f < (1 << 30) && memoryWith(f) > limit_)
    --f;
  while (f < (1 << 30) && memoryWith(f + 1) <= limit_)
    ++f;
  return f;
}

double CostModel::memoryOf(double params, double optimizerStateBytes, double activationBytes, double inputBytes,
                           int f) const {
  // Weights, their gradients (one buffer per stage, accumulated over the
  // micro-batches: the runtime's StageModel) and the optimizer state.
  double fixed = 2 * params + optimizerStateBytes;
  double stash = options_.asynchronous ? (f - 1) * params : 0; // the live version serves one
  double acts = options_.recompute ? f * inputBytes + activationBytes : f * activationBytes;
  return fixed + stash + acts;
}

double CostModel::allreduceTime(int level, int i, int j, int r) const {
  return 2.0 * (r - 1) * parameters(i, j) / topology_.levels[level].bandwidthBytesPerSecond;
}

double CostModel::cutTime(int level, int s) const {
  if (s >= 0 && s < static_cast<int>(forbiddenCut_.size()) && forbiddenCut_[s])
    return kInf; // inside an unsplittable range (PartitionOptions::unsplittable)
  return linkTime(level, static_cast<double>(cutBytes(s)));
}

double CostModel::linkTime(int level, double bytes) const {
  return level < 0 ? 0 : 2.0 * bytes / topology_.levels[level].bandwidthBytesPerSecond;
}

double CostModel::rangeAllreduceCoefficient(int64_t firstRank, int64_t ranks) const {
  std::vector<int64_t> touched = topology_.workersTouched(firstRank, ranks);
  double coefficient = 0, below = 1; // below: c_0···c_{k-1}
  for (size_t k = 0; k < touched.size(); ++k) {
    coefficient = std::max(coefficient, 2.0 * static_cast<double>(touched[k] - 1) * below /
                                            topology_.levels[k].bandwidthBytesPerSecond);
    below *= static_cast<double>(touched[k]);
  }
  return coefficient;
}

double CostModel::rangeStageTime(double compute, double params, int64_t firstRank, int64_t ranks) const {
  return rangeStageTime(compute, params, rangeAllreduceCoefficient(firstRank, ranks), ranks);
}

double CostModel::rangeStageTime(double compute, double params, double allreduceCoefficient, int64_t ranks) {
  return std::max(compute, allreduceCoefficient * params) / static_cast<double>(ranks);
}

double CostModel::rangeAllreduceSeconds(double params, int64_t firstRank, int64_t ranks) const {
  std::vector<int64_t> touched = topology_.workersTouched(firstRank, ranks);
  double seconds = 0;
  for (size_t k = 0; k < touched.size(); ++k)
    seconds += 2.0 * static_cast<double>(touched[k] - 1) / static_cast<double>(touched[k]) * params /
               topology_.levels[k].bandwidthBytesPerSecond;
  return seconds;
}

int CostModel::rangeCutLevel(int64_t firstRank, int64_t ranks, int64_t nextRanks) const {
  return topology_.linkLevel(firstRank, firstRank + ranks + nextRanks - 1);
}

double CostModel::rangeCutTime(int s, int64_t firstRank, int64_t ranks, int64_t nextRanks) const {
  // The sender side (the stage and the next's first device) and the receiver side
  // (the stage's last device and the next stage) separately, so that the search
  // can charge each when it places that stage.
  int sender = topology_.linkLevel(firstRank, firstRank + ranks);
  int receiver = topology_.linkLevel(firstRank + ranks - 1, firstRank + ranks + nextRanks - 1);
  return std::max(cutTime(sender, s), cutTime(receiver, s));
}

double CostModel::deviceStageTime(int i, int j, int r, int f) const {
  if (memory(i, j, f) > limit_)
    return kInf;
  return std::max(compute(i, j), allreduceTime(0, i, j, r)) / r;
}

double CostModel::evaluatePipeline(int level, const std::vector<TreeStage> &stages, int first,
                                   int last, int64_t outer) const {
  // built only on failure: evaluate() runs in the refiner's inner loop
  auto where = [&] {
    return "partition: level " + std::to_string(level) + " (" + topology_.levels[level].name + ")";
  };
  if (stages.empty())
    throw Error(where() + ": empty pipeline for ops " + std::to_string(first) + ".." + std::to_string(last));
  int64_t workers = 0;
  for (const TreeStage &st : stages) {
    if (st.replicas < 1)
      throw Error(where() + ": a stage has " + std::to_string(st.replicas) + " replicas");
    if (!options_.allowReplication && st.replicas != 1)
      throw Error(where() + ": replication is disabled but a stage has " + std::to_string(st.replicas) + " replicas");
    workers += st.replicas;
  }
  if (workers > topology_.levels[level].fanout)
    throw Error(where() + ": the stages use " + std::to_string(workers) + " workers, the level has " +
                std::to_string(topology_.levels[level].fanout));
  double value = 0;
  int next = first;
  int64_t after = workers;
  for (size_t q = 0; q < stages.size(); ++q) {
    const TreeStage &st = stages[q];
    if (st.firstOp != next || st.lastOp < st.firstOp || st.lastOp > last)
      throw Error(where() + ": stages do not cover ops " + std::to_string(first) + ".." +
                  std::to_string(last) + " contiguously");
    next = st.lastOp + 1;
    after -= st.replicas;
    int x = static_cast<int>(after);
    double t;
    if (level == 0) {
      if (!st.inner.empty())
        throw Error(where() + ": a device stage has an inner pipeline");
      t = deviceStageTime(st.firstOp, st.lastOp, st.replicas, inflight(st.replicas, x, outer));
    } else {
      int64_t innerOuter = innerOuterOf(x, st.replicas, outer, topology_.devicesPerComponent(level - 1));
      double inner = evaluatePipeline(level - 1, st.inner, st.firstOp, st.lastOp, innerOuter);
      t = std::max(inner, allreduceTime(level, st.firstOp, st.lastOp, st.replicas)) / st.replicas;
    }
    value = std::max(value, t);
    if (q + 1 < stages.size())
      value = std::max(value, cutTime(level, st.lastOp));
  }
  if (next != last + 1)
    throw Error(where() + ": stages do not cover ops " + std::to_string(first) + ".." + std::to_string(last));
  return value;
}

double CostModel::evaluateDeviceRanges(const std::vector<TreeStage> &stages) const {
  auto where = [&] { return std::string("partition (stages on device ranges)"); };
  if (stages.empty())
    throw Error(where() + ": no stages");
  int64_t devices = 0;
  for (const TreeStage &st : stages) {
    if (st.replicas < 1 || !st.inner.empty())
      throw Error(where() + ": a stage has " + std::to_string(st.replicas) + " replicas or an inner pipeline");
    if (!options_.allowReplication && st.replicas != 1)
      throw Error(where() + ": replication is disabled but a stage has " + std::to_string(st.replicas) + " replicas");
    devices += st.replicas;
  }
  if (devices > topology_.totalDevices())
    throw Error(where() + ": the stages use " + std::to_string(devices) + " devices, the topology has " +
                std::to_string(topology_.totalDevices()));
  double value = 0;
  int next = 0;
  int64_t rank = 0;
  for (size_t q = 0; q < stages.size(); ++q) {
    const TreeStage &st = stages[q];
    if (st.firstOp != next || st.lastOp < st.firstOp || st.lastOp >= numOps())
      throw Error(where() + ": stages do not cover the ops contiguously");
    next = st.lastOp + 1;
    int x = static_cast<int>(devices - rank - st.replicas);
    if (memory(st.firstOp, st.lastOp, inflight(st.replicas, x, 0)) > limit_)
      return kInf;
    value = std::max(value, rangeStageTime(compute(st.firstOp, st.lastOp), parameters(st.firstOp, st.lastOp), rank,
                                           st.replicas));
    if (q + 1 < stages.size())
      value = std::max(value, rangeCutTime(st.lastOp, rank, st.replicas, stages[q + 1].replicas));
    rank += st.replicas;
  }
  if (next != numOps())
    throw Error(where() + ": stages do not cover every op");
  return value;
}

double CostModel::evaluate(const PartitionTree &tree) const {
  if (tree.deviceRanges)
    return evaluateDeviceRanges(tree.stages);
  return evaluatePipeline(static_cast<int>(topology_.levels.size()) - 1, tree.stages, 0,
                          numOps() - 1, 0);
}

} // namespace pipec::partition
