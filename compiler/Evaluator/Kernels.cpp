// The reference kernels' common ground: the tensor basics Kernels.h declares
// and the helpers of KernelsInternal.h. The kernels themselves live in one
// file per op family (CMakeLists.txt lists them). Clarity over speed: each
// kernel is the textbook loop nest over multi-indices, so that a reader can
// check it against the ONNX specification line by line. Values are computed
// in double (int64 for integers) and rounded to the element type once, at
// the end of each kernel.
#include "compiler/Evaluator/KernelsInternal.h"

#include "llvm/ADT/APFloat.h"

#include <atomic>

namespace pipec::eval {

using import::isFloating;

namespace {
double roundTo(double value, const llvm::fltSemantics &semantics) {
  llvm::APFloat converted(value);
  bool losesInfo = false;
  converted.convert(semantics, llvm::APFloat::rmNearestTiesToEven, &losesInfo);
  return converted.convertToDouble();
}
} // namespace

Tensor zeros(ElementKind kind, std::vector<int64_t> shape) {
  Tensor tensor;
  tensor.kind = kind;
  tensor.shape = std::move(shape);
  if (isFloating(kind))
    tensor.floats.assign(detail::product(tensor.shape), 0.0);
  else
    tensor.ints.assign(detail::product(tensor.shape), 0);
  return tensor;
}

namespace {
std::atomic<bool> roundFloats{true};
} // namespace

void setFloatRounding(bool round) { roundFloats = round; }

void roundToElementType(Tensor &tensor) {
  if (!roundFloats && import::isFloating(tensor.kind))
    return;
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
      value = import::wrapInteger(tensor.kind, value);
  }
}

std::string shapeToString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

namespace detail {

int64_t product(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t axis = static_cast<int64_t>(shape.size()) - 2; axis >= 0; --axis)
    strides[axis] = strides[axis + 1] * shape[axis + 1];
  return strides;
}

bool nextIndex(std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  for (int64_t axis = static_cast<int64_t>(shape.size()) - 1; axis >= 0; --axis) {
    if (++index[axis] < shape[axis])
      return true;
    index[axis] = 0;
  }
  return false;
}

int64_t broadcastOffset(const std::vector<int64_t> &index, const std::vector<int64_t> &from) {
  size_t lead = index.size() - from.size();
  int64_t offset = 0;
  for (size_t axis = 0; axis < from.size(); ++axis)
    offset = offset * from[axis] + (from[axis] == 1 ? 0 : index[lead + axis]);
  return offset;
}

std::vector<int64_t> broadcastTwo(const std::vector<int64_t> &lhs,
                                  const std::vector<int64_t> &rhs) {
  try {
    return import::broadcastShape(lhs, rhs);
  } catch (const import::FoldError &) {
    throw EvalError("shapes " + shapeToString(lhs) + " and " + shapeToString(rhs) +
                    " do not broadcast");
  }
}

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

void requireSameShape(const Tensor &a, const Tensor &b, const char *what) {
  if (a.shape != b.shape || a.kind != b.kind)
    throw EvalError(std::string(what) + ": " + import::elementKindName(a.kind) +
                    shapeToString(a.shape) + " vs " + import::elementKindName(b.kind) +
                    shapeToString(b.shape));
}

int64_t normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    throw EvalError("axis " + std::to_string(axis) + " out of range for rank " +
                    std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

AxisView viewAround(const std::vector<int64_t> &shape, int64_t axis) {
  return {product(std::vector<int64_t>(shape.begin(), shape.begin() + axis)), shape[axis],
          product(std::vector<int64_t>(shape.begin() + axis + 1, shape.end()))};
}

} // namespace detail
} // namespace pipec::eval
