// Verifiers, result-type inference and work estimates of the gradient and
// optimizer ops (NNGradOps.td).
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace pipec::nn;

namespace {
RankedTensorType rankedType(Value value) {
  return llvm::cast<RankedTensorType>(value.getType());
}

LogicalResult fail(std::optional<Location> loc, const Twine &message) {
  return emitOptionalError(loc, message);
}

double elementsOf(Value value) {
  return static_cast<double>(rankedType(value).getNumElements());
}

double bytesOf(Value value) {
  auto type = rankedType(value);
  return static_cast<double>(type.getNumElements()) *
         std::max(1u, type.getElementType().getIntOrFloatBitWidth() / 8);
}

/// A gradient op is itself never differentiated: its work is its forward.
OpWork streamingWork(Operation *op, double flopsPerElement) {
  OpWork work;
  double elements = 0, bytes = 0;
  for (Value operand : op->getOperands()) {
    elements = std::max(elements, elementsOf(operand));
    bytes += bytesOf(operand);
  }
  for (Value result : op->getResults())
    bytes += bytesOf(result);
  work.forwardFlops = elements * flopsPerElement;
  work.forwardBytes = bytes;
  work.gradientFlops.assign(op->getNumOperands(), 0);
  work.gradientBytes.assign(op->getNumOperands(), 0);
  return work;
}

LogicalResult verifyConvGrad(Operation *op, RankedTensorType dy, RankedTensorType other,
                             ArrayRef<int64_t> strides, ArrayRef<int64_t> pads,
                             ArrayRef<int64_t> dilations) {
  size_t spatial = dy.getRank() - 2;
  if (dy.getRank() < 3 || other.getRank() != dy.getRank())
    return op->emitOpError("dy and the other operand need the same rank >= 3");
  if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial)
    return op->emitOpError("strides and dilations need ")
           << spatial << " entries and pads " << 2 * spatial;
  return success();
}
} // namespace

LogicalResult ReduceSumOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                            Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> axes = adaptor.getAxes();
  for (auto [index, axis] : llvm::enumerate(axes))
    if (axis < 0 || axis >= inputType.getRank() || (index && axes[index - 1] >= axis))
      return fail(loc, "nn.reduce_sum: axes must be sorted, unique and in [0, " +
                           Twine(inputType.getRank()) + ")");
  SmallVector<int64_t> shape;
  for (int64_t dim = 0; dim < inputType.getRank(); ++dim) {
    if (!llvm::is_contained(axes, dim))
      shape.push_back(inputType.getDimSize(dim));
    else if (adaptor.getKeepdims())
      shape.push_back(1);
  }
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult BinaryGradOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                             Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto shape = broadcastShapes(rankedType(adaptor.getLhs()).getShape(),
                               rankedType(adaptor.getRhs()).getShape());
  auto dyType = rankedType(adaptor.getDy());
  if (failed(shape) || ArrayRef<int64_t>(*shape) != dyType.getShape())
    return fail(loc, "nn.binary_grad: dy must have the broadcast shape of lhs and rhs");
  types.push_back(dyType);
  return success();
}

LogicalResult UnaryGradOp::verify() {
  // Exactly the forward value the derivative reads: the other one would be
  // kept alive (saved for the backward) for nothing.
  const bool readsInput = derivativeReadsInput(getKind());
  Value read = readsInput ? getX() : getY(), unread = readsInput ? getY() : getX();
  const char *readName = readsInput ? "x" : "y", *unreadName = readsInput ? "y" : "x";
  if (!read)
    return emitOpError() << "'" << unaryName(getKind()) << "' reads the forward "
                         << (readsInput ? "input" : "result") << ": needs " << readName << " = ...";
  if (unread)
    return emitOpError() << "'" << unaryName(getKind()) << "' does not read " << unreadName
                         << ": give only " << readName;
  return success();
}

LogicalResult DropoutGradOp::verify() {
  if (Value mask = getMask()) {
    if (llvm::cast<RankedTensorType>(mask.getType()).getShape() != getDy().getType().getShape())
      return emitOpError("mask shape differs from dy's");
    if (getDropoutOpId())
      return emitOpError("has both a mask and a dropout_op_id to draw one");
  } else if (getTraining() && getRatio().convertToDouble() > 0 && !getDropoutOpId()) {
    return emitOpError("in training needs its mask or the forward dropout's dropout_op_id");
  }
  return success();
}

LogicalResult MaskedSoftmaxGradOp::verify() {
  std::string error = maskedSoftmaxShapeError(getY().getType().getShape(), getMask().getType().getShape());
  if (!error.empty())
    return emitOpError(error);
  return success();
}

LogicalResult ConvInputGradOp::verify() {
  if (failed(verifyConvGrad(*this, getDy().getType(), getWeight().getType(), getStrides(),
                            getPads(), getDilations())))
    return failure();
  // The result is a forward conv's input: convolving it must give dy's shape
  // (checked, since ConvTranspose's attributes come from the model).
  // Checked in the channels-first order the rules are written in.
  const bool channelsLast = getChannelsLast();
  const SmallVector<int64_t> dy = channelsFirstShape(getDy().getType().getShape(), channelsLast),
                             weight = channelsFirstShape(getWeight().getType().getShape(), channelsLast),
                             result = channelsFirstShape(getResult().getType().getShape(), channelsLast);
  int64_t group = getGroup();
  if (result.size() != dy.size() || group < 1 || dy[1] != weight[0] || weight[0] % group ||
      result[1] != weight[1] * group || result[0] != dy[0])
    return emitOpError() << "dy [" << getDy().getType().getShape() << "], weight ["
                         << getWeight().getType().getShape() << "], group " << group << " and result ["
                         << getResult().getType().getShape() << "] do not match";
  auto spatial = inferWindowedShape(getLoc(), "nn.conv_input_grad", result, ArrayRef<int64_t>(weight).drop_front(2),
                                    getStrides(), getPads(), getDilations(), /*ceilMode=*/false);
  if (failed(spatial))
    return failure();
  for (auto [axis, size] : llvm::enumerate(*spatial))
    if (size != dy[axis + 2])
      return emitOpError() << "convolving the result [" << getResult().getType().getShape() << "] gives "
                           << size << " on spatial axis " << axis << ", not dy's " << dy[axis + 2];
  return success();
}

LogicalResult ConvWeightGradOp::verify() {
  return verifyConvGrad(*this, getDy().getType(), getInput().getType(), getStrides(), getPads(),
                        getDilations());
}

LogicalResult BatchNormGradOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                                Adaptor adaptor, SmallVectorImpl<Type> &types) {
  if (adaptor.getDy().getType() != adaptor.getInput().getType())
    return fail(loc, "nn.batch_norm_grad: dy and input types differ");
  const bool activation = adaptor.getActivation().has_value();
  if (activation && !::pipec::epilogueActivationApplies(*adaptor.getActivation()))
    return fail(loc, "nn.batch_norm_grad: the only activations its kernels take are relu and relu6");
  if (activation != static_cast<bool>(adaptor.getY()))
    return fail(loc, "nn.batch_norm_grad: an activation needs y, its output, and y an activation");
  if (Value y = adaptor.getY(); y && rankedType(y).getShape() != rankedType(adaptor.getInput()).getShape())
    return fail(loc, "nn.batch_norm_grad: y does not have the input's shape");
  types.push_back(adaptor.getInput().getType());
  // (Attributes from a dictionary may lack the defaulted ones.)
  if (BoolAttr keeps = adaptor.getKeepsMaskedDyAttr(); keeps && keeps.getValue()) {
    if (!activation)
      return fail(loc, "nn.batch_norm_grad: keeps_masked_dy without an activation");
    types.push_back(adaptor.getDy().getType());
  }
  return success();
}

LogicalResult BatchNormParamGradOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                                     Adaptor adaptor,
                                                     SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (adaptor.getDy().getType() != inputType || inputType.getRank() < 2)
    return fail(loc, "nn.batch_norm_param_grad: dy and input must be the same (N,C,...) type");
  const int64_t channel = channelAxis(inputType.getRank(), isSet(adaptor.getChannelsLastAttr()));
  auto channels = RankedTensorType::get({inputType.getDimSize(channel)}, inputType.getElementType());
  types.push_back(channels);
  types.push_back(channels);
  return success();
}

LogicalResult LayerNormGradOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                                Adaptor adaptor, SmallVectorImpl<Type> &types) {
  if (adaptor.getDy().getType() != adaptor.getInput().getType())
    return fail(loc, "nn.layer_norm_grad: dy and input types differ");
  if (failed(normalizeAxis(adaptor.getAxis(), rankedType(adaptor.getInput()).getRank())))
    return fail(loc, "nn.layer_norm_grad: axis out of range");
  types.push_back(adaptor.getInput().getType());
  return success();
}

AttentionOperandShapes AttentionGradOp::operandShapes() {
  AttentionOperandShapes shapes;
  (void)attentionOperandsError(getQuery(), getKey(), getValue(), {}, getSequenceMajor(), getJointKvHeads(), shapes);
  return shapes;
}

LogicalResult AttentionGradOp::verify() {
  AttentionOperandShapes shapes;
  std::string error = attentionOperandsError(getQuery(), getKey(), getValue(), getMask(), getSequenceMajor(),
                                             getJointKvHeads(), shapes);
  if (!error.empty())
    return emitOpError(error);
  // The gradients: one per operand, or the joint operand's alone.
  SmallVector<Type> operandTypes{getQuery().getType()};
  if (getJointKvHeads() == 0)
    operandTypes.append({getKey().getType(), getValue().getType()});
  if (getDy().getType() != getResult().getType() || TypeRange(getGrads()) != TypeRange(operandTypes))
    return emitOpError("dy must match the forward result, and the gradients their operands (the joint operand "
                       "alone with joint_kv_heads)");
  if (const double ratio = getDropoutRatio().convertToDouble(); !(ratio >= 0.0 && ratio < 1.0))
    return emitOpError("dropout_ratio must be in [0, 1), got ") << ratio;
  return success();
}

// Work estimates: gradient ops are scheduled as B or W work by autodiff's
// placement, and their own work is their forward.
OpWork ReduceSumOp::estimateWork() { return streamingWork(*this, 1); }
OpWork UnaryGradOp::estimateWork() { return streamingWork(*this, 10); }
OpWork BinaryGradOp::estimateWork() { return streamingWork(*this, 10); }
OpWork ConvInputGradOp::estimateWork() {
  OpWork work = streamingWork(*this, 0);
  auto weight = getWeight().getType();
  work.forwardFlops = 2 * elementsOf(getDy()) *
                      static_cast<double>(weight.getNumElements()) / weight.getDimSize(0);
  // As ConvTranspose's forward: each operand's gradient is one convolution
  // of the same size (a conv, a conv_weight_grad).
  work.gradientFlops.assign(2, work.forwardFlops);
  work.gradientBytes.assign(2, work.forwardBytes);
  return work;
}
OpWork ConvWeightGradOp::estimateWork() {
  OpWork work = streamingWork(*this, 0);
  auto weight = getResult().getType();
  work.forwardFlops = 2 * elementsOf(getDy()) *
                      static_cast<double>(weight.getNumElements()) / weight.getDimSize(0);
  return work;
}
OpWork BatchNormGradOp::estimateWork() { return streamingWork(*this, 10); }
OpWork BatchNormParamGradOp::estimateWork() { return streamingWork(*this, 6); }
OpWork LayerNormGradOp::estimateWork() { return streamingWork(*this, 12); }
OpWork LayerNormParamGradOp::estimateWork() { return streamingWork(*this, 6); }
OpWork AttentionGradOp::estimateWork() {
  // Recomputing the scores, then four products of the same size (and the
  // dropout mask regenerated, when there is one).
  OpWork work = streamingWork(*this, 0);
  if (getJointKvHeads() > 0) // one joint operand, read once
    work.forwardBytes -= 2 * bytesOf(getQuery());
  const AttentionOperandShapes shapes = operandShapes();
  auto elementType = getQuery().getType().getElementType();
  auto query = RankedTensorType::get(shapes.query, elementType), value = RankedTensorType::get(shapes.value, elementType);
  work.forwardFlops =
      attentionGradFlops(query, value, getSequenceMajor()) +
      attentionDropoutFlops(query, value, getSequenceMajor(),
                            getDropoutRatio().convertToFloat());
  return work;
}
OpWork MaxPoolGradOp::estimateWork() { return streamingWork(*this, 2); }
OpWork AveragePoolGradOp::estimateWork() { return streamingWork(*this, 2); }
OpWork DropoutGradOp::estimateWork() { return streamingWork(*this, 1); }
OpWork SoftmaxGradOp::estimateWork() { return streamingWork(*this, 4); }
OpWork MaskedSoftmaxGradOp::estimateWork() { return streamingWork(*this, 5); }
OpWork SoftmaxCrossEntropyLossGradOp::estimateWork() { return streamingWork(*this, 4); }
OpWork GatherGradOp::estimateWork() { return streamingWork(*this, 1); }
OpWork SliceGradOp::estimateWork() { return streamingWork(*this, 0); }
OpWork SgdUpdateOp::estimateWork() { return streamingWork(*this, 4); }
OpWork AdamWUpdateOp::estimateWork() { return streamingWork(*this, 12); }
