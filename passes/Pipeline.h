// The whole compilation after import as one pass pipeline, registered as
// `pipec-pipeline` (pipec-opt runs it; lit tests it) and built by the pipec
// driver with every planner flag (docs/layers.md).
#ifndef PIPEC_PASSES_PIPELINE_H
#define PIPEC_PASSES_PIPELINE_H

#include "passes/Passes.h"

#include "mlir/Pass/PassManager.h"

#include <optional>
#include <string>

namespace pipec::passes {

/// Where the pipeline stops; `pipec --emit=<phase>` prints the IR there.
enum class Phase {
  NN,        ///< the imported model (no pass runs)
  Costs,     ///< loss appended, every op annotated with its times and bytes (pipe.cost)
  Partition, ///< the plan chosen: pipe.stage on every op, pipe.stages and pipe.plan
  Autodiff,  ///< @train_step: loss, B and W gradients (pipe.phase)
  Stages,    ///< one pipe.stage per stage: fwd, bwd_input, bwd_weight, step
  Optimized, ///< the stages as code generation takes them (-O2: fused, memory planned)
};
} // namespace pipec::passes

namespace pipec {
/// The phases' spellings (--emit=<phase>), in enum order: one list for the
/// parser, the names and the help (pipec/vocabulary.h's Choices).
template <> struct Choices<passes::Phase> {
  static constexpr const char *spellings[] = {"nn", "costs", "partition", "autodiff", "stages", "optimized"};
};
static_assert(choiceCount<passes::Phase>() == int(passes::Phase::Optimized) + 1, "every phase has one spelling");
} // namespace pipec

namespace pipec::passes {
inline std::optional<Phase> parsePhase(llvm::StringRef name) {
  Phase phase;
  if (!parseChoice(std::string_view(name.data(), name.size()), phase))
    return std::nullopt;
  return phase;
}
inline const char *phaseName(Phase phase) { return choiceName(phase); }
/// "nn, costs, partition, autodiff, stages, optimized": for messages and --help.
inline std::string phaseNames() { return choiceNames<Phase>(); }

/// -O0: one kernel call per op and storage per value, as the stages are.
/// -O2 (pipec's default): GEMM canonicalisation (on the partitioned model,
/// so that autodiff derives GEMM gradients), element-wise fusion and the
/// static memory plan (docs/optimization.md).
enum class OptLevel { O0, O2 };

struct PipelineConfig {
  Phase last = Phase::Stages;
  AppendLossOptions loss;
  EstimateCostsOptions costs;
  /// The planner's request (pipec-partition's options).
  planner::Request planning;
  /// Receives the full plan, which pipec prints (the job is written from the module).
  PlanningResult *planningResult = nullptr;
  /// A search already run for `planning` on this model's costs (a
  /// PlanningResult's): the partition pass chooses from it (createPlanning).
  std::shared_ptr<const planner::Ranking> ranking;
  OptimizerOptions optimizer;
  OptLevel optLevel = OptLevel::O2;
  /// The stage code target, whose kernels' scratch the memory plan holds.
  PlanMemoryOptions memory;
};

/// Appends the passes up to `config.last`: append-loss, estimate-costs,
/// partition, [-O2: canonicalize-gemm,] autodiff, optimizer, outline-stages,
/// recompute (mode=auto), weight-stashing (from-plan), verify-pipeline, and
/// for the optimized phase: at -O2 canonicalize-gemm, fuse-gemm-epilogue,
/// recompute-elementwise and fuse-elementwise; bf16-storage for the CUDA target at bf16 precision; at
/// -O2 plan-memory.
void buildPipecPipeline(mlir::OpPassManager &pm, const PipelineConfig &config);

/// Registers `pipec-pipeline` with its textual options.
void registerPipecPipeline();

} // namespace pipec::passes

#endif // PIPEC_PASSES_PIPELINE_H
