// The exact mode (`pipec schedule --optimal`, docs/schedules.md): a
// disjunctive integer program over one chunk per rank with a split backward,
// solved by COIN-OR CBC (Debian's coinor-libcbc-dev, CMake option
// PIPEC_WITH_CBC).
//
// Per stage s and micro-batch b, three operations F, B, W with start times
// (continuous) and the stage's costs as durations:
//   F(s,b) >= F(s-1,b) + F_{s-1} + c            the activation arrives
//   B(s,b) >= B(s+1,b) + B_{s+1} + c            the gradient arrives
//   B(p-1,b) >= F(p-1,b) + F_{p-1};  W(s,b) >= B(s,b) + B_s
// One binary per pair of operations on a stage orders them (big-M with M an
// upper bound of the makespan); the memory a stage holds when an F starts,
// a_s per admitted micro-batch less what earlier B's (share 1 - w_mem_frac)
// and W's (share w_mem_frac) freed, is linear in those binaries and kept
// within the limit. Minimise the makespan. The micro-batches are
// interchangeable, so every stage's forwards are fixed in micro-batch order
// (argued where the bounds are set).
// The lowering and the simulator run the solution's per-stage order as soon
// as possible, which cannot be slower than the program's start times.
#include "analysis/Schedule/Orders.h"
#include "analysis/Settings/Declared.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#ifdef PIPEC_WITH_CBC
#include <CbcModel.hpp>
#include <CoinPackedMatrix.hpp>
#include <CoinPackedVector.hpp>
#include <OsiClpSolverInterface.hpp>
#endif

namespace pipec::schedule {

bool optimalAvailable() {
#ifdef PIPEC_WITH_CBC
  return true;
#else
  return false;
#endif
}

namespace {
constexpr int kMaxStages = 8, kMaxMicrobatches = 16;

void requireInScope(const Problem &P) {
  auto out = [](const std::string &why) {
    throw ScheduleError((settings::flag(settings::kOptimal) + ": ") + why);
  };
  if (P.chunks != 1)
    out(("one model chunk per rank only (got " + settings::flag(settings::kChunks) + " ") + std::to_string(P.chunks) + ")");
  if (P.numRanks() != P.stages)
    out("no replicas (one rank per stage)");
  for (int st = 0; st < P.stages; ++st)
    if (P.recomputes(st))
      out("no recompute");
  if (P.stages > kMaxStages || P.microbatches > kMaxMicrobatches)
    out("at most " + std::to_string(kMaxStages) + " stages and " + std::to_string(kMaxMicrobatches) +
        " micro-batches (the program grows with the square of the micro-batches per stage)");
}
// The least work stage st must spend on backwards (B's and W's of the
// first `done` micro-batches) before it can hold `held` micro-batches'
// activations within the memory limit: B frees 1 - w_mem_frac of one, its W
// the rest. 0 when no freeing is needed (or no limit); infinity when even
// every backward would not make room.
double minFreeingWork(const Problem &P, int st, int held, int done) {
  const double a = P.activationOf(st, 0);
  if (!(P.memoryLimit > 0) || !(a > 0))
    return 0;
  const double need = held - P.memoryLimit / a - 1e-9; // micro-batches' worth to free
  if (need <= 0)
    return 0;
  const double frac = P.wMemFrac, b = P.costOf(Op::BwdInput, st, 0), w = P.costOf(Op::BwdWeight, st, 0);
  double best = std::numeric_limits<double>::infinity();
  for (int ws = 0; ws <= done; ++ws) { // W's run (each after its B), then B's alone
    const double rest = need - frac * ws;
    int bs = ws;
    if (rest > 0) {
      if (!(1 - frac > 0))
        continue;
      bs = std::max(ws, (int)std::ceil(rest / (1 - frac) - 1e-9));
    }
    if (bs <= done)
      best = std::min(best, bs * b + ws * w);
  }
  return best;
}
} // namespace

#ifndef PIPEC_WITH_CBC
OptimalResult optimalSchedule(const Problem &problem, double) {
  requireInScope(problem);
  throw ScheduleError((settings::flag(settings::kOptimal) + ": this pipec was built without COIN-OR CBC (install coinor-libcbc-dev and ") +
                      "configure with -DPIPEC_WITH_CBC=ON)");
}
#else
OptimalResult optimalSchedule(const Problem &problemIn, double seconds) {
  Problem P = problemIn;
  P.check();
  requireInScope(P);
  const auto t0 = std::chrono::steady_clock::now();
  const int p = P.stages, m = P.microbatches;
  enum Kind { F = 0, B = 1, W = 2 };
  auto op = [m](int st, int mb, int k) { return (st * m + mb) * 3 + k; };
  auto duration = [&](int st, int k) {
    return P.costOf(k == F ? Op::Fwd : k == B ? Op::BwdInput : Op::BwdWeight, st, 0);
  };
  const int nOps = 3 * p * m, cmax = nOps;
  // The incumbent: the best of the heuristics whose orders lie in this space
  // (its start times become the solver's first solution), else the
  // micro-batches one after another. Its makespan bounds every start (big M).
  Schedule incumbent;
  SimResult incumbentSim;
  incumbentSim.makespan = std::numeric_limits<double>::infinity();
  for (const char *name : {"zb-h1", "zb-h2", "auto", "1f1b", "gpipe"}) {
    try {
      Schedule s = generate(name, P);
      SimResult sim = simulate(s);
      if (sim.makespan < incumbentSim.makespan)
        incumbent = std::move(s), incumbentSim = std::move(sim);
    } catch (const ScheduleError &) {
      // over the memory limit
    }
  }
  // Then zb-v's local search with random kicks from the incumbent's order
  // (detail::improveOrder): it finds optima the branching would take long
  // to reach (p=4, m=8, F=1 B=1.2 W=0.8 c=0.5 at memory 4: 34.2 against
  // the heuristics' 34.6 and the 34.4 CBC found in 120 s, while the root's
  // bound is 34.2), and a better first solution prunes more.
  if (std::isfinite(incumbentSim.makespan)) {
    detail::Orders orders(p);
    for (int st = 0; st < p; ++st)
      for (const Instr &in : incumbent.ranks[st]) {
        if (in.op == Op::Bwd) { // 1F1B, GPipe: B then W at once
          orders[st].push_back(detail::mk(Op::BwdInput, in.mb, 0));
          orders[st].push_back(detail::mk(Op::BwdWeight, in.mb, 0));
        } else if (in.op == Op::Fwd || in.op == Op::BwdInput || in.op == Op::BwdWeight) {
          orders[st].push_back(detail::mk(in.op, in.mb, 0));
        }
      }
    Schedule shape;
    shape.name = "optimal";
    shape.problem = P;
    shape.splitBackward = true;
    detail::improveOrder(shape, m, P.memoryLimit > 0 ? P.memoryLimit : std::numeric_limits<double>::infinity(),
                         orders, 30, 2000);
    try {
      Schedule s = detail::scheduleFromStageOrders("optimal", P, orders);
      SimResult sim = simulate(s);
      if (sim.makespan < incumbentSim.makespan - 1e-9)
        incumbent = std::move(s), incumbentSim = std::move(sim);
    } catch (const ScheduleError &) {
      // not faster after all, or over the limit: keep the heuristic's
    }
  }
  double upper = 0;
  for (int st = 0; st < p; ++st)
    upper += duration(st, F) + duration(st, B) + duration(st, W);
  upper = m * (upper + 2.0 * (p - 1) * P.comm);
  const bool haveIncumbent = std::isfinite(incumbentSim.makespan);
  if (haveIncumbent)
    upper = std::min(upper, incumbentSim.makespan - P.stepCost);
  upper += 1e-6;
  const double M = upper;

  // Columns: start times, the makespan, then one order binary per pair of a
  // stage's operations (pair (i, j), i < j: 1 when i runs before j).
  std::vector<std::vector<int>> pairIndex(nOps, std::vector<int>(nOps, -1));
  int columns = nOps + 1;
  for (int st = 0; st < p; ++st)
    for (int i = op(st, 0, 0); i < op(st + 1, 0, 0); ++i)
      for (int j = i + 1; j < op(st + 1, 0, 0); ++j)
        pairIndex[i][j] = columns++;
  std::vector<double> colLower(columns, 0.0), colUpper(columns, upper), objective(columns, 0.0);
  objective[cmax] = 1.0;
  for (int c = nOps + 1; c < columns; ++c)
    colUpper[c] = 1.0;

  CoinPackedMatrix rows(false, 0, 0);
  std::vector<double> rowLower, rowUpper;
  auto addRow = [&](const std::vector<std::pair<int, double>> &terms, double lo, double hi) {
    CoinPackedVector v;
    for (auto [c, a] : terms)
      v.insert(c, a);
    rows.appendRow(v);
    rowLower.push_back(lo);
    rowUpper.push_back(hi);
  };
  const double inf = COIN_DBL_MAX;
  for (int mb = 0; mb < m; ++mb) {
    for (int st = 0; st < p; ++st) {
      if (st > 0)
        addRow({{op(st, mb, F), 1}, {op(st - 1, mb, F), -1}}, duration(st - 1, F) + P.comm, inf);
      if (st + 1 < p)
        addRow({{op(st, mb, B), 1}, {op(st + 1, mb, B), -1}}, duration(st + 1, B) + P.comm, inf);
      else
        addRow({{op(st, mb, B), 1}, {op(st, mb, F), -1}}, duration(st, F), inf);
      addRow({{op(st, mb, W), 1}, {op(st, mb, B), -1}}, duration(st, B), inf);
      addRow({{cmax, 1}, {op(st, mb, W), -1}}, duration(st, W), inf);
    }
  }
  // i before j (y = 1): S_i + d_i <= S_j; j before i (y = 0): S_j + d_j <= S_i.
  for (int st = 0; st < p; ++st)
    for (int i = op(st, 0, 0); i < op(st + 1, 0, 0); ++i)
      for (int j = i + 1; j < op(st + 1, 0, 0); ++j) {
        const int y = pairIndex[i][j];
        const double di = duration(st, i % 3), dj = duration(st, j % 3);
        addRow({{i, 1}, {j, -1}, {y, M}}, -inf, M - di);
        addRow({{j, 1}, {i, -1}, {y, -M}}, -inf, -dj);
      }
  // Every stage's forwards in micro-batch order, and the orders the
  // dependencies imply (a micro-batch's F, B, W). The first is no loss: the
  // micro-batches are interchangeable, so stage 0's forwards can be numbered
  // in order; then if a stage s >= 1 ran F(b) before F(a), a < b, swapping
  // the labels a and b on the forwards of stages >= s and on every B and W
  // keeps each dependency (stage s - 1 ran F(a) no later than F(b)) and each
  // stage's memory (the same times of adding and freeing), and orders stage
  // s's pair; stage by stage, every stage's forwards come in order.
  for (int st = 0; st < p; ++st)
    for (int mb = 0; mb + 1 < m; ++mb)
      for (int later = mb + 1; later < m; ++later)
        colLower[pairIndex[op(st, mb, F)][op(st, later, F)]] = 1.0;
  for (int st = 0; st < p; ++st)
    for (int mb = 0; mb < m; ++mb) {
      colLower[pairIndex[op(st, mb, F)][op(st, mb, B)]] = 1.0;
      colLower[pairIndex[op(st, mb, F)][op(st, mb, W)]] = 1.0;
      colLower[pairIndex[op(st, mb, B)][op(st, mb, W)]] = 1.0;
    }
  // Bounds the LP relaxation misses: a stage has all its work to do, and
  // it idles until the first forward reaches it and, until its first
  // backward can start (after the round trip), can only run forwards, no
  // more than its memory admits (k of its micro-batches, none freed yet).
  for (int st = 0; st < p; ++st) {
    double arrival = 0, load = 0, firstBackward = 0;
    for (int t = 0; t < st; ++t)
      arrival += duration(t, F) + P.comm;
    for (int t = 0; t < p; ++t)
      firstBackward += duration(t, F) + (t + 1 < p ? P.comm : 0.0);
    for (int t = st + 1; t < p; ++t)
      firstBackward += duration(t, B) + P.comm;
    for (int k : {F, B, W})
      load += m * duration(st, k);
    const double a = P.activationOf(st, 0);
    const double admitted =
        P.memoryLimit > 0 && a > 0 ? std::min<double>(m, std::floor(P.memoryLimit / a + 1e-9)) : m;
    const double busyBefore = std::min(admitted * duration(st, F), firstBackward - arrival);
    const double headIdle = std::max(0.0, firstBackward - arrival - busyBefore);
    addRow({{cmax, 1}}, arrival + headIdle + load, inf);
    // Before F(st, j) starts, the forwards 0..j-1 have run (they are in
    // micro-batch order) and enough B's and W's to make room for F(st, j);
    // when that takes a backward, the head idle above precedes it too.
    // After it, micro-batches j..m-1 still need all their work, and their
    // B's and W's wait for the round trip from F(st, j) (their forwards
    // start no earlier).
    const double roundTrip = firstBackward - arrival;
    for (int j = 0; j < m; ++j) {
      addRow({{cmax, 1}, {op(st, j, F), -1}}, roundTrip + (m - j) * (duration(st, B) + duration(st, W)), inf);
      addRow({{cmax, 1}, {op(st, j, F), -1}},
             (m - j) * (duration(st, F) + duration(st, B) + duration(st, W)), inf);
      const double freeing = minFreeingWork(P, st, j + 1, j);
      if (!std::isfinite(freeing))
        continue; // no schedule holds that many; the memory rows say so
      double earliest = arrival + j * duration(st, F);
      if (freeing > 0)
        earliest += headIdle + freeing;
      colLower[op(st, j, F)] = std::max(colLower[op(st, j, F)], earliest);
    }
  }
  // Memory when each F starts. before(x, f) as a linear term of the pair binary.
  if (P.memoryLimit > 0)
    for (int st = 0; st < p; ++st) {
      const double a = P.activationOf(st, 0);
      if (!(a > 0))
        continue;
      const double frac = P.wMemFrac;
      for (int mb = 0; mb < m; ++mb) {
        const int f = op(st, mb, F);
        std::vector<std::pair<int, double>> terms;
        double constant = a; // f's own activation
        auto before = [&](int x, double weight) {
          if (x < f) {
            terms.push_back({pairIndex[x][f], weight});
          } else {
            constant += weight; // 1 - y
            terms.push_back({pairIndex[f][x], -weight});
          }
        };
        for (int other = 0; other < m; ++other) {
          if (other != mb)
            before(op(st, other, F), a);
          if (1 - frac > 0)
            before(op(st, other, B), -a * (1 - frac));
          if (frac > 0)
            before(op(st, other, W), -a * frac);
        }
        addRow(terms, -inf, P.memoryLimit - constant + 1e-9);
      }
    }

  OsiClpSolverInterface solver;
  solver.loadProblem(rows, colLower.data(), colUpper.data(), objective.data(), rowLower.data(), rowUpper.data());
  for (int c = nOps + 1; c < columns; ++c)
    solver.setInteger(c);
  solver.messageHandler()->setLogLevel(0);
  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.setMaximumSeconds(seconds);
  model.setAllowableGap(1e-7);
  model.setAllowableFractionGap(1e-9);
  if (haveIncumbent) {
    // The incumbent's start times and the orders they imply.
    std::vector<double> start(columns, 0.0);
    for (const Interval &in : incumbentSim.intervals) {
      if (!isCompute(in.instr.op))
        continue;
      const int st = P.stageOfRank(in.rank), mb = in.instr.mb;
      if (in.instr.op == Op::Fwd) {
        start[op(st, mb, F)] = in.start;
      } else if (in.instr.op == Op::BwdInput) {
        start[op(st, mb, B)] = in.start;
      } else if (in.instr.op == Op::BwdWeight) {
        start[op(st, mb, W)] = in.start;
      } else if (in.instr.op == Op::Bwd) { // 1F1B: B then W at once
        start[op(st, mb, B)] = in.start;
        start[op(st, mb, W)] = in.start + duration(st, B);
      }
    }
    start[cmax] = incumbentSim.makespan - P.stepCost;
    for (int st = 0; st < p; ++st)
      for (int i = op(st, 0, 0); i < op(st + 1, 0, 0); ++i)
        for (int j = i + 1; j < op(st + 1, 0, 0); ++j)
          start[pairIndex[i][j]] = start[i] < start[j] || (start[i] == start[j] && i < j) ? 1.0 : 0.0;
    model.setBestSolution(start.data(), columns, start[cmax], true);
  }
  model.branchAndBound();
  const double *x = model.bestSolution();
  if (!x)
    throw ScheduleError((settings::flag(settings::kOptimal) + ": no schedule found within ") + std::to_string(seconds) +
                        " s (the memory limit may admit none)");

  // Each stage's operations in the order of their start times.
  detail::Orders orders(p);
  for (int st = 0; st < p; ++st) {
    std::vector<int> ops(3 * m);
    std::iota(ops.begin(), ops.end(), op(st, 0, 0));
    std::stable_sort(ops.begin(), ops.end(), [&](int i, int j) {
      if (x[i] < x[j] - 1e-6 || x[i] > x[j] + 1e-6)
        return x[i] < x[j];
      return i < j; // a zero-length W and its B: B first
    });
    for (int o : ops) {
      const int mb = (o / 3) % m, k = o % 3;
      orders[st].push_back(detail::mk(k == F ? Op::Fwd : k == B ? Op::BwdInput : Op::BwdWeight, mb, 0));
    }
  }
  OptimalResult result;
  result.schedule = detail::scheduleFromStageOrders("optimal", P, orders);
  result.sim = simulate(result.schedule);
  const SimResult &sim = result.sim;
  result.makespan = sim.makespan;
  result.proven = model.isProvenOptimal();
  // Every schedule ends with a STEP after its last compute on some rank.
  result.lowerBound = std::min(result.makespan, model.getBestPossibleObjValue() + P.stepCost);
  result.nodes = model.getNodeCount();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (P.memoryLimit > 0 && sim.maxPeakMemory > P.memoryLimit + 1e-6)
    throw ScheduleError((settings::flag(settings::kOptimal) + ": the solution holds ") + std::to_string(sim.maxPeakMemory) +
                        " units, over the limit (a defect of the program)");
  return result;
}
#endif

} // namespace pipec::schedule
