// The planner: one joint search over stage boundaries, replicas, schedule
// family, chunks, micro-batch count and recompute, scored by the simulated
// time per sample of the schedule that will be emitted (docs/planner.md).
//
// Plain C++17 below the passes and the driver: it calls the partition DP and
// the schedule library and knows nothing of MLIR.
#ifndef PIPEC_COMPILER_PLANNER_PLANNER_H
#define PIPEC_COMPILER_PLANNER_PLANNER_H

#include "analysis/Partition/PartitionCommand.h"
#include "analysis/Schedule/Schedule.h"
#include "runtime/include/pipec/job_plan.h"

#include <nlohmann/json_fwd.hpp>

#include <algorithm>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace pipec::planner {

/// What the user asked for; every field left at its default is searched.
struct Request {
  /// Topology and the partition constraints (--stages, --no-replication,
  /// --memory-limit, --microbatches, --async, --recompute, --partition).
  partition::PartitionCliOptions partition;
  /// --schedule; absent: every family with a search order (1f1b-rr only with --async)
  std::optional<ScheduleKind> schedule;
  /// --schedule-file: a schedule in PyTorch's CSV format whose order the plan
  /// runs (family csv); its ranks, chunks and micro-batches become constraints.
  std::string scheduleFile;
  std::string scheduleFileText; ///< its content, read once by plan()
  std::optional<int> chunks; ///< --chunks; absent: any
  bool verticalSync = false;
  /// --fb-overlap: the share of a DualPipeV F&B pair's shorter half hidden
  /// behind the longer in the schedule problem (schedule::Problem::fbOverlap).
  double fbOverlap = 0;
  /// --batch-size: samples per optimizer step; absent: the planner chooses
  /// (at most settings::kDefaultMaxBatchSize). Fixes the micro-batch count
  /// to N / the cost table's micro-batch size.
  std::optional<int64_t> batchSize;
  int candidates = 3;   ///< runner-up plans to report (--candidates)
  /// Which plan of the ranking to choose (--plan-rank): 1 is the best; a
  /// runner-up can be compiled as it was evaluated. Absent: the best.
  std::optional<int> rank;
  /// Ops that must share a stage: [first, last] ranges (tied parameters
  /// under --async, whose copies the runtime cannot keep consistent).
  std::vector<std::pair<int, int>> unsplittable;
  /// Where the model's micro-batch size came from, and the sizes tried when
  /// the driver chose it (it plans the model once per size): reported with
  /// the plan, not searched here.
  std::string microbatchSizeSource;
  std::vector<plan::MicrobatchSizeTried> microbatchSizesTried;

  /// Binds the partition's settings and the planner's own (schedule, chunks,
  /// vertical sync, candidates, plan rank).
  void bind(settings::Binder &binder);
};

/// One evaluated plan.
struct Candidate {
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int chunks = 1;
  Placement placement = Placement::Interleaved;
  int pipelineStages = 0; ///< stage positions of the emitted schedule (ranks per pipeline)
  int microbatches = 0;
  partition::PartitionResult partition; ///< in model order (virtual stages when chunks > 1)
  schedule::Problem problem;
  double makespan = 0;         ///< one mini-batch from an empty pipeline (simulated)
  double timePerMinibatch = 0; ///< back-to-back mini-batches (simulated), the prediction
  double bubble = 0;           ///< flush-to-flush bubble of one mini-batch
  double peakDeviceBytes = 0;  ///< weights, optimizer state, stashes and simulated activations
  std::string origin;          ///< which partition search produced it
  /// The planner's objective: the simulated time per micro-batch of the
  /// step (per sample, up to the model's one micro-batch size; samples()
  /// divides by it where the size is known).
  double timePerMicrobatch() const { return timePerMinibatch / microbatches; }
  /// Seconds per sample: timePerMicrobatch() over `microbatchSize`, or per
  /// micro-batch when the size is not known (a cost table's plan, 0).
  double timePerSample(int64_t microbatchSize) const {
    return timePerMicrobatch() / static_cast<double>(std::max<int64_t>(1, microbatchSize));
  }
};

/// Where the samples per optimizer step came from.
enum class BatchSource { Planner, Microbatches, BatchSize };

struct Plan {
  Candidate chosen;
  BatchSource batchSource = BatchSource::Planner;
  schedule::Schedule schedule;     ///< the emitted schedule
  schedule::SimResult simulated;   ///< of one mini-batch
  std::vector<Candidate> ranked;   ///< best first; ranked[0] is `chosen`
  int evaluated = 0, rejected = 0;
  std::vector<std::string> rejections; ///< the first few reasons, for the report
  double searchSeconds = 0;
  int candidatesShown = 3; ///< runner-ups printed (Request::candidates)
  int chosenRank = 1;      ///< Request::rank: where the chosen plan stood in the ranking
  std::string microbatchSizeSource;                      ///< Request's, reported
  std::vector<plan::MicrobatchSizeTried> microbatchSizesTried; ///< Request's, reported
  /// The plans printed (--candidates N, at least one): each can be chosen.
  size_t shown() const { return std::min(ranked.size(), static_cast<size_t>(std::max(1, candidatesShown))); }
};

/// The search before a plan is chosen: plan() is search() then choose(), and
/// one search can give every plan of its ranking (--each-candidate).
struct Ranking {
  Request request;         ///< as searched (the schedule file read, --batch-size as micro-batches)
  std::string searchedFor; ///< the cost table and request it answers (sameSearch)
  /// The search's report with `ranked` best first; no plan chosen yet.
  Plan searched;
};

/// Runs the search. Throws partition::Error or schedule::ScheduleError when
/// nothing satisfies the constraints (naming the constraint and, for
/// explicit requests, the nearest valid values).
Ranking search(const partition::CostTable &table, const Request &request);
/// The plan at `rank` (1: the best) of a ranking, as plan() with that rank
/// gives it. Throws partition::Error past the ranking's end.
Plan choose(const Ranking &ranking, int rank);
/// Whether `ranking` is search(table, request)'s for any rank of `request`.
bool sameSearch(const Ranking &ranking, const partition::CostTable &table, const Request &request);
/// search() then choose() at request.rank (the best without one).
Plan plan(const partition::CostTable &table, const Request &request);

/// The schedule problem of a partition: per-stage F, B and W are the sums of
/// the stage's op times, communication is the slowest boundary's one-way
/// transfer, activation memory is in units of the largest stage's
/// activations of one micro-batch (the zero-bubble paper's M_B).
/// Seconds every compute instruction (a FWD, BWD_INPUT or BWD_WEIGHT of one
/// virtual stage) costs beyond its ops: piperun's fixed work per instruction
/// (docs/planner.md, "Chunks"); what makes a chunk more not free.
inline constexpr double kInstructionOverheadSeconds = 10e-6;
schedule::Problem scheduleProblem(const partition::CostTable &table,
                                  const partition::PartitionResult &result, int chunks,
                                  Placement placement);

/// The printed plan: partition table, the chosen schedule and why, runner-ups.
void printPlan(std::ostream &os, const partition::CostTable &table,
               const partition::Topology &topology, const Plan &plan);
/// The same as one JSON document (--json).
nlohmann::json planSummaryJson(const partition::CostTable &table, const Plan &plan);
/// plan.json's typed content for the chosen plan, without its `runtime`
/// section (the driver adds it once the stages are written): the pipeline
/// (schedule, chunks, placement, micro-batches, asynchronous), the partition,
/// the simulated schedule and the runner-ups (docs/plan-json.md).
plan::PlanFile planFile(const partition::CostTable &table, const partition::Topology &topology,
                        const Plan &plan);

} // namespace pipec::planner

#endif
