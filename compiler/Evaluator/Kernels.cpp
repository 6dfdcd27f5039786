// The reference kernels. Clarity over speed: each is the textbook loop nest
// over multi-indices, so that a reader can check it against the ONNX
// specification line by line. Values are computed in double (int64 for
// integers) and rounded to the element type once, at the end of each kernel.
#include "compiler/Evaluator/Kernels.h"

#include "llvm/ADT/APFloat.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pipec::eval {

using import::isFloating;
using kernels::BinaryOp;
using kernels::windowOutputSize;

namespace {

int64_t product(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

/// Row-major strides of a shape.
std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t axis = static_cast<int64_t>(shape.size()) - 2; axis >= 0; --axis)
    strides[axis] = strides[axis + 1] * shape[axis + 1];
  return strides;
}

/// Advances a row-major multi-index; false after the last one.
bool nextIndex(std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  for (int64_t axis = static_cast<int64_t>(shape.size()) - 1; axis >= 0; --axis) {
    if (++index[axis] < shape[axis])
      return true;
    index[axis] = 0;
  }
  return false;
}

/// Calls visit(multiIndex) for every index of `shape` in row-major order.
template <typename Visit> void forEachIndex(const std::vector<int64_t> &shape, Visit visit) {
  if (product(shape) == 0)
    return;
  std::vector<int64_t> index(shape.size(), 0);
  do
    visit(index);
  while (nextIndex(index, shape));
}

/// The flat offset into a tensor of shape `from` (right-aligned against the
/// output index, numpy style) of output multi-index `index`: broadcast axes
/// of size 1 always read position 0.
int64_t broadcastOffset(const std::vector<int64_t> &index, const std::vector<int64_t> &from) {
  size_t lead = index.size() - from.size();
  int64_t offset = 0;
  for (size_t axis = 0; axis < from.size(); ++axis)
    offset = offset * from[axis] + (from[axis] == 1 ? 0 : index[lead + axis]);
  return offset;
}

/// The importer's numpy broadcast, reporting failures as evaluator errors.
std::vector<int64_t> broadcastTwo(const std::vector<int64_t> &lhs,
                                  const std::vector<int64_t> &rhs) {
  try {
    return import::broadcastShape(lhs, rhs);
  } catch (const import::FoldError &) {
    throw EvalError("shapes " + shapeToString(lhs) + " and " + shapeToString(rhs) +
                    " do not broadcast");
  }
}

double get(const Tensor &tensor, int64_t index) { return tensor.asDouble(index); }

/// Copies one element between tensors of the same kind (data movement ops).
void copyElement(Tensor &to, int64_t toIndex, const Tensor &from, int64_t fromIndex) {
  if (isFloating(from.kind))
    to.floats[toIndex] = from.floats[fromIndex];
  else
    to.ints[toIndex] = from.ints[fromIndex];
}

Tensor finish(Tensor tensor) {
  roundToElementType(tensor);
  return tensor;
}

void requireFloating(const Tensor &tensor, const char *what) {
  if (!isFloating(tensor.kind))
    throw EvalError(std::string(what) + " must be floating point, got " +
                    import::elementKindName(tensor.kind));
}

void requireRank(const Tensor &tensor, size_t atLeast, const char *what) {
  if (tensor.shape.size() < atLeast)
    throw EvalError(std::string(what) + " needs rank >= " + std::to_string(atLeast) + ", got " +
                    shapeToString(tensor.shape));
}

int64_t normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    throw EvalError("axis " + std::to_string(axis) + " out of range for rank " +
                    std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

double roundTo(double value, const llvm::fltSemantics &semantics) {
  llvm::APFloat converted(value);
  bool losesInfo = false;
  converted.convert(semantics, llvm::APFloat::rmNearestTiesToEven, &losesInfo);
  return converted.convertToDouble();
}

int64_t wrapInteger(int64_t value, ElementKind kind) {
  switch (kind) {
  case ElementKind::Int32: return static_cast<int32_t>(static_cast<uint32_t>(value));
  case ElementKind::Int8: return static_cast<int8_t>(static_cast<uint8_t>(value));
  case ElementKind::UInt8: return static_cast<uint8_t>(value);
  case ElementKind::Bool: return value != 0;
  default: return value;
  }
}

/// Integer arithmetic in uint64 so that overflow wraps instead of being
/// undefined; the result is then wrapped to the element's width.
int64_t integerBinary(BinaryOp op, int64_t a, int64_t b) {
  auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
  case BinaryOp::Add: return static_cast<int64_t>(ua + ub);
  case BinaryOp::Sub: return static_cast<int64_t>(ua - ub);
  case BinaryOp::Mul: return static_cast<int64_t>(ua * ub);
  case BinaryOp::Div:
    if (b == 0)
      throw EvalError("integer division by zero");
    if (a == std::numeric_limits<int64_t>::min() && b == -1)
      return a;
    return a / b;
  case BinaryOp::Pow: {
    if (b < 0)
      throw EvalError("integer power with a negative exponent");
    // By repeated squaring: at most 63 steps whatever the exponent.
    uint64_t result = 1, base = ua;
    for (uint64_t e = ub; e; e >>= 1) {
      if (e & 1)
        result *= base;
      base *= base;
    }
    return static_cast<int64_t>(result);
  }
  case BinaryOp::Equal: return a == b;
  }
  return 0;
}

double floatBinary(BinaryOp op, double a, double b) {
  switch (op) {
  case BinaryOp::Add: return a + b;
  case BinaryOp::Sub: return a - b;
  case BinaryOp::Mul: return a * b;
  case BinaryOp::Div: return a / b;
  case BinaryOp::Pow: return std::pow(a, b);
  case BinaryOp::Equal: return a == b;
  }
  return 0;
}

double geluExact(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double geluTanh(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

/// Shared by the pools: iterates output positions and, per position, the
/// window's input positions (already offset by the begin pads).
struct Window {
  std::vector<int64_t> kernel, strides, pads, dilations;
  std::vector<int64_t> inputSpatial, outputSpatial;
  size_t spatial() const { return kernel.size(); }
};

/// The window over an input of shape `inputShape` (N, C, spatial...).
Window makeWindow(const std::vector<int64_t> &inputShape, std::vector<int64_t> kernel,
                  std::vector<int64_t> strides, std::vector<int64_t> pads,
                  std::vector<int64_t> dilations, bool ceilMode) {
  if (inputShape.size() < 3)
    throw EvalError("the input (N, C, spatial...) needs rank >= 3, got " +
                    shapeToString(inputShape));
  Window window{std::move(kernel), std::move(strides), std::move(pads), std::move(dilations),
                {}, {}};
  size_t spatial = inputShape.size() - 2;
  if (window.kernel.size() != spatial || window.strides.size() != spatial ||
      window.dilations.size() != spatial || window.pads.size() != 2 * spatial)
    throw EvalError("window attributes do not match " + std::to_string(spatial) +
                    " spatial axes");
  for (size_t axis = 0; axis < spatial; ++axis) {
    int64_t size = inputShape[axis + 2];
    window.inputSpatial.push_back(size);
    int64_t out = windowOutputSize(size, window.kernel[axis], window.strides[axis],
                                   window.pads[axis], window.pads[axis + spatial],
                                   window.dilations[axis], ceilMode);
    if (out <= 0)
      throw EvalError("window larger than the padded input " + shapeToString(inputShape));
    window.outputSpatial.push_back(out);
  }
  return window;
}

} // namespace

Tensor zeros(ElementKind kind, std::vector<int64_t> shape) {
  Tensor tensor;
  tensor.kind = kind;
  tensor.shape = std::move(shape);
  if (isFloating(kind))
    tensor.floats.assign(product(tensor.shape), 0.0);
  else
    tensor.ints.assign(product(tensor.shape), 0);
  return tensor;
}

void roundToElementType(Tensor &tensor) {
  switch (tensor.kind) {
  case ElementKind::Float64:
    return;
  case ElementKind::Float32:
    for (double &value : tensor.floats)
      value = static_cast<float>(value);
    return;
  case ElementKind::Float16:
    for (double &value : tensor.floats)
      value = roundTo(value, llvm::APFloat::IEEEhalf());
    return;
  case ElementKind::BFloat16:
    for (double &value : tensor.floats)
      value = roundTo(value, llvm::APFloat::BFloat());
    return;
  default:
    for (int64_t &value : tensor.ints)
      value = wrapInteger(value, tensor.kind);
  }
}

std::string shapeToString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

namespace kernels {

//===----------------------------------------------------------------------===//
// Element-wise
//===----------------------------------------------------------------------===//

Tensor binary(BinaryOp op, const Tensor &lhs, const Tensor &rhs) {
  if (lhs.kind != rhs.kind)
    throw EvalError(std::string("operand element types differ (") +
                    import::elementKindName(lhs.kind) + " vs " +
                    import::elementKindName(rhs.kind) + ")");
  std::vector<int64_t> shape = broadcastTwo(lhs.shape, rhs.shape);
  bool floating = isFloating(lhs.kind);
  Tensor out = zeros(op == BinaryOp::Equal ? ElementKind::Bool : lhs.kind, shape);
  int64_t flat = 0;
  forEachIndex(shape, [&](const std::vector<int64_t> &index) {
    int64_t l = broadcastOffset(index, lhs.shape), r = broadcastOffset(index, rhs.shape);
    if (op == BinaryOp::Equal)
      out.ints[flat] = floating ? lhs.floats[l] == rhs.floats[r] : lhs.ints[l] == rhs.ints[r];
    else if (floating)
      out.floats[flat] = floatBinary(op, lhs.floats[l], rhs.floats[r]);
    else
      out.ints[flat] = integerBinary(op, lhs.ints[l], rhs.ints[r]);
    ++flat;
  });
  return finish(std::move(out));
}

Tensor unary(UnaryOp op, const Tensor &input) {
  requireFloating(input, "the operand");
  Tensor out = zeros(input.kind, input.shape);
  for (size_t i = 0; i < input.floats.size(); ++i) {
    double x = input.floats[i];
    switch (op) {
    case UnaryOp::Relu: out.floats[i] = x > 0 ? x : 0.0; break;
    case UnaryOp::Tanh: out.floats[i] = std::tanh(x); break;
    case UnaryOp::Sigmoid: out.floats[i] = 1.0 / (1.0 + std::exp(-x)); break;
    case UnaryOp::Erf: out.floats[i] = std::erf(x); break;
    case UnaryOp::Sqrt: out.floats[i] = std::sqrt(x); break;
    case UnaryOp::GeluExact: out.floats[i] = geluExact(x); break;
    case UnaryOp::GeluTanh: out.floats[i] = geluTanh(x); break;
    }
    // NaN propagates through Relu as numpy's maximum does.
    if (op == UnaryOp::Relu && std::isnan(x))
      out.floats[i] = x;
  }
  return finish(std::move(out));
}

Tensor where(const Tensor &condition, const Tensor &x, const Tensor &y) {
  if (condition.kind != ElementKind::Bool)
    throw EvalError("the condition must be bool");
  if (x.kind != y.kind)
    throw EvalError("x and y element types differ");
  std::vector<int64_t> shape = broadcastTwo(condition.shape, broadcastTwo(x.shape, y.shape));
  Tensor out = zeros(x.kind, shape);
  int64_t flat = 0;
  forEachIndex(shape, [&](const std::vector<int64_t> &index) {
    bool pick = condition.ints[broadcastOffset(index, condition.shape)] != 0;
    const Tensor &from = pick ? x : y;
    copyElement(out, flat++, from, broadcastOffset(index, from.shape));
  });
  return out;
}

Tensor cast(const Tensor &input, ElementKind to) {
  Tensor out = zeros(to, input.shape);
  for (int64_t i = 0; i < input.numElements(); ++i) {
    if (isFloating(to)) {
      out.floats[i] = get(input, i);
    } else if (to == ElementKind::Bool) {
      out.ints[i] = get(input, i) != 0.0;
    } else if (isFloating(input.kind)) {
      double value = std::trunc(input.floats[i]);
      if (std::isnan(value))
        out.ints[i] = 0;
      else if (value >= 9.2233720368547758e18)
        out.ints[i] = std::numeric_limits<int64_t>::max();
      else if (value <= -9.2233720368547758e18)
        out.ints[i] = std::numeric_limits<int64_t>::min();
      else
        out.ints[i] = static_cast<int64_t>(value);
      // Saturate at the narrower target's range instead of wrapping.
      int64_t low = 0, high = 0;
      switch (to) {
      case ElementKind::Int32: low = INT32_MIN; high = INT32_MAX; break;
      case ElementKind::Int8: low = INT8_MIN; high = INT8_MAX; break;
      case ElementKind::UInt8: low = 0; high = UINT8_MAX; break;
      default: low = std::numeric_limits<int64_t>::min(); high = std::numeric_limits<int64_t>::max();
      }
      out.ints[i] = std::clamp(out.ints[i], low, high);
    } else {
      out.ints[i] = input.ints[i];
    }
  }
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

Tensor gemm(const Tensor &a, const Tensor &b, const Tensor *c, double alpha, double beta,
            bool transA, bool transB) {
  requireFloating(a, "A");
  if (a.shape.size() != 2 || b.shape.size() != 2)
    throw EvalError("A and B must be 2-D, got " + shapeToString(a.shape) + " and " +
                    shapeToString(b.shape));
  int64_t m = a.shape[transA ? 1 : 0], k = a.shape[transA ? 0 : 1];
  int64_t kb = b.shape[transB ? 1 : 0], n = b.shape[transB ? 0 : 1];
  if (k != kb)
    throw EvalError("inner dimensions differ (" + std::to_string(k) + " vs " +
                    std::to_string(kb) + ")");
  if (c && broadcastTwo(c->shape, {m, n}) != std::vector<int64_t>{m, n})
    throw EvalError("C of shape " + shapeToString(c->shape) + " does not broadcast to [" +
                    std::to_string(m) + "," + std::to_string(n) + "]");
  Tensor out = zeros(a.kind, {m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = a.floats[transA ? p * m + i : i * k + p];
        double bv = b.floats[transB ? j * k + p : p * n + j];
        sum += av * bv;
      }
      double value = alpha * sum;
      if (c)
        value += beta * c->floats[broadcastOffset({i, j}, c->shape)];
      out.floats[i * n + j] = value;
    }
  return finish(std::move(out));
}

Tensor matmul(const Tensor &a, const Tensor &b) {
  requireFloating(a, "A");
  if (a.kind != b.kind)
    throw EvalError("operand element types differ");
  requireRank(a, 1, "A");
  requireRank(b, 1, "B");
  std::vector<int64_t> aShape = a.shape, bShape = b.shape;
  bool vectorA = aShape.size() == 1, vectorB = bShape.size() == 1;
  if (vectorA)
    aShape.insert(aShape.begin(), 1);
  if (vectorB)
    bShape.push_back(1);
  int64_t m = aShape[aShape.size() - 2], k = aShape.back();
  int64_t kb = bShape[bShape.size() - 2], n = bShape.back();
  if (k != kb)
    throw EvalError("inner dimensions differ for " + shapeToString(a.shape) + " x " +
                    shapeToString(b.shape));
  std::vector<int64_t> aBatch(aShape.begin(), aShape.end() - 2);
  std::vector<int64_t> bBatch(bShape.begin(), bShape.end() - 2);
  std::vector<int64_t> batch = broadcastTwo(aBatch, bBatch);
  Tensor out = zeros(a.kind, [&] {
    std::vector<int64_t> shape = batch;
    if (!vectorA)
      shape.push_back(m);
    if (!vectorB)
      shape.push_back(n);
    return shape;
  }());
  int64_t batchIndex = 0;
  auto visit = [&](const std::vector<int64_t> &index) {
    // The batch offsets count whole matrices of each operand.
    int64_t aBase = broadcastOffset(index, aBatch) * m * k;
    int64_t bBase = broadcastOffset(index, bBatch) * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum += a.floats[aBase + i * k + p] * b.floats[bBase + p * n + j];
        out.floats[batchIndex * m * n + i * n + j] = sum;
      }
    ++batchIndex;
  };
  if (batch.empty())
    visit({});
  else
    forEachIndex(batch, visit);
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Convolution, normalization, pooling
//===----------------------------------------------------------------------===//

int64_t windowOutputSize(int64_t input, int64_t kernel, int64_t stride, int64_t padBegin,
                         int64_t padEnd, int64_t dilation, bool ceilMode) {
  int64_t effectiveKernel = (kernel - 1) * dilation + 1;
  int64_t span = input + padBegin + padEnd - effectiveKernel;
  if (span < 0)
    return 0;
  int64_t size = ceilMode ? (span + stride - 1) / stride + 1 : span / stride + 1;
  if (ceilMode && (size - 1) * stride >= input + padBegin)
    --size;
  return size;
}

Tensor conv(const Tensor &input, const Tensor &weight, const Tensor *bias,
            const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
            const std::vector<int64_t> &dilations, int64_t group) {
  requireFloating(input, "the input");
  requireRank(input, 3, "the input (N, C, spatial...)");
  if (weight.shape.size() != input.shape.size())
    throw EvalError("weight " + shapeToString(weight.shape) + " and input " +
                    shapeToString(input.shape) + " differ in rank");
  int64_t batch = input.shape[0], channels = input.shape[1], filters = weight.shape[0];
  int64_t groupChannels = weight.shape[1];
  if (group <= 0 || channels != groupChannels * group || filters % group)
    throw EvalError(std::to_string(channels) + " input channels, group " +
                    std::to_string(group) + " and weight " + shapeToString(weight.shape) +
                    " do not match");
  std::vector<int64_t> kernel(weight.shape.begin() + 2, weight.shape.end());
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, false);
  size_t spatial = window.spatial();
  int64_t filtersPerGroup = filters / group;

  std::vector<int64_t> outShape{batch, filters};
  outShape.insert(outShape.end(), window.outputSpatial.begin(), window.outputSpatial.end());
  Tensor out = zeros(input.kind, outShape);
  std::vector<int64_t> inStrides = stridesOf(input.shape), wStrides = stridesOf(weight.shape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &o) {
    int64_t n = o[0], f = o[1], g = f / filtersPerGroup;
    double sum = bias ? bias->floats[f] : 0.0;
    for (int64_t c = 0; c < groupChannels; ++c) {
      forEachIndex(kernel, [&](const std::vector<int64_t> &k) {
        int64_t inOffset = n * inStrides[0] + (g * groupChannels + c) * inStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis) {
          int64_t position = o[axis + 2] * window.strides[axis] - window.pads[axis] +
                             k[axis] * window.dilations[axis];
          if (position < 0 || position >= window.inputSpatial[axis])
            return; // in the zero padding
          inOffset += position * inStrides[axis + 2];
        }
        int64_t wOffset = f * wStrides[0] + c * wStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis)
          wOffset += k[axis] * wStrides[axis + 2];
        sum += input.floats[inOffset] * weight.floats[wOffset];
      });
    }
    out.floats[flat++] = sum;
  });
  return finish(std::move(out));
}

BatchNormResults batchNorm(const Tensor &input, const Tensor &scale, const Tensor &bias,
                           const Tensor &runningMean, const Tensor &runningVar, double epsilon,
                           double momentum, bool training) {
  requireFloating(input, "the input");
  requireRank(input, 2, "the input (N, C, ...)");
  int64_t batch = input.shape[0], channels = input.shape[1];
  int64_t inner = product(std::vector<int64_t>(input.shape.begin() + 2, input.shape.end()));
  for (const Tensor *stat : {&scale, &bias, &runningMean, &runningVar})
    if (stat->shape != std::vector<int64_t>{channels})
      throw EvalError("scale, bias, mean and variance must have shape [" +
                      std::to_string(channels) + "], got " + shapeToString(stat->shape));
  auto at = [&](int64_t n, int64_t c, int64_t i) { return (n * channels + c) * inner + i; };

  BatchNormResults results{zeros(input.kind, input.shape), runningMean, runningVar};
  for (int64_t c = 0; c < channels; ++c) {
    double mean = runningMean.floats[c], variance = runningVar.floats[c];
    if (training) {
      double count = static_cast<double>(batch * inner), sum = 0, squares = 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i)
          sum += input.floats[at(n, c, i)];
      mean = sum / count;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          double d = input.floats[at(n, c, i)] - mean;
          squares += d * d;
        }
      variance = squares / count;
      results.runningMean.floats[c] = momentum * runningMean.floats[c] + (1 - momentum) * mean;
      results.runningVar.floats[c] = momentum * runningVar.floats[c] + (1 - momentum) * variance;
    }
    double invStd = 1.0 / std::sqrt(variance + epsilon);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < inner; ++i)
        results.output.floats[at(n, c, i)] =
            (input.floats[at(n, c, i)] - mean) * invStd * scale.floats[c] + bias.floats[c];
  }
  roundToElementType(results.output);
  roundToElementType(results.runningMean);
  roundToElementType(results.runningVar);
  return results;
}

LayerNormResults layerNorm(const Tensor &input, const Tensor &scale, const Tensor *bias,
                           int64_t axis, double epsilon) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  axis = normalizeAxis(axis, rank);
  std::vector<int64_t> normalizedShape(input.shape.begin() + axis, input.shape.end());
  for (const Tensor *param : {&scale, bias})
    if (param && broadcastTwo(param->shape, normalizedShape) != normalizedShape)
      throw EvalError("scale/bias of shape " + shapeToString(param->shape) +
                      " does not broadcast to " + shapeToString(normalizedShape));
  int64_t outer = product(std::vector<int64_t>(input.shape.begin(), input.shape.begin() + axis));
  int64_t inner = product(normalizedShape);
  std::vector<int64_t> statsShape = input.shape;
  std::fill(statsShape.begin() + axis, statsShape.end(), 1);
  LayerNormResults results{zeros(input.kind, input.shape), zeros(input.kind, statsShape),
                           zeros(input.kind, statsShape)};
  std::vector<int64_t> innerIndex(normalizedShape.size());
  for (int64_t row = 0; row < outer; ++row) {
    const double *x = input.floats.data() + row * inner;
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < inner; ++i)
      mean += x[i];
    mean /= static_cast<double>(inner);
    for (int64_t i = 0; i < inner; ++i)
      variance += (x[i] - mean) * (x[i] - mean);
    variance /= static_cast<double>(inner);
    double invStd = 1.0 / std::sqrt(variance + epsilon);
    results.mean.floats[row] = mean;
    results.invStdDev.floats[row] = invStd;
    int64_t i = 0;
    forEachIndex(normalizedShape, [&](const std::vector<int64_t> &index) {
      double value = (x[i] - mean) * invStd * scale.floats[broadcastOffset(index, scale.shape)];
      if (bias)
        value += bias->floats[broadcastOffset(index, bias->shape)];
      results.output.floats[row * inner + i] = value;
      ++i;
    });
  }
  roundToElementType(results.output);
  roundToElementType(results.mean);
  roundToElementType(results.invStdDev);
  return results;
}

namespace {
/// Calls visit(outputFlat, positions) for every output element of a pool
/// over an input of shape `inputShape`, in row-major order; positions are
/// the window's input offsets (-1 in the padding), each with whether it lies
/// within the padded input.
template <typename Visit>
void forEachWindow(const std::vector<int64_t> &inputShape, const Window &window, Visit visit) {
  std::vector<int64_t> outShape{inputShape[0], inputShape[1]};
  outShape.insert(outShape.end(), window.outputSpatial.begin(), window.outputSpatial.end());
  std::vector<int64_t> inStrides = stridesOf(inputShape);
  size_t spatial = window.spatial();
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &o) {
    int64_t channelBase = o[0] * inStrides[0] + o[1] * inStrides[1];
    std::vector<std::pair<int64_t, bool>> positions;
    forEachIndex(window.kernel, [&](const std::vector<int64_t> &k) {
      int64_t offset = channelBase;
      bool inside = true, insidePadded = true;
      for (size_t axis = 0; axis < spatial; ++axis) {
        int64_t p = o[axis + 2] * window.strides[axis] - window.pads[axis] +
                    k[axis] * window.dilations[axis];
        if (p < 0 || p >= window.inputSpatial[axis])
          inside = false;
        if (p < -window.pads[axis] ||
            p >= window.inputSpatial[axis] + window.pads[axis + spatial])
          insidePadded = false;
        offset += p * inStrides[axis + 2];
      }
      positions.push_back({inside ? offset : -1, insidePadded});
    });
    visit(flat++, positions);
  });
}

std::vector<int64_t> pooledShape(const std::vector<int64_t> &inputShape, const Window &window) {
  std::vector<int64_t> shape{inputShape[0], inputShape[1]};
  shape.insert(shape.end(), window.outputSpatial.begin(), window.outputSpatial.end());
  return shape;
}

/// out[flat] = reduce(positions) for every output element of a pool.
template <typename Reduce>
Tensor pool(const Tensor &input, const Window &window, Reduce reduce) {
  Tensor out = zeros(input.kind, pooledShape(input.shape, window));
  forEachWindow(input.shape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  out.floats[flat] = reduce(positions);
                });
  return finish(std::move(out));
}
} // namespace

Tensor maxPool(const Tensor &input, const std::vector<int64_t> &kernel,
               const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
               const std::vector<int64_t> &dilations, bool ceilMode) {
  requireFloating(input, "the input");
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, ceilMode);
  return pool(input, window, [&](const std::vector<std::pair<int64_t, bool>> &positions) {
    double best = -std::numeric_limits<double>::infinity();
    for (auto [offset, insidePadded] : positions)
      if (offset >= 0)
        best = std::max(best, input.floats[offset]);
    return best;
  });
}

Tensor averagePool(const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   bool ceilMode, bool countIncludePad) {
  requireFloating(input, "the input");
  Window window = makeWindow(input.shape, kernel, strides, pads,
                             std::vector<int64_t>(kernel.size(), 1), ceilMode);
  return pool(input, window, [&](const std::vector<std::pair<int64_t, bool>> &positions) {
    double sum = 0;
    int64_t count = 0;
    for (auto [offset, insidePadded] : positions) {
      if (offset >= 0)
        sum += input.floats[offset];
      if (countIncludePad ? insidePadded : offset >= 0)
        ++count;
    }
    return sum / static_cast<double>(count);
  });
}

Tensor globalAveragePool(const Tensor &input) {
  requireFloating(input, "the input");
  requireRank(input, 3, "the input (N, C, spatial...)");
  std::vector<int64_t> outShape(input.shape.size(), 1);
  outShape[0] = input.shape[0];
  outShape[1] = input.shape[1];
  Tensor out = zeros(input.kind, outShape);
  int64_t planes = input.shape[0] * input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(planes, 1);
  for (int64_t plane = 0; plane < planes; ++plane) {
    double sum = 0;
    for (int64_t i = 0; i < inner; ++i)
      sum += input.floats[plane * inner + i];
    out.floats[plane] = sum / static_cast<double>(inner);
  }
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Dropout and its generator
//===----------------------------------------------------------------------===//

namespace {
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
}

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t dropoutStreamKey(uint64_t seed, uint64_t step, uint64_t microBatch, uint64_t opId) {
  // Chaining the finalizer makes every key part change all bits of the key;
  // the gamma keeps (0, 0, 0, 0) away from the fixed point mix64(0) = 0.
  uint64_t key = mix64(seed + kGoldenGamma);
  key = mix64(key ^ (step + kGoldenGamma));
  key = mix64(key ^ (microBatch + kGoldenGamma));
  return mix64(key ^ (opId + kGoldenGamma));
}

double dropoutUniform(uint64_t streamKey, uint64_t index) {
  uint64_t bits = mix64(streamKey + (index + 1) * kGoldenGamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

DropoutResults dropout(const Tensor &input, double ratio, bool training, uint64_t streamKey) {
  requireFloating(input, "the input");
  if (!(ratio >= 0.0 && ratio < 1.0))
    throw EvalError("ratio must be in [0, 1), got " + std::to_string(ratio));
  DropoutResults results{input, zeros(ElementKind::Bool, input.shape)};
  std::fill(results.mask.ints.begin(), results.mask.ints.end(), 1);
  if (!training || ratio == 0.0)
    return results;
  double scale = 1.0 / (1.0 - ratio);
  for (int64_t i = 0; i < input.numElements(); ++i) {
    bool keep = dropoutUniform(streamKey, static_cast<uint64_t>(i)) >= ratio;
    results.mask.ints[i] = keep;
    results.output.floats[i] = keep ? input.floats[i] * scale : 0.0;
  }
  roundToElementType(results.output);
  return results;
}

//===----------------------------------------------------------------------===//
// Softmax, loss, reductions
//===----------------------------------------------------------------------===//

namespace {
/// Splits a shape around one axis: [outer, axis size, inner].
struct AxisView {
  int64_t outer, size, inner;
  int64_t at(int64_t o, int64_t i, int64_t in) const { return (o * size + i) * inner + in; }
};
AxisView viewAround(const std::vector<int64_t> &shape, int64_t axis) {
  return {product(std::vector<int64_t>(shape.begin(), shape.begin() + axis)), shape[axis],
          product(std::vector<int64_t>(shape.begin() + axis + 1, shape.end()))};
}

/// log(softmax(x)) along `axis`, in double, unrounded.
std::vector<double> logSoftmax(const Tensor &input, int64_t axis) {
  AxisView view = viewAround(input.shape, axis);
  std::vector<double> out(input.floats.size());
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      double maximum = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < view.size; ++i)
        maximum = std::max(maximum, input.floats[view.at(o, i, in)]);
      double sum = 0;
      for (int64_t i = 0; i < view.size; ++i)
        sum += std::exp(input.floats[view.at(o, i, in)] - maximum);
      double logSum = maximum + std::log(sum);
      for (int64_t i = 0; i < view.size; ++i)
        out[view.at(o, i, in)] = input.floats[view.at(o, i, in)] - logSum;
    }
  return out;
}
} // namespace

Tensor softmax(const Tensor &input, int64_t axis) {
  requireFloating(input, "the input");
  axis = normalizeAxis(axis, static_cast<int64_t>(input.shape.size()));
  AxisView view = viewAround(input.shape, axis);
  Tensor out = zeros(input.kind, input.shape);
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      // Subtracting the maximum keeps exp() finite; the result is unchanged.
      double maximum = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < view.size; ++i)
        maximum = std::max(maximum, input.floats[view.at(o, i, in)]);
      double sum = 0;
      for (int64_t i = 0; i < view.size; ++i)
        sum += std::exp(input.floats[view.at(o, i, in)] - maximum);
      for (int64_t i = 0; i < view.size; ++i)
        out.floats[view.at(o, i, in)] = std::exp(input.floats[view.at(o, i, in)] - maximum) / sum;
    }
  return finish(std::move(out));
}

/// The operand checks softmax_cross_entropy_loss and its gradient share;
/// returns the labels' shape (N, d1, ...).
std::vector<int64_t> checkLossOperands(const Tensor &scores, const Tensor &labels,
                                       const Tensor *weights, const std::string &reduction) {
  requireFloating(scores, "the scores");
  requireRank(scores, 2, "the scores (N, C, ...)");
  if (isFloating(labels.kind))
    throw EvalError("labels must be integers");
  int64_t classes = scores.shape[1];
  std::vector<int64_t> labelShape{scores.shape[0]};
  labelShape.insert(labelShape.end(), scores.shape.begin() + 2, scores.shape.end());
  if (labels.shape != labelShape)
    throw EvalError("labels must have shape " + shapeToString(labelShape) + ", got " +
                    shapeToString(labels.shape));
  if (weights && weights->shape != std::vector<int64_t>{classes})
    throw EvalError("weights must have shape [" + std::to_string(classes) + "]");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    throw EvalError("reduction must be mean, sum or none, got " + reduction);
  return labelShape;
}

SoftmaxCrossEntropyResults softmaxCrossEntropyLoss(const Tensor &scores, const Tensor &labels,
                                                   const Tensor *weights,
                                                   const std::string &reduction,
                                                   std::optional<int64_t> ignoreIndex) {
  std::vector<int64_t> labelShape = checkLossOperands(scores, labels, weights, reduction);
  int64_t classes = scores.shape[1];

  std::vector<double> logProb = logSoftmax(scores, 1);
  AxisView view = viewAround(scores.shape, 1); // outer = N, inner = d1*d2*...
  std::vector<double> losses(labels.numElements());
  double lossSum = 0, weightSum = 0;
  for (int64_t n = 0; n < view.outer; ++n)
    for (int64_t in = 0; in < view.inner; ++in) {
      int64_t flat = n * view.inner + in;
      int64_t label = labels.ints[flat];
      if (ignoreIndex && label == *ignoreIndex)
        continue; // contributes 0 and weighs nothing
      if (label < 0 || label >= classes)
        throw EvalError("label " + std::to_string(label) + " out of range [0, " +
                        std::to_string(classes) + ")");
      double weight = weights ? weights->floats[label] : 1.0;
      losses[flat] = -weight * logProb[view.at(n, label, in)];
      lossSum += losses[flat];
      weightSum += weight;
    }

  SoftmaxCrossEntropyResults results;
  if (reduction == "none") {
    results.loss = Tensor::ofFloats(scores.kind, labelShape, losses);
  } else {
    // "mean" over no counted element is 0/0 = NaN, as in ONNX's reference
    // and PyTorch.
    double value = reduction == "sum" ? lossSum : lossSum / weightSum;
    results.loss = Tensor::ofFloats(scores.kind, {}, {value});
  }
  results.logProb = Tensor::ofFloats(scores.kind, scores.shape, logProb);
  roundToElementType(results.loss);
  roundToElementType(results.logProb);
  return results;
}

Tensor reduceMean(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t axis : axes) {
    if (axis < 0 || axis >= rank)
      throw EvalError("axis " + std::to_string(axis) + " out of range for rank " +
                      std::to_string(rank));
    reduced[axis] = true;
  }
  std::vector<int64_t> keptShape; // the output shape with keepdims
  for (int64_t axis = 0; axis < rank; ++axis)
    keptShape.push_back(reduced[axis] ? 1 : input.shape[axis]);
  std::vector<double> sums(product(keptShape), 0.0);
  forEachIndex(input.shape, [&](const std::vector<int64_t> &index) {
    int64_t inFlat = 0, outFlat = 0;
    for (int64_t axis = 0; axis < rank; ++axis) {
      inFlat = inFlat * input.shape[axis] + index[axis];
      outFlat = outFlat * keptShape[axis] + (reduced[axis] ? 0 : index[axis]);
    }
    sums[outFlat] += input.floats[inFlat];
  });
  double count = static_cast<double>(input.numElements()) /
                 static_cast<double>(std::max<int64_t>(product(keptShape), 1));
  std::vector<int64_t> outShape;
  for (int64_t axis = 0; axis < rank; ++axis)
    if (!reduced[axis] || keepdims)
      outShape.push_back(keptShape[axis]);
  for (double &sum : sums)
    sum /= count;
  return finish(Tensor::ofFloats(input.kind, outShape, sums));
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

Tensor gather(const Tensor &data, const Tensor &indices, int64_t axis) {
  if (isFloating(indices.kind))
    throw EvalError("indices must be integers");
  int64_t rank = static_cast<int64_t>(data.shape.size());
  axis = normalizeAxis(axis, rank);
  AxisView view = viewAround(data.shape, axis);
  std::vector<int64_t> outShape(data.shape.begin(), data.shape.begin() + axis);
  outShape.insert(outShape.end(), indices.shape.begin(), indices.shape.end());
  outShape.insert(outShape.end(), data.shape.begin() + axis + 1, data.shape.end());
  Tensor out = zeros(data.kind, outShape);
  int64_t count = indices.numElements(), flat = 0;
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      int64_t index = indices.ints[j];
      if (index < -view.size || index >= view.size)
        throw EvalError("index " + std::to_string(index) + " out of range for axis size " +
                        std::to_string(view.size));
      if (index < 0)
        index += view.size;
      for (int64_t in = 0; in < view.inner; ++in)
        copyElement(out, flat++, data, view.at(o, index, in));
    }
  return out;
}

Tensor reshape(const Tensor &input, const std::vector<int64_t> &shape) {
  if (product(shape) != input.numElements())
    throw EvalError("cannot reshape " + shapeToString(input.shape) + " into " +
                    shapeToString(shape));
  Tensor out = input;
  out.shape = shape;
  return out;
}

Tensor expand(const Tensor &input, const std::vector<int64_t> &shape) {
  std::vector<int64_t> target = broadcastTwo(input.shape, shape);
  Tensor out = zeros(input.kind, target);
  int64_t flat = 0;
  forEachIndex(target, [&](const std::vector<int64_t> &index) {
    copyElement(out, flat++, input, broadcastOffset(index, input.shape));
  });
  return out;
}

Tensor transpose(const Tensor &input, const std::vector<int64_t> &perm) {
  size_t rank = input.shape.size();
  std::vector<bool> seen(rank, false);
  if (perm.size() != rank)
    throw EvalError("perm has " + std::to_string(perm.size()) + " entries for rank " +
                    std::to_string(rank));
  std::vector<int64_t> outShape;
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[axis])
      throw EvalError("perm is not a permutation");
    seen[axis] = true;
    outShape.push_back(input.shape[axis]);
  }
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  Tensor out = zeros(input.kind, outShape);
  int64_t flat = 0;
  // Output axis i walks input axis perm[i].
  forEachIndex(outShape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t i = 0; i < rank; ++i)
      offset += index[i] * inStrides[perm[i]];
    copyElement(out, flat++, input, offset);
  });
  return out;
}

Tensor concat(const std::vector<const Tensor *> &inputs, int64_t axis) {
  if (inputs.empty())
    throw EvalError("needs at least one input");
  const Tensor &first = *inputs.front();
  axis = normalizeAxis(axis, static_cast<int64_t>(first.shape.size()));
  std::vector<int64_t> outShape = first.shape;
  outShape[axis] = 0;
  for (const Tensor *input : inputs) {
    std::vector<int64_t> expected = first.shape;
    expected[axis] = input->shape.size() == first.shape.size() ? input->shape[axis] : -1;
    if (input->kind != first.kind || input->shape != expected)
      throw EvalError("inputs " + shapeToString(first.shape) + " and " +
                      shapeToString(input->shape) + " differ outside axis " +
                      std::to_string(axis));
    outShape[axis] += input->shape[axis];
  }
  Tensor out = zeros(first.kind, outShape);
  AxisView outView = viewAround(outShape, axis);
  int64_t offset = 0; // where the current input starts along the axis
  for (const Tensor *input : inputs) {
    AxisView view = viewAround(input->shape, axis);
    for (int64_t o = 0; o < view.outer; ++o)
      for (int64_t i = 0; i < view.size; ++i)
        for (int64_t in = 0; in < view.inner; ++in)
          copyElement(out, outView.at(o, offset + i, in), *input, view.at(o, i, in));
    offset += view.size;
  }
  return out;
}

std::vector<Tensor> split(const Tensor &input, int64_t axis, const std::vector<int64_t> &sizes) {
  axis = normalizeAxis(axis, static_cast<int64_t>(input.shape.size()));
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      throw EvalError("negative piece size");
    total += size;
  }
  if (total != input.shape[axis])
    throw EvalError("piece sizes sum to " + std::to_string(total) + " but axis " +
                    std::to_string(axis) + " has size " + std::to_string(input.shape[axis]));
  AxisView view = viewAround(input.shape, axis);
  std::vector<Tensor> pieces;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    std::vector<int64_t> shape = input.shape;
    shape[axis] = size;
    Tensor piece = zeros(input.kind, shape);
    AxisView pieceView = viewAround(shape, axis);
    for (int64_t o = 0; o < view.outer; ++o)
      for (int64_t i = 0; i < size; ++i)
        for (int64_t in = 0; in < view.inner; ++in)
          copyElement(piece, pieceView.at(o, i, in), input, view.at(o, offset + i, in));
    pieces.push_back(std::move(piece));
    offset += size;
  }
  return pieces;
}

namespace {
/// The result shape of a slice with normalized per-axis bounds; throws on
/// bounds that are not normalized.
std::vector<int64_t> slicedShape(const std::vector<int64_t> &inputShape,
                                 const std::vector<int64_t> &starts,
                                 const std::vector<int64_t> &ends,
                                 const std::vector<int64_t> &steps) {
  size_t rank = inputShape.size();
  if (starts.size() != rank || ends.size() != rank || steps.size() != rank)
    throw EvalError("starts, ends and steps need one entry per axis (" + std::to_string(rank) +
                    ")");
  std::vector<int64_t> outShape;
  for (size_t axis = 0; axis < rank; ++axis) {
    int64_t dim = inputShape[axis], start = starts[axis], end = ends[axis], step = steps[axis];
    if (step == 0)
      throw EvalError("step 0 on axis " + std::to_string(axis));
    bool valid = step > 0 ? (start >= 0 && start <= dim && end >= 0 && end <= dim)
                          : (start >= -1 && start < dim && end >= -1 && end < dim);
    if (!valid)
      throw EvalError("bounds of axis " + std::to_string(axis) +
                      " are not normalized for size " + std::to_string(dim));
    int64_t size = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / -step;
    outShape.push_back(std::max<int64_t>(size, 0));
  }
  return outShape;
}
} // namespace

Tensor slice(const Tensor &input, const std::vector<int64_t> &starts,
             const std::vector<int64_t> &ends, const std::vector<int64_t> &steps) {
  size_t rank = input.shape.size();
  std::vector<int64_t> outShape = slicedShape(input.shape, starts, ends, steps);
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  Tensor out = zeros(input.kind, outShape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < rank; ++axis)
      offset += (starts[axis] + index[axis] * steps[axis]) * inStrides[axis];
    copyElement(out, flat++, input, offset);
  });
  return out;
}

Tensor pad(const Tensor &input, const std::vector<int64_t> &pads, double value) {
  size_t rank = input.shape.size();
  if (pads.size() != 2 * rank)
    throw EvalError("pads needs " + std::to_string(2 * rank) + " entries for rank " +
                    std::to_string(rank));
  std::vector<int64_t> outShape = input.shape;
  for (size_t axis = 0; axis < rank; ++axis) {
    if (pads[axis] < 0 || pads[axis + rank] < 0)
      throw EvalError("pads must be non-negative");
    outShape[axis] += pads[axis] + pads[axis + rank];
  }
  Tensor out = zeros(input.kind, outShape);
  if (isFloating(input.kind))
    std::fill(out.floats.begin(), out.floats.end(), value);
  else
    std::fill(out.ints.begin(), out.ints.end(), static_cast<int64_t>(value));
  std::vector<int64_t> outStrides = stridesOf(outShape);
  int64_t flat = 0;
  forEachIndex(input.shape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < rank; ++axis)
      offset += (index[axis] + pads[axis]) * outStrides[axis];
    copyElement(out, offset, input, flat++);
  });
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

namespace {
void requireSameShape(const Tensor &a, const Tensor &b, const char *what) {
  if (a.shape != b.shape || a.kind != b.kind)
    throw EvalError(std::string(what) + ": " + import::elementKindName(a.kind) +
                    shapeToString(a.shape) + " vs " + import::elementKindName(b.kind) +
                    shapeToString(b.shape));
}

/// Sums values of shape `from` down to `to`, which broadcasts to `from`
/// (numpy style, right-aligned).
std::vector<double> sumToShape(const std::vector<double> &values, const std::vector<int64_t> &from,
                               const std::vector<int64_t> &to) {
  if (to.size() > from.size() || broadcastTwo(to, from) != from)
    throw EvalError("shape " + shapeToString(to) + " does not broadcast to " +
                    shapeToString(from));
  std::vector<double> out(product(to), 0.0);
  int64_t flat = 0;
  forEachIndex(from, [&](const std::vector<int64_t> &index) {
    out[broadcastOffset(index, to)] += values[flat++];
  });
  return out;
}

/// Calls visit(outputFlat, inputOffset, weightOffset) for every product of
/// nn.conv: the output element, the input element and the weight element it
/// multiplies (positions in the zero padding are skipped).
template <typename Visit>
void forEachConvTap(const std::vector<int64_t> &inputShape, const std::vector<int64_t> &weightShape,
                    const std::vector<int64_t> &outShape, const Window &window, int64_t group,
                    Visit visit) {
  size_t spatial = window.spatial();
  int64_t groupChannels = weightShape[1], filtersPerGroup = weightShape[0] / group;
  std::vector<int64_t> kernel(weightShape.begin() + 2, weightShape.end());
  std::vector<int64_t> inStrides = stridesOf(inputShape), wStrides = stridesOf(weightShape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &o) {
    int64_t n = o[0], f = o[1], g = f / filtersPerGroup;
    for (int64_t c = 0; c < groupChannels; ++c)
      forEachIndex(kernel, [&](const std::vector<int64_t> &k) {
        int64_t inOffset = n * inStrides[0] + (g * groupChannels + c) * inStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis) {
          int64_t position = o[axis + 2] * window.strides[axis] - window.pads[axis] +
                             k[axis] * window.dilations[axis];
          if (position < 0 || position >= window.inputSpatial[axis])
            return;
          inOffset += position * inStrides[axis + 2];
        }
        int64_t wOffset = f * wStrides[0] + c * wStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis)
          wOffset += k[axis] * wStrides[axis + 2];
        visit(flat, inOffset, wOffset);
      });
    ++flat;
  });
}

/// Checks the shapes of a conv gradient and returns its window.
Window convGradWindow(const Tensor &dy, const std::vector<int64_t> &inputShape,
                      const std::vector<int64_t> &weightShape,
                      const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                      const std::vector<int64_t> &dilations, int64_t group) {
  requireFloating(dy, "dy");
  requireRank(dy, 3, "dy (N, F, spatial...)");
  if (inputShape.size() != dy.shape.size() || weightShape.size() != dy.shape.size())
    throw EvalError("dy " + shapeToString(dy.shape) + ", input " + shapeToString(inputShape) +
                    " and weight " + shapeToString(weightShape) + " differ in rank");
  if (group <= 0 || inputShape[1] != weightShape[1] * group || weightShape[0] % group ||
      dy.shape[1] != weightShape[0] || dy.shape[0] != inputShape[0])
    throw EvalError("dy " + shapeToString(dy.shape) + ", input " + shapeToString(inputShape) +
                    ", weight " + shapeToString(weightShape) + " and group " +
                    std::to_string(group) + " do not match");
  std::vector<int64_t> kernel(weightShape.begin() + 2, weightShape.end());
  Window window = makeWindow(inputShape, kernel, strides, pads, dilations, false);
  for (size_t axis = 0; axis < window.spatial(); ++axis)
    if (window.outputSpatial[axis] != dy.shape[axis + 2])
      throw EvalError("dy " + shapeToString(dy.shape) + " is not the conv result of input " +
                      shapeToString(inputShape) + " and weight " + shapeToString(weightShape));
  return window;
}

/// Per channel of (N, C, ...): the mean and 1/sqrt(var + eps) that nn.batch_norm
/// normalizes with (the batch's in training, else the running ones).
std::pair<std::vector<double>, std::vector<double>>
batchNormStats(const Tensor &input, const Tensor &runningMean, const Tensor &runningVar,
               double epsilon, bool training) {
  requireFloating(input, "the input");
  requireRank(input, 2, "the input (N, C, ...)");
  int64_t batch = input.shape[0], channels = input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(batch * channels, 1);
  for (const Tensor *stat : {&runningMean, &runningVar})
    if (stat->shape != std::vector<int64_t>{channels})
      throw EvalError("mean and variance must have shape [" + std::to_string(channels) +
                      "], got " + shapeToString(stat->shape));
  std::vector<double> means(channels), invStds(channels);
  for (int64_t c = 0; c < channels; ++c) {
    double mean = runningMean.floats[c], variance = runningVar.floats[c];
    if (training) {
      double count = static_cast<double>(batch * inner), sum = 0, squares = 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i)
          sum += input.floats[(n * channels + c) * inner + i];
      mean = sum / count;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          double d = input.floats[(n * channels + c) * inner + i] - mean;
          squares += d * d;
        }
      variance = squares / count;
    }
    means[c] = mean;
    invStds[c] = 1.0 / std::sqrt(variance + epsilon);
  }
  return {means, invStds};
}
} // namespace

Tensor reduceSum(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<bool> reduced(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= rank || (i && axes[i - 1] >= axes[i]))
      throw EvalError("axes must be sorted, unique and in [0, " + std::to_string(rank) + ")");
    reduced[axes[i]] = true;
  }
  std::vector<int64_t> keptShape, outShape;
  for (int64_t axis = 0; axis < rank; ++axis) {
    keptShape.push_back(reduced[axis] ? 1 : input.shape[axis]);
    if (!reduced[axis] || keepdims)
      outShape.push_back(keptShape.back());
  }
  return finish(
      Tensor::ofFloats(input.kind, outShape, sumToShape(input.floats, input.shape, keptShape)));
}

Tensor unaryGrad(UnaryOp op, const Tensor &dy, const Tensor &x, const Tensor &y) {
  requireFloating(dy, "dy");
  requireSameShape(dy, x, "dy and x differ");
  requireSameShape(dy, y, "dy and y differ");
  const double pi = 3.14159265358979323846;
  Tensor out = zeros(dy.kind, dy.shape);
  for (size_t i = 0; i < dy.floats.size(); ++i) {
    double xv = x.floats[i], yv = y.floats[i], derivative = 0;
    switch (op) {
    case UnaryOp::Relu: derivative = xv > 0 ? 1.0 : 0.0; break;
    case UnaryOp::Tanh: derivative = 1.0 - yv * yv; break;
    case UnaryOp::Sigmoid: derivative = yv * (1.0 - yv); break;
    case UnaryOp::Erf: derivative = 2.0 / std::sqrt(pi) * std::exp(-xv * xv); break;
    case UnaryOp::Sqrt: derivative = 1.0 / (2.0 * yv); break;
    case UnaryOp::GeluExact:
      // Phi(x) + x * phi(x)
      derivative = 0.5 * (1.0 + std::erf(xv / std::sqrt(2.0))) +
                   xv * std::exp(-0.5 * xv * xv) / std::sqrt(2.0 * pi);
      break;
    case UnaryOp::GeluTanh: {
      double c = std::sqrt(2.0 / pi);
      double t = std::tanh(c * (xv + 0.044715 * xv * xv * xv));
      derivative = 0.5 * (1.0 + t) + 0.5 * xv * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * xv * xv);
      break;
    }
    }
    out.floats[i] = dy.floats[i] * derivative;
  }
  return finish(std::move(out));
}

Tensor binaryGrad(BinaryGradKind kind, const Tensor &dy, const Tensor &lhs, const Tensor &rhs) {
  requireFloating(dy, "dy");
  if (lhs.kind != dy.kind || rhs.kind != dy.kind)
    throw EvalError("dy, lhs and rhs element types differ");
  std::vector<int64_t> shape = broadcastTwo(lhs.shape, rhs.shape);
  if (shape != dy.shape)
    throw EvalError("dy " + shapeToString(dy.shape) + " is not the broadcast shape " +
                    shapeToString(shape));
  Tensor out = zeros(dy.kind, shape);
  int64_t flat = 0;
  forEachIndex(shape, [&](const std::vector<int64_t> &index) {
    double g = dy.floats[flat], l = lhs.floats[broadcastOffset(index, lhs.shape)],
           r = rhs.floats[broadcastOffset(index, rhs.shape)];
    switch (kind) {
    case BinaryGradKind::SubRhs: out.floats[flat] = -g; break;
    case BinaryGradKind::DivRhs: out.floats[flat] = -g * l / (r * r); break;
    case BinaryGradKind::PowLhs: out.floats[flat] = g * r * std::pow(l, r - 1); break;
    case BinaryGradKind::PowRhs: out.floats[flat] = g * std::pow(l, r) * std::log(l); break;
    }
    ++flat;
  });
  return finish(std::move(out));
}

Tensor convInputGrad(const Tensor &dy, const Tensor &weight, const std::vector<int64_t> &inputShape,
                     const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                     const std::vector<int64_t> &dilations, int64_t group) {
  Window window = convGradWindow(dy, inputShape, weight.shape, strides, pads, dilations, group);
  Tensor out = zeros(dy.kind, inputShape);
  forEachConvTap(inputShape, weight.shape, dy.shape, window, group,
                 [&](int64_t outFlat, int64_t inOffset, int64_t wOffset) {
                   out.floats[inOffset] += dy.floats[outFlat] * weight.floats[wOffset];
                 });
  return finish(std::move(out));
}

Tensor convWeightGrad(const Tensor &dy, const Tensor &input,
                      const std::vector<int64_t> &weightShape,
                      const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                      const std::vector<int64_t> &dilations, int64_t group) {
  Window window = convGradWindow(dy, input.shape, weightShape, strides, pads, dilations, group);
  Tensor out = zeros(dy.kind, weightShape);
  forEachConvTap(input.shape, weightShape, dy.shape, window, group,
                 [&](int64_t outFlat, int64_t inOffset, int64_t wOffset) {
                   out.floats[wOffset] += dy.floats[outFlat] * input.floats[inOffset];
                 });
  return finish(std::move(out));
}

Tensor batchNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale,
                     const Tensor &runningMean, const Tensor &runningVar, double epsilon,
                     bool training) {
  requireSameShape(dy, input, "dy and input differ");
  auto [means, invStds] = batchNormStats(input, runningMean, runningVar, epsilon, training);
  int64_t batch = input.shape[0], channels = input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(batch * channels, 1);
  if (scale.shape != std::vector<int64_t>{channels})
    throw EvalError("scale must have shape [" + std::to_string(channels) + "]");
  auto at = [&](int64_t n, int64_t c, int64_t i) { return (n * channels + c) * inner + i; };
  Tensor out = zeros(dy.kind, dy.shape);
  for (int64_t c = 0; c < channels; ++c) {
    double sumDy = 0, sumDyXhat = 0, count = static_cast<double>(batch * inner);
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < inner; ++i) {
        double xhat = (input.floats[at(n, c, i)] - means[c]) * invStds[c];
        sumDy += dy.floats[at(n, c, i)];
        sumDyXhat += dy.floats[at(n, c, i)] * xhat;
      }
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t i = 0; i < inner; ++i) {
        double g = dy.floats[at(n, c, i)];
        if (training) {
          // The batch statistics depend on x: d/dx of (x - mean) * invStd.
          double xhat = (input.floats[at(n, c, i)] - means[c]) * invStds[c];
          g = g - sumDy / count - xhat * sumDyXhat / count;
        }
        out.floats[at(n, c, i)] = scale.floats[c] * invStds[c] * g;
      }
  }
  return finish(std::move(out));
}

ParamGrads batchNormParamGrad(const Tensor &dy, const Tensor &input, const Tensor &runningMean,
                              const Tensor &runningVar, double epsilon, bool training) {
  requireSameShape(dy, input, "dy and input differ");
  auto [means, invStds] = batchNormStats(input, runningMean, runningVar, epsilon, training);
  int64_t batch = input.shape[0], channels = input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(batch * channels, 1);
  ParamGrads grads{zeros(dy.kind, {channels}), zeros(dy.kind, {channels})};
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t flat = (n * channels + c) * inner + i;
        grads.scale.floats[c] += dy.floats[flat] * (input.floats[flat] - means[c]) * invStds[c];
        grads.bias.floats[c] += dy.floats[flat];
      }
  roundToElementType(grads.scale);
  roundToElementType(grads.bias);
  return grads;
}

namespace {
/// Rows of a layer norm: [outer, inner] around `axis`, with each row's mean
/// and 1/sqrt(var + eps).
struct LayerNormRows {
  int64_t outer, inner;
  std::vector<int64_t> normalizedShape;
  std::vector<double> means, invStds;
};
LayerNormRows layerNormRows(const Tensor &input, int64_t axis, double epsilon) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  axis = normalizeAxis(axis, rank);
  LayerNormRows rows;
  rows.normalizedShape.assign(input.shape.begin() + axis, input.shape.end());
  rows.outer = product(std::vector<int64_t>(input.shape.begin(), input.shape.begin() + axis));
  rows.inner = product(rows.normalizedShape);
  for (int64_t row = 0; row < rows.outer; ++row) {
    const double *x = input.floats.data() + row * rows.inner;
    double mean = 0, variance = 0;
    for (int64_t i = 0; i < rows.inner; ++i)
      mean += x[i];
    mean /= static_cast<double>(rows.inner);
    for (int64_t i = 0; i < rows.inner; ++i)
      variance += (x[i] - mean) * (x[i] - mean);
    variance /= static_cast<double>(rows.inner);
    rows.means.push_back(mean);
    rows.invStds.push_back(1.0 / std::sqrt(variance + epsilon));
  }
  return rows;
}
} // namespace

Tensor layerNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale, int64_t axis,
                     double epsilon) {
  requireSameShape(dy, input, "dy and input differ");
  LayerNormRows rows = layerNormRows(input, axis, epsilon);
  if (broadcastTwo(scale.shape, rows.normalizedShape) != rows.normalizedShape)
    throw EvalError("scale of shape " + shapeToString(scale.shape) + " does not broadcast to " +
                    shapeToString(rows.normalizedShape));
  // g = dy * scale; dx = invStd * (g - mean(g) - xhat * mean(g * xhat)).
  std::vector<double> scaleFull(rows.inner);
  int64_t flat = 0;
  forEachIndex(rows.normalizedShape, [&](const std::vector<int64_t> &index) {
    scaleFull[flat++] = scale.floats[broadcastOffset(index, scale.shape)];
  });
  Tensor out = zeros(dy.kind, dy.shape);
  double count = static_cast<double>(rows.inner);
  for (int64_t row = 0; row < rows.outer; ++row) {
    int64_t base = row * rows.inner;
    double sumG = 0, sumGXhat = 0;
    for (int64_t i = 0; i < rows.inner; ++i) {
      double g = dy.floats[base + i] * scaleFull[i];
      double xhat = (input.floats[base + i] - rows.means[row]) * rows.invStds[row];
      sumG += g;
      sumGXhat += g * xhat;
    }
    for (int64_t i = 0; i < rows.inner; ++i) {
      double g = dy.floats[base + i] * scaleFull[i];
      double xhat = (input.floats[base + i] - rows.means[row]) * rows.invStds[row];
      out.floats[base + i] = rows.invStds[row] * (g - sumG / count - xhat * sumGXhat / count);
    }
  }
  return finish(std::move(out));
}

ParamGrads layerNormParamGrad(const Tensor &dy, const Tensor &input, int64_t axis,
                              double epsilon, const std::vector<int64_t> &scaleShape,
                              const std::vector<int64_t> &biasShape) {
  requireSameShape(dy, input, "dy and input differ");
  LayerNormRows rows = layerNormRows(input, axis, epsilon);
  std::vector<double> dscale(rows.inner, 0.0), dbias(rows.inner, 0.0);
  for (int64_t row = 0; row < rows.outer; ++row)
    for (int64_t i = 0; i < rows.inner; ++i) {
      int64_t flat = row * rows.inner + i;
      double xhat = (input.floats[flat] - rows.means[row]) * rows.invStds[row];
      dscale[i] += dy.floats[flat] * xhat;
      dbias[i] += dy.floats[flat];
    }
  ParamGrads grads{
      Tensor::ofFloats(dy.kind, scaleShape, sumToShape(dscale, rows.normalizedShape, scaleShape)),
      Tensor::ofFloats(dy.kind, biasShape, sumToShape(dbias, rows.normalizedShape, biasShape))};
  roundToElementType(grads.scale);
  roundToElementType(grads.bias);
  return grads;
}

Tensor maxPoolGrad(const Tensor &dy, const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   const std::vector<int64_t> &dilations, bool ceilMode) {
  requireFloating(dy, "dy");
  requireFloating(input, "the input");
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, ceilMode);
  if (dy.shape != pooledShape(input.shape, window))
    throw EvalError("dy " + shapeToString(dy.shape) + " is not the pooled shape " +
                    shapeToString(pooledShape(input.shape, window)));
  Tensor out = zeros(dy.kind, input.shape);
  forEachWindow(input.shape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  int64_t best = -1;
                  for (auto [offset, insidePadded] : positions)
                    if (offset >= 0 && (best < 0 || input.floats[offset] > input.floats[best]))
                      best = offset;
                  if (best >= 0)
                    out.floats[best] += dy.floats[flat];
                });
  return finish(std::move(out));
}

Tensor averagePoolGrad(const Tensor &dy, const std::vector<int64_t> &inputShape,
                       const std::vector<int64_t> &kernel, const std::vector<int64_t> &strides,
                       const std::vector<int64_t> &pads, bool ceilMode, bool countIncludePad) {
  requireFloating(dy, "dy");
  Window window = makeWindow(inputShape, kernel, strides, pads,
                             std::vector<int64_t>(kernel.size(), 1), ceilMode);
  if (dy.shape != pooledShape(inputShape, window))
    throw EvalError("dy " + shapeToString(dy.shape) + " is not the pooled shape " +
                    shapeToString(pooledShape(inputShape, window)));
  Tensor out = zeros(dy.kind, inputShape);
  forEachWindow(inputShape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  int64_t count = 0;
                  for (auto [offset, insidePadded] : positions)
                    if (countIncludePad ? insidePadded : offset >= 0)
                      ++count;
                  for (auto [offset, insidePadded] : positions)
                    if (offset >= 0)
                      out.floats[offset] += dy.floats[flat] / static_cast<double>(count);
                });
  return finish(std::move(out));
}

Tensor dropoutGrad(const Tensor &dy, const Tensor &mask, double ratio, bool training) {
  requireFloating(dy, "dy");
  if (mask.kind != ElementKind::Bool || mask.shape != dy.shape)
    throw EvalError("the mask must be bool of dy's shape " + shapeToString(dy.shape));
  if (!(ratio >= 0.0 && ratio < 1.0))
    throw EvalError("ratio must be in [0, 1), got " + std::to_string(ratio));
  Tensor out = dy;
  if (!training)
    return out;
  for (size_t i = 0; i < out.floats.size(); ++i)
    out.floats[i] = mask.ints[i] ? dy.floats[i] / (1.0 - ratio) : 0.0;
  return finish(std::move(out));
}

Tensor softmaxGrad(const Tensor &dy, const Tensor &y, int64_t axis) {
  requireFloating(dy, "dy");
  requireSameShape(dy, y, "dy and y differ");
  axis = normalizeAxis(axis, static_cast<int64_t>(dy.shape.size()));
  AxisView view = viewAround(dy.shape, axis);
  Tensor out = zeros(dy.kind, dy.shape);
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      double dot = 0;
      for (int64_t i = 0; i < view.size; ++i)
        dot += dy.floats[view.at(o, i, in)] * y.floats[view.at(o, i, in)];
      for (int64_t i = 0; i < view.size; ++i)
        out.floats[view.at(o, i, in)] =
            y.floats[view.at(o, i, in)] * (dy.floats[view.at(o, i, in)] - dot);
    }
  return finish(std::move(out));
}

Tensor softmaxCrossEntropyLossGrad(const Tensor &dloss, const Tensor &scores,
                                   const Tensor &labels, const Tensor *weights,
                                   const std::string &reduction,
                                   std::optional<int64_t> ignoreIndex) {
  std::vector<int64_t> labelShape = checkLossOperands(scores, labels, weights, reduction);
  int64_t classes = scores.shape[1];
  requireFloating(dloss, "dloss");
  std::vector<int64_t> lossShape = reduction == "none" ? labelShape : std::vector<int64_t>{};
  if (dloss.shape != lossShape)
    throw EvalError("dloss must have the loss's shape " + shapeToString(lossShape) + ", got " +
                    shapeToString(dloss.shape));

  std::vector<double> logProb = logSoftmax(scores, 1);
  AxisView view = viewAround(scores.shape, 1);
  // The weight of every element (0 when ignored) and, for mean, their sum.
  std::vector<double> elementWeights(labels.numElements(), 0.0);
  double weightSum = 0;
  for (int64_t flat = 0; flat < labels.numElements(); ++flat) {
    int64_t label = labels.ints[flat];
    if (ignoreIndex && label == *ignoreIndex)
      continue;
    if (label < 0 || label >= classes)
      throw EvalError("label " + std::to_string(label) + " out of range [0, " +
                      std::to_string(classes) + ")");
    elementWeights[flat] = weights ? weights->floats[label] : 1.0;
    weightSum += elementWeights[flat];
  }
  Tensor out = zeros(scores.kind, scores.shape);
  for (int64_t n = 0; n < view.outer; ++n)
    for (int64_t in = 0; in < view.inner; ++in) {
      int64_t flat = n * view.inner + in;
      if (elementWeights[flat] == 0.0)
        continue;
      double upstream = reduction == "none" ? dloss.floats[flat] : dloss.floats[0];
      double factor = upstream * elementWeights[flat] / (reduction == "mean" ? weightSum : 1.0);
      for (int64_t c = 0; c < classes; ++c) {
        double p = std::exp(logProb[view.at(n, c, in)]);
        out.floats[view.at(n, c, in)] = factor * (p - (c == labels.ints[flat] ? 1.0 : 0.0));
      }
    }
  return finish(std::move(out));
}

Tensor gatherGrad(const Tensor &dy, const Tensor &indices, int64_t axis,
                  const std::vector<int64_t> &dataShape) {
  requireFloating(dy, "dy");
  if (isFloating(indices.kind))
    throw EvalError("indices must be integers");
  axis = normalizeAxis(axis, static_cast<int64_t>(dataShape.size()));
  AxisView view = viewAround(dataShape, axis);
  std::vector<int64_t> dyShape(dataShape.begin(), dataShape.begin() + axis);
  dyShape.insert(dyShape.end(), indices.shape.begin(), indices.shape.end());
  dyShape.insert(dyShape.end(), dataShape.begin() + axis + 1, dataShape.end());
  if (dy.shape != dyShape)
    throw EvalError("dy must have the gather's result shape " + shapeToString(dyShape) +
                    ", got " + shapeToString(dy.shape));
  Tensor out = zeros(dy.kind, dataShape);
  int64_t count = indices.numElements(), flat = 0;
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      int64_t index = indices.ints[j];
      if (index < -view.size || index >= view.size)
        throw EvalError("index " + std::to_string(index) + " out of range for axis size " +
                        std::to_string(view.size));
      if (index < 0)
        index += view.size;
      for (int64_t in = 0; in < view.inner; ++in)
        out.floats[view.at(o, index, in)] += dy.floats[flat++];
    }
  return finish(std::move(out));
}

Tensor sliceGrad(const Tensor &dy, const std::vector<int64_t> &starts,
                 const std::vector<int64_t> &ends, const std::vector<int64_t> &steps,
                 const std::vector<int64_t> &inputShape) {
  requireFloating(dy, "dy");
  std::vector<int64_t> outShape = slicedShape(inputShape, starts, ends, steps);
  if (dy.shape != outShape)
    throw EvalError("dy must have the slice's result shape " + shapeToString(outShape) +
                    ", got " + shapeToString(dy.shape));
  std::vector<int64_t> inStrides = stridesOf(inputShape);
  Tensor out = zeros(dy.kind, inputShape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < inputShape.size(); ++axis)
      offset += (starts[axis] + index[axis] * steps[axis]) * inStrides[axis];
    out.floats[offset] += dy.floats[flat++];
  });
  return out;
}

//===----------------------------------------------------------------------===//
// Optimizers
//===----------------------------------------------------------------------===//

SgdResults sgdUpdate(const Tensor &param, const Tensor &grad, const Tensor &momentumBuffer,
                     int64_t step, double lr, double momentum, double weightDecay) {
  requireFloating(param, "the parameter");
  requireSameShape(param, grad, "param and grad differ");
  requireSameShape(param, momentumBuffer, "param and momentum buffer differ");
  if (step < 1)
    throw EvalError("step counts updates from 1, got " + std::to_string(step));
  SgdResults results{zeros(param.kind, param.shape), zeros(param.kind, param.shape)};
  for (size_t i = 0; i < param.floats.size(); ++i) {
    double g = grad.floats[i] + weightDecay * param.floats[i];
    double buffer =
        momentum == 0.0 || step == 1 ? g : momentum * momentumBuffer.floats[i] + g;
    results.momentumBuffer.floats[i] = buffer;
    results.param.floats[i] = param.floats[i] - lr * buffer;
  }
  roundToElementType(results.param);
  roundToElementType(results.momentumBuffer);
  return results;
}

AdamWResults adamwUpdate(const Tensor &param, const Tensor &grad, const Tensor &m,
                         const Tensor &v, int64_t step, double lr, double beta1, double beta2,
                         double epsilon, double weightDecay) {
  requireFloating(param, "the parameter");
  requireSameShape(param, grad, "param and grad differ");
  requireSameShape(param, m, "param and m differ");
  requireSameShape(param, v, "param and v differ");
  if (step < 1)
    throw EvalError("step counts updates from 1, got " + std::to_string(step));
  double t = static_cast<double>(step);
  double correction1 = 1.0 - std::pow(beta1, t), correction2 = 1.0 - std::pow(beta2, t);
  AdamWResults results{zeros(param.kind, param.shape), zeros(param.kind, param.shape),
                       zeros(param.kind, param.shape)};
  for (size_t i = 0; i < param.floats.size(); ++i) {
    double g = grad.floats[i];
    double decayed = param.floats[i] * (1.0 - lr * weightDecay);
    double mi = beta1 * m.floats[i] + (1.0 - beta1) * g;
    double vi = beta2 * v.floats[i] + (1.0 - beta2) * g * g;
    results.m.floats[i] = mi;
    results.v.floats[i] = vi;
    results.param.floats[i] =
        decayed - lr * (mi / correction1) / (std::sqrt(vi / correction2) + epsilon);
  }
  roundToElementType(results.param);
  roundToElementType(results.m);
  roundToElementType(results.v);
  return results;
}

} // namespace kernels
} // namespace pipec::eval
