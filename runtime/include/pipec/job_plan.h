// plan.json as types (docs/plan-json.md): the one description of the file
// pipec writes and piperun reads, and its one writer.
//
// It lives in the runtime layer because the runtime deploys alone and reads
// the file: the compiler (compiler/Driver/TrainingJob.cpp assembles a
// PlanFile once from the planner's plan and the options) and the analysis
// libraries (analysis/Partition/PlanJson.cpp, `pipec partition --out`)
// include this header, never the other way round (docs/layers.md). The
// writer is inline so that no layer needs another library to write the
// file; the runtime's reader, with its error messages, is loadPlan
// (runtime/src/Plan.cpp).
//
// Each fact is in one place: the schedule family, micro-batch count,
// asynchronous flag, chunks and placement only in `pipeline`; the ranks of
// each stage only in `stages[].ranks`; what the descriptive sections
// (partition, predictions, schedule, planner) add is derived or measured,
// never a copy.
#pragma once

#include "vocabulary.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pipec::plan {

inline constexpr const char *kFormat = "pipec-plan";
/// Version 2: `pipeline` holds the schedule, micro-batches, asynchronous,
/// chunks and placement once; `runtime.format` is gone (docs/plan-json.md,
/// "Versions").
inline constexpr int kVersion = 2;

// ---------------------------------------------------------------- what runs
/// The pipeline the streams in schedule/ implement.
struct Pipeline {
  std::string schedule; ///< family ("1f1b", "zb-v", ...); empty in a partition-only file
  int microbatches = 1; ///< per optimizer step, over all replicas
  bool asynchronous = false;
  int chunks = 1; ///< virtual stages per rank
  Placement placement = Placement::Interleaved;
};

/// One virtual stage's code and initial weights (paths relative to the plan).
struct StageFiles {
  int64_t id = 0;
  std::string library, weights;
  /// The static memory plan (-O2, docs/optimization.md): the bytes of the
  /// stage's one arena (the largest entry point's) and each entry point's
  /// (function name -> pipe.arena_size). Absent at -O0 (written as null / {}).
  std::optional<int64_t> arenaBytes;
  std::map<std::string, int64_t> entryArenaBytes;
  /// Kernel scratch in that plan (docs/optimization.md, "Kernel scratch"):
  /// the largest one kernel call takes inside the arena, and the bytes per
  /// kernel thread (CPU) that the arena gets beyond arenaBytes, one part per
  /// thread the rank's kernels use. Absent at -O0.
  std::optional<int64_t> scratchBytes, threadScratchBytes;
};

struct DataField {
  std::string name, dtype; ///< dtype: f32, f64, i64, i32, bool
  std::vector<int64_t> shape; ///< one sample
  double low = 0, high = 0;
};

struct Optimizer {
  ::pipec::Optimizer rule = ::pipec::Optimizer::Sgd; ///< the update the stages run: sgd or adamw
  double lr = 0, weightDecay = 0, momentum = 0;
  double beta1 = OptimizerDefaults::beta1, beta2 = OptimizerDefaults::beta2,
         epsilon = OptimizerDefaults::epsilon;
  std::optional<double> maxGradNorm; ///< absent: no clipping
};

struct TiedParameter {
  std::string name;
  std::vector<int64_t> stages; ///< holder virtual stages
};

/// How piperun runs the pipeline: the `runtime` section.
struct Runtime {
  int64_t microbatchSize = 1; ///< samples per micro-batch
  uint64_t seed = 0;
  Target target = Target::Cpu;
  Precision precision = Precision::F32;
  std::vector<std::string> cudaArch; ///< written for target cuda only
  std::string gpu;                   ///< written for target cuda only
  std::vector<StageFiles> stages;    ///< by virtual stage id
  Optimizer optimizer;
  std::vector<DataField> dataFields;
  std::optional<uint64_t> syntheticSamples;
  std::vector<TiedParameter> tied;
};

// ---------------------------------------------------------------- what the planner reports
struct Level {
  std::string name;
  int64_t fanout = 1;
  double bandwidthGBps = 0;
};

struct Topology {
  std::string device;
  int64_t deviceMemory = 0, devices = 0;
  std::vector<Level> levels; ///< innermost first
};

struct Partition {
  std::string source = "search"; ///< search | given
  int64_t layers = 0;
  bool recompute = false;
  std::optional<int64_t> memoryLimitBytes; ///< absent: unlimited (written as null)
};

/// A stage in model order (a virtual stage when chunks > 1).
struct Stage {
  int64_t id = 0;
  std::string firstOp, lastOp;
  int64_t firstOpIndex = 0, lastOpIndex = 0;
  int64_t replicas = 1;
  std::vector<int> replicasPerLevel;
  std::vector<int> ranks; ///< the MPI ranks holding a replica: what piperun maps streams by
  double computeSeconds = 0, sendSeconds = 0, allreduceSeconds = 0;
  int64_t sendBytes = 0, sendLevel = -1, inflight = 1;
  int64_t parameterBytes = 0, optimizerBytes = 0, stashBytes = 0, activationBytes = 0, memoryBytes = 0;
};

struct Predictions {
  double timePerMicrobatch = 0, timePerMinibatch = 0, throughput = 0, bubbleSeconds = 0,
         bubbleFraction = 0;
  bool simulated = false; ///< time_per_minibatch_source
  std::optional<double> analyticTimePerMinibatch; ///< PipeDream's estimate beside a simulated one
  int64_t inflightMicrobatches = 0, devicesUsed = 0;
  bool dataParallelFits = false;
  double dataParallelTimePerMicrobatch = 0, speedupOverDataParallel = 0; ///< null unless it fits
};

/// The simulated schedule of one mini-batch (its name, chunks and
/// micro-batches are the pipeline's).
struct ScheduleReport {
  double makespan = 0, bubbleFlush = 0, bubbleSteadyState = 0, bubbleOverIdeal = 0,
         peakActivationUnits = 0;
  std::string rankFiles = "schedule/rank_<rank>.json";
};

/// A plan the planner ranked below the chosen one.
struct RunnerUp {
  std::string schedule, origin;
  int64_t chunks = 1, microbatches = 1;
  std::vector<int> replicas;
  double timePerMinibatch = 0, timePerSample = 0, makespan = 0, bubbleFlush = 0,
         peakDeviceBytes = 0;
};

struct PlannerReport {
  std::string objective = "simulated time per sample";
  /// Samples per optimizer step (micro-batch size x pipeline.microbatches,
  /// absent when the micro-batch size is unknown) and where the count came
  /// from (--batch-size, --microbatches or the planner's bounded choice).
  std::optional<int64_t> samplesPerStep;
  std::string batchSource;
  int64_t evaluated = 0, rejected = 0;
  std::vector<std::string> rejections;
  double searchSeconds = 0;
  std::vector<RunnerUp> runnerUps;
};

/// The whole file. `runtime`, `schedule` and `planner` are absent in the
/// partition-only file of `pipec partition --out`.
struct PlanFile {
  Pipeline pipeline;
  std::optional<Runtime> runtime;
  Topology topology;
  Partition partition;
  std::vector<Stage> stages;
  std::vector<std::string> opOrder; ///< written when not empty
  Predictions predictions;
  std::optional<ScheduleReport> schedule;
  std::optional<PlannerReport> planner;
};

// ---------------------------------------------------------------- the writer
inline nlohmann::json toJson(const Pipeline &p) {
  nlohmann::json j = {{"microbatches", p.microbatches},
                      {"asynchronous", p.asynchronous},
                      {"chunks", p.chunks},
                      {"placement", choiceName(p.placement)}};
  if (!p.schedule.empty())
    j["schedule"] = p.schedule;
  return j;
}

inline nlohmann::json toJson(const Runtime &r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const StageFiles &s : r.stages)
    stages.push_back({{"id", s.id},
                      {"library", s.library},
                      {"weights", s.weights},
                      {"arena_bytes", s.arenaBytes ? nlohmann::json(*s.arenaBytes) : nlohmann::json(nullptr)},
                      {"entry_arena_bytes", s.entryArenaBytes},
                      {"scratch_bytes", s.scratchBytes ? nlohmann::json(*s.scratchBytes) : nlohmann::json(nullptr)},
                      {"thread_scratch_bytes",
                       s.threadScratchBytes ? nlohmann::json(*s.threadScratchBytes) : nlohmann::json(nullptr)}});
  nlohmann::json fields = nlohmann::json::array();
  for (const DataField &f : r.dataFields)
    fields.push_back({{"name", f.name}, {"dtype", f.dtype}, {"shape", f.shape}, {"low", f.low},
                      {"high", f.high}});
  nlohmann::json data = {{"fields", fields}};
  if (r.syntheticSamples)
    data["synthetic_samples"] = *r.syntheticSamples;
  nlohmann::json tied = nlohmann::json::array();
  for (const TiedParameter &t : r.tied)
    tied.push_back({{"name", t.name}, {"stages", t.stages}});
  nlohmann::json optimizer = {{"name", choiceName(r.optimizer.rule)},
                              {"lr", r.optimizer.lr},
                              {"weight_decay", r.optimizer.weightDecay},
                              {"momentum", r.optimizer.momentum},
                              {"beta1", r.optimizer.beta1},
                              {"beta2", r.optimizer.beta2},
                              {"epsilon", r.optimizer.epsilon}};
  if (r.optimizer.maxGradNorm)
    optimizer["max_grad_norm"] = *r.optimizer.maxGradNorm;
  nlohmann::json j = {{"microbatch_size", r.microbatchSize},
                      {"seed", r.seed},
                      {"target", choiceName(r.target)},
                      {"precision", choiceName(r.precision)},
                      {"stages", stages},
                      {"optimizer", optimizer},
                      {"data", data},
                      {"tied", tied}};
  if (r.target == Target::Cuda) {
    j["cuda_arch"] = r.cudaArch;
    j["gpu"] = r.gpu;
  }
  return j;
}

inline nlohmann::json toJson(const Topology &t) {
  nlohmann::json levels = nlohmann::json::array();
  for (const Level &l : t.levels)
    levels.push_back({{"name", l.name}, {"fanout", l.fanout}, {"bandwidth_GBps", l.bandwidthGBps}});
  return {{"device", t.device}, {"device_memory", t.deviceMemory}, {"devices", t.devices},
          {"levels", levels}};
}

inline nlohmann::json toJson(const Partition &p) {
  return {{"source", p.source},
          {"layers", p.layers},
          {"recompute", p.recompute},
          {"memory_limit_bytes",
           p.memoryLimitBytes ? nlohmann::json(*p.memoryLimitBytes) : nlohmann::json(nullptr)}};
}

inline nlohmann::json toJson(const Stage &s) {
  return {{"id", s.id},
          {"first_op", s.firstOp},
          {"last_op", s.lastOp},
          {"first_op_index", s.firstOpIndex},
          {"last_op_index", s.lastOpIndex},
          {"replicas", s.replicas},
          {"replicas_per_level", s.replicasPerLevel},
          {"ranks", s.ranks},
          {"compute_s", s.computeSeconds},
          {"send_s", s.sendSeconds},
          {"send_bytes", s.sendBytes},
          {"send_level", s.sendLevel},
          {"allreduce_s", s.allreduceSeconds},
          {"inflight_microbatches", s.inflight},
          {"parameter_bytes", s.parameterBytes},
          {"optimizer_bytes", s.optimizerBytes},
          {"stash_bytes", s.stashBytes},
          {"activation_bytes", s.activationBytes},
          {"memory_bytes", s.memoryBytes}};
}

inline nlohmann::json toJson(const Predictions &p) {
  nlohmann::json j = {
      {"time_per_microbatch_s", p.timePerMicrobatch},
      {"time_per_minibatch_s", p.timePerMinibatch},
      {"time_per_minibatch_source",
       p.simulated ? "simulated schedule" : "analytic (PipeDream's model)"},
      {"throughput_microbatches_per_s", p.throughput},
      {"bubble_s", p.bubbleSeconds},
      {"bubble_fraction", p.bubbleFraction},
      {"inflight_microbatches", p.inflightMicrobatches},
      {"devices_used", p.devicesUsed},
      {"data_parallel_fits", p.dataParallelFits},
      {"data_parallel_time_per_microbatch_s",
       p.dataParallelFits ? nlohmann::json(p.dataParallelTimePerMicrobatch) : nlohmann::json(nullptr)},
      {"speedup_over_data_parallel",
       p.dataParallelFits ? nlohmann::json(p.speedupOverDataParallel) : nlohmann::json(nullptr)}};
  if (p.analyticTimePerMinibatch)
    j["dp_estimate_time_per_minibatch_s"] = *p.analyticTimePerMinibatch;
  return j;
}

inline nlohmann::json toJson(const ScheduleReport &s) {
  return {{"makespan_s", s.makespan},
          {"bubble_flush", s.bubbleFlush},
          {"bubble_steady_state", s.bubbleSteadyState},
          {"bubble_over_ideal", s.bubbleOverIdeal},
          {"peak_activation_units", s.peakActivationUnits},
          {"rank_files", s.rankFiles}};
}

inline nlohmann::json toJson(const PlannerReport &p) {
  nlohmann::json runnerUps = nlohmann::json::array();
  for (const RunnerUp &c : p.runnerUps)
    runnerUps.push_back({{"schedule", c.schedule},
                         {"chunks", c.chunks},
                         {"microbatches", c.microbatches},
                         {"replicas", c.replicas},
                         {"partition", c.origin},
                         {"time_per_minibatch_s", c.timePerMinibatch},
                         {"time_per_sample_s", c.timePerSample},
                         {"makespan_s", c.makespan},
                         {"bubble_flush", c.bubbleFlush},
                         {"peak_device_bytes", c.peakDeviceBytes}});
  const nlohmann::json batch = {
      {"samples_per_step", p.samplesPerStep ? nlohmann::json(*p.samplesPerStep) : nlohmann::json(nullptr)},
      {"source", p.batchSource}};
  return {{"objective", p.objective},   {"batch", batch}, {"evaluated", p.evaluated},
          {"rejected", p.rejected},     {"rejections", p.rejections},
          {"search_s", p.searchSeconds}, {"runner_ups", runnerUps}};
}

/// plan.json's content: the one writer (member order is the JSON library's,
/// sorted).
inline nlohmann::json toJson(const PlanFile &f) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["pipeline"] = toJson(f.pipeline);
  if (f.runtime)
    j["runtime"] = toJson(*f.runtime);
  j["topology"] = toJson(f.topology);
  j["partition"] = toJson(f.partition);
  nlohmann::json stages = nlohmann::json::array();
  for (const Stage &s : f.stages)
    stages.push_back(toJson(s));
  j["stages"] = stages;
  if (!f.opOrder.empty())
    j["op_order"] = f.opOrder;
  j["predictions"] = toJson(f.predictions);
  if (f.schedule)
    j["schedule"] = toJson(*f.schedule);
  if (f.planner)
    j["planner"] = toJson(*f.planner);
  return j;
}

} // namespace pipec::plan
