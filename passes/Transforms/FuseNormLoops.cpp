// pipec-fuse-norm-loops (CUDA): an element-wise loop whose result a layer
// or RMS norm normalizes runs in the norm's kernel before it, and one that
// alone reads a norm's input gradient runs in that gradient's kernel after
// it, so that the loop and the norm are one launch and the norm's input, or
// its gradient, makes no trip through memory of its own (docs/optimization.md,
// "Norms with their loops"). The pair is marked on the loop and made
// adjacent; code generation writes the joined kernel
// (pipec/cuda_row_norm.cuh).
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/pipe/NormJoins.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SetVector.h"

namespace pipec::passes {
#define GEN_PASS_DEF_FUSENORMLOOPS
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// Whether a norm over `x` (axis `axis`) with these parameters runs as the
/// kernels' rows: a static shape of float or bf16 storage, at least one
/// element, and parameters of float with one element per position of a row
/// (the joined kernel reads them as they are; the library expands others).
bool rowsFit(Value x, int64_t axis, std::initializer_list<Value> parameters) {
  auto type = llvm::dyn_cast<RankedTensorType>(x.getType());
  if (!type || !type.hasStaticShape() || type.getNumElements() == 0 ||
      !(type.getElementType().isF32() || type.getElementType().isBF16()))
    return false;
  FailureOr<pipe::NormRows> view = pipe::normRows(type, axis);
  if (failed(view))
    return false;
  for (Value parameter : parameters) {
    auto parameterType = llvm::dyn_cast_or_null<RankedTensorType>(parameter ? parameter.getType() : Type());
    if (parameter && (!parameterType || !parameterType.hasStaticShape() || !parameterType.getElementType().isF32() ||
                      parameterType.getNumElements() != view->inner))
      return false;
  }
  return true;
}

/// A loop that may join a norm: a pipe.fused not joined yet, or a lone op
/// a loop can compute (pipec-fuse-elementwise leaves a group of one as it
/// is: the residual add of a model without dropout), with one result.
bool loopLike(Operation *op) {
  if (auto fused = llvm::dyn_cast_or_null<pipe::FusedOp>(op))
    return !pipe::markedForNorm(fused);
  return op && op->getNumResults() == 1 && computableInLoop(op);
}

/// Whether `value` has the iteration space of the loop-like `op` (its
/// first result's shape): element i of the loop is element i of the value.
bool spansLoop(Value value, Operation *op) {
  return llvm::cast<RankedTensorType>(value.getType()).getShape() ==
         llvm::cast<RankedTensorType>(op->getResult(0).getType()).getShape();
}

/// The loop-like `op` as a pipe.fused: itself, or the lone op moved into a
/// loop of its own at its place (the body computes in float whatever the
/// storage, as pipec-bf16-storage's loops do).
pipe::FusedOp asLoop(Operation *op) {
  if (auto fused = llvm::dyn_cast<pipe::FusedOp>(op))
    return fused;
  auto inBody = [](Type type) {
    auto tensor = llvm::cast<RankedTensorType>(type);
    return tensor.getElementType().isBF16() ? tensor.clone(Float32Type::get(type.getContext())) : tensor;
  };
  llvm::SetVector<Value> inputs(op->operand_begin(), op->operand_end());
  OpBuilder builder(op);
  auto fused = pipe::FusedOp::create(builder, op->getLoc(), op->getResultTypes(), inputs.getArrayRef());
  Block *body = new Block();
  fused.getBody().push_back(body);
  for (Value input : inputs)
    body->addArgument(inBody(input.getType()), input.getLoc());
  for (OpOperand &operand : op->getOpOperands())
    operand.set(body->getArgument(static_cast<unsigned>(llvm::find(inputs, operand.get()) - inputs.begin())));
  op->getResult(0).replaceAllUsesWith(fused.getResult(0));
  op->moveBefore(body, body->end());
  op->getResult(0).setType(inBody(op->getResult(0).getType()));
  OpBuilder atEnd = OpBuilder::atBlockEnd(body);
  pipe::YieldOp::create(atEnd, op->getLoc(), op->getResult(0));
  return fused;
}

struct FuseNormLoops : impl::FuseNormLoopsBase<FuseNormLoops> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp function) {
      if (!function->getParentOfType<pipe::StageOp>() || function.getSymName() == "step")
        return;
      SmallVector<nn::LayerNormOp> norms;
      SmallVector<nn::LayerNormGradOp> grads;
      function.walk([&](Operation *op) {
        if (auto norm = llvm::dyn_cast<nn::LayerNormOp>(op))
          norms.push_back(norm);
        else if (auto grad = llvm::dyn_cast<nn::LayerNormGradOp>(op))
          grads.push_back(grad);
      });
      for (nn::LayerNormOp norm : norms)
        joinPrologue(norm);
      for (nn::LayerNormGradOp grad : grads)
        joinEpilogue(grad);
    });
  }

  /// norm(fused(...)): the norm moves right after the loop (its scale and
  /// bias are defined before it), which runs in the norm's kernel and stores
  /// its results there, the normalized one included, which the norm then
  /// reads back while it is still in cache.
  void joinPrologue(nn::LayerNormOp norm) {
    Operation *loop = norm.getInput().getDefiningOp();
    if (!loopLike(loop) || loop->getBlock() != norm->getBlock() ||
        !rowsFit(norm.getInput(), norm.getAxis(), {norm.getScale(), norm.getBias()}) ||
        !spansLoop(norm.getInput(), loop) || norm.getResult().getType() != norm.getInput().getType() ||
        !definedBefore(norm.getScale(), loop) || (norm.getBias() && !definedBefore(norm.getBias(), loop)))
      return;
    pipe::FusedOp fused = asLoop(loop);
    norm->moveAfter(fused);
    fused->setAttr(pipe::kNormPrologueAttrName, UnitAttr::get(&getContext()));
    ++numPrologues;
  }

  /// fused(layer_norm_grad(...), ...), the loop the gradient's only reader:
  /// the loop moves right after the gradient (its other inputs are defined
  /// before it) and runs on each pack of the gradient as the norm's kernel
  /// computes it, which is never stored.
  void joinEpilogue(nn::LayerNormGradOp grad) {
    Value dx = grad.getResult();
    if (!dx.hasOneUse())
      return;
    Operation *loop = *dx.getUsers().begin();
    if (!loopLike(loop) || loop->getBlock() != grad->getBlock() || !rowsFit(dx, grad.getAxis(), {grad.getScale()}) ||
        !spansLoop(dx, loop) || grad.getDy().getType() != dx.getType() || grad.getInput().getType() != dx.getType())
      return;
    for (Value input : loop->getOperands())
      if (input != dx && !definedBefore(input, grad))
        return;
    pipe::FusedOp fused = asLoop(loop);
    fused->moveAfter(grad);
    fused->setAttr(pipe::kNormEpilogueAttrName, UnitAttr::get(&getContext()));
    ++numEpilogues;
  }
};

} // namespace
} // namespace pipec::passes
