// The reference kernels on the semantics that are easy to get wrong. The
// expected values are worked out by hand in the comments, not by running the
// kernels.
#include "compiler/Evaluator/Kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

using namespace pipec::eval;
using namespace pipec::eval::kernels;

namespace {

Tensor floats(std::vector<int64_t> shape, std::vector<double> values,
              ElementKind kind = ElementKind::Float32) {
  return Tensor::ofFloats(kind, std::move(shape), std::move(values));
}
Tensor ints(std::vector<int64_t> shape, std::vector<int64_t> values,
            ElementKind kind = ElementKind::Int64) {
  return Tensor::ofInts(kind, std::move(shape), std::move(values));
}
/// 0, 1, 2, ... in the given shape.
Tensor iota(std::vector<int64_t> shape, ElementKind kind = ElementKind::Float32) {
  Tensor tensor = zeros(kind, shape);
  std::iota(tensor.floats.begin(), tensor.floats.end(), 0.0);
  return tensor;
}

void expectNear(const Tensor &actual, const std::vector<int64_t> &shape,
                const std::vector<double> &expected, double tolerance = 1e-6) {
  ASSERT_EQ(actual.shape, shape);
  ASSERT_EQ(actual.floats.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual.floats[i], expected[i], tolerance) << "element " << i;
}

TEST(Kernels, BroadcastingAlignsTrailingAxes) {
  // [2,1,3] + [4,1] -> [2,4,3]: out[i,j,k] = a[i,0,k] + b[j,0].
  Tensor a = iota({2, 1, 3});
  Tensor b = floats({4, 1}, {0, 10, 20, 30});
  Tensor sum = binary(BinaryOp::Add, a, b);
  ASSERT_EQ(sum.shape, (std::vector<int64_t>{2, 4, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(sum.floats[(i * 4 + j) * 3 + k], (i * 3 + k) + 10.0 * j);
  // A scalar broadcasts against anything; Equal yields bools.
  Tensor equal = binary(BinaryOp::Equal, a, floats({}, {4}));
  EXPECT_EQ(equal.kind, ElementKind::Bool);
  EXPECT_EQ(equal.ints, (std::vector<int64_t>{0, 0, 0, 0, 1, 0}));
  EXPECT_THROW(binary(BinaryOp::Add, iota({2, 3}), iota({2})), EvalError);
}

TEST(Kernels, IntegerArithmeticWrapsAndTruncates) {
  Tensor sum = binary(BinaryOp::Add, ints({2}, {250, 3}, ElementKind::UInt8),
                      ints({2}, {10, 4}, ElementKind::UInt8));
  EXPECT_EQ(sum.ints, (std::vector<int64_t>{4, 7})); // 260 wraps to 4
  Tensor quotient = binary(BinaryOp::Div, ints({2}, {-7, 7}), ints({2}, {2, -2}));
  EXPECT_EQ(quotient.ints, (std::vector<int64_t>{-3, -3})); // toward zero
  EXPECT_THROW(binary(BinaryOp::Div, ints({1}, {1}), ints({1}, {0})), EvalError);
  Tensor power = binary(BinaryOp::Pow, ints({2}, {3, -2}, ElementKind::Int32),
                        ints({2}, {4, 3}, ElementKind::Int32));
  EXPECT_EQ(power.ints, (std::vector<int64_t>{81, -8}));
}

TEST(Kernels, Float32ResultsAreRounded) {
  // 0.1 + 0.2 in double is not a float32; the result must be one.
  Tensor sum = binary(BinaryOp::Add, floats({1}, {0.1}), floats({1}, {0.2}));
  EXPECT_EQ(sum.floats[0], static_cast<double>(static_cast<float>(0.1 + 0.2)));
  Tensor wide = binary(BinaryOp::Add, floats({1}, {0.1}, ElementKind::Float64),
                       floats({1}, {0.2}, ElementKind::Float64));
  EXPECT_EQ(wide.floats[0], 0.1 + 0.2);
}

TEST(Kernels, CastTruncatesSaturatesAndRounds) {
  Tensor source = floats({5}, {-1.7, 2.9, 300.0, NAN, 0.0}, ElementKind::Float64);
  EXPECT_EQ(cast(source, ElementKind::Int64).ints, (std::vector<int64_t>{-1, 2, 300, 0, 0}));
  EXPECT_EQ(cast(source, ElementKind::UInt8).ints, (std::vector<int64_t>{0, 2, 255, 0, 0}));
  EXPECT_EQ(cast(source, ElementKind::Bool).ints, (std::vector<int64_t>{1, 1, 1, 1, 0}));
  // 1 + 2^-11 is halfway between two float16 values: ties go to even (1.0).
  Tensor half = cast(floats({1}, {1.0 + std::ldexp(1.0, -11)}, ElementKind::Float64),
                     ElementKind::Float16);
  EXPECT_EQ(half.floats[0], 1.0);
}

TEST(Kernels, SliceWithNegativeSteps) {
  Tensor input = iota({10});
  // start 8, end -1 ("past the first element"), step -3: 8, 5, 2.
  expectNear(slice(input, {8}, {-1}, {-3}), {3}, {8, 5, 2});
  // start 9, end 1 (exclusive), step -2: 9, 7, 5, 3.
  expectNear(slice(input, {9}, {1}, {-2}), {4}, {9, 7, 5, 3});
  // 2-D: rows reversed, every second column from 1.
  Tensor matrix = iota({3, 4});
  expectNear(slice(matrix, {2, 1}, {-1, 4}, {-1, 2}), {3, 2}, {9, 11, 5, 7, 1, 3});
  // An empty slice.
  expectNear(slice(input, {3}, {3}, {1}), {0}, {});
  EXPECT_THROW(slice(input, {0}, {11}, {1}), EvalError);
}

TEST(Kernels, ConvWithGroups) {
  // 4 input channels in 2 groups, 1x1 kernels: filter 0 sees channels 0,1
  // and filter 1 channels 2,3.
  Tensor input = iota({1, 4, 1, 2}); // channel c holds {2c, 2c+1}
  Tensor weight = floats({2, 2, 1, 1}, {1, 10, 100, 1000});
  Tensor bias = floats({2}, {0.5, -0.5});
  Tensor out = conv(input, weight, &bias, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2);
  // filter 0: 1*{0,1} + 10*{2,3} + 0.5; filter 1: 100*{4,5} + 1000*{6,7} - 0.5.
  expectNear(out, {1, 2, 1, 2}, {20.5, 31.5, 6399.5, 7499.5});
  // Depthwise-style mismatch: 4 channels cannot make 3 groups.
  EXPECT_THROW(conv(input, weight, nullptr, {1, 1}, {0, 0, 0, 0}, {1, 1}, 3), EvalError);
}

TEST(Kernels, ConvWithPadsStridesAndDilations) {
  // 1-D: x = 1..5, kernel {1, 2}, dilation 2, pads 1/1, stride 2.
  // Padded x is 0 1 2 3 4 5 0; the windows start at 0, 2 and 4 and read
  // padded[s] * 1 + padded[s + 2] * 2: 0 + 4, 2 + 8, 4 + 0.
  Tensor input = floats({1, 1, 5}, {1, 2, 3, 4, 5});
  Tensor weight = floats({1, 1, 2}, {1, 2});
  expectNear(conv(input, weight, nullptr, {2}, {1, 1}, {2}, 1), {1, 1, 3}, {4, 10, 4});
}

TEST(Kernels, PoolingCeilMode) {
  Tensor input = floats({1, 1, 6}, {1, 2, 3, 4, 5, 6});
  // kernel 3, stride 2: floor gives 2 windows, ceil 3 (the last one covers
  // positions 4, 5 and one past the end).
  expectNear(maxPool(input, {3}, {2}, {0, 0}, {1}, false), {1, 1, 2}, {3, 5});
  expectNear(maxPool(input, {3}, {2}, {0, 0}, {1}, true), {1, 1, 3}, {3, 5, 6});
  // The partial window averages the elements it covers: (5 + 6) / 2,
  // with or without count_include_pad (nothing of it is padding).
  expectNear(averagePool(input, {3}, {2}, {0, 0}, true, false), {1, 1, 3}, {2, 4, 5.5});
  expectNear(averagePool(input, {3}, {2}, {0, 0}, true, true), {1, 1, 3}, {2, 4, 5.5});
  // A last window that would start in the end padding is dropped.
  EXPECT_EQ(windowOutputSize(2, 2, 2, 0, 1, 1, true), 1);
  EXPECT_EQ(windowOutputSize(3, 2, 2, 0, 0, 1, true), 2);
  EXPECT_EQ(windowOutputSize(3, 2, 2, 0, 0, 1, false), 1);
}

TEST(Kernels, AveragePoolCountIncludePad) {
  // x = 1, 2, 3 with one pad each side, kernel 2, stride 1:
  // windows [pad,1] [1,2] [2,3] [3,pad].
  Tensor input = floats({1, 1, 3}, {1, 2, 3});
  expectNear(averagePool(input, {2}, {1}, {1, 1}, false, true), {1, 1, 4}, {0.5, 1.5, 2.5, 1.5});
  expectNear(averagePool(input, {2}, {1}, {1, 1}, false, false), {1, 1, 4}, {1, 1.5, 2.5, 3});
  // Max pooling ignores padding even when all inputs are negative.
  Tensor negative = floats({1, 1, 2}, {-3, -4});
  expectNear(maxPool(negative, {2}, {1}, {1, 1}, {1}, false), {1, 1, 3}, {-3, -3, -4});
}

TEST(Kernels, SoftmaxCrossEntropyWithIgnoreIndexAndWeights) {
  // Two classes with scores {0, ln 3}: log p = {ln 1/4, ln 3/4}.
  double l0 = std::log(0.25), l1 = std::log(0.75);
  Tensor scores = floats({3, 2}, {0, std::log(3.0), 0, std::log(3.0), 0, std::log(3.0)},
                         ElementKind::Float64);
  Tensor labels = ints({3}, {0, 1, 0});
  Tensor weights = floats({2}, {2, 5}, ElementKind::Float64);
  // Sample 1 (label 1) is ignored: mean = (2*-l0 + 2*-l0) / (2 + 2).
  auto mean = softmaxCrossEntropyLoss(scores, labels, &weights, "mean", 1);
  expectNear(mean.loss, {}, {-l0}, 1e-12);
  expectNear(mean.logProb, {3, 2}, {l0, l1, l0, l1, l0, l1}, 1e-12);
  auto none = softmaxCrossEntropyLoss(scores, labels, &weights, "none", 1);
  expectNear(none.loss, {3}, {-2 * l0, 0, -2 * l0}, 1e-12);
  // Without weights the mean divides by the count of counted samples.
  auto unweighted = softmaxCrossEntropyLoss(scores, labels, nullptr, "mean", 0);
  expectNear(unweighted.loss, {}, {-l1}, 1e-12);
  auto sum = softmaxCrossEntropyLoss(scores, labels, &weights, "sum", std::nullopt);
  expectNear(sum.loss, {}, {-2 * l0 - 5 * l1 - 2 * l0}, 1e-12);
  // A label that is neither a class nor ignored is an error.
  EXPECT_THROW(softmaxCrossEntropyLoss(scores, ints({3}, {0, 2, 0}), nullptr, "mean", -100),
               EvalError);
}

TEST(Kernels, SoftmaxIsStableForLargeScores) {
  Tensor out = softmax(floats({1, 3}, {1000, 1001, 1002}, ElementKind::Float64), -1);
  double e0 = 1, e1 = std::exp(1.0), e2 = std::exp(2.0), total = e0 + e1 + e2;
  expectNear(out, {1, 3}, {e0 / total, e1 / total, e2 / total}, 1e-12);
}

TEST(Kernels, BatchNormTrainingUpdatesRunningStatistics) {
  // One channel, values 1..4: mean 2.5, population variance 1.25.
  Tensor input = floats({2, 1, 2}, {1, 2, 3, 4}, ElementKind::Float64);
  Tensor one = floats({1}, {1}, ElementKind::Float64), zero = floats({1}, {0}, ElementKind::Float64);
  auto results = batchNorm(input, one, zero, floats({1}, {10}, ElementKind::Float64),
                           floats({1}, {20}, ElementKind::Float64), 0.0, 0.9, true);
  double s = 1 / std::sqrt(1.25);
  expectNear(results.output, {2, 1, 2}, {-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s}, 1e-12);
  expectNear(results.runningMean, {1}, {0.9 * 10 + 0.1 * 2.5}, 1e-12);
  expectNear(results.runningVar, {1}, {0.9 * 20 + 0.1 * 1.25}, 1e-12);
  // Inference uses and returns the running statistics.
  auto inference = batchNorm(input, one, zero, floats({1}, {1}, ElementKind::Float64),
                             floats({1}, {4}, ElementKind::Float64), 0.0, 0.9, false);
  expectNear(inference.output, {2, 1, 2}, {0, 0.5, 1, 1.5}, 1e-12);
  expectNear(inference.runningVar, {1}, {4}, 1e-12);
}

TEST(Kernels, LayerNormReturnsStatistics) {
  Tensor input = floats({2, 2}, {1, 3, 2, 2}, ElementKind::Float64);
  Tensor scale = floats({2}, {1, 2}, ElementKind::Float64);
  Tensor bias = floats({2}, {0, 1}, ElementKind::Float64);
  auto results = layerNorm(input, scale, &bias, -1, 0.0, /*centered=*/true);
  // Row 0: mean 2, variance 1 -> {-1, 1} -> scaled and shifted {-1, 3}.
  // (Row 1 has variance 0: only a positive epsilon makes it finite.)
  expectNear(results.mean, {2, 1}, {2, 2}, 1e-12);
  EXPECT_NEAR(results.output.floats[0], -1, 1e-12);
  EXPECT_NEAR(results.output.floats[1], 3, 1e-12);
  auto withEpsilon = layerNorm(input, scale, &bias, 1, 1.0, /*centered=*/true);
  // Epsilon 1: row 0 has 1/sqrt(2), row 1 (variance 0) 1.
  expectNear(withEpsilon.invStdDev, {2, 1}, {1 / std::sqrt(2.0), 1.0}, 1e-12);
  expectNear(withEpsilon.output, {2, 2}, {-1 / std::sqrt(2.0), 1 + 2 / std::sqrt(2.0), 0, 1},
             1e-12);
}

TEST(Kernels, RmsNormDividesByTheRootMeanSquare) {
  Tensor input = floats({2, 2}, {3, 4, 0, 2}, ElementKind::Float64);
  Tensor scale = floats({2}, {1, 2}, ElementKind::Float64);
  auto results = layerNorm(input, scale, nullptr, -1, 0.0, /*centered=*/false);
  // Row 0: mean square 12.5; row 1: 2. The mean is 0.
  expectNear(results.mean, {2, 1}, {0, 0}, 1e-12);
  expectNear(results.invStdDev, {2, 1}, {1 / std::sqrt(12.5), 1 / std::sqrt(2.0)}, 1e-12);
  expectNear(results.output, {2, 2},
             {3 / std::sqrt(12.5), 8 / std::sqrt(12.5), 0, 4 / std::sqrt(2.0)}, 1e-12);
}

TEST(Kernels, MatMulPromotesVectorsAndBroadcastsBatches) {
  Tensor a = iota({2, 1, 2, 3}); // two batches of one 2x3 matrix
  Tensor b = iota({3, 3, 1});    // three 3x1 matrices
  Tensor out = matmul(a, b);     // batch [2,3], each 2x1
  ASSERT_EQ(out.shape, (std::vector<int64_t>{2, 3, 2, 1}));
  // out[i, j] = a[i] (2x3) * b[j] (3x1).
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int r = 0; r < 2; ++r) {
        double sum = 0;
        for (int p = 0; p < 3; ++p)
          sum += (i * 6 + r * 3 + p) * (j * 3 + p);
        EXPECT_EQ(out.floats[(i * 3 + j) * 2 + r], sum);
      }
  // 1-D x 1-D is a dot product of rank 0; matrix x vector drops the axis.
  expectNear(matmul(iota({3}), iota({3})), {}, {5});
  expectNear(matmul(iota({2, 3}), iota({3})), {2}, {5, 14});
  expectNear(matmul(iota({3}), iota({3, 2})), {2}, {10, 13});
}

TEST(Kernels, GemmTransposesAndBroadcastsC) {
  Tensor a = floats({2, 1}, {1, 2}); // transposed: 1x2
  Tensor b = floats({3, 2}, {1, 0, 0, 1, 1, 1}); // transposed: 2x3
  Tensor c = floats({3}, {100, 200, 300});
  expectNear(gemm(a, b, &c, 2.0, 0.5, true, true), {1, 3}, {52, 104, 156});
}

TEST(Kernels, GatherWithNegativeIndices) {
  Tensor data = iota({3, 2});
  expectNear(gather(data, ints({2, 1}, {-1, 0}), 0), {2, 1, 2}, {4, 5, 0, 1});
  expectNear(gather(data, ints({1}, {1}), 1), {3, 1}, {1, 3, 5});
  EXPECT_THROW(gather(data, ints({1}, {3}), 0), EvalError);
}

TEST(Kernels, DataMovement) {
  Tensor x = iota({2, 3});
  expectNear(transpose(x, {1, 0}), {3, 2}, {0, 3, 1, 4, 2, 5});
  expectNear(expand(floats({3, 1}, {1, 2, 3}), {2, 3, 2}), {2, 3, 2},
             {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  Tensor y = iota({2, 1});
  expectNear(concat({&x, &y}, -1), {2, 4}, {0, 1, 2, 0, 3, 4, 5, 1});
  auto pieces = split(x, 1, {1, 0, 2});
  ASSERT_EQ(pieces.size(), 3u);
  expectNear(pieces[0], {2, 1}, {0, 3});
  expectNear(pieces[1], {2, 0}, {});
  expectNear(pieces[2], {2, 2}, {1, 2, 4, 5});
  expectNear(pad(x, {1, 0, 0, 1}, -1), {3, 4}, {-1, -1, -1, -1, 0, 1, 2, -1, 3, 4, 5, -1});
  expectNear(reduceMean(iota({2, 3, 2}), {0, 2}, false), {3}, {3.5, 5.5, 7.5});
  expectNear(reduceMean(iota({2, 2}), {}, true), {1, 1}, {1.5});
  Tensor condition = ints({2, 1}, {1, 0}, ElementKind::Bool);
  expectNear(where(condition, x, floats({}, {-1})), {2, 3}, {0, 1, 2, -1, -1, -1});
}

TEST(Kernels, GeluVariants) {
  Tensor x = floats({2}, {1.0, -0.5}, ElementKind::Float64);
  expectNear(unary(UnaryOp::Gelu, x), {2},
             {0.5 * (1 + std::erf(1 / std::sqrt(2.0))),
              -0.25 * (1 + std::erf(-0.5 / std::sqrt(2.0)))},
             1e-15);
  // The tanh form agrees with the exact one to about 1e-3.
  Tensor exact = unary(UnaryOp::Gelu, x), approximate = unary(UnaryOp::GeluTanh, x);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(exact.floats[i], approximate.floats[i], 1e-3);
    EXPECT_NE(exact.floats[i], approximate.floats[i]);
  }
}

TEST(Kernels, DropoutMaskIsKeyedAndScaled) {
  Tensor x = floats({1000}, std::vector<double>(1000, 2.0));
  uint64_t key = dropoutStreamKey(1, 2, 3, 4);
  auto first = dropout(x, 0.25, true, key), again = dropout(x, 0.25, true, key);
  EXPECT_EQ(first.mask.ints, again.mask.ints); // stateless: same key, same mask
  int64_t kept = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    kept += first.mask.ints[i];
    EXPECT_EQ(first.output.floats[i], first.mask.ints[i] ? static_cast<float>(2.0 / 0.75) : 0.0);
  }
  // Binomial(1000, 0.75): mean 750, standard deviation ~13.7.
  EXPECT_NEAR(kept, 750, 70);
  // Every key part changes the mask.
  for (uint64_t other : {dropoutStreamKey(9, 2, 3, 4), dropoutStreamKey(1, 9, 3, 4),
                         dropoutStreamKey(1, 2, 9, 4), dropoutStreamKey(1, 2, 3, 9)})
    EXPECT_NE(dropout(x, 0.25, true, other).mask.ints, first.mask.ints);
  // Inference mode and ratio 0 are the identity with an all-true mask.
  for (auto results : {dropout(x, 0.25, false, key), dropout(x, 0.0, true, key)}) {
    EXPECT_EQ(results.output.floats, x.floats);
    EXPECT_EQ(results.mask.ints, std::vector<int64_t>(1000, 1));
  }
}

TEST(Kernels, DropoutGeneratorIsPinned) {
  // Generated code must reproduce these bits exactly (docs/evaluator.md).
  // SplitMix64 seeded with 0: its first output is 0xE220A8397B1DCDAF.
  EXPECT_EQ(mix64(0x9E3779B97F4A7C15ull), 0xE220A8397B1DCDAFull);
  uint64_t key = dropoutStreamKey(0, 0, 0, 0);
  double u = dropoutUniform(key, 0);
  EXPECT_EQ(u, static_cast<double>(mix64(key + 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
}

//===----------------------------------------------------------------------===//
// Gradients: the semantics finite differences cannot see (GradientTest.cpp
// checks the derivatives themselves).
//===----------------------------------------------------------------------===//

TEST(Kernels, MaxPoolGradGoesToTheFirstMaximum) {
  // One 2x2 window over [[3, 5], [5, 1]]: the tie goes to the first 5 in
  // row-major order, (0, 1).
  Tensor input = floats({1, 1, 2, 2}, {3, 5, 5, 1});
  Tensor grad = maxPoolGrad(floats({1, 1, 1, 1}, {2}), input, {2, 2}, {1, 1}, {0, 0, 0, 0},
                            {1, 1}, false);
  EXPECT_EQ(grad.floats, (std::vector<double>{0, 2, 0, 0}));
  // Overlapping windows accumulate: kernel 2, stride 1 over [1, 4, 2]: both
  // windows pick the 4.
  Tensor row = maxPoolGrad(floats({1, 1, 2}, {1, 10}), floats({1, 1, 3}, {1, 4, 2}), {2}, {1},
                           {0, 0}, {1}, false);
  EXPECT_EQ(row.floats, (std::vector<double>{0, 11, 0}));
}

TEST(Kernels, AveragePoolGradDividesLikeTheForward) {
  // Kernel 2, stride 2, pads [1, 1] over 3 elements: windows {pad, 0},
  // {1, 2}. Without count_include_pad the first divides by 1.
  Tensor grad = averagePoolGrad(floats({1, 1, 2}, {6, 8}), {1, 1, 3}, {2}, {2}, {1, 1}, false,
                                false);
  EXPECT_EQ(grad.floats, (std::vector<double>{6, 4, 4}));
  Tensor padded = averagePoolGrad(floats({1, 1, 2}, {6, 8}), {1, 1, 3}, {2}, {2}, {1, 1}, false,
                                  true);
  EXPECT_EQ(padded.floats, (std::vector<double>{3, 4, 4}));
}

TEST(Kernels, SoftmaxCrossEntropyGradIgnoresAndWeighs) {
  // Two samples, two classes, equal scores (softmax 1/2); labels 1 and
  // ignored. mean: only the first counts, with weight 3 of total 3:
  // d = dloss * (p - onehot) = 2 * [0.5, -0.5].
  Tensor scores = floats({2, 2}, {0, 0, 0, 0});
  Tensor labels = ints({2}, {1, -100});
  Tensor weights = floats({2}, {1, 3});
  Tensor grad = softmaxCrossEntropyLossGrad(floats({}, {2}), scores, labels, &weights, "mean",
                                            -100);
  EXPECT_EQ(grad.floats, (std::vector<double>{1, -1, 0, 0}));
  // sum: the weight scales the gradient: 3 * 2 * [0.5, -0.5].
  grad = softmaxCrossEntropyLossGrad(floats({}, {2}), scores, labels, &weights, "sum", -100);
  EXPECT_EQ(grad.floats, (std::vector<double>{3, -3, 0, 0}));
  // Every element ignored: nothing contributes, the gradient is 0.
  grad = softmaxCrossEntropyLossGrad(floats({}, {1}), scores, ints({2}, {-100, -100}), nullptr,
                                     "mean", -100);
  EXPECT_EQ(grad.floats, (std::vector<double>{0, 0, 0, 0}));
  // dloss must have the loss's shape.
  EXPECT_THROW(softmaxCrossEntropyLossGrad(floats({2}, {1, 1}), scores, labels, nullptr, "mean",
                                           std::nullopt),
               EvalError);
}

TEST(Kernels, ReduceSumWithoutAxesIsTheIdentity) {
  Tensor x = floats({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(reduceSum(x, {}, true).floats, x.floats);
  EXPECT_EQ(reduceSum(x, {0}, false).floats, (std::vector<double>{4, 6}));
  EXPECT_EQ(reduceSum(x, {0, 1}, true).shape, (std::vector<int64_t>{1, 1}));
  EXPECT_THROW(reduceSum(x, {1, 0}, true), EvalError);
}

TEST(Kernels, GradientsScatterIntoTheSourceShape) {
  // gather_grad: repeated and negative indices accumulate.
  Tensor gathered = gatherGrad(floats({3}, {1, 2, 4}), ints({3}, {0, -1, 0}), 0, {2});
  EXPECT_EQ(gathered.floats, (std::vector<double>{5, 2}));
  // slice_grad with a negative step: x[3:0:-2] of 4 elements picks 3 and 1.
  Tensor sliced = sliceGrad(floats({2}, {7, 9}), {3}, {0}, {-2}, {4});
  EXPECT_EQ(sliced.floats, (std::vector<double>{0, 9, 0, 7}));
  EXPECT_THROW(sliceGrad(floats({3}, {7, 9, 1}), {3}, {0}, {-2}, {4}), EvalError);
  // dropout_grad: the mask and 1/(1 - ratio) in training, identity outside.
  Tensor mask = ints({3}, {1, 0, 1}, ElementKind::Bool);
  EXPECT_EQ(dropoutGrad(floats({3}, {1, 1, 3}), mask, 0.5, true).floats,
            (std::vector<double>{2, 0, 6}));
  EXPECT_EQ(dropoutGrad(floats({3}, {1, 1, 3}), mask, 0.5, false).floats,
            (std::vector<double>{1, 1, 3}));
}

} // namespace
