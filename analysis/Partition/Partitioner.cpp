// partition() and evaluatePartition(): PipeDream's hierarchical DP
// (HierarchicalDp.cpp) and the device-range search (DeviceRanges.cpp) on a
// cost table, the better plan described (Describe.cpp), and the messages when
// nothing fits (docs/partition.md).
#include "analysis/Partition/Partitioner.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Partition/DeviceRanges.h"
#include "analysis/Partition/Error.h"
#include "analysis/Partition/HierarchicalDp.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace pipec::partition {

using detail::autoMaxLayers;
using detail::checkSearchSize;
using detail::HierarchicalDp;
using detail::refineBoundaries;

namespace {

std::string opRange(const CostTable &table, int first, int last) {
  return "ops '" + table.ops[first].name + "'..'" + table.ops[last].name + "'";
}

/// " stage k (ops 'a'..'b') needs X, Y more" for the stages over `limit` that
/// need the most (at most kStagesListed, in stage order; "and N more stages"
/// after them), joined by "; ", with the in-flight count when `withInflight`.
void listStagesOverLimit(std::ostream &os, const CostTable &table, const std::vector<StagePlan> &stages,
                         double limit, bool withInflight) {
  constexpr size_t kStagesListed = 4;
  std::vector<size_t> over;
  for (size_t k = 0; k < stages.size(); ++k)
    if (static_cast<double>(stages[k].memoryBytes) > limit)
      over.push_back(k);
  std::vector<size_t> listed = over;
  if (listed.size() > kStagesListed) {
    std::stable_sort(listed.begin(), listed.end(),
                     [&](size_t a, size_t b) { return stages[a].memoryBytes > stages[b].memoryBytes; });
    listed.resize(kStagesListed);
    std::sort(listed.begin(), listed.end());
  }
  const char *sep = " ";
  for (size_t k : listed) {
    const StagePlan &s = stages[k];
    const double need = static_cast<double>(s.memoryBytes);
    os << sep << "stage " << k << " (" << opRange(table, s.firstOp, s.lastOp);
    if (withInflight)
      os << ", " << s.inflight << " in flight";
    os << ") needs " << formatBytes(need) << ", " << formatBytes(need - limit) << " more";
    sep = "; ";
  }
  if (over.size() > listed.size())
    os << "; and " << over.size() - listed.size() << " more stages over the limit";
}

} // namespace

std::string memoryShortfall(const CostTable &table, const Topology &topology, const PartitionOptions &options,
                            bool explain) {
  const CostModel model(table, topology, options);
  std::ostringstream os;
  double limit = model.memoryLimit();
  const std::string unit = topology.memoryUnit();
  os << "no partition of the " << table.ops.size() << " ops over " << topology.totalDevices() << " " << unit
     << "s fits in " << formatBytes(limit) << " per " << unit;
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
  if (!explain)
    return os.str();
  // Bisect the limit over the DP's own feasibility (monotone in the limit) to
  // find about the least memory any partition needs, and show that partition.
  // 1% is precise enough for "about" and halves the searches.
  int layers = options.maxLayers > 0 ? options.maxLayers : autoMaxLayers(topology, options);
  auto solveWith = [&](double memoryLimit, PartitionTree &tree) {
    PartitionOptions o = options;
    o.memoryLimitBytes = memoryLimit < 0 ? -1 : static_cast<int64_t>(memoryLimit);
    CostModel m(table, topology, o);
    return std::isfinite(HierarchicalDp(m, groupIntoLayers(m, layers)).solve(tree));
  };
  PartitionTree tree;
  if (!solveWith(-1, tree))
    return os.str();
  double hi = 0, lo = limit;
  for (const StagePlan &s : model.describe(tree, true).stages)
    hi = std::max(hi, static_cast<double>(s.memoryBytes));
  for (int step = 0; step < 12 && hi - lo > 0.01 * hi; ++step) {
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
  os << "; the least any partition needs is about " << formatBytes(need) << " per " << unit << " ("
     << formatBytes(need - limit) << " more), in a partition where";
  listStagesOverLimit(os, table, r.stages, limit, true);
  os << " (try " << (options.recompute ? "" : settings::flag(settings::kRecompute) + ", ")
     << "fewer micro-batches in flight, more " << unit << "s or a larger "
     << settings::flag(options.memoryLimitBytes != 0 || topology.memoryOrigin.empty() ? settings::kMemoryLimit
                                                                                      : settings::kHostMemory)
     << ")";
  return os.str();
}

namespace {

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

/// `run(table, options)` on the ops in `order` (table indices; identity or
/// empty: the table's order), its result recording the order.
template <typename Run>
PartitionResult inOrder(const CostTable &table, const PartitionOptions &options, const std::vector<int> &order,
                        Run run) {
  if (isIdentityOrder(order))
    return run(table, options);
  CostTable ordered = reorderedCostTable(table, order, "partition");
  PartitionResult result = run(ordered, optionsInOrder(options, order));
  result.opOrder = order;
  return result;
}

/// evaluatePartition() with the stages' op indices in table order.
PartitionResult evaluateInTableOrder(const CostTable &table, const Topology &topology,
                                     const PartitionOptions &options, const std::vector<StageSpec> &stages) {
  PartitionOptions opts = options;
  opts.forcedStages = 0;
  opts.allowReplication = true; // the given replicas are what they are
  CostModel model(table, topology, opts);
  PartitionTree tree = treeFromStages(topology, model.numOps(), stages);
  PartitionResult result = model.describe(tree, false);
  result.layers = model.numOps();
  if (!std::isfinite(result.timePerMicrobatch)) {
    std::ostringstream os;
    const bool overLimit = std::any_of(result.stages.begin(), result.stages.end(), [&](const StagePlan &s) {
      return static_cast<double>(s.memoryBytes) > model.memoryLimit();
    });
    if (!overLimit) // the cost model's infinite cut: PartitionOptions::unsplittable
      throw Error("the given partition cuts between ops that must share a stage (the readers of one tied "
                  "parameter under an asynchronous schedule, docs/planner.md)");
    os << "the given partition does not fit in " << formatBytes(model.memoryLimit()) << " per "
       << topology.memoryUnit() << ":";
    listStagesOverLimit(os, table, result.stages, model.memoryLimit(), false);
    throw Error(os.str());
  }
  return result;
}

} // namespace

PartitionResult partition(const CostTable &table, const Topology &topology, const PartitionOptions &options,
                          bool explainShortfall) {
  if (std::optional<PartitionResult> result = partitionIfFits(table, topology, options))
    return std::move(*result);
  throw MemoryShortfall(memoryShortfall(table, topology, options, explainShortfall));
}

std::optional<PartitionResult> partitionIfFits(const CostTable &table, const Topology &topology,
                                               const PartitionOptions &options) {
  CostModel model(table, topology, options);
  if (options.forcedStages > topology.totalDevices())
    throw Error((settings::flag(settings::kStages) + " ") + std::to_string(options.forcedStages) + ": only " +
                std::to_string(topology.totalDevices()) + " devices");
  std::vector<int> ends =
      groupIntoLayers(model, options.maxLayers > 0 ? options.maxLayers : autoMaxLayers(topology, options));
  if (options.forcedStages > static_cast<int>(ends.size()))
    throw Error((settings::flag(settings::kStages) + " ") + std::to_string(options.forcedStages) + ": the graph has only " +
                std::to_string(ends.size()) + (ends.size() == table.ops.size() ? " ops" : " layers"));
  // Refuse what would run for minutes or exhaust memory rather than hang; the
  // stage-count dimension and wide levels multiply the DP's work.
  checkSearchSize(topology, options, static_cast<int>(ends.size()), table.ops.size(), 2);
  auto solver = std::make_unique<HierarchicalDp>(model, ends);
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
      solver = std::make_unique<HierarchicalDp>(model, ends);
    }
  }
  PartitionTree tree;
  double best = solver->solve(tree);
  if (std::isfinite(best) && static_cast<int>(ends.size()) < model.numOps()) {
    // grouped: move boundaries op by op within a layer's width of where they are
    int window = (model.numOps() + static_cast<int>(ends.size()) - 1) / static_cast<int>(ends.size());
    refineBoundaries(model, tree, window, 8);
    best = model.evaluate(tree);
  }
  // Stages on device ranges that share servers, cut at antichains: taken only
  // when strictly better, so PipeDream's tree stays the answer on a tie.
  DeviceRangePlan ranges = options.deviceRangeSearch ? searchDeviceRangesWithinBudget(model) : DeviceRangePlan{};
  if (ranges.value < best * (1 - 1e-9)) {
    PartitionResult result =
        inOrder(table, options, ranges.order, [&](const CostTable &t, const PartitionOptions &o) {
          return CostModel(t, topology, o).describe(ranges.tree, true);
        });
    result.layers = ranges.units;
    return result;
  }
  if (!std::isfinite(best))
    return std::nullopt;
  PartitionResult result = model.describe(tree, true);
  result.layers = static_cast<int>(ends.size());
  return result;
}

PartitionResult evaluatePartition(const CostTable &table, const Topology &topology,
                                  const PartitionOptions &options, const std::vector<StageSpec> &stages,
                                  const std::vector<int> &opOrder) {
  return inOrder(table, options, opOrder, [&](const CostTable &t, const PartitionOptions &o) {
    return evaluateInTableOrder(t, topology, o, stages);
  });
}

} // namespace pipec::partition
