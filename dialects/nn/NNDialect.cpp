// Verifiers and result-type inference of the `nn` ops. Each op's shape rule
// lives here, beside its definition, so the importer never repeats it: the
// importer asks the op to infer its result types.
#include "dialects/nn/NNDialect.h"
#include "dialects/nn/NNGradient.h"
#include "runtime/include/pipec/vocabulary.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/ScopedPrinter.h"

using namespace mlir;
using namespace pipec::nn;
using pipec::windowOutputSize;

#include "dialects/nn/NNOpsDialect.cpp.inc"
#include "dialects/nn/NNInterfaces.cpp.inc"

void NNDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/nn/NNOps.cpp.inc"
      >();
}

Operation *NNDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                          Type type, Location loc) {
  auto elements = llvm::dyn_cast<ElementsAttr>(value);
  if (!elements || elements.getType() != type)
    return nullptr;
  return ConstantOp::create(builder, loc, elements);
}

//===----------------------------------------------------------------------===//
// Shape helpers
//===----------------------------------------------------------------------===//

namespace {
std::string shapeString(ArrayRef<int64_t> shape) {
  std::string text = "[";
  for (auto [index, dim] : llvm::enumerate(shape)) {
    if (index)
      text += ",";
    text += std::to_string(dim);
  }
  return text + "]";
}

RankedTensorType rankedType(Value value) {
  return llvm::cast<RankedTensorType>(value.getType());
}

LogicalResult fail(std::optional<Location> loc, const Twine &message) {
  return emitOptionalError(loc, message);
}

int64_t product(ArrayRef<int64_t> dims) {
  int64_t result = 1;
  for (int64_t dim : dims)
    result *= dim;
  return result;
}

} // namespace

FailureOr<SmallVector<int64_t>>
pipec::nn::inferWindowedShape(std::optional<Location> loc, StringRef opName,
                              ArrayRef<int64_t> inputShape, ArrayRef<int64_t> kernel,
                              ArrayRef<int64_t> strides, ArrayRef<int64_t> pads,
                              ArrayRef<int64_t> dilations, bool ceilMode) {
  size_t spatial = inputShape.size() - 2;
  if (kernel.size() != spatial || strides.size() != spatial ||
      dilations.size() != spatial || pads.size() != 2 * spatial) {
    (void)fail(loc, opName + ": kernel_shape, strides and dilations need " +
                        Twine(spatial) + " entries and pads " +
                        Twine(2 * spatial) + " for input " +
                        shapeString(inputShape));
    return failure();
  }
  SmallVector<int64_t> outputs;
  for (size_t axis = 0; axis < spatial; ++axis) {
    if (kernel[axis] <= 0 || strides[axis] <= 0 || dilations[axis] <= 0 ||
        pads[axis] < 0 || pads[axis + spatial] < 0) {
      (void)fail(loc, opName + ": kernel, strides and dilations must be "
                               "positive and pads non-negative");
      return failure();
    }
    int64_t size = windowOutputSize(inputShape[axis + 2], kernel[axis],
                                    strides[axis], pads[axis],
                                    pads[axis + spatial], dilations[axis],
                                    ceilMode);
    if (size <= 0) {
      (void)fail(loc, opName + ": window larger than the padded input " +
                          shapeString(inputShape));
      return failure();
    }
    outputs.push_back(size);
  }
  return outputs;
}

FailureOr<SmallVector<int64_t>> pipec::nn::broadcastShapes(ArrayRef<int64_t> lhs,
                                                           ArrayRef<int64_t> rhs) {
  size_t rank = std::max(lhs.size(), rhs.size());
  SmallVector<int64_t> result(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t l = i < rank - lhs.size() ? 1 : lhs[i - (rank - lhs.size())];
    int64_t r = i < rank - rhs.size() ? 1 : rhs[i - (rank - rhs.size())];
    if (l != r && l != 1 && r != 1)
      return failure();
    result[i] = l == 1 ? r : l;
  }
  return result;
}

bool pipec::nn::isView(Operation *op) {
  return op && llvm::isa<ReshapeOp, FlattenOp, SqueezeOp, UnsqueezeOp>(op);
}

bool pipec::nn::broadcastsTo(ArrayRef<int64_t> operand, ArrayRef<int64_t> space) {
  if (operand.size() > space.size())
    return false;
  size_t offset = space.size() - operand.size();
  for (size_t axis = 0; axis < operand.size(); ++axis)
    if (operand[axis] != 1 && operand[axis] != space[offset + axis])
      return false;
  return true;
}

bool pipec::nn::sameUpToFloatStorage(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != actual.size())
    return false;
  auto storage = [](Type element) { return element.isF32() || element.isBF16(); };
  for (auto [expected, given] : llvm::zip(inferred, actual)) {
    if (expected == given)
      continue;
    auto a = llvm::dyn_cast<RankedTensorType>(expected), b = llvm::dyn_cast<RankedTensorType>(given);
    if (!a || !b || a.getShape() != b.getShape() || !storage(a.getElementType()) || !storage(b.getElementType()))
      return false;
  }
  return true;
}

std::string pipec::nn::maskedSoftmaxShapeError(ArrayRef<int64_t> input, ArrayRef<int64_t> mask) {
  if (input.empty())
    return "the input must have rank >= 1";
  if (!broadcastsTo(mask, input))
    return "mask of shape " + shapeString(mask) + " does not broadcast to the input's " + shapeString(input);
  return "";
}

std::optional<llvm::StringRef> pipec::nn::nodeName(Location location) {
  std::optional<llvm::StringRef> name;
  location->walk([&](Location part) {
    if (auto named = llvm::dyn_cast<NameLoc>(part)) {
      name = named.getName().getValue();
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return name;
}

std::optional<uint64_t> pipec::nn::dropoutOpId(Operation *dropout) {
  if (auto seed = dropout->getAttrOfType<IntegerAttr>("seed"))
    return seed.getValue().getZExtValue();
  const std::optional<StringRef> name = nodeName(dropout->getLoc());
  if (!name)
    return std::nullopt;
  uint64_t hash = 0xcbf29ce484222325ull; // FNV-1a, 64 bits
  for (unsigned char c : *name) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

FailureOr<int64_t> pipec::nn::normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    return failure();
  return axis < 0 ? axis + rank : axis;
}

//===----------------------------------------------------------------------===//
// Element-wise
//===----------------------------------------------------------------------===//

namespace {
LogicalResult inferBroadcast(std::optional<Location> loc, StringRef opName,
                             Value lhs, Value rhs, Type resultElement,
                             SmallVectorImpl<Type> &types) {
  auto lhsType = rankedType(lhs), rhsType = rankedType(rhs);
  if (lhsType.getElementType() != rhsType.getElementType())
    return fail(loc, opName + ": operand element types differ (" +
                         llvm::to_string(lhsType.getElementType()) + " vs " +
                         llvm::to_string(rhsType.getElementType()) + ")");
  auto shape = broadcastShapes(lhsType.getShape(), rhsType.getShape());
  if (failed(shape))
    return fail(loc, opName + ": shapes " + shapeString(lhsType.getShape()) +
                         " and " + shapeString(rhsType.getShape()) +
                         " are not broadcast-compatible");
  types.push_back(RankedTensorType::get(
      *shape, resultElement ? resultElement : lhsType.getElementType()));
  return success();
}
} // namespace

LogicalResult pipec::nn::inferBinaryElementwise(MLIRContext *context, std::optional<Location> loc,
                                                Binary function, Value lhs, Value rhs,
                                                SmallVectorImpl<Type> &types) {
  const std::string name = std::string("nn.") + binaryName(function);
  if (takesBool(function) && !rankedType(lhs).getElementType().isInteger(1))
    return fail(loc, name + ": operands must be bool (i1), not " +
                         llvm::to_string(rankedType(lhs).getElementType()));
  return inferBroadcast(loc, name, lhs, rhs,
                        givesBool(function) ? IntegerType::get(context, 1) : Type(), types);
}

LogicalResult RotaryOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  auto shape = inputType.getShape();
  if (shape.empty() || shape.back() % 2 != 0)
    return fail(loc, "nn.rotary: the last axis of the input " + shapeString(shape) + " must have an even length");
  for (Value table : {adaptor.getCos(), adaptor.getSin()}) {
    auto tableType = rankedType(table);
    // bf16 storage keeps the tables float32 (pipec-bf16-storage).
    const bool storage = tableType.getElementType().isF32() && inputType.getElementType().isBF16();
    if ((tableType.getElementType() != inputType.getElementType() && !storage) ||
        !broadcastsTo(tableType.getShape(), shape))
      return fail(loc, "nn.rotary: cos/sin of type " + llvm::to_string(tableType) +
                           " does not broadcast to the input " + llvm::to_string(inputType));
  }
  types.push_back(inputType);
  return success();
}

LogicalResult WhereOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  SmallVector<Type> valueType;
  if (failed(inferBroadcast(loc, "nn.where", adaptor.getX(), adaptor.getY(),
                            Type(), valueType)))
    return failure();
  auto valueShape = llvm::cast<RankedTensorType>(valueType[0]).getShape();
  auto shape =
      broadcastShapes(rankedType(adaptor.getCondition()).getShape(), valueShape);
  if (failed(shape))
    return fail(loc, "nn.where: condition shape " +
                         shapeString(rankedType(adaptor.getCondition()).getShape()) +
                         " does not broadcast with " + shapeString(valueShape));
  types.push_back(RankedTensorType::get(
      *shape, rankedType(adaptor.getX()).getElementType()));
  return success();
}

LogicalResult GeluOp::verify() {
  if (getApproximate() != "none" && getApproximate() != "tanh")
    return emitOpError("approximate must be \"none\" or \"tanh\", got \"")
           << getApproximate() << "\"";
  return success();
}

LogicalResult CastOp::verify() {
  if (getInput().getType().getShape() != getResult().getType().getShape())
    return emitOpError("changes the shape from ")
           << shapeString(getInput().getType().getShape()) << " to "
           << shapeString(getResult().getType().getShape());
  return success();
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

GemmDims pipec::nn::gemmDims(RankedTensorType a, RankedTensorType b, bool transA, bool transB) {
  return {a.getDimSize(transA ? 1 : 0), a.getDimSize(transA ? 0 : 1), b.getDimSize(transB ? 1 : 0),
          b.getDimSize(transB ? 0 : 1)};
}

LogicalResult GemmOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &types) {
  auto aType = rankedType(adaptor.getA()), bType = rankedType(adaptor.getB());
  if (aType.getRank() != 2 || bType.getRank() != 2)
    return fail(loc, "nn.gemm: A and B must be 2-D, got " +
                         shapeString(aType.getShape()) + " and " +
                         shapeString(bType.getShape()));
  if (aType.getElementType() != bType.getElementType())
    return fail(loc, "nn.gemm: A and B element types differ");
  bool transA = adaptor.getTransA(), transB = adaptor.getTransB();
  const auto [m, k, kb, n] = gemmDims(aType, bType, transA, transB);
  if (k != kb)
    return fail(loc, "nn.gemm: inner dimensions differ (" + Twine(k) + " vs " +
                         Twine(kb) + ") for A " + shapeString(aType.getShape()) +
                         (transA ? " (transposed)" : "") + " and B " +
                         shapeString(bType.getShape()) +
                         (transB ? " (transposed)" : ""));
  if (Value c = adaptor.getC()) {
    auto cType = rankedType(c);
    SmallVector<int64_t> outShape{m, n};
    auto shape = broadcastShapes(cType.getShape(), outShape);
    if (failed(shape) || ArrayRef<int64_t>(*shape) != ArrayRef<int64_t>(outShape))
      return fail(loc, "nn.gemm: C of shape " + shapeString(cType.getShape()) +
                           " does not broadcast to " + shapeString(outShape));
    // A float32 C (a bias) may go with bfloat16 A and B (pipec-bf16-storage).
    if (cType.getElementType() != aType.getElementType() &&
        !sameUpToFloatStorage(TypeRange{RankedTensorType::get({}, cType.getElementType())},
                              TypeRange{RankedTensorType::get({}, aType.getElementType())}))
      return fail(loc, "nn.gemm: C element type differs from A");
  }
  types.push_back(RankedTensorType::get({m, n}, aType.getElementType()));
  // (Attributes from a dictionary, as the importer builds ops, may lack the
  // defaulted ones.)
  if (BoolAttr keeps = adaptor.getKeepsPreActivationAttr(); keeps && keeps.getValue()) {
    if (!adaptor.getActivation())
      return fail(loc, "nn.gemm: keeps_pre_activation without an activation");
    types.push_back(types.back());
  }
  return success();
}

LogicalResult GemmActivationGradOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
                                                     SmallVectorImpl<Type> &types) {
  auto aType = rankedType(adaptor.getA()), bType = rankedType(adaptor.getB()), xType = rankedType(adaptor.getX());
  if (aType.getRank() != 2 || bType.getRank() != 2 || aType.getElementType() != bType.getElementType())
    return fail(loc, "nn.gemm_activation_grad: A and B must be 2-D of one element type, got " +
                         shapeString(aType.getShape()) + " and " + shapeString(bType.getShape()));
  const bool transA = adaptor.getTransA(), transB = adaptor.getTransB();
  const auto [m, k, kb, n] = gemmDims(aType, bType, transA, transB);
  if (k != kb || xType.getShape() != ArrayRef<int64_t>{m, n} || xType.getElementType() != aType.getElementType())
    return fail(loc, "nn.gemm_activation_grad: the product of A " + shapeString(aType.getShape()) +
                         (transA ? " (transposed)" : "") + " and B " + shapeString(bType.getShape()) +
                         (transB ? " (transposed)" : "") + " does not have x's shape " +
                         shapeString(xType.getShape()) + " and type");
  if (!derivativeReadsInput(adaptor.getFunction()))
    return fail(loc, Twine("nn.gemm_activation_grad: the derivative of '") + unaryName(adaptor.getFunction()) +
                         "' reads its result, not x");
  types.push_back(xType);
  return success();
}

/// numpy.matmul's result type for operands of types `aType` and `bType`
/// (nn.matmul; nn.batched_gemm on op(A) and op(B)); errors name `op`.
static LogicalResult inferMatmulType(std::optional<Location> loc, StringRef op, RankedTensorType aType,
                                     RankedTensorType bType, SmallVectorImpl<Type> &types) {
  if (aType.getRank() == 0 || bType.getRank() == 0)
    return fail(loc, op + ": operands must have rank >= 1");
  if (aType.getElementType() != bType.getElementType())
    return fail(loc, op + ": operand element types differ");
  // Numpy: a 1-D operand is promoted to a matrix and the added axis removed.
  SmallVector<int64_t> a(aType.getShape()), b(bType.getShape());
  bool vectorA = a.size() == 1, vectorB = b.size() == 1;
  if (vectorA)
    a.insert(a.begin(), 1);
  if (vectorB)
    b.push_back(1);
  if (a.back() != b[b.size() - 2])
    return fail(loc, op + ": inner dimensions differ for " + shapeString(aType.getShape()) + " x " +
                         shapeString(bType.getShape()));
  auto batch = broadcastShapes(ArrayRef<int64_t>(a).drop_back(2),
                               ArrayRef<int64_t>(b).drop_back(2));
  if (failed(batch))
    return fail(loc, op + ": batch dimensions of " + shapeString(aType.getShape()) + " and " +
                         shapeString(bType.getShape()) + " do not broadcast");
  SmallVector<int64_t> shape(*batch);
  if (!vectorA)
    shape.push_back(a[a.size() - 2]);
  if (!vectorB)
    shape.push_back(b.back());
  types.push_back(RankedTensorType::get(shape, aType.getElementType()));
  return success();
}

LogicalResult MatMulOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  return inferMatmulType(loc, "nn.matmul", rankedType(adaptor.getA()), rankedType(adaptor.getB()), types);
}

LogicalResult BatchedGemmOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &types) {
  auto a = rankedType(adaptor.getA()), b = rankedType(adaptor.getB());
  // op(X): X with its last two axes swapped when transposed.
  auto operand = [](RankedTensorType type, bool trans) {
    if (!trans)
      return type;
    SmallVector<int64_t> shape(type.getShape());
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    return RankedTensorType::get(shape, type.getElementType());
  };
  if ((adaptor.getTransA() && a.getRank() < 2) || (adaptor.getTransB() && b.getRank() < 2))
    return fail(loc, "nn.batched_gemm: a transposed operand needs rank >= 2, got " +
                         shapeString(a.getShape()) + " and " + shapeString(b.getShape()));
  return inferMatmulType(loc, "nn.batched_gemm", operand(a, adaptor.getTransA()),
                         operand(b, adaptor.getTransB()), types);
}

//===----------------------------------------------------------------------===//
// Convolution, normalization, pooling
//===----------------------------------------------------------------------===//

/// An epilogue (pipec-fuse-norm-epilogue's): a residual of the result's type, an activation the kernels apply.
static LogicalResult checkEpilogue(std::optional<Location> loc, StringRef op, Value residual,
                                   std::optional<::pipec::Unary> activation, RankedTensorType result) {
  if (residual && rankedType(residual) != result)
    return fail(loc, op + ": the residual " + shapeString(rankedType(residual).getShape()) +
                         " does not have the result's shape and element type " + shapeString(result.getShape()));
  if (activation && !::pipec::epilogueActivationApplies(*activation))
    return fail(loc, op + ": the only activations its epilogue applies are relu and relu6");
  return success();
}

LogicalResult ConvOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                       Adaptor adaptor,
                                       SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  auto weightType = rankedType(adaptor.getWeight());
  if (inputType.getRank() < 3 || weightType.getRank() != inputType.getRank())
    return fail(loc, "nn.conv: input (N,C,spatial...) and weight (M,C/group,kernel...) "
                     "need the same rank >= 3, got " +
                         shapeString(inputType.getShape()) + " and " +
                         shapeString(weightType.getShape()));
  const bool channelsLast = isSet(adaptor.getChannelsLastAttr());
  const SmallVector<int64_t> input = channelsFirstShape(inputType.getShape(), channelsLast),
                             weight = channelsFirstShape(weightType.getShape(), channelsLast);
  int64_t group = adaptor.getGroup();
  int64_t channels = input[1], filters = weight[0];
  if (group <= 0 || channels % group || filters % group || weight[1] * group != channels)
    return fail(loc, "nn.conv: " + Twine(channels) + " input channels, group " +
                         Twine(group) + " and weight " +
                         shapeString(weightType.getShape()) + " do not match");
  if (Value bias = adaptor.getBias()) {
    auto biasType = rankedType(bias);
    if (biasType.getRank() != 1 || biasType.getDimSize(0) != filters)
      return fail(loc, "nn.conv: bias must have shape [" + Twine(filters) +
                           "], got " + shapeString(biasType.getShape()));
  }
  auto spatial = inferWindowedShape(loc, "nn.conv", input, ArrayRef<int64_t>(weight).drop_front(2),
                                    adaptor.getStrides(), adaptor.getPads(), adaptor.getDilations(), false);
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape{input[0], filters};
  shape.append(spatial->begin(), spatial->end());
  auto resultType = RankedTensorType::get(storedShape(shape, channelsLast), inputType.getElementType());
  if (failed(checkEpilogue(loc, "nn.conv", adaptor.getResidual(), adaptor.getActivation(), resultType)))
    return failure();
  types.push_back(resultType);
  return success();
}

LogicalResult BatchNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (inputType.getRank() < 2)
    return fail(loc, "nn.batch_norm: input must be (N,C,...), got " +
                         shapeString(inputType.getShape()));
  int64_t channels = inputType.getDimSize(channelAxis(inputType.getRank(), isSet(adaptor.getChannelsLastAttr())));
  for (Value stat : {adaptor.getScale(), adaptor.getBias(),
                     adaptor.getRunningMean(), adaptor.getRunningVar()}) {
    auto type = rankedType(stat);
    if (type.getRank() != 1 || type.getDimSize(0) != channels)
      return fail(loc, "nn.batch_norm: scale, bias, mean and variance must have "
                       "shape [" + Twine(channels) + "], got " +
                           shapeString(type.getShape()));
  }
  if (failed(checkEpilogue(loc, "nn.batch_norm", adaptor.getResidual(), adaptor.getActivation(), inputType)))
    return failure();
  types.push_back(inputType);
  types.push_back(adaptor.getRunningMean().getType());
  types.push_back(adaptor.getRunningVar().getType());
  return success();
}

LogicalResult LayerNormOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  auto axis = normalizeAxis(adaptor.getAxis(), inputType.getRank());
  if (failed(axis))
    return fail(loc, "nn.layer_norm: axis " + Twine(static_cast<int64_t>(adaptor.getAxis())) +
                         " out of range for rank " + Twine(inputType.getRank()));
  auto normalized = inputType.getShape().drop_front(*axis);
  for (Value param : {adaptor.getScale(), adaptor.getBias()}) {
    if (!param)
      continue;
    if (!broadcastsTo(rankedType(param).getShape(), normalized))
      return fail(loc, "nn.layer_norm: scale/bias of shape " +
                           shapeString(rankedType(param).getShape()) +
                           " does not broadcast to " + shapeString(normalized));
  }
  types.push_back(inputType);
  SmallVector<int64_t> statsShape(inputType.getShape());
  for (int64_t dim = *axis; dim < inputType.getRank(); ++dim)
    statsShape[dim] = 1;
  auto statsType = RankedTensorType::get(statsShape, inputType.getElementType());
  types.push_back(statsType);
  types.push_back(statsType);
  return success();
}

LogicalResult MaxPoolOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (inputType.getRank() < 3)
    return fail(loc, "nn.max_pool: input must be (N,C,spatial...), got " +
                         shapeString(inputType.getShape()));
  const SmallVector<int64_t> input = channelsFirstShape(inputType.getShape(), isSet(adaptor.getChannelsLastAttr()));
  auto spatial = inferWindowedShape(loc, "nn.max_pool", input,
                                    adaptor.getKernelShape(), adaptor.getStrides(),
                                    adaptor.getPads(), adaptor.getDilations(),
                                    adaptor.getCeilMode());
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape(ArrayRef<int64_t>(input).take_front(2));
  shape.append(spatial->begin(), spatial->end());
  types.push_back(RankedTensorType::get(storedShape(shape, isSet(adaptor.getChannelsLastAttr())), inputType.getElementType()));
  return success();
}

LogicalResult AveragePoolOp::inferReturnTypes(MLIRContext *,
                                              std::optional<Location> loc,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (inputType.getRank() < 3)
    return fail(loc, "nn.average_pool: input must be (N,C,spatial...), got " +
                         shapeString(inputType.getShape()));
  SmallVector<int64_t> dilations(inputType.getRank() - 2, 1);
  const SmallVector<int64_t> input = channelsFirstShape(inputType.getShape(), isSet(adaptor.getChannelsLastAttr()));
  auto spatial = inferWindowedShape(loc, "nn.average_pool", input,
                                    adaptor.getKernelShape(), adaptor.getStrides(),
                                    adaptor.getPads(), dilations,
                                    adaptor.getCeilMode());
  if (failed(spatial))
    return failure();
  SmallVector<int64_t> shape(ArrayRef<int64_t>(input).take_front(2));
  shape.append(spatial->begin(), spatial->end());
  types.push_back(RankedTensorType::get(storedShape(shape, isSet(adaptor.getChannelsLastAttr())), inputType.getElementType()));
  return success();
}

LogicalResult GlobalAveragePoolOp::inferReturnTypes(MLIRContext *,
                                                    std::optional<Location> loc,
                                                    Adaptor adaptor,
                                                    SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (inputType.getRank() < 3)
    return fail(loc, "nn.global_average_pool: input must be (N,C,spatial...), got " +
                         shapeString(inputType.getShape()));
  SmallVector<int64_t> shape(inputType.getRank(), 1);
  shape[0] = inputType.getDimSize(0);
  const int64_t channel = channelAxis(inputType.getRank(), isSet(adaptor.getChannelsLastAttr()));
  shape[channel] = inputType.getDimSize(channel);
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult DropoutOp::inferReturnTypes(MLIRContext *context,
                                          std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  float ratio = adaptor.getRatio().convertToFloat();
  if (!(ratio >= 0.0f && ratio < 1.0f))
    return fail(loc, "nn.dropout: ratio must be in [0, 1), got " + Twine(std::to_string(ratio)));
  auto inputType = rankedType(adaptor.getInput());
  types.push_back(inputType);
  types.push_back(RankedTensorType::get(inputType.getShape(),
                                        IntegerType::get(context, 1)));
  return success();
}

LogicalResult SoftmaxOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  if (failed(normalizeAxis(adaptor.getAxis(), inputType.getRank())))
    return fail(loc, "nn.softmax: axis " + Twine(static_cast<int64_t>(adaptor.getAxis())) +
                         " out of range for rank " + Twine(inputType.getRank()));
  types.push_back(inputType);
  return success();
}

LogicalResult MaskedSoftmaxOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                                Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  std::string error = maskedSoftmaxShapeError(inputType.getShape(), rankedType(adaptor.getMask()).getShape());
  if (!error.empty())
    return fail(loc, "nn.masked_softmax: " + Twine(error));
  types.push_back(inputType);
  return success();
}

std::string pipec::nn::attentionShapeError(ArrayRef<int64_t> queryShape, ArrayRef<int64_t> keyShape,
                                           ArrayRef<int64_t> valueShape, std::optional<ArrayRef<int64_t>> mask,
                                           bool sequenceMajor) {
  const size_t rank = queryShape.size(), minimumRank = sequenceMajor ? 3 : 2;
  if (rank < minimumRank || keyShape.size() != rank || valueShape.size() != rank)
    return "query, key and value must have one rank >= " + std::to_string(minimumRank) + ", got " +
           shapeString(queryShape) + ", " + shapeString(keyShape) + ", " + shapeString(valueShape);
  const SmallVector<int64_t> query = headMajorShape(queryShape, sequenceMajor),
                             key = headMajorShape(keyShape, sequenceMajor),
                             value = headMajorShape(valueShape, sequenceMajor);
  // Grouped-query heads: key and value may have a divisor of the query's
  // heads (axis -3 head-major, from rank 3); query head h reads head h / g.
  SmallVector<int64_t> queryLead(ArrayRef<int64_t>(query).drop_back(2));
  if (rank >= 3 && key[rank - 3] != query[rank - 3] && key[rank - 3] > 0 && query[rank - 3] > 0 &&
      query[rank - 3] % key[rank - 3] == 0)
    queryLead[rank - 3] = key[rank - 3];
  if (ArrayRef<int64_t>(queryLead) != ArrayRef<int64_t>(key).drop_back(2) ||
      ArrayRef<int64_t>(key).drop_back(1) != ArrayRef<int64_t>(value).drop_back(1) || query.back() != key.back())
    return std::string(sequenceMajor ? "query [L..., S, H, D], key [L..., T, H, D] and value [L..., T, H, Dv]"
                                     : "query [L..., S, D], key [L..., T, D] and value [L..., T, Dv]") +
           " (key and value may have a divisor of the query's heads H) do not agree: " + shapeString(queryShape) +
           ", " + shapeString(keyShape) + ", " + shapeString(valueShape);
  if (mask) {
    SmallVector<int64_t> scores(ArrayRef<int64_t>(query).drop_back());
    scores.push_back(key[rank - 2]);
    std::string error = maskedSoftmaxShapeError(scores, *mask);
    if (!error.empty())
      return error;
  }
  return "";
}

/// The windows of a joint [L'..., S, H + 2·Hkv, D] operand with Hkv =
/// `kvHeads`; or why it has none, in `error`.
static AttentionOperandShapes jointAttentionWindows(ArrayRef<int64_t> joint, int64_t kvHeads, std::string &error) {
  const int64_t rank = joint.size(), heads = rank >= 3 ? joint[rank - 2] - 2 * kvHeads : 0;
  if (rank < 3 || kvHeads <= 0 || heads <= 0 || heads % kvHeads != 0) {
    error = "a joint query, key and value " + shapeString(joint) + " must be [L'..., S, H + 2·Hkv, D] with Hkv = " +
            std::to_string(kvHeads) + " dividing H > 0";
    return {};
  }
  AttentionOperandShapes windows{SmallVector<int64_t>(joint), SmallVector<int64_t>(joint), SmallVector<int64_t>(joint)};
  windows.query[rank - 2] = heads;
  windows.key[rank - 2] = windows.value[rank - 2] = kvHeads;
  return windows;
}

std::string pipec::nn::attentionOperandsError(Value query, Value key, Value value, std::optional<Value> mask,
                                              bool sequenceMajor, int64_t jointKvHeads,
                                              AttentionOperandShapes &shapes) {
  auto shape = [](Value v) { return SmallVector<int64_t>(rankedType(v).getShape()); };
  std::string error;
  if (jointKvHeads == 0)
    shapes = {shape(query), shape(key), shape(value)};
  else if (!sequenceMajor || query != key || key != value)
    return "joint_kv_heads needs sequence_major and one value as query, key and value";
  else if (shapes = jointAttentionWindows(shape(query), jointKvHeads, error); !error.empty())
    return error;
  std::optional<ArrayRef<int64_t>> maskShape;
  if (mask && *mask)
    maskShape = rankedType(*mask).getShape();
  return attentionShapeError(shapes.query, shapes.key, shapes.value, maskShape, sequenceMajor);
}

AttentionOperandShapes AttentionOp::operandShapes() {
  AttentionOperandShapes shapes;
  (void)attentionOperandsError(getQuery(), getKey(), getValue(), {}, getSequenceMajor(), getJointKvHeads(), shapes);
  return shapes;
}

LogicalResult AttentionOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto query = rankedType(adaptor.getQuery());
  if (adaptor.getMask()) {
    Type element = rankedType(adaptor.getMask()).getElementType();
    // bf16 storage keeps an additive mask float32 (pipec-bf16-storage).
    const bool storage = element.isF32() && query.getElementType().isBF16();
    if (!element.isInteger(1) && element != query.getElementType() && !storage)
      return fail(loc, "nn.attention: an additive mask must have the query's element type (or be float32 with bf16 "
                       "storage)");
  }
  // Attributes are absent from a dictionary without them.
  BoolAttr sequenceMajorAttr = adaptor.getSequenceMajorAttr();
  const bool sequenceMajor = sequenceMajorAttr && sequenceMajorAttr.getValue();
  IntegerAttr jointAttr = adaptor.getJointKvHeadsAttr();
  AttentionOperandShapes shapes;
  std::string error = attentionOperandsError(adaptor.getQuery(), adaptor.getKey(), adaptor.getValue(),
                                             adaptor.getMask(), sequenceMajor, jointAttr ? jointAttr.getInt() : 0,
                                             shapes);
  if (!error.empty())
    return fail(loc, "nn.attention: " + Twine(error));
  if (const double ratio = adaptor.getDropoutRatio().convertToDouble(); !(ratio >= 0.0 && ratio < 1.0))
    return fail(loc, "nn.attention: dropout_ratio must be in [0, 1), got " + Twine(std::to_string(ratio)));
  SmallVector<int64_t> shape(ArrayRef<int64_t>(shapes.query).drop_back());
  shape.push_back(shapes.value.back());
  types.push_back(RankedTensorType::get(shape, query.getElementType()));
  // log_sum_exp: one per score row, in the head-major order either way.
  shape = headMajorShape(shapes.query, sequenceMajor);
  shape.back() = 1;
  types.push_back(RankedTensorType::get(shape, query.getElementType()));
  return success();
}

LogicalResult SoftmaxCrossEntropyLossOp::inferReturnTypes(
    MLIRContext *, std::optional<Location> loc, Adaptor adaptor,
    SmallVectorImpl<Type> &types) {
  auto scoresType = rankedType(adaptor.getScores());
  auto labelsType = rankedType(adaptor.getLabels());
  if (scoresType.getRank() < 2)
    return fail(loc, "nn.softmax_cross_entropy_loss: scores must be (N,C,...), got " +
                         shapeString(scoresType.getShape()));
  SmallVector<int64_t> expectedLabels{scoresType.getDimSize(0)};
  expectedLabels.append(scoresType.getShape().begin() + 2, scoresType.getShape().end());
  if (labelsType.getShape() != ArrayRef<int64_t>(expectedLabels))
    return fail(loc, "nn.softmax_cross_entropy_loss: labels must have shape " +
                         shapeString(expectedLabels) + ", got " +
                         shapeString(labelsType.getShape()));
  if (Value weights = adaptor.getWeights()) {
    auto weightsType = rankedType(weights);
    if (weightsType.getRank() != 1 || weightsType.getDimSize(0) != scoresType.getDimSize(1))
      return fail(loc, "nn.softmax_cross_entropy_loss: weights must have shape [" +
                           Twine(scoresType.getDimSize(1)) + "]");
  }
  if (std::optional<int64_t> classes = adaptor.getClasses())
    if (*classes < 1 || *classes > scoresType.getDimSize(1))
      return fail(loc, "nn.softmax_cross_entropy_loss: classes must be in [1, " +
                           Twine(scoresType.getDimSize(1)) + "], got " + Twine(*classes));
  StringRef reduction = adaptor.getReduction();
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return fail(loc, "nn.softmax_cross_entropy_loss: reduction must be mean, sum "
                     "or none, got " + reduction);
  Type element = scoresType.getElementType();
  types.push_back(reduction == "none" ? RankedTensorType::get(expectedLabels, element)
                                      : RankedTensorType::get({}, element));
  types.push_back(scoresType);
  return success();
}

LogicalResult ReduceMeanOp::inferReturnTypes(MLIRContext *,
                                             std::optional<Location> loc,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> axes = adaptor.getAxes();
  for (auto [index, axis] : llvm::enumerate(axes))
    if (axis < 0 || axis >= inputType.getRank() || (index && axes[index - 1] >= axis))
      return fail(loc, "nn.reduce_mean: axes must be sorted, unique and in [0, " +
                           Twine(inputType.getRank()) + ")");
  SmallVector<int64_t> shape;
  for (int64_t dim = 0; dim < inputType.getRank(); ++dim) {
    bool reduced = axes.empty() || llvm::is_contained(axes, dim);
    if (!reduced)
      shape.push_back(inputType.getDimSize(dim));
    else if (adaptor.getKeepdims())
      shape.push_back(1);
  }
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult GatherOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  auto dataType = rankedType(adaptor.getData());
  auto axis = normalizeAxis(adaptor.getAxis(), dataType.getRank());
  if (failed(axis))
    return fail(loc, "nn.gather: axis " + Twine(static_cast<int64_t>(adaptor.getAxis())) +
                         " out of range for rank " + Twine(dataType.getRank()));
  SmallVector<int64_t> shape(dataType.getShape().take_front(*axis));
  auto indices = rankedType(adaptor.getIndices()).getShape();
  shape.append(indices.begin(), indices.end());
  auto rest = dataType.getShape().drop_front(*axis + 1);
  shape.append(rest.begin(), rest.end());
  types.push_back(RankedTensorType::get(shape, dataType.getElementType()));
  return success();
}

LogicalResult ReshapeOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  if (in.getElementType() != out.getElementType())
    return emitOpError("changes the element type");
  if (in.getNumElements() != out.getNumElements())
    return emitOpError("cannot reshape ")
           << shapeString(in.getShape()) << " (" << in.getNumElements()
           << " elements) into " << shapeString(out.getShape()) << " ("
           << out.getNumElements() << " elements)";
  return success();
}

LogicalResult FlattenOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  int64_t rank = inputType.getRank();
  int64_t axis = adaptor.getAxis();
  if (axis < -rank || axis > rank)
    return fail(loc, "nn.flatten: axis " + Twine(axis) + " out of range for rank " +
                         Twine(rank));
  if (axis < 0)
    axis += rank;
  int64_t outer = product(inputType.getShape().take_front(axis));
  int64_t inner = product(inputType.getShape().drop_front(axis));
  types.push_back(RankedTensorType::get({outer, inner}, inputType.getElementType()));
  return success();
}

LogicalResult UnsqueezeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> axes = adaptor.getAxes();
  int64_t outRank = inputType.getRank() + axes.size();
  SmallVector<bool> inserted(outRank, false);
  for (int64_t axis : axes) {
    if (axis < 0 || axis >= outRank || inserted[axis])
      return fail(loc, "nn.unsqueeze: axes must be unique and in [0, " +
                           Twine(outRank) + ")");
    inserted[axis] = true;
  }
  SmallVector<int64_t> shape;
  auto next = inputType.getShape().begin();
  for (int64_t dim = 0; dim < outRank; ++dim)
    shape.push_back(inserted[dim] ? 1 : *next++);
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult SqueezeOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                          Adaptor adaptor,
                                          SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> axes = adaptor.getAxes();
  for (int64_t axis : axes)
    if (axis < 0 || axis >= inputType.getRank() || inputType.getDimSize(axis) != 1)
      return fail(loc, "nn.squeeze: axis " + Twine(axis) + " of " +
                           shapeString(inputType.getShape()) +
                           " is not a size-1 axis");
  SmallVector<int64_t> shape;
  for (int64_t dim = 0; dim < inputType.getRank(); ++dim)
    if (!llvm::is_contained(axes, dim))
      shape.push_back(inputType.getDimSize(dim));
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult ExpandOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  if (in.getElementType() != out.getElementType())
    return emitOpError("changes the element type");
  auto shape = broadcastShapes(in.getShape(), out.getShape());
  if (failed(shape) || ArrayRef<int64_t>(*shape) != out.getShape())
    return emitOpError("cannot expand ")
           << shapeString(in.getShape()) << " to " << shapeString(out.getShape());
  return success();
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> perm = adaptor.getPerm();
  SmallVector<bool> seen(inputType.getRank(), false);
  if (static_cast<int64_t>(perm.size()) != inputType.getRank())
    return fail(loc, "nn.transpose: perm has " + Twine(perm.size()) +
                         " entries for rank " + Twine(inputType.getRank()));
  SmallVector<int64_t> shape;
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= inputType.getRank() || seen[axis])
      return fail(loc, "nn.transpose: perm is not a permutation");
    seen[axis] = true;
    shape.push_back(inputType.getDimSize(axis));
  }
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult PadOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                      Adaptor adaptor, SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> pads = adaptor.getPads();
  int64_t rank = inputType.getRank();
  if (static_cast<int64_t>(pads.size()) != 2 * rank)
    return fail(loc, "nn.pad: pads needs " + Twine(2 * rank) + " entries for rank " +
                         Twine(rank));
  SmallVector<int64_t> shape(inputType.getShape());
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (pads[axis] < 0 || pads[axis + rank] < 0)
      return fail(loc, "nn.pad: pads must be non-negative");
    shape[axis] += pads[axis] + pads[axis + rank];
  }
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &types) {
  ValueRange inputs = adaptor.getInputs();
  if (inputs.empty())
    return fail(loc, "nn.concat: needs at least one input");
  auto firstType = rankedType(inputs.front());
  auto axis = normalizeAxis(adaptor.getAxis(), firstType.getRank());
  if (failed(axis))
    return fail(loc, "nn.concat: axis " + Twine(static_cast<int64_t>(adaptor.getAxis())) +
                         " out of range for rank " + Twine(firstType.getRank()));
  SmallVector<int64_t> shape(firstType.getShape());
  shape[*axis] = 0;
  for (Value input : inputs) {
    auto type = rankedType(input);
    if (type.getElementType() != firstType.getElementType() ||
        type.getRank() != firstType.getRank())
      return fail(loc, "nn.concat: inputs differ in element type or rank");
    for (int64_t dim = 0; dim < type.getRank(); ++dim)
      if (dim != *axis && type.getDimSize(dim) != firstType.getDimSize(dim))
        return fail(loc, "nn.concat: input shapes " + shapeString(firstType.getShape()) +
                             " and " + shapeString(type.getShape()) +
                             " differ outside axis " + Twine(*axis));
    shape[*axis] += type.getDimSize(*axis);
  }
  types.push_back(RankedTensorType::get(shape, firstType.getElementType()));
  return success();
}

LogicalResult SplitOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  auto axis = normalizeAxis(adaptor.getAxis(), inputType.getRank());
  if (failed(axis))
    return fail(loc, "nn.split: axis out of range");
  ArrayRef<int64_t> sizes = adaptor.getSizes();
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      return fail(loc, "nn.split: negative piece size");
    total += size;
  }
  if (total != inputType.getDimSize(*axis))
    return fail(loc, "nn.split: piece sizes sum to " + Twine(total) +
                         " but axis " + Twine(*axis) + " has size " +
                         Twine(inputType.getDimSize(*axis)));
  for (int64_t size : sizes) {
    SmallVector<int64_t> shape(inputType.getShape());
    shape[*axis] = size;
    types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  }
  return success();
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &types) {
  auto inputType = rankedType(adaptor.getInput());
  ArrayRef<int64_t> starts = adaptor.getStarts(), ends = adaptor.getEnds(),
                    steps = adaptor.getSteps();
  int64_t rank = inputType.getRank();
  if (static_cast<int64_t>(starts.size()) != rank ||
      static_cast<int64_t>(ends.size()) != rank ||
      static_cast<int64_t>(steps.size()) != rank)
    return fail(loc, "nn.slice: starts, ends and steps need one entry per axis (" +
                         Twine(rank) + ")");
  SmallVector<int64_t> shape;
  for (int64_t axis = 0; axis < rank; ++axis) {
    int64_t dim = inputType.getDimSize(axis);
    int64_t start = starts[axis], end = ends[axis], step = steps[axis];
    if (step == 0)
      return fail(loc, "nn.slice: step 0 on axis " + Twine(axis));
    bool valid = step > 0 ? (start >= 0 && start <= dim && end >= 0 && end <= dim)
                          : (start >= -1 && start < dim && end >= -1 && end < dim);
    if (!valid)
      return fail(loc, "nn.slice: bounds of axis " + Twine(axis) +
                           " are not normalized for size " + Twine(dim));
    int64_t size = step > 0 ? (end - start + step - 1) / step
                            : (start - end + (-step) - 1) / (-step);
    shape.push_back(std::max<int64_t>(size, 0));
  }
  types.push_back(RankedTensorType::get(shape, inputType.getElementType()));
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

LogicalResult ConstantOp::inferReturnTypes(MLIRContext *, std::optional<Location>,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &types) {
  types.push_back(adaptor.getValue().getType());
  return success();
}

#define GET_OP_CLASSES
#include "dialects/nn/NNOps.cpp.inc"
