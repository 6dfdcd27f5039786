#ifndef PIPEC_PARTITION_PARTITIONER_H
#define PIPEC_PARTITION_PARTITIONER_H

#include "analysis/Partition/CostTable.h"
#include "analysis/Partition/Topology.h"

#include <cstdint>
#include <string>
#include <utility>
#include <optional>
#include <vector>

namespace pipec::partition {

/// Micro-batches per mini-batch at most (--microbatches); the schedule
/// library has the same bound (schedule::kMaxMicrobatches).
inline constexpr int kMaxMicrobatches = 65536;

struct PartitionOptions {
  int forcedStages = 0;          ///< --stages N: exactly N pipeline stages (0: the DP chooses)
  bool allowReplication = true;  ///< false: --no-replication, a straight pipeline
  int64_t memoryLimitBytes = 0;  ///< 0: the topology's device memory; < 0: unlimited
  bool asynchronous = false;     ///< PipeDream 1F1B-RR: weight stashing, no flush
  bool recompute = false;        ///< keep only stage inputs of in-flight micro-batches
  int microbatches = 1;          ///< micro-batches per mini-batch
  int maxLayers = 0;             ///< group ops into at most this many layers (0: as many as the time budget allows)
  /// Also search stages on device ranges that share servers, cut at antichains
  /// (DeviceRanges.h); false: PipeDream's hierarchical search alone.
  bool deviceRangeSearch = true;
  /// Inclusive op ranges that must stay in one stage (no cut inside): the
  /// users of a tied parameter under --async.
  std::vector<std::pair<int, int>> unsplittable;
};

/// A hierarchical partition, as PipeDream's DP builds it: at the outermost level a
/// pipeline of stages; each stage is replicated over `replicas` components of the
/// next level down, and each replica runs the same inner pipeline (`inner`,
/// empty at level 0 where the replicas are devices). Op indices are inclusive.
struct TreeStage {
  int firstOp = 0, lastOp = 0;
  int replicas = 1;
  std::vector<TreeStage> inner;
};
/// With `deviceRanges`, the stages are device stages (no inner pipelines) that
/// take consecutive ranks in order, `replicas` each, whatever servers those
/// ranks fall in: consecutive stages may share a server (docs/partition.md,
/// "Stages that share servers"). PipeDream's tree cannot express those.
struct PartitionTree {
  std::vector<TreeStage> stages; ///< the pipeline at the outermost level
  bool deviceRanges = false;
};

/// A flat stage as a user writes it (--partition): op range, replicas, and
/// optionally the ranks (when absent, stages take consecutive ranks in order).
struct StageSpec {
  int firstOp = 0, lastOp = 0;
  int replicas = 1;
  std::vector<int> ranks;
};

/// One pipeline stage of the flattened plan, with what the table prints.
struct StagePlan {
  int firstOp = 0, lastOp = 0;
  int replicas = 1;
  /// Innermost first; their product is `replicas`. Empty for a device-range stage
  /// whose devices are not a product of whole components (it shares a server).
  std::vector<int> replicasPerLevel;
  std::vector<int> ranks;
  double computeSeconds = 0;   ///< fwd + B + W of one micro-batch on one replica
  double sendSeconds = 0;      ///< 2·a/B: activations out and gradients back over the cut after it
  int sendLevel = -1;          ///< topology level carrying that cut (-1: last stage)
  int64_t sendBytes = 0;       ///< a: bytes of all tensors crossing the cut after the stage
  double allreduceSeconds = 0; ///< Σ_k 2(r_k-1)/r_k·|w|/B_k, the gradient all-reduce of this stage
  int inflight = 1;            ///< micro-batches in flight on one replica (memory model)
  int64_t parameterBytes = 0, optimizerStateBytes = 0;
  int64_t gradientBytes = 0;   ///< the weights' gradient buffer (parameterBytes)
  int64_t stashBytes = 0;      ///< stashed weight versions (asynchronous)
  int64_t activationBytes = 0; ///< activations kept for the in-flight micro-batches
  int64_t memoryBytes = 0;     ///< total per device
};

struct PartitionResult {
  std::vector<StagePlan> stages;
  PartitionTree tree;
  /// The topological order the stages' op ranges index: opOrder[k] is the table
  /// index of the k-th op. Empty: the table's own order. A partition cut at an
  /// antichain of the DAG that no prefix of the table's order reaches has one.
  std::vector<int> opOrder;
  int op(int position) const { return opOrder.empty() ? position : opOrder[position]; }
  bool fromSearch = true;            ///< false: evaluatePartition of a given partition
  int layers = 0;                    ///< units the DP ran on (ops grouped into layers)
  int devicesUsed = 0;
  int64_t memoryLimitBytes = -1;     ///< -1: unlimited
  int microbatches = 1;
  bool asynchronous = false, recompute = false;
  /// Stages that recompute their activations (all with --recompute, the ones
  /// that need it to fit with --recompute=auto; empty without).
  std::vector<int> recomputedStages;
  double timePerMicrobatch = 0;      ///< PipeDream's objective: the slowest stage or link
  double timePerMinibatch = 0;       ///< the simulated schedule's when `simulated`, else analytic
  double analyticTimePerMinibatch = 0; ///< PipeDream's estimate, kept beside a simulated one
  bool simulated = false;            ///< timePerMinibatch, throughput and bubble come from the schedule
  double throughput = 0;             ///< micro-batches per second
  double bubbleSeconds = 0;          ///< fill and drain per mini-batch (synchronous)
  double bubbleFraction = 0;         ///< bubble / time per mini-batch
  int inflightMicrobatches = 1;      ///< of the input stage (≈ workers / its replicas)
  bool dataParallelFits = false;
  double dataParallelTimePerMicrobatch = 0; ///< all devices replicate the whole model
  double speedupOverDataParallel = 0;       ///< 0 when data parallelism does not fit

  /// Checks the invariants (contiguous cover, replicas and ranks, memory within the
  /// limit, predicted times consistent); throws Error("internal: ...") on violation.
  void verify(const CostTable &table, const Topology &topology) const;
};

/// The numbers of design.md §2 for a cost table on a topology (it keeps a reference
/// to `table`, which must outlive it), shared by the DP,
/// the evaluation of given partitions and the exhaustive search in the tests.
class CostModel {
public:
  CostModel(const CostTable &table, const Topology &topology, const PartitionOptions &options);

  int numOps() const { return static_cast<int>(computePrefix_.size()) - 1; }
  double compute(int i, int j) const { return computePrefix_[j + 1] - computePrefix_[i]; }
  double parameters(int i, int j) const { return paramPrefix_[j + 1] - paramPrefix_[i]; }
  double optimizerState(int i, int j) const { return optPrefix_[j + 1] - optPrefix_[i]; }
  double activations(int i, int j) const { return actPrefix_[j + 1] - actPrefix_[i]; }
  /// a_s: bytes of every tensor produced at or before op s and read after it.
  int64_t cutBytes(int s) const { return s < 0 || s + 1 >= numOps() ? 0 : cutBytes_[s]; }
  /// Micro-batches in flight for a device stage with r replicas, x devices after it
  /// in its innermost pipeline and `outer` from enclosing levels (see docs/partition.md).
  int inflight(int r, int x, int64_t outer) const;
  /// Per-device memory of ops i..j with f micro-batches in flight.
  double memory(int i, int j, int f) const;
  /// The same from a stage's sums; `inputBytes` is what crosses into the stage
  /// (what --recompute keeps per micro-batch).
  double memoryOf(double parameterBytes, double optimizerStateBytes, double activationBytes,
                  double inputBytes, int f) const;
  /// The most micro-batches in flight such a stage fits with under the limit
  /// (0: not even one; INT_MAX: any number).
  int mostInflightFitting(double parameterBytes, double optimizerStateBytes, double activationBytes,
                          double inputBytes) const;
  double memoryLimit() const { return limit_; } ///< infinity when unlimited
  /// T at level 0 (a device stage): (1/r)·max(compute, 2(r-1)|w|/B_0), or infinity if it
  /// does not fit in memory.
  double deviceStageTime(int i, int j, int r, int f) const;
  double allreduceTime(int level, int i, int j, int r) const;
  double cutTime(int level, int s) const;
  /// 2·bytes/B_level: activations out and gradients back over a level's link.
  double linkTime(int level, double bytes) const;

  /// Device-range stages (PartitionTree::deviceRanges) on `ranks` devices from
  /// `firstRank`, with c_k = Topology::workersTouched: PipeDream's T unrolled,
  /// (1/r)·max(compute, max_k 2(c_k-1)·c_0···c_{k-1}·|w|/B_k), which equals the
  /// tree's T when the range is a product of whole components.
  double rangeStageTime(double compute, double parameterBytes, int64_t firstRank, int64_t ranks) const;
  /// max_k 2(c_k-1)·c_0···c_{k-1}/B_k: rangeStageTime's all-reduce seconds per byte.
  double rangeAllreduceCoefficient(int64_t firstRank, int64_t ranks) const;
  static double rangeStageTime(double compute, double parameterBytes, double allreduceCoefficient, int64_t ranks);
  /// Σ_k 2(c_k-1)/c_k·|w|/B_k: the hierarchical all-reduce the schedule simulates.
  double rangeAllreduceSeconds(double parameterBytes, int64_t firstRank, int64_t ranks) const;
  /// The link a cut between a stage on firstRank.. (ranks devices) and the next
  /// stage (nextRanks devices) crosses: some replica pair spans it.
  int rangeCutLevel(int64_t firstRank, int64_t ranks, int64_t nextRanks) const;
  /// The cut after op s between such stages: the slower of the sender's side (its
  /// devices and the next stage's first) and the receiver's (its last device and
  /// the next stage's devices); the time of rangeCutLevel's link when outer links
  /// are slower.
  double rangeCutTime(int s, int64_t firstRank, int64_t ranks, int64_t nextRanks) const;

  /// PipeDream's objective for a tree (infinity if some stage does not fit);
  /// validates the shape and throws Error when the tree is malformed.
  double evaluate(const PartitionTree &tree) const;
  PartitionResult describe(const PartitionTree &tree, bool fromSearch) const;

  const Topology &topology() const { return topology_; }
  const PartitionOptions &options() const { return options_; }
  const CostTable &table() const { return table_; }

private:
  double evaluatePipeline(int level, const std::vector<TreeStage> &stages, int first, int last,
                          int64_t outer) const;
  double evaluateDeviceRanges(const std::vector<TreeStage> &stages) const;
  const CostTable &table_;
  Topology topology_;
  PartitionOptions options_;
  double limit_;
  std::vector<double> computePrefix_, paramPrefix_, optPrefix_, actPrefix_;
  std::vector<int64_t> cutBytes_;
  std::vector<char> forbiddenCut_; ///< 1: cut s falls inside an unsplittable range
};

/// Ends (last op index, inclusive) of the layers the DP runs on: the identity
/// when the table has at most maxLayers ops; otherwise compute-balanced layers
/// whose boundaries sit at the cheapest cuts nearby (docs/partition.md).
std::vector<int> groupIntoLayers(const CostModel &model, int maxLayers);

/// PipeDream's hierarchical DP (design.md §2). Throws MemoryShortfall when no
/// partition fits in memory, with memoryShortfall's message (`explainShortfall`:
/// naming the stages and how much more they need).
PartitionResult partition(const CostTable &table, const Topology &topology,
                          const PartitionOptions &options, bool explainShortfall = true);
/// partition(), but nullopt when no partition fits in memory: the message
/// partition() throws then bisects the limit with a dozen more searches, which
/// a caller that retries differently (recompute) does not need. Other errors
/// (a search too large, too many stages) are thrown as by partition().
std::optional<PartitionResult> partitionIfFits(const CostTable &table, const Topology &topology,
                                               const PartitionOptions &options);
/// What partition() throws (as MemoryShortfall) when nothing fits: with
/// `explain`, the least memory a partition needs and where (a dozen more
/// searches); without, that nothing fits and any op that alone is too large.
std::string memoryShortfall(const CostTable &table, const Topology &topology, const PartitionOptions &options,
                            bool explain);

/// The same predictions for a given partition. Throws Error when the stages do not
/// cover the ops in order, use too many devices, or do not fit the hierarchy.
/// `opOrder` (table indices in a topological order, empty: the table's order) is
/// what the stages' op indices refer to, as in PartitionResult::opOrder.
PartitionResult evaluatePartition(const CostTable &table, const Topology &topology,
                                  const PartitionOptions &options,
                                  const std::vector<StageSpec> &stages,
                                  const std::vector<int> &opOrder = {});

/// Rebuilds the hierarchy PipeDream's model needs from flat stages and their
/// ranks (assigning consecutive ranks where none are given); stages on
/// consecutive rank ranges that no hierarchy holds become a deviceRanges tree.
PartitionTree treeFromStages(const Topology &topology, int numOps, std::vector<StageSpec> stages);

} // namespace pipec::partition

#endif
