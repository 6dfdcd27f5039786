// The planner's report: the plan and the candidates it ranked as text for
// the terminal (printPlan) and as JSON (planSummaryJson), and plan.json's
// content of the chosen plan (planFile), apart from the search that makes
// them (Planner.cpp; docs/planner.md).
#include "analysis/Planner/Planner.h"
#include "analysis/Settings/Declared.h"

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/PlanJson.h"

#include <nlohmann/json.hpp>

#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

namespace pipec::planner {

using partition::PartitionResult;
using nlohmann::json;

namespace {
std::string joinInts(const std::vector<int> &values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i)
    out += (i ? "," : "") + std::to_string(values[i]);
  return out;
}
} // namespace

namespace {
std::string batchSourceText(BatchSource source) {
  switch (source) {
  case BatchSource::BatchSize: return settings::flag(settings::kBatchSize);
  case BatchSource::Microbatches: return settings::flag(settings::kMicrobatches);
  case BatchSource::Planner: break;
  }
  return "the planner's choice: at most " + std::to_string(settings::kDefaultMaxBatchSize) +
         (" samples unless the replicas need more; " + settings::flag(settings::kBatchSize) + " N sets it");
}

/// Samples per optimizer step: the chosen micro-batch count times the
/// table's micro-batch size; nullopt when the table does not know it.
std::optional<int64_t> samplesPerStep(const partition::CostTable &table, const Plan &plan) {
  if (table.microbatchSize <= 0)
    return std::nullopt;
  return table.microbatchSize * plan.chosen.microbatches;
}

void printBatch(std::ostream &os, const partition::CostTable &table, const Plan &plan) {
  const Candidate &c = plan.chosen;
  const int64_t b = table.microbatchSize;
  if (b > 0)
    os << "samples per optimizer step: " << *samplesPerStep(table, plan) << " = " << c.microbatches
       << (c.microbatches == 1 ? " micro-batch of " : " micro-batches of ") << b << " ("
       << batchSourceText(plan.batchSource) << ")\n";
  else
    os << "micro-batches per optimizer step: " << c.microbatches << " (" << batchSourceText(plan.batchSource)
       << "); the samples per micro-batch are the model's\n";
  if (!plan.microbatchSizesTried.empty()) {
    os << "micro-batch size: " << b << " (" << plan.microbatchSizeSource
       << (": the lowest simulated time per sample of the sizes tried; " + settings::flag(settings::kMicrobatchSize) + " b sets it)\n")
       << "  size  samples/step  time per sample\n";
    for (const plan::MicrobatchSizeTried &tried : plan.microbatchSizesTried) {
      os << std::setw(6) << tried.size << "  ";
      if (tried.timePerSample)
        os << std::setw(12) << (tried.samplesPerStep ? std::to_string(*tried.samplesPerStep) : std::string("-"))
           << "  " << std::setw(15) << partition::formatSeconds(*tried.timePerSample)
           << (tried.size == b ? "  (chosen)" : "") << (tried.rejection.empty() ? "" : "  " + tried.rejection)
           << "\n";
      else
        os << "not planned: " << tried.rejection << "\n";
    }
  }
  if (c.partition.asynchronous)
    os << choiceName(c.schedule) << " is asynchronous: every stage updates its weights after each micro-batch, so one update "
       << "consumes " << (b > 0 ? std::to_string(b) + " samples" : std::string("one micro-batch")) << "; the "
       << c.microbatches << " micro-batches are one round of the schedule\n";
}
} // namespace

void printPlan(std::ostream &os, const partition::CostTable &table,
               const partition::Topology &topology, const Plan &plan) {
  const Candidate &c = plan.chosen;
  printBatch(os, table, plan);
  partition::printPlanTable(os, table, topology, c.partition);
  if (c.chunks > 1) {
    const int p = c.pipelineStages;
    os << "virtual stages: " << c.chunks << " chunks on each of " << p << " ranks ("
       << (c.placement == Placement::VShape ? "V placement: rank r runs stages r and " + std::to_string(2 * p - 1) + "-r"
                        : std::string("interleaved: rank r runs stages r, r+p, ..."))
       << ")\n";
  }
  os << "recompute: ";
  if (c.partition.recomputedStages.empty())
    os << "none (every stage fits without it)\n";
  for (size_t i = 0; i < c.partition.recomputedStages.size(); ++i)
    os << (i ? ", " : "stages ") << c.partition.recomputedStages[i]
       << (i + 1 == c.partition.recomputedStages.size() ? "\n" : "");
  const auto &sim = plan.simulated;
  os << std::fixed << std::setprecision(2);
  os << "schedule " << choiceName(c.schedule) << ": " << partition::formatSeconds(c.timePerMinibatch) << " per mini-batch of "
     << c.microbatches << " micro-batches (simulated, back to back), " << partition::formatSeconds(c.makespan)
     << " from an empty pipeline; bubble " << 100 * sim.bubbleFlush << "% flush-to-flush, "
     << 100 * sim.bubbleSteady << "% steady-state; peak activations " << sim.maxPeakMemory
     << " x one micro-batch of the largest stage\n";
  os << std::defaultfloat;
  int pairs = 0;
  for (const schedule::Interval &iv : sim.intervals)
    pairs += iv.instr.paired;
  if (pairs > 0) {
    const std::string overlap = settings::flag(settings::kFbOverlap);
    os << "F&B pairs: " << pairs << " per mini-batch (DualPipeV), each timed at ";
    if (c.problem.fbOverlap > 0)
      os << "F + B - " << c.problem.fbOverlap << " min(F, B) (" << overlap << " " << c.problem.fbOverlap
         << "); piperun runs a pair's halves one after the other, so the time assumes a runtime that overlaps them\n";
    else
      os << "F + B, as piperun runs them (" << overlap << " 0)\n";
  }
  if (plan.chosenRank > 1) {
    os << "chosen: plan " << plan.chosenRank << (" of the ranking (" + settings::flag(settings::kPlanRank) + ") of ") << plan.evaluated
       << " plans evaluated (" << plan.rejected << " rejected); the others move down one place\n";
  } else if (plan.ranked.size() > 1 || plan.evaluated > 1) {
    os << "chosen: the lowest simulated time per sample of " << plan.evaluated << " plans evaluated ("
       << plan.rejected << " rejected) in " << std::setprecision(3) << plan.searchSeconds << " s";
    if (plan.ranked.size() > 1) {
      const Candidate &next = plan.ranked[1];
      const double slower = 100 * (next.timePerMicrobatch() / c.timePerMicrobatch() - 1);
      os << "; runner-up " << choiceName(next.schedule) << " (" << next.origin << ", " << next.microbatches
         << " micro-batches) is ";
      if (slower < 0.05)
        os << "as fast (ties go to fewer micro-batches, then fewer devices, then the family tried first)";
      else
        os << std::setprecision(3) << slower << "% slower per sample";
    }
    os << "\n" << std::defaultfloat;
  }
  const size_t shown = plan.shown();
  if (shown > 1) {
    os << "\n" << std::left << std::setw(4) << "#" << std::setw(16) << "schedule" << std::setw(7)
       << "chunks" << std::setw(24) << "replicas per stage" << std::setw(8) << "m" << std::right
       << std::setw(14) << "mini-batch" << std::setw(14) << "per sample" << std::setw(9) << "bubble"
       << "  partition\n";
    for (size_t i = 0; i < shown; ++i) {
      const Candidate &k = plan.ranked[i];
      std::vector<int> replicas;
      for (const auto &st : k.partition.stages)
        replicas.push_back(st.replicas);
      std::string reps = joinInts(replicas);
      if (reps.size() > 23)
        reps = reps.substr(0, 20) + "...";
      os << std::left << std::setw(4) << i + 1 << std::setw(16) << choiceName(k.schedule) << std::setw(7) << k.chunks
         << std::setw(24) << reps << std::setw(8) << k.microbatches << std::right << std::setw(14)
         << partition::formatSeconds(k.timePerMinibatch) << std::setw(14) << partition::formatSeconds(k.timePerSample(table.microbatchSize))
         << std::setw(8) << std::fixed << std::setprecision(1) << 100 * k.bubble << "%"
         << std::defaultfloat << "  " << k.origin << "\n";
    }
  }
  if (!plan.rejections.empty() && plan.ranked.size() <= 1) {
    os << "not possible here:\n";
    for (const auto &r : plan.rejections)
      os << "  " << r << "\n";
  }
}

namespace {
json candidateJson(const partition::CostTable &table, const Candidate &c) {
  std::vector<int> replicas;
  for (const auto &st : c.partition.stages)
    replicas.push_back(st.replicas);
  // The stages in --partition's schema, so that any runner-up can be
  // compiled as it was evaluated (test/e2e/candidate_plans.py).
  json stages = partition::summaryToJson(table, c.partition)["stages"];
  return {{"schedule", choiceName(c.schedule)},
          {"stages", stages},
          {"chunks", c.chunks},
          {"microbatches", c.microbatches},
          {"replicas", replicas},
          {"partition", c.origin},
          {"time_per_minibatch_s", c.timePerMinibatch},
          {"time_per_sample_s", c.timePerSample(table.microbatchSize)},
          {"makespan_s", c.makespan},
          {"bubble_flush", c.bubble},
          {"peak_device_bytes", c.peakDeviceBytes}};
}

json scheduleJson(const Plan &plan) {
  const Candidate &c = plan.chosen;
  const auto &sim = plan.simulated;
  return {{"name", choiceName(c.schedule)},
          {"chunks", c.chunks},
          {"microbatches", c.microbatches},
          {"time_per_minibatch_s", c.timePerMinibatch},
          {"makespan_s", c.makespan},
          {"bubble_flush", sim.bubbleFlush},
          {"bubble_steady_state", sim.bubbleSteady},
          {"bubble_over_ideal", sim.bubbleOverIdeal},
          {"peak_activation_units", sim.maxPeakMemory},
          {"rank_files", "schedule/rank_<rank>.json"}};
}

json batchJson(const partition::CostTable &table, const Plan &plan) {
  const std::optional<int64_t> samples = samplesPerStep(table, plan);
  json batch = {{"samples_per_step", samples ? json(*samples) : json(nullptr)},
                {"source", batchSourceText(plan.batchSource)}};
  if (!plan.microbatchSizeSource.empty())
    batch["microbatch_size_source"] = plan.microbatchSizeSource;
  if (!plan.microbatchSizesTried.empty())
    batch["microbatch_sizes_tried"] = plan::toJson(plan.microbatchSizesTried);
  return batch;
}

json plannerJson(const partition::CostTable &table, const Plan &plan) {
  json ranked = json::array();
  const size_t shown = plan.shown();
  for (size_t i = 0; i < shown; ++i)
    ranked.push_back(candidateJson(table, plan.ranked[i]));
  return {{"objective", "simulated time per sample"},
          {"batch", batchJson(table, plan)},
          {"evaluated", plan.evaluated},
          {"rejected", plan.rejected},
          {"rejections", plan.rejections},
          {"search_s", plan.searchSeconds},
          {"candidates", ranked}};
}
} // namespace

json planSummaryJson(const partition::CostTable &table, const Plan &plan) {
  json summary = partition::summaryToJson(table, plan.chosen.partition);
  summary["schedule"] = scheduleJson(plan);
  summary["planner"] = plannerJson(table, plan);
  if (plan.chosen.chunks > 1)
    summary["virtual_stages"] = {{"chunks", plan.chosen.chunks},
                                 {"ranks", plan.chosen.pipelineStages},
                                 {"placement", choiceName(plan.chosen.placement)}};
  return summary;
}

plan::PlanFile planFile(const partition::CostTable &table, const partition::Topology &topology,
                        const Plan &plan) {
  const Candidate &c = plan.chosen;
  plan::PlanFile file = partition::planFile(table, topology, c.partition);
  file.pipeline.schedule = c.schedule;
  file.pipeline.microbatches = c.microbatches;
  file.pipeline.chunks = c.chunks;
  file.pipeline.placement = c.placement;
  if (c.chunks > 1) {
    // The stages are the virtual stages in model order, partitioned on a
    // topology with `chunks` times the devices; each runs on the rank of its
    // pipeline position (docs/plan-json.md).
    for (plan::Stage &st : file.stages) {
      int position = 0, chunk = 0;
      locateVirtualStage(c.placement, c.pipelineStages, static_cast<int>(st.id), position, chunk);
      st.ranks = {position};
    }
  }
  const auto &sim = plan.simulated;
  plan::ScheduleReport schedule;
  schedule.makespan = c.makespan;
  schedule.bubbleFlush = sim.bubbleFlush;
  schedule.bubbleSteadyState = sim.bubbleSteady;
  schedule.bubbleOverIdeal = sim.bubbleOverIdeal;
  schedule.peakActivationUnits = sim.maxPeakMemory;
  file.schedule = schedule;
  plan::PlannerReport report;
  report.samplesPerStep = samplesPerStep(table, plan);
  report.batchSource = batchSourceText(plan.batchSource);
  report.microbatchSizeSource = plan.microbatchSizeSource;
  report.microbatchSizesTried = plan.microbatchSizesTried;
  report.evaluated = plan.evaluated;
  report.rejected = plan.rejected;
  report.rejections = plan.rejections;
  // The chosen plan is the file itself; the runner-ups as printed.
  const size_t shown = plan.shown();
  for (size_t i = 1; i < shown; ++i) {
    const Candidate &k = plan.ranked[i];
    plan::RunnerUp r;
    r.schedule = k.schedule;
    r.origin = k.origin;
    r.chunks = k.chunks;
    r.microbatches = k.microbatches;
    for (const auto &st : k.partition.stages)
      r.replicas.push_back(st.replicas);
    r.timePerMinibatch = k.timePerMinibatch;
    r.timePerSample = k.timePerSample(table.microbatchSize);
    r.makespan = k.makespan;
    r.bubbleFlush = k.bubble;
    r.peakDeviceBytes = k.peakDeviceBytes;
    report.runnerUps.push_back(std::move(r));
  }
  file.planner = report;
  return file;
}

} // namespace pipec::planner
