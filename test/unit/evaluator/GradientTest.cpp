// Finite-difference checks of the gradient ops (dialects/nn/NNGradOps.td)
// against the forward kernels, in double precision. For every forward op
// with a differentiable operand, y = f(x...), a random dy and central
// differences give d<dy, f(x)>/dx_i per element, which must match the
// gradient that autodiff would emit: the op's gradient kernel, or for the
// ops whose gradient is plain algebra the composition of forward kernels
// (reduce_sum + reshape for broadcasting, transposed matmuls, ...). This is
// the oracle of the autodiff pass, which emits exactly these ops.
#include "compiler/Evaluator/Kernels.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <set>

using namespace pipec::eval;
using namespace pipec::eval::kernels;

namespace {

using Tensors = std::vector<Tensor>;
constexpr ElementKind f64 = ElementKind::Float64;

/// One check: the differentiable outputs of a forward op as a function of
/// its inputs, the inputs to differentiate, and the analytic gradients
/// (one per entry of `wrt`) given one dy per output.
struct GradCase {
  std::string op, variant;
  Tensors inputs;
  std::function<Tensors(const Tensors &)> forward;
  std::vector<size_t> wrt;
  std::function<Tensors(const Tensors &inputs, const Tensors &dys)> backward;
};

Tensor random(std::mt19937_64 &rng, std::vector<int64_t> shape, double low = -1.0,
              double high = 1.0) {
  std::uniform_real_distribution<double> uniform(low, high);
  Tensor tensor = zeros(f64, std::move(shape));
  for (double &value : tensor.floats)
    value = uniform(rng);
  return tensor;
}

/// Values with gaps of at least 0.05 between any two (no max-pool ties).
Tensor distinct(std::mt19937_64 &rng, std::vector<int64_t> shape) {
  Tensor tensor = zeros(f64, std::move(shape));
  std::vector<double> values(tensor.floats.size());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = 0.1 * static_cast<double>(i) + std::uniform_real_distribution<double>(0, 0.05)(rng);
  std::shuffle(values.begin(), values.end(), rng);
  tensor.floats = values;
  return tensor;
}

Tensor scalar(double value) { return Tensor::ofFloats(f64, {}, {value}); }

int64_t count(const std::vector<int64_t> &shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

/// The gradient of an operand of shape `shape` that was broadcast to
/// grad's shape: reduce_sum over the broadcast axes, then reshape (what
/// autodiff emits for every broadcasting op).
Tensor unbroadcast(const Tensor &grad, const std::vector<int64_t> &shape) {
  size_t lead = grad.shape.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t axis = 0; axis < grad.shape.size(); ++axis)
    if (axis < lead || (shape[axis - lead] == 1 && grad.shape[axis] != 1))
      axes.push_back(static_cast<int64_t>(axis));
  return reshape(reduceSum(grad, axes, true), shape);
}

/// Swaps the last two axes (rank >= 2).
Tensor transposeLast(const Tensor &tensor) {
  std::vector<int64_t> perm(tensor.shape.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(tensor, perm);
}

double dot(const Tensors &a, const Tensors &b) {
  double sum = 0;
  for (size_t k = 0; k < a.size(); ++k)
    for (size_t i = 0; i < a[k].floats.size(); ++i)
      sum += a[k].floats[i] * b[k].floats[i];
  return sum;
}

/// Empty when every analytic gradient element matches its central
/// difference within 1e-6 relative to the operand's largest gradient.
/// `worstError`, when given, receives the largest such relative error.
std::string check(const GradCase &test, uint64_t seed, double *worstError = nullptr) {
  const double eps = 1e-6, tolerance = 1e-6;
  std::mt19937_64 rng(seed);
  Tensors outputs = test.forward(test.inputs);
  Tensors dys;
  for (const Tensor &output : outputs)
    dys.push_back(random(rng, output.shape));
  Tensors analytic = test.backward(test.inputs, dys);
  if (analytic.size() != test.wrt.size())
    return "backward returned " + std::to_string(analytic.size()) + " gradients for " +
           std::to_string(test.wrt.size()) + " operands";
  std::string problems;
  for (size_t k = 0; k < test.wrt.size(); ++k) {
    size_t operand = test.wrt[k];
    const Tensor &x = test.inputs[operand];
    if (analytic[k].shape != x.shape) {
      problems += "operand " + std::to_string(operand) + ": gradient shape " +
                  shapeToString(analytic[k].shape) + " for " + shapeToString(x.shape) + "\n";
      continue;
    }
    double scale = 1.0;
    for (double value : analytic[k].floats)
      scale = std::max(scale, std::abs(value));
    int reported = 0;
    for (size_t i = 0; i < x.floats.size(); ++i) {
      Tensors plus = test.inputs, minus = test.inputs;
      plus[operand].floats[i] += eps;
      minus[operand].floats[i] -= eps;
      double numeric = (dot(dys, test.forward(plus)) - dot(dys, test.forward(minus))) / (2 * eps);
      double error = std::abs(analytic[k].floats[i] - numeric);
      if (worstError)
        *worstError = std::max(*worstError, error / scale);
      if (!(error <= tolerance * scale) && reported++ < 3)
        problems += "operand " + std::to_string(operand) + " element " + std::to_string(i) +
                    ": analytic " + std::to_string(analytic[k].floats[i]) + ", numeric " +
                    std::to_string(numeric) + "\n";
    }
  }
  return problems;
}

//===----------------------------------------------------------------------===//
// The cases, one or more variants per forward op
//===----------------------------------------------------------------------===//

std::vector<GradCase> elementwiseCases(std::mt19937_64 &rng) {
  std::vector<GradCase> cases;
  // Broadcasting both ways: rhs against lhs, and both against each other.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{2, 3, 4}, {3, 1}}, {{3, 1}, {2, 1, 4}}};
  for (auto [lhsShape, rhsShape] : shapes) {
    std::string variant = shapeToString(lhsShape) + " op " + shapeToString(rhsShape);
    Tensor lhs = random(rng, lhsShape), rhs = random(rng, rhsShape);
    Tensor positive = random(rng, lhsShape, 0.5, 2.0), divisor = random(rng, rhsShape, 0.5, 2.0);
    auto forwardOf = [](BinaryOp op) {
      return [op](const Tensors &in) { return Tensors{binary(op, in[0], in[1])}; };
    };
    cases.push_back({"nn.add", variant, {lhs, rhs}, forwardOf(BinaryOp::Add), {0, 1},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{unbroadcast(dy[0], in[0].shape),
                                      unbroadcast(dy[0], in[1].shape)};
                     }});
    cases.push_back({"nn.sub", variant, {lhs, rhs}, forwardOf(BinaryOp::Sub), {0, 1},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{
                           unbroadcast(dy[0], in[0].shape),
                           unbroadcast(binaryGrad(BinaryGradKind::SubRhs, dy[0], in[0], in[1]),
                                       in[1].shape)};
                     }});
    cases.push_back({"nn.mul", variant, {lhs, rhs}, forwardOf(BinaryOp::Mul), {0, 1},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{
                           unbroadcast(binary(BinaryOp::Mul, dy[0], in[1]), in[0].shape),
                           unbroadcast(binary(BinaryOp::Mul, dy[0], in[0]), in[1].shape)};
                     }});
    cases.push_back({"nn.div", variant, {lhs, divisor}, forwardOf(BinaryOp::Div), {0, 1},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{
                           unbroadcast(binary(BinaryOp::Div, dy[0], in[1]), in[0].shape),
                           unbroadcast(binaryGrad(BinaryGradKind::DivRhs, dy[0], in[0], in[1]),
                                       in[1].shape)};
                     }});
    cases.push_back({"nn.pow", variant, {positive, random(rng, rhsShape, -1.5, 1.5)},
                     forwardOf(BinaryOp::Pow), {0, 1},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{
                           unbroadcast(binaryGrad(BinaryGradKind::PowLhs, dy[0], in[0], in[1]),
                                       in[0].shape),
                           unbroadcast(binaryGrad(BinaryGradKind::PowRhs, dy[0], in[0], in[1]),
                                       in[1].shape)};
                     }});
    // Max and Min: random operands never tie, so finite differences see
    // one side at a time.
    for (auto [name, op, lhsKind, rhsKind] :
         {std::tuple{"nn.max", BinaryOp::Max, BinaryGradKind::MaxLhs, BinaryGradKind::MaxRhs},
          std::tuple{"nn.min", BinaryOp::Min, BinaryGradKind::MinLhs, BinaryGradKind::MinRhs}}) {
      cases.push_back({name, variant, {lhs, rhs}, forwardOf(op), {0, 1},
                       [lhsKind, rhsKind](const Tensors &in, const Tensors &dy) {
                         return Tensors{
                             unbroadcast(binaryGrad(lhsKind, dy[0], in[0], in[1]), in[0].shape),
                             unbroadcast(binaryGrad(rhsKind, dy[0], in[0], in[1]), in[1].shape)};
                       }});
    }
  }

  // Where: the condition selects, x and y broadcast.
  Tensor condition = zeros(ElementKind::Bool, {3, 4});
  for (int64_t &flag : condition.ints)
    flag = std::uniform_int_distribution<int>(0, 1)(rng);
  cases.push_back({"nn.where", "[3,4] ? [2,3,4] : [4]",
                   {condition, random(rng, {2, 3, 4}), random(rng, {4})},
                   [](const Tensors &in) { return Tensors{where(in[0], in[1], in[2])}; }, {1, 2},
                   [](const Tensors &in, const Tensors &dy) {
                     Tensor zero = scalar(0.0);
                     return Tensors{unbroadcast(where(in[0], dy[0], zero), in[1].shape),
                                    unbroadcast(where(in[0], zero, dy[0]), in[2].shape)};
                   }});

  // Unary ops: dx = unary_grad(dy, x, y).
  struct Unary {
    const char *op, *variant;
    UnaryOp kind;
    double low, high;
  };
  for (Unary unaryOp : {Unary{"nn.relu", "", UnaryOp::Relu, -2, 2},
                        Unary{"nn.relu6", "", UnaryOp::Relu6, -2, 8},
                        Unary{"nn.tanh", "", UnaryOp::Tanh, -2, 2},
                        Unary{"nn.sigmoid", "", UnaryOp::Sigmoid, -3, 3},
                        Unary{"nn.erf", "", UnaryOp::Erf, -2, 2},
                        Unary{"nn.sqrt", "", UnaryOp::Sqrt, 0.2, 3},
                        Unary{"nn.gelu", "approximate none", UnaryOp::Gelu, -3, 3},
                        Unary{"nn.gelu", "approximate tanh", UnaryOp::GeluTanh, -3, 3},
                        Unary{"nn.neg", "", UnaryOp::Neg, -2, 2},
                        Unary{"nn.reciprocal", "", UnaryOp::Reciprocal, 0.5, 2},
                        Unary{"nn.abs", "", UnaryOp::Abs, -2, 2},
                        Unary{"nn.exp", "", UnaryOp::Exp, -2, 2},
                        Unary{"nn.log", "", UnaryOp::Log, 0.2, 3},
                        Unary{"nn.sin", "", UnaryOp::Sin, -3, 3},
                        Unary{"nn.cos", "", UnaryOp::Cos, -3, 3},
                        Unary{"nn.softplus", "", UnaryOp::Softplus, -4, 4},
                        Unary{"nn.softsign", "", UnaryOp::Softsign, -3, 3},
                        Unary{"nn.floor", "zero gradient", UnaryOp::Floor, -3, 3},
                        Unary{"nn.ceil", "zero gradient", UnaryOp::Ceil, -3, 3},
                        Unary{"nn.round", "zero gradient", UnaryOp::Round, -3, 3},
                        Unary{"nn.sign", "zero gradient", UnaryOp::Sign, -3, 3},
                        Unary{"nn.tan", "", UnaryOp::Tan, -1.2, 1.2},
                        Unary{"nn.atan", "", UnaryOp::Atan, -3, 3},
                        Unary{"nn.asin", "", UnaryOp::Asin, -0.9, 0.9},
                        Unary{"nn.acos", "", UnaryOp::Acos, -0.9, 0.9},
                        Unary{"nn.sinh", "", UnaryOp::Sinh, -2, 2},
                        Unary{"nn.cosh", "", UnaryOp::Cosh, -2, 2},
                        Unary{"nn.asinh", "", UnaryOp::Asinh, -3, 3},
                        Unary{"nn.acosh", "", UnaryOp::Acosh, 1.2, 3},
                        Unary{"nn.atanh", "", UnaryOp::Atanh, -0.9, 0.9}}) {
    Tensor x = random(rng, {3, 5}, unaryOp.low, unaryOp.high);
    for (double &value : x.floats) {
      if (std::abs(value) < 0.05) // away from relu's and abs's kinks
        value = 0.5;
      if (std::abs(value - 6) < 0.05) // and relu6's upper one
        value = 5.5;
      // Floor, ceil and round jump at integers and halves: stay between.
      double fraction = value - std::floor(value);
      if (std::abs(fraction) < 0.05 || std::abs(fraction - 0.5) < 0.05 || fraction > 0.95)
        value = std::floor(value) + 0.25;
    }
    UnaryOp kind = unaryOp.kind;
    cases.push_back({unaryOp.op, unaryOp.variant, {x},
                     [kind](const Tensors &in) { return Tensors{unary(kind, in[0])}; }, {0},
                     [kind](const Tensors &in, const Tensors &dy) {
                       return Tensors{
                           unaryGrad(kind, dy[0], pipec::derivativeReadsInput(kind) ? in[0] : unary(kind, in[0]))};
                     }});
  }

  // Cast: the gradient is cast back to the source type (float32 input values
  // are exact in double, so only dy's rounding to float32 differs).
  Tensor x32 = Tensor::ofFloats(ElementKind::Float32, {2, 3}, random(rng, {2, 3}).floats);
  roundToElementType(x32);
  cases.push_back({"nn.cast", "f32 -> f64", {x32},
                   [](const Tensors &in) { return Tensors{cast(in[0], f64)}; }, {0},
                   [](const Tensors &, const Tensors &dy) {
                     return Tensors{cast(dy[0], ElementKind::Float32)};
                   }});
  return cases;
}

std::vector<GradCase> linearAlgebraCases(std::mt19937_64 &rng) {
  std::vector<GradCase> cases;
  // Gemm: d op(A) = alpha dy op(B)^T, d op(B) = alpha op(A)^T dy, dC = beta
  // dy summed to C's shape; each written as one gemm with transposes.
  for (int variant = 0; variant < 5; ++variant) {
    bool transA = variant & 1, transB = variant & 2, withC = variant < 4;
    int64_t m = 3, k = 4, n = 2;
    double alpha = 0.7, beta = 1.3;
    Tensors inputs{random(rng, transA ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}),
                   random(rng, transB ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n})};
    if (withC)
      inputs.push_back(random(rng, variant % 2 ? std::vector<int64_t>{n} : std::vector<int64_t>{m, 1}));
    std::vector<size_t> wrt{0, 1};
    if (withC)
      wrt.push_back(2);
    cases.push_back(
        {"nn.gemm",
         std::string("transA ") + (transA ? "1" : "0") + " transB " + (transB ? "1" : "0") +
             (withC ? " C " + shapeToString(inputs[2].shape) : " no C"),
         inputs,
         [=](const Tensors &in) {
           return Tensors{gemm(in[0], in[1], withC ? &in[2] : nullptr, alpha, beta, transA, transB)};
         },
         wrt,
         [=](const Tensors &in, const Tensors &dy) {
           const Tensor &a = in[0], &b = in[1], &g = dy[0];
           Tensors grads{
               transA ? gemm(b, g, nullptr, alpha, 0, transB, true)
                      : gemm(g, b, nullptr, alpha, 0, false, !transB),
               transB ? gemm(g, a, nullptr, alpha, 0, true, transA)
                      : gemm(a, g, nullptr, alpha, 0, !transA, false)};
           if (withC)
             grads.push_back(unbroadcast(binary(BinaryOp::Mul, g, scalar(beta)), in[2].shape));
           return grads;
         }});
  }

  // MatMul: dA = dy B^T, dB = A^T dy, summed over broadcast batch axes; 1-D
  // operands are promoted by reshape as in the forward.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{3, 4}, {4, 2}}, {{2, 3, 4}, {4, 5}}, {{2, 1, 3, 4}, {3, 4, 2}}, {{4}, {2, 4, 3}},
      {{2, 3}, {3}}};
  for (auto [aShape, bShape] : shapes)
    cases.push_back(
        {"nn.matmul", shapeToString(aShape) + " x " + shapeToString(bShape),
         {random(rng, aShape), random(rng, bShape)},
         [](const Tensors &in) { return Tensors{matmul(in[0], in[1])}; }, {0, 1},
         [](const Tensors &in, const Tensors &dy) {
           Tensor a = in[0], b = in[1], g = dy[0];
           if (a.shape.size() == 1)
             a = reshape(a, {1, a.shape[0]});
           if (b.shape.size() == 1)
             b = reshape(b, {b.shape[0], 1});
           std::vector<int64_t> gShape = matmul(a, b).shape;
           g = reshape(g, gShape);
           Tensor da = unbroadcast(matmul(g, transposeLast(b)), a.shape);
           Tensor db = unbroadcast(matmul(transposeLast(a), g), b.shape);
           return Tensors{reshape(da, in[0].shape), reshape(db, in[1].shape)};
         }});
  // The rotary embedding, halves and pairs, cos and sin broadcast: the
  // gradients NNGradient.cpp builds (x: the transposed rotation; cos: dy·x;
  // sin: dy·R(x), R the rotation with cos 0 and sin 1), summed to the tables.
  for (bool interleaved : {false, true}) {
    Tensor zero = Tensor::ofFloats(ElementKind::Float64, {}, {0.0});
    Tensor one = Tensor::ofFloats(ElementKind::Float64, {}, {1.0});
    cases.push_back(
        {"nn.rotary", interleaved ? "interleaved pairs, tables [1, 3, 4]" : "halves, tables [1, 3, 4]",
         {random(rng, {2, 3, 4}), random(rng, {1, 3, 4}), random(rng, {1, 3, 4})},
         [=](const Tensors &in) { return Tensors{rotary(in[0], in[1], in[2], interleaved, false)}; },
         {0, 1, 2},
         [=](const Tensors &in, const Tensors &dy) {
           Tensor rotated = rotary(in[0], zero, one, interleaved, false);
           return Tensors{rotary(dy[0], in[1], in[2], interleaved, true),
                          unbroadcast(binary(BinaryOp::Mul, dy[0], in[0]), in[1].shape),
                          unbroadcast(binary(BinaryOp::Mul, dy[0], rotated), in[2].shape)};
         }});
  }
  // The fused attention, causal-masked and scaled (then divided), without a
  // mask, with an additive one, or causal-masked with a dropout of its
  // probabilities (the mask fixed by its key), or causal-masked with
  // grouped-query heads (2 key/value heads for 4 query heads): its gradient
  // op against the finite differences of its result.
  for (int variant = 0; variant < 5; ++variant) {
    const bool masked = variant != 1, divide = variant == 0;
    const double dropoutRatio = variant == 3 ? 0.4 : 0.0;
    const uint64_t dropoutKey = kernels::dropoutStreamKey(1, 2, 3, 4);
    Tensor mask = variant == 2 ? random(rng, {2, 1, 5}) // an additive mask
                               : Tensor::ofInts(ElementKind::Bool, {4, 5}, {0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0,
                                                                            1, 1, 0, 0, 0, 0, 1});
    cases.push_back(
        {"nn.attention",
         variant == 0   ? "causal mask, divided scale"
         : variant == 1 ? "no mask"
         : variant == 2 ? "additive mask"
         : variant == 3 ? "causal mask, dropout"
                        : "causal mask, grouped heads",
         variant == 4 ? Tensors{random(rng, {2, 4, 4, 3}), random(rng, {2, 2, 5, 3}), random(rng, {2, 2, 5, 2})}
                      : Tensors{random(rng, {2, 4, 3}), random(rng, {2, 5, 3}), random(rng, {2, 5, 2})},
         [=](const Tensors &in) {
           return Tensors{attention(in[0], in[1], in[2], masked ? &mask : nullptr, 1.7, divide, -1e9, true,
                                    dropoutRatio, dropoutKey)
                              .output};
         },
         {0, 1, 2},
         [=](const Tensors &in, const Tensors &dy) {
           AttentionGrads grads = attentionGrad(dy[0], in[0], in[1], in[2], masked ? &mask : nullptr, 1.7, divide,
                                                -1e9, true, dropoutRatio, dropoutKey);
           return Tensors{grads.query, grads.key, grads.value};
         }});
  }
  return cases;
}

std::vector<GradCase> convolutionCases(std::mt19937_64 &rng) {
  std::vector<GradCase> cases;
  struct Conv {
    std::vector<int64_t> input, weight, strides, pads, dilations;
    int64_t group;
  };
  for (Conv conv : {Conv{{2, 4, 5, 6}, {6, 2, 3, 2}, {2, 1}, {1, 0, 0, 1}, {1, 2}, 2},
                    Conv{{1, 3, 7}, {2, 3, 3}, {1}, {1, 1}, {1}, 1},
                    // Stride 2 leaves the last row and column out of every window.
                    Conv{{1, 2, 6, 6}, {3, 2, 3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1}}) {
    Tensors inputs{random(rng, conv.input), random(rng, conv.weight),
                   random(rng, {conv.weight[0]})};
    std::vector<int64_t> biasAxes{0};
    for (size_t axis = 2; axis < conv.input.size(); ++axis)
      biasAxes.push_back(static_cast<int64_t>(axis));
    cases.push_back(
        {"nn.conv",
         "input " + shapeToString(conv.input) + " weight " + shapeToString(conv.weight) +
             " strides " + shapeToString(conv.strides) + " pads " + shapeToString(conv.pads) +
             " dilations " + shapeToString(conv.dilations) + " group " +
             std::to_string(conv.group),
         inputs,
         [=](const Tensors &in) {
           return Tensors{kernels::conv(in[0], in[1], &in[2], conv.strides, conv.pads,
                                        conv.dilations, conv.group)};
         },
         {0, 1, 2},
         [=](const Tensors &in, const Tensors &dy) {
           return Tensors{convInputGrad(dy[0], in[1], in[0].shape, conv.strides, conv.pads,
                                        conv.dilations, conv.group),
                          convWeightGrad(dy[0], in[0], in[1].shape, conv.strides, conv.pads,
                                         conv.dilations, conv.group),
                          reduceSum(dy[0], biasAxes, false)};
         }});
  }

  // Batch normalization: input, scale and bias; the statistics flow in
  // training and are constants in inference.
  for (auto [shape, training] : std::vector<std::pair<std::vector<int64_t>, bool>>{
           {{4, 3, 2}, true}, {{2, 2, 3, 2}, true}, {{4, 3, 2}, false}}) {
    int64_t channels = shape[1];
    Tensors inputs{random(rng, shape, -2, 2), random(rng, {channels}), random(rng, {channels}),
                   random(rng, {channels}), random(rng, {channels}, 0.5, 2.0)};
    double epsilon = 1e-5;
    cases.push_back(
        {"nn.batch_norm", shapeToString(shape) + (training ? " training" : " inference"), inputs,
         [=](const Tensors &in) {
           return Tensors{batchNorm(in[0], in[1], in[2], in[3], in[4], epsilon, 0.9, training)
                              .output};
         },
         {0, 1, 2},
         [=](const Tensors &in, const Tensors &dy) {
           ParamGrads params = batchNormParamGrad(dy[0], in[0], in[3], in[4], epsilon, training);
           return Tensors{batchNormGrad(dy[0], in[0], in[1], in[3], in[4], epsilon, training),
                          params.scale, params.bias};
         }});
  }

  // Layer and RMS normalization over the trailing axes; scale and bias broadcast.
  struct Layer {
    std::vector<int64_t> input;
    int64_t axis;
    std::vector<int64_t> scale, bias;
  };
  for (bool centered : {true, false})
    for (Layer layer : {Layer{{2, 3, 4}, -1, {4}, {4}}, Layer{{2, 3, 4}, 1, {3, 4}, {3, 4}},
                        Layer{{2, 3, 4}, 1, {1, 4}, {4}}}) {
      double epsilon = 1e-5;
      cases.push_back(
          {"nn.layer_norm",
           std::string(centered ? "" : "centered = false, ") + "input " + shapeToString(layer.input) +
               " axis " + std::to_string(layer.axis) + " scale " + shapeToString(layer.scale) + " bias " +
               shapeToString(layer.bias),
           {random(rng, layer.input, -2, 2), random(rng, layer.scale), random(rng, layer.bias)},
           [=](const Tensors &in) {
             return Tensors{layerNorm(in[0], in[1], &in[2], layer.axis, epsilon, centered).output};
           },
           {0, 1, 2},
           [=](const Tensors &in, const Tensors &dy) {
             ParamGrads params = layerNormParamGrad(dy[0], in[0], layer.axis, epsilon, centered, in[1].shape,
                                                    in[2].shape);
             return Tensors{layerNormGrad(dy[0], in[0], in[1], layer.axis, epsilon, centered), params.scale,
                            params.bias};
           }});
    }

  // Pools.
  struct Pool {
    std::vector<int64_t> input, kernel, strides, pads, dilations;
    bool ceilMode, countIncludePad;
  };
  std::vector<Pool> pools = {
      {{2, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false, false},
      {{1, 2, 5, 5}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true, false},
      {{1, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, true, true},
      {{1, 3, 7}, {3}, {2}, {1, 0}, {1}, false, true},
      {{1, 1, 5, 6}, {2, 2}, {1, 2}, {0, 1, 1, 0}, {2, 1}, false, false}};
  for (const Pool &pool : pools) {
    std::string variant = "input " + shapeToString(pool.input) + " kernel " +
                          shapeToString(pool.kernel) + " strides " + shapeToString(pool.strides) +
                          " pads " + shapeToString(pool.pads) +
                          (pool.ceilMode ? " ceil_mode" : "");
    cases.push_back(
        {"nn.max_pool", variant + " dilations " + shapeToString(pool.dilations),
         {distinct(rng, pool.input)},
         [=](const Tensors &in) {
           return Tensors{maxPool(in[0], pool.kernel, pool.strides, pool.pads, pool.dilations,
                                  pool.ceilMode)};
         },
         {0},
         [=](const Tensors &in, const Tensors &dy) {
           return Tensors{maxPoolGrad(dy[0], in[0], pool.kernel, pool.strides, pool.pads,
                                      pool.dilations, pool.ceilMode)};
         }});
    bool dilated = std::any_of(pool.dilations.begin(), pool.dilations.end(),
                               [](int64_t d) { return d != 1; });
    if (dilated)
      continue; // average pooling has no dilations
    cases.push_back(
        {"nn.average_pool", variant + (pool.countIncludePad ? " count_include_pad" : ""),
         {random(rng, pool.input)},
         [=](const Tensors &in) {
           return Tensors{averagePool(in[0], pool.kernel, pool.strides, pool.pads,
                                      pool.ceilMode, pool.countIncludePad)};
         },
         {0},
         [=](const Tensors &in, const Tensors &dy) {
           return Tensors{averagePoolGrad(dy[0], in[0].shape, pool.kernel, pool.strides,
                                          pool.pads, pool.ceilMode, pool.countIncludePad)};
         }});
  }
  cases.push_back({"nn.global_average_pool", "[2,3,4,5]", {random(rng, {2, 3, 4, 5})},
                   [](const Tensors &in) { return Tensors{globalAveragePool(in[0])}; }, {0},
                   [](const Tensors &in, const Tensors &dy) {
                     double size = static_cast<double>(in[0].shape[2] * in[0].shape[3]);
                     return Tensors{
                         expand(binary(BinaryOp::Mul, dy[0], scalar(1.0 / size)), in[0].shape)};
                   }});
  return cases;
}

std::vector<GradCase> activationAndLossCases(std::mt19937_64 &rng) {
  std::vector<GradCase> cases;
  uint64_t key = dropoutStreamKey(1, 2, 3, 4);
  for (bool training : {true, false}) {
    double ratio = 0.3;
    cases.push_back({"nn.dropout", training ? "training ratio 0.3" : "inference",
                     {random(rng, {4, 5})},
                     [=](const Tensors &in) {
                       return Tensors{dropout(in[0], ratio, training, key).output};
                     },
                     {0},
                     [=](const Tensors &in, const Tensors &dy) {
                       Tensor mask = dropout(in[0], ratio, training, key).mask;
                       return Tensors{dropoutGrad(dy[0], mask, ratio, training)};
                     }});
  }
  for (int64_t axis : {1, -1})
    cases.push_back({"nn.softmax", "[2,3,4] axis " + std::to_string(axis),
                     {random(rng, {2, 3, 4}, -2, 2)},
                     [=](const Tensors &in) { return Tensors{softmax(in[0], axis)}; }, {0},
                     [=](const Tensors &in, const Tensors &dy) {
                       return Tensors{softmaxGrad(dy[0], softmax(in[0], axis), axis)};
                     }});
  // The attention softmax (pipec-recognize-composites), a finite fill so
  // that central differences stay finite; the mask broadcasts.
  for (bool divide : {false, true})
    for (bool maskedWhen : {true, false}) {
      Tensor mask = Tensor::ofInts(ElementKind::Bool, {1, 3, 4}, {1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 0});
      const double scale = divide ? 4.0 : 0.5;
      cases.push_back({"nn.masked_softmax",
                       std::string("[2,3,4] mask [1,3,4]") + (divide ? " divide" : " multiply") +
                           (maskedWhen ? " masked when true" : " masked when false"),
                       {random(rng, {2, 3, 4}, -2, 2), mask},
                       [=](const Tensors &in) {
                         return Tensors{maskedSoftmax(in[0], in[1], scale, divide, -30.0, maskedWhen)};
                       },
                       {0},
                       [=](const Tensors &in, const Tensors &dy) {
                         Tensor y = maskedSoftmax(in[0], in[1], scale, divide, -30.0, maskedWhen);
                         return Tensors{maskedSoftmaxGrad(dy[0], y, in[1], scale, divide, maskedWhen)};
                       }});
    }

  // The loss over scores [N, C, d...]; labels, weights and ignore_index as
  // ONNX defines them.
  struct Loss {
    std::vector<int64_t> scores;
    std::vector<int64_t> labels;
    bool weighted;
    std::string reduction;
    std::optional<int64_t> ignoreIndex;
  };
  for (const Loss &loss :
       {Loss{{4, 5}, {0, 3, 4, 1}, false, "mean", std::nullopt},
        Loss{{3, 4, 2}, {2, 0, 1, 2, 3, 2}, true, "mean", 2},
        Loss{{3, 4, 2}, {-1, 0, 1, 3, -1, 2}, true, "sum", -1},
        Loss{{4, 3}, {2, 0, 7, 1}, true, "none", 7},
        Loss{{2, 3}, {1, 2}, false, "none", std::nullopt}}) {
    std::vector<int64_t> labelShape{loss.scores[0]};
    labelShape.insert(labelShape.end(), loss.scores.begin() + 2, loss.scores.end());
    Tensor labels = Tensor::ofInts(ElementKind::Int64, labelShape, loss.labels);
    Tensors inputs{random(rng, loss.scores, -2, 2), labels};
    if (loss.weighted)
      inputs.push_back(random(rng, {loss.scores[1]}, 0.2, 2.0));
    cases.push_back(
        {"nn.softmax_cross_entropy_loss",
         shapeToString(loss.scores) + " " + loss.reduction + (loss.weighted ? " weighted" : "") +
             (loss.ignoreIndex ? " ignore_index " + std::to_string(*loss.ignoreIndex) : ""),
         inputs,
         [=](const Tensors &in) {
           return Tensors{softmaxCrossEntropyLoss(in[0], in[1], loss.weighted ? &in[2] : nullptr,
                                                  loss.reduction, loss.ignoreIndex)
                              .loss};
         },
         {0},
         [=](const Tensors &in, const Tensors &dy) {
           return Tensors{softmaxCrossEntropyLossGrad(dy[0], in[0], in[1],
                                                      loss.weighted ? &in[2] : nullptr,
                                                      loss.reduction, loss.ignoreIndex)};
         }});
  }
  return cases;
}

std::vector<GradCase> reductionAndDataMovementCases(std::mt19937_64 &rng) {
  std::vector<GradCase> cases;
  // Reductions: dy reshaped to the kept shape, broadcast back (and divided
  // by the count for the mean).
  for (auto [axes, keepdims] : std::vector<std::pair<std::vector<int64_t>, bool>>{
           {{1}, false}, {{0, 2}, true}, {{}, false}}) {
    std::string variant = "[2,3,4] axes " + shapeToString(axes) + (keepdims ? " keepdims" : "");
    cases.push_back(
        {"nn.reduce_mean", variant, {random(rng, {2, 3, 4})},
         [=](const Tensors &in) { return Tensors{reduceMean(in[0], axes, keepdims)}; }, {0},
         [=](const Tensors &in, const Tensors &dy) {
           std::vector<int64_t> kept = in[0].shape;
           int64_t reducedCount = 1;
           for (size_t axis = 0; axis < kept.size(); ++axis)
             if (axes.empty() ||
                 std::count(axes.begin(), axes.end(), static_cast<int64_t>(axis))) {
               reducedCount *= kept[axis];
               kept[axis] = 1;
             }
           Tensor spread = expand(reshape(dy[0], kept), in[0].shape);
           return Tensors{binary(BinaryOp::Mul, spread, scalar(1.0 / reducedCount))};
         }});
    if (axes.empty())
      continue; // reduce_sum with no axes is the identity
    cases.push_back({"nn.reduce_sum", variant, {random(rng, {2, 3, 4})},
                     [=](const Tensors &in) { return Tensors{reduceSum(in[0], axes, keepdims)}; },
                     {0},
                     [=](const Tensors &in, const Tensors &dy) {
                       std::vector<int64_t> kept = in[0].shape;
                       for (int64_t axis : axes)
                         kept[axis] = 1;
                       return Tensors{expand(reshape(dy[0], kept), in[0].shape)};
                     }});
  }

  // Gather: scatter-add, repeated and negative indices accumulate.
  struct Gather {
    std::vector<int64_t> data, indexShape, indices;
    int64_t axis;
  };
  for (const Gather &g : {Gather{{5, 3}, {2, 3}, {0, 4, -1, 2, 0, 0}, 0},
                          Gather{{2, 4, 3}, {3}, {3, 1, 3}, 1},
                          Gather{{2, 4, 3}, {2}, {-3, 2}, -1}}) {
    Tensor indices = Tensor::ofInts(ElementKind::Int64, g.indexShape, g.indices);
    cases.push_back({"nn.gather",
                     "data " + shapeToString(g.data) + " indices " + shapeToString(g.indexShape) +
                         " axis " + std::to_string(g.axis),
                     {random(rng, g.data), indices},
                     [=](const Tensors &in) { return Tensors{gather(in[0], in[1], g.axis)}; }, {0},
                     [=](const Tensors &in, const Tensors &dy) {
                       return Tensors{gatherGrad(dy[0], in[1], g.axis, in[0].shape)};
                     }});
  }

  // Reshape-like ops (one kernel, four ops): dx = reshape(dy).
  struct Reshape {
    const char *op;
    std::vector<int64_t> from, to;
  };
  for (const Reshape &r : {Reshape{"nn.reshape", {2, 6}, {3, 4}},
                           Reshape{"nn.flatten", {2, 3, 4}, {6, 4}},
                           Reshape{"nn.unsqueeze", {3, 4}, {3, 1, 4}},
                           Reshape{"nn.squeeze", {3, 1, 4}, {3, 4}}})
    cases.push_back({r.op, shapeToString(r.from) + " -> " + shapeToString(r.to),
                     {random(rng, r.from)},
                     [=](const Tensors &in) { return Tensors{reshape(in[0], r.to)}; }, {0},
                     [](const Tensors &in, const Tensors &dy) {
                       return Tensors{reshape(dy[0], in[0].shape)};
                     }});

  cases.push_back({"nn.expand", "[3,1] -> [2,3,4]", {random(rng, {3, 1})},
                   [](const Tensors &in) { return Tensors{expand(in[0], {2, 3, 4})}; }, {0},
                   [](const Tensors &in, const Tensors &dy) {
                     return Tensors{unbroadcast(dy[0], in[0].shape)};
                   }});
  cases.push_back({"nn.transpose", "[2,3,4] perm [2,0,1]", {random(rng, {2, 3, 4})},
                   [](const Tensors &in) { return Tensors{transpose(in[0], {2, 0, 1})}; }, {0},
                   [](const Tensors &, const Tensors &dy) {
                     // The inverse of perm [2, 0, 1] is [1, 2, 0].
                     return Tensors{transpose(dy[0], {1, 2, 0})};
                   }});
  cases.push_back({"nn.pad", "[2,3] pads [1,0,2,1] value 0.5", {random(rng, {2, 3})},
                   [](const Tensors &in) { return Tensors{pad(in[0], {1, 0, 2, 1}, 0.5)}; }, {0},
                   [](const Tensors &, const Tensors &dy) {
                     return Tensors{slice(dy[0], {1, 0}, {3, 3}, {1, 1})};
                   }});
  cases.push_back({"nn.concat", "[2,3] [2,1] [2,2] axis 1",
                   {random(rng, {2, 3}), random(rng, {2, 1}), random(rng, {2, 2})},
                   [](const Tensors &in) {
                     return Tensors{concat({&in[0], &in[1], &in[2]}, 1)};
                   },
                   {0, 1, 2},
                   [](const Tensors &, const Tensors &dy) { return split(dy[0], 1, {3, 1, 2}); }});
  cases.push_back({"nn.split", "[5,2,3] axis 0 sizes [2,3]", {random(rng, {5, 2, 3})},
                   [](const Tensors &in) { return split(in[0], 0, {2, 3}); }, {0},
                   [](const Tensors &, const Tensors &dy) {
                     return Tensors{concat({&dy[0], &dy[1]}, 0)};
                   }});
  cases.push_back({"nn.split", "[2,6] axis -1 sizes [1,2,3]", {random(rng, {2, 6})},
                   [](const Tensors &in) { return split(in[0], -1, {1, 2, 3}); }, {0},
                   [](const Tensors &, const Tensors &dy) {
                     return Tensors{concat({&dy[0], &dy[1], &dy[2]}, -1)};
                   }});
  struct Slice {
    std::vector<int64_t> input, starts, ends, steps;
  };
  for (const Slice &s : {Slice{{5, 4, 3}, {4, 0, 1}, {-1, 4, 3}, {-2, 2, 1}},
                         Slice{{6, 2}, {1, 1}, {5, -1}, {3, -1}}})
    cases.push_back({"nn.slice",
                     shapeToString(s.input) + " starts " + shapeToString(s.starts) + " ends " +
                         shapeToString(s.ends) + " steps " + shapeToString(s.steps),
                     {random(rng, s.input)},
                     [=](const Tensors &in) {
                       return Tensors{slice(in[0], s.starts, s.ends, s.steps)};
                     },
                     {0},
                     [=](const Tensors &in, const Tensors &dy) {
                       return Tensors{sliceGrad(dy[0], s.starts, s.ends, s.steps, in[0].shape)};
                     }});
  return cases;
}

std::vector<GradCase> allCases() {
  std::mt19937_64 rng(20240611);
  std::vector<GradCase> cases;
  for (auto make : {elementwiseCases, linearAlgebraCases, convolutionCases,
                    activationAndLossCases, reductionAndDataMovementCases}) {
    std::vector<GradCase> more = make(rng);
    cases.insert(cases.end(), more.begin(), more.end());
  }
  return cases;
}

/// Ops without a differentiable operand, and the gradient and optimizer ops
/// themselves (autodiff never differentiates them).
const std::set<std::string> notDifferentiated = {
    "nn.equal", "nn.constant", "nn.less", "nn.less_or_equal", "nn.greater", "nn.greater_or_equal",
    "nn.and", "nn.or", "nn.xor", "nn.mod", "nn.fmod",
    "nn.unary_grad", "nn.binary_grad", "nn.conv_input_grad", "nn.conv_weight_grad",
    "nn.batch_norm_grad", "nn.batch_norm_param_grad", "nn.layer_norm_grad",
    "nn.layer_norm_param_grad", "nn.max_pool_grad", "nn.average_pool_grad", "nn.dropout_grad",
    "nn.softmax_grad", "nn.masked_softmax_grad", "nn.softmax_cross_entropy_loss_grad", "nn.gather_grad", "nn.slice_grad",
    "nn.attention_grad",
    "nn.sgd_update", "nn.adamw_update",
    "nn.batched_gemm",          // made by pipec-canonicalize-gemm after autodiff only
    "nn.gemm_activation_grad"}; // made by pipec-fuse-gemm-epilogue after autodiff only

TEST(GradientCheck, EveryForwardOp) {
  std::vector<GradCase> cases = allCases();
  std::map<std::string, bool> opPassed;
  uint64_t seed = 1;
  int variantsPassed = 0;
  for (const GradCase &test : cases) {
    std::string problems;
    double worst = 0;
    try {
      problems = check(test, seed++, &worst);
    } catch (const std::exception &error) {
      problems = std::string("threw: ") + error.what();
    }
    if (std::getenv("PIPEC_GRADIENT_VERBOSE"))
      std::printf("  %-32s %-60s worst relative error %.1e\n", test.op.c_str(),
                  test.variant.c_str(), worst);
    EXPECT_EQ(problems, "") << test.op << " (" << test.variant << ")";
    opPassed.emplace(test.op, true);
    opPassed[test.op] = opPassed[test.op] && problems.empty();
    variantsPassed += problems.empty();
  }
  int opsPassed = 0;
  for (auto &[op, passed] : opPassed)
    opsPassed += passed;
  std::printf("gradient checks: passed %d of %zu ops (%d of %zu variants)\n", opsPassed,
              opPassed.size(), variantsPassed, cases.size());

  // Every registered forward op with a differentiable operand has a check.
  mlir::MLIRContext context;
  context.loadDialect<pipec::nn::NNDialect>();
  std::set<std::string> missing;
  for (mlir::RegisteredOperationName name : context.getRegisteredOperations()) {
    std::string op = name.getStringRef().str();
    if (name.getDialectNamespace() == "nn" && !notDifferentiated.count(op) &&
        !opPassed.count(op))
      missing.insert(op);
  }
  EXPECT_TRUE(missing.empty()) << "ops without a gradient check: " << [&] {
    std::string list;
    for (const std::string &op : missing)
      list += op + " ";
    return list;
  }();
}

/// The check itself catches a wrong gradient (a sign error in the rhs of sub).
TEST(GradientCheck, DetectsAWrongGradient) {
  std::mt19937_64 rng(7);
  GradCase wrong{"nn.sub", "wrong", {random(rng, {2, 3}), random(rng, {3})},
                 [](const Tensors &in) { return Tensors{binary(BinaryOp::Sub, in[0], in[1])}; },
                 {1},
                 [](const Tensors &in, const Tensors &dy) {
                   return Tensors{unbroadcast(dy[0], in[1].shape)};
                 }};
  EXPECT_NE(check(wrong, 1), "");
}

} // namespace
