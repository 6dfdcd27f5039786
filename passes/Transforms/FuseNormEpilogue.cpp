// pipec-fuse-norm-epilogue: the residual add and the ReLU (or ReLU6) that
// follow a batch norm, or a channels-last convolution, become its epilogue,
// so that the norm's apply pass (cuDNN's convolution graph) writes
// relu(value + residual) and neither sum nor activation is a pass over
// memory of its own; and the activation's gradient becomes part of the
// norm's input gradient (docs/optimization.md).
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

/// The same for a convolution: one that runs on cuDNN's graphs, which apply
/// the epilogue (channels-last: CUDA at tf32 and bf16; at fp32 the
/// convolutions run pipec's kernels, shared with the CPU's, where the
/// activation stays a loop of its own).
nn::ConvOp soleConvProducer(Value value, Block *block, bool forResidual) {
  auto conv = value.getDefiningOp<nn::ConvOp>();
  if (!conv || conv->getBlock() != block || !value.hasOneUse() || !conv.getChannelsLast() || conv.getActivation() ||
      (forResidual && conv.getResidual()))
    return {};
  return conv;
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
        if (epilogueActivationApplies(unary.getUnaryFunction()))
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
    if (!epilogueActivationApplies(relu.getKind()) || !relu.getY())
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

  /// bn(x) + r or conv(x) + r of one shape and type, the producer's result
  /// read by the add alone: the producer adds r, computed where it was if r
  /// is defined before it, else where the add was. Of two such producers the
  /// one the add reads second takes the other as its residual.
  void fuseResidual(nn::AddOp add) {
    Value lhs = add.getLhs(), rhs = add.getRhs();
    if (lhs.getType() != rhs.getType() || lhs.getType() != add.getResult().getType())
      return; // a broadcast: not the producer's shape
    for (auto [produced, residual] : {std::pair{rhs, lhs}, std::pair{lhs, rhs}}) {
      if (nn::BatchNormOp norm = soleNormProducer(produced, add->getBlock(), /*forResidual=*/true))
        if (fuseNormResidual(add, norm, residual))
          return;
      if (nn::ConvOp conv = soleConvProducer(produced, add->getBlock(), /*forResidual=*/true))
        return fuseConvResidual(add, conv, residual);
    }
  }

  bool fuseNormResidual(nn::AddOp add, nn::BatchNormOp norm, Value residual) {
    Operation *point = definedBefore(residual, norm) ? norm.getOperation() : add.getOperation();
    if (point == add && !statisticsReadAfter(norm, add))
      return false;
    OpBuilder builder(point);
    auto fused = nn::BatchNormOp::create(builder, absorbedLocation(norm.getLoc(), {add}), norm.getInput(),
                                         norm.getScale(), norm.getBias(), norm.getRunningMean(), norm.getRunningVar(),
                                         residual, norm.getEpsilonAttr(), norm.getMomentumAttr(),
                                         norm.getTrainingAttr(), nn::UnaryFunctionAttr(), norm.getChannelsLastAttr());
    inheritPlacement(norm, fused, /*withCost=*/true);
    add.getResult().replaceAllUsesWith(fused.getResult());
    norm.getNewRunningMean().replaceAllUsesWith(fused.getNewRunningMean());
    norm.getNewRunningVar().replaceAllUsesWith(fused.getNewRunningVar());
    add.erase();
    norm.erase();
    ++numResiduals;
    return true;
  }

  /// A convolution has no other result: it may always move to the add.
  void fuseConvResidual(nn::AddOp add, nn::ConvOp conv, Value residual) {
    OpBuilder builder(definedBefore(residual, conv) ? conv.getOperation() : add.getOperation());
    auto fused = nn::ConvOp::create(builder, absorbedLocation(conv.getLoc(), {add}), conv.getInput(),
                                    conv.getWeight(), conv.getBias(), residual, conv.getStridesAttr(),
                                    conv.getPadsAttr(), conv.getDilationsAttr(), conv.getGroupAttr(),
                                    conv.getChannelsLastAttr(), nn::UnaryFunctionAttr());
    inheritPlacement(conv, fused, /*withCost=*/true);
    add.getResult().replaceAllUsesWith(fused.getResult());
    add.erase();
    conv.erase();
    ++numConvResiduals;
  }

  /// f(bn(x) [+ r]) or f(conv(x) [+ r]) for f ReLU or ReLU6, the producer's
  /// result read by f alone: the producer applies it. (f's gradient reads
  /// its output, which the producer now writes; the value before it is read
  /// by nothing else.)
  void fuseActivation(nn::UnaryElementwiseOpInterface activation) {
    Operation *op = activation.getOperation();
    Value operand = op->getOperand(0);
    if (op->getResult(0).getType() != operand.getType())
      return;
    auto function = nn::UnaryFunctionAttr::get(op->getContext(), activation.getUnaryFunction());
    Operation *producer = nullptr;
    if (nn::BatchNormOp norm = soleNormProducer(operand, op->getBlock(), /*forResidual=*/false)) {
      norm.setActivationAttr(function);
      producer = norm, ++numActivations;
    } else if (nn::ConvOp conv = soleConvProducer(operand, op->getBlock(), /*forResidual=*/false)) {
      conv.setActivationAttr(function);
      producer = conv, ++numConvActivations;
    } else {
      return;
    }
    producer->setLoc(absorbedLocation(producer->getLoc(), {op}));
    op->getResult(0).replaceAllUsesWith(operand);
    op->erase();
  }
};

} // namespace
} // namespace pipec::passes
