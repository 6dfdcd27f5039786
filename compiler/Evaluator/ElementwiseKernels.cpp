// Element-wise reference kernels and their gradients: arithmetic with numpy
// broadcasting, activations, where, cast, and dropout with its generator.
#include "compiler/Evaluator/KernelsInternal.h"

#include "llvm/Support/ErrorHandling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pipec::eval::kernels {

using namespace detail;
using import::isFloating;

namespace {

constexpr double kPi = 3.14159265358979323846;

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
  case BinaryOp::Max: return std::max(a, b);
  case BinaryOp::Min: return std::min(a, b);
  case BinaryOp::Mod:
  case BinaryOp::FMod: {
    if (b == 0)
      throw EvalError("integer modulo by zero");
    int64_t r = b == -1 ? 0 : a % b;
    if (op == BinaryOp::Mod && r != 0 && (r < 0) != (b < 0))
      r += b; // Python's %: the sign of the divisor
    return r;
  }
  case BinaryOp::Equal: return a == b;
  case BinaryOp::Less: return a < b;
  case BinaryOp::LessOrEqual: return a <= b;
  case BinaryOp::Greater: return a > b;
  case BinaryOp::GreaterOrEqual: return a >= b;
  case BinaryOp::And: return a && b;
  case BinaryOp::Or: return a || b;
  case BinaryOp::Xor: return (a != 0) != (b != 0);
  }
  llvm_unreachable("every BinaryOp has its case in integerBinary");
}

double floatBinary(BinaryOp op, double a, double b) {
  switch (op) {
  case BinaryOp::Add: return a + b;
  case BinaryOp::Sub: return a - b;
  case BinaryOp::Mul: return a * b;
  case BinaryOp::Div: return a / b;
  case BinaryOp::Pow: return std::pow(a, b);
  // NaN propagates, as numpy's maximum and minimum.
  case BinaryOp::Max: return std::isnan(a) || std::isnan(b) ? a + b : std::max(a, b);
  case BinaryOp::Min: return std::isnan(a) || std::isnan(b) ? a + b : std::min(a, b);
  case BinaryOp::Mod: { // numpy's mod: the sign of the divisor
    double r = std::fmod(a, b);
    return r != 0 && (r < 0) != (b < 0) ? r + b : r;
  }
  case BinaryOp::FMod: return std::fmod(a, b);
  case BinaryOp::Equal: return a == b;
  case BinaryOp::Less: return a < b;
  case BinaryOp::LessOrEqual: return a <= b;
  case BinaryOp::Greater: return a > b;
  case BinaryOp::GreaterOrEqual: return a >= b;
  case BinaryOp::And:
  case BinaryOp::Or:
  case BinaryOp::Xor: break; // bool operands only: integerBinary
  }
  llvm_unreachable("every BinaryOp has its case in floatBinary");
}

double geluExact(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double geluTanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

void requireRatio(double ratio) {
  if (!(ratio >= 0.0 && ratio < 1.0))
    throw EvalError("ratio must be in [0, 1), got " + std::to_string(ratio));
}

} // namespace

Tensor binary(BinaryOp op, const Tensor &lhs, const Tensor &rhs) {
  if (lhs.kind != rhs.kind)
    throw EvalError(std::string("operand element types differ (") +
                    import::elementKindName(lhs.kind) + " vs " +
                    import::elementKindName(rhs.kind) + ")");
  std::vector<int64_t> shape = broadcastTwo(lhs.shape, rhs.shape);
  bool floating = isFloating(lhs.kind);
  if (pipec::takesBool(op) && lhs.kind != ElementKind::Bool)
    throw EvalError(std::string("the operands must be bool, not ") + import::elementKindName(lhs.kind));
  const bool givesBool = pipec::givesBool(op);
  Tensor out = zeros(givesBool ? ElementKind::Bool : lhs.kind, shape);
  int64_t flat = 0;
  forEachIndex(shape, [&](const std::vector<int64_t> &index) {
    int64_t l = broadcastOffset(index, lhs.shape), r = broadcastOffset(index, rhs.shape);
    if (givesBool && floating)
      out.ints[flat] = floatBinary(op, lhs.floats[l], rhs.floats[r]) != 0.0;
    else if (givesBool)
      out.ints[flat] = integerBinary(op, lhs.ints[l], rhs.ints[r]) != 0;
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
    case UnaryOp::Relu6: out.floats[i] = x <= 0 ? 0.0 : x >= 6 ? 6.0 : x; break; // NaN stays, -0 becomes +0
    case UnaryOp::Tanh: out.floats[i] = std::tanh(x); break;
    case UnaryOp::Sigmoid: out.floats[i] = 1.0 / (1.0 + std::exp(-x)); break;
    case UnaryOp::Erf: out.floats[i] = std::erf(x); break;
    case UnaryOp::Sqrt: out.floats[i] = std::sqrt(x); break;
    case UnaryOp::Gelu: out.floats[i] = geluExact(x); break;
    case UnaryOp::GeluTanh: out.floats[i] = geluTanh(x); break;
    case UnaryOp::Neg: out.floats[i] = -x; break;
    case UnaryOp::Reciprocal: out.floats[i] = 1.0 / x; break;
    case UnaryOp::Abs: out.floats[i] = std::fabs(x); break;
    case UnaryOp::Exp: out.floats[i] = std::exp(x); break;
    case UnaryOp::Log: out.floats[i] = std::log(x); break;
    case UnaryOp::Sin: out.floats[i] = std::sin(x); break;
    case UnaryOp::Cos: out.floats[i] = std::cos(x); break;
    case UnaryOp::Softplus: out.floats[i] = x > 30 ? x + std::exp(-x) : std::log1p(std::exp(x)); break;
    case UnaryOp::Softsign: out.floats[i] = x / (1.0 + std::fabs(x)); break;
    case UnaryOp::Floor: out.floats[i] = std::floor(x); break;
    case UnaryOp::Ceil: out.floats[i] = std::ceil(x); break;
    case UnaryOp::Round: out.floats[i] = std::nearbyint(x); break; // halves to even
    case UnaryOp::Sign: out.floats[i] = x > 0 ? 1.0 : x < 0 ? -1.0 : x; break;
    case UnaryOp::Tan: out.floats[i] = std::tan(x); break;
    case UnaryOp::Atan: out.floats[i] = std::atan(x); break;
    case UnaryOp::Asin: out.floats[i] = std::asin(x); break;
    case UnaryOp::Acos: out.floats[i] = std::acos(x); break;
    case UnaryOp::Sinh: out.floats[i] = std::sinh(x); break;
    case UnaryOp::Cosh: out.floats[i] = std::cosh(x); break;
    case UnaryOp::Asinh: out.floats[i] = std::asinh(x); break;
    case UnaryOp::Acosh: out.floats[i] = std::acosh(x); break;
    case UnaryOp::Atanh: out.floats[i] = std::atanh(x); break;
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

Tensor rotary(const Tensor &input, const Tensor &cos, const Tensor &sin, bool interleaved, bool transposed) {
  requireFloating(input, "the input");
  if (input.shape.empty() || input.shape.back() % 2 != 0)
    throw EvalError("the last axis of the input " + shapeToString(input.shape) + " must have an even length");
  for (const Tensor *table : {&cos, &sin})
    if (broadcastTwo(table->shape, input.shape) != input.shape)
      throw EvalError("cos/sin of shape " + shapeToString(table->shape) + " does not broadcast to " +
                      shapeToString(input.shape));
  const int64_t width = input.shape.back();
  std::vector<double> cosAt(input.numElements()), sinAt(input.numElements());
  int64_t flat = 0;
  forEachIndex(input.shape, [&](const std::vector<int64_t> &index) {
    cosAt[flat] = cos.floats[broadcastOffset(index, cos.shape)];
    sinAt[flat++] = sin.floats[broadcastOffset(index, sin.shape)];
  });
  // R as a matrix on one row: R(v)[j] = sign[j] * v[source[j]].
  std::vector<int64_t> source(width);
  std::vector<double> sign(width);
  for (int64_t j = 0; j < width; ++j) {
    bool first = interleaved ? j % 2 == 0 : j < width / 2;
    source[j] = interleaved ? (first ? j + 1 : j - 1) : (first ? j + width / 2 : j - width / 2);
    sign[j] = first ? -1.0 : 1.0;
  }
  Tensor out = zeros(input.kind, input.shape);
  for (int64_t row = 0; row < input.numElements() / width; ++row)
    for (int64_t j = 0; j < width; ++j) {
      const int64_t i = row * width + j;
      double value = input.floats[i] * cosAt[i];
      if (!transposed) {
        value += sign[j] * input.floats[row * width + source[j]] * sinAt[i];
      } else {
        // Rᵀ(w)[k] = sign[j] * w[j] for the j with source[j] == k: the
        // partner of k is j = source[k] (R pairs elements), sign[source[k]].
        const int64_t from = row * width + source[j];
        value += sign[source[j]] * input.floats[from] * sinAt[from];
      }
      out.floats[i] = value;
    }
  return finish(std::move(out));
}

Tensor cast(const Tensor &input, ElementKind to) {
  Tensor out = zeros(to, input.shape);
  for (int64_t i = 0; i < input.numElements(); ++i) {
    if (isFloating(to)) {
      out.floats[i] = input.asDouble(i);
    } else if (to == ElementKind::Bool) {
      out.ints[i] = input.asDouble(i) != 0.0;
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

Tensor unaryGrad(UnaryOp op, const Tensor &dy, const Tensor &forward) {
  requireFloating(dy, "dy");
  requireSameShape(dy, forward, "dy and the forward value differ");
  const bool readsInput = pipec::derivativeReadsInput(op);
  Tensor out = zeros(dy.kind, dy.shape);
  for (size_t i = 0; i < dy.floats.size(); ++i) {
    // Only the one the kind reads is meaningful.
    double xv = readsInput ? forward.floats[i] : 0, yv = readsInput ? 0 : forward.floats[i], derivative = 0;
    switch (op) {
    case UnaryOp::Relu: derivative = yv > 0 ? 1.0 : 0.0; break;
    case UnaryOp::Relu6: derivative = yv <= 0 || yv >= 6 ? 0.0 : 1.0; break; // Clip's: 0 on the bounds
    case UnaryOp::Tanh: derivative = 1.0 - yv * yv; break;
    case UnaryOp::Sigmoid: derivative = yv * (1.0 - yv); break;
    case UnaryOp::Erf: derivative = 2.0 / std::sqrt(kPi) * std::exp(-xv * xv); break;
    case UnaryOp::Sqrt: derivative = 1.0 / (2.0 * yv); break;
    case UnaryOp::Gelu:
      // Phi(x) + x * phi(x)
      derivative = 0.5 * (1.0 + std::erf(xv / std::sqrt(2.0))) +
                   xv * std::exp(-0.5 * xv * xv) / std::sqrt(2.0 * kPi);
      break;
    case UnaryOp::GeluTanh: {
      double c = std::sqrt(2.0 / kPi);
      double t = std::tanh(c * (xv + 0.044715 * xv * xv * xv));
      derivative = 0.5 * (1.0 + t) + 0.5 * xv * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * xv * xv);
      break;
    }
    case UnaryOp::Neg: derivative = -1.0; break;
    case UnaryOp::Reciprocal: derivative = -yv * yv; break;
    case UnaryOp::Abs: derivative = xv > 0 ? 1.0 : xv < 0 ? -1.0 : 0.0; break;
    case UnaryOp::Exp: derivative = yv; break;
    case UnaryOp::Log: derivative = 1.0 / xv; break;
    case UnaryOp::Sin: derivative = std::cos(xv); break;
    case UnaryOp::Cos: derivative = -std::sin(xv); break;
    case UnaryOp::Softplus: derivative = 1.0 / (1.0 + std::exp(-xv)); break;
    case UnaryOp::Softsign: derivative = 1.0 / ((1.0 + std::fabs(xv)) * (1.0 + std::fabs(xv))); break;
    case UnaryOp::Floor:
    case UnaryOp::Ceil:
    case UnaryOp::Round:
    case UnaryOp::Sign: derivative = 0.0; break;
    case UnaryOp::Tan: derivative = 1.0 + yv * yv; break;
    case UnaryOp::Atan: derivative = 1.0 / (1.0 + xv * xv); break;
    case UnaryOp::Asin: derivative = 1.0 / std::sqrt(1.0 - xv * xv); break;
    case UnaryOp::Acos: derivative = -1.0 / std::sqrt(1.0 - xv * xv); break;
    case UnaryOp::Sinh: derivative = std::cosh(xv); break;
    case UnaryOp::Cosh: derivative = std::sinh(xv); break;
    case UnaryOp::Asinh: derivative = 1.0 / std::sqrt(xv * xv + 1.0); break;
    case UnaryOp::Acosh: derivative = 1.0 / std::sqrt(xv * xv - 1.0); break;
    case UnaryOp::Atanh: derivative = 1.0 / (1.0 - xv * xv); break;
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
    // Ties split dy evenly (PyTorch's maximum and minimum).
    case BinaryGradKind::MaxLhs: out.floats[flat] = l < r ? 0.0 : l == r ? g / 2 : g; break;
    case BinaryGradKind::MaxRhs: out.floats[flat] = l > r ? 0.0 : l == r ? g / 2 : g; break;
    case BinaryGradKind::MinLhs: out.floats[flat] = l > r ? 0.0 : l == r ? g / 2 : g; break;
    case BinaryGradKind::MinRhs: out.floats[flat] = l < r ? 0.0 : l == r ? g / 2 : g; break;
    }
    ++flat;
  });
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
  requireRatio(ratio);
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

Tensor dropoutGrad(const Tensor &dy, const Tensor &mask, double ratio, bool training) {
  requireFloating(dy, "dy");
  if (mask.kind != ElementKind::Bool || mask.shape != dy.shape)
    throw EvalError("the mask must be bool of dy's shape " + shapeToString(dy.shape));
  requireRatio(ratio);
  Tensor out = dy;
  if (!training)
    return out;
  for (size_t i = 0; i < out.floats.size(); ++i)
    out.floats[i] = mask.ints[i] ? dy.floats[i] / (1.0 - ratio) : 0.0;
  return finish(std::move(out));
}

} // namespace pipec::eval::kernels
