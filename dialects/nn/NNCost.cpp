// Each `nn` op's work for one micro-batch (NNCostInterface): forward FLOPs
// and bytes, and the FLOPs and bytes of the gradient with respect to each
// operand. Counting conventions (docs/cost-model.md): a multiply-add is two
// FLOPs; transcendental functions count as a few FLOPs per element; bytes are
// every operand read once and every result written once.
#include "dialects/nn/NNDialect.h"

using namespace mlir;
using namespace pipec::nn;

namespace {

double elementsOf(Value value) {
  return static_cast<double>(llvm::cast<ShapedType>(value.getType()).getNumElements());
}

double bytesOf(Value value) {
  auto type = llvm::cast<ShapedType>(value.getType());
  unsigned bits = type.getElementType().getIntOrFloatBitWidth();
  return static_cast<double>(type.getNumElements()) * std::max(1u, bits / 8);
}

bool hasGradient(Value value) {
  return llvm::isa<FloatType>(llvm::cast<ShapedType>(value.getType()).getElementType());
}

double operandBytes(Operation *op) {
  double bytes = 0;
  for (Value operand : op->getOperands())
    bytes += bytesOf(operand);
  return bytes;
}

double resultBytes(Operation *op) {
  double bytes = 0;
  for (Value result : op->getResults())
    bytes += bytesOf(result);
  return bytes;
}

/// Forward reads the operands and writes the results; the gradient of a
/// float operand reads the result gradients and the operands and writes one
/// tensor of the operand's size, at `gradientFlopsPerElement` per output
/// element (plus the reduction over broadcast axes, one add per element).
OpWork elementwise(Operation *op, double flopsPerElement, double gradientFlopsPerElement) {
  OpWork work;
  double outputs = elementsOf(op->getResult(0));
  work.forwardFlops = outputs * flopsPerElement;
  work.forwardBytes = operandBytes(op) + resultBytes(op);
  for (Value operand : op->getOperands()) {
    bool differentiable = hasGradient(operand);
    double reduction = outputs > elementsOf(operand) ? outputs : 0;
    work.gradientFlops.push_back(differentiable ? outputs * gradientFlopsPerElement + reduction
                                                : 0);
    work.gradientBytes.push_back(differentiable ? resultBytes(op) + operandBytes(op) +
                                                      bytesOf(operand)
                                                : 0);
  }
  return work;
}

/// Data movement: no arithmetic; copies (or, for views, nothing).
OpWork movement(Operation *op, bool isView) {
  OpWork work;
  work.launchesKernel = !isView;
  work.forwardBytes = isView ? 0 : operandBytes(op) + resultBytes(op);
  for (Value operand : op->getOperands()) {
    bool differentiable = hasGradient(operand);
    work.gradientFlops.push_back(0);
    work.gradientBytes.push_back(differentiable && !isView ? resultBytes(op) + bytesOf(operand)
                                                           : 0);
  }
  return work;
}

/// A product of an m×k and a k×n operand (batch times): 2mnk FLOPs forward
/// and for each operand's gradient.
OpWork matrixProduct(Operation *op, double batch, double m, double n, double k) {
  OpWork work;
  double flops = 2 * batch * m * n * k;
  work.forwardFlops = flops;
  work.forwardBytes = operandBytes(op) + resultBytes(op);
  // A GEMM's C, a convolution's bias (not an epilogue's residual).
  Value bias = op->getNumOperands() == 3 ? op->getOperand(2) : Value();
  if (auto conv = llvm::dyn_cast<ConvOp>(op))
    bias = conv.getBias();
  for (Value operand : op->getOperands()) {
    bool differentiable = hasGradient(operand);
    bool isBias = bias && operand == bias;
    work.gradientFlops.push_back(!differentiable ? 0 : isBias ? batch * m * n : flops);
    work.gradientBytes.push_back(differentiable ? resultBytes(op) + operandBytes(op) +
                                                      bytesOf(operand)
                                                : 0);
  }
  return work;
}

/// Normalizations, softmax, loss: a few passes over the input.
OpWork reduction(Operation *op, double flopsPerElement, double gradientFlopsPerElement) {
  OpWork work;
  double elements = elementsOf(op->getOperand(0));
  work.forwardFlops = elements * flopsPerElement;
  work.forwardBytes = operandBytes(op) + resultBytes(op);
  for (Value operand : op->getOperands()) {
    bool differentiable = hasGradient(operand);
    work.gradientFlops.push_back(differentiable ? elements * gradientFlopsPerElement : 0);
    work.gradientBytes.push_back(differentiable ? 2 * bytesOf(op->getOperand(0)) +
                                                      bytesOf(op->getResult(0)) +
                                                      bytesOf(operand)
                                                : 0);
  }
  return work;
}

double windowVolume(ArrayRef<int64_t> kernel) {
  double volume = 1;
  for (int64_t size : kernel)
    volume *= size;
  return volume;
}

} // namespace

OpWork pipec::nn::unaryWork(Operation *op) {
  const UnaryFunction &function =
      unaryFunction(llvm::cast<UnaryElementwiseOpInterface>(op).getUnaryFunction());
  return elementwise(op, function.flops, function.derivativeFlops);
}

OpWork pipec::nn::binaryWork(Operation *op) {
  const BinaryFunction &function =
      binaryFunction(llvm::cast<BinaryElementwiseOpInterface>(op).getBinaryFunction());
  return elementwise(op, function.flops, function.gradientFlops);
}

// Element-wise (transcendentals count as 8 FLOPs: a polynomial each).
OpWork WhereOp::estimateWork() { return elementwise(*this, 1, 1); }
OpWork RotaryOp::estimateWork() { return elementwise(*this, 3, 3); }
OpWork CastOp::estimateWork() { return elementwise(*this, 1, 1); }
OpWork DropoutOp::estimateWork() { return elementwise(*this, 4, 1); }

OpWork GemmOp::estimateWork() {
  const auto [m, k, kB, n] = gemmDims(getA().getType(), getB().getType(), getTransA(), getTransB());
  OpWork work = matrixProduct(*this, 1, m, n, k);
  if (auto activation = getActivation()) // the epilogue, on the output while it is written
    work.forwardFlops += double(m) * double(n) * unaryFunction(*activation).flops;
  return work;
}

OpWork GemmActivationGradOp::estimateWork() {
  const auto [m, k, kB, n] = gemmDims(getA().getType(), getB().getType(), getTransA(), getTransB());
  OpWork work = matrixProduct(*this, 1, m, n, k);
  // The derivative at x, on the product while it is written.
  work.forwardFlops += double(m) * double(n) * unaryFunction(getFunction()).derivativeFlops;
  return work;
}

OpWork MatMulOp::estimateWork() {
  auto a = getA().getType(), b = getB().getType();
  auto result = getResult().getType();
  double k = a.getShape().back();
  double m = a.getRank() >= 2 ? a.getDimSize(a.getRank() - 2) : 1;
  double n = b.getRank() >= 2 ? b.getShape().back() : 1;
  double batch = elementsOf(getResult()) / std::max(1.0, m * n);
  (void)result;
  return matrixProduct(*this, batch, m, n, k);
}

OpWork BatchedGemmOp::estimateWork() {
  auto a = getA().getType(), b = getB().getType();
  int64_t rankA = a.getRank(), rankB = b.getRank();
  double k = getTransA() ? a.getDimSize(rankA - 2) : a.getShape().back();
  double m = getTransA() ? a.getShape().back() : rankA >= 2 ? a.getDimSize(rankA - 2) : 1;
  double n = getTransB() ? b.getDimSize(rankB - 2) : rankB >= 2 ? b.getShape().back() : 1;
  double batch = elementsOf(getResult()) / std::max(1.0, m * n);
  return matrixProduct(*this, batch, m, n, k);
}

OpWork ConvOp::estimateWork() {
  auto weight = getWeight().getType();
  // Each output element is a dot product over C/group × kernel inputs.
  double perOutput = static_cast<double>(weight.getNumElements()) / weight.getDimSize(0);
  OpWork work = matrixProduct(*this, 1, elementsOf(getResult()), 1, perOutput);
  return work;
}

OpWork BatchNormOp::estimateWork() { return reduction(*this, 6, 10); }
OpWork LayerNormOp::estimateWork() { return reduction(*this, 8, 12); }
OpWork SoftmaxOp::estimateWork() { return reduction(*this, 12, 4); }
OpWork MaskedSoftmaxOp::estimateWork() { return reduction(*this, 13, 4); }
namespace {
/// nn.attention's score rows (L·S) and keys (T), from its query and value.
std::pair<double, double> attentionScores(RankedTensorType query, RankedTensorType value, bool sequenceMajor) {
  return {static_cast<double>(query.getNumElements()) / query.getShape().back(),
          static_cast<double>(pipec::nn::headMajorShape(value.getShape(), sequenceMajor)[value.getRank() - 2])};
}
} // namespace

double pipec::nn::attentionGradFlops(RankedTensorType query, RankedTensorType value, bool sequenceMajor) {
  const auto [rows, keys] = attentionScores(query, value, sequenceMajor);
  return 2 * rows * keys * (3 * query.getShape().back() + 2 * value.getShape().back());
}

double pipec::nn::attentionDropoutFlops(RankedTensorType query, RankedTensorType value, bool sequenceMajor,
                                        float ratio) {
  if (ratio == 0.0f)
    return 0;
  // The mask of each score regenerated (nn.dropout's 4 per element) and applied.
  const auto [rows, keys] = attentionScores(query, value, sequenceMajor);
  return 5 * rows * keys;
}

OpWork AttentionOp::estimateWork() {
  // Two products (scores, then P · value) and the softmax between; the
  // gradient is nn.attention_grad's work and the softmax's again; a dropout
  // of P adds its mask's generation to each.
  OpWork work = elementwise(*this, 0, 0);
  const bool joint = getJointKvHeads() > 0;
  if (joint) {
    // One joint operand, read once; its one gradient costs what separate
    // q, k and v's three did (each reads the result and the operands, and
    // writes its own), so that the form does not move the plan.
    const double jointBytes = bytesOf(getQuery()), maskBytes = operandBytes(*this) - 3 * jointBytes;
    work.forwardBytes -= 2 * jointBytes;
    work.gradientBytes[0] = 3 * (resultBytes(*this) + jointBytes + maskBytes) + jointBytes;
    work.gradientBytes[1] = work.gradientBytes[2] = 0;
  }
  const AttentionOperandShapes shapes = operandShapes();
  auto elementType = getQuery().getType().getElementType();
  auto query = RankedTensorType::get(shapes.query, elementType), value = RankedTensorType::get(shapes.value, elementType);
  const bool sequenceMajor = getSequenceMajor();
  const auto [rows, keys] = attentionScores(query, value, sequenceMajor);
  const double d = query.getShape().back(), dv = value.getShape().back();
  const double dropout = attentionDropoutFlops(query, value, sequenceMajor, getDropoutRatio().convertToFloat());
  work.forwardFlops = 2 * rows * keys * (d + dv) + 13 * rows * keys + dropout;
  const double backward = attentionGradFlops(query, value, sequenceMajor) + 13 * rows * keys + dropout;
  work.gradientFlops.assign(getOperation()->getNumOperands(), 0.0);
  for (int operand = 0; operand < 3; ++operand) // a joint operand's gradient is the query slot's
    work.gradientFlops[operand] = joint ? (operand == 0 ? backward : 0.0) : backward / 3;
  return work;
}
OpWork SoftmaxCrossEntropyLossOp::estimateWork() { return reduction(*this, 14, 4); }
OpWork ReduceMeanOp::estimateWork() { return reduction(*this, 1, 1); }
OpWork GlobalAveragePoolOp::estimateWork() { return reduction(*this, 1, 1); }

OpWork MaxPoolOp::estimateWork() {
  OpWork work = elementwise(*this, windowVolume(getKernelShape()), 1);
  return work;
}

OpWork AveragePoolOp::estimateWork() {
  return elementwise(*this, windowVolume(getKernelShape()), windowVolume(getKernelShape()));
}

OpWork GatherOp::estimateWork() {
  // The gradient of an embedding is a scatter-add of the result gradient.
  OpWork work = movement(*this, /*isView=*/false);
  if (hasGradient(getData()))
    work.gradientFlops[0] = elementsOf(getResult());
  return work;
}

OpWork ReshapeOp::estimateWork() { return movement(*this, true); }
OpWork FlattenOp::estimateWork() { return movement(*this, true); }
OpWork UnsqueezeOp::estimateWork() { return movement(*this, true); }
OpWork SqueezeOp::estimateWork() { return movement(*this, true); }
OpWork ExpandOp::estimateWork() {
  OpWork work = movement(*this, false);
  if (hasGradient(getInput()))
    work.gradientFlops[0] = elementsOf(getResult()); // sum over the expanded axes
  return work;
}
OpWork TransposeOp::estimateWork() { return movement(*this, false); }
OpWork PadOp::estimateWork() { return movement(*this, false); }
OpWork ConcatOp::estimateWork() { return movement(*this, false); }
OpWork SplitOp::estimateWork() { return movement(*this, false); }
OpWork SliceOp::estimateWork() { return movement(*this, false); }
OpWork ConstantOp::estimateWork() {
  OpWork work;
  work.launchesKernel = false;
  return work;
}
