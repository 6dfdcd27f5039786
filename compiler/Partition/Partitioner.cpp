#include "compiler/Partition/Partitioner.h"
#include "compiler/Partition/DeviceRanges.h"

#include "compiler/Partition/Error.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

namespace pipec::partition {

static constexpr double kInf = std::numeric_limits<double>::infinity();

static int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Bytes computed in double (memory of a stage, possibly with no limit) as an
/// int64 for the plan, saturating instead of overflowing.
static int64_t bytesOf(double bytes) {
  constexpr double kMax = 9.0e18;
  return bytes >= kMax ? static_cast<int64_t>(kMax) : bytes <= 0 ? 0 : static_cast<int64_t>(bytes);
}

/// The `outer` term an inner pipeline sees: the devices after a stage of r
/// replicas with x workers (of `workerDevices` each) after it, plus what lies
/// beyond its own pipeline, per replica (rounded up; exact, see inflight()).
static int64_t innerOuterOf(int64_t x, int64_t r, int64_t outer, int64_t workerDevices) {
  return ceilDiv(x * workerDevices + outer, r);
}

//===----------------------------------------------------------------------===//
// CostModel
//===----------------------------------------------------------------------===//

CostModel::CostModel(const CostTable &table, const Topology &topology, const PartitionOptions &options)
    : table_(table), topology_(topology), options_(options) {
  topology_.verify("topology");
  if (table.ops.empty())
    throw Error("cost table: no ops");
  validateCostTable(table, "cost table");
  if (options.microbatches < 1 || options.microbatches > kMaxMicrobatches)
    throw Error("--microbatches " + std::to_string(options.microbatches) + ": must be between 1 and " +
                std::to_string(kMaxMicrobatches));
  if (options.forcedStages < 0 || options.forcedStages > kMaxDevices)
    throw Error("--stages " + std::to_string(options.forcedStages) + ": must be between 1 and " +
                std::to_string(kMaxDevices));
  limit_ = options.memoryLimitBytes < 0   ? kInf
           : options.memoryLimitBytes > 0 ? static_cast<double>(options.memoryLimitBytes)
                                          : static_cast<double>(topology.deviceMemoryBytes);
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
    actPrefix_[i + 1] = actPrefix_[i] + static_cast<double>(op.activationBytes);
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
  double fixed = params + optimizerStateBytes;
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

namespace {

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
  double mem = model.memory(st.firstOp, st.lastOp, plan.inflight);
  plan.stashBytes = model.options().asynchronous
                        ? bytesOf(static_cast<double>(plan.inflight - 1) * static_cast<double>(plan.parameterBytes))
                        : 0;
  plan.memoryBytes = bytesOf(mem);
  plan.activationBytes = bytesOf(mem - static_cast<double>(plan.parameterBytes) -
                                 static_cast<double>(plan.optimizerStateBytes) - static_cast<double>(plan.stashBytes));
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
// Grouping into layers
//===----------------------------------------------------------------------===//

std::vector<int> groupIntoLayers(const CostModel &model, int maxLayers) {
  int n = model.numOps();
  std::vector<int> ends;
  if (maxLayers < 1)
    throw Error("maxLayers must be positive");
  if (n <= maxLayers) {
    for (int i = 0; i < n; ++i)
      ends.push_back(i);
    return ends;
  }
  // Targets split the compute evenly; each boundary moves, within half a layer of
  // its target, to the cheapest cut (a block boundary where only the residual
  // stream crosses), so that the DP sees the cuts a good partition would use.
  double total = model.compute(0, n - 1);
  std::vector<double> weight(n);
  for (int i = 0; i < n; ++i)
    weight[i] = total > 0 ? model.compute(i, i) / total : 1.0 / n;
  int halfWindow = std::max(1, n / maxLayers / 2);
  int prev = -1, op = 0;
  double prefix = 0;
  for (int g = 1; g < maxLayers; ++g) {
    double target = static_cast<double>(g) / maxLayers;
    while (op < n - 1 && prefix + weight[op] < target)
      prefix += weight[op++];
    int center = op;
    int lo = std::max(prev + 1, center - halfWindow);
    int hi = std::min(n - 1 - (maxLayers - g), center + halfWindow); // leave ops for later layers
    if (lo > hi)
      continue;
    int best = -1;
    for (int s = lo; s <= hi; ++s)
      if (best < 0 || model.cutBytes(s) < model.cutBytes(best) ||
          (model.cutBytes(s) == model.cutBytes(best) && std::abs(s - center) < std::abs(best - center)))
        best = s;
    ends.push_back(best);
    prev = best;
  }
  ends.push_back(n - 1);
  return ends;
}

//===----------------------------------------------------------------------===//
// The DP
//===----------------------------------------------------------------------===//

namespace {

struct Choice {
  int32_t split = -1;       ///< last unit of the first stage; -1: one stage over all
  int32_t firstWorkers = 0; ///< workers of the first stage
  int32_t firstStages = 0;  ///< flat stages inside the first stage (forced depth only)
};

/// Suffix form of design.md §2's recurrence, on units (layers):
///   A_k(i..j, m) = min( T_k(i..j, m | x=0),
///                       min_{s,m'} max(T_k(i..s, m' | x=m-m'), 2a_s/B_k, A_k(s+1..j, m-m')) )
/// with exactly m workers, and T_k(i..j, r | x) = (1/r)·max(Use_{k-1}(i..j), 2(r-1)|w|/B_k),
/// Use_k = min over m <= fanout_k (idle workers allowed). The first stage is the one
/// whose downstream worker count x is known, which the memory model needs.
class Solver {
public:
  Solver(const CostModel &model, std::vector<int> ends)
      : model_(model), topo_(model.topology()), opts_(model.options()), ends_(std::move(ends)),
        n_(static_cast<int>(ends_.size())) {
    stagesDim_ = opts_.forcedStages > 0 ? opts_.forcedStages : 1;
    for (int u = 0; u < n_; ++u)
      firstOp_.push_back(u == 0 ? 0 : ends_[u - 1] + 1);
    precompute();
    buildOuterEvents();
    for (size_t k = 0; k < topo_.levels.size(); ++k)
      workerDevices_.push_back(topo_.devicesPerComponent(static_cast<int>(k) - 1));
    // maxFit_[i]: the last unit a device stage starting at unit i can reach with
    // one micro-batch in flight; memory grows with the segment, so longer ones
    // never fit (two pointers).
    maxFit_.assign(n_, n_ - 1);
    if (std::isfinite(model_.memoryLimit())) {
      int s = 0;
      for (int i = 0; i < n_; ++i) {
        s = std::max(s, i);
        while (s < n_ && model_.memory(firstOp_[i], ends_[s], 1) <= model_.memoryLimit())
          ++s;
        maxFit_[i] = s - 1; // i - 1 when unit i alone does not fit
      }
    }
  }

  /// How many memory variants of the device-level table the search may need: the
  /// outer terms reachable from the top, mapped to their feasibility classes.
  size_t deviceTableVariants() const {
    std::set<int64_t> outers = {0};
    double steps = 0;
    for (int k = static_cast<int>(topo_.levels.size()) - 1; k >= 1; --k) {
      std::set<int64_t> next;
      int fan = topo_.levels[k].fanout;
      // counting more than 2e7 would cost more than it saves: report "very many"
      steps += static_cast<double>(outers.size()) * fan * (fan + 1) / 2;
      if (steps > 2e7)
        return size_t(1) << 20;
      for (int64_t outer : outers)
        for (int r = 1; r <= fan; ++r)
          for (int x = 0; r + x <= fan; ++x)
            next.insert(innerOuterOf(x, r, outer, topo_.devicesPerComponent(k - 1)));
      outers.clear();
      for (int64_t o : next) // canonical classes only matter at level 0
        outers.insert(k == 1 ? canonicalOuter(o) : o);
      if (outers.size() > 4096)
        return outers.size();
    }
    return outers.size();
  }

  /// Returns the optimum and its tree (in op indices); infinity if nothing fits.
  double solve(PartitionTree &tree) {
    int top = static_cast<int>(topo_.levels.size()) - 1;
    Table &t = table(top, 0);
    int p = stagesDim_ - 1;
    double best = t.use[useIndex(t, 0, n_ - 1, p)];
    if (std::isfinite(best))
      tree.stages = pipeline(t, 0, n_ - 1, t.useWorkers[useIndex(t, 0, n_ - 1, p)], p);
    return best;
  }

private:
  struct Table {
    int level;
    int64_t outer;
    bool suffixOnly; // the outermost level needs only segments ending at the last unit
    int fanout;
    std::vector<double> value;
    std::vector<Choice> choice;
    std::vector<double> use;
    std::vector<int32_t> useWorkers;
    std::vector<Table *> lowerOf; // [r*(fanout+1)+x] → the level-1 table a stage looks into
    std::vector<int> inflightOf;          // level 0: [r*(fanout+1)+x] → in-flight count
    std::vector<char> done;               // columns filled so far
  };

  size_t index(const Table &t, int i, int j, int m, int p) const {
    size_t seg = t.suffixOnly ? static_cast<size_t>(i) : static_cast<size_t>(i) * n_ + j;
    return (seg * t.fanout + (m - 1)) * stagesDim_ + p;
  }
  size_t useIndex(const Table &t, int i, int j, int p) const {
    size_t seg = t.suffixOnly ? static_cast<size_t>(i) : static_cast<size_t>(i) * n_ + j;
    return seg * stagesDim_ + p;
  }

  /// Memory feasibility of a device stage depends on `outer` only through
  /// thresholds: outer values between two events give identical level-0 tables,
  /// so each is mapped to the smallest one (and all to 0 when memory never binds).
  void buildOuterEvents() {
    int f0 = topo_.levels[0].fanout;
    int64_t cap = opts_.asynchronous ? topo_.totalDevices() + f0 + 1 : opts_.microbatches;
    // the exact largest in-flight count each segment fits with (precompute())
    std::set<int64_t> critical;
    for (int v : maxInflight_)
      if (v >= 1 && v < cap)
        critical.insert(v);
    // Past this many insertions (wide device levels with many thresholds) skip
    // the sharing: every outer value keeps its own table, which is exact too.
    if (static_cast<double>(critical.size()) * f0 * (f0 + 1) / 2 > 2e7) {
      identityOuters_ = true;
      return;
    }
    // ceil((r + x + Q)/r) <= v  <=>  Q <= v·r - r - x: the signature changes just above
    std::set<int64_t> events;
    for (int64_t v : critical)
      for (int r = 1; r <= f0; ++r)
        for (int x = 0; r + x <= f0; ++x)
          if (v * r - r - x + 1 > 0)
            events.insert(v * r - r - x + 1);
    outerEvents_.assign(events.begin(), events.end());
  }

  int64_t canonicalOuter(int64_t outer) const {
    if (identityOuters_)
      return outer;
    auto it = std::upper_bound(outerEvents_.begin(), outerEvents_.end(), outer);
    return it == outerEvents_.begin() ? 0 : *std::prev(it);
  }

  Table &table(int level, int64_t outer) {
    if (level == 0)
      outer = canonicalOuter(outer);
    auto key = std::make_pair(level, outer);
    auto it = tables_.find(key);
    if (it != tables_.end())
      return *it->second;
    auto owned = std::make_unique<Table>();
    Table &t = *owned;
    tables_.emplace(key, std::move(owned));
    t.level = level;
    t.outer = outer;
    t.suffixOnly = level == static_cast<int>(topo_.levels.size()) - 1;
    t.fanout = topo_.levels[level].fanout;
    size_t segs = t.suffixOnly ? n_ : static_cast<size_t>(n_) * n_;
    t.value.assign(segs * t.fanout * stagesDim_, kInf);
    t.choice.assign(t.value.size(), Choice{});
    t.use.assign(segs * stagesDim_, kInf);
    t.useWorkers.assign(t.use.size(), 0);
    if (level == 0) {
      t.inflightOf.assign((t.fanout + 1) * (t.fanout + 1), 0);
      for (int r = 1; r <= t.fanout; ++r)
        for (int x = 0; r + x <= t.fanout; ++x)
          t.inflightOf[r * (t.fanout + 1) + x] = model_.inflight(r, x, outer);
    }
    if (t.suffixOnly)
      ensureColumn(t, n_ - 1);
    return t;
  }

  /// The level-(k-1) table a stage with r workers and x after it looks into.
  Table &lower(Table &t, int x, int r) {
    if (t.lowerOf.empty())
      t.lowerOf.assign((t.fanout + 1) * (t.fanout + 1), nullptr);
    Table *&l = t.lowerOf[r * (t.fanout + 1) + x];
    if (!l)
      l = &table(t.level - 1, innerOuterOf(x, r, t.outer, topo_.devicesPerComponent(t.level - 1)));
    return *l;
  }

  /// T_k for units i..s on r workers with x workers after it; `p` indexes the
  /// number of flat stages inside (forced depth only).
  double stageTime(Table &t, int i, int s, int r, int x, int p, double cutoff = kInf) {
    size_t seg = static_cast<size_t>(i) * n_ + s;
    if (t.level == 0) {
      if (p != 0)
        return kInf; // a device stage is one flat stage
      int f = t.inflightOf[r * (t.fanout + 1) + x];
      return f <= maxInflight_[seg] ? std::max(compute_[seg], allreduce_[0][seg] * (r - 1)) / r : kInf;
    }
    Table &l = lower(t, x, r);
    if (cutoff < kInf) {
      // More in flight never helps: the variant without outer in-flight devices
      // bounds this one from below, and often shows the split cannot win, sparing
      // the column of another memory variant.
      Table &base = lower(t, 0, t.fanout); // the smallest outer any child sees
      if (&base != &l) {
        ensureColumn(base, s);
        double bound = std::max(base.use[useIndex(base, i, s, p)], allreduce_[t.level][seg] * (r - 1)) / r;
        if (bound >= cutoff)
          return bound;
      }
    }
    ensureColumn(l, s);
    double inner = l.use[useIndex(l, i, s, p)];
    if (!std::isfinite(inner))
      return kInf;
    return std::max(inner, allreduce_[t.level][seg] * (r - 1)) / r;
  }

  /// Per-segment numbers the inner loops read (the DP's own arithmetic; the
  /// exhaustive tests compare it with CostModel::evaluate).
  void precompute() {
    size_t L = topo_.levels.size(), segs = static_cast<size_t>(n_) * n_;
    compute_.assign(segs, 0);
    maxInflight_.assign(segs, 0);
    allreduce_.assign(L, std::vector<double>(segs, 0));
    cut_.assign(L, std::vector<double>(n_, 0));
    for (int i = 0; i < n_; ++i) {
      for (int s = i; s < n_; ++s) {
        size_t seg = static_cast<size_t>(i) * n_ + s;
        int a = firstOp_[i], b = ends_[s];
        compute_[seg] = model_.compute(a, b);
        for (size_t k = 0; k < L; ++k)
          allreduce_[k][seg] = model_.allreduceTime(static_cast<int>(k), a, b, 2); // 2|w|/B_k
        maxInflight_[seg] = model_.mostInflightFitting(model_.parameters(a, b), model_.optimizerState(a, b),
                                                       model_.activations(a, b),
                                                       static_cast<double>(model_.cutBytes(a - 1)));
      }
      for (size_t k = 0; k < L; ++k)
        cut_[k][i] = model_.cutTime(static_cast<int>(k), ends_[i]);
    }
  }

  /// Columns (segments ending at unit j) are filled on first use: A_k(i..j) reads
  /// only column j of its own table, and many memory variants of a lower table are
  /// only ever asked for a few columns.
  void ensureColumn(Table &t, int j) {
    if (t.done.empty())
      t.done.assign(n_, 0);
    if (!t.done[j]) {
      fillColumn(t, j);
      t.done[j] = 1;
    }
  }

  void fillColumn(Table &t, int j) {
    const bool repl = opts_.allowReplication;
    const bool forced = opts_.forcedStages > 0;
    const std::vector<double> &cuts = cut_[t.level];
    {
      for (int i = j; i >= 0; --i) {
        bool anyFits = false;
        for (int m = 1; m <= t.fanout; ++m) {
          // every flat stage needs a device: p+1 stages need p+1 <= m·(devices per worker)
          int pEnd = std::min<int64_t>(stagesDim_, m * workerDevices_[t.level]);
          for (int p = 0; p < pEnd; ++p) {
            double best = kInf;
            Choice choice;
            if (repl || m == 1) {
              best = stageTime(t, i, j, m, 0, p);
              choice.firstWorkers = static_cast<int32_t>(m);
              choice.firstStages = static_cast<int32_t>(p);
            }
            int sEnd = t.level == 0 ? std::min(j - 1, maxFit_[i]) : j - 1;
            int maxFirst = repl ? m - 1 : std::min(1, m - 1);
            for (int s = i; s <= sEnd; ++s) {
              double cut = cuts[s];
              if (cut >= best)
                continue;
              for (int m1 = 1; m1 <= maxFirst; ++m1) {
                // forced depth: the first stage holds p1+1 flat stages, the rest p-p1
                int p1End = forced ? std::min<int64_t>(p - 1, m1 * workerDevices_[t.level] - 1) : 0;
                for (int p1 = 0; p1 <= p1End; ++p1) {
                  int pRest = forced ? p - p1 - 1 : 0;
                  if (pRest >= (m - m1) * workerDevices_[t.level])
                    continue;
                  double rest = t.value[index(t, s + 1, j, m - m1, pRest)];
                  if (rest >= best)
                    continue;
                  double first = stageTime(t, i, s, m1, m - m1, p1, best);
                  double v = std::max(std::max(first, cut), rest);
                  if (v < best) {
                    best = v;
                    choice.split = s;
                    choice.firstWorkers = static_cast<int32_t>(m1);
                    choice.firstStages = static_cast<int32_t>(p1);
                  }
                }
              }
            }
            size_t idx = index(t, i, j, m, p);
            anyFits = anyFits || std::isfinite(best);
            t.value[idx] = best;
            t.choice[idx] = choice;
            size_t u = useIndex(t, i, j, p);
            if (best < t.use[u]) {
              t.use[u] = best;
              t.useWorkers[u] = static_cast<int32_t>(m);
            }
          }
        }
        // Without recompute, a segment that fits nowhere stays unfit when it grows to
        // the left (any partition of the longer one, cut down, would fit): stop.
        if (!anyFits && !opts_.recompute)
          break;
      }
    }
  }

  TreeStage stage(Table &t, int i, int s, int r, int x, int p) {
    TreeStage st{firstOp_[i], ends_[s], r, {}};
    if (t.level > 0) {
      Table &l = lower(t, x, r);
      ensureColumn(l, s);
      st.inner = pipeline(l, i, s, l.useWorkers[useIndex(l, i, s, p)], p);
    }
    return st;
  }

  std::vector<TreeStage> pipeline(Table &t, int i, int j, int m, int p) {
    std::vector<TreeStage> stages;
    for (;;) {
      Choice c = t.choice[index(t, i, j, m, p)];
      if (c.split < 0) {
        stages.push_back(stage(t, i, j, m, 0, p));
        return stages;
      }
      stages.push_back(stage(t, i, c.split, c.firstWorkers, m - c.firstWorkers, c.firstStages));
      if (opts_.forcedStages > 0)
        p = p - c.firstStages - 1;
      i = c.split + 1;
      m -= c.firstWorkers;
    }
  }

  const CostModel &model_;
  const Topology &topo_;
  const PartitionOptions &opts_;
  std::vector<int> ends_, firstOp_;
  int n_;
  int stagesDim_ = 1;
  std::vector<int64_t> outerEvents_;
  bool identityOuters_ = false; // too many thresholds: no sharing of level-0 tables
  std::vector<int> maxFit_;
  std::vector<int64_t> workerDevices_; // devices in one worker of each level
  std::vector<double> compute_;                 // [i*n+s]
  std::vector<int> maxInflight_;                // [i*n+s]: largest f that fits
  std::vector<std::vector<double>> allreduce_;  // [level][i*n+s]: 2|w|/B_k
  std::vector<std::vector<double>> cut_;        // [level][s]: 2a_s/B_k
  std::map<std::pair<int, int64_t>, std::unique_ptr<Table>> tables_;
};

/// Per segment and level: every worker split and, with a forced depth, every
/// split of the stage count that leaves each stage a device (closed forms, so
/// that this stays O(levels * fan-out) even for the largest topologies).
std::vector<double> perSegmentWork(const Topology &topology, const PartitionOptions &options) {
  std::vector<double> out;
  const bool forced = options.forcedStages > 0;
  const int64_t P = forced ? options.forcedStages : 1;
  for (size_t k = 0; k < topology.levels.size(); ++k) {
    int64_t fan = topology.levels[k].fanout, dev = topology.devicesPerComponent(static_cast<int>(k) - 1);
    double perSegment = 0;
    if (!forced) {
      // pm = 1: one stage-count column, m - 1 first-stage worker counts
      perSegment = static_cast<double>(fan) + static_cast<double>(fan) * (fan - 1) / 2;
    } else {
      for (int64_t m = 1; m <= fan; ++m) {
        const int64_t pm = std::min(P, m * dev);
        perSegment += static_cast<double>(pm);
        // sum over m1 < m of sum_{p < pm} min(p, c), c = m1 * dev: once c >= pm - 1
        // every remaining m1 adds pm(pm-1)/2.
        const double full = static_cast<double>(pm) * (pm - 1) / 2;
        int64_t m1 = 1;
        for (; m1 < m && m1 * dev < pm - 1; ++m1) {
          const double c = static_cast<double>(m1 * dev);
          perSegment += c * (c + 1) / 2 + (static_cast<double>(pm) - 1 - c) * c;
        }
        perSegment += static_cast<double>(m - m1) * full;
      }
    }
    out.push_back(perSegment);
  }
  return out;
}

/// Inner-loop steps of the DP for `layers` units: levels below the top fill every
/// segment (layers^3/6 split points, about two memory variants), the top only
/// suffixes (layers^2/2); per segment, perSegmentWork. Plus the set insertions
/// of the memory-variant thresholds (Solver::buildOuterEvents), bounded there.
double estimatedWork(const Topology &topology, const PartitionOptions &options,
                     const std::vector<double> &perSegment, int layers, double lowerTables = 2) {
  double L = layers, work = 0;
  for (size_t k = 0; k < topology.levels.size(); ++k)
    work += (k + 1 == topology.levels.size() ? L * L / 2 : lowerTables * L * L * L / 6) * perSegment[k];
  return work;
}
double estimatedWork(const Topology &topology, const PartitionOptions &options, int layers,
                     double lowerTables = 2) {
  return estimatedWork(topology, options, perSegmentWork(topology, options), layers, lowerTables);
}

/// Bytes of the DP's tables for `layers` units: a value and a choice per
/// (segment, workers, stage count) and level, `lowerTables` variants below the top.
double estimatedTableBytes(const Topology &topology, const PartitionOptions &options, int layers,
                           double lowerTables = 2) {
  const double L = layers, stagesDim = options.forcedStages > 0 ? options.forcedStages : 1;
  const double perEntry = sizeof(double) + sizeof(Choice), perUse = sizeof(double) + sizeof(int32_t);
  double bytes = 0;
  for (size_t k = 0; k < topology.levels.size(); ++k) {
    const bool top = k + 1 == topology.levels.size();
    const double segs = top ? L : L * L, fan = topology.levels[k].fanout;
    bytes += (top ? 1 : lowerTables) * segs * stagesDim * (fan * perEntry + perUse);
  }
  return bytes;
}

/// Refuses a search that would run for more than a few seconds or allocate
/// gigabytes (measured: about 2.5 ns per step), naming what to change.
/// `layers` is the depth it would run at.
void checkSearchSize(const Topology &topology, const PartitionOptions &options, int layers,
                     size_t numOps, double lowerTables) {
  constexpr double kMaxWork = 1e9, kMaxBytes = 2.0 * (1 << 30), kSecondsPerStep = 3e-9;
  const double work = estimatedWork(topology, options, layers, lowerTables);
  const double bytes = estimatedTableBytes(topology, options, layers, lowerTables);
  if (work <= kMaxWork && bytes <= kMaxBytes)
    return;
  std::ostringstream os;
  os << (options.forcedStages > 0 ? "--stages " + std::to_string(options.forcedStages) + " on " : std::string())
     << topology.totalDevices() << " devices (" << topology.describe() << "): the partition search would take about "
     << static_cast<int64_t>(std::min(work * kSecondsPerStep, 1e12)) << " s and " << formatBytes(bytes) << " with "
     << layers << (static_cast<size_t>(layers) == numOps ? " ops" : " layers") << " (limits: about "
     << static_cast<int>(kMaxWork * kSecondsPerStep) << " s, " << formatBytes(kMaxBytes) << "); "
     << (options.forcedStages > 0 ? "ask for fewer stages, let the DP choose the depth, "
                                  : "use fewer devices per level (or more levels in a --cluster file), ")
     << "or evaluate a hand-made split with --partition";
  throw Error(os.str());
}

/// Local search after a grouped DP: grouping allows cuts only at layer ends, so
/// each stage boundary (at any level) is moved op by op within `window` ops while
/// the objective does not get worse, preferring positions that balance the two
/// device stages beside it. Moves keep the tree valid; the result is never worse
/// than the DP's on the grouped graph.
class BoundaryRefiner {
public:
  BoundaryRefiner(const CostModel &model, PartitionTree &tree) : model_(model), tree_(tree) {}

  void run(int window, int maxPasses) {
    collect(tree_.stages);
    double best = model_.evaluate(tree_);
    for (int pass = 0; pass < maxPasses; ++pass) {
      bool moved = false;
      for (const Handle &h : handles_) {
        TreeStage &left = (*h.pipeline)[h.index], &right = (*h.pipeline)[h.index + 1];
        int current = left.lastOp;
        int lo = std::max(current - window, rightSpineFirst(left));
        int hi = std::min(current + window, leftSpineLast(right) - 1);
        int bestPos = current;
        double bestBalance = balance(left, right);
        for (int b = lo; b <= hi; ++b) {
          if (b == current)
            continue;
          setBoundary(left, right, b);
          double v = model_.evaluate(tree_);
          double bal = balance(left, right);
          if (v < best * (1 - 1e-12) || (v <= best && bal < bestBalance * (1 - 1e-12))) {
            best = std::min(best, v);
            bestBalance = bal;
            bestPos = b;
          }
        }
        setBoundary(left, right, bestPos);
        moved = moved || bestPos != current;
      }
      if (!moved)
        break;
    }
  }

private:
  struct Handle {
    std::vector<TreeStage> *pipeline;
    size_t index;
  };

  void collect(std::vector<TreeStage> &pipeline) {
    for (size_t q = 0; q < pipeline.size(); ++q) {
      if (q + 1 < pipeline.size())
        handles_.push_back(Handle{&pipeline, q});
      collect(pipeline[q].inner);
    }
  }
  static int rightSpineFirst(const TreeStage &s) {
    int first = s.firstOp;
    for (const TreeStage *t = &s; !t->inner.empty(); t = &t->inner.back())
      first = std::max(first, t->inner.back().firstOp);
    return first;
  }
  static int leftSpineLast(const TreeStage &s) {
    int last = s.lastOp;
    for (const TreeStage *t = &s; !t->inner.empty(); t = &t->inner.front())
      last = std::min(last, t->inner.front().lastOp);
    return last;
  }
  static void setBoundary(TreeStage &left, TreeStage &right, int b) {
    for (TreeStage *t = &left;; t = &t->inner.back()) {
      t->lastOp = b;
      if (t->inner.empty())
        break;
    }
    for (TreeStage *t = &right;; t = &t->inner.front()) {
      t->firstOp = b + 1;
      if (t->inner.empty())
        break;
    }
  }
  /// The larger per-replica load of the two device stages meeting at the boundary.
  double balance(const TreeStage &left, const TreeStage &right) const {
    const TreeStage *l = &left, *r = &right;
    int64_t lr = left.replicas, rr = right.replicas;
    while (!l->inner.empty()) {
      l = &l->inner.back();
      lr *= l->replicas;
    }
    while (!r->inner.empty()) {
      r = &r->inner.front();
      rr *= r->replicas;
    }
    return std::max(model_.compute(l->firstOp, l->lastOp) / lr, model_.compute(r->firstOp, r->lastOp) / rr);
  }

  const CostModel &model_;
  PartitionTree &tree_;
  std::vector<Handle> handles_;
};

/// The most layers whose DP fits the time budget (about 1 s here for 64x8), with
/// `lowerTables` memory variants of the tables below the top level.
int autoMaxLayers(const Topology &topology, const PartitionOptions &options, double lowerTables = 2) {
  const double budget = 5e7;
  int best = 16;
  const std::vector<double> perSegment = perSegmentWork(topology, options);
  for (int layers = 16; layers <= 256; layers += 8)
    if (estimatedWork(topology, options, perSegment, layers, lowerTables) <= budget)
      best = layers;
  // a forced depth needs at least as many layers as stages
  return std::max(best, options.forcedStages);
}

std::string opRange(const CostTable &table, int first, int last) {
  return "ops '" + table.ops[first].name + "'..'" + table.ops[last].name + "'";
}

/// The message when nothing fits: what the fastest unconstrained partition would
/// need per stage, and whether some op cannot fit on any device at all.
std::string memoryShortfall(const CostTable &table, const Topology &topology,
                            const PartitionOptions &options, const CostModel &model) {
  std::ostringstream os;
  double limit = model.memoryLimit();
  os << "no partition of the " << table.ops.size() << " ops over " << topology.totalDevices()
     << " devices fits in " << formatBytes(limit) << " per device";
  int worst = -1;
  double worstNeed = 0;
  for (int i = 0; i < model.numOps(); ++i) {
    double need = model.memory(i, i, 1);
    if (need > worstNeed) {
      worstNeed = need;
      worst = i;
    }
  }
  if (worst >= 0 && worstNeed > limit) {
    os << ": op '" << table.ops[worst].name << "' alone needs " << formatBytes(worstNeed) << ", "
       << formatBytes(worstNeed - limit) << " more than the limit";
    return os.str();
  }
  // Bisect the limit over the DP's own feasibility (monotone in the limit) to
  // find about the least memory any partition needs, and show that partition.
  int layers = options.maxLayers > 0 ? options.maxLayers : autoMaxLayers(topology, options);
  auto solveWith = [&](double memoryLimit, PartitionTree &tree) {
    PartitionOptions o = options;
    o.memoryLimitBytes = memoryLimit < 0 ? -1 : static_cast<int64_t>(memoryLimit);
    CostModel m(table, topology, o);
    return std::isfinite(Solver(m, groupIntoLayers(m, layers)).solve(tree));
  };
  PartitionTree tree;
  if (!solveWith(-1, tree))
    return os.str();
  double hi = 0, lo = limit;
  for (const StagePlan &s : model.describe(tree, true).stages)
    hi = std::max(hi, static_cast<double>(s.memoryBytes));
  for (int step = 0; step < 12 && hi - lo > 0.001 * hi; ++step) {
    double mid = (lo + hi) / 2;
    PartitionTree t;
    if (solveWith(mid, t)) {
      hi = mid;
      tree = t;
    } else {
      lo = mid;
    }
  }
  PartitionResult r = model.describe(tree, true);
  double need = 0;
  for (const StagePlan &s : r.stages)
    need = std::max(need, static_cast<double>(s.memoryBytes));
  os << "; the least any partition needs is about " << formatBytes(need) << " per device ("
     << formatBytes(need - limit) << " more), in a partition where";
  const char *sep = " ";
  for (size_t k = 0; k < r.stages.size(); ++k)
    if (static_cast<double>(r.stages[k].memoryBytes) > limit) {
      os << sep << "stage " << k << " (" << opRange(table, r.stages[k].firstOp, r.stages[k].lastOp) << ", "
         << r.stages[k].inflight << " in flight) needs "
         << formatBytes(static_cast<double>(r.stages[k].memoryBytes)) << ", "
         << formatBytes(static_cast<double>(r.stages[k].memoryBytes) - limit) << " more";
      sep = "; ";
    }
  os << " (try --recompute, fewer micro-batches in flight, more devices or a larger --memory-limit)";
  return os.str();
}

bool isIdentityOrder(const std::vector<int> &order) {
  for (size_t k = 0; k < order.size(); ++k)
    if (order[k] != static_cast<int>(k))
      return false;
  return true;
}

/// The options with unsplittable op ranges moved to the ops' positions in
/// `order`. A partition keeps each range in one stage, and ops of one stage stay
/// in table order, so a range stays contiguous.
PartitionOptions optionsInOrder(const PartitionOptions &options, const std::vector<int> &order) {
  std::vector<int> position(order.size());
  for (size_t k = 0; k < order.size(); ++k)
    position[order[k]] = static_cast<int>(k);
  PartitionOptions o = options;
  for (auto &[first, last] : o.unsplittable) {
    int lo = static_cast<int>(order.size()), hi = -1;
    for (int op = std::max(0, first); op <= last && op < static_cast<int>(order.size()); ++op) {
      lo = std::min(lo, position[op]);
      hi = std::max(hi, position[op]);
    }
    first = lo;
    last = hi;
  }
  return o;
}

/// describe() of a tree whose op indices are positions in `order` (table
/// indices; identity or empty: the table's order).
PartitionResult describeInOrder(const CostTable &table, const Topology &topology, const PartitionOptions &options,
                                const PartitionTree &tree, const std::vector<int> &order, bool fromSearch) {
  if (isIdentityOrder(order))
    return CostModel(table, topology, options).describe(tree, fromSearch);
  CostTable ordered = reorderedCostTable(table, order, "partition");
  PartitionResult result = CostModel(ordered, topology, optionsInOrder(options, order)).describe(tree, fromSearch);
  result.opOrder = order;
  return result;
}

} // namespace

PartitionResult partition(const CostTable &table, const Topology &topology, const PartitionOptions &options) {
  CostModel model(table, topology, options);
  if (options.forcedStages > topology.totalDevices())
    throw Error("--stages " + std::to_string(options.forcedStages) + ": only " +
                std::to_string(topology.totalDevices()) + " devices");
  std::vector<int> ends =
      groupIntoLayers(model, options.maxLayers > 0 ? options.maxLayers : autoMaxLayers(topology, options));
  if (options.forcedStages > static_cast<int>(ends.size()))
    throw Error("--stages " + std::to_string(options.forcedStages) + ": the graph has only " +
                std::to_string(ends.size()) + (ends.size() == table.ops.size() ? " ops" : " layers"));
  // Refuse what would run for minutes or exhaust memory rather than hang; the
  // stage-count dimension and wide levels multiply the DP's work.
  checkSearchSize(topology, options, static_cast<int>(ends.size()), table.ops.size(), 2);
  auto solver = std::make_unique<Solver>(model, ends);
  if (options.maxLayers <= 0 && static_cast<int>(ends.size()) < model.numOps()) {
    // When memory binds, each outer in-flight term can need its own device-level
    // table: budget for them, regrouping coarser if needed.
    size_t variants = solver->deviceTableVariants();
    // (measured: lazy columns and the lower-bound pruning make a variant cost about an eighth of a table)
    double lowerTables = std::max(2.0, variants / 8.0);
    int layers = autoMaxLayers(topology, options, lowerTables);
    if (layers < static_cast<int>(ends.size())) {
      ends = groupIntoLayers(model, layers);
      checkSearchSize(topology, options, static_cast<int>(ends.size()), table.ops.size(), lowerTables);
      solver = std::make_unique<Solver>(model, ends);
    }
  }
  PartitionTree tree;
  double best = solver->solve(tree);
  if (std::isfinite(best) && static_cast<int>(ends.size()) < model.numOps()) {
    // grouped: move boundaries op by op within a layer's width of where they are
    int window = (model.numOps() + static_cast<int>(ends.size()) - 1) / static_cast<int>(ends.size());
    BoundaryRefiner(model, tree).run(window, 8);
    best = model.evaluate(tree);
  }
  // Stages on device ranges that share servers, cut at antichains: taken only
  // when strictly better, so PipeDream's tree stays the answer on a tie.
  DeviceRangePlan ranges = options.deviceRangeSearch ? searchDeviceRangesWithinBudget(model) : DeviceRangePlan{};
  if (ranges.value < best * (1 - 1e-9)) {
    PartitionResult result = describeInOrder(table, topology, options, ranges.tree, ranges.order, true);
    result.layers = ranges.units;
    return result;
  }
  if (!std::isfinite(best))
    throw Error(memoryShortfall(table, topology, options, model));
  PartitionResult result = model.describe(tree, true);
  result.layers = static_cast<int>(ends.size());
  return result;
}

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

PartitionResult evaluatePartition(const CostTable &table, const Topology &topology,
                                  const PartitionOptions &options, const std::vector<StageSpec> &stages,
                                  const std::vector<int> &opOrder) {
  if (!opOrder.empty() && !isIdentityOrder(opOrder)) {
    CostTable ordered = reorderedCostTable(table, opOrder, "partition");
    PartitionResult result = evaluatePartition(ordered, topology, optionsInOrder(options, opOrder), stages);
    result.opOrder = opOrder;
    return result;
  }
  PartitionOptions opts = options;
  opts.forcedStages = 0;
  opts.allowReplication = true; // the given replicas are what they are
  CostModel model(table, topology, opts);
  PartitionTree tree = treeFromStages(topology, model.numOps(), stages);
  PartitionResult result = model.describe(tree, false);
  result.layers = model.numOps();
  if (!std::isfinite(result.timePerMicrobatch)) {
    std::ostringstream os;
    os << "the given partition does not fit in " << formatBytes(model.memoryLimit()) << " per device:";
    const char *sep = " ";
    for (size_t k = 0; k < result.stages.size(); ++k)
      if (static_cast<double>(result.stages[k].memoryBytes) > model.memoryLimit()) {
        os << sep << "stage " << k << " (" << opRange(table, result.stages[k].firstOp, result.stages[k].lastOp)
           << ") needs " << formatBytes(static_cast<double>(result.stages[k].memoryBytes)) << ", "
           << formatBytes(result.stages[k].memoryBytes - model.memoryLimit()) << " more";
        sep = "; ";
      }
    throw Error(os.str());
  }
  return result;
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
