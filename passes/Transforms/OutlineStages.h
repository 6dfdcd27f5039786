// Shared by pipec's stage passes (outline, verify, weight stashing,
// recompute): the names and attributes that make up a stage module
// (docs/stages.md) and small helpers over them.
#ifndef PIPEC_PASSES_TRANSFORMS_OUTLINESTAGES_H
#define PIPEC_PASSES_TRANSFORMS_OUTLINESTAGES_H

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace pipec::passes::stages {

// Entry points of a stage, in the order they run for one micro-batch.
inline constexpr llvm::StringLiteral kForward = "fwd";
inline constexpr llvm::StringLiteral kBackwardInput = "bwd_input";
inline constexpr llvm::StringLiteral kBackwardWeight = "bwd_weight";
inline constexpr llvm::StringLiteral kStep = "step";

// Argument and result attributes.
inline constexpr llvm::StringLiteral kName = nn::kNameAttrName;   // ONNX name of params and data fields
inline constexpr llvm::StringLiteral kSaved = "pipe.saved"; // workspace value, by name
// Function and stage attributes.
inline constexpr llvm::StringLiteral kSavedBytes = "pipe.saved_bytes";
inline constexpr llvm::StringLiteral kSavedBytesNoRecompute = "pipe.saved_bytes_no_recompute";
inline constexpr llvm::StringLiteral kWorkspaceBytes = "pipe.workspace_bytes";
inline constexpr llvm::StringLiteral kStashBytes = "pipe.stash_bytes";
inline constexpr llvm::StringLiteral kRecomputeAttr = "pipe.recompute";

/// Bytes of a statically shaped tensor (booleans take one byte, as in the
/// stage ABI); 0 for other types.
int64_t tensorBytes(mlir::Type type);

/// The name attribute of argument `index` (empty when absent). Roles:
/// nn::argumentRole / nn::resultRole (dialects/nn/NNDialect.h).
llvm::StringRef argName(mlir::func::FuncOp function, unsigned index);

/// Recomputes `pipe.saved_bytes` of @fwd and @bwd_input (bytes of their
/// results marked pipe.saved) and the stage's `pipe.workspace_bytes` (their
/// sum: what a micro-batch keeps from forward to backward_weight).
void updateMemoryAttributes(pipe::StageOp stage);

/// The stage's function `name`, or null.
mlir::func::FuncOp stageFunction(pipe::StageOp stage, llvm::StringRef name);

/// Checks a module of stages (the pipec-verify-pipeline pass); reports every
/// problem as an error on the op concerned.
mlir::LogicalResult verifyPipeline(mlir::ModuleOp module);

} // namespace pipec::passes::stages

#endif // PIPEC_PASSES_TRANSFORMS_OUTLINESTAGES_H
