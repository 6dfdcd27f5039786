#include "TestUtil.h"

#include <cstring>
#include <limits>

using namespace kt;

namespace {

TEST(Softmax, MatchesReferenceOnEveryAxis) {
  const pk::Shape xs{2, 3, 4};
  auto x = randomVec(xs.numel(), 5, -5.0f, 5.0f);
  for (int64_t axis : {0, 1, 2, -1}) {
    std::vector<float> y(x.size()), want(x.size());
    pk::softmax(x.data(), xs, axis, y.data());
    const int a = axis < 0 ? axis + 3 : (int)axis;
    forEachIndex(vecOf(xs), [&](const std::vector<int64_t> &idx) {
      auto at = [&](int64_t i) {
        auto j = idx;
        j[a] = i;
        return (j[0] * 3 + j[1]) * 4 + j[2];
      };
      double s = 0;
      for (int64_t i = 0; i < xs[a]; ++i) s += std::exp((double)x[at(i)]);
      want[at(idx[a])] = (float)(std::exp((double)x[at(idx[a])]) / s);
    });
    expectAllNear(y, want, 1e-6);
  }
  // Large inputs do not overflow (the maximum is subtracted first).
  const float big[2] = {1000.0f, 1000.0f};
  float out[2];
  pk::softmax(big, {2}, 0, out);
  EXPECT_EQ(out[0], 0.5f);
}

// nn.masked_softmax stands for scale, where and softmax (and its gradient for
// their three gradients): the same bits, for both fill sides, a scale or a
// division, a broadcast mask and fully masked rows (NaN with a -inf fill).
TEST(MaskedSoftmax, SameBitsAsTheOpsItReplaces) {
  const pk::Shape xs{2, 3, 4, 5}, ms{1, 1, 4, 5};
  auto x = randomVec(xs.numel(), 11, -6.0f, 6.0f), dy = randomVec(xs.numel(), 12, -1.0f, 1.0f);
  std::vector<uint8_t> mask(ms.numel());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = (i * 7 % 5 == 0) || i < 5; // row 0 fully masked
  auto bits = [](const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (bool divide : {false, true})
    for (bool maskedWhen : {true, false})
      for (float fill : {-std::numeric_limits<float>::infinity(), -1.0e4f}) {
        const float scale = divide ? 8.0f : 0.125f, zero = 0.0f;
        const pk::Shape scalar{};
        std::vector<float> s(x.size()), z(x.size()), want(x.size()), got(x.size());
        pk::binary(divide ? pk::Binary::Div : pk::Binary::Mul, x.data(), xs, &scale, scalar, s.data());
        if (maskedWhen)
          pk::where(mask.data(), ms, &fill, scalar, s.data(), xs, z.data());
        else
          pk::where(mask.data(), ms, s.data(), xs, &fill, scalar, z.data());
        pk::softmax(z.data(), xs, -1, want.data());
        pk::maskedSoftmax(x.data(), xs, mask.data(), ms, scale, divide, fill, maskedWhen, got.data());
        EXPECT_TRUE(bits(want, got)) << "forward, divide " << divide << " masked_when " << maskedWhen;

        std::vector<float> g(x.size()), kept(x.size()), dwant(x.size()), dgot(x.size());
        pk::softmaxGrad(dy.data(), want.data(), xs, -1, g.data());
        if (maskedWhen)
          pk::where(mask.data(), ms, &zero, scalar, g.data(), xs, kept.data());
        else
          pk::where(mask.data(), ms, g.data(), xs, &zero, scalar, kept.data());
        pk::binary(divide ? pk::Binary::Div : pk::Binary::Mul, kept.data(), xs, &scale, scalar, dwant.data());
        pk::maskedSoftmaxGrad(dy.data(), want.data(), xs, mask.data(), ms, scale, divide, maskedWhen, dgot.data());
        EXPECT_TRUE(bits(dwant, dgot)) << "gradient, divide " << divide << " masked_when " << maskedWhen;
      }
  float y[6];
  EXPECT_THROW(pk::maskedSoftmax(x.data(), {2, 3}, mask.data(), {3, 1}, 1.0f, false, 0.0f, true, y), pk::KernelError);
}

TEST(SoftmaxCrossEntropy, KnownValuesWeightsAndIgnoreIndex) {
  // scores [2, 3]: log-softmax of [0, ln 2, ln 3]... use exact log values.
  const float scores[6] = {0.0f, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f};
  const int64_t labels[2] = {1, 2};
  float loss, logProb[6];
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, labels, nullptr, pk::Reduction::Mean, std::nullopt, &loss, logProb);
  const double lse1 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double l0 = std::log(3.0), l1 = lse1 - 3.0;
  EXPECT_NEAR(loss, (l0 + l1) / 2, 1e-6);
  EXPECT_NEAR(logProb[0], -std::log(3.0), 1e-6);
  EXPECT_NEAR(logProb[3], 1.0 - lse1, 1e-6);
  // Sum, weights
  const float w[3] = {0.5f, 2.0f, 4.0f};
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, labels, w, pk::Reduction::Sum, std::nullopt, &loss, nullptr);
  EXPECT_NEAR(loss, 2.0 * l0 + 4.0 * l1, 1e-5);
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, labels, w, pk::Reduction::Mean, std::nullopt, &loss, nullptr);
  EXPECT_NEAR(loss, (2.0 * l0 + 4.0 * l1) / 6.0, 1e-6);
  // Ignore index: the element contributes 0 and weighs nothing.
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, labels, w, pk::Reduction::Mean, int64_t(2), &loss, nullptr);
  EXPECT_NEAR(loss, l0, 1e-6);
  float none[2];
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, labels, nullptr, pk::Reduction::None, int64_t(1), none, nullptr);
  EXPECT_EQ(none[0], 0.0f);
  EXPECT_NEAR(none[1], l1, 1e-6);
  // All ignored: mean is 0/0.
  const int64_t ignored[2] = {-100, -100};
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, ignored, nullptr, pk::Reduction::Mean, int64_t(-100), &loss, nullptr);
  EXPECT_TRUE(std::isnan(loss));
  // int32 labels, and [N, C, d] scores
  const int32_t l32[2] = {1, 2};
  pk::softmaxCrossEntropyLoss(scores, {2, 3}, l32, nullptr, pk::Reduction::Mean, std::nullopt, &loss, nullptr);
  EXPECT_NEAR(loss, (l0 + l1) / 2, 1e-6);
  const float s3[6] = {0.0f, 1.0f, 0.0f, 2.0f, 0.0f, 3.0f}; // [1, 3, 2]: column 1 is [1, 2, 3]
  const int64_t lab3[2] = {0, 2};
  pk::softmaxCrossEntropyLoss(s3, {1, 3, 2}, lab3, nullptr, pk::Reduction::None, std::nullopt, none, nullptr);
  EXPECT_NEAR(none[0], l0, 1e-6);
  EXPECT_NEAR(none[1], l1, 1e-6);
  const int64_t bad[2] = {0, 3};
  EXPECT_THROW(pk::softmaxCrossEntropyLoss(scores, {2, 3}, bad, nullptr, pk::Reduction::Mean, std::nullopt, &loss,
                                           nullptr),
               pk::KernelError);
  EXPECT_EQ(pk::reductionKind("sum"), pk::Reduction::Sum);
  EXPECT_THROW(pk::reductionKind("max"), pk::KernelError);
}

TEST(Reduce, SumAndMeanOverAxes) {
  const pk::Shape xs{2, 3, 4};
  auto x = randomVec(xs.numel(), 11);
  struct Case { pk::Dims axes; pk::Shape kept; };
  const Case cases[] = {{{0}, {1, 3, 4}}, {{1}, {2, 1, 4}}, {{2}, {2, 3, 1}}, {{0, 2}, {1, 3, 1}}, {{0, 1, 2}, {1, 1, 1}}};
  for (const Case &c : cases) {
    std::vector<double> want(c.kept.numel(), 0.0);
    forEachIndex(vecOf(xs), [&](const std::vector<int64_t> &idx) {
      want[bcastOffset(idx, vecOf(c.kept))] += x[(idx[0] * 3 + idx[1]) * 4 + idx[2]];
    });
    std::vector<float> s(c.kept.numel()), m(c.kept.numel());
    pk::reduceSum(x.data(), xs, c.axes, s.data());
    pk::reduceMean(x.data(), xs, c.axes, m.data());
    const double count = (double)xs.numel() / c.kept.numel();
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(s[i], want[i], 1e-5);
      EXPECT_NEAR(m[i], want[i] / count, 1e-6);
    }
  }
  // No axes: reduce_mean over everything, reduce_sum is a copy.
  float all;
  pk::reduceMean(x.data(), xs, {}, &all);
  double total = 0;
  for (float v : x) total += v;
  EXPECT_NEAR(all, total / 24, 1e-6);
  std::vector<float> same(24);
  pk::reduceSum(x.data(), xs, {}, same.data());
  EXPECT_EQ(same, x);
  EXPECT_THROW(pk::reduceSum(x.data(), xs, {2, 1}, same.data()), pk::KernelError);
  EXPECT_THROW(pk::reduceSum(x.data(), xs, {3}, same.data()), pk::KernelError);
}

TEST(Gather, EmbeddingAndOtherAxes) {
  const float table[8] = {0, 1, 10, 11, 20, 21, 30, 31}; // [4, 2]
  const int64_t idx[3] = {3, 0, -1};
  float out[6];
  pk::gather(table, {4, 2}, idx, {3}, 0, out);
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{30, 31, 0, 1, 30, 31}));
  // axis 1 of [2, 3] with indices [2, 2]
  const int64_t data[6] = {1, 2, 3, 4, 5, 6};
  const int32_t i2[4] = {2, 0, 1, 1};
  int64_t o2[8];
  pk::gather(data, {2, 3}, i2, {2, 2}, 1, o2);
  EXPECT_EQ(std::vector<int64_t>(o2, o2 + 8), (std::vector<int64_t>{3, 1, 2, 2, 6, 4, 5, 5}));
  const int64_t bad[1] = {4};
  EXPECT_THROW(pk::gather(table, {4, 2}, bad, {1}, 0, out), pk::KernelError);
}

TEST(Movement, TransposeMatchesReference) {
  const pk::Shape xs{2, 3, 4, 5};
  auto x = randomVec(xs.numel(), 21);
  const pk::Dims perms[] = {{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 0, 3, 2}, {0, 1, 2, 3}, {2, 3, 0, 1}};
  for (const pk::Dims &perm : perms) {
    std::vector<float> y(x.size()), want;
    pk::transpose(x.data(), xs, perm, y.data());
    std::vector<int64_t> ys;
    for (int i = 0; i < 4; ++i) ys.push_back(xs[perm[i]]);
    forEachIndex(ys, [&](const std::vector<int64_t> &o) {
      int64_t in[4];
      for (int i = 0; i < 4; ++i) in[perm[i]] = o[i];
      want.push_back(x[((in[0] * 3 + in[1]) * 4 + in[2]) * 5 + in[3]]);
    });
    EXPECT_EQ(y, want) << perm.str();
  }
  float y[120];
  EXPECT_THROW(pk::transpose(x.data(), xs, {0, 0, 1, 2}, y), pk::KernelError);
}

TEST(Movement, ConcatSplitRoundTrip) {
  const pk::Shape a{2, 1, 3}, b{2, 2, 3}, c{2, 3, 3};
  auto va = randomVec(a.numel(), 1), vb = randomVec(b.numel(), 2), vc = randomVec(c.numel(), 3);
  const float *ins[3] = {va.data(), vb.data(), vc.data()};
  const pk::Shape shapes[3] = {a, b, c};
  std::vector<float> cat(2 * 6 * 3);
  pk::concat(ins, shapes, 3, 1, cat.data());
  // Element [n, j, k] of the result comes from the piece holding row j.
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 6; ++j)
      for (int k = 0; k < 3; ++k) {
        const float want = j < 1 ? va[(n * 1 + j) * 3 + k] : j < 3 ? vb[(n * 2 + j - 1) * 3 + k] : vc[(n * 3 + j - 3) * 3 + k];
        EXPECT_EQ(cat[(n * 6 + j) * 3 + k], want);
      }
  std::vector<float> pa(va.size()), pb(vb.size()), pc(vc.size());
  float *outs[3] = {pa.data(), pb.data(), pc.data()};
  pk::split(cat.data(), {2, 6, 3}, -2, {1, 2, 3}, outs);
  EXPECT_EQ(pa, va);
  EXPECT_EQ(pb, vb);
  EXPECT_EQ(pc, vc);
  EXPECT_THROW(pk::split(cat.data(), {2, 6, 3}, 1, {1, 2, 2}, outs), pk::KernelError);
  EXPECT_THROW(pk::concat(ins, shapes, 3, 0, cat.data()), pk::KernelError);
}

TEST(Movement, SliceWithNegativeSteps) {
  // x [3, 5] = 0..14
  std::vector<float> x(15);
  for (int i = 0; i < 15; ++i) x[i] = (float)i;
  // rows 2..0 reversed (end -1 = past the first), columns 1, 3
  const pk::Dims starts{2, 1}, ends{-1, 5}, steps{-1, 2};
  EXPECT_EQ(pk::sliceShape({3, 5}, starts, ends, steps), (pk::Shape{3, 2}));
  float y[6];
  pk::slice(x.data(), {3, 5}, starts, ends, steps, y);
  EXPECT_EQ(std::vector<float>(y, y + 6), (std::vector<float>{11, 13, 6, 8, 1, 3}));
  // Columns 4..1 step -2: 4, 2
  float z[6];
  pk::slice(x.data(), {3, 5}, {0, 4}, {3, 1}, {1, -2}, z);
  EXPECT_EQ(std::vector<float>(z, z + 6), (std::vector<float>{4, 2, 9, 7, 14, 12}));
  // Empty slice
  EXPECT_EQ(pk::sliceShape({3, 5}, {3, 0}, {3, 5}, {1, 1}), (pk::Shape{0, 5}));
  EXPECT_THROW(pk::sliceShape({3, 5}, {0, 0}, {4, 5}, {1, 1}), pk::KernelError);
  EXPECT_THROW(pk::sliceShape({3, 5}, {0, 0}, {3, 5}, {1, 0}), pk::KernelError);
  // slice_grad scatters into zeros
  std::vector<float> dx(15, 7.0f);
  const float dy[6] = {1, 2, 3, 4, 5, 6};
  pk::sliceGrad(dy, dx.data(), {3, 5}, starts, ends, steps);
  EXPECT_EQ(dx, (std::vector<float>{0, 5, 0, 6, 0, 0, 3, 0, 4, 0, 0, 1, 0, 2, 0}));
}

TEST(Movement, PadExpandCopy) {
  const float x[6] = {1, 2, 3, 4, 5, 6}; // [2, 3]
  float y[4 * 4];
  pk::pad(x, {2, 3}, {1, 0, 1, 1}, -1.0f, y);
  EXPECT_EQ(std::vector<float>(y, y + 16),
            (std::vector<float>{-1, -1, -1, -1, 1, 2, 3, -1, 4, 5, 6, -1, -1, -1, -1, -1}));
  EXPECT_THROW(pk::pad(x, {2, 3}, {1, 0, -1, 1}, 0.0f, y), pk::KernelError);
  const int64_t xi[2] = {7, 8};
  int64_t yi[6];
  pk::expand(xi, {2, 1}, yi, {2, 3});
  EXPECT_EQ(std::vector<int64_t>(yi, yi + 6), (std::vector<int64_t>{7, 7, 7, 8, 8, 8}));
  float e[12];
  pk::expand(x, {3}, e, {4, 3});
  for (int i = 0; i < 12; ++i) EXPECT_EQ(e[i], x[i % 3]);
  EXPECT_THROW(pk::expand(x, {3}, e, {4, 2}), pk::KernelError);
  float c[6];
  pk::copy(x, sizeof x, c);
  EXPECT_EQ(0, std::memcmp(c, x, sizeof x));
  pk::copy(c, sizeof c, c); // in place is a no-op
  EXPECT_EQ(0, std::memcmp(c, x, sizeof x));
}

} // namespace
