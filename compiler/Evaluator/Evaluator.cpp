// Dispatch from `nn` ops to the reference kernels, and function evaluation.
// This file only decodes attributes and checks types; the arithmetic lives in
// the kernels (Kernels.h).
#include "compiler/Evaluator/Evaluator.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/ScopedPrinter.h"

#include <array>
#include <deque>
#include <numeric>

using namespace mlir;

namespace pipec::eval {

namespace {

using kernels::BinaryOp;

double toDouble(llvm::APFloat value) {
  bool losesInfo = false;
  value.convert(llvm::APFloat::IEEEdouble(), llvm::APFloat::rmNearestTiesToEven, &losesInfo);
  return value.convertToDouble();
}

std::vector<int64_t> toVector(ArrayRef<int64_t> values) { return {values.begin(), values.end()}; }

std::vector<int64_t> shapeOf(Type type) {
  return toVector(llvm::cast<RankedTensorType>(type).getShape());
}


/// The reference rules of the ops, by family (forward ops, their gradient
/// ops, the optimizer updates and constants), over one op's operands.
class OpRules {
public:
  OpRules(Operation *op, ArrayRef<Tensor> operands, const EvalOptions &options)
      : op(op), operands(operands), options(options) {}
  std::optional<std::vector<Tensor>> forward();
  std::optional<std::vector<Tensor>> gradient();
  std::optional<std::vector<Tensor>> optimizerOrConstant();

private:
  const Tensor &in(unsigned index) const { return operands[index]; }
  /// A batch norm's or convolution's epilogue (pipec-fuse-norm-epilogue):
  /// f(value + residual).
  Tensor withEpilogue(Tensor value, Value residual, std::optional<::pipec::Unary> activation) const {
    if (const Tensor *added = optionalIn(residual))
      value = kernels::binary(BinaryOp::Add, value, *added);
    if (activation)
      value = kernels::unary(*activation, value);
    return value;
  }
  const Tensor *optionalIn(Value value) const {
    if (!value)
      return nullptr;
    for (unsigned i = 0; i < op->getNumOperands(); ++i)
      if (op->getOperand(i) == value)
        return &operands[i];
    return nullptr;
  }
  static std::vector<Tensor> one(Tensor tensor) { return std::vector<Tensor>{std::move(tensor)}; }
  // A result's shape in the channels-first order of the rules: a
  // channels-last op (docs/optimization.md, "Channels last") is evaluated
  // on its operands moved to that order, and its results moved back
  // (dispatch).
  std::vector<int64_t> channelsFirstResult(Value result) const {
    return toVector(nn::channelsFirstShape(llvm::cast<RankedTensorType>(result.getType()).getShape(),
                                           nn::storesChannelsLast(op)));
  }
  // nn.attention(_grad)'s operands in their head-major order ([L..., S, D])
  // and its results back: a sequence-major op is the head-major one with
  // axes -3 and -2 swapped on each (docs/dialects.md). Head-major, the
  // operands are passed as they are and the results moved, not copied.
  static Tensor headAxesSwapped(const Tensor &tensor) {
    std::vector<int64_t> perm(tensor.shape.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[perm.size() - 3], perm[perm.size() - 2]);
    return kernels::transpose(tensor, perm);
  }
  const Tensor &headMajorOperand(unsigned index, bool sequenceMajor) {
    return sequenceMajor ? swappedOperands.emplace_back(headAxesSwapped(in(index))) : in(index);
  }
  // Query, key and value (operands first..first + 2) head-major; a joint
  // operand's windows split from it (joint_kv_heads, docs/dialects.md).
  std::array<const Tensor *, 3> attentionOperands(unsigned first, bool sequenceMajor, int64_t jointKvHeads) {
    if (jointKvHeads == 0)
      return {&headMajorOperand(first, sequenceMajor), &headMajorOperand(first + 1, sequenceMajor),
              &headMajorOperand(first + 2, sequenceMajor)};
    const Tensor &joint = in(first);
    const int64_t headsAxis = static_cast<int64_t>(joint.shape.size()) - 2;
    std::vector<Tensor> windows = kernels::split(
        joint, headsAxis, {joint.shape[headsAxis] - 2 * jointKvHeads, jointKvHeads, jointKvHeads});
    std::array<const Tensor *, 3> operands;
    for (size_t i = 0; i < 3; ++i)
      operands[i] = &swappedOperands.emplace_back(headAxesSwapped(windows[i]));
    return operands;
  }
  static Tensor inLayout(Tensor result, bool sequenceMajor) {
    if (!sequenceMajor)
      return result; // moved
    return headAxesSwapped(result);
  }
  // The key of a dropout whose mask an op draws again (nn.attention's, a
  // mask-less nn.dropout_grad's): nn.dropout's, from its op id.
  uint64_t redrawnDropoutKey(uint64_t dropoutOpId) const {
    return kernels::dropoutStreamKey(options.seed, options.step, options.microBatch, dropoutOpId);
  }

  Operation *op;
  ArrayRef<Tensor> operands;
  const EvalOptions &options;
  std::deque<Tensor> swappedOperands; // references to them stay valid as more come
};


/// The forward ops. Empty when `op` is not one of them.
std::optional<std::vector<Tensor>> OpRules::forward() {
  if (auto unary = llvm::dyn_cast<nn::UnaryElementwiseOpInterface>(op))
    return one(kernels::unary(unary.getUnaryFunction(), in(0)));
  if (auto binary = llvm::dyn_cast<nn::BinaryElementwiseOpInterface>(op))
    return one(kernels::binary(binary.getBinaryFunction(), in(0), in(1)));
  return llvm::TypeSwitch<Operation *, std::optional<std::vector<Tensor>>>(op)
      .Case([&](nn::WhereOp) { return one(kernels::where(in(0), in(1), in(2))); })
      .Case([&](nn::RotaryOp rotary) {
        return one(kernels::rotary(in(0), in(1), in(2), rotary.getInterleaved(), rotary.getTransposed()));
      })
      .Case([&](nn::CastOp cast) {
        auto kind = elementKindOf(cast.getResult().getType().getElementType());
        if (failed(kind))
          throw EvalError("unsupported result element type");
        return one(kernels::cast(in(0), *kind));
      })
      .Case([&](nn::GemmOp gemm) {
        Tensor product = kernels::gemm(in(0), in(1), optionalIn(gemm.getC()), toDouble(gemm.getAlpha()),
                                       toDouble(gemm.getBeta()), gemm.getTransA(), gemm.getTransB());
        if (auto activation = gemm.getActivation()) { // the epilogue: f of the product (and the product)
          Tensor activated = kernels::unary(*activation, product);
          if (gemm.getKeepsPreActivation())
            return std::vector<Tensor>{std::move(activated), std::move(product)};
          return one(std::move(activated));
        }
        return one(std::move(product));
      })
      .Case([&](nn::GemmActivationGradOp grad) {
        // nn.unary_grad of the function at x, the product its incoming gradient.
        Tensor product = kernels::gemm(in(0), in(1), nullptr, toDouble(grad.getAlpha()), 0.0, grad.getTransA(),
                                       grad.getTransB());
        return one(kernels::unaryGrad(grad.getFunction(), product, in(2)));
      })
      .Case([&](nn::MatMulOp) { return one(kernels::matmul(in(0), in(1))); })
      .Case([&](nn::BatchedGemmOp gemm) {
        // op(X): X with its last two axes swapped (the reference: a
        // materialized transpose, then numpy matmul).
        auto operand = [](const Tensor &x, bool trans) {
          if (!trans)
            return x;
          std::vector<int64_t> perm(x.shape.size());
          std::iota(perm.begin(), perm.end(), 0);
          if (perm.size() < 2)
            throw EvalError("a transposed operand needs rank >= 2");
          std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
          return kernels::transpose(x, perm);
        };
        return one(kernels::matmul(operand(in(0), gemm.getTransA()), operand(in(1), gemm.getTransB())));
      })
      .Case([&](nn::ConvOp conv) {
        Tensor result = kernels::conv(in(0), in(1), optionalIn(conv.getBias()), toVector(conv.getStrides()),
                                      toVector(conv.getPads()), toVector(conv.getDilations()),
                                      static_cast<int64_t>(conv.getGroup()));
        return one(withEpilogue(std::move(result), conv.getResidual(), conv.getActivation()));
      })
      .Case([&](nn::BatchNormOp norm) {
        auto results = kernels::batchNorm(in(0), in(1), in(2), in(3), in(4),
                                          toDouble(norm.getEpsilon()),
                                          toDouble(norm.getMomentum()), norm.getTraining());
        results.output = withEpilogue(std::move(results.output), norm.getResidual(), norm.getActivation());
        return std::vector<Tensor>{std::move(results.output), std::move(results.runningMean),
                                   std::move(results.runningVar)};
      })
      .Case([&](nn::LayerNormOp norm) {
        auto results = kernels::layerNorm(in(0), in(1), optionalIn(norm.getBias()),
                                          static_cast<int64_t>(norm.getAxis()),
                                          toDouble(norm.getEpsilon()), norm.getCentered());
        return std::vector<Tensor>{std::move(results.output), std::move(results.mean),
                                   std::move(results.invStdDev)};
      })
      .Case([&](nn::MaxPoolOp pool) {
        return one(kernels::maxPool(in(0), toVector(pool.getKernelShape()),
                                    toVector(pool.getStrides()), toVector(pool.getPads()),
                                    toVector(pool.getDilations()), pool.getCeilMode()));
      })
      .Case([&](nn::AveragePoolOp pool) {
        return one(kernels::averagePool(in(0), toVector(pool.getKernelShape()),
                                        toVector(pool.getStrides()), toVector(pool.getPads()),
                                        pool.getCeilMode(), pool.getCountIncludePad()));
      })
      .Case([&](nn::GlobalAveragePoolOp) { return one(kernels::globalAveragePool(in(0))); })
      .Case([&](nn::DropoutOp dropout) {
        double ratio = toDouble(dropout.getRatio());
        uint64_t key = 0;
        // The key only matters when elements are dropped; inference-mode
        // dropouts need no identity.
        if (dropout.getTraining() && ratio > 0) {
          auto opId = dropoutOpId(op);
          if (failed(opId))
            throw EvalError("training-mode dropout needs a `seed` attribute or a name "
                            "location to key its mask");
          key = kernels::dropoutStreamKey(options.seed, options.step, options.microBatch, *opId);
        }
        auto results = kernels::dropout(in(0), ratio, dropout.getTraining(), key);
        return std::vector<Tensor>{std::move(results.output), std::move(results.mask)};
      })
      .Case([&](nn::SoftmaxOp softmax) {
        return one(kernels::softmax(in(0), static_cast<int64_t>(softmax.getAxis())));
      })
      .Case([&](nn::MaskedSoftmaxOp softmax) {
        return one(kernels::maskedSoftmax(in(0), in(1), softmax.getScaleAttr().getValueAsDouble(),
                                          softmax.getDivide(), softmax.getFillAttr().getValueAsDouble(),
                                          softmax.getMaskedWhen()));
      })
      .Case([&](nn::AttentionOp attention) {
        const double dropoutRatio = attention.getDropoutRatioAttr().getValueAsDouble();
        const bool sequenceMajor = attention.getSequenceMajor();
        const auto [query, key, value] = attentionOperands(0, sequenceMajor, attention.getJointKvHeads());
        auto results = kernels::attention(
            *query, *key, *value, optionalIn(attention.getMask()), attention.getScaleAttr().getValueAsDouble(), attention.getDivide(),
            attention.getFillAttr().getValueAsDouble(), attention.getMaskedWhen(), dropoutRatio,
            redrawnDropoutKey(attention.getDropoutOpId()));
        return std::vector<Tensor>{inLayout(std::move(results.output), sequenceMajor), std::move(results.logSumExp)};
      })
      .Case([&](nn::SoftmaxCrossEntropyLossOp loss) {
        std::optional<int64_t> ignoreIndex;
        if (auto ignore = loss.getIgnoreIndex())
          ignoreIndex = static_cast<int64_t>(*ignore);
        auto results = kernels::softmaxCrossEntropyLoss(
            in(0), in(1), optionalIn(loss.getWeights()), loss.getReduction().str(), ignoreIndex,
            static_cast<int64_t>(loss.getClasses().value_or(0)));
        return std::vector<Tensor>{std::move(results.loss), std::move(results.logProb)};
      })
      .Case([&](nn::ReduceMeanOp reduce) {
        return one(kernels::reduceMean(in(0), toVector(reduce.getAxes()), reduce.getKeepdims()));
      })
      .Case([&](nn::GatherOp gather) {
        return one(kernels::gather(in(0), in(1), static_cast<int64_t>(gather.getAxis())));
      })
      // Reshape-like ops keep the row-major data; the target shape is the
      // result type, which the op's verifier or shape rule has checked.
      .Case<nn::ReshapeOp, nn::FlattenOp, nn::UnsqueezeOp, nn::SqueezeOp>([&](Operation *) {
        return one(kernels::reshape(in(0), shapeOf(op->getResult(0).getType())));
      })
      .Case([&](nn::ExpandOp) {
        return one(kernels::expand(in(0), shapeOf(op->getResult(0).getType())));
      })
      .Case([&](nn::TransposeOp transpose) {
        return one(kernels::transpose(in(0), toVector(transpose.getPerm())));
      })
      .Case([&](nn::PadOp pad) {
        return one(kernels::pad(in(0), toVector(pad.getPads()), toDouble(pad.getValue())));
      })
      .Case([&](nn::ConcatOp concat) {
        std::vector<const Tensor *> inputs;
        for (const Tensor &operand : operands)
          inputs.push_back(&operand);
        return one(kernels::concat(inputs, static_cast<int64_t>(concat.getAxis())));
      })
      .Case([&](nn::SplitOp split) {
        return kernels::split(in(0), static_cast<int64_t>(split.getAxis()),
                              toVector(split.getSizes()));
      })
      .Case([&](nn::SliceOp slice) {
        return one(kernels::slice(in(0), toVector(slice.getStarts()), toVector(slice.getEnds()),
                                  toVector(slice.getSteps())));
      })
      // Gradients (NNGradOps.td). Result shapes that dy does not determine
      // come from the result types.
      .Case([&](nn::ReduceSumOp reduce) {
        return one(kernels::reduceSum(in(0), toVector(reduce.getAxes()), reduce.getKeepdims()));
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// The gradient ops of autodiff. Empty when `op` is not one of them.
std::optional<std::vector<Tensor>> OpRules::gradient() {
  return llvm::TypeSwitch<Operation *, std::optional<std::vector<Tensor>>>(op)
      .Case([&](nn::UnaryGradOp grad) {
        return one(kernels::unaryGrad(grad.getKind(), in(0), in(1))); // x or y, whichever it reads
      })
      .Case([&](nn::BinaryGradOp grad) {
        return one(kernels::binaryGrad(grad.getKind(), in(0), in(1), in(2)));
      })
      .Case([&](nn::ConvInputGradOp grad) {
        return one(kernels::convInputGrad(
            in(0), in(1), channelsFirstResult(grad.getResult()), toVector(grad.getStrides()),
            toVector(grad.getPads()), toVector(grad.getDilations()),
            static_cast<int64_t>(grad.getGroup())));
      })
      .Case([&](nn::ConvWeightGradOp grad) {
        return one(kernels::convWeightGrad(
            in(0), in(1), channelsFirstResult(grad.getResult()), toVector(grad.getStrides()),
            toVector(grad.getPads()), toVector(grad.getDilations()),
            static_cast<int64_t>(grad.getGroup())));
      })
      .Case([&](nn::BatchNormGradOp grad) {
        // The ReLU's gradient folded in (pipec-fuse-norm-epilogue): at its output y.
        Tensor dy = grad.getActivation() ? kernels::unaryGrad(*grad.getActivation(), in(0), in(5)) : in(0);
        Tensor dx = kernels::batchNormGrad(dy, in(1), in(2), in(3), in(4), toDouble(grad.getEpsilon()),
                                           grad.getTraining());
        if (grad.getKeepsMaskedDy())
          return std::vector<Tensor>{std::move(dx), std::move(dy)};
        return one(std::move(dx));
      })
      .Case([&](nn::BatchNormParamGradOp grad) {
        auto grads = kernels::batchNormParamGrad(in(0), in(1), in(2), in(3),
                                                 toDouble(grad.getEpsilon()), grad.getTraining());
        return std::vector<Tensor>{std::move(grads.scale), std::move(grads.bias)};
      })
      .Case([&](nn::LayerNormGradOp grad) {
        return one(kernels::layerNormGrad(in(0), in(1), in(2), static_cast<int64_t>(grad.getAxis()),
                                          toDouble(grad.getEpsilon()), grad.getCentered()));
      })
      .Case([&](nn::LayerNormParamGradOp grad) {
        auto grads = kernels::layerNormParamGrad(
            in(0), in(1), static_cast<int64_t>(grad.getAxis()), toDouble(grad.getEpsilon()),
            grad.getCentered(), shapeOf(grad.getScaleGrad().getType()), shapeOf(grad.getBiasGrad().getType()));
        return std::vector<Tensor>{std::move(grads.scale), std::move(grads.bias)};
      })
      .Case([&](nn::MaxPoolGradOp grad) {
        return one(kernels::maxPoolGrad(in(0), in(1), toVector(grad.getKernelShape()),
                                        toVector(grad.getStrides()), toVector(grad.getPads()),
                                        toVector(grad.getDilations()), grad.getCeilMode()));
      })
      .Case([&](nn::AveragePoolGradOp grad) {
        return one(kernels::averagePoolGrad(
            in(0), channelsFirstResult(grad.getResult()), toVector(grad.getKernelShape()),
            toVector(grad.getStrides()), toVector(grad.getPads()), grad.getCeilMode(),
            grad.getCountIncludePad()));
      })
      .Case([&](nn::DropoutGradOp grad) {
        const double ratio = toDouble(grad.getRatio());
        if (grad.getMask())
          return one(kernels::dropoutGrad(in(0), in(1), ratio, grad.getTraining()));
        // The forward's mask drawn again (its key from dropout_op_id).
        Tensor mask = grad.getDropoutOpId()
                          ? kernels::dropout(in(0), ratio, grad.getTraining(),
                                             redrawnDropoutKey(*grad.getDropoutOpId()))
                                .mask
                          : kernels::dropout(in(0), ratio, false, 0).mask;
        return one(kernels::dropoutGrad(in(0), mask, ratio, grad.getTraining()));
      })
      .Case([&](nn::SoftmaxGradOp grad) {
        return one(kernels::softmaxGrad(in(0), in(1), static_cast<int64_t>(grad.getAxis())));
      })
      .Case([&](nn::MaskedSoftmaxGradOp grad) {
        return one(kernels::maskedSoftmaxGrad(in(0), in(1), in(2), grad.getScaleAttr().getValueAsDouble(),
                                              grad.getDivide(), grad.getMaskedWhen()));
      })
      .Case([&](nn::AttentionGradOp grad) {
        const bool sequenceMajor = grad.getSequenceMajor();
        const auto [query, key, value] = attentionOperands(1, sequenceMajor, grad.getJointKvHeads());
        auto grads = kernels::attentionGrad(
            headMajorOperand(0, sequenceMajor), *query, *key, *value, optionalIn(grad.getMask()), grad.getScaleAttr().getValueAsDouble(),
            grad.getDivide(), grad.getFillAttr().getValueAsDouble(), grad.getMaskedWhen(),
            grad.getDropoutRatioAttr().getValueAsDouble(), redrawnDropoutKey(grad.getDropoutOpId()));
        std::vector<Tensor> results{inLayout(std::move(grads.query), sequenceMajor),
                                    inLayout(std::move(grads.key), sequenceMajor),
                                    inLayout(std::move(grads.value), sequenceMajor)};
        if (grad.getJointKvHeads() == 0)
          return results;
        // The joint gradient: the windows' gradients in their heads.
        return one(kernels::concat({&results[0], &results[1], &results[2]},
                                   static_cast<int64_t>(results[0].shape.size()) - 2));
      })
      .Case([&](nn::SoftmaxCrossEntropyLossGradOp grad) {
        std::optional<int64_t> ignoreIndex;
        if (auto ignore = grad.getIgnoreIndex())
          ignoreIndex = static_cast<int64_t>(*ignore);
        return one(kernels::softmaxCrossEntropyLossGrad(in(0), in(1), in(2),
                                                        optionalIn(grad.getWeights()),
                                                        grad.getReduction().str(), ignoreIndex,
                                                        static_cast<int64_t>(grad.getClasses().value_or(0))));
      })
      .Case([&](nn::GatherGradOp grad) {
        return one(kernels::gatherGrad(in(0), in(1), static_cast<int64_t>(grad.getAxis()),
                                       shapeOf(grad.getResult().getType())));
      })
      .Case([&](nn::SliceGradOp grad) {
        return one(kernels::sliceGrad(in(0), toVector(grad.getStarts()), toVector(grad.getEnds()),
                                      toVector(grad.getSteps()),
                                      shapeOf(grad.getResult().getType())));
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// The optimizer updates and constants. Empty when `op` is not one of them.
std::optional<std::vector<Tensor>> OpRules::optimizerOrConstant() {
  return llvm::TypeSwitch<Operation *, std::optional<std::vector<Tensor>>>(op)
      // Optimizers: `step` is a scalar i64, whose value is a rank-0 Int64 tensor.
      .Case([&](nn::SgdUpdateOp update) {
        auto results = kernels::sgdUpdate(in(0), in(1), in(2), in(3).ints.at(0),
                                          toDouble(update.getLr()), toDouble(update.getMomentum()),
                                          toDouble(update.getWeightDecay()));
        return std::vector<Tensor>{std::move(results.param), std::move(results.momentumBuffer)};
      })
      .Case([&](nn::AdamWUpdateOp update) {
        auto results = kernels::adamwUpdate(
            in(0), in(1), in(2), in(3), in(4).ints.at(0), toDouble(update.getLr()),
            toDouble(update.getBeta1()), toDouble(update.getBeta2()),
            toDouble(update.getEpsilon()), toDouble(update.getWeightDecay()));
        return std::vector<Tensor>{std::move(results.param), std::move(results.m),
                                   std::move(results.v)};
      })
      .Case([&](nn::ConstantOp constant) {
        auto value = tensorFromAttr(constant.getValue());
        if (failed(value))
          throw EvalError("cannot read the constant's value");
        return one(std::move(*value));
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// A channels-last operand or result in the other layout: rank >= 3 ones
/// (activations, a convolution's weight) move their channel axis; the
/// per-channel parameters stay.
Tensor inOtherLayout(const Tensor &tensor, bool toChannelsLast) {
  const int64_t rank = static_cast<int64_t>(tensor.shape.size());
  if (rank < 3)
    return tensor;
  return kernels::transpose(tensor, toVector(toChannelsLast ? nn::toChannelsLast(rank) : nn::toChannelsFirst(rank)));
}

/// Computes the results of one op; kernels throw EvalError on bad input.
/// `operands` match the op's operands in number, kind and shape.
std::vector<Tensor> dispatch(Operation *op, ArrayRef<Tensor> operands,
                             const EvalOptions &options) {
  if (nn::storesChannelsLast(op)) {
    std::vector<Tensor> channelsFirst;
    for (const Tensor &operand : operands)
      channelsFirst.push_back(inOtherLayout(operand, /*toChannelsLast=*/false));
    OpRules rules(op, channelsFirst, options);
    std::optional<std::vector<Tensor>> results = rules.forward();
    if (!results)
      results = rules.gradient();
    if (!results)
      throw EvalError("the reference evaluator has no rule for '" + op->getName().getStringRef().str() + "'");
    for (Tensor &result : *results)
      result = inOtherLayout(result, /*toChannelsLast=*/true);
    return std::move(*results);
  }
  OpRules rules(op, operands, options);
  if (std::optional<std::vector<Tensor>> results = rules.forward())
    return std::move(*results);
  if (std::optional<std::vector<Tensor>> results = rules.gradient())
    return std::move(*results);
  if (std::optional<std::vector<Tensor>> results = rules.optimizerOrConstant())
    return std::move(*results);
  throw EvalError("the reference evaluator has no rule for '" + op->getName().getStringRef().str() + "'");
}


/// Empty when `tensor` has the kind and shape of `type`, else the difference.
/// A scalar integer or float type (nn.sgd_update's `step: i64`) takes a
/// rank-0 tensor of its element kind.
std::string mismatch(const Tensor &tensor, Type type) {
  Type elementType = type;
  std::vector<int64_t> shape;
  if (auto ranked = llvm::dyn_cast<RankedTensorType>(type)) {
    if (!ranked.hasStaticShape())
      return "a statically shaped tensor type is needed, got " + llvm::to_string(type);
    elementType = ranked.getElementType();
    shape = shapeOf(type);
  } else if (!llvm::isa<IntegerType, FloatType>(type)) {
    return "a statically shaped tensor type or a scalar is needed, got " +
           llvm::to_string(type);
  }
  auto kind = elementKindOf(elementType);
  if (failed(kind))
    return "unsupported element type " + llvm::to_string(elementType);
  if (*kind != tensor.kind || tensor.shape != shape)
    return std::string("value ") + import::elementKindName(tensor.kind) +
           shapeToString(tensor.shape) + " does not match type " + llvm::to_string(type);
  if (static_cast<size_t>(tensor.numElements()) !=
      (import::isFloating(tensor.kind) ? tensor.floats.size() : tensor.ints.size()))
    return "value holds " +
           std::to_string(import::isFloating(tensor.kind) ? tensor.floats.size()
                                                          : tensor.ints.size()) +
           " elements for shape " + shapeToString(tensor.shape);
  return "";
}

} // namespace

FailureOr<ElementKind> elementKindOf(Type type) {
  if (type.isF32()) return ElementKind::Float32;
  if (type.isF64()) return ElementKind::Float64;
  if (type.isF16()) return ElementKind::Float16;
  if (type.isBF16()) return ElementKind::BFloat16;
  if (type.isSignlessInteger(64)) return ElementKind::Int64;
  if (type.isSignlessInteger(32)) return ElementKind::Int32;
  if (type.isSignlessInteger(8)) return ElementKind::Int8;
  if (type.isUnsignedInteger(8)) return ElementKind::UInt8;
  if (type.isSignlessInteger(1)) return ElementKind::Bool;
  return failure();
}

FailureOr<Tensor> tensorFromAttr(ElementsAttr attr) {
  auto type = llvm::cast<ShapedType>(attr.getType());
  auto kind = elementKindOf(type.getElementType());
  if (failed(kind) || !type.hasStaticShape())
    return failure();
  Tensor tensor = zeros(*kind, toVector(type.getShape()));
  if (import::isFloating(*kind)) {
    auto values = attr.tryGetValues<llvm::APFloat>();
    if (!values)
      return failure();
    int64_t i = 0;
    for (llvm::APFloat value : *values)
      tensor.floats[i++] = toDouble(value);
  } else {
    auto values = attr.tryGetValues<llvm::APInt>();
    if (!values)
      return failure();
    bool isUnsigned = *kind == ElementKind::UInt8 || *kind == ElementKind::Bool;
    int64_t i = 0;
    for (const llvm::APInt &value : *values)
      tensor.ints[i++] = isUnsigned ? static_cast<int64_t>(value.getZExtValue()) : value.getSExtValue();
  }
  return tensor;
}

DenseElementsAttr tensorToAttr(const Tensor &tensor, RankedTensorType type) {
  Type element = type.getElementType();
  if (auto floatType = llvm::dyn_cast<FloatType>(element)) {
    std::vector<llvm::APFloat> values;
    for (double value : tensor.floats) {
      llvm::APFloat converted(value);
      bool losesInfo = false;
      converted.convert(floatType.getFloatSemantics(), llvm::APFloat::rmNearestTiesToEven,
                        &losesInfo);
      values.push_back(converted);
    }
    return DenseElementsAttr::get(type, values);
  }
  if (element.isInteger(1)) {
    SmallVector<bool> flags(tensor.ints.begin(), tensor.ints.end());
    return DenseElementsAttr::get(type, llvm::ArrayRef<bool>(flags));
  }
  unsigned width = element.getIntOrFloatBitWidth();
  std::vector<llvm::APInt> values;
  for (int64_t value : tensor.ints)
    values.emplace_back(width, static_cast<uint64_t>(value), /*isSigned=*/true,
                        /*implicitTrunc=*/true);
  return DenseElementsAttr::get(type, values);
}

FailureOr<uint64_t> dropoutOpId(Operation *op) {
  if (std::optional<uint64_t> id = nn::dropoutOpId(op))
    return *id;
  return failure();
}

FailureOr<std::vector<Tensor>> evaluateOp(Operation *op, ArrayRef<Tensor> operands,
                                          const EvalOptions &options) {
  if (operands.size() != op->getNumOperands())
    return op->emitOpError("evaluator: ") << operands.size() << " operand values for "
                                          << op->getNumOperands() << " operands";
  for (auto [index, operand] : llvm::enumerate(operands)) {
    std::string problem = mismatch(operand, op->getOperand(index).getType());
    if (!problem.empty())
      return op->emitOpError("evaluator: operand ") << index << ": " << problem;
  }
  std::vector<Tensor> results;
  try {
    results = dispatch(op, operands, options);
  } catch (const std::exception &error) {
    return op->emitOpError("evaluator: ") << error.what();
  }
  if (results.size() != op->getNumResults())
    return op->emitOpError("evaluator: computed ")
           << results.size() << " results for " << op->getNumResults();
  for (auto [index, result] : llvm::enumerate(results)) {
    // A disagreement here is a bug in the evaluator or in the op's shape
    // rule: the two are written independently on purpose.
    std::string problem = mismatch(result, op->getResult(index).getType());
    if (!problem.empty())
      return op->emitOpError("evaluator: result ") << index << ": " << problem;
  }
  return results;
}

FailureOr<std::vector<Tensor>> evaluateFunction(func::FuncOp function,
                                                ArrayRef<Tensor> arguments,
                                                const EvalOptions &options) {
  if (function.isExternal() || !function.getBody().hasOneBlock())
    return function.emitOpError("evaluator: needs a body of exactly one block");
  Block &body = function.getBody().front();
  if (arguments.size() != body.getNumArguments())
    return function.emitOpError("evaluator: ")
           << arguments.size() << " argument values for " << body.getNumArguments()
           << " arguments";
  llvm::DenseMap<Value, Tensor> values;
  for (auto [index, argument] : llvm::enumerate(arguments)) {
    std::string problem = mismatch(argument, body.getArgument(index).getType());
    if (!problem.empty())
      return function.emitOpError("evaluator: argument ") << index << ": " << problem;
    values[body.getArgument(index)] = argument;
  }
  for (Operation &op : body) {
    std::vector<Tensor> operands;
    for (Value operand : op.getOperands()) {
      auto it = values.find(operand);
      if (it == values.end())
        return op.emitOpError("evaluator: an operand is not defined in the function's block");
      operands.push_back(it->second);
    }
    if (llvm::isa<func::ReturnOp>(op))
      return operands;
    if (op.getNumRegions() != 0)
      return op.emitOpError("evaluator: ops with regions are not evaluated");
    auto results = evaluateOp(&op, operands, options);
    if (failed(results))
      return failure();
    for (auto [value, result] : llvm::zip(op.getResults(), *results))
      values[value] = std::move(result);
  }
  return function.emitOpError("evaluator: the body does not end in func.return");
}

} // namespace pipec::eval
