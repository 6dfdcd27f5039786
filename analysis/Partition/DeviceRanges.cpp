#include "analysis/Partition/DeviceRanges.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <map>

namespace pipec::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A set of units as a bitset.
using UnitSet = std::vector<uint64_t>;

bool contains(const UnitSet &set, int unit) { return (set[unit / 64] >> (unit % 64)) & 1; }
void insert(UnitSet &set, int unit) { set[unit / 64] |= uint64_t(1) << (unit % 64); }
bool subsetOf(const UnitSet &a, const UnitSet &b) {
  for (size_t w = 0; w < a.size(); ++w)
    if (a[w] & ~b[w])
      return false;
  return true;
}
int count(const UnitSet &set) {
  int n = 0;
  for (uint64_t w : set)
    n += __builtin_popcountll(w);
  return n;
}

/// One ideal (a set of units closed under producers) and the sums of its ops.
struct Ideal {
  UnitSet units;
  int size = 0;
  double compute = 0, parameters = 0, optimizerState = 0, activations = 0;
  double cutBytes = 0; ///< bytes of its ops' outputs read outside it
  std::vector<int> supersets; ///< indices of the ideals that strictly contain it
  /// Per superset: the most micro-batches in flight the stage between them fits with.
  std::vector<int> inflightFits;
};

/// The units (groups of consecutive ops) as a DAG: each op's unit, each unit's
/// first op, the units each unit reads, and the unsplittable groups.
struct UnitDag {
  int n = 0, ops = 0, words = 0;
  std::vector<int> unitOf, unitFirst;
  std::vector<UnitSet> needs;
  std::vector<std::vector<int>> readerUnits; // units other than its own that read an op
  std::vector<UnitSet> groups;                // an ideal holds all of a group's units or none
};

UnitDag unitDag(const CostModel &model, const std::vector<int> &unitEnds) {
  const CostTable &table = model.table();
  const PartitionOptions &opts = model.options();
  UnitDag dag;
  const int n = dag.n = static_cast<int>(unitEnds.size());
  const int ops = dag.ops = model.numOps();
  const int words = dag.words = (n + 63) / 64;
  dag.unitOf.assign(ops, 0);
  dag.unitFirst.assign(n, 0);
  for (int u = 0; u < n; ++u) {
    dag.unitFirst[u] = u == 0 ? 0 : unitEnds[u - 1] + 1;
    for (int op = dag.unitFirst[u]; op <= unitEnds[u]; ++op)
      dag.unitOf[op] = u;
  }
  std::vector<std::vector<int>> producers = table.producerIndices();
  dag.needs.assign(n, UnitSet(words, 0));
  dag.readerUnits.assign(ops, {});
  for (int c = 0; c < ops; ++c)
    for (int p : producers[c])
      if (dag.unitOf[p] != dag.unitOf[c]) {
        insert(dag.needs[dag.unitOf[c]], dag.unitOf[p]);
        dag.readerUnits[p].push_back(dag.unitOf[c]);
      }
  // Unsplittable ranges: an ideal holds all of a range's units or none.
  for (auto [first, last] : opts.unsplittable) {
    UnitSet g(words, 0);
    for (int op = std::max(0, first); op <= last && op < ops; ++op)
      insert(g, dag.unitOf[op]);
    if (count(g) > 1)
      dag.groups.push_back(std::move(g));
  }
  return dag;
}

/// Every ideal, by breadth-first growth from the empty set; false (and `all`
/// incomplete) when there are more than `maxIdeals`.
bool enumerateIdeals(const UnitDag &dag, int maxIdeals, std::vector<UnitSet> &all) {
  all = {UnitSet(dag.words, 0)};
  std::map<UnitSet, int> seen{{all[0], 0}};
  for (size_t q = 0; q < all.size(); ++q)
    for (int u = 0; u < dag.n; ++u) {
      if (contains(all[q], u) || !subsetOf(dag.needs[u], all[q]))
        continue;
      UnitSet next = all[q];
      insert(next, u);
      if (seen.count(next))
        continue;
      if (static_cast<int>(all.size()) >= maxIdeals)
        return false;
      seen.emplace(next, static_cast<int>(all.size()));
      all.push_back(std::move(next));
    }
  return true;
}

/// The ideals a stage boundary may sit at (none splits an unsplittable group),
/// smallest first (the empty and the full one included), each with its
/// strict supersets; `pairs` counts those nested pairs.
std::vector<Ideal> boundaryIdeals(const UnitDag &dag, const std::vector<UnitSet> &all, double &pairs) {
  const int n = dag.n;
  std::vector<Ideal> ideals;
  for (const UnitSet &set : all) {
    int size = count(set);
    bool splits = false;
    if (size > 0 && size < n)
      for (const UnitSet &g : dag.groups) {
        bool any = false, every = true;
        for (int u = 0; u < n; ++u)
          if (contains(g, u)) {
            any = any || contains(set, u);
            every = every && contains(set, u);
          }
        splits = splits || (any && !every);
      }
    if (splits)
      continue;
    Ideal ideal;
    ideal.units = set;
    ideal.size = size;
    ideals.push_back(std::move(ideal));
  }
  std::stable_sort(ideals.begin(), ideals.end(), [](const Ideal &a, const Ideal &b) { return a.size < b.size; });
  const int count_ = static_cast<int>(ideals.size());
  pairs = 0;
  for (int i = 0; i < count_; ++i) {
    for (int j = i + 1; j < count_; ++j)
      if (ideals[j].size > ideals[i].size && subsetOf(ideals[i].units, ideals[j].units))
        ideals[i].supersets.push_back(j);
    pairs += static_cast<double>(ideals[i].supersets.size());
  }
  return ideals;
}

/// Each ideal's sums of its ops' costs and cut bytes, and per superset the
/// most micro-batches in flight the stage between them fits with.
void addIdealCosts(const CostModel &model, const std::vector<int> &unitEnds, const UnitDag &dag,
                   std::vector<Ideal> &ideals) {
  const CostTable &table = model.table();
  for (Ideal &ideal : ideals)
    for (int u = 0; u < dag.n; ++u)
      if (contains(ideal.units, u)) {
        const int first = dag.unitFirst[u], last = unitEnds[u];
        ideal.compute += model.compute(first, last);
        ideal.parameters += model.parameters(first, last);
        ideal.optimizerState += model.optimizerState(first, last);
        ideal.activations += model.activations(first, last);
        for (int op = first; op <= last; ++op)
          for (int reader : dag.readerUnits[op])
            if (!contains(ideal.units, reader)) {
              ideal.cutBytes += static_cast<double>(table.ops[op].activationBytes);
              break;
            }
      }
  for (Ideal &from : ideals)
    for (int j : from.supersets) {
      const Ideal &to = ideals[j];
      from.inflightFits.push_back(model.mostInflightFitting(to.parameters - from.parameters,
                                                            to.optimizerState - from.optimizerState,
                                                            to.activations - from.activations, from.cutBytes));
    }
}

/// Per device range [d, d+r): the all-reduce coefficient and the links its cuts cross.
struct DeviceRangeLinks {
  int64_t devices;
  std::vector<double> coefficient;
  std::vector<int8_t> sendLevel, receiveLevel;
  size_t index(int64_t d, int64_t r) const { return static_cast<size_t>(d * (devices + 1) + r); }

  explicit DeviceRangeLinks(const CostModel &model) : devices(model.topology().totalDevices()) {
    const Topology &topo = model.topology();
    coefficient.assign((devices + 1) * (devices + 1), 0);
    sendLevel.assign(coefficient.size(), -1);
    receiveLevel.assign(coefficient.size(), -1);
    for (int64_t d = 0; d < devices; ++d)
      for (int64_t r = 1; d + r <= devices; ++r) {
        coefficient[index(d, r)] = model.rangeAllreduceCoefficient(d, r);
        if (d + r < devices)
          sendLevel[index(d, r)] = static_cast<int8_t>(topo.linkLevel(d, d + r));
        if (d > 0)
          receiveLevel[index(d, r)] = static_cast<int8_t>(topo.linkLevel(d - 1, d + r - 1));
      }
  }
};

/// The dynamic program over chains of ideals and device ranges:
/// value[(ideal·devices + d)·depth + p] is the best pipeline for the ops outside
/// the ideal on devices d.. (all of them) in p+1 stages (any count when not
/// forced); choice, the next ideal and the replicas of the stage that gets it.
struct ChainTables {
  struct Choice {
    int32_t next = -1;
    int32_t replicas = 0;
  };
  int64_t devices;
  int depth;
  bool forced;
  std::vector<double> value;
  std::vector<Choice> choice;
  size_t at(int ideal, int64_t d, int p) const {
    return (static_cast<size_t>(ideal) * static_cast<size_t>(devices) + static_cast<size_t>(d)) * depth + p;
  }
};

ChainTables solveChains(const CostModel &model, const std::vector<Ideal> &ideals, int depth, bool forced,
                        int64_t maxReplicas) {
  const DeviceRangeLinks links(model);
  const int64_t devices = links.devices;
  const int count_ = static_cast<int>(ideals.size());
  const int full = count_ - 1; // the only ideal of size n
  ChainTables T{devices, depth, forced, {}, {}};
  T.value.assign(static_cast<size_t>(count_) * devices * depth, kInf);
  T.choice.assign(T.value.size(), {});
  for (int i = full - 1; i >= 0; --i) {
    const Ideal &from = ideals[i];
    for (int64_t d = 0; d < devices; ++d)
      for (int p = 0; p < depth; ++p) {
        double best = kInf;
        ChainTables::Choice bestChoice;
        for (size_t k = 0; k < from.supersets.size(); ++k) {
          const int j = from.supersets[k];
          const Ideal &to = ideals[j];
          bool last = j == full;
          if (forced && (last != (p == 0)))
            continue;
          double compute = to.compute - from.compute, params = to.parameters - from.parameters;
          // the last stage takes every device left; others leave at least one
          int64_t rFirst = last ? devices - d : std::min<int64_t>(maxReplicas, devices - d - 1);
          int64_t rLast = last ? devices - d : 1;
          if (rFirst < 1 || rFirst > maxReplicas || compute / static_cast<double>(rFirst) >= best)
            continue;
          const int fits = from.inflightFits[k];
          // fewer replicas keep more micro-batches in flight (once one does not fit, fewer
          // never do) and take longer per micro-batch (once one is too slow, fewer are too)
          for (int64_t r = rFirst; r >= rLast; --r) {
            if (compute / static_cast<double>(r) >= best ||
                model.inflight(static_cast<int>(r), static_cast<int>(devices - d - r), 0) > fits)
              break;
            size_t range = links.index(d, r);
            double t = CostModel::rangeStageTime(compute, params, links.coefficient[range], r);
            if (i > 0)
              t = std::max(t, model.linkTime(links.receiveLevel[range], from.cutBytes));
            if (!last) {
              t = std::max(t, model.linkTime(links.sendLevel[range], to.cutBytes));
              t = std::max(t, T.value[T.at(j, d + r, forced ? p - 1 : 0)]);
            }
            if (t < best) {
              best = t;
              bestChoice = ChainTables::Choice{j, static_cast<int32_t>(r)};
            }
          }
        }
        T.value[T.at(i, d, p)] = best;
        T.choice[T.at(i, d, p)] = bestChoice;
      }
  }
  return T;
}

/// The chain of ideals the tables chose, the stage of each unit, and the op
/// order that makes stages contiguous, into the plan's order and tree.
void tracePlan(const ChainTables &T, const std::vector<Ideal> &ideals, const UnitDag &dag, DeviceRangePlan &plan) {
  const int n = dag.n, ops = dag.ops;
  const int full = static_cast<int>(ideals.size()) - 1;
  std::vector<int> stageOfUnit(n, -1), replicas;
  int ideal = 0, stage = 0, p = T.depth - 1;
  int64_t d = 0;
  while (ideal != full) {
    ChainTables::Choice c = T.choice[T.at(ideal, d, p)];
    for (int u = 0; u < n; ++u)
      if (contains(ideals[c.next].units, u) && !contains(ideals[ideal].units, u))
        stageOfUnit[u] = stage;
    replicas.push_back(c.replicas);
    ideal = c.next;
    d += c.replicas;
    p = T.forced ? p - 1 : 0;
    ++stage;
  }
  plan.order.resize(ops);
  for (int op = 0; op < ops; ++op)
    plan.order[op] = op;
  const std::vector<int> &unitOf = dag.unitOf;
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](int a, int b) { return stageOfUnit[unitOf[a]] < stageOfUnit[unitOf[b]]; });
  plan.tree.deviceRanges = true;
  int position = 0;
  for (int s = 0; s < stage; ++s) {
    int first = position;
    while (position < ops && stageOfUnit[unitOf[plan.order[position]]] == s)
      ++position;
    assert(position > first && "every step of the chain of ideals adds at least one unit");
    plan.tree.stages.push_back(TreeStage{first, position - 1, replicas[s], {}});
  }
  assert(position == ops && "the chain of ideals ends at the full set, so every op has a stage");
}

} // namespace

DeviceRangePlan searchDeviceRanges(const CostModel &model, const std::vector<int> &unitEnds, double maxSteps,
                                   int maxIdeals) {
  DeviceRangePlan plan;
  const Topology &topo = model.topology();
  const PartitionOptions &opts = model.options();
  const int64_t devices = topo.totalDevices();
  const UnitDag dag = unitDag(model, unitEnds);
  plan.units = dag.n;

  std::vector<UnitSet> all;
  if (!enumerateIdeals(dag, maxIdeals, all)) {
    plan.tooLarge = true;
    return plan;
  }
  // One server and a chain: every plan here is one of the tree's (which may also
  // leave devices idle), so the tree's search already covers it.
  if (topo.levels.size() == 1 && static_cast<int>(all.size()) == dag.n + 1)
    return plan;

  double pairs = 0;
  std::vector<Ideal> ideals = boundaryIdeals(dag, all, pairs);
  const int count_ = static_cast<int>(ideals.size());
  const bool forced = opts.forcedStages > 0;
  const int depth = forced ? opts.forcedStages : 1; // p: stages still to place, minus one
  const int64_t maxReplicas = opts.allowReplication ? devices : 1;
  double steps = pairs * static_cast<double>(devices) * static_cast<double>(std::min<int64_t>(devices, maxReplicas)) /
                 2 * depth;
  // (the tables hold 16 bytes per state: at most 64 MiB)
  if (steps > maxSteps || static_cast<double>(count_) * devices * depth > 4e6) {
    plan.tooLarge = true;
    return plan;
  }
  addIdealCosts(model, unitEnds, dag, ideals);
  const ChainTables tables = solveChains(model, ideals, depth, forced, maxReplicas);
  plan.value = tables.value[tables.at(0, 0, depth - 1)];
  if (!std::isfinite(plan.value))
    return plan;
  tracePlan(tables, ideals, dag, plan);
  return plan;
}

DeviceRangePlan searchDeviceRangesWithinBudget(const CostModel &model) {
  // Under about 0.1 s of search (measured: a few ns per step); PipeDream's tree
  // runs beside it with its own budget.
  const double maxSteps = 1e7;
  const int maxIdeals = 4096;
  if (model.topology().totalDevices() > 1024)
    return DeviceRangePlan{};
  // Any n units have at least n+1 ideals (the prefixes of a topological order),
  // so n(n+1)/2 nested pairs: start at the most units that bound allows.
  const PartitionOptions &opts = model.options();
  double devices = static_cast<double>(model.topology().totalDevices());
  double perPair = devices * (opts.allowReplication ? devices : 1) / 2 * std::max(1, opts.forcedStages);
  int layers = 2;
  while (layers < 256 && (layers + 1.0) * (layers + 2.0) / 2 * perPair <= maxSteps)
    ++layers;
  if (opts.maxLayers > 0)
    layers = std::min(layers, opts.maxLayers);
  for (;;) {
    std::vector<int> ends = groupIntoLayers(model, layers);
    DeviceRangePlan plan = searchDeviceRanges(model, ends, maxSteps, maxIdeals);
    if (!plan.tooLarge)
      return plan;
    layers = static_cast<int>(ends.size()) * 2 / 3;
    if (layers < std::max(2, model.options().forcedStages))
      return DeviceRangePlan{};
  }
}

} // namespace pipec::partition
