// Schedule generators.
//
// Every generator first decides the order of the compute instructions on each
// rank (FWD/BWD/BWD_INPUT/BWD_WEIGHT plus the optimizer tail). lower() then
// inserts LOAD, the point-to-point transfers and STASH/RESTORE. To make the
// transfers deadlock-free under blocking rendezvous semantics, lower() times
// the compute order once and sorts every rank's stream by one global key
// (time, class, id) that a send and its receive share: the pending
// instruction with the smallest key is then always at the head of its rank,
// and so is its partner, so some instruction can always proceed.
#include "Schedule/Schedule.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <tuple>

namespace pipec::schedule {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEps = 1e-9;

using Orders = std::vector<std::vector<Instr>>; // per rank or per stage position

Instr mk(Op op, int mb = -1, int chunk = -1, int peer = -1) { return Instr{op, mb, chunk, peer}; }

// ------------------------------------------------------------ timing an order
struct Timing {
  std::vector<std::vector<double>> start, end; // per rank, per instruction
  double makespan = 0;
};

// Times a compute-only order (sends asynchronous, `comm` per transfer between
// ranks). `zeroCost` replaces zero durations (steps, free collectives) so that
// starts strictly increase on a rank; lower() relies on it for its keys.
Timing timeOrder(const Schedule &s, const Orders &orders, double zeroCost) {
  const Problem &P = s.problem;
  const int V = s.virtualStages(), m = P.microbatches, R = (int)orders.size();
  std::vector<double> fEnd((size_t)m * V, kNaN), bEnd((size_t)m * V, kNaN);
  auto at = [V](int mb, int vs) { return (size_t)mb * V + vs; };
  Timing T;
  T.start.resize(R);
  T.end.resize(R);
  std::vector<size_t> pc(R, 0);
  std::vector<double> now(R, 0.0);
  // Collective state keyed by (group, sequence): group = stage for ALLREDUCE,
  // -1 for VALIDATE (all ranks).
  struct Coll {
    int arrived = 0;
    double maxT = 0;
  };
  std::map<std::pair<int, int>, Coll> colls;
  std::vector<int> arSeq(R, 0), valSeq(R, 0);
  std::vector<int> registeredPc(R, -1);
  auto dur = [&](double c) { return c > 0 ? c : zeroCost; };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      const int stage = P.stageOfRank(r);
      while (pc[r] < orders[r].size()) {
        const Instr &in = orders[r][pc[r]];
        double ready = now[r], cost = 0;
        bool ok = true;
        int vs = in.chunk >= 0 ? s.virtualStage(stage, in.chunk) : -1;
        auto need = [&](double t, bool remote) {
          if (std::isnan(t))
            ok = false;
          else
            ready = std::max(ready, t + (remote ? P.comm : 0.0));
        };
        switch (in.op) {
        case Op::Fwd:
          if (vs > 0)
            need(fEnd[at(in.mb, vs - 1)], s.rankFor(vs - 1, in.mb) != r);
          cost = P.costOf(Op::Fwd, stage, in.chunk);
          break;
        case Op::Bwd:
        case Op::BwdInput:
          need(fEnd[at(in.mb, vs)], false);
          if (vs + 1 < V)
            need(bEnd[at(in.mb, vs + 1)], s.rankFor(vs + 1, in.mb) != r);
          cost = P.costOf(in.op, stage, in.chunk);
          break;
        case Op::BwdWeight:
          need(bEnd[at(in.mb, vs)], false);
          cost = P.costOf(in.op, stage, in.chunk);
          break;
        case Op::Recompute:
          need(fEnd[at(in.mb, vs)], false);
          cost = P.costOf(in.op, stage, in.chunk);
          break;
        case Op::AllReduce:
        case Op::Validate: {
          const bool ar = in.op == Op::AllReduce;
          auto key = std::make_pair(ar ? stage : -1, ar ? arSeq[r] : valSeq[r]);
          Coll &c = colls[key];
          if (registeredPc[r] != (int)pc[r]) {
            registeredPc[r] = (int)pc[r];
            c.arrived++;
            c.maxT = std::max(c.maxT, now[r]);
          }
          const int size = ar ? P.replicasOf(stage) : R;
          if (c.arrived < size) {
            ok = false;
            break;
          }
          ready = c.maxT;
          cost = dur(P.allreduceCost);
          break;
        }
        case Op::Step:
        case Op::SpecStep:
          cost = dur(P.stepCost);
          break;
        default:
          cost = dur(0);
          break;
        }
        if (!ok)
          break;
        if (in.op == Op::AllReduce)
          arSeq[r]++;
        if (in.op == Op::Validate)
          valSeq[r]++;
        T.start[r].push_back(ready);
        now[r] = ready + cost;
        T.end[r].push_back(now[r]);
        if (in.op == Op::Fwd)
          fEnd[at(in.mb, vs)] = now[r];
        if (in.op == Op::Bwd || in.op == Op::BwdInput)
          bEnd[at(in.mb, vs)] = now[r];
        T.makespan = std::max(T.makespan, now[r]);
        pc[r]++;
        progress = true;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    if (pc[r] < orders[r].size())
      throw ScheduleError(s.name + ": compute order cannot execute: rank " + std::to_string(r) +
                          " waits forever at #" + std::to_string(pc[r]) + " " +
                          toString(orders[r][pc[r]]));
  return T;
}

// ------------------------------------------------------------ lowering
void lower(Schedule &s, const Orders &orders) {
  const Problem &P = s.problem;
  const int V = s.virtualStages(), m = P.microbatches, R = (int)orders.size();
  double minCost = std::numeric_limits<double>::infinity();
  for (int st = 0; st < P.stages; ++st)
    for (int c = 0; c < P.chunks; ++c)
      minCost = std::min({minCost, P.costOf(Op::Fwd, st, c), P.costOf(Op::BwdInput, st, c),
                          P.costOf(Op::BwdWeight, st, c)});
  const Timing T = timeOrder(s, orders, minCost * 1e-6);

  // End time of every F and B, the keys of their messages.
  std::vector<double> fEnd((size_t)m * V, kNaN), bEnd((size_t)m * V, kNaN);
  for (int r = 0; r < R; ++r)
    for (size_t i = 0; i < orders[r].size(); ++i) {
      const Instr &in = orders[r][i];
      if (in.op != Op::Fwd && in.op != Op::Bwd && in.op != Op::BwdInput)
        continue;
      const int vs = s.virtualStage(P.stageOfRank(r), in.chunk);
      (in.op == Op::Fwd ? fEnd : bEnd)[(size_t)in.mb * V + vs] = T.end[r][i];
    }

  struct Entry {
    double key;
    int cls; // 0: rendezvous (p2p, collective), 1: local
    long id; // message / collective id (global) or local sequence
    Instr in;
  };
  const long msgBase = 0, collBase = 2L * m * V;
  auto msgId = [&](bool grad, int mb, int vsRecv) { return msgBase + ((grad ? m : 0) + mb) * (long)V + vsRecv; };

  s.ranks.assign(R, {});
  for (int r = 0; r < R; ++r) {
    const int stage = P.stageOfRank(r);
    std::vector<Entry> entries;
    long seq = 0;
    int arSeq = 0, valSeq = 0;
    auto local = [&](double key, Instr in) { entries.push_back({key, 1, seq++, in}); };
    for (size_t i = 0; i < orders[r].size(); ++i) {
      const Instr &in = orders[r][i];
      const double st = T.start[r][i], en = T.end[r][i];
      const int vs = in.chunk >= 0 ? s.virtualStage(stage, in.chunk) : -1;
      switch (in.op) {
      case Op::Fwd: {
        if (vs == 0)
          local(st, mk(Op::Load, in.mb));
        else if (int pr = s.rankFor(vs - 1, in.mb); pr != r)
          entries.push_back({fEnd[(size_t)in.mb * V + vs - 1], 0, msgId(false, in.mb, vs),
                             mk(Op::RecvAct, in.mb, in.chunk, pr)});
        local(st, in);
        if (s.asynchronous && !P.verticalSync)
          local(en, mk(Op::Stash, in.mb));
        if (vs + 1 < V)
          if (int cr = s.rankFor(vs + 1, in.mb); cr != r)
            entries.push_back({en, 0, msgId(false, in.mb, vs + 1), mk(Op::SendAct, in.mb, in.chunk, cr)});
        break;
      }
      case Op::Bwd:
      case Op::BwdInput: {
        if (vs + 1 < V)
          if (int pr = s.rankFor(vs + 1, in.mb); pr != r)
            entries.push_back({bEnd[(size_t)in.mb * V + vs + 1], 0, msgId(true, in.mb, vs),
                               mk(Op::RecvGrad, in.mb, in.chunk, pr)});
        // The stashed weights are restored before the backward, or before
        // its RECOMPUTE (which re-runs the forward with the same version).
        if (s.asynchronous && !P.verticalSync && !P.recomputes(stage))
          local(st, mk(Op::Restore, in.mb));
        local(st, in);
        if (vs > 0)
          if (int cr = s.rankFor(vs - 1, in.mb); cr != r)
            entries.push_back({en, 0, msgId(true, in.mb, vs - 1), mk(Op::SendGrad, in.mb, in.chunk, cr)});
        break;
      }
      case Op::Recompute:
        if (s.asynchronous && !P.verticalSync)
          local(st, mk(Op::Restore, in.mb));
        local(st, in);
        break;
      case Op::AllReduce:
        entries.push_back({st, 0, collBase + (long)(arSeq++) * (P.stages + 1) + stage, in});
        break;
      case Op::Validate:
        entries.push_back({st, 0, collBase + (long)(valSeq++) * (P.stages + 1) + P.stages, in});
        break;
      default:
        local(st, in);
      }
    }
    std::stable_sort(entries.begin(), entries.end(), [](const Entry &a, const Entry &b) {
      return std::tie(a.key, a.cls, a.id) < std::tie(b.key, b.cls, b.id);
    });
    for (const Entry &e : entries)
      s.ranks[r].push_back(e.in);
  }
}

// ------------------------------------------------------------ shapes
Schedule shell(const std::string &name, const Problem &problem, Placement placement, bool split,
               bool async) {
  Schedule s;
  s.name = name;
  s.problem = problem;
  s.placement = placement;
  s.splitBackward = split;
  s.asynchronous = async;
  return s;
}

void requireUniformReplicas(const Problem &P, const std::string &name) {
  for (int st = 1; st < P.stages; ++st)
    if (P.replicasOf(st) != P.replicasOf(0))
      throw ScheduleError(name + " needs the same replica count on every stage (its chunks "
                                 "place every virtual stage on every pipeline); gpipe, 1f1b, "
                                 "zb-h1, zb-h2, auto and 1f1b-rr take per-stage replicas");
}

// Micro-batch mb runs on replica mb mod R of every stage (docs/schedules.md).
std::vector<int> microbatchesOfReplica(const Problem &P, int st, int rep) {
  std::vector<int> mine;
  for (int mb = rep; mb < P.microbatches; mb += P.replicasOf(st))
    mine.push_back(mb);
  return mine;
}

// Forwards a replica of stage st runs before its first backward: PipeDream's
// NOAM, enough micro-batches to keep every worker at and after the stage
// busy, ceil(sum_{t>=st} R_t / R_st) - 1. With one replica per stage (or the
// same count on all) it is 1F1B's p - st - 1.
int warmupOf(const Problem &P, int st) {
  long downstream = 0;
  for (int t = st; t < P.stages; ++t)
    downstream += P.replicasOf(t);
  const long r = P.replicasOf(st);
  return (int)((downstream + r - 1) / r) - 1;
}

// Every rank's optimizer tail: the all-reduce over its stage's replicas, then
// the step (ZB-H2: speculative step, global validation, possible rollback).
void appendOptimizerTail(const Problem &P, Orders &orders, bool speculativeStep) {
  for (int r = 0; r < P.numRanks(); ++r) {
    const int st = P.stageOfRank(r);
    if (P.replicasOf(st) > 1)
      orders[r].push_back(mk(Op::AllReduce, -1, -1, st));
    if (speculativeStep) {
      // ZB-H2: step as soon as this stage's gradients are ready; a global
      // post-validation decides afterwards whether to roll the step back.
      orders[r].push_back(mk(Op::SpecStep));
      orders[r].push_back(mk(Op::Validate));
      orders[r].push_back(mk(Op::Rollback));
    } else {
      orders[r].push_back(mk(Op::Step));
    }
  }
}

// A synchronous schedule is one pipeline order per replica (data-parallel
// pipelines over the micro-batches mb % R == r), then the optimizer tail.
// Needs the same replica count on every stage.
using PipelineGen = std::function<Orders(int n)>; // per stage position, local micro-batches

Orders assemble(const Schedule &s, const PipelineGen &gen, bool speculativeStep) {
  const Problem &P = s.problem;
  const int R = P.replicasOf(0);
  Orders orders(P.numRanks());
  for (int rep = 0; rep < R; ++rep) {
    const int n = (P.microbatches - rep + R - 1) / R;
    if (n == 0)
      continue;
    Orders local = gen(n);
    for (int st = 0; st < P.stages; ++st)
      for (Instr in : local[st]) {
        in.mb = in.mb * R + rep;
        orders[P.rankOf(st, rep)].push_back(in);
      }
  }
  appendOptimizerTail(P, orders, speculativeStep);
  return orders;
}

// Per-stage replica counts that differ: every replica runs the stage's
// pattern over its own micro-batches (`pattern(stage, n)` in local indices),
// with the stage's warm-up from warmupOf. Replicas with fewer micro-batches
// idle; the all-reduce sums all of them.
using StagePattern = std::function<std::vector<Instr>(int stage, int n)>;
Orders assemblePerReplica(const Schedule &s, const StagePattern &pattern, bool speculativeStep) {
  const Problem &P = s.problem;
  Orders orders(P.numRanks());
  for (int st = 0; st < P.stages; ++st)
    for (int rep = 0; rep < P.replicasOf(st); ++rep) {
      const std::vector<int> mine = microbatchesOfReplica(P, st, rep);
      if (mine.empty())
        continue;
      for (Instr in : pattern(st, (int)mine.size())) {
        in.mb = mine[in.mb];
        orders[P.rankOf(st, rep)].push_back(in);
      }
    }
  appendOptimizerTail(P, orders, speculativeStep);
  return orders;
}

bool uniformReplicas(const Problem &P) {
  for (int st = 1; st < P.stages; ++st)
    if (P.replicasOf(st) != P.replicasOf(0))
      return false;
  return true;
}

std::vector<Instr> gpipeStage(int n) {
  std::vector<Instr> o;
  for (int i = 0; i < n; ++i)
    o.push_back(mk(Op::Fwd, i, 0));
  for (int i = 0; i < n; ++i)
    o.push_back(mk(Op::Bwd, i, 0));
  return o;
}

// `warm` forwards, then forward/backward pairs, then the remaining backwards.
std::vector<Instr> oneF1BStage(int warm, int n) {
  std::vector<Instr> o;
  warm = std::min(warm, n);
  int f = 0, b = 0;
  while (f < warm)
    o.push_back(mk(Op::Fwd, f++, 0));
  while (f < n) {
    o.push_back(mk(Op::Fwd, f++, 0));
    o.push_back(mk(Op::Bwd, b++, 0));
  }
  while (b < n)
    o.push_back(mk(Op::Bwd, b++, 0));
  return o;
}

// The zero-bubble paper's handcrafted ZB-H1 (section 2.1, figure 3 top) for
// one stage: 1F1B with B and W split; the stage runs `warm` warm-up forwards,
// then F,B pairs, and starts its W's `wDelay` steps late (a W follows a B
// once wDelay+1 B's are done), so every stage keeps as many micro-batches in
// flight as stage 0; the W's left over fill the drain. With one replica per
// stage (warm p-1-s, delay s): bubble (p-1)(F+B-W), memory p.
std::vector<Instr> zbH1Stage(int warm, int wDelay, int n) {
  std::vector<Instr> o;
  warm = std::min(warm, n);
  int f = 0, b = 0, w = 0;
  auto backward = [&] {
    o.push_back(mk(Op::BwdInput, b++, 0));
    if (b > wDelay)
      o.push_back(mk(Op::BwdWeight, w++, 0));
  };
  while (f < warm)
    o.push_back(mk(Op::Fwd, f++, 0));
  while (f < n) {
    o.push_back(mk(Op::Fwd, f++, 0));
    backward();
  }
  while (b < n)
    backward();
  while (w < n)
    o.push_back(mk(Op::BwdWeight, w++, 0));
  return o;
}

Orders zbH1Order(int p, int n) {
  Orders o(p);
  for (int st = 0; st < p; ++st)
    o[st] = zbH1Stage(p - st - 1, st, n);
  return o;
}

// Megatron-LM's interleaved 1F1B: micro-batches in groups of p, each group
// runs through chunk 0, then chunk 1, ...; backward visits chunks in reverse.
Orders interleavedOrder(int p, int v, int n) {
  if (n % p != 0)
    throw ScheduleError("interleaved: micro-batches per pipeline (" + std::to_string(n) +
                        ") must be a multiple of the stage count (" + std::to_string(p) + ")");
  Orders o(p);
  const int total = n * v;
  auto mbOf = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int st = 0; st < p; ++st) {
    const int warm = std::min(total, (p - st - 1) * 2 + (v - 1) * p);
    auto fwd = [&](int k) { return mk(Op::Fwd, mbOf(k), (k / p) % v); };
    auto bwd = [&](int k) { return mk(Op::Bwd, mbOf(k), v - 1 - (k / p) % v); };
    int f = 0, b = 0;
    while (f < warm)
      o[st].push_back(fwd(f++));
    while (f < total) {
      o[st].push_back(fwd(f++));
      o[st].push_back(bwd(b++));
    }
    while (b < total)
      o[st].push_back(bwd(b++));
  }
  return o;
}

// Inserts RECOMPUTE(mb, chunk) right before every backward of a stage that
// recomputes (orders indexed by rank of `s`).
Orders withRecompute(const Schedule &s, Orders orders) {
  const Problem &P = s.problem;
  for (size_t r = 0; r < orders.size(); ++r) {
    if (!P.recomputes(P.stageOfRank((int)r)))
      continue;
    std::vector<Instr> out;
    out.reserve(orders[r].size() * 4 / 3 + 1);
    for (const Instr &in : orders[r]) {
      if (in.op == Op::Bwd || in.op == Op::BwdInput)
        out.push_back(mk(Op::Recompute, in.mb, in.chunk));
      out.push_back(in);
    }
    orders[r] = std::move(out);
  }
  return orders;
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
      default: break;
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
};

struct GreedyResult {
  Orders order; // per stage position, local micro-batches
  double makespan = 0;
  double maxSpan = 0; // largest (last end - first start) of a stage: the steady-state bubble
  bool betterThan(const GreedyResult &o) const {
    return makespan < o.makespan - kEps || (makespan < o.makespan + kEps && maxSpan < o.maxSpan - kEps);
  }
};

GreedyResult greedy(const Schedule &shape, int n, const Policy &pol) {
  const Problem &P = shape.problem;
  const int p = P.stages, v = P.chunks, V = shape.virtualStages();
  const double frac = P.wMemFrac;
  auto at = [V](int mb, int vs) { return (size_t)mb * V + vs; };
  std::vector<double> fEnd((size_t)n * V, kNaN);
  std::vector<int> nextF(V, 0);
  // perMb: what an admitted micro-batch keeps on the stage between its F and
  // its backward (the boundary share when the stage recomputes); headroom:
  // room kept free for one RECOMPUTE to re-materialize the rest.
  std::vector<double> held(p, 0), reserved(p, 0), perMb(p, 0), headroom(p, 0);
  for (int st = 0; st < p; ++st)
    for (int c = 0; c < v; ++c) {
      perMb[st] += P.restingActivationOf(st, c);
      headroom[st] = std::max(headroom[st], P.activationOf(st, c) - P.restingActivationOf(st, c));
    }
  // Per stage and local micro-batch: chunks started / backwarded.
  std::vector<std::vector<int>> started(p, std::vector<int>(n, 0)), bdone(p, std::vector<int>(n, 0));
  std::vector<int> inflight(p, 0);
  using BItem = std::tuple<double, int, int>; // ready, mb, -vs
  std::vector<std::priority_queue<BItem, std::vector<BItem>, std::greater<BItem>>> bReady(p);
  std::vector<std::vector<std::pair<int, int>>> wPending(p); // (mb, vs), FIFO via index
  std::vector<size_t> wHead(p, 0);
  using Ev = std::pair<double, int>;
  std::priority_queue<Ev, std::vector<Ev>, std::greater<Ev>> events;
  std::vector<double> busyUntil(p, 0);
  std::vector<char> lastWasF(p, 0);
  std::vector<double> firstStart(p, 0), lastEnd(p, 0);
  GreedyResult res;
  res.order.assign(p, {});
  long remaining = (long)n * V * (pol.split ? 3 : 2);
  for (int st = 0; st < p; ++st)
    events.push({0.0, st});

  auto stageOf = [&](int vs) {
    int st, c;
    shape.locate(vs, st, c);
    return st;
  };
  auto fReady = [&](int vs) -> double {
    const int mb = nextF[vs];
    if (vs == 0)
      return 0.0;
    const double e = fEnd[at(mb, vs - 1)];
    return std::isnan(e) ? kNaN : e + (stageOf(vs - 1) != stageOf(vs) ? P.comm : 0.0);
  };

  while (remaining > 0) {
    if (events.empty())
      throw ScheduleError(shape.name + ": greedy scheduler stalled (memory limit too small?)");
    auto [t, st] = events.top();
    events.pop();
    if (t < busyUntil[st] - kEps)
      continue; // stale: the rank is busy
    Instr chosen{};
    bool have = false;
    auto takeW = [&]() {
      if (!have && wHead[st] < wPending[st].size()) {
        auto [mb, vs] = wPending[st][wHead[st]++];
        int s2, c;
        shape.locate(vs, s2, c);
        chosen = mk(Op::BwdWeight, mb, c);
        have = true;
      }
    };
    auto takeB = [&]() {
      if (!have && !bReady[st].empty() && std::get<0>(bReady[st].top()) <= t + kEps) {
        auto [rt, mb, nvs] = bReady[st].top();
        int s2, c;
        shape.locate(-nvs, s2, c);
        if (pol.memLimit > 0 && P.recomputes(st) &&
            held[st] + P.activationOf(st, c) - P.restingActivationOf(st, c) > pol.memLimit + kEps)
          return; // a pending W frees the room the RECOMPUTE needs
        bReady[st].pop();
        chosen = mk(pol.split ? Op::BwdInput : Op::Bwd, mb, c);
        lastWasF[st] = false;
        have = true;
      }
    };
    double wake = std::numeric_limits<double>::infinity();
    // The deepest ready, admissible F (with W first when eager).
    auto takeF = [&]() {
      if (have)
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
          wake = std::min(wake, rt);
          continue;
        }
        if (started[st][mb] == 0) { // admission of a new micro-batch
          if (inflight[st] >= pol.cap[st])
            continue;
          if (pol.memLimit > 0 && held[st] + reserved[st] + perMb[st] + headroom[st] > pol.memLimit + kEps)
            continue;
        } else if (pol.memLimit > 0 && held[st] + P.restingActivationOf(st, c) > pol.memLimit + kEps) {
          // Reserved, but a RECOMPUTE's re-materialized activations are still
          // held until their W: wait for the W (it fills the gap).
          continue;
        }
        if (pol.eagerW) {
          takeW();
          if (have)
            return;
        }
        chosen = mk(Op::Fwd, mb, c);
        lastWasF[st] = true;
        have = true;
        return;
      }
    };
    // A ready B goes first (critical path) unless we alternate and the last was a B.
    if (pol.alternate && !lastWasF[st]) {
      takeF();
      takeB();
    } else {
      takeB();
      takeF();
    }
    takeW(); // 4. fill the gap with a W
    if (!have) {
      if (!bReady[st].empty())
        wake = std::min(wake, std::get<0>(bReady[st].top()));
      busyUntil[st] = t;
      if (wake < std::numeric_limits<double>::infinity())
        events.push({wake, st});
      continue; // otherwise woken by a neighbour's progress
    }
    // Execute `chosen` at time t.
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
      break;
    }
  }
  for (int st = 0; st < p; ++st)
    res.maxSpan = std::max(res.maxSpan, lastEnd[st] - firstStart[st]);
  return res;
}

std::vector<int> capsLinear(int p, int n, double a, int b) {
  std::vector<int> cap(p);
  for (int st = 0; st < p; ++st)
    cap[st] = std::clamp((int)std::lround(a * (p - st) + b), 1, std::max(1, n));
  return cap;
}

double peakOf1F1B(const Problem &P) {
  // Units of memory 1F1B needs on its fullest rank (the zero-bubble paper's "p").
  double peak = 0;
  for (int st = 0; st < P.stages; ++st)
    peak = std::max(peak, std::min(P.stages - st, P.microbatches) * [&] {
      double a = 0;
      for (int c = 0; c < P.chunks; ++c)
        a += P.activationOf(st, c);
      return a;
    }());
  return peak;
}

// The automatic schedule: search greedy policies (in-flight caps, W
// placement), keep the lowest makespan; then improve per-stage caps by
// coordinate descent. Every candidate obeys the memory limit by construction.
Orders autoOrder(const Schedule &shape, int n, double limit) {
  const int p = shape.problem.stages;
  GreedyResult best;
  best.makespan = std::numeric_limits<double>::infinity();
  Policy bestPol;
  auto tryPolicy = [&](const Policy &pol) {
    GreedyResult r = greedy(shape, n, pol);
    if (r.betterThan(best)) {
      best = std::move(r);
      bestPol = pol;
    }
  };
  for (bool alternate : {true, false})
    for (bool eager : {false, true}) {
      for (double a : {1.0, 1.5, 2.0, 3.0})
        for (int b : {-1, 0, 1})
          tryPolicy(Policy{capsLinear(p, n, a, b), limit, true, eager, alternate});
      tryPolicy(Policy{std::vector<int>(p, std::max(1, n)), limit, true, eager, alternate});
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
        tryPolicy(pol);
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
  if ((limit <= 0 || e.peak <= limit + kEps) &&
      (e.makespan < best.makespan - kEps || (e.makespan < best.makespan + kEps && e.maxSpan < best.maxSpan - kEps)))
    return h1;
  return best.order;
}

// ------------------------------------------------------------ 1F1B-RR
Orders pipedreamOrder(const Schedule &s) {
  const Problem &P = s.problem;
  Orders orders(P.numRanks());
  for (int st = 0; st < P.stages; ++st) {
    const int R = P.replicasOf(st);
    if (R > 1 && P.microbatches % R != 0) {
      // The nearest valid counts: multiples of every stage's replica count.
      long all = 1;
      for (int t = 0; t < P.stages; ++t)
        all = std::lcm(all, (long)P.replicasOf(t));
      const long below = P.microbatches / all * all, above = below + all;
      throw ScheduleError("1f1b-rr: micro-batches (" + std::to_string(P.microbatches) +
                          ") must be a multiple of stage " + std::to_string(st) + "'s replicas (" +
                          std::to_string(R) + ") so that replicas all-reduce in lock step; " +
                          "nearest valid counts: " +
                          (below > 0 ? std::to_string(below) + " or " : std::string()) +
                          std::to_string(above));
    }
    int downstream = 0;
    for (int t = st; t < P.stages; ++t)
      downstream += P.replicasOf(t);
    // Stage 0 admits inFlight micro-batches per replica; a later stage needs
    // at most one per worker downstream of it, shared by its replicas.
    const int cap = std::max(1, std::min(P.inFlight, (downstream + R - 1) / R));
    for (int rep = 0; rep < R; ++rep) {
      std::vector<int> mine;
      for (int mb = rep; mb < P.microbatches; mb += R)
        mine.push_back(mb);
      auto &o = orders[P.rankOf(st, rep)];
      const int warm = std::min<int>(st == 0 ? P.inFlight : cap, (int)mine.size());
      size_t f = 0;
      while ((int)f < warm)
        o.push_back(mk(Op::Fwd, mine[f++], 0));
      for (size_t b = 0; b < mine.size(); ++b) {
        o.push_back(mk(Op::Bwd, mine[b], 0));
        if (R > 1)
          o.push_back(mk(Op::AllReduce, -1, -1, st));
        o.push_back(mk(Op::Step)); // asynchronous: update per micro-batch
        if (f < mine.size())
          o.push_back(mk(Op::Fwd, mine[f++], 0));
      }
    }
  }
  return orders;
}

// ------------------------------------------------------------ vertical sync
// PipeDream's vertical sync for 1F1B-RR. A weight version is named by the
// number of micro-batches whose gradients it contains: a rank of a stage with
// R replicas is at version R*k after its k-th STEP (replicas all-reduce every
// step, so they agree). A micro-batch's entry version V(mb) is the version of
// its stage-0 rank when its FWD runs there; stage s computes the micro-batch
// with w(mb, s) = R_s * floor(V / R_s), its newest version containing no
// micro-batch that stage 0 had not applied (w = V when R_s = 1).
// Each rank's stream is rewritten:
//  * right after the STEP that creates version k (at the start for k = 0):
//    STASH(mb, version=k) for every micro-batch it will run with version k;
//  * RESTORE(mb, version=w) before its FWD, and before its BWD (before its
//    RECOMPUTE when the stage recomputes): load the kept version;
//  * SEND_ACT/RECV_ACT carry version=V(mb), the tag travelling with the activation;
//  * the BWD releases the micro-batch's kept version.
void applyVerticalSync(Schedule &s) {
  const Problem &P = s.problem;
  const int m = P.microbatches;
  std::vector<int> entry(m, -1);
  for (int rep = 0; rep < P.replicasOf(0); ++rep) {
    int steps = 0;
    for (const Instr &in : s.ranks[P.rankOf(0, rep)]) {
      if (in.op == Op::Step)
        ++steps;
      if (in.op == Op::Fwd)
        entry[in.mb] = steps * P.replicasOf(0);
    }
  }
  for (int r = 0; r < P.numRanks(); ++r) {
    const int st = P.stageOfRank(r), R = P.replicasOf(st);
    std::map<int, std::vector<int>> pins; // version -> micro-batches
    std::vector<int> use(m, -1);
    for (const Instr &in : s.ranks[r])
      if (in.op == Op::Fwd) {
        use[in.mb] = R * (entry[in.mb] / R);
        pins[use[in.mb]].push_back(in.mb);
      }
    std::vector<Instr> out;
    int version = 0;
    auto pinNow = [&] {
      for (int mb : pins[version]) {
        Instr x = mk(Op::Stash, mb);
        x.version = version;
        out.push_back(x);
      }
      pins.erase(version);
    };
    auto restore = [&](int mb) {
      Instr x = mk(Op::Restore, mb);
      x.version = use[mb];
      out.push_back(x);
    };
    pinNow();
    for (Instr in : s.ranks[r]) {
      if (in.op == Op::Stash || in.op == Op::Restore)
        continue;
      if (in.op == Op::Fwd || in.op == Op::Recompute || (in.op == Op::Bwd && !P.recomputes(st)))
        restore(in.mb);
      if (in.op == Op::SendAct || in.op == Op::RecvAct)
        in.version = entry[in.mb];
      out.push_back(in);
      if (in.op == Op::Step) {
        version += R;
        pinNow();
      }
    }
    if (!pins.empty())
      throw ScheduleError("1f1b-rr vertical sync: rank " + std::to_string(r) + " needs weight version " +
                          std::to_string(pins.begin()->first) + " that it never reaches");
    s.ranks[r] = std::move(out);
  }
}

} // namespace

std::vector<std::string> scheduleNames() {
  return {"gpipe", "1f1b", "1f1b-rr", "interleaved", "zb-h1", "zb-h2", "zb-v", "auto"};
}

Schedule generate(const std::string &name, const Problem &problemIn) {
  Problem problem = problemIn;
  const int p = problem.stages;
  Schedule s;
  auto linear = [&](bool split, bool async) {
    if (problem.chunks != 1)
      throw ScheduleError(name + " has one chunk per rank; --chunks " +
                          std::to_string(problem.chunks) + " applies to interleaved");
    problem.check();
    return shell(name, problem, Placement::Interleaved, split, async);
  };
  Orders orders;
  if (name == "gpipe" || name == "1f1b" || name == "zb-h1") {
    const bool h1 = name == "zb-h1";
    s = linear(h1, false);
    // One pattern per stage for every replica: with the same replica count
    // on every stage this is the textbook schedule on each replica pipeline.
    const int warm0 = warmupOf(problem, 0);
    orders = assemblePerReplica(
        s,
        [&](int st, int n) {
          if (name == "gpipe")
            return gpipeStage(n);
          const int warm = warmupOf(problem, st);
          return h1 ? zbH1Stage(warm, std::max(0, warm0 - warm), n) : oneF1BStage(warm, n);
        },
        false);
  } else if (name == "interleaved") {
    problem.check();
    requireUniformReplicas(problem, name);
    s = shell(name, problem, Placement::Interleaved, false, false);
    orders = assemble(s, [&](int n) { return interleavedOrder(p, problem.chunks, n); }, false);
  } else if (name == "1f1b-rr") {
    if (problem.inFlight == 0)
      problem.inFlight = problem.defaultInFlight();
    s = linear(false, true);
    orders = pipedreamOrder(s);
  } else if (name == "zb-h2") {
    s = linear(true, false);
    double unit = 0; // largest activation of one micro-batch on one stage
    for (int st = 0; st < p; ++st) {
      double a = 0;
      for (int c = 0; c < problem.chunks; ++c)
        a += problem.activationOf(st, c);
      unit = std::max(unit, a);
    }
    if (uniformReplicas(problem)) {
      // The list scheduler with 2(p-s)-1 in flight on stage s and memory 2p-1.
      orders = assemble(
          s,
          [&](int n) {
            Policy pol{capsLinear(p, n, 2.0, -1), (2 * p - 1) * unit, true, false, true};
            return greedy(s, n, pol).order;
          },
          true);
    } else {
      // Per-stage replicas: ZB-H1's pattern with twice its warm-up on every
      // replica (H2's 2(p-s)-1 in flight for one replica per stage).
      const int warm0 = 2 * warmupOf(problem, 0);
      orders = assemblePerReplica(
          s,
          [&](int st, int n) {
            const int warm = 2 * warmupOf(problem, st);
            return zbH1Stage(warm, warm0 - warm, n);
          },
          true);
    }
  } else if (name == "zb-v") {
    if (problem.chunks != 1 && problem.chunks != 2)
      throw ScheduleError("zb-v places exactly two chunks per rank");
    problem.chunks = 2;
    problem.check();
    requireUniformReplicas(problem, name);
    s = shell(name, problem, Placement::VShape, true, false);
    const double limit = problem.memoryLimit > 0 ? problem.memoryLimit : peakOf1F1B(problem);
    orders = assemble(
        s,
        [&](int n) {
          // Memory is the only admission rule; keep the better F/B/W priority.
          GreedyResult best;
          best.makespan = std::numeric_limits<double>::infinity();
          for (bool alternate : {true, false})
            for (bool eager : {false, true}) {
              GreedyResult r = greedy(s, n, Policy{std::vector<int>(p, std::max(1, n)), limit, true, eager, alternate});
              if (r.betterThan(best))
                best = std::move(r);
            }
          return best.order;
        },
        false);
  } else if (name == "auto") {
    s = linear(true, false);
    const double limit = problem.memoryLimit > 0 ? problem.memoryLimit : peakOf1F1B(problem);
    if (uniformReplicas(problem)) {
      orders = assemble(s, [&](int n) { return autoOrder(s, n, limit); }, false);
    } else {
      // Per-stage replicas: the list scheduler models one pipeline; ZB-H1's
      // pattern on every replica (auto's fallback candidate) instead.
      const int warm0 = warmupOf(problem, 0);
      orders = assemblePerReplica(
          s,
          [&](int st, int n) {
            const int warm = warmupOf(problem, st);
            return zbH1Stage(warm, warm0 - warm, n);
          },
          false);
    }
  } else {
    std::string all;
    for (const auto &n : scheduleNames())
      all += (all.empty() ? "" : ", ") + n;
    throw ScheduleError("unknown schedule '" + name + "' (known: " + all + ")");
  }
  if (problem.verticalSync && name != "1f1b-rr")
    throw ScheduleError("--vertical-sync applies to 1f1b-rr only (" + name + " is synchronous)");
  lower(s, withRecompute(s, orders));
  if (problem.verticalSync)
    applyVerticalSync(s);
  ValidationReport rep = validate(s);
  if (!rep.ok())
    throw ScheduleError(name + ": generated schedule is invalid:\n" + rep.summary());
  return s;
}

} // namespace pipec::schedule
