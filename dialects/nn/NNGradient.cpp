// The gradient rule of each differentiable `nn` op (GradientOpInterface,
// docs/autodiff.md): the gradient of one operand given the gradients of the
// op's results. Element-wise unary ops share one rule (NN_UnaryFloatOp and
// GradientBuilder::unaryGradient); pipec-autodiff walks the graph and calls
// these.
#include "dialects/nn/NNGradient.h"


using namespace mlir;

namespace pipec::nn {
namespace {

RankedTensorType tensorType(Value value) { return llvm::cast<RankedTensorType>(value.getType()); }

} // namespace

Value GradientBuilder::scalar(Type element, double value) {
  auto type = RankedTensorType::get({}, element);
  return ConstantOp::create(b, loc, DenseElementsAttr::get(type, b.getFloatAttr(element, value)));
}

Value GradientBuilder::reshape(Value value, RankedTensorType type) {
  if (value.getType() == type)
    return value;
  return ReshapeOp::create(b, loc, type, value);
}

Value GradientBuilder::sumTo(Value gradient, RankedTensorType target) {
  auto type = tensorType(gradient);
  if (type == target)
    return gradient;
  int64_t offset = type.getRank() - target.getRank();
  SmallVector<int64_t> axes;
  for (int64_t axis = 0; axis < type.getRank(); ++axis)
    if (axis < offset || (target.getDimSize(axis - offset) == 1 && type.getDimSize(axis) != 1))
      axes.push_back(axis);
  Value reduced = axes.empty() ? gradient : Value(ReduceSumOp::create(b, loc, gradient, axes, true));
  return reshape(reduced, target);
}

Value GradientBuilder::gemm(Value lhs, Value rhs, float alpha, bool transA, bool transB) {
  return GemmOp::create(b, loc, lhs, rhs, /*c=*/Value(), llvm::APFloat(alpha), llvm::APFloat(1.0f), transA,
                        transB, /*activation=*/nullptr)
      .getResult();
}

Value GradientBuilder::transposeLastTwo(Value value) {
  int64_t rank = tensorType(value).getRank();
  SmallVector<int64_t> perm(rank);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return TransposeOp::create(b, loc, value, perm);
}

Value GradientBuilder::unaryGradient(Operation *op, Value dy) {
  Unary kind = llvm::cast<UnaryElementwiseOpInterface>(op).getUnaryFunction();
  // Only the forward value the derivative reads, so only that one is saved.
  const bool readsInput = derivativeReadsInput(kind);
  return UnaryGradOp::create(b, loc, dy.getType(), dy, readsInput ? op->getOperand(0) : Value(),
                             readsInput ? Value() : op->getResult(0), kind);
}

Value AddOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return g.sumTo(dy, operandType);
}

Value SubOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index == 0)
    return g.sumTo(dy, operandType);
  return g.sumTo(BinaryGradOp::create(g.b, g.loc, dy, getLhs(), getRhs(), BinaryGradient::SubRhs),
               operandType);
}

Value MulOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  Value other = index == 0 ? getRhs() : getLhs();
  return g.sumTo(MulOp::create(g.b, g.loc, dy, other), operandType);
}

Value DivOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index == 0)
    return g.sumTo(DivOp::create(g.b, g.loc, dy, getRhs()), operandType);
  return g.sumTo(BinaryGradOp::create(g.b, g.loc, dy, getLhs(), getRhs(), BinaryGradient::DivRhs),
               operandType);
}

Value PowOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return g.sumTo(BinaryGradOp::create(g.b, g.loc, dy, getLhs(), getRhs(),
                                        index == 0 ? BinaryGradient::PowLhs : BinaryGradient::PowRhs),
               operandType);
}

Value MaxOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return g.sumTo(BinaryGradOp::create(g.b, g.loc, dys[0], getLhs(), getRhs(),
                                      index == 0 ? BinaryGradient::MaxLhs : BinaryGradient::MaxRhs),
                 operandType);
}

Value MinOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return g.sumTo(BinaryGradOp::create(g.b, g.loc, dys[0], getLhs(), getRhs(),
                                      index == 0 ? BinaryGradient::MinLhs : BinaryGradient::MinRhs),
                 operandType);
}

Value WhereOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index == 0)
    return Value();
  Value zero = g.scalar(tensorType(dy).getElementType(), 0.0);
  Value picked = index == 1 ? WhereOp::create(g.b, g.loc, getCondition(), dy, zero)
                            : WhereOp::create(g.b, g.loc, getCondition(), zero, dy);
  return g.sumTo(picked, operandType);
}

Value RotaryOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  // The op is linear in x with adjoint the transposed rotation (and the
  // transposed one's adjoint is the plain one).
  if (index == 0)
    return RotaryOp::create(g.b, g.loc, dy, getCos(), getSin(), getInterleaved(), !getTransposed());
  if (index == 1)
    return g.sumTo(MulOp::create(g.b, g.loc, dy, getInput()), operandType);
  // sin: <dy, R(x) * sin> gives dy * R(x); <dy, Rᵀ(x * sin)> gives x * R(dy).
  // R(v) is the rotation with cos 0 and sin 1.
  Type element = tensorType(dy).getElementType();
  auto rotated = [&](Value v) {
    return RotaryOp::create(g.b, g.loc, v, g.scalar(element, 0.0), g.scalar(element, 1.0), getInterleaved(),
                            /*transposed=*/false);
  };
  Value product = getTransposed() ? MulOp::create(g.b, g.loc, getInput(), rotated(dy))
                                  : MulOp::create(g.b, g.loc, dy, rotated(getInput()));
  return g.sumTo(product, operandType);
}

Value CastOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (!llvm::isa<FloatType>(operandType.getElementType()))
    return Value();
  return CastOp::create(g.b, g.loc, operandType, dy);
}

Value GemmOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  if (getActivation())
    return Value(); // an epilogue exists after autodiff only
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  float alpha = getAlpha().convertToFloat();
  bool transA = getTransA(), transB = getTransB();
  if (index == 0)
    return transA ? g.gemm(getB(), dy, alpha, transB, true)
                  : g.gemm(dy, getB(), alpha, false, !transB);
  if (index == 1)
    return transB ? g.gemm(dy, getA(), alpha, true, transA)
                  : g.gemm(getA(), dy, alpha, !transA, false);
  Value scaled = dy;
  float beta = getBeta().convertToFloat();
  if (beta != 1.0f)
    scaled = MulOp::create(g.b, g.loc, dy, g.scalar(tensorType(dy).getElementType(), beta));
  return g.sumTo(scaled, operandType);
}

Value MatMulOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  // Work on matrices: 1-D operands become [1, K] and [K, 1].
  Value a = getA(), bValue = getB();
  auto aType = tensorType(a), bType = tensorType(bValue);
  Type element = aType.getElementType();
  if (aType.getRank() == 1)
    a = g.reshape(a, RankedTensorType::get({1, aType.getDimSize(0)}, element));
  if (bType.getRank() == 1)
    bValue = g.reshape(bValue, RankedTensorType::get({bType.getDimSize(0), 1}, element));
  Value full = MatMulOp::create(g.b, g.loc, a, bValue);
  Value dyFull = g.reshape(dy, tensorType(full));
  full.getDefiningOp()->erase();
  Value grad = index == 0 ? Value(MatMulOp::create(g.b, g.loc, dyFull, g.transposeLastTwo(bValue)))
                          : Value(MatMulOp::create(g.b, g.loc, g.transposeLastTwo(a), dyFull));
  Value shaped = index == 0 ? a : bValue;
  return g.reshape(g.sumTo(grad, tensorType(shaped)), operandType);
}

Value ConvOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  if (getResidual() || getActivation())
    return Value(); // an epilogue exists after autodiff only
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index == 0)
    return ConvInputGradOp::create(g.b, g.loc, operandType, dy, getWeight(), getStrides(), getPads(),
                                   getDilations(), getGroup(), getChannelsLast());
  if (index == 1)
    return ConvWeightGradOp::create(g.b, g.loc, operandType, dy, getInput(), getStrides(), getPads(),
                                    getDilations(), getGroup(), getChannelsLast());
  const int64_t rank = tensorType(dy).getRank(), channel = channelAxis(rank, getChannelsLast());
  SmallVector<int64_t> axes;
  for (int64_t axis = 0; axis < rank; ++axis)
    if (axis != channel)
      axes.push_back(axis);
  return Value(ReduceSumOp::create(g.b, g.loc, dy, axes, false));
}

Value ConvInputGradOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  // As ConvTranspose's forward, result = A^T dy where A is the convolution by
  // the weight: d dy = A dresult, and the weight's gradient is the weight
  // gradient of that convolution with dy as its output gradient.
  Value dresult = dys[0];
  if (index == 0)
    return ConvOp::create(g.b, g.loc, dresult, getWeight(), /*bias=*/Value(), /*residual=*/Value(), getStrides(),
                          getPads(), getDilations(), getGroup(), getChannelsLast(), /*activation=*/nullptr);
  return ConvWeightGradOp::create(g.b, g.loc, getWeight().getType(), getDy(), dresult, getStrides(), getPads(),
                                  getDilations(), getGroup(), getChannelsLast());
}

Value BatchNormOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  if (getResidual() || getActivation())
    return Value(); // an epilogue exists after autodiff only
  Value dy = dys[0];
  if (index == 0)
    return BatchNormGradOp::create(g.b, g.loc, dy, getInput(), getScale(), getRunningMean(), getRunningVar(),
                                   /*y=*/Value(), getEpsilon(), getTraining(), /*activation=*/nullptr,
                                   /*keeps_masked_dy=*/false, getChannelsLast())
        .getResult();
  auto statisticType = tensorType(getRunningMean());
  if (index > 2 && getTraining()) // the batch's statistics normalize; the given ones only update
    return ConstantOp::create(g.b, g.loc,
                              DenseElementsAttr::get(statisticType,
                                                     g.b.getZeroAttr(statisticType.getElementType())));
  auto params = BatchNormParamGradOp::create(g.b, g.loc, dy, getInput(), getRunningMean(), getRunningVar(),
                                             getEpsilon(), getTraining(), getChannelsLast());
  if (index <= 2)
    return index == 1 ? params.getScaleGrad() : params.getBiasGrad();
  // Inference form, statistics computed from parameters (weight
  // standardization): y = (x - mean) / s * scale + bias with s = sqrt(var + eps),
  // so dmean = -scale / s * sum(dy) and dvar = -scale / (2 (var + eps)) * sum(dy * x̂).
  Type element = statisticType.getElementType();
  Value variance = AddOp::create(g.b, g.loc, getRunningVar(),
                                 g.scalar(element, getEpsilon().convertToDouble()));
  if (index == 3) {
    Value perScale = DivOp::create(g.b, g.loc, getScale(), SqrtOp::create(g.b, g.loc, variance));
    return NegOp::create(g.b, g.loc, MulOp::create(g.b, g.loc, perScale, params.getBiasGrad()));
  }
  Value halfScale = MulOp::create(g.b, g.loc, getScale(), g.scalar(element, -0.5));
  Value perScale = DivOp::create(g.b, g.loc, halfScale, variance);
  return MulOp::create(g.b, g.loc, perScale, params.getScaleGrad());
}

Value LayerNormOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index == 0)
    return LayerNormGradOp::create(g.b, g.loc, dy, getInput(), getScale(),
                                       getAxis(), getEpsilon(), getCentered());
  auto inputType = tensorType(getInput());
  int64_t axis = *normalizeAxis(getAxis(), inputType.getRank());
  auto normalized = RankedTensorType::get(inputType.getShape().drop_front(axis),
                                          inputType.getElementType());
  auto params = LayerNormParamGradOp::create(
      g.b, g.loc, TypeRange{normalized, normalized}, dy, getInput(), getAxis(),
      getEpsilon(), getCentered());
  Value grad = index == 1 ? params.getScaleGrad() : params.getBiasGrad();
  return g.sumTo(grad, operandType);
}

Value MaxPoolOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return MaxPoolGradOp::create(g.b, g.loc, operandType, dy, getInput(), getKernelShape(), getStrides(), getPads(),
                               getDilations(), getCeilMode(), getChannelsLast());
}

Value AveragePoolOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return AveragePoolGradOp::create(g.b, g.loc, operandType, dy, getKernelShape(), getStrides(), getPads(),
                                   getCeilMode(), getCountIncludePad(), getChannelsLast());
}

Value GlobalAveragePoolOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  const int64_t rank = operandType.getRank(), channel = channelAxis(rank, getChannelsLast());
  int64_t window = 1;
  for (int64_t axis = 1; axis < rank; ++axis)
    if (axis != channel)
      window *= operandType.getDimSize(axis);
  Value spread = ExpandOp::create(g.b, g.loc, operandType, dy);
  return MulOp::create(g.b, g.loc, spread,
                           g.scalar(operandType.getElementType(), 1.0 / window));
}

Value DropoutOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return DropoutGradOp::create(g.b, g.loc, operandType, dy, getMask(), getRatio(), getTraining(),
                               /*dropout_op_id=*/nullptr);
}

Value SoftmaxOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned) {
  Value dy = dys[0];
  return SoftmaxGradOp::create(g.b, g.loc, dy, getResult(), getAxis());
}

Value MaskedSoftmaxOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  if (index != 0) // the mask
    return Value();
  return MaskedSoftmaxGradOp::create(g.b, g.loc, dys[0], getResult(), getMask(), getScaleAttr(), getDivideAttr(),
                                     getMaskedWhenAttr());
}

Value AttentionOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  if (index > 2) // the mask
    return Value();
  Value dy = dys[0];
  if (!dy)
    return Value();
  // One op for the three gradients (CSE merges the three requests); a
  // joint operand's one gradient is asked for the query's slot alone.
  if (gradientInEarlierOperand(index))
    return Value();
  const bool joint = getJointKvHeads() > 0;
  SmallVector<Type> types{getQuery().getType()};
  if (!joint)
    types.append({getKey().getType(), getValue().getType()});
  auto grads = AttentionGradOp::create(
      g.b, g.loc, types, dy, getQuery(), getKey(), getValue(), getMask(), getResult(), getLogSumExp(), getScaleAttr(),
      getDivideAttr(), getFillAttr(), getMaskedWhenAttr(), getDropoutRatioAttr(), getDropoutOpIdAttr(),
      getSequenceMajorAttr(), getJointKvHeadsAttr());
  return grads->getResult(index);
}

bool AttentionOp::gradientInEarlierOperand(unsigned index) {
  return getJointKvHeads() > 0 && (index == 1 || index == 2);
}

Value SoftmaxCrossEntropyLossOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index != 0)
    return Value();
  return SoftmaxCrossEntropyLossGradOp::create(
      g.b, g.loc, operandType, dy, getScores(), getLabels(), getWeights(),
      getReduction(), getIgnoreIndexAttr(), getClassesAttr());
}

Value ReduceMeanOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  ArrayRef<int64_t> axes = getAxes();
  SmallVector<int64_t> kept(operandType.getShape());
  int64_t count = 1;
  for (int64_t axis = 0; axis < operandType.getRank(); ++axis)
    if (axes.empty() || llvm::is_contained(axes, axis)) {
      count *= kept[axis];
      kept[axis] = 1;
    }
  Value shaped = g.reshape(dy, RankedTensorType::get(kept, operandType.getElementType()));
  Value spread = ExpandOp::create(g.b, g.loc, operandType, shaped);
  return MulOp::create(g.b, g.loc, spread, g.scalar(operandType.getElementType(), 1.0 / count));
}

Value GatherOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  if (index != 0)
    return Value();
  return GatherGradOp::create(g.b, g.loc, operandType, dy, getIndices(),
                                  getAxis());
}

/// A view (reshape, flatten, squeeze, unsqueeze): dy in the operand's shape.
static Value viewGradient(GradientBuilder &g, Operation *op, ArrayRef<Value> dys, unsigned index) {
  return g.reshape(dys[0], tensorType(op->getOperand(index)));
}

Value ReshapeOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  return viewGradient(g, *this, dys, index);
}

Value FlattenOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  return viewGradient(g, *this, dys, index);
}

Value SqueezeOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  return viewGradient(g, *this, dys, index);
}

Value UnsqueezeOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  return viewGradient(g, *this, dys, index);
}

Value ExpandOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return g.sumTo(dy, operandType);
}

Value TransposeOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned) {
  Value dy = dys[0];
  ArrayRef<int64_t> perm = getPerm();
  SmallVector<int64_t> inverse(perm.size());
  for (auto [position, axis] : llvm::enumerate(perm))
    inverse[axis] = position;
  return TransposeOp::create(g.b, g.loc, dy, inverse);
}

Value ConcatOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  int64_t rank = operandType.getRank();
  int64_t axis = *normalizeAxis(getAxis(), rank);
  int64_t start = 0;
  for (unsigned i = 0; i < index; ++i)
    start += tensorType(getInputs()[i]).getDimSize(axis);
  SmallVector<int64_t> starts(rank, 0), ends(tensorType(dy).getShape()), steps(rank, 1);
  starts[axis] = start;
  ends[axis] = start + operandType.getDimSize(axis);
  return SliceOp::create(g.b, g.loc, dy, starts, ends, steps);
}

Value SplitOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned) {
  SmallVector<Value> pieces;
  for (auto [piece, result] : llvm::zip(dys, getResults())) {
    if (piece) {
      pieces.push_back(piece);
      continue;
    }
    auto type = tensorType(result);
    pieces.push_back(ConstantOp::create(
        g.b, g.loc, DenseElementsAttr::get(type, g.b.getFloatAttr(type.getElementType(), 0.0))));
  }
  return ConcatOp::create(g.b, g.loc, pieces, getAxis());
}

Value SliceOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  return SliceGradOp::create(g.b, g.loc, operandType, dy, getStarts(), getEnds(),
                                 getSteps());
}

Value PadOp::buildGradient(GradientBuilder &g, ArrayRef<Value> dys, unsigned index) {
  Value dy = dys[0];
  RankedTensorType operandType = tensorType(getOperation()->getOperand(index));
  int64_t rank = operandType.getRank();
  ArrayRef<int64_t> pads = getPads();
  SmallVector<int64_t> starts(pads.take_front(rank)), ends, steps(rank, 1);
  for (int64_t axis = 0; axis < rank; ++axis)
    ends.push_back(pads[axis] + operandType.getDimSize(axis));
  return SliceOp::create(g.b, g.loc, dy, starts, ends, steps);
}

} // namespace pipec::nn
