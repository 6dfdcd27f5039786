// plan.json as types (docs/plan-json.md): the one description of the file
// pipec writes and piperun reads, and its one writer.
//
// It lives in the runtime layer because the runtime deploys alone and reads
// the file: the compiler (compiler/Driver/TrainingJob.cpp assembles a
// PlanFile once from the planner's plan and the options) and the analysis
// libraries (analysis/Partition/PlanJson.cpp, `pipec partition --out`)
// include this header, never the other way round (docs/layers.md). What
// piperun reads (`pipeline`, `runtime`) is a schema below: one list of
// members per struct that the writer and the reader both walk, so each key
// is spelled once; the runtime's loadPlan (runtime/src/Plan.cpp) reads
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
  /// Synthetic values' range; absent: the runtime's default for the dtype.
  std::optional<double> low, high;
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

// ---------------------------------------------------------------- the schema
// The members of what piperun reads (`pipeline` and `runtime`), listed once
// per struct: the writer (toJson) and the reader (fromJson) walk the same
// list, so a key is spelled once. A list says of each member whether the
// file must have it (required) or the struct's value stands in for it
// (optional: a std::optional member is then left out, or written as null
// with Absent::Null).
enum class Absent { Omit, Null };

template <class V, class P> void pipelineMembers(V &v, P &p) {
  v.optional("schedule", p.schedule); // empty in a partition-only file: left out
  v.required("microbatches", p.microbatches);
  v.optional("asynchronous", p.asynchronous);
  v.optional("chunks", p.chunks);
  v.optional("placement", p.placement);
}

template <class V, class S> void stageFileMembers(V &v, S &s) {
  v.required("id", s.id);
  v.required("library", s.library);
  v.required("weights", s.weights);
  v.optional("arena_bytes", s.arenaBytes, Absent::Null);
  v.optional("entry_arena_bytes", s.entryArenaBytes);
  v.optional("scratch_bytes", s.scratchBytes, Absent::Null);
  v.optional("thread_scratch_bytes", s.threadScratchBytes, Absent::Null);
}

template <class V, class F> void dataFieldMembers(V &v, F &f) {
  v.required("name", f.name);
  v.required("dtype", f.dtype);
  v.required("shape", f.shape);
  v.optional("low", f.low);
  v.optional("high", f.high);
}

template <class V, class O> void optimizerMembers(V &v, O &o) {
  v.required("name", o.rule);
  v.required("lr", o.lr);
  v.optional("weight_decay", o.weightDecay);
  v.optional("momentum", o.momentum);
  v.optional("beta1", o.beta1);
  v.optional("beta2", o.beta2);
  v.optional("epsilon", o.epsilon);
  v.optional("max_grad_norm", o.maxGradNorm); // absent: no clipping
}

template <class V, class T> void tiedMembers(V &v, T &t) {
  v.required("name", t.name);
  v.required("stages", t.stages);
}

template <class V, class R> void runtimeMembers(V &v, R &r) {
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

namespace schema {
template <class T> struct IsOptional : std::false_type {};
template <class T> struct IsOptional<std::optional<T>> : std::true_type {};
template <class T> struct IsMap : std::false_type {};
template <class V> struct IsMap<std::map<std::string, V>> : std::true_type {};

/// Calls the member list of a struct of the schema with visitor v.
template <class V, class T> void visitMembers(V &v, T &x) {
  using Plain = std::remove_const_t<T>;
  if constexpr (std::is_same_v<Plain, Pipeline>) pipelineMembers(v, x);
  else if constexpr (std::is_same_v<Plain, StageFiles>) stageFileMembers(v, x);
  else if constexpr (std::is_same_v<Plain, DataField>) dataFieldMembers(v, x);
  else if constexpr (std::is_same_v<Plain, Optimizer>) optimizerMembers(v, x);
  else if constexpr (std::is_same_v<Plain, TiedParameter>) tiedMembers(v, x);
  else if constexpr (std::is_same_v<Plain, Runtime>) runtimeMembers(v, x);
  else static_assert(!sizeof(T), "not a struct of the schema");
}
template <class T> constexpr bool kIsStruct =
    std::is_same_v<T, Pipeline> || std::is_same_v<T, StageFiles> || std::is_same_v<T, DataField> ||
    std::is_same_v<T, Optimizer> || std::is_same_v<T, TiedParameter> || std::is_same_v<T, Runtime>;
/// A list of schema structs (written as an array of objects).
template <class T> struct IsStructList : std::false_type {};
template <class E> struct IsStructList<std::vector<E>> : std::bool_constant<kIsStruct<E>> {};

template <class T> nlohmann::json encode(const T &value);

/// Writes each member into `out`.
struct Writer {
  nlohmann::json &out;
  template <class T> void required(const char *key, const T &value) { out[key] = encode(value); }
  template <class T> void optional(const char *key, const T &value, Absent absent = Absent::Omit) {
    if constexpr (IsOptional<T>::value) {
      if (value)
        out[key] = encode(*value);
      else if (absent == Absent::Null)
        out[key] = nullptr;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!value.empty())
        out[key] = value;
    } else {
      out[key] = encode(value);
    }
  }
  template <class T> void optionalWrittenIf(bool written, const char *key, const T &value) {
    if (written)
      out[key] = encode(value);
  }
  template <class Members> void object(const char *key, Members &&inner) {
    nlohmann::json j = nlohmann::json::object();
    Writer w{j};
    inner(w);
    out[key] = std::move(j);
  }
};

template <class T> nlohmann::json encode(const T &value) {
  if constexpr (std::is_enum_v<T>) {
    return choiceName(value);
  } else if constexpr (kIsStruct<T>) {
    nlohmann::json j = nlohmann::json::object();
    Writer w{j};
    visitMembers(w, value);
    return j;
  } else if constexpr (IsStructList<T>::value) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto &e : value)
      j.push_back(encode(e));
    return j;
  } else {
    return nlohmann::json(value);
  }
}

/// Reads each member from `in` (at JSON path `path`), with errors naming the
/// file and the path.
template <class Error> struct Reader {
  const json_io::Reader<Error> &file;
  const nlohmann::json &in;
  std::string path;

  std::string pathOf(const char *key) const { return path.empty() ? std::string(key) : path + "." + key; }
  bool has(const char *key) const { return in.is_object() && in.contains(key) && !in.at(key).is_null(); }

  template <class T> void required(const char *key, T &field) {
    if (!in.is_object() || !in.contains(key))
      throw Error(file.file + ": missing member " + pathOf(key));
    field = decode<T>(in.at(key), pathOf(key));
  }
  template <class T> void optional(const char *key, T &field, Absent = Absent::Omit) {
    if (!has(key))
      return;
    if constexpr (IsOptional<T>::value)
      field = decode<typename T::value_type>(in.at(key), pathOf(key));
    else
      field = decode<T>(in.at(key), pathOf(key));
  }
  template <class T> void optionalWrittenIf(bool, const char *key, T &field) { optional(key, field); }
  template <class Members> void object(const char *key, Members &&inner) {
    static const nlohmann::json empty = nlohmann::json::object();
    if (has(key) && !in.at(key).is_object())
      throw Error(file.file + ": member " + pathOf(key) + " has the wrong type (" + json_io::brief(in.at(key)) + ")");
    Reader sub{file, has(key) ? in.at(key) : empty, pathOf(key)};
    inner(sub);
  }

  template <class T> T decode(const nlohmann::json &v, const std::string &name) const {
    if constexpr (std::is_enum_v<T>) {
      const std::string text = file.template convert<std::string>(v, name);
      T value{};
      if (!parseChoice(text, value))
        throw Error(file.file + ": " + name + " must be " + choiceNames<T>(" or ") + ", is \"" + text + "\"");
      return value;
    } else if constexpr (kIsStruct<T>) {
      if (!v.is_object())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T value{};
      Reader sub{file, v, name};
      visitMembers(sub, value);
      return value;
    } else if constexpr (IsStructList<T>::value) {
      if (!v.is_array())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T out;
      for (size_t i = 0; i < v.size(); ++i)
        out.push_back(decode<typename T::value_type>(v[i], name + "[" + std::to_string(i) + "]"));
      return out;
    } else if constexpr (IsMap<T>::value) {
      if (!v.is_object())
        throw Error(file.file + ": member " + name + " has the wrong type (" + json_io::brief(v) + ")");
      T out;
      for (const auto &[key, item] : v.items())
        out[key] = file.template convert<typename T::mapped_type>(item, name + "." + key);
      return out;
    } else {
      return file.template convert<T>(v, name);
    }
  }
};
} // namespace schema

// ---------------------------------------------------------------- the writer
inline nlohmann::json toJson(const Pipeline &p) { return schema::encode(p); }
inline nlohmann::json toJson(const Runtime &r) { return schema::encode(r); }

// ---------------------------------------------------------------- the reader
/// plan.json's `pipeline` and `runtime` sections as the schema reads them
/// (the runtime's loadPlan then checks what the values mean).
template <class Error> Pipeline pipelineFromJson(const json_io::Reader<Error> &file, const nlohmann::json &j) {
  return schema::Reader<Error>{file, j, ""}.template decode<Pipeline>(j, "pipeline");
}
template <class Error> Runtime runtimeFromJson(const json_io::Reader<Error> &file, const nlohmann::json &j) {
  return schema::Reader<Error>{file, j, ""}.template decode<Runtime>(j, "runtime");
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
