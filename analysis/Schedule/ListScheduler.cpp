// The zero-bubble list scheduler (after Qi et al. 2023's heuristic) and the
// searches over its policies behind zb-h2, zb-v and auto (docs/schedules.md).
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

namespace pipec::schedule::detail {

namespace {

constexpr double kEps = 1e-9;

// Lower makespan first, then the smaller largest per-stage span, within kEps.
bool finishesBetter(double makespan, double maxSpan, double otherMakespan, double otherMaxSpan) {
  return makespan < otherMakespan - kEps || (makespan < otherMakespan + kEps && maxSpan < otherMaxSpan - kEps);
}

// Activation of one micro-batch on a stage, all its chunks together.
double stageActivation(const Problem &P, int st) {
  double a = 0;
  for (int c = 0; c < P.chunks; ++c)
    a += P.activationOf(st, c);
  return a;
}

// Times one pipeline's order (per stage position, n local micro-batches) and
// returns its makespan, largest per-stage span and peak activation memory.
struct OrderEval {
  double makespan = 0, maxSpan = 0, peak = 0;
};
OrderEval evalOrder(const Schedule &shape, int n, const Orders &order) {
  Schedule tmp = shape;
  tmp.problem.microbatches = n;
  tmp.problem.replicas.clear();
  const Problem &P = tmp.problem;
  const Orders full = withRecompute(tmp, order);
  const Timing T = timeOrder(tmp, full, 0.0);
  OrderEval e;
  e.makespan = T.makespan;
  for (int st = 0; st < P.stages; ++st) {
    double first = std::numeric_limits<double>::infinity(), last = 0, mem = 0;
    for (size_t i = 0; i < full[st].size(); ++i) {
      const Instr &in = full[st][i];
      if (!isCompute(in.op))
        continue;
      first = std::min(first, T.start[st][i]);
      last = std::max(last, T.end[st][i]);
      const double a = P.activationOf(st, in.chunk), rest = P.restingActivationOf(st, in.chunk);
      switch (in.op) {
      case Op::Fwd: mem += rest; break;
      case Op::Recompute: mem += a - rest; break;
      case Op::Bwd: mem -= a; break;
      case Op::BwdInput: mem -= a * (1 - P.wMemFrac); break;
      case Op::BwdWeight: mem -= a * P.wMemFrac; break;
      default: assert(false && "isCompute() admits the five ops above only"); break;
      }
      e.peak = std::max(e.peak, mem);
    }
    if (last > 0)
      e.maxSpan = std::max(e.maxSpan, last - first);
  }
  return e;
}

// ------------------------------------------------------------ greedy engine
// A list scheduler in the spirit of the zero-bubble paper's heuristic: ranks
// are simulated in time; a free rank runs a ready B (critical path) first,
// else the next F if admission allows (in-flight cap, memory), else a pending
// W (filling what would be a bubble), else waits. Memory of the later chunks of
// an admitted micro-batch is reserved on admission, so an F is never blocked
// by memory that only the same micro-batch could free (no memory deadlock).
struct Policy {
  std::vector<int> cap; // per stage: admitted micro-batches whose backward is unfinished
  double memLimit = 0;  // units; <= 0 unlimited
  bool split = true;    // B and W separate
  bool eagerW = false;  // pending W before a new F
  bool alternate = true; // when both an F and a B are ready, alternate like 1F1B
  // Admission keeps room for the later chunks of every admitted micro-batch
  // (safe for any chunk count). Without it, room for one micro-batch's chunks
  // only: with two chunks and no recompute that still cannot deadlock (the
  // oldest micro-batch not fully forwarded always finds its chunk-1 room
  // once the older ones' backwards free theirs; docs/schedules.md), and it
  // lets the V's first rank hold twice as many chunk-0 activations.
  bool reserveLaterChunks = true;
  // A W fills a gap only if it ends before the next known arrival (a B, or
  // an F whose input is on its way), so that it never delays the critical
  // path; otherwise the rank waits for that arrival (the zero-bubble
  // paper's handcrafted orders place their W's the same way).
  bool wOnlyInGaps = false;
};

struct GreedyResult {
  Orders order; // per stage position, local micro-batches
  double makespan = 0;
  double maxSpan = 0; // largest (last end - first start) of a stage: the steady-state bubble
  bool betterThan(const GreedyResult &o) const { return finishesBetter(makespan, maxSpan, o.makespan, o.maxSpan); }
};

// The engine's state while it simulates the ranks in time.
class GreedyEngine {
public:
  GreedyEngine(const Schedule &shape, int n, const Policy &pol);
  GreedyResult run();

private:
  using BItem = std::tuple<double, int, int>; // ready, mb, -vs
  using Ev = std::pair<double, int>;
  // What a free rank picks at one time: the instruction, if any, and the
  // earliest time an F not yet ready arrives.
  struct Pick {
    Instr chosen{};
    bool have = false;
    double wake = std::numeric_limits<double>::infinity();
  };

  size_t at(int mb, int vs) const { return (size_t)mb * V + vs; }
  int stageOf(int vs) const {
    int st, c;
    shape.locate(vs, st, c);
    return st;
  }
  double fReady(int vs) const;
  void takeW(int st, Pick &pick);
  void takeB(int st, double t, Pick &pick);
  void takeF(int st, double t, Pick &pick);
  bool wWaits(int st, double t, const Pick &pick) const;
  void execute(int st, double t, const Instr &chosen);

  const Schedule &shape;
  const int n;
  const Policy &pol;
  const Problem &P;
  const int p, v, V;
  const double frac;
  std::vector<double> fEnd;
  std::vector<int> nextF;
  // perMb: what an admitted micro-batch keeps on the stage between its F and
  // its backward (the boundary share when the stage recomputes); headroom:
  // room kept free for one RECOMPUTE to re-materialize the rest.
  std::vector<double> held, reserved, perMb, headroom;
  // Per stage and local micro-batch: chunks started / backwarded.
  std::vector<std::vector<int>> started, bdone;
  std::vector<int> inflight;
  std::vector<std::priority_queue<BItem, std::vector<BItem>, std::greater<BItem>>> bReady;
  std::vector<std::vector<std::pair<int, int>>> wPending; // (mb, vs), FIFO via index
  std::vector<size_t> wHead;
  std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> events;
  std::vector<double> busyUntil;
  std::vector<char> lastWasF;
  std::vector<double> firstStart, lastEnd;
  GreedyResult res;
  long remaining;
};

GreedyEngine::GreedyEngine(const Schedule &shape, int n, const Policy &pol)
    : shape(shape), n(n), pol(pol), P(shape.problem), p(P.stages), v(P.chunks), V(shape.virtualStages()),
      frac(P.wMemFrac), fEnd((size_t)n * V, kNaN), nextF(V, 0), held(p, 0), reserved(p, 0), perMb(p, 0),
      headroom(p, 0), started(p, std::vector<int>(n, 0)), bdone(p, std::vector<int>(n, 0)), inflight(p, 0),
      bReady(p), wPending(p), wHead(p, 0), busyUntil(p, 0), lastWasF(p, 0), firstStart(p, 0), lastEnd(p, 0),
      remaining((long)n * V * (pol.split ? 3 : 2)) {
  for (int st = 0; st < p; ++st)
    for (int c = 0; c < v; ++c) {
      perMb[st] += P.restingActivationOf(st, c);
      headroom[st] = std::max(headroom[st], P.activationOf(st, c) - P.restingActivationOf(st, c));
    }
  res.order.assign(p, {});
  for (int st = 0; st < p; ++st)
    events.push({0.0, st});
}

// When virtual stage vs's next F has its input; NaN while its producer has not run.
double GreedyEngine::fReady(int vs) const {
  const int mb = nextF[vs];
  if (vs == 0)
    return 0.0;
  const double e = fEnd[at(mb, vs - 1)];
  return std::isnan(e) ? kNaN : e + (stageOf(vs - 1) != stageOf(vs) ? P.comm : 0.0);
}

// The oldest pending W.
void GreedyEngine::takeW(int st, Pick &pick) {
  if (!pick.have && wHead[st] < wPending[st].size()) {
    auto [mb, vs] = wPending[st][wHead[st]++];
    int s2, c;
    shape.locate(vs, s2, c);
    pick.chosen = mk(Op::BwdWeight, mb, c);
    pick.have = true;
  }
}

// The earliest ready B, unless its RECOMPUTE lacks the room.
void GreedyEngine::takeB(int st, double t, Pick &pick) {
  if (!pick.have && !bReady[st].empty() && std::get<0>(bReady[st].top()) <= t + kEps) {
    auto [rt, mb, nvs] = bReady[st].top();
    int s2, c;
    shape.locate(-nvs, s2, c);
    if (pol.memLimit > 0 && P.recomputes(st) &&
        held[st] + P.activationOf(st, c) - P.restingActivationOf(st, c) > pol.memLimit + kEps)
      return; // a pending W frees the room the RECOMPUTE needs
    bReady[st].pop();
    pick.chosen = mk(pol.split ? Op::BwdInput : Op::Bwd, mb, c);
    lastWasF[st] = false;
    pick.have = true;
  }
}

// The deepest ready, admissible F (with W first when eager).
void GreedyEngine::takeF(int st, double t, Pick &pick) {
  if (pick.have)
    return;
  for (int c = v - 1; c >= 0; --c) {
    const int vs = shape.virtualStage(st, c);
    const int mb = nextF[vs];
    if (mb >= n)
      continue;
    const double rt = fReady(vs);
    if (std::isnan(rt))
      continue;
    if (rt > t + kEps) {
      pick.wake = std::min(pick.wake, rt);
      continue;
    }
    if (started[st][mb] == 0) { // admission of a new micro-batch
      if (inflight[st] >= pol.cap[st])
        continue;
      if (pol.memLimit > 0 &&
          held[st] + (pol.reserveLaterChunks ? reserved[st] : 0.0) + perMb[st] + headroom[st] > pol.memLimit + kEps)
        continue;
    } else if (pol.memLimit > 0 && held[st] + P.restingActivationOf(st, c) > pol.memLimit + kEps) {
      // Reserved, but a RECOMPUTE's re-materialized activations are still
      // held until their W: wait for the W (it fills the gap).
      continue;
    }
    if (pol.eagerW) {
      takeW(st, pick);
      if (pick.have)
        return;
    }
    pick.chosen = mk(Op::Fwd, mb, c);
    lastWasF[st] = true;
    pick.have = true;
    return;
  }
}

// Policy::wOnlyInGaps: the pending W must wait, as it would end after the
// next known arrival.
bool GreedyEngine::wWaits(int st, double t, const Pick &pick) const {
  if (pick.have || !pol.wOnlyInGaps || wHead[st] >= wPending[st].size())
    return false;
  // Only arrivals still to come: a B already here but held back (its
  // RECOMPUTE needs the memory a W frees) must not make the W wait.
  double next = pick.wake;
  if (!bReady[st].empty() && std::get<0>(bReady[st].top()) > t + kEps)
    next = std::min(next, std::get<0>(bReady[st].top()));
  int s2, c;
  shape.locate(wPending[st][wHead[st]].second, s2, c);
  return next < t + P.costOf(Op::BwdWeight, st, c) - kEps;
}

// Runs `chosen` on rank st at time t: its memory, and what it makes ready.
void GreedyEngine::execute(int st, double t, const Instr &chosen) {
  const int vs = shape.virtualStage(st, chosen.chunk);
  const int mb = chosen.mb;
  const double a = P.activationOf(st, chosen.chunk), rest = P.restingActivationOf(st, chosen.chunk);
  const bool recompute = P.recomputes(st) && (chosen.op == Op::Bwd || chosen.op == Op::BwdInput);
  // A recomputed backward runs RECOMPUTE (cost F) right before it.
  const double end = t + P.costOf(chosen.op, st, chosen.chunk) +
                     (recompute ? P.costOf(Op::Recompute, st, chosen.chunk) : 0.0);
  if (res.order[st].empty())
    firstStart[st] = t;
  lastEnd[st] = end;
  res.order[st].push_back(chosen);
  busyUntil[st] = end;
  res.makespan = std::max(res.makespan, end);
  remaining--;
  events.push({end, st});
  auto notify = [&](int st2, double when) { events.push({when, st2}); };
  switch (chosen.op) {
  case Op::Fwd:
    if (started[st][mb]++ == 0) {
      inflight[st]++;
      reserved[st] += perMb[st];
    }
    reserved[st] -= rest;
    held[st] += rest;
    fEnd[at(mb, vs)] = end;
    nextF[vs]++;
    if (vs + 1 < V) {
      const int s2 = stageOf(vs + 1);
      notify(s2, end + (s2 != st ? P.comm : 0.0));
    } else {
      bReady[st].push({end, mb, -vs});
    }
    break;
  case Op::Bwd:
  case Op::BwdInput:
    held[st] += a - rest; // re-materialized by RECOMPUTE (0 without recompute)
    held[st] -= chosen.op == Op::Bwd ? a : a * (1 - frac);
    if (++bdone[st][mb] == v)
      inflight[st]--;
    if (chosen.op == Op::BwdInput)
      wPending[st].push_back({mb, vs});
    if (vs > 0) {
      const int s2 = stageOf(vs - 1);
      const double rt = end + (s2 != st ? P.comm : 0.0);
      bReady[s2].push({rt, mb, -(vs - 1)});
      notify(s2, rt);
    }
    break;
  case Op::BwdWeight:
    held[st] -= a * frac;
    break;
  default:
    assert(false && "the greedy engine chooses a FWD, BWD, BWD_INPUT or BWD_WEIGHT only");
    break;
  }
}

GreedyResult GreedyEngine::run() {
  while (remaining > 0) {
    if (events.empty())
      throw ScheduleError(shape.name + ": greedy scheduler stalled (memory limit too small?)");
    auto [t, st] = events.top();
    events.pop();
    if (t < busyUntil[st] - kEps)
      continue; // stale: the rank is busy
    Pick pick;
    // A ready B goes first (critical path) unless we alternate and the last was a B.
    if (pol.alternate && !lastWasF[st]) {
      takeF(st, t, pick);
      takeB(st, t, pick);
    } else {
      takeB(st, t, pick);
      takeF(st, t, pick);
    }
    // 4. fill the gap with a W
    if (!wWaits(st, t, pick))
      takeW(st, pick);
    if (!pick.have) {
      // A B arriving later wakes the rank; one already here but held back
      // (its RECOMPUTE lacks the room) waits for this rank's own W or a
      // neighbour's progress: waking at `t` again would find the same state
      // and spin forever.
      if (!bReady[st].empty() && std::get<0>(bReady[st].top()) > t + kEps)
        pick.wake = std::min(pick.wake, std::get<0>(bReady[st].top()));
      busyUntil[st] = t;
      if (pick.wake < std::numeric_limits<double>::infinity())
        events.push({pick.wake, st});
      continue; // otherwise woken by a neighbour's progress
    }
    execute(st, t, pick.chosen);
  }
  for (int st = 0; st < p; ++st)
    res.maxSpan = std::max(res.maxSpan, lastEnd[st] - firstStart[st]);
  return res;
}

GreedyResult greedy(const Schedule &shape, int n, const Policy &pol) { return GreedyEngine(shape, n, pol).run(); }

// The best of the policies tried on one pipeline: the first with the lowest
// makespan, then the smallest largest per-stage span.
struct PolicySearch {
  PolicySearch(const Schedule &shape, int n) : shape(shape), n(n) {
    best.makespan = std::numeric_limits<double>::infinity();
  }
  void tryPolicy(const Policy &pol) {
    GreedyResult r = greedy(shape, n, pol);
    if (r.betterThan(best)) {
      best = std::move(r);
      bestPol = pol;
    }
  }
  const Schedule &shape;
  const int n;
  GreedyResult best;
  Policy bestPol;
};

std::vector<int> capsLinear(int p, int n, double a, int b) {
  std::vector<int> cap(p);
  for (int st = 0; st < p; ++st)
    cap[st] = std::clamp((int)std::lround(a * (p - st) + b), 1, std::max(1, n));
  return cap;
}

// Units of memory 1F1B needs on its fullest rank (the zero-bubble paper's "p").
double peakOf1F1B(const Problem &P) {
  double peak = 0;
  for (int st = 0; st < P.stages; ++st)
    peak = std::max(peak, std::min(P.stages - st, P.microbatches) * stageActivation(P, st));
  return peak;
}

} // namespace

double limitOr1F1BPeak(const Problem &P) { return P.memoryLimit > 0 ? P.memoryLimit : peakOf1F1B(P); }

// The automatic schedule: search greedy policies (in-flight caps, W
// placement), keep the lowest makespan; then improve per-stage caps by
// coordinate descent. Every candidate obeys the memory limit by construction.
Orders autoOrder(const Schedule &shape, int n, double limit) {
  const int p = shape.problem.stages;
  PolicySearch search(shape, n);
  const GreedyResult &best = search.best;
  const Policy &bestPol = search.bestPol;
  for (bool alternate : {true, false})
    for (bool eager : {false, true}) {
      for (double a : {1.0, 1.5, 2.0, 3.0})
        for (int b : {-1, 0, 1})
          search.tryPolicy(Policy{capsLinear(p, n, a, b), limit, true, eager, alternate});
      search.tryPolicy(Policy{std::vector<int>(p, std::max(1, n)), limit, true, eager, alternate});
    }
  // Coordinate descent on the caps, bounded so that large problems stay fast.
  const long budget = std::max<long>(8, 4000000L / std::max<long>(1, (long)n * p * 3));
  long tries = 0;
  for (bool improved = true; improved && tries < budget;) {
    improved = false;
    for (int st = 0; st < p && tries < budget; ++st)
      for (int d : {+1, -1}) {
        Policy pol = bestPol;
        pol.cap[st] = std::clamp(pol.cap[st] + d, 1, std::max(1, n));
        if (pol.cap[st] == bestPol.cap[st])
          continue;
        const Policy before = bestPol;
        search.tryPolicy(pol);
        ++tries;
        if (bestPol.cap != before.cap)
          improved = true;
      }
  }
  // The handcrafted ZB-H1 is a candidate too, so auto is never worse than
  // ZB-H1 under a limit ZB-H1 fits in.
  if (shape.problem.chunks != 1)
    return best.order;
  Orders h1 = zbH1Order(p, n);
  const OrderEval e = evalOrder(shape, n, h1);
  if ((limit <= 0 || e.peak <= limit + kEps) && finishesBetter(e.makespan, e.maxSpan, best.makespan, best.maxSpan))
    return h1;
  return best.order;
}

// ZB-H2: the list scheduler with 2(p-s)-1 in flight on stage s and memory
// 2p-1 times the largest stage's activation.
Orders zbH2Order(const Schedule &shape, int n) {
  const Problem &P = shape.problem;
  const int p = P.stages;
  double unit = 0; // largest activation of one micro-batch on one stage
  for (int st = 0; st < p; ++st)
    unit = std::max(unit, stageActivation(P, st));
  PolicySearch search(shape, n);
  for (bool gaps : {false, true}) {
    Policy pol{capsLinear(p, n, 2.0, -1), (2 * p - 1) * unit, true, false, true};
    pol.wOnlyInGaps = gaps;
    search.tryPolicy(pol);
  }
  return search.best.order;
}

// Whether `order` times within the limit and finishes sooner than
// bestEval (which it then replaces); an order that cannot execute is not.
bool timesBetter(const Schedule &shape, int n, double limit, const Orders &order, OrderEval &bestEval) {
  try {
    const OrderEval e = evalOrder(shape, n, order);
    if (e.peak > limit + kEps || !finishesBetter(e.makespan, e.maxSpan, bestEval.makespan, bestEval.maxSpan))
      return false;
    bestEval = e;
    return true;
  } catch (const ScheduleError &) {
    return false;
  }
}

// ------------------------------------------------------------ OrderTimer (Orders.h)
OrderTimer::OrderTimer(const Schedule &shape, int n)
    : P(shape.problem), p(shape.problem.stages), n(n), V(shape.virtualStages()), rankOfVs(V),
      vsAt((size_t)p * P.chunks, 0), start(p), end(p), backwardSum(p), peakOf(p, 0),
      opEnd((size_t)2 * V * n, kNaN), first(p), savedFirst(p), savedPeak(p) {
  for (int vs = 0; vs < V; ++vs) {
    int chunk;
    shape.locate(vs, rankOfVs[vs], chunk);
    vsAt[(size_t)rankOfVs[vs] * P.chunks + chunk] = vs;
  }
  for (int r = 0; r < p; ++r) {
    recomputes.push_back(P.recomputes(r));
    for (int c = 0; c < P.chunks; ++c) {
      Slot s;
      for (Op op : {Op::Fwd, Op::BwdInput, Op::BwdWeight, Op::Bwd})
        s.cost[(int)kindOf(op)] = P.costOf(op, r, c);
      s.recompute = P.costOf(Op::Recompute, r, c);
      s.activation = P.activationOf(r, c);
      s.resting = P.restingActivationOf(r, c);
      slots.push_back(s);
    }
  }
}

bool OrderTimer::time(const Orders &order) {
  for (int r = 0; r < p; ++r) {
    start[r].assign(order[r].size(), 0);
    end[r].assign(order[r].size(), 0);
    backwardSum[r].assign(order[r].size() + 1, 0);
    peakOf[r] = peakMemory(order[r], r);
    first[r] = 0;
  }
  std::fill(opEnd.begin(), opEnd.end(), kNaN);
  return sweep(order);
}

bool OrderTimer::retime(const Orders &order, int rank, size_t from) {
  const double t0 = start[rank][from] - kEps;
  savedMetrics = metrics;
  savedStart.clear();
  savedEnd.clear();
  savedIds.clear();
  for (int r = 0; r < p; ++r) {
    size_t k = (size_t)(std::lower_bound(start[r].begin(), start[r].end(), t0) - start[r].begin());
    if (r == rank)
      k = std::min(k, from);
    first[r] = savedFirst[r] = k;
    savedPeak[r] = peakOf[r];
    savedStart.insert(savedStart.end(), start[r].begin() + (long)k, start[r].end());
    savedEnd.insert(savedEnd.end(), end[r].begin() + (long)k, end[r].end());
    for (size_t i = k; i < order[r].size(); ++i)
      if (const long id = dependedOn(order[r][i], r); id >= 0) {
        savedIds.push_back({id, opEnd[(size_t)id]});
        opEnd[(size_t)id] = kNaN;
      }
  }
  peakOf[rank] = peakMemory(order[rank], rank);
  return sweep(order);
}

void OrderTimer::restore(const Orders &order) {
  size_t at = 0;
  for (int r = 0; r < p; ++r) {
    const size_t len = start[r].size() - savedFirst[r];
    std::copy_n(savedStart.begin() + (long)at, len, start[r].begin() + (long)savedFirst[r]);
    std::copy_n(savedEnd.begin() + (long)at, len, end[r].begin() + (long)savedFirst[r]);
    for (size_t i = savedFirst[r]; i < start[r].size(); ++i) // the sums from the restored ends
      backwardSum[r][i + 1] = backwardSum[r][i] + (backward(order[r][i].op) ? end[r][i] : 0.0);
    at += len;
    peakOf[r] = savedPeak[r];
  }
  for (auto it = savedIds.rbegin(); it != savedIds.rend(); ++it)
    opEnd[(size_t)it->first] = it->second;
  metrics = savedMetrics;
}

long OrderTimer::dependedOn(const Instr &in, int rank) const {
  if (in.op != Op::Fwd && !backward(in.op))
    return -1;
  return ((long)(in.op == Op::Fwd ? 0 : 1) * V + vsOf(rank, in.chunk)) * n + in.mb;
}

double OrderTimer::peakMemory(const std::vector<Instr> &rank, int st) const {
  double mem = 0, peak = 0;
  for (const Instr &in : rank) {
    const double a = slot(st, in.chunk).activation, rest = slot(st, in.chunk).resting;
    if (in.op == Op::Fwd) {
      mem += rest;
    } else if (backward(in.op)) {
      mem += a - rest; // re-materialized by RECOMPUTE (0 without recompute)
      peak = std::max(peak, mem);
      mem -= in.op == Op::Bwd ? a : a * (1 - P.wMemFrac);
    } else {
      mem -= a * P.wMemFrac;
    }
    peak = std::max(peak, mem);
  }
  return peak;
}

bool OrderTimer::sweep(const Orders &order) {
  std::vector<size_t> &pc = first;
  std::vector<double> now(p, 0);
  for (int r = 0; r < p; ++r)
    now[r] = pc[r] > 0 ? end[r][pc[r] - 1] : 0.0;
  const std::vector<size_t> from = pc;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r)
      for (; pc[r] < order[r].size(); ++pc[r]) {
        const Instr &in = order[r][pc[r]];
        const int vs = vsOf(r, in.chunk);
        double ready = now[r];
        auto need = [&](int kind, int dvs) {
          const double t = opEnd[((size_t)kind * V + dvs) * n + in.mb];
          if (std::isnan(t))
            return false;
          ready = std::max(ready, t + (rankOfVs[dvs] != r ? P.comm : 0.0));
          return true;
        };
        if (in.op == Op::Fwd) {
          if (vs > 0 && !need(0, vs - 1))
            break;
        } else if (backward(in.op)) {
          if (!need(0, vs) || (vs + 1 < V && !need(1, vs + 1)))
            break;
          if (recomputes[r]) // RECOMPUTE right before, after its F only
            ready = std::max(ready, std::max(now[r], opEnd[(size_t)vs * n + in.mb]) + slot(r, in.chunk).recompute);
        } else if (!need(1, vs)) {
          break;
        }
        const double finish = ready + slot(r, in.chunk).cost[kindOf(in.op)];
        start[r][pc[r]] = ready;
        end[r][pc[r]] = finish;
        if (const long id = dependedOn(in, r); id >= 0)
          opEnd[(size_t)id] = finish;
        now[r] = finish;
        progress = true;
      }
  }
  metrics = Metrics{};
  for (int r = 0; r < p; ++r) {
    if (pc[r] < order[r].size())
      return false; // waits for work that never runs: not an executable order
    for (size_t i = from[r]; i < order[r].size(); ++i)
      backwardSum[r][i + 1] = backwardSum[r][i] + (backward(order[r][i].op) ? end[r][i] : 0.0);
    if (order[r].empty())
      continue;
    metrics.makespan = std::max(metrics.makespan, end[r].back());
    // A rank starts with an F (each backward waits for its F on the rank),
    // so start.front() is its first start with or without recompute.
    metrics.maxSpan = std::max(metrics.maxSpan, end[r].back() - start[r].front());
    metrics.peak = std::max(metrics.peak, peakOf[r]);
    metrics.backwardEnds += backwardSum[r].back();
  }
  return true;
}

// The local search's order of preference: sooner, then the smaller largest
// span (finishesBetter), then the backwards ending earlier in sum. The last
// lets the search walk across orders of equal makespan towards ones whose
// critical backward chains run earlier, where a later change then shortens
// the makespan (the cool-down of the V with communication cost: docs/schedules.md).
bool searchPrefers(const OrderTimer::Metrics &a, const OrderTimer::Metrics &b, bool byBackwardEnds) {
  if (finishesBetter(a.makespan, a.maxSpan, b.makespan, b.maxSpan))
    return true;
  if (!byBackwardEnds || finishesBetter(b.makespan, b.maxSpan, a.makespan, a.maxSpan))
    return false;
  return a.backwardEnds < b.backwardEnds - kEps * std::max(1.0, std::abs(b.backwardEnds));
}

// A local search on the best V order: swap two adjacent computes of a rank
// and keep the swap when the order is then preferred (searchPrefers) within
// the limit; when no swap helps, move one compute up to 8 places earlier;
// repeat while that helps, within `evaluations` timings (OrderTimer's,
// which re-time only what a change can move). Swaps of two computes of the
// same kind and chunk (which only renumber micro-batches) or of one
// micro-batch are skipped; a change that breaks a dependency does not time
// and is undone.
void improveBySwaps(const Schedule &shape, int n, double limit, Orders &best, OrderEval &bestEval, long evaluations,
                    bool byBackwardEnds) {
  OrderTimer timer(shape, n);
  if (!timer.time(best))
    return;
  const Orders start = best;
  OrderTimer::Metrics current = timer.result();
  bool changed = false;
  // Times best after a change of best[rank] from position `from` on; keeps
  // it when preferred, else the caller undoes the change and restores.
  auto better = [&](size_t rank, size_t from) {
    --evaluations;
    if (timer.retime(best, (int)rank, from) && timer.result().peak <= limit + kEps &&
        searchPrefers(timer.result(), current, byBackwardEnds)) {
      current = timer.result();
      changed = true;
      return true;
    }
    return false;
  };
  constexpr size_t kReach = 8;
  for (bool improved = true; improved && evaluations > 0;) {
    improved = false;
    for (size_t r = 0; r < best.size(); ++r) {
      auto &rank = best[r];
      for (size_t i = rank.size(); i-- > 1 && evaluations > 0;) {
        if ((rank[i - 1].op == rank[i].op && rank[i - 1].chunk == rank[i].chunk) || rank[i - 1].mb == rank[i].mb)
          continue;
        std::swap(rank[i - 1], rank[i]);
        if (better(r, i - 1)) {
          improved = true;
        } else {
          std::swap(rank[i - 1], rank[i]);
          timer.restore(best);
        }
      }
    }
    if (improved)
      continue;
    for (size_t r = 0; r < best.size(); ++r) {
      auto &rank = best[r];
      for (size_t i = rank.size(); i-- > 2 && evaluations > 0;)
        for (size_t d = 2; d <= kReach && d <= i && evaluations > 0; ++d) {
          const auto at = rank.begin() + (long)i;
          std::rotate(at - (long)d, at, at + 1); // rank[i] to i - d
          if (better(r, i - d)) {
            improved = true;
            break;
          }
          std::rotate(at - (long)d, at - (long)d + 1, at + 1);
          timer.restore(best);
        }
    }
  }
  if (!changed)
    return;
  // The result as evalOrder times it: kept only when it is within the limit
  // and no later than the start (the timer times the same way; this makes
  // sure of it).
  OrderEval e = bestEval;
  try {
    e = evalOrder(shape, n, best);
  } catch (const ScheduleError &) {
    best = start;
    return;
  }
  if (e.peak > limit + kEps || finishesBetter(bestEval.makespan, bestEval.maxSpan, e.makespan, e.maxSpan)) {
    best = start;
    return;
  }
  bestEval = e;
}

// Both passes of the local search: first by makespan and span alone (what
// it was before the tie-break on the backwards' ends, so no order gets
// slower), then with the tie-break, for at most 10^7 / computes timings of
// OrderTimer (about as long as the first pass took with evalOrder).
void improveBySwapsBothPasses(const Schedule &shape, int n, double limit, Orders &best, OrderEval &bestEval) {
  long computes = 0;
  for (const auto &rank : best)
    computes += (long)rank.size();
  computes = std::max<long>(1, computes);
  improveBySwaps(shape, n, limit, best, bestEval, std::min<long>(4000, 2000000 / computes), false);
  improveBySwaps(shape, n, limit, best, bestEval, std::min<long>(100000, 10000000 / computes), true);
}

void improveOrder(const Schedule &shape, int n, double limit, Orders &order, int kicks, long evaluationsPerKick) {
  OrderEval bestEval;
  try {
    bestEval = evalOrder(shape, n, order);
  } catch (const ScheduleError &) {
    return;
  }
  if (bestEval.peak > limit + kEps)
    return;
  improveBySwapsBothPasses(shape, n, limit, order, bestEval);
  std::mt19937 rng(20261125); // fixed: the same problem gets the same order
  Orders current = order;
  OrderEval currentEval = bestEval;
  OrderTimer timer(shape, n);
  for (int kick = 0; kick < kicks; ++kick) {
    // Four random moves of one compute to any place on its rank, each kept
    // when the order still executes within the limit.
    Orders trial = current;
    int moved = 0;
    for (int attempt = 0; attempt < 100 && moved < 4; ++attempt) {
      auto &rank = trial[rng() % trial.size()];
      if (rank.size() < 2)
        continue;
      const size_t from = rng() % rank.size(), to = rng() % rank.size();
      if (from == to)
        continue;
      const Instr moving = rank[from];
      rank.erase(rank.begin() + (long)from);
      rank.insert(rank.begin() + (long)to, moving);
      if (timer.time(trial) && timer.result().peak <= limit + kEps) {
        ++moved;
      } else {
        rank.erase(rank.begin() + (long)to);
        rank.insert(rank.begin() + (long)from, moving);
      }
    }
    OrderEval trialEval;
    try {
      trialEval = evalOrder(shape, n, trial);
    } catch (const ScheduleError &) {
      continue; // the timer executed it; evalOrder has the last word
    }
    improveBySwaps(shape, n, limit, trial, trialEval, evaluationsPerKick, false);
    improveBySwaps(shape, n, limit, trial, trialEval, evaluationsPerKick, true);
    // Sooner replaces the current order, as soon does half of the time (a
    // walk across orders of the same makespan).
    const bool sooner =
        finishesBetter(trialEval.makespan, trialEval.maxSpan, currentEval.makespan, currentEval.maxSpan);
    const bool later = finishesBetter(currentEval.makespan, currentEval.maxSpan, trialEval.makespan, trialEval.maxSpan);
    if (sooner || (!later && rng() % 2)) {
      current = std::move(trial);
      currentEval = trialEval;
    }
    if (finishesBetter(currentEval.makespan, currentEval.maxSpan, bestEval.makespan, bestEval.maxSpan)) {
      order = current;
      bestEval = currentEval;
    }
  }
}

// ZB-V: memory is the only admission rule; keep the better F/B/W priority,
// then the paper's V orders (VHeuristic.cpp) where they fit the limit and finish sooner,
// then a local search on the best (improveBySwaps).
Orders zbVOrder(const Schedule &shape, int n, double limit) {
  const int p = shape.problem.stages;
  const Problem &P = shape.problem;
  bool recomputes = false;
  for (int st = 0; st < p; ++st)
    recomputes |= P.recomputes(st);
  PolicySearch search(shape, n);
  for (bool reserve : {true, false}) {
    if (!reserve && (P.chunks != 2 || recomputes))
      continue; // the one-micro-batch room is proven for two chunks without recompute only
    for (bool alternate : {true, false})
      for (bool eager : {false, true})
        for (bool gaps : {false, true}) {
          Policy pol{std::vector<int>(p, std::max(1, n)), limit, true, eager, alternate, reserve};
          pol.wOnlyInGaps = gaps;
          search.tryPolicy(pol);
        }
  }
  // The list scheduler's makespan is timed like the candidates' (evalOrder),
  // so that a candidate replaces it only when the lowered schedule is faster.
  Orders best = std::move(search.best.order);
  OrderEval bestEval = evalOrder(shape, n, best);
  // ZB-V's greedy with our limit and, below it, with 1F1B's memory (the paper's own budget).
  std::vector<double> budgets{limit};
  if (const double oneF1B = peakOf1F1B(P); oneF1B < limit - kEps)
    budgets.push_back(oneF1B);
  for (Orders &candidate : paperVOrders(P, n, budgets))
    if (timesBetter(shape, n, limit, candidate, bestEval))
      best = std::move(candidate);
  improveBySwapsBothPasses(shape, n, limit, best, bestEval);
  return best;
}

// Zero bubble over interleaved chunks as a fixed pattern: on rank r,
// (v-1) rounds of forwards plus p-1-r more as the warm-up (a round: the
// micro-batches of one chunk before the next chunk's, p of them), then
// interleaved 1F1B's steady forward and backward, the backward split; from
// the (r + 1 + wDelay)-th backward on each is followed by the oldest pending
// W, and the W's left end the rank. (PyTorch's ScheduleInterleavedZeroBubble
// is this pattern with wDelay 0.) Empty when n is not a whole number of rounds.
Orders zbInterleavedPattern(int p, int v, int n, int wDelay) {
  const int rounds = std::max(1, n / p);
  if (n % rounds != 0)
    return {};
  const int perRound = n / rounds, total = n * v;
  Orders orders(p);
  for (int r = 0; r < p; ++r) {
    const int warm = std::min((v - 1) * perRound + (p - 1 - r), total);
    std::vector<int> fNext(v, 0), bNext(v, 0), wNext(v, 0);
    std::vector<int> backwardChunks;
    size_t weights = 0;
    std::vector<Instr> &o = orders[r];
    auto weight = [&]() {
      const int c = backwardChunks[weights++];
      o.push_back(mk(Op::BwdWeight, wNext[c]++, c));
    };
    for (int op = 0; op < total + warm; ++op) {
      if (op < total) {
        const int c = (op / perRound) % v;
        o.push_back(mk(Op::Fwd, fNext[c]++, c));
      }
      if (op < warm)
        continue;
      const int c = v - 1 - ((op - warm) / perRound) % v;
      o.push_back(mk(Op::BwdInput, bNext[c]++, c));
      backwardChunks.push_back(c);
      if (op - warm >= r + wDelay)
        weight();
    }
    while (weights < backwardChunks.size())
      weight();
  }
  return orders;
}

Orders zbInterleavedOrder(const Schedule &shape, int n, double limit) {
  const int p = shape.problem.stages;
  PolicySearch search(shape, n);
  // With room reserved for the later chunks of every admitted micro-batch
  // the greedy cannot stall at any chunk count; without it (room for one
  // micro-batch's chunks) it admits more under a tight limit and may stall,
  // which only drops that policy.
  for (bool reserve : {true, false})
    for (bool alternate : {true, false})
      for (bool eager : {false, true})
        for (bool gaps : {false, true}) {
          std::vector<Policy> policies;
          for (double a : {1.0, 2.0})
            for (int b : {0, 1})
              policies.push_back(Policy{capsLinear(p, n, a, b), limit, true, eager, alternate, reserve});
          policies.push_back(Policy{std::vector<int>(p, std::max(1, n)), limit, true, eager, alternate, reserve});
          for (Policy &pol : policies) {
            pol.wOnlyInGaps = gaps;
            try {
              search.tryPolicy(pol);
            } catch (const ScheduleError &) {
              if (reserve)
                throw;
            }
          }
        }
  Orders best = std::move(search.best.order);
  OrderEval bestEval = evalOrder(shape, n, best);
  // The fixed pattern, with its W's from later on too (less memory held early).
  for (int wDelay = 0; wDelay <= 2; ++wDelay) {
    Orders candidate = zbInterleavedPattern(p, shape.problem.chunks, n, wDelay);
    if (!candidate.empty() && timesBetter(shape, n, limit, candidate, bestEval))
      best = std::move(candidate);
  }
  improveBySwapsBothPasses(shape, n, limit, best, bestEval);
  return best;
}

} // namespace pipec::schedule::detail
