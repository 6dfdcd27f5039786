// Lowering compute orders to instruction streams.
//
// Every generator first decides the order of the compute instructions on each
// rank (FWD/BWD/BWD_INPUT/BWD_WEIGHT plus the optimizer tail). lower() then
// inserts LOAD, the point-to-point transfers and STASH/RESTORE. To make the
// transfers deadlock-free under blocking rendezvous semantics, lower() times
// the compute order once and sorts every rank's stream by one global key
// (time, class, id) that a send and its receive share: the pending
// instruction with the smallest key is then always at the head of its rank,
// and so is its partner, so some instruction can always proceed.
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pipec::schedule::detail {

// ------------------------------------------------------------ timing an order
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
        // The data a forward reads (the previous virtual stage's output) or
        // a backward reads (its forward, the next virtual stage's gradient).
        auto needInputs = [&](const Instr &x) {
          const int xvs = s.virtualStage(stage, x.chunk);
          if (x.op == Op::Fwd) {
            if (xvs > 0)
              need(fEnd[at(x.mb, xvs - 1)], s.rankFor(xvs - 1, x.mb) != r);
            return;
          }
          need(fEnd[at(x.mb, xvs)], false);
          if (xvs + 1 < V)
            need(bEnd[at(x.mb, xvs + 1)], s.rankFor(xvs + 1, x.mb) != r);
        };
        if (in.paired) {
          // DualPipeV's F&B: one compute once both inputs are in; both
          // results are out when it ends.
          const Instr *partner = pairedBackward(orders[r], pc[r]);
          if (!partner)
            throw ScheduleError(s.name + ": rank " + std::to_string(r) + " #" + std::to_string(pc[r]) + " " +
                                toString(in) + " is paired, but no backward follows it");
          const Instr &b = *partner;
          const int vsB = s.virtualStage(stage, b.chunk);
          needInputs(in);
          needInputs(b);
          if (!ok)
            break;
          const double end = ready + P.pairCostOf(stage, in.chunk, b.op, b.chunk);
          for (int k = 0; k < 2; ++k) {
            T.start[r].push_back(ready);
            T.end[r].push_back(end);
          }
          now[r] = end;
          fEnd[at(in.mb, vs)] = end;
          bEnd[at(b.mb, vsB)] = end;
          T.makespan = std::max(T.makespan, end);
          pc[r] += 2;
          progress = true;
          continue;
        }
        switch (in.op) {
        case Op::Fwd:
        case Op::Bwd:
        case Op::BwdInput:
          needInputs(in);
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
  // Zero-cost instructions (LOAD, STEP, a W of cost 0, ...) are timed at a
  // tiny duration so that each rank's keys keep its order: a millionth of the
  // cheapest compute, and never so little that adding it to a time within
  // the run (at most `horizon`) leaves the time unchanged (W = 1e-9 next to
  // F = 1 put a VALIDATE before its SPEC_STEP).
  double minCost = std::numeric_limits<double>::infinity(), horizon = 0;
  for (int st = 0; st < P.stages; ++st)
    for (int c = 0; c < P.chunks; ++c)
      for (Op op : {Op::Fwd, Op::BwdInput, Op::BwdWeight}) {
        const double cost = P.costOf(op, st, c);
        if (cost > 0)
          minCost = std::min(minCost, cost);
        horizon += cost * m * P.replicasOf(st);
      }
  horizon += (2.0 * m * V + R) * P.comm + (R + 2.0) * (P.allreduceCost + P.stepCost);
  const Timing T = timeOrder(s, orders, std::max(minCost * 1e-6, horizon * 1e-9));

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

// ------------------------------------------------------------ recompute
Orders withRecompute(const Schedule &s, Orders orders) {
  const Problem &P = s.problem;
  for (size_t r = 0; r < orders.size(); ++r) {
    if (!P.recomputes(P.stageOfRank((int)r)))
      continue;
    std::vector<Instr> out;
    out.reserve(orders[r].size() * 4 / 3 + 1);
    for (const Instr &in : orders[r]) {
      if (in.op == Op::Bwd || in.op == Op::BwdInput) {
        // Before a paired forward when the backward is its partner: nothing
        // comes between the two of an F&B.
        const Instr recompute = mk(Op::Recompute, in.mb, in.chunk);
        if (!out.empty() && out.back().paired)
          out.insert(out.end() - 1, recompute);
        else
          out.push_back(recompute);
      }
      out.push_back(in);
    }
    orders[r] = std::move(out);
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

} // namespace pipec::schedule::detail
