// plan.json as types (docs/plan-json.md): the one description of the file
// pipec writes and piperun reads, and its one writer.
//
// It lives in the runtime layer because the runtime deploys alone and reads
// the file: the compiler (compiler/Driver/WriteJob.cpp adds the runtime
// section to the planner's PlanFile, which pipec-partition leaves on the
// module) and the analysis libraries (analysis/Partition/PlanJson.cpp,
// `pipec partition --out`) include this header, never the other way round
// (docs/layers.md). The whole file is a schema below: one list of members
// per struct (Schema<T>) that the writer and the reader both walk, so each
// key is spelled once; the runtime's loadPlan (runtime/src/Plan.cpp) reads
// through it and then checks what the values mean. Header-only, so that no
// layer needs another library to write or read the file.
//
// Each fact is in one place: the schedule family, micro-batch count,
// asynchronous flag, chunks and placement only in `pipeline`; the ranks of
// each stage only in `stages[].ranks`; what the descriptive sections
// (partition, predictions, schedule, planner) add is derived or measured,
// never a copy.
#pragma once

#include "json_reader.h"
#include "json_schema.h"
#include "vocabulary.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
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
  /// The family (written "1f1b", "zb-v", ...: its Choices spelling); absent
  /// in a partition-only file. A compiled plan never names auto.
  std::optional<ScheduleKind> schedule;
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
  /// Synthetic values' range; absent: the runtime's default for the dtype.
  std::optional<double> low, high;
  /// An input of the model or its labels (absent in plans written before).
  std::optional<DataRole> role;
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
  int64_t parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0, stashBytes = 0, activationBytes = 0,
          memoryBytes = 0;
};

/// Where predictions.time_per_minibatch_s comes from.
enum class TimeSource : unsigned char { Analytic, Simulated };

struct Predictions {
  double timePerMicrobatch = 0, timePerMinibatch = 0, throughput = 0, bubbleSeconds = 0,
         bubbleFraction = 0;
  TimeSource source = TimeSource::Analytic;
  std::optional<double> analyticTimePerMinibatch; ///< PipeDream's estimate beside a simulated one
  int64_t inflightMicrobatches = 0, devicesUsed = 0;
  bool dataParallelFits = false;
  /// Written as null when data parallelism does not fit.
  std::optional<double> dataParallelTimePerMicrobatch, speedupOverDataParallel;
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
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::string origin;
  int64_t chunks = 1, microbatches = 1;
  std::vector<int> replicas;
  double timePerMinibatch = 0, timePerSample = 0, makespan = 0, bubbleFlush = 0,
         peakDeviceBytes = 0;
};

/// One micro-batch size the planner tried when it chose it (pipec's
/// --micro-batch-size search over a model whose batch dimension is free):
/// its samples per step and simulated time per sample, and why it was not
/// taken (no plan, or over the default samples per step).
struct MicrobatchSizeTried {
  int64_t size = 0;
  std::optional<int64_t> samplesPerStep;
  std::optional<double> timePerSample; ///< seconds per sample (mini-batch time / samples)
  std::string rejection;               ///< empty when a plan was found
};

/// What the search found (not how long it took: the file, like the IR that
/// carries it until the job is written, is the same on every run).
struct PlannerReport {
  std::string objective = "simulated time per sample";
  /// Samples per optimizer step (micro-batch size x pipeline.microbatches,
  /// absent when the micro-batch size is unknown) and where the count came
  /// from (--batch-size, --microbatches or the planner's bounded choice).
  std::optional<int64_t> samplesPerStep;
  std::string batchSource;
  /// Where the micro-batch size came from (--micro-batch-size, the export,
  /// --input-shape or the planner's choice) and, when the planner chose it,
  /// every size it tried.
  std::string microbatchSizeSource;
  std::vector<MicrobatchSizeTried> microbatchSizesTried;
  int64_t evaluated = 0, rejected = 0;
  std::vector<std::string> rejections;
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

} // namespace pipec::plan

namespace pipec {
template <> struct Choices<plan::TimeSource> {
  static constexpr const char *spellings[] = {"analytic (PipeDream's model)", "simulated schedule"};
};
} // namespace pipec

// ---------------------------------------------------------------- the schema
// The members of every struct of the file, listed once per struct
// (pipec/json_schema.h): what piperun needs is required; what only describes
// the plan is optional, so that a plan written by hand (the runtime's tests)
// may leave it out.
namespace pipec::schema {

template <> struct Schema<plan::Pipeline> {
  template <class V, class P> static void members(V &v, P &p) {
    v.optional("schedule", p.schedule); // absent in a partition-only file: left out
    v.required("microbatches", p.microbatches);
    v.optional("asynchronous", p.asynchronous);
    v.optional("chunks", p.chunks);
    v.optional("placement", p.placement);
  }
};

template <> struct Schema<plan::StageFiles> {
  template <class V, class S> static void members(V &v, S &s) {
    v.required("id", s.id);
    v.required("library", s.library);
    v.required("weights", s.weights);
    v.optional("arena_bytes", s.arenaBytes, Absent::Null);
    v.optional("entry_arena_bytes", s.entryArenaBytes);
    v.optional("scratch_bytes", s.scratchBytes, Absent::Null);
    v.optional("thread_scratch_bytes", s.threadScratchBytes, Absent::Null);
  }
};

template <> struct Schema<plan::DataField> {
  template <class V, class F> static void members(V &v, F &f) {
    v.required("name", f.name);
    v.required("dtype", f.dtype);
    v.required("shape", f.shape);
    v.optional("low", f.low);
    v.optional("high", f.high);
    v.optional("role", f.role);
  }
};

template <> struct Schema<plan::Optimizer> {
  template <class V, class O> static void members(V &v, O &o) {
    v.required("name", o.rule);
    v.required("lr", o.lr);
    v.optional("weight_decay", o.weightDecay);
    v.optional("momentum", o.momentum);
    v.optional("beta1", o.beta1);
    v.optional("beta2", o.beta2);
    v.optional("epsilon", o.epsilon);
    v.optional("max_grad_norm", o.maxGradNorm); // absent: no clipping
  }
};

template <> struct Schema<plan::TiedParameter> {
  template <class V, class T> static void members(V &v, T &t) {
    v.required("name", t.name);
    v.required("stages", t.stages);
  }
};

template <> struct Schema<plan::Runtime> {
  template <class V, class R> static void members(V &v, R &r) {
    v.required("microbatch_size", r.microbatchSize);
    v.optional("seed", r.seed);
    v.optional("target", r.target);
    v.optional("precision", r.precision);
    v.optionalWrittenIf(r.target == Target::Cuda, "cuda_arch", r.cudaArch);
    v.optionalWrittenIf(r.target == Target::Cuda, "gpu", r.gpu);
    v.required("stages", r.stages);
    v.required("optimizer", r.optimizer);
    v.object("data", [&](auto &data) {
      data.optional("fields", r.dataFields);
      data.optional("synthetic_samples", r.syntheticSamples);
    });
    v.optional("tied", r.tied);
  }
};

template <> struct Schema<plan::Level> {
  template <class V, class L> static void members(V &v, L &l) {
    v.required("name", l.name);
    v.required("fanout", l.fanout);
    v.required("bandwidth_GBps", l.bandwidthGBps);
  }
};

template <> struct Schema<plan::Topology> {
  template <class V, class T> static void members(V &v, T &t) {
    v.required("device", t.device);
    v.optional("device_memory", t.deviceMemory);
    v.optional("devices", t.devices);
    v.optional("levels", t.levels);
  }
};

template <> struct Schema<plan::Partition> {
  template <class V, class P> static void members(V &v, P &p) {
    v.required("source", p.source);
    v.optional("layers", p.layers);
    v.optional("recompute", p.recompute);
    v.optional("memory_limit_bytes", p.memoryLimitBytes, Absent::Null);
  }
};

template <> struct Schema<plan::Stage> {
  template <class V, class S> static void members(V &v, S &s) {
    v.optional("id", s.id);
    v.optional("first_op", s.firstOp);
    v.optional("last_op", s.lastOp);
    v.optional("first_op_index", s.firstOpIndex);
    v.optional("last_op_index", s.lastOpIndex);
    v.optional("replicas", s.replicas);
    v.optional("replicas_per_level", s.replicasPerLevel);
    v.required("ranks", s.ranks);
    v.optional("compute_s", s.computeSeconds);
    v.optional("send_s", s.sendSeconds);
    v.optional("send_bytes", s.sendBytes);
    v.optional("send_level", s.sendLevel);
    v.optional("allreduce_s", s.allreduceSeconds);
    v.optional("inflight_microbatches", s.inflight);
    v.optional("parameter_bytes", s.parameterBytes);
    v.optional("gradient_bytes", s.gradientBytes);
    v.optional("optimizer_bytes", s.optimizerBytes);
    v.optional("stash_bytes", s.stashBytes);
    v.optional("activation_bytes", s.activationBytes);
    v.optional("memory_bytes", s.memoryBytes);
  }
};

template <> struct Schema<plan::Predictions> {
  template <class V, class P> static void members(V &v, P &p) {
    v.required("time_per_microbatch_s", p.timePerMicrobatch);
    v.required("time_per_minibatch_s", p.timePerMinibatch);
    v.required("time_per_minibatch_source", p.source);
    v.optional("dp_estimate_time_per_minibatch_s", p.analyticTimePerMinibatch);
    v.required("throughput_microbatches_per_s", p.throughput);
    v.required("bubble_s", p.bubbleSeconds);
    v.required("bubble_fraction", p.bubbleFraction);
    v.required("inflight_microbatches", p.inflightMicrobatches);
    v.required("devices_used", p.devicesUsed);
    v.required("data_parallel_fits", p.dataParallelFits);
    v.optional("data_parallel_time_per_microbatch_s", p.dataParallelTimePerMicrobatch, Absent::Null);
    v.optional("speedup_over_data_parallel", p.speedupOverDataParallel, Absent::Null);
  }
};

template <> struct Schema<plan::ScheduleReport> {
  template <class V, class S> static void members(V &v, S &s) {
    v.required("makespan_s", s.makespan);
    v.required("bubble_flush", s.bubbleFlush);
    v.required("bubble_steady_state", s.bubbleSteadyState);
    v.required("bubble_over_ideal", s.bubbleOverIdeal);
    v.required("peak_activation_units", s.peakActivationUnits);
    v.required("rank_files", s.rankFiles);
  }
};

template <> struct Schema<plan::RunnerUp> {
  template <class V, class R> static void members(V &v, R &r) {
    v.required("schedule", r.schedule);
    v.required("chunks", r.chunks);
    v.required("microbatches", r.microbatches);
    v.required("replicas", r.replicas);
    v.required("partition", r.origin);
    v.required("time_per_minibatch_s", r.timePerMinibatch);
    v.required("time_per_sample_s", r.timePerSample);
    v.required("makespan_s", r.makespan);
    v.required("bubble_flush", r.bubbleFlush);
    v.required("peak_device_bytes", r.peakDeviceBytes);
  }
};

template <> struct Schema<plan::MicrobatchSizeTried> {
  template <class V, class M> static void members(V &v, M &m) {
    v.required("size", m.size);
    v.optional("samples_per_step", m.samplesPerStep);
    v.optional("time_per_sample_s", m.timePerSample);
    v.optional("rejection", m.rejection);
  }
};

template <> struct Schema<plan::PlannerReport> {
  template <class V, class P> static void members(V &v, P &p) {
    v.required("objective", p.objective);
    v.object("batch", [&](auto &batch) {
      batch.optional("samples_per_step", p.samplesPerStep, Absent::Null);
      batch.required("source", p.batchSource);
      batch.optional("microbatch_size_source", p.microbatchSizeSource);
      batch.optionalWrittenIf(!p.microbatchSizesTried.empty(), "microbatch_sizes_tried", p.microbatchSizesTried);
    });
    v.required("evaluated", p.evaluated);
    v.required("rejected", p.rejected);
    v.required("rejections", p.rejections);
    v.required("runner_ups", p.runnerUps);
  }
};

template <> struct Schema<plan::PlanFile> {
  template <class V, class F> static void members(V &v, F &f) {
    v.required("pipeline", f.pipeline);
    v.optional("runtime", f.runtime);
    v.required("topology", f.topology);
    v.required("partition", f.partition);
    v.required("stages", f.stages);
    v.optionalWrittenIf(!f.opOrder.empty(), "op_order", f.opOrder);
    v.required("predictions", f.predictions);
    v.optional("schedule", f.schedule);
    v.optional("planner", f.planner);
  }
};

} // namespace pipec::schema

namespace pipec::plan {

// ---------------------------------------------------------------- the writer
/// Any struct of the file as JSON (member order is the JSON library's,
/// sorted); a PlanFile with the format and version first.
template <class T> nlohmann::json toJson(const T &value) { return schema::encode(value); }
inline nlohmann::json toJson(const PlanFile &f) {
  nlohmann::json j = schema::encode(f);
  j["format"] = kFormat;
  j["version"] = kVersion;
  return j;
}

// ---------------------------------------------------------------- the reader
/// A value of the file read by its schema (the caller checks the format and
/// version, and what the values mean).
using schema::fromJson;
template <class Error> Pipeline pipelineFromJson(const json_io::Reader<Error> &file, const nlohmann::json &j) {
  return fromJson<Pipeline>(file, j, "pipeline");
}
template <class Error> Runtime runtimeFromJson(const json_io::Reader<Error> &file, const nlohmann::json &j) {
  return fromJson<Runtime>(file, j, "runtime");
}

} // namespace pipec::plan
