#include "compiler/Import/HostTensor.h"
#include "pipec/input_file.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

namespace pipec::import {

bool isFloating(ElementKind kind) {
  return kind == ElementKind::Float32 || kind == ElementKind::Float64 ||
         kind == ElementKind::Float16 || kind == ElementKind::BFloat16;
}

ElementKind trainingKind(ElementKind kind) {
  return isFloating(kind) ? ElementKind::Float32 : kind;
}

HostTensor inTrainingKind(const HostTensor &tensor) {
  HostTensor out = tensor;
  out.kind = trainingKind(tensor.kind);
  if (out.kind != tensor.kind)
    for (double &value : out.floats)
      value = static_cast<float>(value);
  return out;
}

const char *elementKindName(ElementKind kind) {
  switch (kind) {
  case ElementKind::Float32: return "float32";
  case ElementKind::Float64: return "float64";
  case ElementKind::Float16: return "float16";
  case ElementKind::BFloat16: return "bfloat16";
  case ElementKind::Int64: return "int64";
  case ElementKind::Int32: return "int32";
  case ElementKind::Int8: return "int8";
  case ElementKind::UInt8: return "uint8";
  case ElementKind::Bool: return "bool";
  }
  assert(false && "every ElementKind has its case in elementKindName");
  return "?";
}

static int64_t productOf(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

int64_t HostTensor::numElements() const { return productOf(shape); }

int64_t foldedElementCount(const std::vector<int64_t> &shape, const std::string &op) {
  for (int64_t dim : shape)
    if (dim < 0)
      throw FoldError(op + ": negative dimension " + std::to_string(dim) + " in shape " +
                      shapeText(shape));
  auto count = pipec::io::checkedElementCount(shape, kMaxFoldedElements);
  if (!count)
    throw FoldError(op + " would compute a tensor of shape " + shapeText(shape) +
                    ", more than " + std::to_string(kMaxFoldedElements) +
                    " elements (the limit for values computed at import time)");
  return *count;
}

double HostTensor::asDouble(int64_t index) const {
  return isFloating(kind) ? floats[index] : static_cast<double>(ints[index]);
}

/// A double truncated to int64: NaN as 0, saturated at int64's range (a plain
/// cast of NaN or of an out-of-range value is undefined behaviour).
static int64_t truncateToInt64(double value) {
  value = std::trunc(value);
  if (std::isnan(value))
    return 0;
  if (value >= 9.2233720368547758e18)
    return std::numeric_limits<int64_t>::max();
  if (value <= -9.2233720368547758e18)
    return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(value);
}

int64_t HostTensor::asInt(int64_t index) const {
  return isFloating(kind) ? truncateToInt64(floats[index]) : ints[index];
}

std::vector<int64_t> HostTensor::toInts() const {
  std::vector<int64_t> values(numElements());
  for (int64_t i = 0; i < numElements(); ++i)
    values[i] = asInt(i);
  return values;
}

HostTensor HostTensor::ofInts(ElementKind kind, std::vector<int64_t> shape,
                              std::vector<int64_t> values) {
  HostTensor tensor;
  tensor.kind = kind;
  tensor.shape = std::move(shape);
  tensor.ints = std::move(values);
  return tensor;
}

HostTensor HostTensor::ofFloats(ElementKind kind, std::vector<int64_t> shape,
                                std::vector<double> values) {
  HostTensor tensor;
  tensor.kind = kind;
  tensor.shape = std::move(shape);
  tensor.floats = std::move(values);
  return tensor;
}

std::vector<int64_t> broadcastShape(const std::vector<int64_t> &lhs,
                                    const std::vector<int64_t> &rhs) {
  size_t rank = std::max(lhs.size(), rhs.size());
  std::vector<int64_t> result(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t l = i < rank - lhs.size() ? 1 : lhs[i - (rank - lhs.size())];
    int64_t r = i < rank - rhs.size() ? 1 : rhs[i - (rank - rhs.size())];
    if (l < 0 || r < 0)
      throw FoldError("negative dimension in shapes " + shapeText(lhs) + " and " + shapeText(rhs));
    if (l != r && l != 1 && r != 1)
      throw FoldError("shapes do not broadcast");
    result[i] = l == 1 ? r : l;
  }
  return result;
}

void copyElement(HostTensor &to, int64_t toIndex, const HostTensor &from, int64_t fromIndex) {
  if (isFloating(from.kind))
    to.floats[toIndex] = from.floats[fromIndex];
  else
    to.ints[toIndex] = from.ints[fromIndex];
}

std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

namespace {

/// Index into `from` (broadcast to `to`) of the element at flat index `flat` of `to`.
int64_t broadcastSourceIndex(int64_t flat, const std::vector<int64_t> &to,
                             const std::vector<int64_t> &from) {
  int64_t index = 0, stride = 1;
  size_t offset = to.size() - from.size();
  for (int64_t axis = static_cast<int64_t>(to.size()) - 1; axis >= 0; --axis) {
    int64_t coordinate = flat % to[axis];
    flat /= to[axis];
    if (axis >= static_cast<int64_t>(offset)) {
      int64_t dim = from[axis - offset];
      if (dim != 1)
        index += coordinate * stride;
      stride *= dim;
    }
  }
  return index;
}

/// Builds a tensor of `kind` and `shape` whose element i is copied from
/// element source(i) of `input`; `op` names the operator in errors.
HostTensor gatherElements(const char *op, const HostTensor &input, std::vector<int64_t> shape,
                          const std::function<int64_t(int64_t)> &source) {
  HostTensor out;
  out.kind = input.kind;
  out.shape = std::move(shape);
  int64_t count = foldedElementCount(out.shape, op);
  if (isFloating(input.kind)) {
    out.floats.resize(count);
    for (int64_t i = 0; i < count; ++i)
      out.floats[i] = input.floats[source(i)];
  } else {
    out.ints.resize(count);
    for (int64_t i = 0; i < count; ++i)
      out.ints[i] = input.ints[source(i)];
  }
  return out;
}

int64_t normalizedAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    throw FoldError("axis " + std::to_string(axis) + " out of range for rank " +
                    std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

} // namespace

int64_t wrapInteger(ElementKind kind, int64_t value) {
  switch (kind) {
  case ElementKind::Int32: return static_cast<int32_t>(static_cast<uint32_t>(value));
  case ElementKind::Int8: return static_cast<int8_t>(static_cast<uint8_t>(value));
  case ElementKind::UInt8: return static_cast<uint8_t>(value);
  case ElementKind::Bool: return value != 0;
  default: return value;
  }
}

namespace {

/// The lowest and highest value of integer kind `kind` (Bool: 0 and 1).
std::pair<int64_t, int64_t> integerRange(ElementKind kind) {
  switch (kind) {
  case ElementKind::Int32: return {INT32_MIN, INT32_MAX};
  case ElementKind::Int8: return {INT8_MIN, INT8_MAX};
  case ElementKind::UInt8: return {0, UINT8_MAX};
  case ElementKind::Bool: return {0, 1};
  default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

/// The result of integer arithmetic `op` (nullopt: it overflowed int64) in
/// the element type `kind`; an overflow of either is a FoldError, never a
/// silently wrapped value.
int64_t checkedResult(ElementKind kind, std::optional<int64_t> value, const std::string &op,
                      int64_t a, int64_t b) {
  if (kind == ElementKind::Bool)
    return value.value_or(1) != 0;
  const auto [low, high] = integerRange(kind);
  if (!value || *value < low || *value > high)
    throw FoldError(std::string(elementKindName(kind)) + " overflow in " + op + " of " +
                    std::to_string(a) + " and " + std::to_string(b));
  return *value;
}

/// a^b on integers by repeated squaring, nullopt on overflow; b >= 0.
std::optional<int64_t> checkedPower(int64_t a, int64_t b) {
  int64_t result = 1, base = a;
  while (true) {
    if (b & 1) {
      auto next = pipec::io::checkedMul(result, base);
      if (!next) return std::nullopt;
      result = *next;
    }
    b >>= 1;
    if (!b) return result;
    auto squared = pipec::io::checkedMul(base, base);
    if (!squared) return std::nullopt;
    base = *squared;
  }
}

/// One element of integer binary arithmetic, checked.
int64_t integerBinary(const std::string &op, ElementKind kind, int64_t a, int64_t b) {
  using pipec::io::checkedAdd;
  using pipec::io::checkedMul;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  if (op == "Add") return checkedResult(kind, checkedAdd(a, b), op, a, b);
  if (op == "Sub") {
    int64_t out;
    return checkedResult(kind, __builtin_sub_overflow(a, b, &out) ? std::nullopt
                                                                  : std::optional<int64_t>(out),
                         op, a, b);
  }
  if (op == "Mul") return checkedResult(kind, checkedMul(a, b), op, a, b);
  if (op == "Div") {
    if (b == 0)
      throw FoldError("integer division by zero (" + std::to_string(a) + " / 0)");
    if (a == kMin && b == -1)
      return checkedResult(kind, std::nullopt, op, a, b);
    return checkedResult(kind, a / b, op, a, b); // ONNX integer Div truncates like C
  }
  if (op == "Mod" || op == "FMod") {
    if (b == 0)
      throw FoldError("integer modulo by zero (" + std::to_string(a) + " mod 0)");
    int64_t r = b == -1 ? 0 : a % b; // INT64_MIN % -1 traps in C
    // fmod=0 (Mod): the result takes the sign of the divisor; fmod=1 (FMod)
    // that of the dividend, like C. r and b have opposite signs here, so
    // r + b cannot overflow.
    if (op == "Mod" && r != 0 && (r < 0) != (b < 0))
      r += b;
    return r;
  }
  if (op == "Pow") {
    if (b < 0) {
      if (a == 1) return 1;
      if (a == -1) return (b % 2) ? -1 : 1;
      throw FoldError("integer Pow with the negative exponent " + std::to_string(b));
    }
    return checkedResult(kind, checkedPower(a, b), op, a, b);
  }
  if (op == "Max") return std::max(a, b);
  if (op == "Min") return std::min(a, b);
  if (op == "Equal") return a == b;
  if (op == "Less") return a < b;
  if (op == "Greater") return a > b;
  if (op == "LessOrEqual") return a <= b;
  if (op == "GreaterOrEqual") return a >= b;
  if (op == "And") return a && b;
  if (op == "Or") return a || b;
  if (op == "Xor") return (a != 0) != (b != 0);
  throw FoldError("cannot fold " + op + " on integers");
}

/// A floating-point value converted to an integer element type: truncated,
/// NaN as 0, saturated at the type's range (as the reference evaluator does).
int64_t floatToInteger(double value, ElementKind to) {
  if (to == ElementKind::Bool)
    return value != 0.0;
  int64_t out = truncateToInt64(value);
  switch (to) {
  case ElementKind::Int32: return std::clamp<int64_t>(out, INT32_MIN, INT32_MAX);
  case ElementKind::Int8: return std::clamp<int64_t>(out, INT8_MIN, INT8_MAX);
  case ElementKind::UInt8: return std::clamp<int64_t>(out, 0, UINT8_MAX);
  default: return out;
  }
}
} // namespace

namespace fold {

HostTensor cast(const HostTensor &input, ElementKind to) {
  HostTensor out;
  out.kind = to;
  out.shape = input.shape;
  int64_t count = input.numElements();
  if (isFloating(to)) {
    out.floats.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      double value = input.asDouble(i);
      out.floats[i] = to == ElementKind::Float64 ? value : static_cast<float>(value);
    }
  } else {
    out.ints.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      if (isFloating(input.kind)) {
        out.ints[i] = floatToInteger(input.floats[i], to);
      } else {
        out.ints[i] = wrapInteger(to, input.ints[i]);
      }
    }
  }
  return out;
}

HostTensor binary(const std::string &op, const HostTensor &lhs, const HostTensor &rhs) {
  if (lhs.kind != rhs.kind && op != "Pow")
    throw FoldError(std::string("operand element types differ (") +
                    elementKindName(lhs.kind) + " vs " + elementKindName(rhs.kind) + ")");
  std::vector<int64_t> shape = broadcastShape(lhs.shape, rhs.shape);
  bool comparison = op == "Equal" || op == "Less" || op == "Greater" ||
                    op == "LessOrEqual" || op == "GreaterOrEqual";
  bool logical = op == "And" || op == "Or" || op == "Xor";
  HostTensor out;
  out.shape = shape;
  out.kind = comparison || logical ? ElementKind::Bool : lhs.kind;
  int64_t count = foldedElementCount(shape, op);
  bool floating = isFloating(lhs.kind);
  if (floating && !comparison)
    out.floats.reserve(count);
  else
    out.ints.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    int64_t li = broadcastSourceIndex(i, shape, lhs.shape);
    int64_t ri = broadcastSourceIndex(i, shape, rhs.shape);
    if (floating) {
      double a = lhs.floats[li], b = rhs.asDouble(ri);
      double value;
      if (op == "Add") value = a + b;
      else if (op == "Sub") value = a - b;
      else if (op == "Mul") value = a * b;
      else if (op == "Div") value = a / b;
      else if (op == "Pow") value = std::pow(a, b);
      else if (op == "FMod") value = std::fmod(a, b);
      else if (op == "Max") value = std::max(a, b);
      else if (op == "Min") value = std::min(a, b);
      else if (op == "Equal") { out.ints.push_back(a == b); continue; }
      else if (op == "Less") { out.ints.push_back(a < b); continue; }
      else if (op == "Greater") { out.ints.push_back(a > b); continue; }
      else if (op == "LessOrEqual") { out.ints.push_back(a <= b); continue; }
      else if (op == "GreaterOrEqual") { out.ints.push_back(a >= b); continue; }
      else throw FoldError("cannot fold " + op + " on floating point");
      out.floats.push_back(lhs.kind == ElementKind::Float64 ? value
                                                             : static_cast<float>(value));
    } else {
      int64_t a = lhs.ints[li], b = rhs.asInt(ri);
      out.ints.push_back(wrapInteger(out.kind, integerBinary(op, out.kind, a, b)));
    }
  }
  return out;
}

HostTensor unary(const std::string &op, const HostTensor &input) {
  HostTensor out = input;
  int64_t count = input.numElements();
  if (op == "Not") {
    if (input.kind != ElementKind::Bool)
      throw FoldError("Not needs a bool tensor");
    for (auto &value : out.ints)
      value = !value;
    return out;
  }
  if (op == "IsNaN") {
    if (!isFloating(input.kind))
      throw FoldError("IsNaN needs a floating-point tensor");
    std::vector<int64_t> flags;
    for (double x : input.floats)
      flags.push_back(std::isnan(x));
    return HostTensor::ofInts(ElementKind::Bool, input.shape, flags);
  }
  if (isFloating(input.kind)) {
    for (int64_t i = 0; i < count; ++i) {
      double x = input.floats[i], value;
      if (op == "Neg") value = -x;
      else if (op == "Abs") value = std::fabs(x);
      else if (op == "Sqrt") value = std::sqrt(x);
      else if (op == "Reciprocal") value = 1.0 / x;
      else if (op == "Floor") value = std::floor(x);
      else if (op == "Ceil") value = std::ceil(x);
      else if (op == "Round") value = std::nearbyint(x); // halves to even
      else if (op == "Exp") value = std::exp(x);
      else if (op == "Log") value = std::log(x);
      else if (op == "Relu") value = std::max(x, 0.0);
      else throw FoldError("cannot fold " + op);
      out.floats[i] = input.kind == ElementKind::Float64 ? value : static_cast<float>(value);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      int64_t x = input.ints[i];
      if (op == "Neg") out.ints[i] = integerBinary("Sub", input.kind, 0, x);
      else if (op == "Abs") out.ints[i] = x < 0 ? integerBinary("Sub", input.kind, 0, x) : x;
      else if (op == "Relu") out.ints[i] = std::max<int64_t>(x, 0);
      else if (op == "Floor" || op == "Ceil" || op == "Round") out.ints[i] = x;
      else throw FoldError("cannot fold " + op + " on integers");
    }
  }
  return out;
}

HostTensor where(const HostTensor &condition, const HostTensor &x, const HostTensor &y) {
  if (x.kind != y.kind)
    throw FoldError("Where: x and y element types differ");
  std::vector<int64_t> shape =
      broadcastShape(condition.shape, broadcastShape(x.shape, y.shape));
  HostTensor out;
  out.kind = x.kind;
  out.shape = shape;
  int64_t count = foldedElementCount(shape, "Where");
  for (int64_t i = 0; i < count; ++i) {
    bool pick = condition.asInt(broadcastSourceIndex(i, shape, condition.shape)) != 0;
    const HostTensor &from = pick ? x : y;
    int64_t index = broadcastSourceIndex(i, shape, from.shape);
    if (isFloating(out.kind))
      out.floats.push_back(from.floats[index]);
    else
      out.ints.push_back(from.ints[index]);
  }
  return out;
}

HostTensor gather(const HostTensor &data, const HostTensor &indices, int64_t axis) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  axis = normalizedAxis(axis, rank);
  int64_t axisSize = data.shape[axis];
  std::vector<int64_t> shape(data.shape.begin(), data.shape.begin() + axis);
  shape.insert(shape.end(), indices.shape.begin(), indices.shape.end());
  shape.insert(shape.end(), data.shape.begin() + axis + 1, data.shape.end());
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < rank; ++d)
    inner *= data.shape[d];
  if (isFloating(indices.kind))
    throw FoldError("Gather indices must be integers, not " +
                    std::string(elementKindName(indices.kind)));
  int64_t indexCount = indices.numElements();
  std::vector<int64_t> resolved(indexCount);
  for (int64_t i = 0; i < indexCount; ++i) {
    int64_t index = indices.asInt(i);
    if (index < -axisSize || index >= axisSize)
      throw FoldError("Gather index " + std::to_string(index) + " out of range for size " +
                      std::to_string(axisSize));
    resolved[i] = index < 0 ? index + axisSize : index;
  }
  return gatherElements("Gather", data, shape, [&](int64_t flat) {
    int64_t innerIndex = flat % inner;
    int64_t rest = flat / inner;
    int64_t indexPosition = rest % indexCount;
    int64_t outer = rest / indexCount;
    return (outer * axisSize + resolved[indexPosition]) * inner + innerIndex;
  });
}

HostTensor concat(const std::vector<const HostTensor *> &inputs, int64_t axis) {
  if (inputs.empty())
    throw FoldError("Concat of nothing");
  const HostTensor &first = *inputs.front();
  int64_t rank = static_cast<int64_t>(first.shape.size());
  axis = normalizedAxis(axis, rank);
  std::vector<int64_t> shape = first.shape;
  shape[axis] = 0;
  for (const HostTensor *input : inputs) {
    if (input->kind != first.kind || input->shape.size() != first.shape.size())
      throw FoldError("Concat inputs differ in element type or rank");
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && input->shape[d] != first.shape[d])
        throw FoldError("Concat inputs differ outside the axis");
    auto sum = pipec::io::checkedAdd(shape[axis], input->shape[axis]);
    if (!sum)
      throw FoldError("Concat result size overflows");
    shape[axis] = *sum;
  }
  HostTensor out;
  out.kind = first.kind;
  out.shape = shape;
  int64_t count = foldedElementCount(shape, "Concat");
  if (isFloating(out.kind))
    out.floats.reserve(count);
  else
    out.ints.reserve(count);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d)
    inner *= shape[d];
  for (int64_t o = 0; o < outer; ++o)
    for (const HostTensor *input : inputs) {
      int64_t block = input->shape[axis] * inner;
      if (isFloating(out.kind))
        out.floats.insert(out.floats.end(), input->floats.begin() + o * block,
                          input->floats.begin() + (o + 1) * block);
      else
        out.ints.insert(out.ints.end(), input->ints.begin() + o * block,
                        input->ints.begin() + (o + 1) * block);
    }
  return out;
}

HostTensor reshape(const HostTensor &input, std::vector<int64_t> shape) {
  auto count = pipec::io::checkedElementCount(shape);
  if (!count || *count != input.numElements())
    throw FoldError("Reshape of " + shapeText(input.shape) + " to " + shapeText(shape) +
                    " changes the element count");
  HostTensor out = input;
  out.shape = std::move(shape);
  return out;
}

HostTensor transpose(const HostTensor &input, const std::vector<int64_t> &perm) {
  size_t rank = input.shape.size();
  if (perm.size() != rank)
    throw FoldError("Transpose perm has the wrong length");
  std::vector<bool> seen(rank, false);
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[axis])
      throw FoldError("Transpose perm " + shapeText(perm) + " is not a permutation");
    seen[axis] = true;
  }
  std::vector<int64_t> shape(rank);
  for (size_t d = 0; d < rank; ++d)
    shape[d] = input.shape[perm[d]];
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  return gatherElements("Transpose", input, shape, [&](int64_t flat) {
    int64_t source = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      source += (flat % shape[d]) * inStrides[perm[d]];
      flat /= shape[d];
    }
    return source;
  });
}

HostTensor slice(const HostTensor &input, const std::vector<int64_t> &starts,
                 const std::vector<int64_t> &ends, const std::vector<int64_t> &steps) {
  size_t rank = input.shape.size();
  if (starts.size() != rank || ends.size() != rank || steps.size() != rank)
    throw FoldError("Slice bounds do not match the rank");
  std::vector<int64_t> shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    if (steps[d] == 0)
      throw FoldError("Slice step 0");
    // In 128 bits: a step near INT64_MIN or bounds far apart must not overflow.
    __int128 start = starts[d], end = ends[d], step = steps[d];
    __int128 size = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / (-step);
    if (size > 0 && (start < 0 || start >= input.shape[d] || start + (size - 1) * step < 0 ||
                     start + (size - 1) * step >= input.shape[d]))
      throw FoldError("Slice bounds lie outside dimension " + std::to_string(d));
    shape[d] = size > 0 ? static_cast<int64_t>(size) : 0;
  }
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  return gatherElements("Slice", input, shape, [&](int64_t flat) {
    int64_t source = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      source += (starts[d] + (flat % shape[d]) * steps[d]) * inStrides[d];
      flat /= shape[d];
    }
    return source;
  });
}

HostTensor expand(const HostTensor &input, const std::vector<int64_t> &shape) {
  for (int64_t dim : shape)
    if (dim < 0)
      throw FoldError("Expand to the negative dimension " + std::to_string(dim) + " in " +
                      shapeText(shape));
  std::vector<int64_t> out = broadcastShape(input.shape, shape);
  return gatherElements("Expand", input, out, [&](int64_t flat) {
    return broadcastSourceIndex(flat, out, input.shape);
  });
}

HostTensor range(const HostTensor &start, const HostTensor &limit, const HostTensor &delta) {
  if (start.numElements() != 1 || limit.numElements() != 1 || delta.numElements() != 1)
    throw FoldError("Range needs scalar operands");
  if (start.kind != limit.kind || start.kind != delta.kind)
    throw FoldError("Range operands differ in element type");
  auto tooMany = [](const std::string &count) {
    return FoldError("Range would compute " + count + " elements, more than " +
                     std::to_string(kMaxFoldedElements) +
                     " (the limit for values computed at import time)");
  };
  HostTensor out;
  out.kind = start.kind;
  int64_t count = 0;
  if (isFloating(start.kind)) {
    double first = start.floats[0], last = limit.floats[0], step = delta.floats[0];
    if (step == 0)
      throw FoldError("Range with delta 0");
    double size = std::ceil((last - first) / step);
    if (!std::isfinite(size) && !(size < 0))
      throw FoldError("Range(" + std::to_string(first) + ", " + std::to_string(last) + ", " +
                      std::to_string(step) + ") has no finite size");
    if (size > static_cast<double>(kMaxFoldedElements))
      throw tooMany(std::to_string(size));
    count = size > 0 ? static_cast<int64_t>(size) : 0;
    out.floats.reserve(count);
    for (int64_t i = 0; i < count; ++i)
      out.floats.push_back(first + i * step);
  } else {
    // Exactly, in 128 bits: ceil((limit - start) / delta).
    __int128 first = start.ints[0], last = limit.ints[0], step = delta.ints[0];
    if (step == 0)
      throw FoldError("Range with delta 0");
    __int128 distance = last - first;
    __int128 size = step > 0 ? (distance + step - 1) / step : (distance + step + 1) / step;
    if (size > kMaxFoldedElements)
      throw tooMany(size > std::numeric_limits<int64_t>::max()
                        ? "more than 2^63"
                        : std::to_string(static_cast<int64_t>(size)));
    count = size > 0 ? static_cast<int64_t>(size) : 0;
    out.ints.reserve(count);
    // Every value lies between start and limit, so it fits the element type.
    for (int64_t i = 0; i < count; ++i)
      out.ints.push_back(static_cast<int64_t>(first + i * step));
  }
  out.shape = {count};
  return out;
}

HostTensor reduce(const std::string &op, const HostTensor &input, const std::vector<int64_t> &axes,
                  bool keepdims) {
  const int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : axes) {
    if (axis < 0 || axis >= rank)
      throw FoldError(op + ": axis " + std::to_string(axis) + " out of range for rank " +
                      std::to_string(rank));
    reduced[axis] = true;
  }
  std::vector<int64_t> kept(input.shape), outShape; // kept: 1 on the reduced axes
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (reduced[axis])
      kept[axis] = 1;
    if (!reduced[axis] || keepdims)
      outShape.push_back(kept[axis]);
  }
  const int64_t outCount = foldedElementCount(outShape, op);
  const bool floating = isFloating(input.kind);
  const bool extreme = op == "ReduceMax" || op == "ReduceMin";
  if (!floating && !extreme && op != "ReduceSum" && op != "ReduceProd" && op != "ReduceSumSquare" &&
      op != "ReduceL1")
    throw FoldError(op + " of " + elementKindName(input.kind) + " values is not folded");
  // Each input element's output position: its index with the reduced axes at 0.
  const std::vector<int64_t> inStrides = stridesOf(input.shape), outStrides = stridesOf(kept);
  const int64_t count = input.numElements();
  auto outIndex = [&](int64_t flat) {
    int64_t index = 0;
    for (int64_t axis = 0; axis < rank; ++axis)
      if (!reduced[axis])
        index += (flat / inStrides[axis]) % input.shape[axis] * outStrides[axis];
    return index;
  };
  HostTensor out;
  out.kind = input.kind;
  out.shape = outShape;
  if (floating) {
    const double start = op == "ReduceMax"   ? -INFINITY
                         : op == "ReduceMin" ? INFINITY
                         : op == "ReduceProd" ? 1.0
                                              : 0.0;
    std::vector<double> peak(outCount, -INFINITY);
    if (op == "ReduceLogSumExp") { // shifted by the maximum, as the run-time lowering
      for (int64_t flat = 0; flat < count; ++flat)
        peak[outIndex(flat)] = std::max(peak[outIndex(flat)], input.floats[flat]);
      for (double &shift : peak) // an infinite maximum shifts nothing: -inf or +inf results
        shift = std::isinf(shift) ? 0.0 : shift;
    }
    std::vector<double> acc(outCount, start);
    std::vector<int64_t> members(outCount, 0);
    for (int64_t flat = 0; flat < count; ++flat) {
      double x = input.floats[flat], &a = acc[outIndex(flat)];
      ++members[outIndex(flat)];
      if (op == "ReduceMax") a = std::max(a, x);
      else if (op == "ReduceMin") a = std::min(a, x);
      else if (op == "ReduceProd") a *= x;
      else if (op == "ReduceSumSquare" || op == "ReduceL2") a += x * x;
      else if (op == "ReduceL1") a += std::fabs(x);
      else if (op == "ReduceLogSumExp") a += std::exp(x - peak[outIndex(flat)]);
      else a += x; // ReduceSum, ReduceMean, ReduceLogSum
    }
    for (int64_t i = 0; i < outCount; ++i) {
      double &a = acc[i];
      if (op == "ReduceMean") a = members[i] ? a / members[i] : NAN;
      else if (op == "ReduceL2") a = std::sqrt(a);
      else if (op == "ReduceLogSum") a = std::log(a);
      else if (op == "ReduceLogSumExp") a = std::log(a) + peak[i]; // log 0 = -inf for nothing
      out.floats.push_back(input.kind == ElementKind::Float64 ? a : static_cast<float>(a));
    }
    return out;
  }
  // The identities of Max and Min: the kind's extremes (an empty reduction keeps them).
  const auto [lowest, highest] = integerRange(input.kind);
  const int64_t start = op == "ReduceMax"   ? lowest
                        : op == "ReduceMin" ? highest
                        : op == "ReduceProd" ? 1
                                             : 0;
  std::vector<int64_t> acc(outCount, start);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t x = input.ints[flat], &a = acc[outIndex(flat)];
    std::optional<int64_t> next;
    if (op == "ReduceMax") next = std::max(a, x);
    else if (op == "ReduceMin") next = std::min(a, x);
    else if (op == "ReduceProd") next = pipec::io::checkedMul(a, x);
    else if (op == "ReduceSumSquare") {
      std::optional<int64_t> square = pipec::io::checkedMul(x, x);
      next = square ? pipec::io::checkedAdd(a, *square) : std::nullopt;
    }
    else if (op == "ReduceL1")
      next = x == std::numeric_limits<int64_t>::min() ? std::nullopt
                                                      : pipec::io::checkedAdd(a, x < 0 ? -x : x);
    else next = pipec::io::checkedAdd(a, x);
    if (!next)
      throw FoldError(op + ": int64 overflow");
    a = *next;
  }
  for (int64_t value : acc) {
    if (value < lowest || value > highest)
      throw FoldError(op + ": " + std::to_string(value) + " overflows " +
                      elementKindName(input.kind));
    out.ints.push_back(value);
  }
  return out;
}

} // namespace fold

std::vector<int64_t> resolveReshape(const std::vector<int64_t> &input,
                                    const std::vector<int64_t> &target, bool allowZero) {
  std::vector<int64_t> shape = target;
  int64_t inferred = -1, known = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0 && !allowZero) {
      if (d >= input.size())
        throw FoldError("target dimension " + std::to_string(d) +
                        " is 0 (copy) but the input has rank " + std::to_string(input.size()));
      shape[d] = input[d];
    }
    if (shape[d] == -1) {
      if (inferred >= 0)
        throw FoldError("target shape has more than one -1");
      inferred = static_cast<int64_t>(d);
    } else if (shape[d] < 0) {
      throw FoldError("target dimension " + std::to_string(shape[d]) + " is negative");
    } else {
      auto product = pipec::io::checkedMul(known, shape[d]);
      if (!product)
        throw FoldError("target shape " + shapeText(target) + " overflows int64");
      known = *product;
    }
  }
  auto inputCount = pipec::io::checkedElementCount(input);
  if (!inputCount)
    throw FoldError("input shape " + shapeText(input) + " overflows int64");
  int64_t total = *inputCount;
  if (inferred >= 0) {
    if (known == 0 || total % known)
      throw FoldError("cannot infer the -1 dimension: " + std::to_string(total) +
                      " elements do not divide by " + std::to_string(known));
    shape[inferred] = total / known;
  } else if (known != total) {
    throw FoldError("target has " + std::to_string(known) + " elements, input " +
                    std::to_string(total));
  }
  return shape;
}

std::pair<int64_t, int64_t> normalizeSliceBounds(int64_t start, int64_t end, int64_t step,
                                                 int64_t dim) {
  if (dim <= 0)
    return {0, 0}; // nothing to take (and no valid clamp range for a negative step)
  if (start < 0)
    start += dim;
  if (end < 0)
    end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  return {start, end};
}

} // namespace pipec::import
