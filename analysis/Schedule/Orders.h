// Compute orders: what the schedule generators decide and lower() turns into
// instruction streams. The interface between generate() (Generate.cpp), the
// handcrafted per-family orders (Patterns.cpp), the zero-bubble list scheduler
// (ListScheduler.cpp) and the lowering (Lower.cpp); not part of the library's
// interface (Schedule.h).
#pragma once

#include "analysis/Schedule/Schedule.h"

#include <limits>
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
// recomputes (orders indexed by rank of `s`).
Orders withRecompute(const Schedule &s, Orders orders);

// Fills s.ranks from per-rank compute orders: LOAD, the point-to-point
// transfers and STASH/RESTORE, in a deadlock-free order.
void lower(Schedule &s, const Orders &orders);

// Rewrites lowered 1F1B-RR streams for PipeDream's vertical sync.
void applyVerticalSync(Schedule &s);

// ------------------------------------------------------------ Generate.cpp
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

// 1F1B-RR (asynchronous), per rank.
Orders pipedreamOrder(const Schedule &s);

// ------------------------------------------------------------ ListScheduler.cpp
// The memory limit in units, or 1F1B's peak when the problem sets none (the
// default of auto and zb-v).
double limitOr1F1BPeak(const Problem &P);

// One pipeline's order per stage position over n local micro-batches, from
// the list scheduler with `shape`'s problem.
Orders autoOrder(const Schedule &shape, int n, double limit);
Orders zbH2Order(const Schedule &shape, int n);
Orders zbVOrder(const Schedule &shape, int n, double limit);

// ------------------------------------------------------------ VHeuristic.cpp
// The zero-bubble papers' V orders for one V pipeline (P's stages, costs and
// activations; n local micro-batches), per rank: ZB-V's greedy with each
// memory budget (units; the fill and approved-bubble variants of its search),
// then the V-Half and V-Min patterns, each as is and squeezed (its W's
// filled oldest first or, as the paper's generator does, lane 0 first): the
// last kVPatternOrders. Unchecked candidates: an order may exceed a budget
// once timed or, for the patterns, not execute at all.
inline constexpr size_t kVPatternOrders = 6;
std::vector<Orders> paperVOrders(const Problem &P, int n, const std::vector<double> &memBudgets);

} // namespace pipec::schedule::detail
