#include "TestUtil.h"

#include <algorithm>
#include <limits>

using namespace kt;

namespace {

TEST(BatchNorm, TrainingUsesBatchStatisticsAndUpdatesRunning) {
  const pk::Shape xs{3, 2, 2, 2};
  auto x = randomVec(xs.numel(), 1, -2.0f, 3.0f);
  const float scale[2] = {1.5f, -0.5f}, bias[2] = {0.1f, 0.2f}, rm[2] = {0.3f, -0.1f}, rv[2] = {1.2f, 0.8f};
  std::vector<float> y(x.size());
  float nm[2], nv[2];
  pk::batchNorm(x.data(), xs, scale, bias, rm, rv, y.data(), nm, nv, 1e-5f, 0.9f, true);
  for (int c = 0; c < 2; ++c) {
    double sum = 0, sq = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) sum += x[(n * 2 + c) * 4 + i];
    const double mean = sum / 12;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) sq += std::pow(x[(n * 2 + c) * 4 + i] - mean, 2);
    const double var = sq / 12; // population variance
    EXPECT_NEAR(nm[c], 0.9 * rm[c] + 0.1 * mean, 1e-6);
    EXPECT_NEAR(nv[c], 0.9 * rv[c] + 0.1 * var, 1e-6);
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) {
        const int k = (n * 2 + c) * 4 + i;
        EXPECT_NEAR(y[k], (x[k] - mean) / std::sqrt(var + 1e-5) * scale[c] + bias[c], 2e-5);
      }
  }
  // In place: the new statistics may overwrite the running ones.
  float rm2[2] = {rm[0], rm[1]}, rv2[2] = {rv[0], rv[1]};
  pk::batchNorm(x.data(), xs, scale, bias, rm2, rv2, y.data(), rm2, rv2, 1e-5f, 0.9f, true);
  EXPECT_EQ(rm2[0], nm[0]);
  EXPECT_EQ(rv2[1], nv[1]);
  // The parameter gradient added into buffers that hold something: the bits
  // of writing it elsewhere and adding.
  std::vector<float> dy(x.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.25f * (float)(i % 7) - 0.7f;
  float ds[2], db[2], dsAdded[2] = {0.5f, -1.25f}, dbAdded[2] = {2.0f, 0.125f};
  pk::batchNormParamGrad(dy.data(), x.data(), xs, rm, rv, ds, db, 1e-5f, true);
  pk::batchNormParamGrad(dy.data(), x.data(), xs, rm, rv, dsAdded, dbAdded, 1e-5f, true, true);
  EXPECT_EQ(dsAdded[0], 0.5f + ds[0]);
  EXPECT_EQ(dsAdded[1], -1.25f + ds[1]);
  EXPECT_EQ(dbAdded[0], 2.0f + db[0]);
  EXPECT_EQ(dbAdded[1], 0.125f + db[1]);
}

// The epilogue pipec-fuse-norm-epilogue folds in: f(normalized + residual)
// for f ReLU and ReLU6 (a residual wide enough to reach both of ReLU6's
// bounds), bit for bit the separate ops, in training and inference, and a
// refusal of an activation the kernels do not apply.
TEST(BatchNorm, EpilogueIsTheSeparateOps) {
  const pk::Shape xs{3, 2, 4, 5};
  auto x = randomVec(xs.numel(), 11, -2.0f, 3.0f), r = randomVec(xs.numel(), 12, -4.0f, 10.0f);
  const float scale[2] = {1.5f, -0.5f}, bias[2] = {0.1f, 0.2f}, rm[2] = {0.3f, -0.1f}, rv[2] = {1.2f, 0.8f};
  for (pk::Unary activation : {pk::Unary::Relu, pk::Unary::Relu6})
    for (bool training : {true, false}) {
      std::vector<float> fused(x.size()), separate(x.size());
      float nm[2], nv[2], nm2[2], nv2[2];
      pk::batchNorm(x.data(), xs, scale, bias, rm, rv, fused.data(), nm, nv, 1e-5f, 0.9f, training, r.data(),
                    activation);
      pk::batchNorm(x.data(), xs, scale, bias, rm, rv, separate.data(), nm2, nv2, 1e-5f, 0.9f, training);
      pk::binary(pk::Binary::Add, separate.data(), xs, r.data(), xs, separate.data());
      pk::unary(activation, separate.data(), xs.numel(), separate.data());
      int atSix = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(fused[i], separate[i]) << "[" << i << "] training " << training;
        atSix += fused[i] == 6.0f;
      }
      if (activation == pk::Unary::Relu6) EXPECT_GT(atSix, 0) << "no value reached ReLU6's upper bound";
      EXPECT_EQ(nm[0], nm2[0]);
      EXPECT_EQ(nv[1], nv2[1]);
      EXPECT_THROW(pk::batchNorm(x.data(), xs, scale, bias, rm, rv, fused.data(), nm, nv, 1e-5f, 0.9f, training,
                                 nullptr, pk::Unary::Gelu),
                   pk::KernelError);
    }
}

// The activation's gradient (ReLU's, ReLU6's) folded into the input
// gradient (pipec-fuse-norm-epilogue): the bits of nn.unary_grad then
// batch_norm_grad, in training and inference, the masked gradient written
// where asked; y holds both of ReLU6's bounds and values between.
TEST(BatchNorm, GradientThroughReluIsTheSeparateOps) {
  const pk::Shape xs{3, 2, 4, 5};
  auto x = randomVec(xs.numel(), 21, -2.0f, 3.0f), dy = randomVec(xs.numel(), 22),
       y = randomVec(xs.numel(), 23, -2.0f, 8.0f);
  for (float &v : y) v = std::min(std::max(v, 0.0f), 6.0f);
  const float scale[2] = {1.5f, -0.5f}, rm[2] = {0.3f, -0.1f}, rv[2] = {1.2f, 0.8f};
  for (pk::Unary activation : {pk::Unary::Relu, pk::Unary::Relu6})
    for (bool training : {true, false}) {
      std::vector<float> fused(x.size()), masked(x.size(), NAN), g(x.size()), separate(x.size());
      pk::batchNormGrad(dy.data(), x.data(), xs, scale, rm, rv, fused.data(), 1e-5f, training, y.data(),
                        activation, masked.data());
      pk::unaryGrad(activation, dy.data(), nullptr, y.data(), xs.numel(), g.data());
      pk::batchNormGrad(g.data(), x.data(), xs, scale, rm, rv, separate.data(), 1e-5f, training);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(fused[i], separate[i]) << "dx [" << i << "] training " << training;
        ASSERT_EQ(masked[i], g[i]) << "masked dy [" << i << "] training " << training;
        if (activation == pk::Unary::Relu6 && (y[i] == 6.0f || y[i] == 0.0f))
          ASSERT_EQ(masked[i], 0.0f) << "a bound of ReLU6 passed a gradient at [" << i << "]";
      }
      EXPECT_THROW(pk::batchNormGrad(dy.data(), x.data(), xs, scale, rm, rv, fused.data(), 1e-5f, training, nullptr,
                                     activation),
                   pk::KernelError);
    }
}

// Statistics and gradient sums over long channels (runs longer than the
// kernel's lanes, of uneven length, 2·10^5 elements a channel, far from
// zero mean) against double-precision loops.
TEST(BatchNorm, LongChannelsMatchDoublePrecision) {
  for (const pk::Shape xs : {pk::Shape{3, 2, 37, 29}, pk::Shape{200, 2, 1000}, pk::Shape{5, 3, 31}}) {
    const int64_t N = xs[0], C = xs[1], inner = xs.numel() / (N * C);
    auto x = randomVec(xs.numel(), 2, 998.0f, 1003.0f), dy = randomVec(xs.numel(), 3, -1.0f, 1.0f);
    const float scale[3] = {1.5f, -0.5f, 2.0f}, bias[3] = {0.1f, 0.2f, 0.3f}, rm[3] = {}, rv[3] = {1, 1, 1};
    std::vector<float> y(x.size()), dx(x.size());
    float nm[3], nv[3], ds[3], db[3];
    pk::batchNorm(x.data(), xs, scale, bias, rm, rv, y.data(), nm, nv, 1e-5f, 0.0f, true);
    pk::batchNormGrad(dy.data(), x.data(), xs, scale, rm, rv, dx.data(), 1e-5f, true);
    pk::batchNormParamGrad(dy.data(), x.data(), xs, rm, rv, ds, db, 1e-5f, true);
    for (int64_t c = 0; c < C; ++c) {
      auto at = [&](int64_t n, int64_t i) { return (n * C + c) * inner + i; };
      const double count = (double)(N * inner);
      double sum = 0, sq = 0, sumDy = 0, sumDyXhat = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) sum += x[at(n, i)];
      const double mean = sum / count;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) sq += (x[at(n, i)] - mean) * (x[at(n, i)] - mean);
      const double var = sq / count, inv = 1 / std::sqrt(var + 1e-5);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          sumDy += dy[at(n, i)];
          sumDyXhat += dy[at(n, i)] * (x[at(n, i)] - mean) * inv;
        }
      SCOPED_TRACE(xs.str() + " channel " + std::to_string(c));
      EXPECT_NEAR(nm[c], mean, 2e-6 * std::abs(mean));
      EXPECT_NEAR(nv[c], var, 1e-4 * var);
      EXPECT_NEAR(db[c], sumDy, 1e-5 * count);
      EXPECT_NEAR(ds[c], sumDyXhat, 1e-5 * count);
      double worstY = 0, worstDx = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          const int64_t k = at(n, i);
          const double xhat = (x[k] - mean) * inv;
          worstY = std::max(worstY, std::abs(y[k] - (xhat * scale[c] + bias[c])));
          worstDx = std::max(worstDx,
                             std::abs(dx[k] - scale[c] * inv * (dy[k] - sumDy / count - xhat * sumDyXhat / count)));
        }
      // x is 1000 ± 3 in float: its rounding alone moves x̂ by ~4e-5
      EXPECT_LT(worstY, 5e-4);
      EXPECT_LT(worstDx, 5e-4);
    }
  }
}

TEST(BatchNorm, InferenceUsesRunningStatistics) {
  const pk::Shape xs{2, 3};
  const float x[6] = {1, 2, 3, 4, 5, 6};
  const float scale[3] = {1, 2, 3}, bias[3] = {0, 1, -1}, rm[3] = {1, 1, 1}, rv[3] = {4, 1, 0.25f};
  float y[6], nm[3], nv[3];
  pk::batchNorm(x, xs, scale, bias, rm, rv, y, nm, nv, 0.0f, 0.9f, false);
  const float want[6] = {0.0f, 3.0f, 11.0f, 1.5f, 9.0f, 29.0f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(y[i], want[i], 1e-5);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(nm[c], rm[c]);
    EXPECT_EQ(nv[c], rv[c]);
  }
}

void referenceLayerNorm(const std::vector<float> &x, int64_t rows, int64_t inner, const std::vector<float> &g,
                        const std::vector<float> &b, float eps, std::vector<float> &y, std::vector<float> &mean,
                        std::vector<float> &inv) {
  y.resize(x.size());
  mean.resize(rows);
  inv.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < inner; ++i) m += x[r * inner + i];
    m /= inner;
    for (int64_t i = 0; i < inner; ++i) v += std::pow(x[r * inner + i] - m, 2);
    v /= inner;
    const double is = 1 / std::sqrt(v + eps);
    mean[r] = (float)m;
    inv[r] = (float)is;
    for (int64_t i = 0; i < inner; ++i) y[r * inner + i] = (float)((x[r * inner + i] - m) * is * g[i] + b[i]);
  }
}

TEST(LayerNorm, MatchesReferenceWithStatistics) {
  const pk::Shape xs{2, 3, 8};
  auto x = randomVec(xs.numel(), 7, -3.0f, 5.0f), g = randomVec(8, 8), b = randomVec(8, 9);
  std::vector<float> y(x.size()), mean(6), inv(6), wy, wm, wi;
  pk::layerNorm(x.data(), xs, g.data(), {8}, b.data(), {8}, y.data(), mean.data(), inv.data(), -1, 1e-5f);
  referenceLayerNorm(x, 6, 8, g, b, 1e-5f, wy, wm, wi);
  expectAllNear(y, wy, 1e-5, "y");
  expectAllNear(mean, wm, 1e-6, "mean");
  expectAllNear(inv, wi, 1e-5, "invStd");
  // Over the last two axes (axis 1 of 3), scale broadcast from [8], no bias.
  std::vector<float> g24(24), zeros(24, 0.0f);
  for (int i = 0; i < 24; ++i) g24[i] = g[i % 8];
  pk::layerNorm(x.data(), xs, g.data(), {1, 8}, nullptr, {}, y.data(), nullptr, nullptr, 1, 1e-5f);
  referenceLayerNorm(x, 2, 24, g24, zeros, 1e-5f, wy, wm, wi);
  expectAllNear(y, wy, 1e-5, "axis 1");
  EXPECT_THROW(pk::layerNorm(x.data(), xs, g.data(), {7}, nullptr, {}, y.data(), nullptr, nullptr, -1, 1e-5f),
               pk::KernelError);
  EXPECT_THROW(pk::layerNorm(x.data(), xs, g.data(), {8}, nullptr, {}, y.data(), nullptr, nullptr, 3, 1e-5f),
               pk::KernelError);
}

/// The evaluator's pooling loop: every kernel position, inside / inside-padded tests.
std::vector<float> referencePool(bool isMax, const std::vector<float> &x, const pk::Shape &xs, const pk::Dims &k,
                                 const pk::Dims &s, const pk::Dims &p, const pk::Dims &d, bool ceil, bool include) {
  const pk::Shape os = pk::poolOutputShape(xs, k, s, p, d, ceil);
  const int sp = xs.size - 2;
  std::vector<float> y;
  forEachIndex(vecOf(os), [&](const std::vector<int64_t> &o) {
    double best = -std::numeric_limits<double>::infinity(), sum = 0;
    int64_t count = 0;
    forEachIndex(std::vector<int64_t>(k.v, k.v + sp), [&](const std::vector<int64_t> &kk) {
      bool inside = true, insidePadded = true;
      int64_t off = o[0] * xs[1] + o[1];
      for (int a = 0; a < sp; ++a) {
        const int64_t q = o[a + 2] * s[a] - p[a] + kk[a] * (d.size ? d[a] : 1);
        if (q < 0 || q >= xs[a + 2]) inside = false;
        if (q < -p[a] || q >= xs[a + 2] + p[a + sp]) insidePadded = false;
        off = off * xs[a + 2] + q;
      }
      if (inside) {
        best = std::max(best, (double)x[off]);
        sum += x[off];
      }
      if (include ? insidePadded : inside) ++count;
    });
    y.push_back(isMax ? (float)best : (float)(sum / count));
  });
  return y;
}

struct PoolCase {
  pk::Shape xs;
  pk::Dims k, s, p, d;
  bool ceil;
};
const PoolCase kPoolCases[] = {
    {{1, 1, 7}, {3}, {2}, {1, 1}, {1}, false},
    {{2, 3, 7}, {2}, {2}, {0, 0}, {1}, true},
    {{1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, false},
    {{1, 1, 5, 5}, {3, 3}, {2, 2}, {0, 0, 1, 1}, {1, 1}, true},
    {{2, 1, 6, 5}, {2, 2}, {1, 2}, {0, 1, 1, 0}, {2, 1}, true},
    {{1, 2, 4, 5, 3}, {2, 2, 2}, {2, 1, 1}, {1, 0, 0, 0, 1, 1}, {1, 1, 1}, false},
};

TEST(Pool, MaxPoolKnownValues) {
  std::vector<float> x16(16), x25(25);
  for (int i = 0; i < 25; ++i) {
    if (i < 16) x16[i] = (float)(i + 1);
    x25[i] = (float)(i + 1);
  }
  std::vector<float> y(4);
  // ONNX maxpool_2d_ceil
  pk::maxPool(x16.data(), {1, 1, 4, 4}, y.data(), {3, 3}, {2, 2}, {0, 0, 0, 0}, {1, 1}, true);
  EXPECT_EQ(y, (std::vector<float>{11, 12, 15, 16}));
  // ONNX maxpool_2d_dilations
  pk::maxPool(x16.data(), {1, 1, 4, 4}, y.data(), {2, 2}, {1, 1}, {0, 0, 0, 0}, {2, 2}, false);
  EXPECT_EQ(y, (std::vector<float>{11, 12, 15, 16}));
  // ONNX maxpool_2d_pads
  std::vector<float> y25(25);
  pk::maxPool(x25.data(), {1, 1, 5, 5}, y25.data(), {5, 5}, {1, 1}, {2, 2, 2, 2}, {1, 1}, false);
  EXPECT_EQ(y25, (std::vector<float>{13, 14, 15, 15, 15, 18, 19, 20, 20, 20, 23, 24, 25, 25, 25, 23, 24, 25, 25, 25,
                                     23, 24, 25, 25, 25}));
  // Padding never wins, even against negative inputs.
  const float neg[4] = {-4, -3, -2, -1};
  float out[9];
  pk::maxPool(neg, {1, 1, 2, 2}, out, {2, 2}, {1, 1}, {1, 1, 1, 1}, {1, 1}, false);
  EXPECT_EQ(out[0], -4.0f);
  EXPECT_EQ(out[4], -1.0f);
}

TEST(Pool, AveragePoolCountsAndCeilMode) {
  const float x[4] = {1, 2, 3, 4};
  float y[9];
  pk::averagePool(x, {1, 1, 2, 2}, y, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, false);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[4], 2.5f);
  EXPECT_EQ(y[1], 1.5f);
  pk::averagePool(x, {1, 1, 2, 2}, y, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, true);
  EXPECT_EQ(y[0], 0.25f);
  EXPECT_EQ(y[1], 0.75f);
  // Ceil mode: the last window hangs past the end; those positions never count.
  const float r[5] = {1, 2, 3, 4, 5};
  float z[3];
  EXPECT_EQ(pk::poolOutputShape({1, 1, 5}, {2}, {2}, {0, 0}, {}, true), (pk::Shape{1, 1, 3}));
  pk::averagePool(r, {1, 1, 5}, z, {2}, {2}, {0, 0}, true, true);
  EXPECT_EQ(z[0], 1.5f);
  EXPECT_EQ(z[1], 3.5f);
  EXPECT_EQ(z[2], 5.0f);
}

TEST(Pool, MatchReferenceLoops) {
  int seed = 40;
  for (const PoolCase &c : kPoolCases) {
    auto x = randomVec(c.xs.numel(), seed++);
    const pk::Shape os = pk::poolOutputShape(c.xs, c.k, c.s, c.p, c.d, c.ceil);
    std::vector<float> y(os.numel());
    pk::maxPool(x.data(), c.xs, y.data(), c.k, c.s, c.p, c.d, c.ceil);
    expectAllNear(y, referencePool(true, x, c.xs, c.k, c.s, c.p, c.d, c.ceil, false), 0, "max");
    pk::Dims ones;
    for (int a = 0; a < c.k.size; ++a) ones.push(1);
    const pk::Shape aos = pk::poolOutputShape(c.xs, c.k, c.s, c.p, ones, c.ceil);
    y.assign(aos.numel(), 0.0f);
    for (bool include : {false, true}) {
      pk::averagePool(x.data(), c.xs, y.data(), c.k, c.s, c.p, c.ceil, include);
      expectAllNear(y, referencePool(false, x, c.xs, c.k, c.s, c.p, ones, c.ceil, include), 1e-6, "avg");
    }
  }
}

TEST(Pool, GlobalAveragePool) {
  const pk::Shape xs{2, 3, 4, 5};
  auto x = randomVec(xs.numel(), 77);
  std::vector<float> y(6);
  pk::globalAveragePool(x.data(), xs, y.data());
  for (int p = 0; p < 6; ++p) {
    double s = 0;
    for (int i = 0; i < 20; ++i) s += x[p * 20 + i];
    EXPECT_NEAR(y[p], s / 20, 1e-6);
  }
}

TEST(Pool, GradientsMatchFiniteDifferences) {
  int seed = 60;
  for (const PoolCase &c : kPoolCases) {
    // Distinct, well-separated values so that the max is stable under eps.
    std::vector<float> x(c.xs.numel());
    std::mt19937 gen(seed++);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * (float)i;
    std::shuffle(x.begin(), x.end(), gen);
    const pk::Shape os = pk::poolOutputShape(c.xs, c.k, c.s, c.p, c.d, c.ceil);
    auto dy = randomVec(os.numel(), seed++);
    std::vector<float> dx(x.size(), 1e30f);
    pk::maxPoolGrad(dy.data(), x.data(), c.xs, dx.data(), c.k, c.s, c.p, c.d, c.ceil);
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      pk::maxPool(in.data(), c.xs, out.data(), c.k, c.s, c.p, c.d, c.ceil);
    }, dx, 1e-2f, 1e-4, 1e-3, "max_pool_grad");

    pk::Dims ones;
    for (int a = 0; a < c.k.size; ++a) ones.push(1);
    const pk::Shape aos = pk::poolOutputShape(c.xs, c.k, c.s, c.p, ones, c.ceil);
    auto ady = randomVec(aos.numel(), seed++);
    for (bool include : {false, true}) {
      pk::averagePoolGrad(ady.data(), dx.data(), c.xs, c.k, c.s, c.p, c.ceil, include);
      checkGradient(x, ady, [&](const std::vector<float> &in, std::vector<float> &out) {
        pk::averagePool(in.data(), c.xs, out.data(), c.k, c.s, c.p, c.ceil, include);
      }, dx, 1e-2f, 1e-4, 1e-3, "average_pool_grad");
    }
  }
  // Ties go to the first maximum in window order.
  const float x[4] = {1, 1, 1, 1}, dy[1] = {2};
  float dx[4];
  pk::maxPoolGrad(dy, x, {1, 1, 2, 2}, dx, {2, 2}, {1, 1}, {0, 0, 0, 0}, {1, 1}, false);
  EXPECT_EQ(dx[0], 2.0f);
  EXPECT_EQ(dx[1] + dx[2] + dx[3], 0.0f);
}

} // namespace

namespace {
TEST(LayerNorm, LongRowsWithLargeMeanStayAccurate) {
  // 8-lane float partial sums over 4099 elements (not a multiple of 8) with
  // an offset of 1000: statistics still agree with a double reference.
  const int64_t inner = 4099;
  auto x = randomVec(2 * inner, 91, 999.0f, 1001.0f);
  std::vector<float> g(inner, 1.0f), b(inner, 0.0f), y(x.size()), mean(2), inv(2), wy, wm, wi;
  pk::layerNorm(x.data(), {2, inner}, g.data(), {inner}, b.data(), {inner}, y.data(), mean.data(), inv.data(), -1,
                1e-5f);
  referenceLayerNorm(x, 2, inner, g, b, 1e-5f, wy, wm, wi);
  expectAllNear(mean, wm, 1e-6, "mean");
  expectAllNear(inv, wi, 1e-4, "invStd");
  expectAllNear(y, wy, 1e-3, "y");
}
} // namespace
