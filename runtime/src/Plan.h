// The parts of a plan directory that piperun reads: plan.json (its
// "pipeline", "stages[].ranks" and "runtime" members, pipec/job_plan.h and
// docs/plan-json.md; an older version is refused) and the
// per-rank instruction streams schedule/rank_<r>.json (docs/schedules.md).
// No MPI here: the sequential reference (pipeseq) reads the same plan.
#pragma once

#include "pipec/dataset.h"
#include "pipec/input_file.h"
#include "pipec/job_plan.h"
#include "pipec/rank_stream.h"
#include "pipec/vocabulary.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec::rt {

// Errors found while reading or checking inputs; the message names the file
// and the reason (the caller prefixes the rank).
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// Ceilings on plan.json's counts (far above any real job), so that nothing
// sized from them overflows or allocates without bound.
inline constexpr int kMaxStages = 1 << 16;
inline constexpr int kMaxChunks = 64;
inline constexpr int kMaxMicrobatches = 1 << 20;

struct VirtualStage {
  int id = 0;    // model order 0 .. stages*chunks-1
  int stage = 0; // pipeline position (rank group) that runs it
  int chunk = 0; // which of that rank's chunks
  std::string library, weights; // absolute paths
};

// A parameter held by several virtual stages (a tied embedding): their
// partial gradients are summed over all ranks of all holders before STEP.
struct TiedParam {
  std::string name;        // ONNX name, as in the holders' stage descriptors
  std::vector<int> stages; // holder virtual-stage ids, ascending, >= 2 of them
};

struct OptimizerConfig {
  Optimizer rule = Optimizer::Sgd; // the update the stages run: sgd or adamw
  float lr = 0.01f, weightDecay = 0.0f, momentum = 0.0f;
  float beta1 = float(OptimizerDefaults::beta1), beta2 = float(OptimizerDefaults::beta2),
        epsilon = float(OptimizerDefaults::epsilon);
  float maxGradNorm = 0.0f; // 0: no clipping
};

struct Plan {
  std::string dir, planPath;
  // pipeline.* (each once in plan.json; the schedule files carry their own copy, checked)
  ScheduleKind schedule = ScheduleKind::OneFOneB; // informative: the streams decide what runs
  int stages = 1;           // pipeline positions p (plan.json's stages[] / chunks)
  int chunks = 1;           // virtual stages per rank
  Placement placement = Placement::Interleaved; // VShape (ZB-V): chunk 1 runs back up the ranks
  bool asynchronous = false;
  int microbatchSize = 1;   // samples per micro-batch (the model's batch dimension)
  int microbatches = 1;     // per optimizer step (iteration), over all replicas
  uint64_t seed = 0;
  std::vector<std::vector<int>> ranks; // per pipeline stage: MPI rank of each replica
  std::vector<VirtualStage> vstages;   // by id
  OptimizerConfig optimizer;
  plan::Optimizer optimizerAsWritten; // runtime.optimizer's values before the float conversion
  std::vector<io::FieldSpec> dataFields;
  uint64_t syntheticSamples = 0;
  std::vector<TiedParam> tied; // runtime.tied (optional)
  // Where the stages run (issue 7): runtime.target "cpu" (host buffers, MPI)
  // or "cuda" (device buffers, CUDA streams, NCCL); the rest informs checks
  // and the start-up banner.
  Target target = Target::Cpu;       // runtime.target
  Precision precision = Precision::F32; // runtime.precision (the stages' matrix products)
  std::vector<std::string> cudaArch; // runtime.cuda_arch: "sm_80", ... (what the stage libraries contain)
  std::string gpu;                   // runtime.gpu: the GPU kind the plan was made for ("H100"), may be empty

  int numRanks() const;
  /// Tokens per sample of a sequence model: the length of its first data
  /// field of integer ids with one dimension per sample (input_ids [T]);
  /// 0 for other models (images, features), whose progress shows samples only.
  int64_t tokensPerSample() const;
  int replicasOf(int stage) const { return (int)ranks[stage].size(); }
  // Schedule rank numbering (docs/schedules.md): stage-major, replica fastest.
  int scheduleRank(int stage, int replica) const;
  int stageOfScheduleRank(int r) const;
  int replicaOfScheduleRank(int r) const;
  int mpiRankOf(int scheduleRank) const;
  int virtualStage(int stage, int chunk) const;
  std::string scheduleFile(int scheduleRank) const;
};

// Reads PLAN_DIR/plan.json; throws Error naming the file and the member.
Plan loadPlan(const std::string &dir);

// The instruction set is the compiler's (pipec/vocabulary.h).
using ::pipec::Instr;
using ::pipec::Op;
using ::pipec::Placement;
using ::pipec::toString;

// A rank's stream file (pipec/rank_stream.h, docs/schedule-files.md).
struct RankStream : stream::RankFile {
  std::string path;
};
RankStream loadRankStream(const std::string &path);

// Checks schedule rank r's stream against plan.json, the one file that holds
// the pipeline's facts: the stream is rank r's (stage and replica as
// stages[].ranks map it); every micro-batch, chunk and peer is in range; each
// chunk runs the forward of exactly the micro-batches mb <
// pipeline.microbatches with mb mod R = replica, R the stage's replicas.
// Throws Error naming the stream file and plan.json.
void checkRankStream(const Plan &plan, const RankStream &s, int scheduleRank);
// Schedule rank r's stream, checked against the plan: what piperun and pipeseq
// use. schedule/schedule.json and the other files beside the streams are
// reports for people and tools; the runtime never reads them.
RankStream loadPlanStream(const Plan &plan, int scheduleRank);

// A checkpoint's manifest.json as written (docs/checkpoint-format.md): one
// schema (below) for the writer (Checkpoint.cpp) and the reader
// (readCheckpointManifest).
inline constexpr const char *kCheckpointFormat = "pipec.checkpoint/1";
struct ManifestFile {
  std::string format = kCheckpointFormat;
  int64_t iteration = 0;
  std::string schedule; // the family, for people: the checks below use the counts
  int64_t virtualStages = 0, microbatches = 0, microbatchSize = 0;
  std::optional<uint64_t> seed; // absent in checkpoints written before seeds were recorded
};

// The most stage files a checkpoint manifest may announce (virtual stages).
inline constexpr int64_t kMaxCheckpointStageFiles = int64_t(1) << 20;

// A checkpoint to resume from (docs/checkpoint-format.md).
struct CheckpointManifest {
  std::string dir, path; // the iter_<n> directory and its manifest.json
  int64_t iteration = 0;
  uint64_t seed = 0;
  int64_t virtualStages = 0; // of the plan that wrote it: its stage_<k>.bin files
  std::string stageFile(int virtualStage) const; // DIR/stage_<k>.bin
};

// A checkpoint's tensors by name, from every stage file it has, whatever
// plan wrote them: any plan of the same model resumes from it
// (docs/checkpoint-format.md, "Another plan"). Each rank indexes only the
// tensors `wanted` names, and reads their data from the files when it loads
// them (read): a checkpoint is never held in memory.
class CheckpointTensors {
public:
  CheckpointTensors(const CheckpointManifest &manifest, const std::function<bool(const std::string &)> &wanted);
  // The header of tensor `name` ("param/fc.weight"), or null.
  const io::TensorHeader *lookup(const std::string &name) const;
  // Bytes [offset, offset + n) of the data of tensor `name` (lookup's).
  void read(const std::string &name, uint64_t offset, void *dst, uint64_t n) const;
  // The checkpoint directory and its stage files' count, for messages.
  std::string describe() const;
  // The optimizer steps (meta/steps) of the stage file that holds `name`.
  int64_t stepsOf(const std::string &name) const;
  // Every stage file's steps, when they agree (a stage without parameters
  // continues from them); throws Error naming the files otherwise.
  int64_t commonSteps() const;

private:
  struct Held {
    io::TensorHeader header;
    size_t file;
    uint64_t offset; // of its data in the file
  };
  std::string dir_;
  std::map<std::string, Held> tensors_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<io::InputFile>> open_; // per file, for read()
  std::vector<int64_t> steps_; // per file
};
// The checkpoint directory --resume DIR names: DIR itself when it has a
// manifest.json, else the directory beside it that DIR/latest names (one
// line, one path component: iter_<n>). Throws Error naming the file.
std::string resolveCheckpointDir(const std::string &dir);
// Resolves DIR (a checkpoint) or DIR/latest (one line naming a directory
// beside it), reads the manifest (a bounded regular file) and checks it
// against the plan and the run: format, an integer iteration in 0..iters,
// the samples per optimizer step (micro-batches x micro-batch size) equal to
// the plan's, and the seed (when recorded) equal to the run's; the stages,
// chunks, replicas, schedule and target may differ. Throws Error naming the
// file.
CheckpointManifest readCheckpointManifest(const std::string &dir, const Plan &plan, int64_t iters, uint64_t seed);

// A point-to-point transfer of a stream (SEND_ACT/SEND_GRAD/RECV_ACT/RECV_GRAD),
// with its index in the stream.
struct Transfer {
  Op op = Op::SendAct;
  int mb = -1, chunk = -1, peer = -1, index = -1;
};
std::vector<Transfer> transfersOf(const RankStream &s);

// NCCL matches the point-to-point calls between two ranks by issue order, not
// by tag: for every ordered pair (sender, receiver) of schedule ranks, the
// sender's sends to the receiver must be the receiver's receives from the
// sender, bundle for bundle (direction, micro-batch, receiving virtual stage),
// in the same order. transfers[r] and paths[r]: schedule rank r's transfers
// and stream file. Checks the pairs whose receiver is `receiver` (all pairs
// when -1); returns "" or an error naming the pair, the position and the
// first differing micro-batch.
std::string checkTransferOrder(const Plan &plan, const std::vector<std::vector<Transfer>> &transfers,
                               const std::vector<std::string> &paths, int receiver = -1);

} // namespace pipec::rt

template <> struct pipec::schema::Schema<pipec::rt::ManifestFile> {
  template <class V, class M> static void members(V &v, M &m) {
    v.required("format", m.format);
    v.required("iteration", m.iteration);
    v.optional("schedule", m.schedule);
    v.required("virtual_stages", m.virtualStages);
    v.required("microbatches", m.microbatches);
    v.required("microbatch_size", m.microbatchSize);
    v.optional("seed", m.seed);
  }
};
