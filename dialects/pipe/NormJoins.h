// Which pipe.fused loops run inside a row norm's kernel, as
// pipec-fuse-norm-loops marks them (docs/optimization.md, "Norms with their
// loops"): read by the pass, pipec-plan-memory and code generation alone,
// which link both dialects.
#ifndef PIPEC_DIALECTS_PIPE_NORMJOINS_H
#define PIPEC_DIALECTS_PIPE_NORMJOINS_H

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

namespace pipec::pipe {

/// Whether pipec-fuse-norm-loops marked the loop to run in a norm's kernel.
inline bool markedForNorm(FusedOp fused) {
  return fused->hasAttr(kNormPrologueAttrName) || fused->hasAttr(kNormEpilogueAttrName);
}

/// The row norm whose kernel runs `fused`, if the loop is marked and the
/// mark holds: with pipe.norm_prologue the nn.layer_norm right after it,
/// normalizing one of its results; with pipe.norm_epilogue the
/// nn.layer_norm_grad right before it, whose gradient the loop alone reads.
inline mlir::Operation *joinedNorm(FusedOp fused) {
  if (fused->hasAttr(kNormPrologueAttrName)) {
    auto norm = llvm::dyn_cast_or_null<nn::LayerNormOp>(fused->getNextNode());
    return norm && norm.getInput().getDefiningOp() == fused.getOperation() ? norm.getOperation() : nullptr;
  }
  if (fused->hasAttr(kNormEpilogueAttrName)) {
    auto grad = llvm::dyn_cast_or_null<nn::LayerNormGradOp>(fused->getPrevNode());
    return grad && grad.getResult().hasOneUse() && *grad.getResult().getUsers().begin() == fused.getOperation()
               ? grad.getOperation()
               : nullptr;
  }
  return nullptr;
}

/// The marked loop whose kernel `op` runs in (a norm, or a norm's gradient,
/// joined to a loop), else null.
inline FusedOp loopJoinedTo(mlir::Operation *op) {
  FusedOp fused;
  if (auto norm = llvm::dyn_cast<nn::LayerNormOp>(op))
    fused = norm.getInput().getDefiningOp<FusedOp>();
  else if (auto grad = llvm::dyn_cast<nn::LayerNormGradOp>(op); grad && grad.getResult().hasOneUse())
    fused = llvm::dyn_cast<FusedOp>(*grad.getResult().getUsers().begin());
  return fused && joinedNorm(fused) == op ? fused : FusedOp();
}

/// A marked loop whose norm is not next to it cannot run as one kernel:
/// what the memory plan and code generation say of it.
inline mlir::LogicalResult checkNormJoin(FusedOp fused) {
  if (markedForNorm(fused) && !joinedNorm(fused))
    return fused.emitOpError("is marked to run in a norm's kernel, but the norm is not next to it "
                             "(pipec-fuse-norm-loops)");
  return mlir::success();
}

/// A row norm's [rows, inner] around its axis (the rows its kernels walk),
/// if the axis is one of x's.
struct NormRows {
  int64_t rows = 1, inner = 1;
};
inline mlir::FailureOr<NormRows> normRows(mlir::RankedTensorType x, int64_t axis) {
  mlir::FailureOr<int64_t> normalized = nn::normalizeAxis(axis, x.getRank());
  if (mlir::failed(normalized))
    return mlir::failure();
  NormRows view;
  for (auto [d, size] : llvm::enumerate(x.getShape()))
    (static_cast<int64_t>(d) < *normalized ? view.rows : view.inner) *= size;
  return view;
}

} // namespace pipec::pipe

#endif // PIPEC_DIALECTS_PIPE_NORMJOINS_H
