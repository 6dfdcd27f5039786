#include "compiler/Import/HostTensor.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace pipec::import {

bool isFloating(ElementKind kind) {
  return kind == ElementKind::Float32 || kind == ElementKind::Float64 ||
         kind == ElementKind::Float16 || kind == ElementKind::BFloat16;
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
  return "?";
}

static int64_t productOf(const std::vector<int64_t> &shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

int64_t HostTensor::numElements() const { return productOf(shape); }

double HostTensor::asDouble(int64_t index) const {
  return isFloating(kind) ? floats[index] : static_cast<double>(ints[index]);
}

int64_t HostTensor::asInt(int64_t index) const {
  return isFloating(kind) ? static_cast<int64_t>(floats[index]) : ints[index];
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
    if (l != r && l != 1 && r != 1)
      throw FoldError("shapes do not broadcast");
    result[i] = l == 1 ? r : l;
  }
  return result;
}

namespace {
std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

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
/// element source(i) of `input`.
HostTensor gatherElements(const HostTensor &input, std::vector<int64_t> shape,
                          const std::function<int64_t(int64_t)> &source) {
  HostTensor out;
  out.kind = input.kind;
  out.shape = std::move(shape);
  int64_t count = out.numElements();
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

int64_t wrapInteger(ElementKind kind, int64_t value) {
  switch (kind) {
  case ElementKind::Int32: return static_cast<int32_t>(value);
  case ElementKind::Int8: return static_cast<int8_t>(value);
  case ElementKind::UInt8: return static_cast<uint8_t>(value);
  case ElementKind::Bool: return value != 0;
  default: return value;
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
        double value = input.floats[i];
        out.ints[i] = to == ElementKind::Bool ? value != 0.0
                                              : wrapInteger(to, static_cast<int64_t>(value));
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
  bool logical = op == "And" || op == "Or";
  HostTensor out;
  out.shape = shape;
  out.kind = comparison || logical ? ElementKind::Bool : lhs.kind;
  int64_t count = productOf(shape);
  bool floating = isFloating(lhs.kind);
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
      int64_t value;
      if (op == "Add") value = a + b;
      else if (op == "Sub") value = a - b;
      else if (op == "Mul") value = a * b;
      else if (op == "Div") {
        if (b == 0)
          throw FoldError("integer division by zero");
        value = a / b; // ONNX integer Div truncates like C
      } else if (op == "Mod") {
        if (b == 0)
          throw FoldError("integer modulo by zero");
        value = ((a % b) + b) % b; // fmod=0: sign of the divisor
      } else if (op == "Pow") value = static_cast<int64_t>(std::pow(a, b));
      else if (op == "Max") value = std::max(a, b);
      else if (op == "Min") value = std::min(a, b);
      else if (op == "Equal") value = a == b;
      else if (op == "Less") value = a < b;
      else if (op == "Greater") value = a > b;
      else if (op == "LessOrEqual") value = a <= b;
      else if (op == "GreaterOrEqual") value = a >= b;
      else if (op == "And") value = a && b;
      else if (op == "Or") value = a || b;
      else throw FoldError("cannot fold " + op + " on integers");
      out.ints.push_back(wrapInteger(out.kind, value));
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
  if (isFloating(input.kind)) {
    for (int64_t i = 0; i < count; ++i) {
      double x = input.floats[i], value;
      if (op == "Neg") value = -x;
      else if (op == "Abs") value = std::fabs(x);
      else if (op == "Sqrt") value = std::sqrt(x);
      else if (op == "Reciprocal") value = 1.0 / x;
      else if (op == "Floor") value = std::floor(x);
      else if (op == "Ceil") value = std::ceil(x);
      else if (op == "Exp") value = std::exp(x);
      else if (op == "Log") value = std::log(x);
      else if (op == "Relu") value = std::max(x, 0.0);
      else throw FoldError("cannot fold " + op);
      out.floats[i] = input.kind == ElementKind::Float64 ? value : static_cast<float>(value);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      int64_t x = input.ints[i];
      if (op == "Neg") out.ints[i] = wrapInteger(input.kind, -x);
      else if (op == "Abs") out.ints[i] = wrapInteger(input.kind, x < 0 ? -x : x);
      else if (op == "Relu") out.ints[i] = std::max<int64_t>(x, 0);
      else if (op == "Floor" || op == "Ceil") out.ints[i] = x;
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
  int64_t count = productOf(shape);
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
  int64_t indexCount = indices.numElements();
  std::vector<int64_t> resolved(indexCount);
  for (int64_t i = 0; i < indexCount; ++i) {
    int64_t index = indices.asInt(i);
    if (index < -axisSize || index >= axisSize)
      throw FoldError("Gather index " + std::to_string(index) + " out of range for size " +
                      std::to_string(axisSize));
    resolved[i] = index < 0 ? index + axisSize : index;
  }
  return gatherElements(data, shape, [&](int64_t flat) {
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
    shape[axis] += input->shape[axis];
  }
  HostTensor out;
  out.kind = first.kind;
  out.shape = shape;
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
  if (productOf(shape) != input.numElements())
    throw FoldError("Reshape changes the element count");
  HostTensor out = input;
  out.shape = std::move(shape);
  return out;
}

HostTensor transpose(const HostTensor &input, const std::vector<int64_t> &perm) {
  size_t rank = input.shape.size();
  if (perm.size() != rank)
    throw FoldError("Transpose perm has the wrong length");
  std::vector<int64_t> shape(rank);
  for (size_t d = 0; d < rank; ++d)
    shape[d] = input.shape[perm[d]];
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  return gatherElements(input, shape, [&](int64_t flat) {
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
  std::vector<int64_t> shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    int64_t size = steps[d] > 0 ? (ends[d] - starts[d] + steps[d] - 1) / steps[d]
                                : (starts[d] - ends[d] - steps[d] - 1) / (-steps[d]);
    shape[d] = std::max<int64_t>(size, 0);
  }
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  return gatherElements(input, shape, [&](int64_t flat) {
    int64_t source = 0;
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      source += (starts[d] + (flat % shape[d]) * steps[d]) * inStrides[d];
      flat /= shape[d];
    }
    return source;
  });
}

HostTensor expand(const HostTensor &input, const std::vector<int64_t> &shape) {
  std::vector<int64_t> out = broadcastShape(input.shape, shape);
  return gatherElements(input, out, [&](int64_t flat) {
    return broadcastSourceIndex(flat, out, input.shape);
  });
}

HostTensor range(const HostTensor &start, const HostTensor &limit, const HostTensor &delta) {
  if (start.numElements() != 1 || limit.numElements() != 1 || delta.numElements() != 1)
    throw FoldError("Range needs scalar operands");
  double first = start.asDouble(0), last = limit.asDouble(0), step = delta.asDouble(0);
  if (step == 0)
    throw FoldError("Range with delta 0");
  int64_t count = std::max<int64_t>(static_cast<int64_t>(std::ceil((last - first) / step)), 0);
  HostTensor out;
  out.kind = start.kind;
  out.shape = {count};
  for (int64_t i = 0; i < count; ++i) {
    if (isFloating(start.kind))
      out.floats.push_back(first + i * step);
    else
      out.ints.push_back(start.ints[0] + i * delta.ints[0]);
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
      known *= shape[d];
    }
  }
  int64_t total = productOf(input);
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
