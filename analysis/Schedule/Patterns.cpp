// Handcrafted compute orders: GPipe, 1F1B and ZB-H1 per stage, Megatron-LM's
// interleaved 1F1B per pipeline, and PipeDream's 1F1B-RR per rank
// (docs/schedules.md).
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <cassert>
#include <deque>
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

// ------------------------------------------------------------ DualPipeV
// DeepSeek's DualPipeV (deepseek-ai/DualPipe, dualpipev.py, as PyTorch's
// ScheduleDualPipeV orders it) on rank r of p, chunk 0 = virtual stage r and
// chunk 1 = 2p-1-r. Each chunk's forwards and backwards run in micro-batch
// order; "zero bubble" backwards are split, their W's queued and run where
// the reference runs a weight step. The steps:
//   1. 2(p-r-1) forwards of chunk 0           5. p-r-1 times: B1, then F1&B0
//   2. r+1 times: F0, F1                      6. r+1 times: B1, B0 (split from the middle on)
//   3. p-r-1 times: B1 split, its W, F1       7. p-r-1 times: a queued W, B0 split
//   4. n-2p+r+1 times: F0&B1, F1&B0           8. r+1 queued W's
// The last rank runs its first F0&B1 as F0, then B1: B1 there would wait
// for nothing the pair could hide (the reference's note).
Orders dualPipeVOrder(int p, int n) {
  assert(n >= 2 * p && "generate() checks the family's micro-batches per rank");
  Orders o(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Instr> &out = o[r];
    int forwards[2] = {0, 0}, backwards[2] = {0, 0};
    std::deque<Instr> weights;
    auto forward = [&](int chunk, bool paired = false) {
      Instr in = mk(Op::Fwd, forwards[chunk]++, chunk);
      in.paired = paired;
      out.push_back(in);
    };
    auto backward = [&](int chunk, bool split) {
      const int mb = backwards[chunk]++;
      out.push_back(mk(split ? Op::BwdInput : Op::Bwd, mb, chunk));
      if (split)
        weights.push_back(mk(Op::BwdWeight, mb, chunk));
    };
    auto weight = [&] {
      assert(!weights.empty() && "every W step of DualPipeV follows a split backward");
      out.push_back(weights.front());
      weights.pop_front();
    };
    auto pair = [&](int forwardChunk, int backwardChunk) {
      forward(forwardChunk, true);
      backward(backwardChunk, false);
    };
    const int down = p - r - 1;
    for (int i = 0; i < 2 * down; ++i)
      forward(0);
    for (int i = 0; i < r + 1; ++i)
      forward(0), forward(1);
    for (int i = 0; i < down; ++i)
      backward(1, true), weight(), forward(1);
    for (int i = 0; i < n - 2 * p + r + 1; ++i) {
      if (i == 0 && r == p - 1)
        forward(0), backward(1, false);
      else
        pair(0, 1);
      pair(1, 0);
    }
    for (int i = 0; i < down; ++i)
      backward(1, false), pair(1, 0);
    bool split = false;
    for (int i = 0; i < r + 1; ++i) {
      split = split || (i == (r + 1) / 2 && r % 2 == 1);
      backward(1, split);
      split = split || (i == (r + 1) / 2 && r % 2 == 0);
      backward(0, split);
    }
    for (int i = 0; i < down; ++i)
      weight(), backward(0, true);
    while (!weights.empty())
      weight();
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
