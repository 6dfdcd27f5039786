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
namespace {
enum Kind { F = 0, B = 1, W = 2 };

// The program's operations: F, B and W of every (stage, micro-batch),
// numbered stage by stage, with the stage's costs as their durations.
struct Operations {
  const Problem &P;
  int p, m;
  int count() const { return 3 * p * m; }
  int op(int st, int mb, int k) const { return (st * m + mb) * 3 + k; }
  double duration(int st, int k) const {
    return P.costOf(k == F ? Op::Fwd : k == B ? Op::BwdInput : Op::BwdWeight, st, 0);
  }
};

// A schedule in this space to start from, and its simulation (makespan
// infinity when there is none).
struct Incumbent {
  Schedule schedule;
  SimResult sim;
  bool found() const { return std::isfinite(sim.makespan); }
};

// The best of the heuristics whose orders lie in this space (its start times
// become the solver's first solution), else none (the micro-batches one
// after another bound the makespan then).
Incumbent bestHeuristic(const Problem &P) {
  Incumbent best;
  best.sim.makespan = std::numeric_limits<double>::infinity();
  for (const char *name : {"zb-h1", "zb-h2", "auto", "1f1b", "gpipe"}) {
    try {
      Schedule s = generate(name, P);
      SimResult sim = simulate(s);
      if (sim.makespan < best.sim.makespan)
        best.schedule = std::move(s), best.sim = std::move(sim);
    } catch (const ScheduleError &) {
      // over the memory limit
    }
  }
  return best;
}

// Then zb-v's local search with random kicks from the incumbent's order
// (detail::improveOrder): it finds optima the branching would take long
// to reach (p=4, m=8, F=1 B=1.2 W=0.8 c=0.5 at memory 4: 34.2 against
// the heuristics' 34.6 and the 34.4 CBC found in 120 s, while the root's
// bound is 34.2), and a better first solution prunes more.
void improveByLocalSearch(const Problem &P, Incumbent &incumbent) {
  const int p = P.stages, m = P.microbatches;
  detail::Orders orders(p);
  for (int st = 0; st < p; ++st)
    for (const Instr &in : incumbent.schedule.ranks[st]) {
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
    if (sim.makespan < incumbent.sim.makespan - 1e-9)
      incumbent.schedule = std::move(s), incumbent.sim = std::move(sim);
  } catch (const ScheduleError &) {
    // not faster after all, or over the limit: keep the heuristic's
  }
}

// An upper bound of every start time, the big M: the micro-batches one after
// another, or the incumbent's makespan when it is less.
double startTimeBound(const Operations &O, const Incumbent &incumbent) {
  const Problem &P = O.P;
  double upper = 0;
  for (int st = 0; st < O.p; ++st)
    upper += O.duration(st, F) + O.duration(st, B) + O.duration(st, W);
  upper = O.m * (upper + 2.0 * (O.p - 1) * P.comm);
  if (incumbent.found())
    upper = std::min(upper, incumbent.sim.makespan - P.stepCost);
  return upper + 1e-6;
}

// The integer program in CBC's form: its columns with their bounds and
// objective, and its rows.
struct Program {
  // Columns: start times, the makespan, then one order binary per pair of a
  // stage's operations (pair (i, j), i < j: 1 when i runs before j).
  std::vector<std::vector<int>> pairIndex;
  int cmax, columns;
  std::vector<double> colLower, colUpper, objective;
  CoinPackedMatrix rows;
  std::vector<double> rowLower, rowUpper;

  Program(const Operations &O, double upper) : rows(false, 0, 0) {
    const int nOps = O.count();
    cmax = nOps;
    pairIndex.assign(nOps, std::vector<int>(nOps, -1));
    columns = nOps + 1;
    for (int st = 0; st < O.p; ++st)
      for (int i = O.op(st, 0, 0); i < O.op(st + 1, 0, 0); ++i)
        for (int j = i + 1; j < O.op(st + 1, 0, 0); ++j)
          pairIndex[i][j] = columns++;
    colLower.assign(columns, 0.0);
    colUpper.assign(columns, upper);
    objective.assign(columns, 0.0);
    objective[cmax] = 1.0;
    for (int c = nOps + 1; c < columns; ++c)
      colUpper[c] = 1.0;
  }

  void addRow(const std::vector<std::pair<int, double>> &terms, double lo, double hi) {
    CoinPackedVector v;
    for (auto [c, a] : terms)
      v.insert(c, a);
    rows.appendRow(v);
    rowLower.push_back(lo);
    rowUpper.push_back(hi);
  }
};

const double kInf = COIN_DBL_MAX;

// A micro-batch's activation and gradient cross the stages in turn; its W
// follows its B, and the makespan follows every W.
void addDependencyRows(Program &prog, const Operations &O) {
  const Problem &P = O.P;
  const int p = O.p;
  for (int mb = 0; mb < O.m; ++mb) {
    for (int st = 0; st < p; ++st) {
      if (st > 0)
        prog.addRow({{O.op(st, mb, F), 1}, {O.op(st - 1, mb, F), -1}}, O.duration(st - 1, F) + P.comm, kInf);
      if (st + 1 < p)
        prog.addRow({{O.op(st, mb, B), 1}, {O.op(st + 1, mb, B), -1}}, O.duration(st + 1, B) + P.comm, kInf);
      else
        prog.addRow({{O.op(st, mb, B), 1}, {O.op(st, mb, F), -1}}, O.duration(st, F), kInf);
      prog.addRow({{O.op(st, mb, W), 1}, {O.op(st, mb, B), -1}}, O.duration(st, B), kInf);
      prog.addRow({{prog.cmax, 1}, {O.op(st, mb, W), -1}}, O.duration(st, W), kInf);
    }
  }
}

// A stage runs one operation at a time, in the order of the pair binaries.
void addDisjunctionRows(Program &prog, const Operations &O, double M) {
  // i before j (y = 1): S_i + d_i <= S_j; j before i (y = 0): S_j + d_j <= S_i.
  for (int st = 0; st < O.p; ++st)
    for (int i = O.op(st, 0, 0); i < O.op(st + 1, 0, 0); ++i)
      for (int j = i + 1; j < O.op(st + 1, 0, 0); ++j) {
        const int y = prog.pairIndex[i][j];
        const double di = O.duration(st, i % 3), dj = O.duration(st, j % 3);
        prog.addRow({{i, 1}, {j, -1}, {y, M}}, -kInf, M - di);
        prog.addRow({{j, 1}, {i, -1}, {y, -M}}, -kInf, -dj);
      }
}

// Every stage's forwards in micro-batch order, and the orders the
// dependencies imply (a micro-batch's F, B, W). The first is no loss: the
// micro-batches are interchangeable, so stage 0's forwards can be numbered
// in order; then if a stage s >= 1 ran F(b) before F(a), a < b, swapping
// the labels a and b on the forwards of stages >= s and on every B and W
// keeps each dependency (stage s - 1 ran F(a) no later than F(b)) and each
// stage's memory (the same times of adding and freeing), and orders stage
// s's pair; stage by stage, every stage's forwards come in order.
void fixImpliedOrders(Program &prog, const Operations &O) {
  const int p = O.p, m = O.m;
  for (int st = 0; st < p; ++st)
    for (int mb = 0; mb + 1 < m; ++mb)
      for (int later = mb + 1; later < m; ++later)
        prog.colLower[prog.pairIndex[O.op(st, mb, F)][O.op(st, later, F)]] = 1.0;
  for (int st = 0; st < p; ++st)
    for (int mb = 0; mb < m; ++mb) {
      prog.colLower[prog.pairIndex[O.op(st, mb, F)][O.op(st, mb, B)]] = 1.0;
      prog.colLower[prog.pairIndex[O.op(st, mb, F)][O.op(st, mb, W)]] = 1.0;
      prog.colLower[prog.pairIndex[O.op(st, mb, B)][O.op(st, mb, W)]] = 1.0;
    }
}

// Bounds the LP relaxation misses: a stage has all its work to do, and
// it idles until the first forward reaches it and, until its first
// backward can start (after the round trip), can only run forwards, no
// more than its memory admits (k of its micro-batches, none freed yet).
void addStageBounds(Program &prog, const Operations &O) {
  const Problem &P = O.P;
  const int p = O.p, m = O.m;
  for (int st = 0; st < p; ++st) {
    double arrival = 0, load = 0, firstBackward = 0;
    for (int t = 0; t < st; ++t)
      arrival += O.duration(t, F) + P.comm;
    for (int t = 0; t < p; ++t)
      firstBackward += O.duration(t, F) + (t + 1 < p ? P.comm : 0.0);
    for (int t = st + 1; t < p; ++t)
      firstBackward += O.duration(t, B) + P.comm;
    for (int k : {F, B, W})
      load += m * O.duration(st, k);
    const double a = P.activationOf(st, 0);
    const double admitted =
        P.memoryLimit > 0 && a > 0 ? std::min<double>(m, std::floor(P.memoryLimit / a + 1e-9)) : m;
    const double busyBefore = std::min(admitted * O.duration(st, F), firstBackward - arrival);
    const double headIdle = std::max(0.0, firstBackward - arrival - busyBefore);
    prog.addRow({{prog.cmax, 1}}, arrival + headIdle + load, kInf);
    // Before F(st, j) starts, the forwards 0..j-1 have run (they are in
    // micro-batch order) and enough B's and W's to make room for F(st, j);
    // when that takes a backward, the head idle above precedes it too.
    // After it, micro-batches j..m-1 still need all their work, and their
    // B's and W's wait for the round trip from F(st, j) (their forwards
    // start no earlier).
    const double roundTrip = firstBackward - arrival;
    for (int j = 0; j < m; ++j) {
      prog.addRow({{prog.cmax, 1}, {O.op(st, j, F), -1}},
                  roundTrip + (m - j) * (O.duration(st, B) + O.duration(st, W)), kInf);
      prog.addRow({{prog.cmax, 1}, {O.op(st, j, F), -1}},
                  (m - j) * (O.duration(st, F) + O.duration(st, B) + O.duration(st, W)), kInf);
      const double freeing = minFreeingWork(P, st, j + 1, j);
      if (!std::isfinite(freeing))
        continue; // no schedule holds that many; the memory rows say so
      double earliest = arrival + j * O.duration(st, F);
      if (freeing > 0)
        earliest += headIdle + freeing;
      prog.colLower[O.op(st, j, F)] = std::max(prog.colLower[O.op(st, j, F)], earliest);
    }
  }
}

// Memory when each F starts. before(x, f) as a linear term of the pair binary.
void addMemoryRows(Program &prog, const Operations &O) {
  const Problem &P = O.P;
  const int m = O.m;
  if (!(P.memoryLimit > 0))
    return;
  for (int st = 0; st < O.p; ++st) {
    const double a = P.activationOf(st, 0);
    if (!(a > 0))
      continue;
    const double frac = P.wMemFrac;
    for (int mb = 0; mb < m; ++mb) {
      const int f = O.op(st, mb, F);
      std::vector<std::pair<int, double>> terms;
      double constant = a; // f's own activation
      auto before = [&](int x, double weight) {
        if (x < f) {
          terms.push_back({prog.pairIndex[x][f], weight});
        } else {
          constant += weight; // 1 - y
          terms.push_back({prog.pairIndex[f][x], -weight});
        }
      };
      for (int other = 0; other < m; ++other) {
        if (other != mb)
          before(O.op(st, other, F), a);
        if (1 - frac > 0)
          before(O.op(st, other, B), -a * (1 - frac));
        if (frac > 0)
          before(O.op(st, other, W), -a * frac);
      }
      prog.addRow(terms, -kInf, P.memoryLimit - constant + 1e-9);
    }
  }
}

// The incumbent as a solution of the program: its start times and the
// orders they imply.
std::vector<double> incumbentSolution(const Program &prog, const Operations &O, const SimResult &incumbentSim) {
  const Problem &P = O.P;
  std::vector<double> start(prog.columns, 0.0);
  for (const Interval &in : incumbentSim.intervals) {
    if (!isCompute(in.instr.op))
      continue;
    const int st = P.stageOfRank(in.rank), mb = in.instr.mb;
    if (in.instr.op == Op::Fwd) {
      start[O.op(st, mb, F)] = in.start;
    } else if (in.instr.op == Op::BwdInput) {
      start[O.op(st, mb, B)] = in.start;
    } else if (in.instr.op == Op::BwdWeight) {
      start[O.op(st, mb, W)] = in.start;
    } else if (in.instr.op == Op::Bwd) { // 1F1B: B then W at once
      start[O.op(st, mb, B)] = in.start;
      start[O.op(st, mb, W)] = in.start + O.duration(st, B);
    }
  }
  start[prog.cmax] = incumbentSim.makespan - P.stepCost;
  for (int st = 0; st < O.p; ++st)
    for (int i = O.op(st, 0, 0); i < O.op(st + 1, 0, 0); ++i)
      for (int j = i + 1; j < O.op(st + 1, 0, 0); ++j)
        start[prog.pairIndex[i][j]] = start[i] < start[j] || (start[i] == start[j] && i < j) ? 1.0 : 0.0;
  return start;
}

// Each stage's operations in the order of the solution's start times.
detail::Orders stageOrdersOf(const double *x, const Operations &O) {
  const int m = O.m;
  detail::Orders orders(O.p);
  for (int st = 0; st < O.p; ++st) {
    std::vector<int> ops(3 * m);
    std::iota(ops.begin(), ops.end(), O.op(st, 0, 0));
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
  return orders;
}
} // namespace

OptimalResult optimalSchedule(const Problem &problemIn, double seconds) {
  Problem P = problemIn;
  P.check();
  requireInScope(P);
  const auto t0 = std::chrono::steady_clock::now();
  const Operations O{P, P.stages, P.microbatches};
  Incumbent incumbent = bestHeuristic(P);
  if (incumbent.found())
    improveByLocalSearch(P, incumbent);
  const double M = startTimeBound(O, incumbent);

  Program prog(O, M);
  addDependencyRows(prog, O);
  addDisjunctionRows(prog, O, M);
  fixImpliedOrders(prog, O);
  addStageBounds(prog, O);
  addMemoryRows(prog, O);

  OsiClpSolverInterface solver;
  solver.loadProblem(prog.rows, prog.colLower.data(), prog.colUpper.data(), prog.objective.data(),
                     prog.rowLower.data(), prog.rowUpper.data());
  for (int c = O.count() + 1; c < prog.columns; ++c)
    solver.setInteger(c);
  solver.messageHandler()->setLogLevel(0);
  CbcModel model(solver);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.setMaximumSeconds(seconds);
  model.setAllowableGap(1e-7);
  model.setAllowableFractionGap(1e-9);
  if (incumbent.found()) {
    std::vector<double> start = incumbentSolution(prog, O, incumbent.sim);
    model.setBestSolution(start.data(), prog.columns, start[prog.cmax], true);
  }
  model.branchAndBound();
  const double *x = model.bestSolution();
  if (!x)
    throw ScheduleError((settings::flag(settings::kOptimal) + ": no schedule found within ") + std::to_string(seconds) +
                        " s (the memory limit may admit none)");

  OptimalResult result;
  result.schedule = detail::scheduleFromStageOrders("optimal", P, stageOrdersOf(x, O));
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
