// Compute orders: what the schedule generators decide and lower() turns into
// instruction streams. The interface between generate() (Generate.cpp), the
// handcrafted per-family orders (Patterns.cpp), the zero-bubble list scheduler
// (ListScheduler.cpp) and the lowering (Lower.cpp); not part of the library's
// interface (Schedule.h).
#pragma once

#include "analysis/Schedule/Schedule.h"

#include <limits>
#include <utility>
#include <vector>

namespace pipec::schedule::detail {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Orders = std::vector<std::vector<Instr>>; // per rank or per stage position

inline Instr mk(Op op, int mb = -1, int chunk = -1, int peer = -1) { return Instr{op, mb, chunk, peer}; }

// ------------------------------------------------------------ Lower.cpp
struct Timing {
  std::vector<std::vector<double>> start, end; // per rank, per instruction
  double makespan = 0;
};

// Times a compute-only order (sends asynchronous, `comm` per transfer between
// ranks). `zeroCost` replaces zero durations (steps, free collectives) so that
// starts strictly increase on a rank; lower() relies on it for its keys.
Timing timeOrder(const Schedule &s, const Orders &orders, double zeroCost);

// Inserts RECOMPUTE(mb, chunk) right before every backward of a stage that
// recomputes, before the paired forward for the backward of an F&B (orders
// indexed by rank of `s`).
Orders withRecompute(const Schedule &s, Orders orders);

// Fills s.ranks from per-rank compute orders: LOAD, the point-to-point
// transfers and STASH/RESTORE, in a deadlock-free order.
void lower(Schedule &s, const Orders &orders);

// Rewrites lowered 1F1B-RR streams for PipeDream's vertical sync.
void applyVerticalSync(Schedule &s);

// ------------------------------------------------------------ Generate.cpp
// Every rank's optimizer tail: the all-reduce over its stage's replicas, then
// the step (ZB-H2: speculative step, global validation, possible rollback).
void appendOptimizerTail(const Problem &P, Orders &orders, bool speculativeStep);

// A synchronous one-chunk schedule named `name` from one compute order per
// stage (F, BWD_INPUT and BWD_WEIGHT, chunk 0): the optimizer tail, the
// lowering and validation of generate() (the exact mode's result).
Schedule scheduleFromStageOrders(const std::string &name, const Problem &problem, const Orders &perStage);

// ------------------------------------------------------------ Patterns.cpp
// Micro-batch mb runs on replica mb mod R of every stage (docs/schedules.md).
std::vector<int> microbatchesOfReplica(const Problem &P, int st, int rep);

// Forwards a replica of stage st runs before its first backward: PipeDream's
// NOAM, enough micro-batches to keep every worker at and after the stage
// busy, ceil(sum_{t>=st} R_t / R_st) - 1. With one replica per stage (or the
// same count on all) it is 1F1B's p - st - 1.
int warmupOf(const Problem &P, int st);

// One stage's order over n micro-batches (local indices, chunk 0).
std::vector<Instr> gpipeStage(int n);
std::vector<Instr> oneF1BStage(int warm, int n);
std::vector<Instr> zbH1Stage(int warm, int wDelay, int n);

// One pipeline's order per stage position (p stages, n local micro-batches).
Orders zbH1Order(int p, int n);
Orders interleavedOrder(int p, int v, int n);
// DualPipeV (docs/schedules.md, "DualPipeV"): the V placement's order of the
// reference's eight steps over n >= 2p micro-batches, its F&B pairs marked
// (Instr::paired on the forward, the full backward after it).
Orders dualPipeVOrder(int p, int n);

// 1F1B-RR (asynchronous), per rank.
Orders pipedreamOrder(const Schedule &s);

// ------------------------------------------------------------ ListScheduler.cpp
// The memory limit in units, or 1F1B's peak when the problem sets none (the
// default of auto and zb-v).
double limitOr1F1BPeak(const Problem &P);

// Times a compute order of one pipeline exactly as zb-v times its candidates
// (withRecompute, then timeOrder with asynchronous sends; peak memory as the
// simulator counts it) and keeps the times, so that after a change of one rank's order from
// position k on only the work that started at or after the old start t0 of
// position k is re-timed: work that started before t0 depends only on work
// that ended before it, all of it in the unchanged prefixes, and keeps its
// times. A rejected change is undone by restore(). zbVOrder's local search
// times its candidates with it and checks its result the usual way.
class OrderTimer {
public:
  struct Metrics {
    double makespan = 0, maxSpan = 0, peak = 0;
    double backwardEnds = 0; // sum of the end times of every B (and fused backward)
  };

  OrderTimer(const Schedule &shape, int n);

  // Times `order` from scratch; false when it cannot execute.
  bool time(const Orders &order);

  // Re-times after order[rank] changed at positions >= from only (a
  // permutation of them); false when the order cannot execute. After a
  // rejected change the caller undoes it and calls restore().
  bool retime(const Orders &order, int rank, size_t from);

  // Undoes the last retime; `order` is the order before the change (the
  // caller has undone it).
  void restore(const Orders &order);

  const Metrics &result() const { return metrics; }

private:
  // What the timer needs of one (rank, chunk): costs by kindOf, memory.
  struct Slot {
    double cost[4] = {0, 0, 0, 0};
    double recompute = 0, activation = 0, resting = 0;
  };
  enum Kind { kForward, kBackwardInput, kWeight, kFusedBackward };
  static Kind kindOf(Op op) {
    return op == Op::Fwd         ? kForward
           : op == Op::BwdInput  ? kBackwardInput
           : op == Op::BwdWeight ? kWeight
                                 : kFusedBackward;
  }
  const Slot &slot(int rank, int chunk) const { return slots[(size_t)rank * P.chunks + chunk]; }
  static bool backward(Op op) { return op == Op::BwdInput || op == Op::Bwd; }
  int vsOf(int rank, int chunk) const { return vsAt[(size_t)rank * P.chunks + chunk]; }
  // Index of an F or backward in opEnd (the work others wait for), else -1.
  long dependedOn(const Instr &in, int rank) const;
  double peakMemory(const std::vector<Instr> &rank, int st) const;

  // Times every rank from position first[r] on, as timeOrder does.
  bool sweep(const Orders &order);

  const Problem &P;
  const int p, n, V;
  std::vector<int> rankOfVs, vsAt; // rank of a virtual stage; virtual stage of (rank, chunk)
  std::vector<Slot> slots;         // per (rank, chunk)
  std::vector<char> recomputes;    // per rank
  // Per rank and position: start and end of the work itself (a recomputed
  // backward's start is after its RECOMPUTE: what it waits for has ended
  // by then, which is what retime's rule needs).
  std::vector<std::vector<double>> start, end;
  std::vector<std::vector<double>> backwardSum; // per rank: sum of the backwards' ends before each position
  std::vector<double> peakOf;                  // per rank
  std::vector<double> opEnd;                   // F and backward ends by (kind, virtual stage, mb)
  std::vector<size_t> first;                   // per rank: the first position the sweep times
  Metrics metrics;
  // What retime() changed, for restore().
  std::vector<size_t> savedFirst;
  std::vector<double> savedStart, savedEnd, savedPeak;
  std::vector<std::pair<long, double>> savedIds;
  Metrics savedMetrics;
};

// One pipeline's order per stage position over n local micro-batches, from
// the list scheduler with `shape`'s problem.
Orders autoOrder(const Schedule &shape, int n, double limit);
Orders zbH2Order(const Schedule &shape, int n);
Orders zbVOrder(const Schedule &shape, int n, double limit);
// Zero bubble over any number of chunks placed as interleaved's (virtual
// stage k on rank k mod p): the list scheduler's policies, then the local search.
Orders zbInterleavedOrder(const Schedule &shape, int n, double limit);

// zbVOrder's local search on `order` (one pipeline of `shape`, n local
// micro-batches, peak within `limit`), then `kicks` rounds of an iterated
// local search: four random moves of the current order, the local search
// again with `evaluationsPerKick` timings per pass, the result kept when
// sooner (when as soon, half of the time). `order` becomes the best found;
// deterministic. The exact mode's first solution (Optimal.cpp).
void improveOrder(const Schedule &shape, int n, double limit, Orders &order, int kicks, long evaluationsPerKick);

// ------------------------------------------------------------ VHeuristic.cpp
// The zero-bubble papers' V orders for one V pipeline (P's stages, costs and
// activations; n local micro-batches), per rank: ZB-V's greedy with each
// memory budget (units; the fill and approved-bubble variants of its search),
// then the V-Half and V-Min patterns, each as is and squeezed (its W's
// filled oldest first or, as the paper's generator does, lane 0 first), and
// ZB-V's fixed pattern (the paper's figure): the last kVPatternOrders.
// Unchecked candidates: an order may exceed a budget once timed or, for the
// patterns, not execute at all.
inline constexpr size_t kVPatternOrders = 7;
std::vector<Orders> paperVOrders(const Problem &P, int n, const std::vector<double> &memBudgets);

// A lower bound on the makespan of any V schedule (two chunks, VShape) of P
// under P.memoryLimit (none when <= 0), from its turning rank p-1: its
// warm-up idles until a round trip returns the first gradient, and its
// memory bounds the W's that can fill the cool-down (VHeuristic.cpp,
// docs/schedules.md). For uniform costs and activations without recompute
// or replicas; 0 (no bound) otherwise.
double vTurningRankBound(const Problem &P);

} // namespace pipec::schedule::detail
