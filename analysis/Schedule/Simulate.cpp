// Simulator: times the instruction streams with the cost model.
//
// Semantics: compute runs on one stream per rank; sends are posted to a
// separate communication stream and do not stall compute; a receive is
// posted where the stream has it and does not stall compute either: the
// compute that reads the data (the FWD of a RECV_ACT, the BWD/BWD_INPUT of a
// RECV_GRAD) waits until it arrived, `comm` after its send. So a rank idles
// only when its next compute lacks data, never at a receive with ready work
// behind it (piperun posts receives the same way: docs/runtime.md).
// Collectives start when their last member arrives. Memory follows the order
// of the stream. A paired F&B runs as one compute of Problem::pairCostOf once
// both its inputs arrived; its activation counts before the backward frees.
#include "analysis/Schedule/Schedule.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace pipec::schedule {

SimResult simulate(const Schedule &s) {
  const Problem &P = s.problem;
  P.check();
  const int R = P.numRanks(), V = s.virtualStages();
  if ((int)s.ranks.size() != R)
    throw ScheduleError("simulate: rank count does not match the problem");
  SimResult res;
  res.peakMemory.assign(R, 0);
  res.peakStashed.assign(R, 0);
  res.rankCompute.assign(R, 0);
  res.rankFirst.assign(R, std::numeric_limits<double>::infinity());
  res.rankLast.assign(R, 0);

  using MsgKey = std::tuple<bool, int, int, int>; // grad, mb, vsRecv, dst
  std::map<MsgKey, std::pair<double, int>> sent; // send time, src
  std::set<MsgKey> posted;                        // receives posted, data not yet consumed
  std::map<std::pair<int, int>, std::pair<int, double>> colls; // (group, seq) -> arrived, max time
  std::vector<size_t> pc(R, 0);
  std::vector<double> now(R, 0), mem(R, 0);
  std::vector<int> stash(R, 0), arSeq(R, 0), valSeq(R, 0), registered(R, -1);
  std::vector<std::map<int, int>> pins(R); // vertical sync: mb -> kept version

  // Activation memory a compute adds (negative: frees) on a rank of `stage`.
  auto memoryChange = [&P](const Instr &in, int stage) {
    const double a = P.activationOf(stage, in.chunk);
    const double rest = P.restingActivationOf(stage, in.chunk); // < a when recomputed
    switch (in.op) {
    case Op::Fwd: return rest;
    case Op::Recompute: return a - rest;
    case Op::Bwd: return -a;
    case Op::BwdInput: return -a * (1 - P.wMemFrac);
    case Op::BwdWeight: return -a * P.wMemFrac;
    default: return 0.0;
    }
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      const int stage = P.stageOfRank(r);
      while (pc[r] < s.ranks[r].size()) {
        const Instr &in = s.ranks[r][pc[r]];
        const int vs = in.chunk >= 0 ? s.virtualStage(stage, in.chunk) : -1;
        double start = now[r], cost = 0;
        // The compute that reads a posted receive's data waits for it; a
        // paired forward (F&B) waits for its backward's data too.
        const Instr *partner = in.paired ? pairedBackward(s.ranks[r], pc[r]) : nullptr;
        if (in.paired && !partner)
          throw ScheduleError("simulate: rank " + std::to_string(r) + " #" + std::to_string(pc[r]) + " " +
                              toString(in) + " is paired, but no backward follows it");
        MsgKey reads[2];
        int readCount = 0;
        for (const Instr *x : {&in, partner})
          if (x && (x->op == Op::Fwd || x->op == Op::Bwd || x->op == Op::BwdInput))
            if (const MsgKey key{x->op != Op::Fwd, x->mb, s.virtualStage(stage, x->chunk), r}; posted.count(key))
              reads[readCount++] = key;
        bool arrived = true;
        for (int k = 0; k < readCount; ++k)
          arrived = arrived && sent.count(reads[k]);
        if (!arrived)
          break; // a send has not been posted yet
        for (int k = 0; k < readCount; ++k) {
          const MsgKey &key = reads[k];
          auto it = sent.find(key);
          const double arrival = it->second.first + P.comm;
          start = std::max(start, arrival);
          res.transfers.push_back({it->second.second, r, std::get<1>(key), std::get<0>(key), it->second.first, arrival});
          sent.erase(it);
          posted.erase(key);
        }
        if (partner) {
          // One compute of the pair's time; each half drawn in proportion.
          const double f = P.costOf(Op::Fwd, stage, in.chunk), b = P.costOf(partner->op, stage, partner->chunk);
          const double pairCost = P.pairCostOf(stage, in.chunk, partner->op, partner->chunk);
          const double split = start + pairCost * f / (f + b);
          res.rankCompute[r] += pairCost;
          res.rankFirst[r] = std::min(res.rankFirst[r], start);
          res.rankLast[r] = std::max(res.rankLast[r], start + pairCost);
          mem[r] += memoryChange(in, stage);
          res.peakMemory[r] = std::max(res.peakMemory[r], mem[r]);
          mem[r] += memoryChange(*partner, stage);
          res.intervals.push_back({r, in, start, split});
          res.intervals.push_back({r, *partner, split, start + pairCost});
          now[r] = start + pairCost;
          res.makespan = std::max(res.makespan, now[r]);
          pc[r] += 2;
          progress = true;
          continue;
        }
        if (in.op == Op::RecvAct || in.op == Op::RecvGrad) {
          posted.insert({in.op == Op::RecvGrad, in.mb, vs, r});
        } else if (in.op == Op::SendAct || in.op == Op::SendGrad) {
          const bool grad = in.op == Op::SendGrad;
          sent[{grad, in.mb, grad ? vs - 1 : vs + 1, in.peer}] = {now[r], r};
        } else if (isCollective(in.op)) {
          const bool ar = in.op == Op::AllReduce;
          auto &c = colls[{ar ? stage : -1, ar ? arSeq[r] : valSeq[r]}];
          if (registered[r] != (int)pc[r]) {
            registered[r] = (int)pc[r];
            c.first++;
            c.second = std::max(c.second, now[r]);
          }
          if (c.first < (ar ? P.replicasOf(stage) : R))
            break;
          (ar ? arSeq : valSeq)[r]++;
          start = c.second;
          cost = P.allreduceCost;
        } else if (isCompute(in.op)) {
          cost = P.costOf(in.op, stage, in.chunk);
          res.rankCompute[r] += cost;
          res.rankFirst[r] = std::min(res.rankFirst[r], start);
          res.rankLast[r] = std::max(res.rankLast[r], start + cost);
          mem[r] += memoryChange(in, stage);
          res.peakMemory[r] = std::max(res.peakMemory[r], mem[r]);
        } else if (in.op == Op::Step || in.op == Op::SpecStep) {
          cost = P.stepCost;
        } else if (in.op == Op::Stash && P.verticalSync) {
          // Vertical sync: count distinct kept versions (micro-batches share them).
          pins[r][in.mb] = in.version;
          std::set<int> versions;
          for (auto &kv : pins[r])
            versions.insert(kv.second);
          res.peakStashed[r] = std::max(res.peakStashed[r], (int)versions.size());
        } else if (in.op == Op::Stash) {
          res.peakStashed[r] = std::max(res.peakStashed[r], ++stash[r]);
        } else if (in.op == Op::Restore && !P.verticalSync) {
          stash[r]--;
        }
        if (in.op == Op::Bwd && P.verticalSync)
          pins[r].erase(in.mb);
        if (isCompute(in.op) || isCollective(in.op) || in.op == Op::Step || in.op == Op::SpecStep)
          res.intervals.push_back({r, in, start, start + cost});
        now[r] = start + cost;
        res.makespan = std::max(res.makespan, now[r]);
        pc[r]++;
        progress = true;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    if (pc[r] < s.ranks[r].size())
      throw ScheduleError("simulate: rank " + std::to_string(r) + " #" + std::to_string(pc[r]) + " " +
                          toString(s.ranks[r][pc[r]]) + " never completes (missing send or deadlock)");
  (void)V;
  for (int r = 0; r < R; ++r) {
    res.totalCompute += res.rankCompute[r];
    res.maxRankCompute = std::max(res.maxRankCompute, res.rankCompute[r]);
    if (res.rankCompute[r] > 0)
      res.maxSpan = std::max(res.maxSpan, res.rankLast[r] - res.rankFirst[r]);
    else
      res.rankFirst[r] = 0;
    res.maxPeakMemory = std::max(res.maxPeakMemory, res.peakMemory[r]);
  }
  if (res.makespan > 0) {
    res.bubbleFlush = 1.0 - res.totalCompute / (R * res.makespan);
    res.bubbleSteady = res.maxSpan > 0 ? (res.maxSpan - res.maxRankCompute) / res.maxSpan : 0;
    res.bubbleOverIdeal = res.maxRankCompute > 0 ? res.makespan / res.maxRankCompute - 1.0 : 0;
  }
  return res;
}

} // namespace pipec::schedule
