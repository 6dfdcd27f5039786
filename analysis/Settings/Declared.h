// The settings of pipec, each declared here once (docs/settings.md): the
// topology and partition, the planner, the schedule command, the cost model,
// training and code generation. Options structs bind their fields to these
// (`bind(settings::Binder &)`); nothing else declares an option of these names.
#ifndef PIPEC_ANALYSIS_SETTINGS_DECLARED_H
#define PIPEC_ANALYSIS_SETTINGS_DECLARED_H

#include "analysis/Partition/Partitioner.h"
#include "analysis/Partition/Topology.h"
#include "analysis/Schedule/Schedule.h"
#include "analysis/Settings/Settings.h"

namespace pipec::settings {

static_assert(partition::kMaxMicrobatches == schedule::kMaxMicrobatches,
              "--microbatches has one bound for the partition and the schedule");

// ------------------------------------------------------- topology and partition
inline constexpr Setting kCosts{"costs", "The cost table (CSV, docs/cost-table.md)", "file"};
inline constexpr Setting kGpus{
    "gpus", "N servers of G devices (NVLink inside, network between); at most 4096 per level and 65536 in all",
    "NxG"};
inline constexpr Setting kCluster{"cluster", "Up to 8 levels (docs/cluster-json.md)", "file"};
inline constexpr Setting kDevice{"device", "Device preset (default H100)", "name", partition::devicePresetNames};
inline constexpr Setting kIntraBandwidth{"intra-bw", "Override the preset's NVLink bandwidth (with --gpus)", "GB/s"};
inline constexpr Setting kInterBandwidth{"inter-bw", "Override the preset's network bandwidth (with --gpus)",
                                         "GB/s"};
inline constexpr Setting kMemoryLimit{"memory-limit", "Per-device memory, e.g. 16GiB, 80GB (default: the device's)",
                                      "size"};
inline constexpr Setting kHostMemory{
    "host-memory",
    "Memory of one host of CPU ranks, which its ranks (the G of --gpus NxG) share: a CPU job (--out, --target cpu) "
    "is planned against it (default: this machine's, or its container's limit when lower)",
    "size"};
inline constexpr IntSetting kStages{
    {"stages", "Exactly N pipeline stages (pipec MODEL: at most the devices, default chosen by the planner; "
               "pipec schedule: ranks per pipeline, at most 4096)",
     "N"},
    1,
    partition::kMaxDevices};
/// A declaration with a narrower range, for one command that accepts less.
constexpr IntSetting narrowed(IntSetting setting, int64_t min, int64_t max) {
  setting.min = min;
  setting.max = max;
  return setting;
}
/// `pipec schedule --stages`: the schedule library's bound.
inline constexpr IntSetting kScheduleStages = narrowed(kStages, 1, schedule::kMaxStages);
inline constexpr Setting kNoReplication{"no-replication", "A straight pipeline: no stage is replicated"};
inline constexpr IntSetting kMicrobatches{
    {"microbatches",
     "Micro-batches per mini-batch, one optimizer step over all replicas (pipec MODEL: default chosen by the "
     "planner; pipec partition: default 1; pipec schedule: P x V x M at most 1048576)",
     "M"},
    1,
    partition::kMaxMicrobatches};
/// The default bound on the samples per optimizer step when --batch-size is
/// not given (docs/planner.md, "The batch").
inline constexpr int64_t kDefaultMaxBatchSize = 1024;
inline constexpr IntSetting kBatchSize{
    {"batch-size",
     "Samples per optimizer step (the global batch, over all replicas): N / the model's micro-batch size "
     "micro-batches (default: the planner's choice of at most 1024 samples, or the fewest micro-batches the "
     "replicas need)",
     "N"},
    1,
    int64_t(partition::kMaxMicrobatches) * 1048576};
/// The largest micro-batch size the planner tries when it chooses one
/// (docs/planner.md, "The batch").
inline constexpr int64_t kMaxSearchedMicrobatchSize = 256;
inline constexpr IntSetting kMicrobatchSize{
    {"micro-batch-size",
     "Samples per micro-batch: the size of the batch dimension (dimension 0) of every model input, which the "
     "export must leave free (default: the export's fixed size, or the planner's choice among 1, 2, 4, ..., 256)",
     "b"},
    1,
    65536};
inline constexpr Setting kAsync{"async", "PipeDream 1F1B-RR: weight stashing, no flush"};
inline constexpr RecomputeMode kRecomputeBare = RecomputeMode::All;
inline constexpr ChoiceSetting<RecomputeMode> kRecompute{
    {"recompute",
     "Keep only stage inputs and recompute activations in the backward: all (bare flag), none, or auto (only the "
     "stages that need it to fit the memory limit)",
     "mode"},
    &kRecomputeBare};
inline constexpr Setting kPartitionFile{
    "partition", "Evaluate the stages of this file (plan.json schema) instead of searching", "file"};
inline constexpr Setting kJson{"json", "Print the summary as JSON"};
inline constexpr Setting kOut{"out", "Write the job (pipec MODEL), DIR/plan.json (pipec partition) or the schedule "
                                     "files (pipec schedule) into this directory",
                              "dir"};

// ------------------------------------------------------------------- planner
inline constexpr ChoiceSetting<ScheduleKind> kSchedule{
    {"schedule",
     "Pipeline schedule (pipec MODEL: default the planner picks among the synchronous ones, 1f1b-rr with --async; "
     "docs/schedules.md)",
     "name"}};
inline constexpr IntSetting kChunks{
    {"chunks",
     "Model chunks per rank for --schedule interleaved (zb-v: 2); the model is split into ranks x chunks virtual "
     "stages",
     "V"},
    1,
    schedule::kMaxChunks};
inline constexpr Setting kScheduleFile{
    "schedule-file",
    "Run the order of this schedule file, in PyTorch's CSV format (either variant; docs/schedules.md, \"CSV "
    "schedules\"): its ranks are the pipeline stages, its chunks, placement and micro-batches the plan's; the "
    "planner chooses the cut of the model",
    "FILE"};
inline constexpr RealSetting kFbOverlap{
    {"fb-overlap",
     "DualPipeV's F&B pairs: the share of the shorter of a pair's forward and backward that runs hidden behind the "
     "longer, so a pair takes F + B - X min(F, B) (default 0: one after the other, as piperun runs them; "
     "docs/schedules.md, \"DualPipeV\")",
     "X"},
    0,
    1};
inline constexpr Setting kVerticalSync{
    "vertical-sync", "With --async (1f1b-rr): every stage uses the weight version a micro-batch entered stage 0 with"};
inline constexpr IntSetting kCandidates{
    {"candidates", "Print the best N plans the planner evaluated, with their simulated times", "n"}, 0, 1000};
inline constexpr IntSetting kPlanRank{
    {"plan-rank", "Choose the K-th plan of the planner's ranking instead of the best (1); --candidates lists them",
     "k"},
    1,
    1000};
inline constexpr Setting kEachCandidate{
    "each-candidate", "With --out DIR: search once and write the job of every plan --candidates prints, plan K "
                      "into DIR/plan-K (as --plan-rank K --out DIR/plan-K would)"};

// ---------------------------------------------------------------- cost model
inline constexpr ChoiceSetting<Precision> kPrecision{{"precision", "Compute precision of matrix products", "name"}};
inline constexpr ChoiceSetting<Optimizer> kOptimizer{
    {"optimizer", "Optimizer (its state counts in memory; sgd-momentum: SGD with momentum 0.9 unless --momentum)",
     "name"}};
inline constexpr Setting kProfile{"profile", "Measured per-op times (docs/profile-json.md) overriding estimates",
                                  "profile.json"};
inline constexpr Setting kDumpCosts{"dump-costs", "Write the cost table, one row per op (docs/cost-table.md)",
                                    "costs.csv"};
inline constexpr RealSetting kLaunchOverhead{
    {"launch-overhead", "Seconds added to every op's estimate for its kernel launch", "s"}, 0, 1};

// ------------------------------------------------------------------ training
inline constexpr ChoiceSetting<Loss> kLoss{
    {"loss",
     "Loss appended to a model ending in logits (auto, the default: softmax-cross-entropy, or the model's own loss "
     "when its first output is a scalar)",
     "name"}};
inline constexpr RealSetting kLearningRate{{"lr", "Learning rate", "rate"}, 0, 1e6, /*minOpen=*/true};
inline constexpr RealSetting kMomentum{{"momentum", "SGD momentum", "m"}, 0, 1, false, /*maxOpen=*/true};
inline constexpr RealSetting kBeta1{{"beta1", "AdamW beta1", "b"}, 0, 1, false, /*maxOpen=*/true};
inline constexpr RealSetting kBeta2{{"beta2", "AdamW beta2", "b"}, 0, 1, false, /*maxOpen=*/true};
inline constexpr RealSetting kEpsilon{{"epsilon", "AdamW epsilon", "e"}, 0, 1, /*minOpen=*/true};
inline constexpr RealSetting kWeightDecay{
    {"weight-decay", "Weight decay (default: 0.01 for AdamW, 0 for SGD)", "d"}, 0, 1e6};

// ------------------------------------------------------------ weight stashing
inline constexpr IntSetting kWeightVersions{
    {"versions", "Weight versions each stage keeps (PipeDream's in-flight micro-batches; 0 or 1: none)", "n"},
    0,
    partition::kMaxMicrobatches};
inline constexpr Setting kFromPlan{"from-plan", "Take the versions and vertical sync from the module's pipe.plan"};

// ----------------------------------------------------------- code generation
inline constexpr ChoiceSetting<Target> kTarget{
    {"target",
     "Stage code: cpu (C++ on the CPU kernels) or cuda (CUDA C++ on cuBLAS and the CUDA kernels, NCCL between "
     "ranks)",
     "name"}};

inline constexpr Setting kBuild{"build", "Compile the generated stages into libraries (with --out DIR)"};
inline constexpr Setting kCudaArch{"cuda-arch",
                                   "GPU architectures the CUDA stages are built for, comma-separated (default "
                                   "sm_80,sm_90)",
                                   "sm_80,sm_90"};
inline constexpr Setting kSeed{"seed", "Seed of dropout masks and synthetic data (0 to 2^64-1, default 0)", "n"};

// ------------------------------------------------------ `pipec schedule` alone
inline constexpr Setting kReplicas{"replicas", "Replicas per stage: one number or a comma list per stage", "R"};
inline constexpr IntSetting kInFlight{
    {"in-flight", "1f1b-rr: micro-batches admitted per stage-0 replica (0: its default)", "N"},
    0,
    schedule::kMaxMicrobatches};
inline constexpr Setting kCostF{
    "cost-f",
    "Time of the forward of one micro-batch on one stage: one number or a comma list per stage (default 1); every "
    "time (also --cost-b, --cost-w, --comm, --allreduce-cost) finite, at most 1e12",
    "F"};
inline constexpr Setting kCostB{"cost-b", "Time of the input-gradient backward (like --cost-f; default 1)", "B"};
inline constexpr Setting kCostW{
    "cost-w",
    "Time of the weight-gradient backward (like --cost-f; default 1; 0: a fused backward, B computes the weight "
    "gradients too)",
    "W"};
inline constexpr RealSetting kComm{{"comm", "Time of one point-to-point transfer (default 0)", "C"}, 0, 1e12};
inline constexpr RealSetting kAllreduceCost{
    {"allreduce-cost", "Time of one ALLREDUCE / VALIDATE (default 0)", "A"}, 0, 1e12};
inline constexpr Setting kActivationMemoryLimit{
    "activation-limit",
    "Activation memory per rank in units of one micro-batch on one stage (1F1B peaks at p); a 'p' suffix "
    "multiplies by P: 2p = twice 1F1B. Default: unlimited (auto and zb-v: 1p)",
    "K"};
/// `pipec schedule --memory-limit`, the name --activation-limit had: refused
/// with a message naming it, since --memory-limit is a size in bytes elsewhere.
inline constexpr Setting kRenamedActivationMemoryLimit{
    "memory-limit", "Renamed --activation-limit (pipec MODEL's --memory-limit is per-device memory in bytes)", "K"};
inline constexpr RealSetting kWMemFrac{
    {"w-mem-frac", "Share of a micro-batch's activations still held after B until its W completes (default 1)", "X"},
    0,
    1};
inline constexpr Setting kRecomputeStages{"recompute-stages", "Recompute on the listed stages only (comma list)",
                                          "L"};
inline constexpr Setting kBoundaryActivation{
    "boundary-activation",
    "Share of a stage's activation a recomputed micro-batch keeps (one number or one per stage; default 0.1)", "X"};
inline constexpr Setting kCompare{"compare", "All schedules side by side"};
inline constexpr Setting kPrint{"print", "Print the instruction streams"};
inline constexpr Setting kOptimal{
    "optimal",
    "Also the makespan-optimal schedule of one chunk per rank (split backward) under the memory limit, from an "
    "integer program (COIN-OR CBC), and the lower bound it proved; at most 8 stages and 16 micro-batches"};
inline constexpr RealSetting kOptimalSeconds{
    {"optimal-seconds", "Time the --optimal solver may take (default 60); its best schedule and bound are printed "
                        "either way",
     "S"},
    0,
    86400,
    /*minOpen=*/true};
inline constexpr Setting kFromCsv{
    "from-csv",
    "A schedule in PyTorch's CSV format (torch.distributed.pipelining's _dump_csv, either variant): validated, "
    "simulated and drawn with these costs instead of a family's (docs/schedules.md, \"CSV schedules\")",
    "FILE"};
inline constexpr Setting kToCsv{"to-csv", "Also write the schedule in PyTorch's CSV format (--csv-format)", "FILE"};
inline constexpr ChoiceSetting<schedule::CsvFormat> kCsvFormat{
    {"csv-format", "Variant of --to-csv: compute actions only (default), or the transfers too", "format"}};

} // namespace pipec::settings

#endif
