// What the rewrite passes of -O2 share (pipec-recognize-composites,
// pipec-canonicalize-gemm; docs/optimization.md). Internal to passes/.
#ifndef PIPEC_PASSES_TRANSFORMS_PATTERNREWRITES_H
#define PIPEC_PASSES_TRANSFORMS_PATTERNREWRITES_H

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace pipec::passes {

/// The location of an op that takes over the computation of `absorbed`
/// ops: theirs fused with `primary`, so that every ONNX node the op came
/// from stays named (--print-locations; piperun --profile reports the
/// others with no time of their own, docs/optimization.md).
inline mlir::Location absorbedLocation(mlir::Location primary, llvm::ArrayRef<mlir::Operation *> absorbed) {
  llvm::SmallVector<mlir::Location> locations{primary};
  for (mlir::Operation *op : absorbed)
    locations.push_back(op->getLoc());
  return mlir::FusedLoc::get(primary.getContext(), locations);
}

/// The plan's annotations a rewritten op inherits: where it runs and in
/// which phase; the op that takes over `from`'s computation also keeps its
/// cost (the profile's name for it).
inline void inheritPlacement(mlir::Operation *from, mlir::Operation *to, bool withCost) {
  for (llvm::StringRef name : {llvm::StringRef(pipe::kStageAttrName), llvm::StringRef(pipe::kPhaseAttrName)})
    if (mlir::Attribute attribute = from->getAttr(name))
      to->setAttr(name, attribute);
  if (withCost)
    if (mlir::Attribute cost = from->getAttr(pipe::kCostAttrName))
      to->setAttr(pipe::kCostAttrName, cost);
}

/// Every op of a rewritten chain must run on one stage: a partition may cut
/// inside it, and a rewrite across the cut would move a computation (or a
/// parameter's use) to a stage the plan did not give it; the chain then
/// stays as it is. (After outline-stages every op of a function agrees.)
inline bool sameStage(llvm::ArrayRef<mlir::Operation *> ops) {
  mlir::Attribute stage = ops.front()->getAttr(pipe::kStageAttrName);
  return llvm::all_of(ops, [&](mlir::Operation *op) { return op->getAttr(pipe::kStageAttrName) == stage; });
}

/// Whether `value` is defined before `op` in op's block (or is an argument
/// of that block or an enclosing one): an op that reads it may move to
/// just before `op`.
inline bool definedBefore(mlir::Value value, mlir::Operation *op) {
  mlir::Operation *producer = value.getDefiningOp();
  if (!producer)
    return llvm::cast<mlir::BlockArgument>(value).getOwner()->findAncestorOpInBlock(*op) != nullptr;
  return producer->getBlock() == op->getBlock() && producer->isBeforeInBlock(op);
}

/// Float values of either storage (fp32, and bf16 after pipec-bf16-storage),
/// and the bools that comparisons give and wheres read.
inline bool isStaticFloatOrBool(mlir::Type type) {
  auto tensor = llvm::dyn_cast<mlir::RankedTensorType>(type);
  return tensor && tensor.hasStaticShape() &&
         (tensor.getElementType().isF32() || tensor.getElementType().isBF16() ||
          tensor.getElementType().isInteger(1));
}

/// The ops a pipe.fused loop can compute one element at a time (pipec-fuse-elementwise,
/// pipec-fuse-norm-loops): float or bool in and out, operands broadcasting
/// to the result. nn.dropout (its result and its mask, both of its input's
/// shape) and nn.dropout_grad are element-wise too: element i's mask is the
/// generator's draw i.
inline bool computableInLoop(mlir::Operation *op) {
  const bool dropout = llvm::isa<nn::DropoutOp, nn::DropoutGradOp>(op);
  if (!dropout && !llvm::isa<nn::UnaryElementwiseOpInterface, nn::BinaryElementwiseOpInterface, nn::WhereOp,
                             nn::UnaryGradOp, nn::BinaryGradOp>(op))
    return false;
  if ((!dropout && op->getNumResults() != 1) || !llvm::all_of(op->getResultTypes(), isStaticFloatOrBool))
    return false;
  auto space = llvm::cast<mlir::RankedTensorType>(op->getResult(0).getType()).getShape();
  if (!llvm::all_of(op->getResultTypes(),
                    [&](mlir::Type type) { return llvm::cast<mlir::RankedTensorType>(type).getShape() == space; }))
    return false;
  return llvm::all_of(op->getOperandTypes(), [&](mlir::Type type) {
    return isStaticFloatOrBool(type) && nn::broadcastsTo(llvm::cast<mlir::RankedTensorType>(type).getShape(), space);
  });
}

/// `value`'s type if it is a statically shaped float32 tensor, else null:
/// the rewrites apply before bf16 storage, to float32 values of known shape.
inline mlir::RankedTensorType rankedF32(mlir::Value value) {
  auto type = llvm::dyn_cast<mlir::RankedTensorType>(value.getType());
  return type && type.hasStaticShape() && type.getElementType().isF32() ? type : mlir::RankedTensorType();
}

/// `value` seen with `shape` (itself when it has it): an nn.reshape (a
/// view) at the builder's insertion point, placed as `anchor`.
inline mlir::Value reshapeTo(mlir::OpBuilder &builder, mlir::Operation *anchor, mlir::Value value,
                             llvm::ArrayRef<int64_t> shape) {
  auto type = llvm::cast<mlir::RankedTensorType>(value.getType());
  if (type.getShape() == shape)
    return value;
  auto reshape = nn::ReshapeOp::create(builder, anchor->getLoc(),
                                       mlir::RankedTensorType::get(shape, type.getElementType()), value);
  inheritPlacement(anchor, reshape, /*withCost=*/false);
  return reshape;
}

/// The permutation of `rank` axes that swaps the last two.
inline llvm::SmallVector<int64_t> lastTwoAxesSwap(int64_t rank) {
  llvm::SmallVector<int64_t> perm;
  for (int64_t axis = 0; axis < rank; ++axis)
    perm.push_back(axis);
  if (rank >= 2)
    std::swap(perm[rank - 1], perm[rank - 2]);
  return perm;
}

/// Whether `perm` swaps the last two axes and keeps the others.
inline bool swapsLastTwoAxes(llvm::ArrayRef<int64_t> perm) {
  return perm.size() >= 2 && perm == llvm::ArrayRef<int64_t>(lastTwoAxesSwap(perm.size()));
}

/// pipec-recognize-composites' attention layout rewrites (AttentionLayout.cpp):
/// grouped-query heads, the heads' transposes, rotary before the heads' split,
/// q, k and v read in place from their joint projection.
void addAttentionLayoutPatterns(mlir::RewritePatternSet &patterns);

/// Applies `patterns` greedily to `root` until none applies; `applied`
/// returns how many rewrites succeeded (for the pass's statistic).
inline mlir::LogicalResult applyPatternsCounted(mlir::Operation *root,
                                                mlir::RewritePatternSet &&patterns,
                                                int64_t &applied) {
  struct Counter : mlir::RewriterBase::Listener {
    int64_t count = 0;
    void notifyPatternEnd(const mlir::Pattern &, mlir::LogicalResult status) override {
      count += mlir::succeeded(status);
    }
  } counter;
  mlir::GreedyRewriteConfig config;
  config.setListener(&counter);
  mlir::LogicalResult result = mlir::applyPatternsGreedily(root, std::move(patterns), config);
  applied = counter.count;
  return result;
}

} // namespace pipec::passes

#endif // PIPEC_PASSES_TRANSFORMS_PATTERNREWRITES_H
