// PipeDream's hierarchical DP (design.md §2): grouping ops into the layers it
// runs on, the solver, the boundary refinement after a grouped run and the
// search-size budget (docs/partition.md).
#include "analysis/Partition/HierarchicalDp.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Partition/CostModelDetail.h"
#include "analysis/Partition/Error.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace pipec::partition {

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

namespace detail {

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

namespace {

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
double estimatedWork(const Topology &topology, const std::vector<double> &perSegment, int layers,
                     double lowerTables = 2) {
  double L = layers, work = 0;
  for (size_t k = 0; k < topology.levels.size(); ++k)
    work += (k + 1 == topology.levels.size() ? L * L / 2 : lowerTables * L * L * L / 6) * perSegment[k];
  return work;
}
double estimatedWork(const Topology &topology, const PartitionOptions &options, int layers,
                     double lowerTables = 2) {
  return estimatedWork(topology, perSegmentWork(topology, options), layers, lowerTables);
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

/// The local search of refineBoundaries() (HierarchicalDp.h).
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

} // namespace

HierarchicalDp::HierarchicalDp(const CostModel &model, std::vector<int> ends)
    : solver_(std::make_unique<Solver>(model, std::move(ends))) {}

HierarchicalDp::~HierarchicalDp() = default;

size_t HierarchicalDp::deviceTableVariants() const { return solver_->deviceTableVariants(); }

double HierarchicalDp::solve(PartitionTree &tree) { return solver_->solve(tree); }

void refineBoundaries(const CostModel &model, PartitionTree &tree, int window, int maxPasses) {
  BoundaryRefiner(model, tree).run(window, maxPasses);
}

void checkSearchSize(const Topology &topology, const PartitionOptions &options, int layers,
                     size_t numOps, double lowerTables) {
  constexpr double kMaxWork = 1e9, kMaxBytes = 2.0 * (1 << 30), kSecondsPerStep = 3e-9;
  const double work = estimatedWork(topology, options, layers, lowerTables);
  const double bytes = estimatedTableBytes(topology, options, layers, lowerTables);
  if (work <= kMaxWork && bytes <= kMaxBytes)
    return;
  std::ostringstream os;
  os << (options.forcedStages > 0 ? (settings::flag(settings::kStages) + " ") + std::to_string(options.forcedStages) + " on " : std::string())
     << topology.totalDevices() << " devices (" << topology.describe() << "): the partition search would take about "
     << static_cast<int64_t>(std::min(work * kSecondsPerStep, 1e12)) << " s and " << formatBytes(bytes) << " with "
     << layers << (static_cast<size_t>(layers) == numOps ? " ops" : " layers") << " (limits: about "
     << static_cast<int>(kMaxWork * kSecondsPerStep) << " s, " << formatBytes(kMaxBytes) << "); "
     << (options.forcedStages > 0 ? "ask for fewer stages, let the DP choose the depth, "
                                  : ("use fewer devices per level (or more levels in a " + settings::flag(settings::kCluster) + " file), "))
     << ("or evaluate a hand-made split with " + settings::flag(settings::kPartitionFile));
  throw Error(os.str());
}

int autoMaxLayers(const Topology &topology, const PartitionOptions &options, double lowerTables) {
  const double budget = 5e7;
  int best = 16;
  const std::vector<double> perSegment = perSegmentWork(topology, options);
  for (int layers = 16; layers <= 256; layers += 8)
    if (estimatedWork(topology, perSegment, layers, lowerTables) <= budget)
      best = layers;
  // a forced depth needs at least as many layers as stages
  return std::max(best, options.forcedStages);
}

} // namespace detail

} // namespace pipec::partition
