#ifndef PIPEC_TEST_PARTITION_EXHAUSTIVE_H
#define PIPEC_TEST_PARTITION_EXHAUSTIVE_H

// The brute-force twin of the DP: it enumerates every hierarchical partition
// (every split of every level's segment into stages, every replica count, every
// inner pipeline of every stage) and evaluates each one with CostModel::evaluate,
// which walks an explicit tree and shares no code with the DP's tables.

#include "compiler/Partition/Partitioner.h"

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

} // namespace pipec::partition::testing

#endif
