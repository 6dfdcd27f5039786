// pipec's passes: declarations, registration, and the helpers the driver
// shares with them.
#ifndef PIPEC_PASSES_PASSES_H
#define PIPEC_PASSES_PASSES_H

#include "analysis/Planner/Planner.h"
#include "analysis/Settings/Settings.h"
#include "runtime/include/pipec/vocabulary.h" // OptimizerDefaults in the options

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include <memory>

namespace pipec::passes {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// pipec-estimate-costs: the device preset, the precision of matrix
/// products, the optimizer whose state counts in memory, a measured profile
/// and where to write the cost table.
struct EstimateCostsOptions {
  std::string device = partition::kDefaultDevice;
  Precision precision = Precision::F32;
  ::pipec::Optimizer optimizer = ::pipec::Optimizer::AdamW;
  std::string profile;
  double launchOverhead = 4.0e-6; ///< seconds added for each kernel an op runs
  std::string dumpCosts;
  /// Cost the ops as -O2 will rewrite them before autodiff (composites
  /// recognized, GEMMs canonical; buildPipecPipeline sets it at -O2, it is
  /// not a user setting).
  bool optimized = false;
  /// Whether bf16 precision stores activations in bfloat16 (pipec-bf16-storage:
  /// the CUDA target; CPU stages keep float32). buildPipecPipeline sets it
  /// from the target; not a user setting.
  bool bf16Storage = true;
  void bind(settings::Binder &binder);
};
std::unique_ptr<mlir::Pass> createEstimateCosts(const EstimateCostsOptions &options);

/// pipec-recognize-composites' and pipec-canonicalize-gemm's rewrites
/// applied to `root` (the passes, and the cost model's view of -O2);
/// `applied` counts them.
mlir::LogicalResult recognizeComposites(mlir::Operation *root, int64_t &applied);
mlir::LogicalResult canonicalizeGemms(mlir::Operation *root, int64_t &applied);
/// pipec-pad-classes' rewrite applied to `root` (the pass, and the cost
/// model's view of -O2 with bf16 storage); `applied` counts the losses padded.
void padClasses(mlir::Operation *root, int64_t &applied);

/// Whether pipec-bf16-storage leaves `value` in float32 (statistics, the loss,
/// the results of ops without a bfloat16 kernel: convolutions, pooling,
/// batch norm; docs/cuda-codegen.md, "bf16 storage"), read on the IR before
/// fusion as the cost model sees it.
bool keepsFloat32Storage(mlir::Value value);

/// The ops that compute `result` from one other saved value (`source`: a
/// value `isSaved` accepts, or a parameter) and constants: pure unary and
/// binary element-wise ops, pads and views, at most 8 of them, in program order (the
/// last computes `result`); empty if there are none. GELU of a kept input is
/// one op, SwiGLU's silu, g * sigmoid(g), two. pipec-recompute-elementwise
/// recomputes such a saved value instead of keeping it, and the cost model
/// does not count it as kept (docs/optimization.md).
llvm::SmallVector<mlir::Operation *> recomputableFrom(mlir::Value result, llvm::function_ref<bool(mlir::Value)> isSaved,
                                                      mlir::Value &source);

/// pipec-optimizer: the update rule and its hyper-parameters.
struct OptimizerOptions {
  ::pipec::Optimizer optimizer = ::pipec::Optimizer::AdamW;
  double lr = 1e-3;
  /// sgd-momentum with 0 takes OptimizerDefaults::sgdMomentum.
  double momentum = 0.0;
  double weightDecay = -1.0; ///< < 0: the optimizer's default (OptimizerDefaults::weightDecay)
  double beta1 = OptimizerDefaults::beta1, beta2 = OptimizerDefaults::beta2;
  double epsilon = OptimizerDefaults::epsilon;
  void bind(settings::Binder &binder);
  /// The momentum and weight decay the update runs with (the defaults resolved).
  double effectiveMomentum() const;
  double effectiveWeightDecay() const;
};
std::unique_ptr<mlir::Pass> createOptimizer(const OptimizerOptions &options);

/// pipec-plan-memory: the stage code target whose kernels' scratch the plan holds.
struct PlanMemoryOptions {
  Target target = Target::Cpu;
  void bind(settings::Binder &binder);
};
std::unique_ptr<mlir::Pass> createPlanMemory(const PlanMemoryOptions &options);

/// pipec-fuse-gemm-epilogue: the stage code target, which decides which
/// activations are worth an epilogue (on CUDA only those cuBLASLt applies).
struct FuseGemmEpilogueOptions {
  Target target = Target::Cpu;
  void bind(settings::Binder &binder);
};
std::unique_ptr<mlir::Pass> createFuseGemmEpilogue(const FuseGemmEpilogueOptions &options);

/// pipec-append-loss: the loss appended to @forward.
struct AppendLossOptions {
  Loss loss = Loss::Auto;
  void bind(settings::Binder &binder);
};
std::unique_ptr<mlir::Pass> createAppendLoss(const AppendLossOptions &options);

/// pipec-weight-stashing: the weight versions each stage keeps and vertical
/// sync, or both from the plan.
struct WeightStashingOptions {
  int versions = 0;
  bool verticalSync = false;
  bool fromPlan = false;
  void bind(settings::Binder &binder);
};
std::unique_ptr<mlir::Pass> createWeightStashing(const WeightStashingOptions &options);

/// What pipec-partition decided, in full, for the driver to print (the
/// candidates table, the per-stage report). Everything the job is written
/// from is on the module (pipe.stage, pipe.stages, pipe.plan, plan.json's
/// document and the schedule: docs/layers.md).
struct PlanningResult {
  partition::CostTable table;
  partition::Topology topology;
  planner::Plan plan;
  /// The search the plan was chosen from: given back to createPlanning, a
  /// module with the same costs gets another rank without searching again.
  std::shared_ptr<const planner::Ranking> ranking;
  /// The pass failed because no partition fits in memory (the broadest
  /// attempt's reason): a larger micro-batch would not fit either.
  bool noPlanFitsMemory = false;
};

/// pipec-partition's request before its options: one device (gpus=1x1), so
/// that `pipec-opt --pipec-partition` alone plans.
planner::Request defaultPlanningRequest();
/// pipec-partition on a request built by the driver from every planner flag
/// (the textual options cover the common ones); fills `result` if given.
/// With `ranking`, the plan at request.rank is chosen from it instead of
/// searching; the pass fails unless it was searched on the module's cost
/// table for this request (planner::sameSearch).
std::unique_ptr<mlir::Pass> createPlanning(const planner::Request &request, PlanningResult *result,
                                           std::shared_ptr<const planner::Ranking> ranking = nullptr);

/// The cost table of a module annotated by pipec-estimate-costs: one row per
/// costed op in program order, with its producers. Fails (with an error on
/// the module) when an nn op has no cost.
mlir::FailureOr<partition::CostTable> costTableFromModule(mlir::ModuleOp module);

/// Rows of that table that read the same parameter, as [first, last] row
/// ranges (a parameter read by one op has none): cutting inside one puts a
/// parameter in two stages (tied weights).
std::vector<std::pair<int, int>> tiedParameterRanges(mlir::ModuleOp module);
/// Rows of that table that -O2 fuses into one composite (pipe.fused_chain), as
/// [first, last] row ranges: a cut inside one would keep the chain unfused,
/// slower and larger than its costs say.
std::vector<std::pair<int, int>> fusedChainRanges(mlir::ModuleOp module);

/// Records a partition on the module: `pipe.stage` on every costed op and
/// `pipe.stages` on the module (op ranges by name, replicas, ranks).
void annotateStages(mlir::ModuleOp module, const partition::CostTable &table,
                    const partition::PartitionResult &result);

} // namespace pipec::passes

#endif // PIPEC_PASSES_PASSES_H
