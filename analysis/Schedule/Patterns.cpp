// Handcrafted compute orders: GPipe, 1F1B and ZB-H1 per stage, Megatron-LM's
// interleaved 1F1B per pipeline, and PipeDream's 1F1B-RR per rank
// (docs/schedules.md).
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace pipec::schedule::detail {

// ------------------------------------------------------------ replicas
std::vector<int> microbatchesOfReplica(const Problem &P, int st, int rep) {
  std::vector<int> mine;
  for (int mb = rep; mb < P.microbatches; mb += P.replicasOf(st))
    mine.push_back(mb);
  return mine;
}

int warmupOf(const Problem &P, int st) {
  long downstream = 0;
  for (int t = st; t < P.stages; ++t)
    downstream += P.replicasOf(t);
  const long r = P.replicasOf(st);
  return (int)((downstream + r - 1) / r) - 1;
}

// ------------------------------------------------------------ stage patterns
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
    // Stage 0 admits inFlight micro-batches per replica; a later stage needs
    // at most one per worker downstream of it, shared by its replicas (NOAM).
    const int cap = std::max(1, std::min(P.inFlight, warmupOf(P, st) + 1));
    for (int rep = 0; rep < R; ++rep) {
      const std::vector<int> mine = microbatchesOfReplica(P, st, rep);
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

} // namespace pipec::schedule::detail
