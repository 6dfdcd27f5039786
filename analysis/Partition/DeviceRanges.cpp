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

} // namespace

DeviceRangePlan searchDeviceRanges(const CostModel &model, const std::vector<int> &unitEnds, double maxSteps,
                                   int maxIdeals) {
  DeviceRangePlan plan;
  const CostTable &table = model.table();
  const Topology &topo = model.topology();
  const PartitionOptions &opts = model.options();
  const int n = static_cast<int>(unitEnds.size());
  const int ops = model.numOps();
  const int64_t devices = topo.totalDevices();
  const int words = (n + 63) / 64;
  plan.units = n;

  std::vector<int> unitOf(ops), unitFirst(n);
  for (int u = 0; u < n; ++u) {
    unitFirst[u] = u == 0 ? 0 : unitEnds[u - 1] + 1;
    for (int op = unitFirst[u]; op <= unitEnds[u]; ++op)
      unitOf[op] = u;
  }
  std::vector<std::vector<int>> producers = table.producerIndices();
  std::vector<UnitSet> needs(n, UnitSet(words, 0));
  std::vector<std::vector<int>> readerUnits(ops); // units other than its own that read an op
  for (int c = 0; c < ops; ++c)
    for (int p : producers[c])
      if (unitOf[p] != unitOf[c]) {
        insert(needs[unitOf[c]], unitOf[p]);
        readerUnits[p].push_back(unitOf[c]);
      }
  // Unsplittable ranges: an ideal holds all of a range's units or none.
  std::vector<UnitSet> groups;
  for (auto [first, last] : opts.unsplittable) {
    UnitSet g(words, 0);
    for (int op = std::max(0, first); op <= last && op < ops; ++op)
      insert(g, unitOf[op]);
    if (count(g) > 1)
      groups.push_back(std::move(g));
  }

  // Every ideal, by breadth-first growth from the empty set.
  std::vector<UnitSet> all{UnitSet(words, 0)};
  std::map<UnitSet, int> seen{{all[0], 0}};
  for (size_t q = 0; q < all.size(); ++q)
    for (int u = 0; u < n; ++u) {
      if (contains(all[q], u) || !subsetOf(needs[u], all[q]))
        continue;
      UnitSet next = all[q];
      insert(next, u);
      if (seen.count(next))
        continue;
      if (static_cast<int>(all.size()) >= maxIdeals) {
        plan.tooLarge = true;
        return plan;
      }
      seen.emplace(next, static_cast<int>(all.size()));
      all.push_back(std::move(next));
    }

  // One server and a chain: every plan here is one of the tree's (which may also
  // leave devices idle), so the tree's search already covers it.
  if (topo.levels.size() == 1 && static_cast<int>(all.size()) == n + 1)
    return plan;

  // The ideals a stage boundary may sit at, smallest first (the empty and the full one included).
  std::vector<Ideal> ideals;
  for (const UnitSet &set : all) {
    int size = count(set);
    bool splits = false;
    if (size > 0 && size < n)
      for (const UnitSet &g : groups) {
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
  const int full = count_ - 1; // the only ideal of size n
  double pairs = 0;
  for (int i = 0; i < count_; ++i) {
    for (int j = i + 1; j < count_; ++j)
      if (ideals[j].size > ideals[i].size && subsetOf(ideals[i].units, ideals[j].units))
        ideals[i].supersets.push_back(j);
    pairs += static_cast<double>(ideals[i].supersets.size());
  }

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
  for (Ideal &ideal : ideals)
    for (int u = 0; u < n; ++u)
      if (contains(ideal.units, u)) {
        ideal.compute += model.compute(unitFirst[u], unitEnds[u]);
        ideal.parameters += model.parameters(unitFirst[u], unitEnds[u]);
        ideal.optimizerState += model.optimizerState(unitFirst[u], unitEnds[u]);
        ideal.activations += model.activations(unitFirst[u], unitEnds[u]);
        for (int op = unitFirst[u]; op <= unitEnds[u]; ++op)
          for (int reader : readerUnits[op])
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

  // Per device range [d, d+r): the all-reduce coefficient and the links its cuts cross.
  auto rangeIndex = [&](int64_t d, int64_t r) { return static_cast<size_t>(d * (devices + 1) + r); };
  std::vector<double> coefficient((devices + 1) * (devices + 1), 0);
  std::vector<int8_t> sendLevel(coefficient.size(), -1), receiveLevel(coefficient.size(), -1);
  for (int64_t d = 0; d < devices; ++d)
    for (int64_t r = 1; d + r <= devices; ++r) {
      coefficient[rangeIndex(d, r)] = model.rangeAllreduceCoefficient(d, r);
      if (d + r < devices)
        sendLevel[rangeIndex(d, r)] = static_cast<int8_t>(topo.linkLevel(d, d + r));
      if (d > 0)
        receiveLevel[rangeIndex(d, r)] = static_cast<int8_t>(topo.linkLevel(d - 1, d + r - 1));
    }

  // value[(ideal·devices + d)·depth + p]: the best pipeline for the ops outside the
  // ideal on devices d.. (all of them) in p+1 stages (any count when not forced).
  struct Choice {
    int32_t next = -1;
    int32_t replicas = 0;
  };
  auto at = [&](int ideal, int64_t d, int p) {
    return (static_cast<size_t>(ideal) * static_cast<size_t>(devices) + static_cast<size_t>(d)) * depth + p;
  };
  std::vector<double> value(static_cast<size_t>(count_) * devices * depth, kInf);
  std::vector<Choice> choice(value.size());
  for (int i = full - 1; i >= 0; --i) {
    const Ideal &from = ideals[i];
    for (int64_t d = 0; d < devices; ++d)
      for (int p = 0; p < depth; ++p) {
        double best = kInf;
        Choice bestChoice;
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
            size_t range = rangeIndex(d, r);
            double t = CostModel::rangeStageTime(compute, params, coefficient[range], r);
            if (i > 0)
              t = std::max(t, model.linkTime(receiveLevel[range], from.cutBytes));
            if (!last) {
              t = std::max(t, model.linkTime(sendLevel[range], to.cutBytes));
              t = std::max(t, value[at(j, d + r, forced ? p - 1 : 0)]);
            }
            if (t < best) {
              best = t;
              bestChoice = Choice{j, static_cast<int32_t>(r)};
            }
          }
        }
        value[at(i, d, p)] = best;
        choice[at(i, d, p)] = bestChoice;
      }
  }
  plan.value = value[at(0, 0, depth - 1)];
  if (!std::isfinite(plan.value))
    return plan;

  // The chain of ideals, the stage of each unit, and the op order that makes stages contiguous.
  std::vector<int> stageOfUnit(n, -1), replicas;
  int ideal = 0, stage = 0, p = depth - 1;
  int64_t d = 0;
  while (ideal != full) {
    Choice c = choice[at(ideal, d, p)];
    for (int u = 0; u < n; ++u)
      if (contains(ideals[c.next].units, u) && !contains(ideals[ideal].units, u))
        stageOfUnit[u] = stage;
    replicas.push_back(c.replicas);
    ideal = c.next;
    d += c.replicas;
    p = forced ? p - 1 : 0;
    ++stage;
  }
  plan.order.resize(ops);
  for (int op = 0; op < ops; ++op)
    plan.order[op] = op;
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
