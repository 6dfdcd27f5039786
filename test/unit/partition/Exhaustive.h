#ifndef PIPEC_TEST_PARTITION_EXHAUSTIVE_H
#define PIPEC_TEST_PARTITION_EXHAUSTIVE_H

// The brute-force twin of the DP: it enumerates every hierarchical partition
// (every split of every level's segment into stages, every replica count, every
// inner pipeline of every stage) and evaluates each one with CostModel::evaluate,
// which walks an explicit tree and shares no code with the DP's tables.

#include "analysis/Partition/Partitioner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

namespace pipec::partition::testing {

class Exhaustive {
public:
  Exhaustive(const CostModel &model) : model_(model), topo_(model.topology()) {}

  struct Best {
    double value = std::numeric_limits<double>::infinity();
    PartitionTree tree;
    long candidates = 0;
  };

  Best solve() {
    Best best;
    int top = static_cast<int>(topo_.levels.size()) - 1;
    for (const std::vector<TreeStage> &pipeline : pipelines(top, 0, model_.numOps() - 1)) {
      PartitionTree tree{pipeline};
      if (model_.options().forcedStages > 0 && flatStages(pipeline) != model_.options().forcedStages)
        continue;
      ++best.candidates;
      double v = model_.evaluate(tree);
      if (v < best.value) {
        best.value = v;
        best.tree = tree;
      }
    }
    return best;
  }

  static int flatStages(const std::vector<TreeStage> &stages) {
    int n = 0;
    for (const TreeStage &s : stages)
      n += s.inner.empty() ? 1 : flatStages(s.inner);
    return n;
  }

private:
  /// Every pipeline over ops first..last at `level` using at most fanout workers.
  const std::vector<std::vector<TreeStage>> &pipelines(int level, int first, int last) {
    auto key = std::make_tuple(level, first, last);
    auto it = memo_.find(key);
    if (it != memo_.end())
      return it->second;
    std::vector<std::vector<TreeStage>> all;
    std::vector<TreeStage> current;
    extend(level, first, last, topo_.levels[level].fanout, current, all);
    return memo_[key] = std::move(all);
  }

  void extend(int level, int first, int last, int workersLeft, std::vector<TreeStage> &current,
              std::vector<std::vector<TreeStage>> &all) {
    if (first > last) {
      all.push_back(current);
      return;
    }
    int maxReplicas = model_.options().allowReplication ? workersLeft : std::min(1, workersLeft);
    for (int end = first; end <= last; ++end)
      for (int r = 1; r <= maxReplicas; ++r) {
        if (level == 0) {
          current.push_back(TreeStage{first, end, r, {}});
          extend(level, end + 1, last, workersLeft - r, current, all);
          current.pop_back();
          continue;
        }
        // copy: the recursive calls below may grow memo_
        std::vector<std::vector<TreeStage>> inners = pipelines(level - 1, first, end);
        for (const std::vector<TreeStage> &inner : inners) {
          current.push_back(TreeStage{first, end, r, inner});
          extend(level, end + 1, last, workersLeft - r, current, all);
          current.pop_back();
        }
      }
  }

  const CostModel &model_;
  const Topology &topo_;
  std::map<std::tuple<int, int, int>, std::vector<std::vector<TreeStage>>> memo_;
};

/// The brute-force twin of the device-range search: every chain of nested
/// ideals of the op DAG (every sequence of antichain cuts), as an op order with
/// contiguous stages, times every split of all the devices into consecutive
/// ranges, one per stage; each evaluated by CostModel::evaluate on the table in
/// that order. It shares no code with searchDeviceRanges.
class ExhaustiveDeviceRanges {
public:
  ExhaustiveDeviceRanges(const CostTable &table, const Topology &topology, const PartitionOptions &options)
      : table_(table), topo_(topology), options_(options), producers_(table.producerIndices()) {}

  struct Best {
    double value = std::numeric_limits<double>::infinity();
    PartitionTree tree;
    std::vector<int> order;
    long candidates = 0;
  };

  Best solve() {
    Best best;
    std::vector<int> stageOf(table_.ops.size(), -1);
    chains(stageOf, 0, best);
    return best;
  }

private:
  /// Assigns the next stage every non-empty set of unassigned ops whose
  /// producers are assigned (to it or earlier), recursively.
  void chains(std::vector<int> &stageOf, int stage, Best &best) {
    int n = static_cast<int>(stageOf.size());
    std::vector<int> open;
    for (int op = 0; op < n; ++op)
      if (stageOf[op] < 0)
        open.push_back(op);
    if (open.empty()) {
      evaluateChain(stageOf, stage, best);
      return;
    }
    for (uint32_t mask = 1; mask < (uint32_t(1) << open.size()); ++mask) {
      bool closed = true;
      for (size_t k = 0; k < open.size() && closed; ++k)
        if (mask >> k & 1)
          for (int p : producers_[open[k]]) {
            bool inMask = false;
            for (size_t q = 0; q < open.size(); ++q)
              inMask = inMask || (open[q] == p && (mask >> q & 1));
            closed = closed && (stageOf[p] >= 0 || inMask);
          }
      if (!closed || splitsGroup(stageOf, open, mask))
        continue;
      for (size_t k = 0; k < open.size(); ++k)
        if (mask >> k & 1)
          stageOf[open[k]] = stage;
      chains(stageOf, stage + 1, best);
      for (size_t k = 0; k < open.size(); ++k)
        if (mask >> k & 1)
          stageOf[open[k]] = -1;
    }
  }

  bool splitsGroup(const std::vector<int> &stageOf, const std::vector<int> &open, uint32_t mask) const {
    for (auto [first, last] : options_.unsplittable) {
      bool any = false, every = true;
      for (int op = first; op <= last; ++op) {
        bool in = stageOf[op] >= 0;
        for (size_t k = 0; k < open.size(); ++k)
          in = in || (open[k] == op && (mask >> k & 1));
        any = any || in;
        every = every && in;
      }
      if (any && !every)
        return true;
    }
    return false;
  }

  void evaluateChain(const std::vector<int> &stageOf, int stages, Best &best) {
    if (options_.forcedStages > 0 && stages != options_.forcedStages)
      return;
    int64_t devices = topo_.totalDevices();
    if (stages > devices)
      return;
    std::vector<int> order(stageOf.size());
    for (size_t k = 0; k < order.size(); ++k)
      order[k] = static_cast<int>(k);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return stageOf[a] < stageOf[b]; });
    std::vector<int> position(order.size());
    for (size_t k = 0; k < order.size(); ++k)
      position[order[k]] = static_cast<int>(k);
    CostTable ordered;
    for (int op : order)
      ordered.ops.push_back(table_.ops[op]);
    PartitionOptions o = options_;
    for (auto &[first, last] : o.unsplittable) {
      int lo = position[first], hi = position[first];
      for (int op = first; op <= last; ++op) {
        lo = std::min(lo, position[op]);
        hi = std::max(hi, position[op]);
      }
      first = lo;
      last = hi;
    }
    CostModel model(ordered, topo_, o);
    std::vector<TreeStage> pipeline;
    int next = 0;
    for (int s = 0; s < stages; ++s) {
      int first = next;
      while (next < static_cast<int>(order.size()) && stageOf[order[next]] == s)
        ++next;
      pipeline.push_back(TreeStage{first, next - 1, 1, {}});
    }
    compositions(model, pipeline, 0, devices, order, best);
  }

  /// Every way to give the stages replicas that use exactly `left` devices.
  void compositions(const CostModel &model, std::vector<TreeStage> &pipeline, size_t stage, int64_t left,
                    const std::vector<int> &order, Best &best) {
    if (stage + 1 == pipeline.size()) {
      if (!options_.allowReplication && left != 1)
        return;
      pipeline[stage].replicas = static_cast<int>(left);
      PartitionTree tree{pipeline, true};
      ++best.candidates;
      double v = model.evaluate(tree);
      if (v < best.value) {
        best.value = v;
        best.tree = tree;
        best.order = order;
      }
      return;
    }
    int64_t most = options_.allowReplication ? left - static_cast<int64_t>(pipeline.size() - stage - 1) : 1;
    for (int64_t r = 1; r <= most; ++r) {
      pipeline[stage].replicas = static_cast<int>(r);
      compositions(model, pipeline, stage + 1, left - r, order, best);
    }
  }

  const CostTable &table_;
  const Topology &topo_;
  PartitionOptions options_;
  std::vector<std::vector<int>> producers_;
};

} // namespace pipec::partition::testing

#endif
