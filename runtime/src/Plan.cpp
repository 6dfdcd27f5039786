#include "Plan.h"

#include "pipec/input_file.h"
#include "pipec/job_plan.h"
#include "pipec/json_reader.h"
#include "pipec/rank_stream.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipec::rt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// A JSON file piperun reads (plan.json, the rank streams, a checkpoint's
// manifest): a regular file of bounded size (pipec/input_file.h), parsed
// from memory.
json readJson(const std::string &path, const char *what) {
  std::string text;
  try {
    text = io::readInputFile(path, what, io::kMaxTextFileBytes);
  } catch (const io::InputError &e) {
    throw Error(e.what());
  }
  try {
    return json::parse(text);
  } catch (const json::exception &e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
}

using Reader = json_io::Reader<Error>;
using json_io::brief;

std::string resolve(const std::string &dir, const std::string &p) {
  return fs::path(p).is_absolute() ? p : (fs::path(dir) / p).lexically_normal().string();
}

// pipeline.schedule names a family the streams were generated for; auto is
// resolved by pipec, so a compiled plan never names it. Checked on the text
// before the schema reads it (whose message would offer auto too).
void checkScheduleFamily(const std::string &planPath, const json &pipeline) {
  if (!pipeline.is_object() || !pipeline.contains("schedule") || !pipeline.at("schedule").is_string()) return;
  const std::string named = pipeline.at("schedule").get<std::string>();
  ScheduleKind family;
  if (parseChoice(named, family) && family != ScheduleKind::Auto) return;
  std::string families;
  for (int i = 0; i < choiceCount<ScheduleKind>(); ++i)
    if (ScheduleKind(i) != ScheduleKind::Auto)
      families += (families.empty() ? "" : ", ") + std::string(choiceName(ScheduleKind(i)));
  throw Error(planPath + ": pipeline.schedule \"" + named + "\" is not a schedule family (" + families + ")");
}
} // namespace

int Plan::numRanks() const {
  int n = 0;
  for (const auto &r : ranks) n += (int)r.size();
  return n;
}
int64_t Plan::tokensPerSample() const {
  // The model's integer input of one dimension per sample (token ids); in a
  // plan without roles, the first such field.
  for (const io::FieldSpec &f : dataFields)
    if ((f.dtype == PIPEC_I64 || f.dtype == PIPEC_I32) && f.shape.size() == 1 && f.role != DataRole::Label)
      return f.shape[0];
  return 0;
}
int Plan::scheduleRank(int stage, int replica) const {
  int r = 0;
  for (int s = 0; s < stage; ++s) r += replicasOf(s);
  return r + replica;
}
int Plan::stageOfScheduleRank(int r) const {
  for (int s = 0; s < stages; ++s) {
    if (r < replicasOf(s)) return s;
    r -= replicasOf(s);
  }
  return -1;
}
int Plan::replicaOfScheduleRank(int r) const { return r - scheduleRank(stageOfScheduleRank(r), 0); }
int Plan::mpiRankOf(int r) const {
  const int s = stageOfScheduleRank(r);
  return s < 0 ? -1 : ranks[s][replicaOfScheduleRank(r)];
}
int Plan::virtualStage(int stage, int chunk) const {
  return ::pipec::virtualStage(placement, stages, stage, chunk);
}
std::string Plan::scheduleFile(int r) const {
  return (fs::path(dir) / "schedule" / ("rank_" + std::to_string(r) + ".json")).string();
}

Plan loadPlan(const std::string &dirIn) {
  Plan p;
  p.dir = dirIn;
  p.planPath = (fs::path(dirIn) / "plan.json").string();
  if (!fs::is_directory(dirIn)) throw Error(dirIn + ": plan directory does not exist");
  const json j = readJson(p.planPath, "plan");
  const Reader R{p.planPath};
  // The file's one version (docs/plan-json.md, "Versions"): an older pipec's
  // plan keeps its facts elsewhere, so it is refused, not half read.
  if (!j.is_object() || R.get<std::string>(j, "format", "") != plan::kFormat)
    throw Error(p.planPath + ": format must be \"" + plan::kFormat + "\"");
  const json version = j.contains("version") ? j.at("version") : json();
  if (version != plan::kVersion)
    throw Error(p.planPath + ": plan.json version " + (version.is_null() ? std::string("(none)") : brief(version)) +
                ", this piperun reads version " + std::to_string(plan::kVersion) +
                "; re-run pipec to compile the job again (docs/plan-json.md, \"Versions\")");
  if (!j.contains("runtime"))
    throw Error(p.planPath + ": no \"runtime\" member (the plan was not compiled for piperun; see docs/plan-json.md)");
  // The pipeline and how to run it, read by the schema that wrote them
  // (pipec/job_plan.h); what follows checks what the values mean.
  if (!j.contains("pipeline")) throw Error(p.planPath + ": missing member pipeline");
  checkScheduleFamily(p.planPath, j.at("pipeline"));
  const plan::Pipeline pipeline = plan::pipelineFromJson(R, j.at("pipeline"));
  const plan::Runtime runtime = plan::runtimeFromJson(R, j.at("runtime"));
  if (!pipeline.schedule) throw Error(p.planPath + ": missing member pipeline.schedule");
  p.schedule = *pipeline.schedule;
  p.microbatches = pipeline.microbatches;
  p.chunks = pipeline.chunks;
  p.placement = pipeline.placement;
  p.asynchronous = pipeline.asynchronous;
  if (runtime.microbatchSize < 1 || runtime.microbatchSize > std::numeric_limits<int>::max())
    throw Error(p.planPath + ": runtime.microbatch_size must be in 1 .. " +
                std::to_string(std::numeric_limits<int>::max()) + ", is " + std::to_string(runtime.microbatchSize));
  p.microbatchSize = (int)runtime.microbatchSize;
  p.seed = runtime.seed;
  if (p.microbatches < 1 || p.chunks < 1)
    throw Error(p.planPath + ": pipeline.microbatches and chunks must be >= 1");
  if (p.microbatches > kMaxMicrobatches || p.chunks > kMaxChunks)
    throw Error(p.planPath + ": pipeline.microbatches (" + std::to_string(p.microbatches) + ") or chunks (" +
                std::to_string(p.chunks) + ") over the limit (" + std::to_string(kMaxMicrobatches) + ", " +
                std::to_string(kMaxChunks) + ")");
  if (p.placement == Placement::VShape && p.chunks != 2) throw Error(p.planPath + ": pipeline.placement \"v\" needs chunks = 2");
  p.target = runtime.target;
  p.precision = runtime.precision;
  p.cudaArch = runtime.cudaArch;
  for (const std::string &a : p.cudaArch)
    if (!isCudaArchitecture(a))
      throw Error(p.planPath + ": runtime.cuda_arch: \"" + a + "\" is not an architecture like " +
                  kCudaArchitectureExamples);
  p.gpu = runtime.gpu;

  // The ranks of each stage (a virtual stage when chunks > 1, in model
  // order) are its stages[].ranks; a pipeline position's are those of the
  // virtual stages it runs, which must name the same ranks.
  const json &stagesJson = j.contains("stages") ? j.at("stages") : json();
  if (!stagesJson.is_array() || stagesJson.empty()) throw Error(p.planPath + ": missing or empty member stages");
  if (stagesJson.size() > (size_t)kMaxStages)
    throw Error(p.planPath + ": " + std::to_string(stagesJson.size()) + " stages, over the limit of " +
                std::to_string(kMaxStages));
  const std::vector<plan::Stage> stages = plan::fromJson<std::vector<plan::Stage>>(R, stagesJson, "stages");
  if (stages.size() % p.chunks != 0)
    throw Error(p.planPath + ": " + std::to_string(stages.size()) + " stages are not pipeline.chunks = " +
                std::to_string(p.chunks) + " virtual stages on each pipeline position");
  p.stages = (int)stages.size() / p.chunks;
  std::vector<int> seen;
  for (int s = 0; s < p.stages; ++s) {
    const int first = p.virtualStage(s, 0);
    const std::string where = "stages[" + std::to_string(first) + "]";
    const std::vector<int> &ranks = stages[first].ranks;
    if (ranks.empty()) throw Error(p.planPath + ": " + where + ".ranks is empty");
    for (int c = 1; c < p.chunks; ++c) {
      const int other = p.virtualStage(s, c);
      const std::string at = "stages[" + std::to_string(other) + "]";
      if (stages[other].ranks != ranks)
        throw Error(p.planPath + ": " + at + ".ranks differ from " + where + ".ranks, but both virtual stages run on "
                    "pipeline position " + std::to_string(s) + " (" + choiceName(p.placement) + " placement)");
    }
    for (int r : ranks) {
      if (r < 0) throw Error(p.planPath + ": " + where + ".ranks has a negative rank");
      for (int q : seen)
        if (q == r) throw Error(p.planPath + ": rank " + std::to_string(r) + " appears in two stages' ranks");
      seen.push_back(r);
    }
    p.ranks.push_back(ranks);
  }
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < (int)seen.size(); ++i)
    if (seen[i] != i)
      throw Error(p.planPath + ": stages[].ranks must cover ranks 0.." + std::to_string(seen.size() - 1) +
                  " exactly (rank " + std::to_string(i) + " is missing)");

  const int V = p.stages * p.chunks;
  if ((int)runtime.stages.size() != V)
    throw Error(p.planPath + ": runtime.stages must list " + std::to_string(V) +
                " virtual stages (stages x chunks), found " + std::to_string(runtime.stages.size()));
  p.vstages.resize(V);
  std::vector<bool> have(V, false);
  for (size_t i = 0; i < runtime.stages.size(); ++i) {
    const plan::StageFiles &files = runtime.stages[i];
    const std::string where = "runtime.stages[" + std::to_string(i) + "]";
    VirtualStage v;
    if (files.id < 0 || files.id >= V || have[files.id])
      throw Error(p.planPath + ": " + where + ".id " + std::to_string(files.id) + " is out of range or repeated");
    v.id = (int)files.id;
    have[v.id] = true;
    v.library = resolve(p.dir, files.library);
    v.weights = resolve(p.dir, files.weights);
    for (int s = 0; s < p.stages; ++s)
      for (int c = 0; c < p.chunks; ++c)
        if (p.virtualStage(s, c) == v.id) v.stage = s, v.chunk = c;
    p.vstages[v.id] = v;
  }

  // The optimizer as written (doubles: resolveOptimizer checks the ranges and
  // what a float holds) and as the stages run it.
  p.optimizerAsWritten = runtime.optimizer;
  const plan::Optimizer &o = runtime.optimizer;
  // sgd-momentum is SGD with its momentum given.
  p.optimizer.rule = usesAdam(o.rule) ? o.rule : Optimizer::Sgd;
  p.optimizer.lr = (float)o.lr;
  p.optimizer.weightDecay = (float)o.weightDecay;
  p.optimizer.momentum = (float)o.momentum;
  p.optimizer.beta1 = (float)o.beta1;
  p.optimizer.beta2 = (float)o.beta2;
  p.optimizer.epsilon = (float)o.epsilon;
  p.optimizer.maxGradNorm = (float)o.maxGradNorm.value_or(0.0);

  // Tied parameters: [{"name": "wte.weight", "stages": [0, 3]}, ...]
  for (size_t i = 0; i < runtime.tied.size(); ++i) {
    const std::string where = "runtime.tied[" + std::to_string(i) + "]";
    TiedParam t;
    t.name = runtime.tied[i].name;
    for (int64_t s : runtime.tied[i].stages) {
      if (s < 0 || s >= V)
        throw Error(p.planPath + ": " + where + ".stages: stage " + std::to_string(s) + " is not a virtual stage (0.." +
                    std::to_string(V - 1) + ")");
      t.stages.push_back((int)s);
    }
    if (t.name.empty()) throw Error(p.planPath + ": " + where + ".name is empty");
    std::sort(t.stages.begin(), t.stages.end());
    if (t.stages.size() < 2 || std::adjacent_find(t.stages.begin(), t.stages.end()) != t.stages.end())
      throw Error(p.planPath + ": " + where + ".stages must list at least two different stages");
    for (const TiedParam &other : p.tied)
      if (other.name == t.name) throw Error(p.planPath + ": " + where + ": parameter " + t.name + " is listed twice");
    p.tied.push_back(t);
  }

  p.syntheticSamples = runtime.syntheticSamples.value_or((uint64_t)p.microbatchSize * p.microbatches * 16);
  if (p.syntheticSamples == 0) throw Error(p.planPath + ": runtime.data.synthetic_samples must be >= 1");
  for (size_t i = 0; i < runtime.dataFields.size(); ++i) {
    const plan::DataField &field = runtime.dataFields[i];
    const std::string where = "runtime.data.fields[" + std::to_string(i) + "]";
    io::FieldSpec f;
    f.name = field.name;
    f.dtype = io::dtypeFromName(field.dtype);
    if (!f.dtype)
      throw Error(p.planPath + ": " + where + ".dtype \"" + field.dtype + "\" is not f32, f64, i64, i32 or bool");
    f.shape = field.shape;
    if (f.shape.size() > 16 || !io::checkedElementCount(f.shape, std::numeric_limits<int64_t>::max() / 8))
      throw Error(p.planPath + ": " + where + ".shape " + io::shapeString(f.shape) +
                  " has a negative dimension, more than 16 dimensions or too many elements");
    const bool isFloat = f.dtype == PIPEC_F32 || f.dtype == PIPEC_F64;
    f.low = field.low.value_or(isFloat ? -1.0 : 0.0);
    f.high = field.high.value_or(isFloat ? 1.0 : 2.0);
    if (!(f.high > f.low)) throw Error(p.planPath + ": " + where + ": high must be > low");
    f.role = field.role;
    p.dataFields.push_back(f);
  }
  return p;
}

// ---------------------------------------------------------------- streams

RankStream loadRankStream(const std::string &path) {
  RankStream rs{stream::rankFileFromJson(Reader{path}, readJson(path, "schedule file")), path};
  return rs;
}

// ---------------------------------------------------------------- plan vs schedule files
namespace {

std::string listMicrobatches(const std::vector<int> &mbs) {
  std::string s;
  for (size_t i = 0; i < mbs.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(mbs[i]);
  if (mbs.size() > 8) s += ", ... (" + std::to_string(mbs.size()) + " in all)";
  return mbs.empty() ? "none" : s;
}
} // namespace

void checkRankStream(const Plan &plan, const RankStream &s, int r) {
  const std::string &sf = s.path;
  const int stage = plan.stageOfScheduleRank(r), replica = plan.replicaOfScheduleRank(r);
  const int replicas = plan.replicasOf(stage);
  if (s.rank != r || s.stage != stage || s.replica != replica)
    throw Error(sf + ": stream is for rank " + std::to_string(s.rank) + " (stage " + std::to_string(s.stage) +
                ", replica " + std::to_string(s.replica) + "), " + plan.planPath + " maps schedule rank " +
                std::to_string(r) + " to stage " + std::to_string(stage) + ", replica " + std::to_string(replica));
  const int m = plan.microbatches;
  for (size_t i = 0; i < s.instrs.size(); ++i) {
    const Instr &in = s.instrs[i];
    const std::string at = sf + ": #" + std::to_string(i) + " " + toString(in) + ": ";
    if (in.mb < -1 || in.chunk < -1 || in.peer < -1 || in.version < -1)
      throw Error(at + "a negative micro-batch, chunk, peer or version");
    if (in.mb >= m)
      throw Error(at + "micro-batch " + std::to_string(in.mb) + " is out of range: " + plan.planPath +
                  " says pipeline.microbatches = " + std::to_string(m));
    if (in.chunk >= plan.chunks)
      throw Error(at + "chunk " + std::to_string(in.chunk) + " is out of range: " + plan.planPath +
                  " says pipeline.chunks = " + std::to_string(plan.chunks));
    if ((isCompute(in.op) || isP2P(in.op)) && (in.mb < 0 || in.chunk < 0))
      throw Error(at + "needs a micro-batch and a chunk");
    if (in.op == Op::Load && in.mb < 0) throw Error(at + "needs a micro-batch");
    if (isP2P(in.op) && (in.peer < 0 || in.peer >= plan.numRanks()))
      throw Error(at + "peer " + std::to_string(in.peer) + " is not a rank of the plan (0.." +
                  std::to_string(plan.numRanks() - 1) + ")");
    if (in.paired && !pairedBackward(s.instrs, i))
      throw Error(at + "is paired, but only a FWD followed by a BWD or BWD_INPUT is an F&B pair");
    if (in.op == Op::AllReduce && in.peer >= 0 && in.peer != stage)
      throw Error(at + "all-reduces stage " + std::to_string(in.peer) + ", but this rank runs stage " +
                  std::to_string(stage));
  }
  // The optimizer steps: a synchronous schedule updates once per iteration
  // (STEP, or ZB-H2's SPEC_STEP), an asynchronous one at least once. A
  // stream without one would train on while its weights never change.
  int steps = 0;
  for (const Instr &in : s.instrs) steps += in.op == Op::Step || in.op == Op::SpecStep;
  if (plan.asynchronous ? steps < 1 : steps != 1)
    throw Error(sf + ": the stream has " + std::to_string(steps) + " optimizer steps (STEP or SPEC_STEP) per iteration, " +
                "but " + plan.planPath + " says pipeline.asynchronous = " + (plan.asynchronous ? "true" : "false") +
                (plan.asynchronous ? ", which needs at least one" : ", which needs exactly one"));
  // Micro-batch mb runs on replica mb mod R of every stage (docs/schedules.md):
  // each chunk of this rank must run the forward of exactly those micro-batches
  // of the plan's m, once each. A plan whose m disagrees with the schedule's
  // would otherwise train on other samples with another gradient scale.
  for (int c = 0; c < plan.chunks; ++c) {
    std::vector<int> got, want;
    for (const Instr &in : s.instrs)
      if (in.op == Op::Fwd && in.chunk == c) got.push_back(in.mb);
    for (int mb = replica; mb < m; mb += replicas) want.push_back(mb);
    std::vector<int> sorted = got;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != want)
      throw Error(sf + ": chunk " + std::to_string(c) + " runs the forward of micro-batches " + listMicrobatches(got) +
                  ", but " + plan.planPath + " says pipeline.microbatches = " + std::to_string(m) +
                  ", which gives this rank (stage " + std::to_string(stage) + ", replica " + std::to_string(replica) +
                  " of " + std::to_string(replicas) + ") micro-batches " + listMicrobatches(want) +
                  " (the plan and its schedule files disagree)");
  }
}

RankStream loadPlanStream(const Plan &plan, int r) {
  RankStream s = loadRankStream(plan.scheduleFile(r));
  checkRankStream(plan, s, r);
  return s;
}

// ---------------------------------------------------------------- checkpoints
std::string resolveCheckpointDir(const std::string &dirIn) {
  fs::path dir(dirIn);
  std::error_code ec;
  if (fs::symlink_status(dir / "manifest.json", ec).type() == fs::file_type::not_found) {
    const std::string latestPath = (dir / "latest").string();
    if (fs::symlink_status(latestPath, ec).type() == fs::file_type::not_found)
      throw Error(dirIn + ": neither a checkpoint (manifest.json) nor a checkpoint directory (latest)");
    std::string name;
    try {
      name = io::readInputFile(latestPath, "checkpoint pointer", 4096);
    } catch (const io::InputError &e) {
      throw Error(e.what());
    }
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    // One directory name beside `latest` (what piperun writes: iter_<n>).
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        std::any_of(name.begin(), name.end(), [](char ch) { return (unsigned char)ch < 0x20 || ch == 0x7f; })) {
      std::string shown = name.substr(0, 64);
      for (char &ch : shown)
        if ((unsigned char)ch < 0x20 || ch == 0x7f) ch = '?';
      throw Error(latestPath + ": does not name a checkpoint directory beside it (\"" + shown +
                  "\"; expected one line like iter_<n>)");
    }
    dir /= name;
  }
  return dir.string();
}

CheckpointManifest readCheckpointManifest(const std::string &dirIn, const Plan &plan, int64_t iters, uint64_t seed) {
  CheckpointManifest c;
  const fs::path dir = resolveCheckpointDir(dirIn);
  c.dir = dir.string();
  c.path = (dir / "manifest.json").string();
  const json m = readJson(c.path, "checkpoint manifest");
  const Reader R{c.path};
  if (!m.is_object() || m.value("format", json()) != kCheckpointFormat)
    throw Error(c.path + ": format must be " + kCheckpointFormat);
  const ManifestFile manifest = schema::fromJson<ManifestFile>(R, m);
  c.iteration = manifest.iteration;
  if (c.iteration < 0)
    throw Error(c.path + ": iteration " + std::to_string(c.iteration) + " is negative");
  if (c.iteration > iters)
    throw Error(c.path + ": the checkpoint is at iteration " + std::to_string(c.iteration) + ", beyond --iters " +
                std::to_string(iters) + " (the iteration count to reach)");
  // The data position is the iteration: iteration n starts at sample
  // n x m x B under any plan with the same samples per step.
  const int64_t samples = plan.microbatches * plan.microbatchSize;
  if (manifest.microbatches <= 0 || manifest.microbatchSize <= 0 ||
      manifest.microbatches > INT64_MAX / manifest.microbatchSize)
    throw Error(c.path + ": microbatches " + std::to_string(manifest.microbatches) + " of " +
                std::to_string(manifest.microbatchSize) + " samples is not a mini-batch");
  if (manifest.microbatches * manifest.microbatchSize != samples)
    throw Error(c.path + ": the checkpoint was trained with " +
                std::to_string(manifest.microbatches * manifest.microbatchSize) + " samples per optimizer step (" +
                std::to_string(manifest.microbatches) + " micro-batches of " + std::to_string(manifest.microbatchSize) +
                "); " + plan.planPath + " takes " + std::to_string(samples) + " (" + std::to_string(plan.microbatches) +
                " of " + std::to_string(plan.microbatchSize) +
                "): another mini-batch would change the training and the data position");
  if (manifest.virtualStages < 1 || manifest.virtualStages > kMaxCheckpointStageFiles)
    throw Error(c.path + ": virtual_stages " + std::to_string(manifest.virtualStages) + " is not between 1 and " +
                std::to_string(kMaxCheckpointStageFiles));
  c.virtualStages = manifest.virtualStages;
  c.seed = manifest.seed.value_or(seed);
  if (c.seed != seed)
    throw Error(c.path + ": the checkpoint was trained with seed " + std::to_string(c.seed) + ", this run uses seed " +
                std::to_string(seed) + " (pass --seed " + std::to_string(c.seed) + " to continue it)");
  return c;
}

std::string CheckpointManifest::stageFile(int vs) const {
  return (fs::path(dir) / ("stage_" + std::to_string(vs) + ".bin")).string();
}

CheckpointTensors::CheckpointTensors(const CheckpointManifest &manifest,
                                     const std::function<bool(const std::string &)> &wanted)
    : dir_(manifest.dir) {
  for (int64_t vs = 0; vs < manifest.virtualStages; ++vs) {
    files_.push_back(manifest.stageFile((int)vs));
    const std::string &file = files_.back();
    bool hasSteps = false;
    std::vector<Held> copies; // of tied tensors: compared once this file is open
    io::forEachTensor(file, "checkpoint file", [&](const io::TensorHeader &t, io::TensorDataReader &reader) {
      if (t.name == "meta/steps") {
        int64_t steps = 0;
        if (t.dtype != PIPEC_I64 || !t.shape.empty())
          throw Error(file + ": checkpoint tensor meta/steps is " + io::dtypeName(t.dtype) + io::shapeString(t.shape) +
                      ", expected i64[]");
        reader.read(&steps, 8);
        if (steps < 0) throw Error(file + ": checkpoint tensor meta/steps is " + std::to_string(steps) + ", negative");
        steps_.push_back(steps);
        hasSteps = true;
        return;
      }
      if (!wanted(t.name)) return;
      // A tied parameter (and its state) is in every file of a stage that
      // holds it, equal after every step (docs/stages.md).
      auto it = tensors_.find(t.name);
      if (it == tensors_.end()) {
        tensors_.emplace(t.name, Held{t, files_.size() - 1, reader.offset()});
      } else if (it->second.header.dtype != t.dtype || it->second.header.shape != t.shape) {
        throw Error(file + ": checkpoint tensor " + t.name + " differs from its copy in " + files_[it->second.file] +
                    " (a tied parameter)");
      } else {
        copies.push_back(Held{t, files_.size() - 1, reader.offset()});
      }
    });
    if (!hasSteps) throw Error(file + ": checkpoint has no tensor meta/steps");
    open_.push_back(std::make_unique<io::InputFile>(file, "checkpoint file", io::kMaxTensorFileBytes));
    // The copies' data compared piece by piece with the first one's.
    constexpr uint64_t kPiece = uint64_t(16) << 20;
    std::vector<char> a, b;
    for (const Held &copy : copies) {
      const std::string &name = copy.header.name;
      const Held &first = tensors_.at(name);
      for (uint64_t done = 0; done < copy.header.bytes; done += kPiece) {
        const uint64_t n = std::min(kPiece, copy.header.bytes - done);
        a.resize(n), b.resize(n);
        open_[first.file]->readAt(first.offset + done, a.data(), n, ("the data of " + name).c_str());
        open_[copy.file]->readAt(copy.offset + done, b.data(), n, ("the data of " + name).c_str());
        if (a != b)
          throw Error(file + ": checkpoint tensor " + name + " differs from its copy in " + files_[first.file] +
                      " (a tied parameter)");
      }
    }
  }
}

const io::TensorHeader *CheckpointTensors::lookup(const std::string &name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.header;
}

void CheckpointTensors::read(const std::string &name, uint64_t offset, void *dst, uint64_t n) const {
  const Held &h = tensors_.at(name);
  if (offset > h.header.bytes || n > h.header.bytes - offset)
    throw Error(files_[h.file] + ": reading bytes " + std::to_string(offset) + ".." + std::to_string(offset + n) +
                " of checkpoint tensor " + name + ", which has " + std::to_string(h.header.bytes));
  open_[h.file]->readAt(h.offset + offset, dst, n, ("the data of " + name).c_str());
}

std::string CheckpointTensors::describe() const {
  return dir_ + " (" + std::to_string(files_.size()) + " stage files)";
}

int64_t CheckpointTensors::stepsOf(const std::string &name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(dir_ + ": checkpoint has no tensor " + name);
  return steps_[it->second.file];
}

int64_t CheckpointTensors::commonSteps() const {
  for (size_t k = 1; k < steps_.size(); ++k)
    if (steps_[k] != steps_[0])
      throw Error(files_[k] + ": " + std::to_string(steps_[k]) + " optimizer steps, " + files_[0] + " " +
                  std::to_string(steps_[0]) + ": a stage of this plan would continue from both");
  return steps_.at(0);
}

// ---------------------------------------------------------------- transfer order
std::vector<Transfer> transfersOf(const RankStream &s) {
  std::vector<Transfer> t;
  for (size_t i = 0; i < s.instrs.size(); ++i) {
    const Instr &in = s.instrs[i];
    if (in.op == Op::SendAct || in.op == Op::SendGrad || in.op == Op::RecvAct || in.op == Op::RecvGrad)
      t.push_back({in.op, in.mb, in.chunk, in.peer, (int)i});
  }
  return t;
}

std::string checkTransferOrder(const Plan &plan, const std::vector<std::vector<Transfer>> &transfers,
                               const std::vector<std::string> &paths, int receiver) {
  const int R = (int)transfers.size();
  auto isSend = [](Op op) { return op == Op::SendAct || op == Op::SendGrad; };
  auto isGrad = [](Op op) { return op == Op::SendGrad || op == Op::RecvGrad; };
  // The bundle a transfer moves: (gradient?, micro-batch, receiving virtual stage).
  auto key = [&](int rank, const Transfer &t) {
    const int vs = plan.virtualStage(plan.stageOfScheduleRank(rank), t.chunk);
    const int dest = isSend(t.op) ? (isGrad(t.op) ? vs - 1 : vs + 1) : vs;
    return std::make_tuple(isGrad(t.op), t.mb, dest);
  };
  auto describe = [&](int rank, const Transfer &t) {
    const auto [grad, mb, dest] = key(rank, t);
    Instr in;
    in.op = t.op, in.mb = t.mb, in.chunk = t.chunk, in.peer = t.peer;
    return std::string(grad ? "the gradient" : "the activation") + " of micro-batch " + std::to_string(mb) +
           " for virtual stage " + std::to_string(dest) + " (#" + std::to_string(t.index) + " " + toString(in) + ")";
  };
  auto name = [&](int r) {
    const int mpi = plan.mpiRankOf(r);
    return "rank " + std::to_string(r) + (mpi != r ? " (MPI rank " + std::to_string(mpi) + ")" : "");
  };
  auto fileOf = [&](int r) { return r < (int)paths.size() ? paths[r] : "schedule rank " + std::to_string(r); };
  for (int to = 0; to < R; ++to) {
    if (receiver >= 0 && to != receiver) continue;
    for (int from = 0; from < R; ++from) {
      if (from == to) continue;
      std::vector<const Transfer *> sends, recvs;
      for (const Transfer &t : transfers[from])
        if (isSend(t.op) && t.peer == to) sends.push_back(&t);
      for (const Transfer &t : transfers[to])
        if (!isSend(t.op) && t.peer == from) recvs.push_back(&t);
      const std::string pair = "transfers from " + name(from) + " to " + name(to) + " (" + fileOf(from) + " -> " +
                               fileOf(to) + ")";
      const std::string why = "; NCCL matches the transfers between two ranks by order, so the ranks would deadlock "
                              "or exchange the wrong bundles";
      const size_t n = std::min(sends.size(), recvs.size());
      for (size_t k = 0; k < n; ++k)
        if (key(from, *sends[k]) != key(to, *recvs[k]))
          return pair + " are out of order: transfer " + std::to_string(k + 1) + " is " + describe(from, *sends[k]) +
                 " on the sender but " + describe(to, *recvs[k]) + " on the receiver" + why;
      if (sends.size() != recvs.size())
        return pair + " do not match: the sender sends " + std::to_string(sends.size()) + " bundles per iteration, the receiver receives " +
               std::to_string(recvs.size()) + "; the first unmatched is " +
               (sends.size() > n ? describe(from, *sends[n]) + " on the sender" : describe(to, *recvs[n]) + " on the receiver") + why;
    }
  }
  return "";
}

} // namespace pipec::rt
