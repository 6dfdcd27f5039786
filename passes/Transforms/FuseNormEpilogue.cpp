// pipec-fuse-norm-epilogue: the residual add and the ReLU (or ReLU6) that
// follow a batch norm become the norm's epilogue, so that the norm's apply
// pass writes relu(normalized + residual) and neither sum nor activation is a
// pass over memory of its own; and the activation's gradient becomes part of
// the norm's input gradient (docs/optimization.md).
#include "passes/Passes.h"
#include "passes/Transforms/PatternRewrites.h"

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace pipec::passes {
#define GEN_PASS_DEF_FUSENORMEPILOGUE
#include "passes/Passes.h.inc"
} // namespace pipec::passes

using namespace mlir;

namespace pipec::passes {
namespace {

/// The batch norm whose normalized result `value` is, read by nothing else,
/// in `block`, without an activation yet (and without a residual when
/// `forResidual`); null otherwise.
nn::BatchNormOp soleNormProducer(Value value, Block *block, bool forResidual) {
  auto norm = value.getDefiningOp<nn::BatchNormOp>();
  if (!norm || norm->getBlock() != block || value != norm.getResult() || !value.hasOneUse() || norm.getActivation() ||
      (forResidual && norm.getResidual()))
    return {};
  return norm;
}

/// Whether every reader of the norm's running-statistic results comes after
/// `point`, so that the norm may be computed there instead.
bool statisticsReadAfter(nn::BatchNormOp norm, Operation *point) {
  for (Value statistic : {norm.getNewRunningMean(), norm.getNewRunningVar()})
    for (Operation *user : statistic.getUsers())
      if (user->getBlock() == point->getBlock() && !point->isBeforeInBlock(user))
        return false;
  return true;
}

struct FuseNormEpilogue : impl::FuseNormEpilogueBase<FuseNormEpilogue> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([&](func::FuncOp function) {
      if (!function->getParentOfType<pipe::StageOp>() || function.getSymName() == "step")
        return;
      // The additions first, so that a ReLU after a residual add finds the
      // norm that absorbed the add.
      SmallVector<nn::AddOp> additions;
      function.walk([&](nn::AddOp add) { additions.push_back(add); });
      for (nn::AddOp add : additions)
        fuseResidual(add);
      SmallVector<nn::UnaryElementwiseOpInterface> activations;
      function.walk([&](nn::UnaryElementwiseOpInterface unary) {
        if (batchNormEpilogueApplies(unary.getUnaryFunction()))
          activations.push_back(unary);
      });
      for (nn::UnaryElementwiseOpInterface activation : activations)
        fuseActivation(activation);
      SmallVector<nn::UnaryGradOp> gradients;
      function.walk([&](nn::UnaryGradOp grad) { gradients.push_back(grad); });
      for (nn::UnaryGradOp grad : gradients)
        fuseActivationGrad(grad);
    });
  }

  /// An activation's gradient (ReLU's or ReLU6's) at its output y, read as
  /// dy by one batch_norm_grad and otherwise only returned (saved for the
  /// norm's parameter gradient in a later entry point): the norm's gradient takes dy and y and returns the
  /// masked gradient for those returns (keeps_masked_dy). A gradient read by
  /// anything else (a residual's branch, a second norm) stays.
  void fuseActivationGrad(nn::UnaryGradOp relu) {
    if (!batchNormEpilogueApplies(relu.getKind()) || !relu.getY())
      return;
    nn::BatchNormGradOp norm;
    bool returned = false;
    for (OpOperand &use : relu.getResult().getUses()) {
      Operation *user = use.getOwner();
      auto grad = llvm::dyn_cast<nn::BatchNormGradOp>(user);
      if (grad && !norm && use.get() == grad.getDy() && !grad.getActivation() && grad->getBlock() == relu->getBlock())
        norm = grad;
      else if (llvm::isa<func::ReturnOp>(user))
        returned = true;
      else
        return;
    }
    if (!norm)
      return;
    OpBuilder builder(norm);
    auto fused = nn::BatchNormGradOp::create(
        builder, absorbedLocation(norm.getLoc(), {relu}), relu.getDy(), norm.getInput(), norm.getScale(),
        norm.getRunningMean(), norm.getRunningVar(), relu.getY(), norm.getEpsilonAttr(), norm.getTrainingAttr(),
        nn::UnaryFunctionAttr::get(norm.getContext(), relu.getKind()), builder.getBoolAttr(returned),
        norm.getChannelsLastAttr());
    inheritPlacement(norm, fused, /*withCost=*/true);
    norm.getResult().replaceAllUsesWith(fused.getResult());
    if (returned)
      relu.getResult().replaceAllUsesWith(fused.getMaskedDy());
    norm.erase();
    relu.erase();
    ++numActivationGradients;
  }

  /// bn(x) + r of one shape and type, bn's result read by the add alone:
  /// the norm adds r, computed where it was if r is defined before it, else
  /// where the add was. Of two such norms the one the add reads second
  /// takes the other as its residual.
  void fuseResidual(nn::AddOp add) {
    Value lhs = add.getLhs(), rhs = add.getRhs();
    if (lhs.getType() != rhs.getType() || lhs.getType() != add.getResult().getType())
      return; // a broadcast: not the norm's shape
    for (auto [normed, residual] : {std::pair{rhs, lhs}, std::pair{lhs, rhs}}) {
      nn::BatchNormOp norm = soleNormProducer(normed, add->getBlock(), /*forResidual=*/true);
      if (!norm)
        continue;
      Operation *point = definedBefore(residual, norm) ? norm.getOperation() : add.getOperation();
      if (point == add && !statisticsReadAfter(norm, add))
        continue;
      OpBuilder builder(point);
      auto fused = nn::BatchNormOp::create(builder, absorbedLocation(norm.getLoc(), {add}), norm.getInput(),
                                           norm.getScale(), norm.getBias(), norm.getRunningMean(),
                                           norm.getRunningVar(), residual, norm.getEpsilonAttr(),
                                           norm.getMomentumAttr(), norm.getTrainingAttr(), nn::UnaryFunctionAttr(),
                                           norm.getChannelsLastAttr());
      inheritPlacement(norm, fused, /*withCost=*/true);
      add.getResult().replaceAllUsesWith(fused.getResult());
      norm.getNewRunningMean().replaceAllUsesWith(fused.getNewRunningMean());
      norm.getNewRunningVar().replaceAllUsesWith(fused.getNewRunningVar());
      add.erase();
      norm.erase();
      ++numResiduals;
      return;
    }
  }

  /// f(bn(x) [+ r]) for f ReLU or ReLU6, the norm's result read by f alone:
  /// the norm applies it. (f's gradient reads its output, which the norm
  /// now writes; the normalized value before it is read by nothing else.)
  void fuseActivation(nn::UnaryElementwiseOpInterface activation) {
    Operation *op = activation.getOperation();
    nn::BatchNormOp norm = soleNormProducer(op->getOperand(0), op->getBlock(), /*forResidual=*/false);
    if (!norm || op->getResult(0).getType() != norm.getResult().getType())
      return;
    norm.setActivationAttr(nn::UnaryFunctionAttr::get(norm.getContext(), activation.getUnaryFunction()));
    norm->setLoc(absorbedLocation(norm.getLoc(), {op}));
    op->getResult(0).replaceAllUsesWith(norm.getResult());
    op->erase();
    ++numActivations;
  }
};

} // namespace
} // namespace pipec::passes
