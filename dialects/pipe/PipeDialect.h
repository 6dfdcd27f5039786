// The `pipe` dialect: pipeline structure around `nn` computation.
#ifndef PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
#define PIPEC_DIALECTS_PIPE_PIPEDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "mlir/IR/DialectImplementation.h"

#include "runtime/include/pipec/vocabulary.h"

#include "dialects/pipe/PipeOpsDialect.h.inc"

#include "dialects/pipe/PipeEnums.h.inc"

#include <optional>

namespace pipec::pipe {
/// Reads a choice parameter of an attribute (#pipe.plan's schedule and
/// placement): a quoted spelling of Choices<E>, or an error listing them.
template <class E> mlir::FailureOr<E> parseChoiceParameter(mlir::AsmParser &parser) {
  const llvm::SMLoc loc = parser.getCurrentLocation();
  std::string text;
  if (mlir::failed(parser.parseString(&text)))
    return mlir::failure();
  E value{};
  if (!parseChoice(text, value))
    return parser.emitError(loc) << "expected " << choiceNames<E>(" or ") << ", got \"" << text << "\"";
  return value;
}
} // namespace pipec::pipe

#define GET_ATTRDEF_CLASSES
#include "dialects/pipe/PipeAttrs.h.inc"

namespace pipec::pipe {
/// Attributes the passes record: pipec-partition's chosen plan (a PlanAttr)
/// and stages' op ranges, replicas and ranks on the module (docs/planner.md).
inline constexpr llvm::StringLiteral kPlanAttrName = "pipe.plan";
/// pipec-estimate-costs' CostAttr on every costed nn op.
inline constexpr llvm::StringLiteral kCostAttrName = "pipe.cost";
/// pipec-estimate-costs' mark on the ops -O2 will fuse into one composite
/// (docs/cost-model.md, "At -O2"): the same non-negative integer on each; the
/// partition keeps them on one stage.
inline constexpr llvm::StringLiteral kFusedChainAttrName = "pipe.fused_chain";
inline constexpr llvm::StringLiteral kStagesAttrName = "pipe.stages";
/// pipec-partition's whole result on the module, for the job writer
/// (docs/layers.md, "The job as a product of the pipeline"): plan.json's
/// document without its "runtime" section, and the chosen schedule (the
/// document of schedule/schedule.json, from which its streams, text and
/// timelines are written); each a JSON document's text in a resource blob
/// (a dense_resource of i8, passes/JsonResource.h).
inline constexpr llvm::StringLiteral kPlanFileAttrName = "pipe.plan_file";
inline constexpr llvm::StringLiteral kScheduleAttrName = "pipe.schedule";
/// pipec-plan-memory's target on the module (its spelling, "cpu" or
/// "cuda"): the kernels whose scratch the memory plan holds, which the stage
/// code must be written for.
inline constexpr llvm::StringLiteral kMemoryTargetAttrName = "pipe.memory_target";
/// pipec-partition's pipeline stage of an op (a non-negative integer).
inline constexpr llvm::StringLiteral kStageAttrName = "pipe.stage";
/// pipec-autodiff's PhaseAttr on every op of @train_step.
inline constexpr llvm::StringLiteral kPhaseAttrName = "pipe.phase";
/// pipec-optimizer's OptimizerAttr on the step function (and every stage's step).
inline constexpr llvm::StringLiteral kOptimizerAttrName = "pipe.optimizer";
/// pipec-optimizer's StateAttr on the step's optimizer-state arguments and results.
inline constexpr llvm::StringLiteral kStateAttrName = "pipe.state";

/// pipec-plan-memory's storage of each op result (an array of StorageAttr,
/// one per result) and the arena bytes a function needs (an i64 on it).
inline constexpr llvm::StringLiteral kStorageAttrName = "pipe.storage";
inline constexpr llvm::StringLiteral kArenaSizeAttrName = "pipe.arena_size";
/// pipec-plan-memory's place of a kernel call's scratch (an array<i64:
/// arena offset, bytes> on the op) and the per-thread scratch bytes of a
/// function's kernel calls (an i64 on it): docs/optimization.md, "Kernel
/// scratch".
inline constexpr llvm::StringLiteral kScratchAttrName = "pipe.scratch";
inline constexpr llvm::StringLiteral kThreadScratchSizeAttrName = "pipe.thread_scratch_size";
/// pipec-plan-memory's mark on a pipe.saved result whose bytes another,
/// earlier pipe.saved result of the function already holds (the same
/// storage, through views): the index of that result, whose workspace slot
/// both names share, so the second is neither stored nor copied.
inline constexpr llvm::StringLiteral kSavedSlotOfAttrName = "pipe.saved_slot_of";

/// pipec-fuse-norm-loops' marks on a pipe.fused loop that runs inside the
/// kernel of the row norm next to it (docs/optimization.md, "Norms with their
/// loops"; pipe/NormJoins.h): `pipe.norm_prologue` before the nn.layer_norm
/// that follows it and normalizes one of its results; `pipe.norm_epilogue`
/// after the nn.layer_norm_grad before it, whose gradient it alone reads
/// (never stored: pipec-plan-memory's `register` storage).
inline constexpr llvm::StringLiteral kNormPrologueAttrName = "pipe.norm_prologue";
inline constexpr llvm::StringLiteral kNormEpilogueAttrName = "pipe.norm_epilogue";

/// The op's `pipe.phase`, if it has a PhaseAttr one.
std::optional<Phase> phaseOf(mlir::Operation *op);
/// Sets the op's `pipe.phase`.
void setPhase(mlir::Operation *op, Phase phase);
/// The `pipe.state` of a function's argument or result, if it has one.
std::optional<OptimizerState> argStateOf(mlir::Operation *function, unsigned index);
std::optional<OptimizerState> resultStateOf(mlir::Operation *function, unsigned index);
/// A double as the pipe attributes print it: the shortest "%.17g" text,
/// which reads back exactly, with ".0" when it would look like an integer
/// (before the exponent of "1e-08", which would not read back as a float).
std::string formatDouble(double value);
} // namespace pipec::pipe

#define GET_OP_CLASSES
#include "dialects/pipe/PipeOps.h.inc"

#endif // PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
