// The zero-bubble papers' V orders, our own implementation of their
// published heuristics: ZB-V's greedy with its approved-bubble search (Qi et
// al., "Zero Bubble Pipeline Parallelism", ICLR 2024) and the repeating
// V-Half and V-Min patterns of "Pipeline Parallelism with Controllable
// Memory" (Qi et al. 2024), as is and squeezed the way that paper turns a
// pattern into a schedule, and the V's fixed pattern as the first paper
// draws it. They are candidates for zb-v: zbVOrder
// (ListScheduler.cpp) times each one, drops those over the memory limit and
// keeps the best (docs/schedules.md, "zb-v").
#include "analysis/Schedule/Orders.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <tuple>
#include <vector>

namespace pipec::schedule::detail {

namespace {

constexpr double kEps = 1e-9;
constexpr double kNotDone = -1.0; // end time of work not placed yet (times are >= 0)

// The papers number a rank's two chunks in the order its work meets them: a
// forward's "lane" is its model chunk, a backward's (and its W's) lane 0 is
// model chunk 1, which the backward reaches first. Lane 0 flows from rank
// r-1 to r, lane 1 from rank r+1 to r, for forwards and backwards alike.
enum Kind { kF = 0, kB = 1, kW = 2 };

int modelChunk(Kind kind, int lane) { return kind == kF ? lane : 1 - lane; }

Op opOf(Kind kind) { return kind == kF ? Op::Fwd : kind == kB ? Op::BwdInput : Op::BwdWeight; }

// ------------------------------------------------------------ ZB-V's greedy
// One run of the greedy (the paper's heuristic for the V):
// warm-up forwards as memory and the first chunk-1 input allow, forwards
// balanced so every rank has more chunk-1 forwards than the one before it,
// then rounds of one B and one F per rank, W's filling the waits a B or F
// would otherwise idle through, and the W's left over at the end. A rank's
// idle time after its first forward is its "bubble"; `approved` (from a
// previous run) lets a rank idle up to the worst rank's bubble instead of
// filling the gap with a W. Gets stuck (yields nothing) where the reference
// would fail an assertion: a dependency not placed, memory with no W to free.
class ZbVGreedy {
public:
  ZbVGreedy(const Problem &P, int n, double memBudget, bool fillF, bool fillB, const std::vector<double> &approved)
      : P(P), p(P.stages), n(n), memBudget(memBudget), fillF(fillF), fillB(fillB), approved(approved),
        count(p, std::array<int, 6>{}), endTime((size_t)6 * p * n, kNotDone), now(p, 0), mem(p, 0), bubble(p, 0),
        pendingW(p), order(p) {
    maxApproved = approved.empty() ? -1 : *std::max_element(approved.begin(), approved.end());
  }

  // The per-rank order, or an empty one when the greedy got stuck.
  Orders run() {
    if (!warmUp() || !balanceForwards() || !steadyRounds())
      return {};
    for (int r = 0; r < p; ++r)
      while (!pendingW[r].empty())
        if (!putW(r))
          return {};
    return order;
  }
  double maxBubble() const { return *std::max_element(bubble.begin(), bubble.end()); }
  const std::vector<double> &bubbles() const { return bubble; }

private:
  size_t id(Kind kind, int lane, int rank, int mb) const {
    return (((size_t)kind * 2 + lane) * p + rank) * n + mb;
  }
  int &counted(int rank, Kind kind, int lane) { return count[rank][kind * 2 + lane]; }
  double costOf(Kind kind, int rank, int lane) const { return P.costOf(opOf(kind), rank, modelChunk(kind, lane)); }
  double memDelta(Kind kind, int rank, int lane) const {
    const double a = P.activationOf(rank, modelChunk(kind, lane));
    return kind == kF ? a : kind == kB ? -a * (1 - P.wMemFrac) : -a * P.wMemFrac;
  }
  // The end-time slot of the work on the neighbouring rank this F or B of
  // `mb` waits for, or -1 when its input is local (or it has none).
  long crossDependency(Kind kind, int lane, int rank, int mb) const {
    if (kind == kW)
      return -1;
    if (lane == 1 && rank + 1 < p)
      return (long)id(kind, 1, rank + 1, mb);
    if (lane == 0 && rank > 0)
      return (long)id(kind, 0, rank - 1, mb);
    return -1;
  }
  bool done(long slot) const { return slot >= 0 && endTime[(size_t)slot] >= 0; }

  bool put(Kind kind, int lane, int rank) {
    const int mb = counted(rank, kind, lane);
    if (mb >= n || mem[rank] + memDelta(kind, rank, lane) > memBudget + kEps)
      return false;
    // Its local predecessor: F lane 1 after F lane 0, B lane 0 after F lane
    // 1, B lane 1 after B lane 0, a W after its B.
    if (kind != kF || lane != 0) {
      const size_t local = kind == kW ? id(kB, lane, rank, mb)
                                      : id(lane == 0 ? Kind(kind - 1) : kind, lane == 0 ? 1 : 0, rank, mb);
      if (endTime[local] < 0)
        return false;
    }
    const double cost = costOf(kind, rank, lane), noWait = now[rank] + cost;
    double end = noWait;
    if (const long dep = crossDependency(kind, lane, rank, mb); dep >= 0) {
      if (!done(dep))
        return false;
      end = std::max(end, endTime[(size_t)dep] + P.comm + cost);
    }
    if (counted(rank, kF, 0) > 0)
      bubble[rank] += end - noWait;
    endTime[id(kind, lane, rank, mb)] = end;
    now[rank] = end;
    mem[rank] += memDelta(kind, rank, lane);
    order[rank].push_back(mk(opOf(kind), mb, modelChunk(kind, lane)));
    if (kind == kB)
      pendingW[rank].push_back(lane);
    ++counted(rank, kind, lane);
    return true;
  }
  bool putW(int rank) {
    if (pendingW[rank].empty())
      return false;
    const int lane = pendingW[rank].front();
    pendingW[rank].pop_front();
    return put(kW, lane, rank);
  }
  // The bubble rank `rank` may still reach without exceeding the worst one
  // (or, on a rerun, what the previous run approved for it).
  double worstBubble(int rank) const {
    return std::max(maxBubble(), rank >= 0 && maxApproved >= 0 ? maxApproved - approved[rank] : 0.0);
  }
  // Before an F or B that waits for `dep`: W's that end before its input
  // arrives, then one more when the wait exceeds what the rank may idle.
  bool fillWait(int rank, long dep, bool fillLongWait) {
    if (dep < 0 || !done(dep))
      return true;
    const double arrival = endTime[(size_t)dep] + P.comm;
    while (!pendingW[rank].empty() && arrival >= now[rank] + costOf(kW, rank, pendingW[rank].front()))
      if (!putW(rank))
        return false;
    if (fillLongWait && !pendingW[rank].empty() && arrival - now[rank] > worstBubble(rank) - bubble[rank])
      return putW(rank);
    return true;
  }

  bool warmUp() {
    for (int r = 0; r < p; ++r)
      if (!put(kF, 0, r))
        return false;
    for (int r = p - 1; r >= 0; --r) {
      if (r + 1 < p) {
        // Until rank r+1's first chunk-1 forward arrives, ranks 0..r run more
        // chunk-0 forwards, keeping room for the chunk-1 work still to come.
        const double arrival = endTime[id(kF, 1, r + 1, 0)] + P.comm;
        const double room = std::max(P.activationOf(r, 0), P.activationOf(r, 1)) * (2 + 2 * r);
        while (mem[r] + room <= memBudget + kEps && now[r] + costOf(kF, r, 0) <= arrival + kEps &&
               counted(r, kF, 0) < n - r)
          for (int j = 0; j <= r; ++j)
            if (!put(kF, 0, j))
              return false;
      }
      if (!put(kF, 1, r))
        return false;
    }
    return true;
  }

  // Every rank gets at least the previous rank's forwards and more chunk-1
  // forwards than it, placed deepest rank first, alternating the lanes.
  bool balanceForwards() {
    int lane = 0, idleLanes = 0;
    for (int r = 1; r < p; ++r)
      while (count[r][0] + count[r][1] < count[r - 1][0] + count[r - 1][1] ||
             (count[r][1] <= count[r - 1][1] && count[r - 1][1] < n)) {
        bool placed = false;
        for (int j = p - 1; j >= r; --j)
          if (counted(j, kF, lane) < n) {
            if (!put(kF, lane, j))
              return false;
            placed = true;
          }
        idleLanes = placed ? 0 : idleLanes + 1;
        if (idleLanes == 2)
          return false;
        lane = 1 - lane;
      }
    return true;
  }

  // 2n rounds: one B per rank (lane-1 B's from the deepest rank up, then
  // lane-0 B's from rank 0 down, so each finds its input placed), then at
  // most one F per rank.
  bool steadyRounds() {
    for (int round = 0; round < 2 * n; ++round) {
      // A rank takes lane 1 when it is behind lane 0 and its input is placed
      // (or lane 0 is finished).
      std::vector<char> lane1(p, 0);
      for (int r = 0; r < p; ++r)
        lane1[r] = counted(r, kB, 1) < counted(r, kB, 0) &&
                   (r == p - 1 || done((long)id(kB, 1, r + 1, counted(r, kB, 1))) || counted(r, kB, 0) >= n);
      std::vector<std::pair<int, int>> bOrder; // (rank, lane)
      for (int r = p - 1; r >= 0; --r)
        if (lane1[r])
          bOrder.push_back({r, 1});
      for (int r = 0; r < p; ++r)
        if (!lane1[r])
          bOrder.push_back({r, 0});
      for (auto [r, lane] : bOrder)
        if (!fillWait(r, crossDependency(kB, lane, r, counted(r, kB, lane)), lane == 1 || fillB) ||
            !put(kB, lane, r))
          return false;
      for (int r = 0; r < p; ++r) {
        if (counted(r, kF, 1) >= n)
          continue;
        int lane = -1;
        if (counted(r, kF, 1) >= counted(r, kF, 0))
          lane = 0;
        else if (r == p - 1 || done((long)id(kF, 1, r + 1, counted(r, kF, 1))))
          lane = 1;
        else if (counted(r, kF, 0) < n && (r == 0 || done((long)id(kF, 0, r - 1, counted(r, kF, 0)))))
          lane = 0;
        if (lane < 0)
          continue;
        while (mem[r] + memDelta(kF, r, lane) > memBudget + kEps)
          if (!putW(r))
            return false;
        if (!fillWait(r, crossDependency(kF, lane, r, counted(r, kF, lane)), fillF) || !put(kF, lane, r))
          return false;
      }
    }
    return true;
  }

  const Problem &P;
  const int p, n;
  const double memBudget;
  const bool fillF, fillB;
  const std::vector<double> approved;
  double maxApproved = -1;
  std::vector<std::array<int, 6>> count; // per rank: (kind, lane) placed
  std::vector<double> endTime;
  std::vector<double> now, mem, bubble;
  std::vector<std::deque<int>> pendingW; // lanes of the B's whose W is pending, in B order
  Orders order;
};

// The paper's search: rerun with the bubbles of the last run approved while
// that lowers the worst bubble. Every run's order is a candidate.
void zbVGreedyRuns(const Problem &P, int n, double memBudget, bool fillF, bool fillB, std::vector<Orders> &out) {
  std::vector<double> approved;
  double worst = -1;
  for (int rerun = 0; rerun < 16; ++rerun) { // the bubbles strictly fall; bounded for safety
    ZbVGreedy greedy(P, n, memBudget, fillF, fillB, approved);
    Orders order = greedy.run();
    if (order.empty())
      return;
    out.push_back(std::move(order));
    if (worst >= 0 && greedy.maxBubble() >= worst - kEps)
      return;
    worst = greedy.maxBubble();
    approved = greedy.bubbles();
  }
}

// ------------------------------------------------------------ V-Half, V-Min
// "Pipeline Parallelism with Controllable Memory": every rank repeats a
// building block of 6 time slots per micro-batch; the offsets of the first
// micro-batch's F lane 0, F lane 1, B lane 0 and B lane 1 on rank r fix the
// memory (V-Half about half of 1F1B's, V-Min about a third). The order is
// the slots' order, with each empty slot taking the oldest pending W;
// lower() then times it. The paper's "squeeze" (below) then moves warm-up
// and cool-down work into earlier free slots.
using Offsets = std::array<int, 4>;

Offsets vHalfOffsets(int p, int r) {
  const int gap = p % 2 == 0 ? 3 : 0; // keeps the four lanes in distinct slots
  return {2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1, 6 * p + gap - r - 2};
}

Offsets vMinOffsets(int p, int r) {
  const int gap = p % 3 == 0 ? 2 : 0;
  return {r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1};
}

Orders patternOrder(int p, int n, Offsets (*offsets)(int, int)) {
  constexpr Kind kKinds[4] = {kF, kF, kB, kB};
  constexpr int kLanes[4] = {0, 1, 0, 1};
  Orders order(p);
  for (int r = 0; r < p; ++r) {
    const Offsets first = offsets(p, r);
    std::vector<std::tuple<int, int, int>> slots; // (slot, lane index, mb)
    for (int k = 0; k < 4; ++k)
      for (int mb = 0; mb < n; ++mb)
        slots.emplace_back(first[k] + 6 * mb, k, mb);
    std::sort(slots.begin(), slots.end());
    std::deque<Instr> pendingW;
    int slot = 0;
    for (auto [at, k, mb] : slots) {
      for (; slot < at && !pendingW.empty(); ++slot) {
        order[r].push_back(pendingW.front());
        pendingW.pop_front();
      }
      slot = std::max(slot, at) + 1;
      const int chunk = modelChunk(kKinds[k], kLanes[k]);
      order[r].push_back(mk(opOf(kKinds[k]), mb, chunk));
      if (kKinds[k] == kB)
        pendingW.push_back(mk(Op::BwdWeight, mb, chunk));
    }
    order[r].insert(order[r].end(), pendingW.begin(), pendingW.end());
  }
  return order;
}

// ------------------------------------------------------------ the squeeze
// The step of "Pipeline Parallelism with Controllable Memory" that turns a
// repeating pattern into a schedule: in a grid of unit time slots, work of
// the warm-up and the cool-down moves to the earliest free slot of its rank
// after its dependencies that keeps the rank's memory within the pattern's
// peak; then the slots are re-timed as soon as possible. First with the W's
// placed in the empty slots (so F's of the warm-up can pass them), then once
// more without them (cool-down only), then the W's go into the empty slots
// again. The result is one per-rank order; evalOrder times it with the real
// costs. Slot lists per rank: kTypes lanes (F lane 0, F lane 1, B lane 0,
// B lane 1, W), each indexed by its k-th micro-batch (lanes run in
// micro-batch order).
constexpr int kTypes = 5, kWType = 4;
using Slots = std::array<std::vector<int>, kTypes>;

int lastSlot(const Slots &rank) {
  int last = 0;
  for (const auto &lane : rank)
    for (int t : lane)
      last = std::max(last, t);
  return last;
}

// Fills the W lane: after each B (of either lane) one W waits; every empty
// slot takes one, the rest follow the last slot.
void placeWs(Slots &rank) {
  rank[kWType].clear();
  const int last = lastSlot(rank);
  std::vector<char> kind(last + 1, -1);
  for (int k = 0; k < 4; ++k)
    for (int t : rank[k])
      kind[t] = (char)k;
  int pending = 0, t = 0;
  for (; t <= last; ++t)
    if (kind[t] >= 2)
      ++pending;
    else if (kind[t] < 0 && pending > 0)
      rank[kWType].push_back(t), --pending;
  for (; pending > 0; --pending)
    rank[kWType].push_back(t++);
}

// Peak memory in forwards (+1 per F, -1 per W); with `explicitW` false the
// W's are implicit: each empty slot frees one pending B's memory.
int peakUnits(const Slots &rank, bool explicitW) {
  const int last = lastSlot(rank);
  std::vector<char> kind(last + 1, -1);
  for (int k = 0; k < (explicitW ? kTypes : 4); ++k)
    for (int t : rank[k])
      kind[t] = (char)k;
  int cur = 0, peak = 0, pending = 0;
  for (int t = 0; t <= last; ++t) {
    if (kind[t] == 0 || kind[t] == 1)
      ++cur;
    else if (kind[t] == kWType)
      --cur;
    else if (kind[t] >= 2)
      ++pending;
    else if (!explicitW && pending > 0)
      --cur, --pending;
    peak = std::max(peak, cur);
  }
  return peak;
}

struct Element {
  int slot, rank, type, k;
  bool operator<(const Element &o) const {
    return std::tie(slot, rank, type, k) < std::tie(o.slot, o.rank, o.type, o.k);
  }
};

// All elements of `s` in slot order (ties: rank, lane, micro-batch).
std::vector<Element> inSlotOrder(const std::vector<Slots> &s, int types) {
  std::vector<Element> all;
  for (int r = 0; r < (int)s.size(); ++r)
    for (int t = 0; t < types; ++t)
      for (int k = 0; k < (int)s[r][t].size(); ++k)
        all.push_back({s[r][t][k], r, t, k});
  std::sort(all.begin(), all.end());
  return all;
}

// The slot an element must follow: its input on the neighbouring rank
// (F and B lane 0 from rank r-1, lane 1 from rank r+1), its previous lane
// on the rank (F lane 1 after F lane 0, B lane 0 after F lane 1, B lane 1
// after B lane 0), the previous micro-batch of its lane, and for a W (when
// `wAfterB`) the k-th B of the rank. `at(r, type, k)` reads a slot.
template <class At>
int dependencySlot(const std::vector<Slots> &s, const Element &e, bool wAfterB, At at) {
  const int p = (int)s.size();
  int dep = -1;
  if ((e.type == 0 || e.type == 2) && e.rank > 0)
    dep = std::max(dep, at(e.rank - 1, e.type, e.k));
  if ((e.type == 1 || e.type == 3) && e.rank + 1 < p)
    dep = std::max(dep, at(e.rank + 1, e.type, e.k));
  if (e.type > 0 && e.type < kWType)
    dep = std::max(dep, at(e.rank, e.type - 1, e.k));
  if (e.type == kWType && wAfterB) {
    std::vector<int> bs(s[e.rank][2]);
    bs.insert(bs.end(), s[e.rank][3].begin(), s[e.rank][3].end());
    std::nth_element(bs.begin(), bs.begin() + e.k, bs.end());
    dep = std::max(dep, bs[e.k]);
  }
  if (e.k > 0)
    dep = std::max(dep, at(e.rank, e.type, e.k - 1));
  return dep;
}

// Re-times the slots as soon as possible with unit costs and no transfer
// time, keeping every rank's order (which has each W after its B).
void retime(std::vector<Slots> &s, int types) {
  std::vector<Slots> end(s.size());
  for (size_t r = 0; r < s.size(); ++r)
    for (int t = 0; t < types; ++t)
      end[r][t].assign(s[r][t].size(), -1);
  std::vector<int> rankFree(s.size(), 0);
  for (const Element &e : inSlotOrder(s, types)) {
    const int dep = dependencySlot(s, e, false, [&](int r, int t, int k) { return end[r][t][k] - 1; });
    const int begin = std::max(dep + 1, rankFree[e.rank]);
    end[e.rank][e.type][e.k] = begin + 1;
    rankFree[e.rank] = begin + 1;
  }
  for (size_t r = 0; r < s.size(); ++r)
    for (int t = 0; t < types; ++t)
      for (size_t k = 0; k < s[r][t].size(); ++k)
        s[r][t][k] = end[r][t][k] - 1;
}

// One squeeze pass. The warm-up ends at rank 0's first B of lane 1 (the
// first micro-batch's round trip), the cool-down begins at the first last
// F of lane 0; the steady state between stays. The warm-up moves only when
// the W's are explicit.
void squeezePass(std::vector<Slots> &s, bool explicitW) {
  const int p = (int)s.size(), types = explicitW ? kTypes : 4;
  if (explicitW)
    for (Slots &rank : s)
      placeWs(rank);
  int budget = 0, last = 0;
  for (const Slots &rank : s)
    budget = std::max(budget, peakUnits(rank, explicitW)), last = std::max(last, lastSlot(rank));
  std::vector<std::vector<char>> occupied(p, std::vector<char>(last + 1, 0));
  enum { kWarmUp, kSteady, kCoolDown } phase = kWarmUp;
  for (const Element &e : inSlotOrder(s, types)) {
    if (phase == kWarmUp && e.rank == 0 && e.type == 3)
      phase = kSteady;
    const bool fixed = phase == kSteady || (phase == kWarmUp && !explicitW);
    if (phase == kSteady && e.type == 0 && e.k + 1 == (int)s[e.rank][0].size())
      phase = kCoolDown;
    int &slot = s[e.rank][e.type][e.k];
    if (!fixed) {
      const int from = dependencySlot(s, e, true, [&](int r, int t, int k) { return s[r][t][k]; }) + 1;
      const int original = slot;
      for (int t = from; t < original; ++t) {
        if (occupied[e.rank][t])
          continue;
        slot = t;
        if (peakUnits(s[e.rank], explicitW) <= budget)
          break;
        slot = original;
      }
    }
    occupied[e.rank][slot] = 1;
  }
  if (!explicitW)
    for (Slots &rank : s)
      placeWs(rank);
  retime(s, kTypes);
}

// The squeezed pattern as an order. The W's fill the empty slots, either
// the oldest pending first or (as the paper's generator) those of lane 0
// first.
Orders squeezedPatternOrder(int p, int n, Offsets (*offsets)(int, int), bool lane0WsFirst) {
  std::vector<Slots> s(p);
  for (int r = 0; r < p; ++r) {
    const Offsets first = offsets(p, r);
    for (int k = 0; k < 4; ++k)
      for (int mb = 0; mb < n; ++mb)
        s[r][k].push_back(first[k] + 6 * mb);
  }
  squeezePass(s, true);
  squeezePass(s, false);
  constexpr Kind kKinds[4] = {kF, kF, kB, kB};
  Orders order(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Element> items;
    for (int t = 0; t < 4; ++t)
      for (int k = 0; k < n; ++k)
        items.push_back({s[r][t][k], r, t, k});
    std::sort(items.begin(), items.end());
    std::array<std::deque<int>, 2> pending; // per B lane: micro-batches whose W waits
    std::deque<Instr> oldest;
    int slot = 0;
    auto takeW = [&] {
      if (lane0WsFirst) {
        const int lane = pending[0].empty() ? 1 : 0;
        order[r].push_back(mk(Op::BwdWeight, pending[lane].front(), modelChunk(kW, lane)));
        pending[lane].pop_front();
      } else {
        order[r].push_back(oldest.front());
        oldest.pop_front();
      }
    };
    auto anyW = [&] { return lane0WsFirst ? !pending[0].empty() || !pending[1].empty() : !oldest.empty(); };
    for (const Element &e : items) {
      for (; slot < e.slot && anyW(); ++slot)
        takeW();
      slot = std::max(slot, e.slot) + 1;
      const int lane = e.type % 2, chunk = modelChunk(kKinds[e.type], lane);
      order[r].push_back(mk(opOf(kKinds[e.type]), e.k, chunk));
      if (kKinds[e.type] == kB) {
        pending[lane].push_back(e.k);
        oldest.push_back(mk(Op::BwdWeight, e.k, chunk));
      }
    }
    while (anyW())
      takeW();
  }
  return order;
}

// ------------------------------------------------------------ ZB-V's fixed pattern
// The V as the zero-bubble paper draws it for F = B = W (its ZB-V figure),
// a fixed order per rank r, written for at least 2p-1 micro-batches:
//  * warm-up: 2(p-r)-1 chunk-0 forwards, then r times a chunk-1 and a
//    chunk-0 forward, then p-r times a chunk-1 F, B and W;
//  * steady state: per step a chunk-0 F (while any is left), B and W, then
//    a chunk-1 F, B and W, until both chunks have run every forward;
//  * cool-down: r times a chunk-0 B and a chunk-1 B, then p-r times a
//    chunk-0 B and the oldest chunk-0 W, then the chunk-1 W's left and the
//    chunk-0 W's left.
// Its W's run right after their B's in the steady state, where the greedy
// runs W's only in waits. Its peak is 2p chunk activations, 1F1B's memory
// p; there it was ahead of zb-v's other candidates in 17 cells of the
// benchmark grid (the 6.2B profile, and F=1 B=1.2 W=0.8 c=0.05 at p >= 8).
// With fewer than 2p-1 micro-batches the missing micro-batches' work is
// left out and the rest keeps its order.
Orders fixedVOrder(int p, int n) {
  const int laidOut = std::max(2 * p - 1, n);
  Orders order(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Instr> &out = order[r];
    int next[3][2] = {{0, 0}, {0, 0}, {0, 0}}; // next micro-batch per kind and model chunk
    auto put = [&](Kind kind, int chunk) {
      const int mb = next[kind][chunk]++;
      if (mb < n)
        out.push_back(mk(opOf(kind), mb, chunk));
    };
    auto forwardBackwardWeight = [&](int chunk) {
      put(kF, chunk);
      put(kB, chunk);
      put(kW, chunk);
    };
    for (int i = 0; i < 2 * (p - r) - 1; ++i)
      put(kF, 0);
    for (int i = 0; i < r; ++i) {
      put(kF, 1);
      put(kF, 0);
    }
    for (int i = 0; i < p - r; ++i)
      forwardBackwardWeight(1);
    while (next[kF][1] < next[kF][0] || next[kF][0] < laidOut) {
      if (next[kF][0] < laidOut)
        put(kF, 0);
      put(kB, 0);
      put(kW, 0);
      forwardBackwardWeight(1);
    }
    for (int i = 0; i < r; ++i) {
      put(kB, 0);
      put(kB, 1);
    }
    for (int i = 0; i < p - r; ++i) {
      put(kB, 0);
      put(kW, 0);
    }
    for (int chunk : {1, 0})
      while (next[kW][chunk] < next[kB][chunk])
        put(kW, chunk);
  }
  return order;
}

} // namespace

std::vector<Orders> paperVOrders(const Problem &P, int n, const std::vector<double> &memBudgets) {
  std::vector<Orders> out;
  for (double budget : memBudgets)
    for (bool fillB : {true, false})
      for (bool fillF : {true, false})
        zbVGreedyRuns(P, n, budget, fillF, fillB, out);
  for (Offsets (*offsets)(int, int) : {vHalfOffsets, vMinOffsets}) {
    out.push_back(patternOrder(P.stages, n, offsets));
    for (bool lane0WsFirst : {false, true})
      out.push_back(squeezedPatternOrder(P.stages, n, offsets, lane0WsFirst));
  }
  out.push_back(fixedVOrder(P.stages, n));
  return out;
}

// ------------------------------------------------------------ the turning rank's bound
// Rank p-1 runs chunk 0's last and chunk 1's first virtual stage, so it
// holds both chunks of each micro-batch it admits. Its first input arrives
// after a0 = (p-1)(f+c) (f, b, w: a chunk's F, B, W); its first B's input
// arrives no earlier than a round trip RT = (p-1)(f+b+2c) after its first
// chunk-1 F ends, at a0 + 2f + RT, and until then it can only run the
// forwards its memory holds (K chunks: K f of work), so it idles at least
// (2f + RT - K f)+ more. After its last chunk-0 B only W's are left on it,
// at most as many as its memory holds (each still holds w_mem_frac of a
// chunk), while that B's gradient still crosses (p-1) ranks (c + b each)
// and rank 0 then runs its W (w): the rank idles at the end whatever of
// E = (p-1)(c+b) + w those W's do not fill. The bound is a0 plus both idles
// plus the rank's work m(F+B+W); with neither idle it is the plain V bound
// (p-1)(F/2+c) + m(F+B+W).
double vTurningRankBound(const Problem &P) {
  if (P.chunks != 2 || P.costF.size() != 1 || P.costB.size() != 1 || P.costW.size() != 1 ||
      P.activation.size() != 1 || !P.recompute.empty() || P.numRanks() != P.stages)
    return 0;
  const int p = P.stages, m = P.microbatches;
  const double f = P.costOf(Op::Fwd, 0, 0), b = P.costOf(Op::BwdInput, 0, 0), w = P.costOf(Op::BwdWeight, 0, 0);
  const double a = P.activationOf(0, 0), c = P.comm;
  // Chunks the rank can hold: of forwards before any W, of pending W's after.
  auto held = [&](double perChunk) {
    if (P.memoryLimit <= 0 || perChunk <= 0)
      return 2.0 * m;
    return std::min(2.0 * m, std::floor(P.memoryLimit / perChunk + kEps));
  };
  const double a0 = (p - 1) * (f + c), roundTrip = (p - 1) * (f + b + 2 * c);
  const double warmUpIdle = std::max(0.0, 2 * f + roundTrip - held(a) * f);
  const double coolDownIdle = std::max(0.0, (p - 1) * (c + b) + w - held(a * P.wMemFrac) * w);
  return a0 + warmUpIdle + m * 2 * (f + b + w) + coolDownIdle;
}

} // namespace pipec::schedule::detail
