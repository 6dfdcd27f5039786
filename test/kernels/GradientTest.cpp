// Finite-difference checks of every gradient kernel against its forward kernel.
#include "TestUtil.h"

using namespace kt;

namespace {

using Fwd = std::function<void(const std::vector<float> &, std::vector<float> &)>;

TEST(Gradients, UnaryGradEveryKind) {
  // Every function of pipec/vocabulary.h's table, so a new row is checked here.
  for (int k = 0; k < pipec::kNumUnaryFunctions; ++k) {
    const pk::Unary op = pk::Unary(k);
    const char *name = pipec::kUnaryFunctions[k].spelling;
    EXPECT_EQ(pk::unaryKind(name), op);
    // Points away from 0 (kinks) and inside the domain (NaN outside: sqrt,
    // asin, acosh), away from poles (tan): the first candidate that is.
    auto x = randomVec(40, 3, -3.0f, 3.0f);
    auto usable = [&](float v) { // a moderate value and slope (asin, atanh steepen at their ends)
      float probe, slope, one = 1.0f;
      pk::unary(op, &v, 1, &probe);
      pk::unaryGrad(op, &one, &v, &probe, 1, &slope);
      return std::isfinite(probe) && std::fabs(probe) < 50.0f && std::isfinite(slope) &&
             std::fabs(slope) < 20.0f;
    };
    for (float &v : x) {
      v = v < 0 ? v - 0.1f : v + 0.1f;
      // Piecewise constant (floor, ceil, round, sign): away from the jumps.
      if (pipec::kUnaryFunctions[k].derivativeFlops == 0) v = std::floor(v) + 0.25f;
      for (float candidate : {v, -v, 0.25f * v, 1.2f + std::fabs(v)})
        if (usable(candidate)) {
          v = candidate;
          break;
        }
    }
    std::vector<float> y(40), dx(40), only(40);
    pk::unary(op, x.data(), 40, y.data());
    auto dy = randomVec(40, 4);
    pk::unaryGrad(op, dy.data(), x.data(), y.data(), 40, dx.data());
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      pk::unary(op, in.data(), 40, out.data());
    }, dx, 1e-3f, 2e-3, 1e-2, name);
    // It reads only the forward value the table names; the other may be null.
    const bool readsInput = pipec::derivativeReadsInput(op);
    pk::unaryGrad(op, dy.data(), readsInput ? x.data() : nullptr, readsInput ? nullptr : y.data(), 40,
                  only.data());
    EXPECT_EQ(only, dx) << name;
    EXPECT_THROW(pk::unaryGrad(op, dy.data(), readsInput ? nullptr : x.data(),
                               readsInput ? y.data() : nullptr, 40, only.data()),
                 pk::KernelError)
        << name;
  }
  const float x = 1.0f, y = 0.5f, dy = 2.0f;
  float dx;
  pk::unaryGrad(pk::Unary::Tanh, &dy, nullptr, &y, 1, &dx);
  EXPECT_FLOAT_EQ(dx, 1.5f);
  pk::unaryGrad(pk::Unary::Gelu, &dy, &x, nullptr, 1, &dx);
  EXPECT_NEAR(dx, 2.0f * 1.0833155f, 1e-5f); // Φ(1) + φ(1)
  // relu's gradient reads its result: positive exactly where the input is.
  for (float v : {1.0f, 0.0f, -0.0f, -1.0f, std::nanf("")}) {
    float r;
    pk::unary(pk::Unary::Relu, &v, 1, &r);
    pk::unaryGrad(pk::Unary::Relu, &dy, nullptr, &r, 1, &dx);
    EXPECT_EQ(dx, v > 0.0f ? dy : 0.0f) << v;
  }
}

TEST(Gradients, BinaryGradWithBroadcastReduction) {
  const pk::Shape ls{2, 3}, rs{3};
  auto lhs = randomVec(6, 7, 0.5f, 2.0f), rhs = randomVec(3, 8, 0.5f, 2.0f), dy = randomVec(6, 9);
  struct Case { pk::BinaryGrad kind; pk::Binary op; bool wrtRhs; const char *name; };
  const Case cases[] = {{pk::BinaryGrad::SubRhs, pk::Binary::Sub, true, "sub_rhs"},
                        {pk::BinaryGrad::DivRhs, pk::Binary::Div, true, "div_rhs"},
                        {pk::BinaryGrad::PowLhs, pk::Binary::Pow, false, "pow_lhs"},
                        {pk::BinaryGrad::PowRhs, pk::Binary::Pow, true, "pow_rhs"},
                        {pk::BinaryGrad::MaxLhs, pk::Binary::Max, false, "max_lhs"},
                        {pk::BinaryGrad::MaxRhs, pk::Binary::Max, true, "max_rhs"},
                        {pk::BinaryGrad::MinLhs, pk::Binary::Min, false, "min_lhs"},
                        {pk::BinaryGrad::MinRhs, pk::Binary::Min, true, "min_rhs"}};
  for (const Case &c : cases) {
    EXPECT_EQ(pk::binaryGradKind(c.name), c.kind);
    std::vector<float> full(6);
    pk::binaryGrad(c.kind, dy.data(), lhs.data(), ls, rhs.data(), rs, full.data());
    std::vector<float> grad(c.wrtRhs ? 3 : 6);
    if (c.wrtRhs)
      pk::reduceSum(full.data(), {2, 3}, {0}, grad.data()); // what autodiff appends
    else
      grad = full;
    Fwd f = [&](const std::vector<float> &in, std::vector<float> &out) {
      if (c.wrtRhs)
        pk::binary(c.op, lhs.data(), ls, in.data(), rs, out.data());
      else
        pk::binary(c.op, in.data(), ls, rhs.data(), rs, out.data());
    };
    checkGradient(c.wrtRhs ? rhs : lhs, dy, f, grad, 1e-3f, 2e-3, 1e-2, c.name);
  }
  // PyTorch's conventions at the singular points.
  const float zero = 0.0f, two = 2.0f, g = 1.0f;
  float out;
  pk::binaryGrad(pk::BinaryGrad::PowRhs, &g, &zero, {}, &two, {}, &out);
  EXPECT_EQ(out, 0.0f);
  pk::binaryGrad(pk::BinaryGrad::PowLhs, &g, &zero, {}, &zero, {}, &out);
  EXPECT_EQ(out, 0.0f);
  EXPECT_THROW(pk::binaryGradKind("add_rhs"), pk::KernelError);
  // Max and Min split a tie evenly, as PyTorch's maximum and minimum.
  const float one = 1.0f;
  for (pk::BinaryGrad tie : {pk::BinaryGrad::MaxLhs, pk::BinaryGrad::MaxRhs, pk::BinaryGrad::MinLhs,
                             pk::BinaryGrad::MinRhs}) {
    pk::binaryGrad(tie, &g, &one, {}, &one, {}, &out);
    EXPECT_EQ(out, 0.5f);
  }
}

TEST(Gradients, BatchNormInputAndParams) {
  const pk::Shape xs{4, 3, 2, 2};
  auto x = randomVec(xs.numel(), 12, -2.0f, 2.0f), dy = randomVec(xs.numel(), 13);
  auto scale = randomVec(3, 14, 0.5f, 1.5f), bias = randomVec(3, 15);
  const std::vector<float> rm{0.1f, -0.2f, 0.3f}, rv{0.9f, 1.1f, 0.7f};
  for (bool training : {true, false}) {
    std::vector<float> dx(x.size()), ds(3), db(3), nm(3), nv(3);
    pk::batchNormGrad(dy.data(), x.data(), xs, scale.data(), rm.data(), rv.data(), dx.data(), 1e-5f, training);
    pk::batchNormParamGrad(dy.data(), x.data(), xs, rm.data(), rv.data(), ds.data(), db.data(), 1e-5f, training);
    auto fwd = [&](const float *xp, const float *sp, const float *bp, std::vector<float> &out) {
      pk::batchNorm(xp, xs, sp, bp, rm.data(), rv.data(), out.data(), nm.data(), nv.data(), 1e-5f, 0.9f, training);
    };
    const char *mode = training ? "training" : "inference";
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(in.data(), scale.data(), bias.data(), out);
    }, dx, 1e-2f, 3e-3, 1e-2, mode);
    checkGradient(scale, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(x.data(), in.data(), bias.data(), out);
    }, ds, 1e-2f, 3e-3, 1e-2, mode);
    checkGradient(bias, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(x.data(), scale.data(), in.data(), out);
    }, db, 1e-2f, 3e-3, 1e-2, mode);
  }
}

TEST(Gradients, LayerAndRmsNormInputAndParams) {
  struct Case { pk::Shape xs; int64_t axis; pk::Shape ps; };
  const Case cases[] = {{{3, 2, 8}, -1, {8}}, {{2, 3, 4}, 1, {3, 4}}, {{2, 3, 4}, 1, {1, 4}}, {{5, 6}, 0, {5, 6}}};
  int seed = 30;
  for (const pk::RowNorm norm : {pk::RowNorm::Layer, pk::RowNorm::Rms})
  for (const Case &c : cases) {
    auto x = randomVec(c.xs.numel(), seed++, -2.0f, 3.0f), dy = randomVec(c.xs.numel(), seed++);
    auto g = randomVec(c.ps.numel(), seed++, 0.5f, 1.5f), b = randomVec(c.ps.numel(), seed++);
    std::vector<float> dx(x.size()), dg(g.size()), db(b.size());
    pk::layerNormGrad(dy.data(), x.data(), c.xs, g.data(), c.ps, dx.data(), c.axis, 1e-5f, norm);
    pk::layerNormParamGrad(dy.data(), x.data(), c.xs, c.ps, dg.data(), db.data(), c.axis, 1e-5f, norm);
    auto fwd = [&](const float *xp, const float *gp, const float *bp, std::vector<float> &out) {
      pk::layerNorm(xp, c.xs, gp, c.ps, bp, c.ps, out.data(), nullptr, nullptr, c.axis, 1e-5f, norm);
    };
    const std::string what = c.xs.str() + " axis " + std::to_string(c.axis) + " params " + c.ps.str() +
                             (norm == pk::RowNorm::Rms ? " (RMS)" : "");
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(in.data(), g.data(), b.data(), out);
    }, dx, 1e-2f, 3e-3, 1e-2, ("dx " + what).c_str());
    checkGradient(g, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(x.data(), in.data(), b.data(), out);
    }, dg, 1e-2f, 3e-3, 1e-2, ("dscale " + what).c_str());
    checkGradient(b, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(x.data(), g.data(), in.data(), out);
    }, db, 1e-2f, 3e-3, 1e-2, ("dbias " + what).c_str());
  }
}

// nn.rotary is linear in x, and its transposed form is its adjoint:
// <rotary(x), v> = <x, rotary_transposed(v)> for every x and v, with cos and
// sin broadcast along leading axes (Hugging Face's) or full, both R's; and
// the rotation itself is R: rotate_half's concat(-x2, x1), or the pairs.
TEST(Gradients, RotaryTransposedIsTheAdjoint) {
  struct Case { pk::Shape xs, ts; };
  const Case cases[] = {{{2, 3, 4, 8}, {1, 1, 4, 8}}, {{2, 5, 6}, {2, 5, 6}}, {{3, 4}, {1}}, {{2, 4, 2}, {4, 1}}};
  int seed = 70;
  for (bool interleaved : {false, true})
    for (const Case &c : cases) {
      const std::string what = c.xs.str() + " tables " + c.ts.str() + (interleaved ? " interleaved" : "");
      auto x = randomVec(c.xs.numel(), seed++), v = randomVec(c.xs.numel(), seed++);
      auto cs = randomVec(c.ts.numel(), seed++), sn = randomVec(c.ts.numel(), seed++);
      std::vector<float> y(x.size()), back(x.size());
      pk::rotary(x.data(), c.xs, cs.data(), c.ts, sn.data(), c.ts, y.data(), interleaved, false);
      pk::rotary(v.data(), c.xs, cs.data(), c.ts, sn.data(), c.ts, back.data(), interleaved, true);
      double lhs = 0, rhs = 0;
      for (size_t i = 0; i < x.size(); ++i) lhs += (double)y[i] * v[i], rhs += (double)x[i] * back[i];
      EXPECT_NEAR(lhs, rhs, 1e-4 * (1 + std::fabs(lhs))) << what;
      // cos 0, sin 1: R(x) itself.
      const float zero = 0.0f, one = 1.0f;
      pk::rotary(x.data(), c.xs, &zero, pk::Shape{}, &one, pk::Shape{}, y.data(), interleaved, false);
      const int64_t width = c.xs.v[c.xs.size - 1], half = width / 2;
      for (int64_t i = 0; i < (int64_t)x.size(); ++i) {
        const int64_t j = i % width;
        const float expected = interleaved ? (j % 2 == 0 ? -x[i + 1] : x[i - 1]) : (j < half ? -x[i + half] : x[i - half]);
        ASSERT_EQ(y[i], expected) << what << " element " << i;
      }
    }
  std::vector<float> odd(6), out(6);
  const float one = 1.0f;
  EXPECT_THROW(pk::rotary(odd.data(), pk::Shape{2, 3}, &one, pk::Shape{}, &one, pk::Shape{}, out.data(), false, false),
               std::exception);
  EXPECT_THROW(pk::rotary(odd.data(), pk::Shape{3, 2}, odd.data(), pk::Shape{2, 3}, &one, pk::Shape{}, out.data(),
                          false, false),
               std::exception);
}

TEST(Gradients, SoftmaxGrad) {
  const pk::Shape xs{2, 5, 3};
  auto x = randomVec(xs.numel(), 50, -2.0f, 2.0f), dy = randomVec(xs.numel(), 51);
  for (int64_t axis : {1, -1}) {
    std::vector<float> y(x.size()), dx(x.size());
    pk::softmax(x.data(), xs, axis, y.data());
    pk::softmaxGrad(dy.data(), y.data(), xs, axis, dx.data());
    checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      pk::softmax(in.data(), xs, axis, out.data());
    }, dx, 1e-2f, 1e-3, 1e-2, "softmax");
  }
}

TEST(Gradients, SoftmaxCrossEntropyLossGrad) {
  const pk::Shape ss{4, 5, 2}; // [N, C, d]
  auto scores = randomVec(ss.numel(), 60, -2.0f, 2.0f);
  const int64_t labels[8] = {0, 4, 2, -1, 1, 3, 3, 0};
  const float weights[5] = {0.5f, 1.0f, 2.0f, 1.5f, 0.25f};
  for (pk::Reduction red : {pk::Reduction::Mean, pk::Reduction::Sum, pk::Reduction::None})
    for (const float *w : {static_cast<const float *>(nullptr), weights}) {
      const int64_t outN = red == pk::Reduction::None ? 8 : 1;
      auto dloss = randomVec(outN, 61);
      std::vector<float> ds(scores.size(), 1e30f);
      pk::softmaxCrossEntropyLossGrad(dloss.data(), scores.data(), ss, labels, w, red, int64_t(-1), ds.data());
      checkGradient(scores, dloss, [&](const std::vector<float> &in, std::vector<float> &out) {
        pk::softmaxCrossEntropyLoss(in.data(), ss, labels, w, red, int64_t(-1), out.data(), nullptr);
      }, ds, 1e-2f, 1e-3, 1e-2, "softmax_cross_entropy_loss_grad");
      // The ignored element (n = 1, d = 1) gets no gradient.
      for (int c = 0; c < 5; ++c) EXPECT_EQ(ds[(1 * 5 + c) * 2 + 1], 0.0f);
    }
  // int32 labels, no ignore index, 2-D scores
  const int32_t l32[2] = {2, 0};
  auto s2 = randomVec(6, 62);
  const float one = 1.0f;
  std::vector<float> d2(6);
  pk::softmaxCrossEntropyLossGrad(&one, s2.data(), {2, 3}, l32, nullptr, pk::Reduction::Mean, std::nullopt, d2.data());
  checkGradient(s2, {1.0f}, [&](const std::vector<float> &in, std::vector<float> &out) {
    pk::softmaxCrossEntropyLoss(in.data(), {2, 3}, l32, nullptr, pk::Reduction::Mean, std::nullopt, out.data(), nullptr);
  }, d2, 1e-2f, 1e-3, 1e-2, "int32 labels");
}

TEST(Gradients, GatherGradScatterAddsRepeats) {
  const pk::Shape ds{5, 3};
  auto data = randomVec(ds.numel(), 70);
  const int64_t idx[6] = {1, 4, 1, -1, 0, 1}; // repeats and a negative index
  const pk::Shape is{2, 3};
  auto dy = randomVec(6 * 3, 71);
  std::vector<float> dx(data.size(), 1e30f);
  pk::gatherGrad(dy.data(), idx, is, 0, dx.data(), ds);
  checkGradient(data, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
    pk::gather(in.data(), ds, idx, is, 0, out.data());
  }, dx, 1e-2f, 1e-4, 1e-4, "gather_grad axis 0");
  // Row 2 is never gathered; row 1 collects three rows of dy.
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(dx[2 * 3 + k], 0.0f);
    EXPECT_NEAR(dx[1 * 3 + k], dy[0 * 3 + k] + dy[2 * 3 + k] + dy[5 * 3 + k], 1e-6);
  }
  // axis 1 with int32 indices
  const int32_t i32[3] = {2, 2, 0};
  auto dy1 = randomVec(5 * 3, 72);
  pk::gatherGrad(dy1.data(), i32, {3}, 1, dx.data(), ds);
  checkGradient(data, dy1, [&](const std::vector<float> &in, std::vector<float> &out) {
    pk::gather(in.data(), ds, i32, {3}, 1, out.data());
  }, dx, 1e-2f, 1e-4, 1e-4, "gather_grad axis 1");
}

TEST(Gradients, SliceGradAndReduceSumAreAdjoints) {
  const pk::Shape xs{4, 6};
  auto x = randomVec(xs.numel(), 80);
  const pk::Dims starts{3, 1}, ends{0, 6}, steps{-2, 2};
  const pk::Shape ys = pk::sliceShape(xs, starts, ends, steps);
  auto dy = randomVec(ys.numel(), 81);
  std::vector<float> dx(x.size(), 1e30f);
  pk::sliceGrad(dy.data(), dx.data(), xs, starts, ends, steps);
  checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
    pk::slice(in.data(), xs, starts, ends, steps, out.data());
  }, dx, 1e-2f, 1e-4, 1e-4, "slice_grad");
  // reduce_sum is the adjoint of expand: <expand(a), b> = <a, reduce_sum(b)>.
  auto a = randomVec(3, 82), b = randomVec(24, 83);
  std::vector<float> ea(24), rb(3);
  pk::expand(a.data(), {1, 3, 1}, ea.data(), {2, 3, 4});
  pk::reduceSum(b.data(), {2, 3, 4}, {0, 2}, rb.data());
  double lhs = 0, rhs = 0;
  for (int i = 0; i < 24; ++i) lhs += (double)ea[i] * b[i];
  for (int i = 0; i < 3; ++i) rhs += (double)a[i] * rb[i];
  EXPECT_NEAR(lhs, rhs, 1e-5);
}

} // namespace

namespace {
/// An attention case: shapes, an optional mask (causal, broadcast over the
/// leading axes) and the scale's form.
struct AttentionCase {
  pk::Shape qs, ks, vs, ms;
  bool masked, divide, additive = false; // additive: the mask is a float bias added to the scores
  std::string str() const {
    return "q " + qs.str() + " k " + ks.str() + " v " + vs.str() +
           (masked ? (additive ? " additive mask " : " mask ") + ms.str() : "") + (divide ? " divided" : "");
  }
};

const AttentionCase kAttentionCases[] = {
    {{2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 3}, {1, 1, 5, 6}, true, false},
    {{2, 70, 4}, {2, 9, 4}, {2, 9, 5}, {70, 9}, true, true}, // two blocks of rows
    {{3, 4, 2}, {3, 7, 2}, {3, 7, 2}, {}, false, false},
    {{4, 6}, {5, 6}, {5, 1}, {4, 5}, true, false},
    {{2, 3, 5, 4}, {2, 3, 6, 4}, {2, 3, 6, 3}, {2, 1, 5, 6}, true, false, true},
    {{2, 70, 4}, {2, 9, 4}, {2, 9, 5}, {9}, true, true, true}};

/// A case's masks: the boolean one, or the additive one (in [-3, 1]).
struct AttentionMasks {
  std::vector<uint8_t> mask;
  std::vector<float> additive;
  const uint8_t *maskData() const { return mask.empty() ? nullptr : mask.data(); }
  const float *additiveData() const { return additive.empty() ? nullptr : additive.data(); }
};
std::vector<uint8_t> causalMask(const pk::Shape &ms);
AttentionMasks masksOf(const AttentionCase &c, int seed) {
  if (!c.masked) return {};
  if (c.additive) return {{}, randomVec(c.ms.numel(), seed, -3.0f, 1.0f)};
  return {causalMask(c.ms), {}};
}

/// A causal mask over the scores' last two axes (masked above the diagonal,
/// shifted so that every row keeps an entry), broadcast as ms says.
std::vector<uint8_t> causalMask(const pk::Shape &ms) {
  std::vector<uint8_t> mask(ms.numel());
  const int64_t S = ms.v[ms.size - 2], T = ms.v[ms.size - 1];
  for (int64_t e = 0; e < ms.numel(); ++e) mask[e] = (e % T) > (e / T) % S + (T - S > 0 ? T - S : 0);
  return mask;
}
} // namespace

// nn.attention equals the unfused matmul, masked softmax (or the bias added,
// then the softmax) and matmul (up to the products' rounding), and its
// log-sum-exp is each row's.
TEST(Attention, EqualsTheUnfusedProducts) {
  int seed = 90;
  for (const AttentionCase &c : kAttentionCases) {
    auto q = randomVec(c.qs.numel(), seed++), k = randomVec(c.ks.numel(), seed++), v = randomVec(c.vs.numel(), seed++);
    const AttentionMasks masks = masksOf(c, seed++);
    pk::Shape scoresShape = c.qs;
    scoresShape.v[scoresShape.size - 1] = c.ks.v[c.ks.size - 2];
    const int64_t S = c.qs.v[c.qs.size - 2], T = c.ks.v[c.ks.size - 2];
    std::vector<float> s(scoresShape.numel()), z(s.size()), p(s.size()),
        want(c.qs.numel() / c.qs.v[c.qs.size - 1] * c.vs.v[c.vs.size - 1]);
    pk::matmul(q.data(), c.qs, k.data(), c.ks, s.data(), false, true);
    // z as the unfused ops write it (the masks broadcast to the scores).
    const std::vector<int64_t> maskDims(c.ms.v, c.ms.v + c.ms.size);
    for (size_t e = 0; e < s.size(); ++e) {
      std::vector<int64_t> index(scoresShape.size);
      for (int axis = scoresShape.size - 1, rest = (int)e; axis >= 0; rest /= scoresShape.v[axis], --axis)
        index[axis] = rest % scoresShape.v[axis];
      const int64_t at = c.masked ? bcastOffset(index, maskDims) : 0;
      const float scaled = c.divide ? s[e] / 0.7f : s[e] * 0.7f;
      z[e] = !c.masked ? scaled : c.additive ? scaled + masks.additive[at] : masks.mask[at] ? -1e9f : scaled;
    }
    pk::softmax(z.data(), scoresShape, -1, p.data());
    pk::matmul(p.data(), scoresShape, v.data(), c.vs, want.data());
    std::vector<float> y(want.size()), lse(scoresShape.numel() / T);
    pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, masks.maskData(), masks.additiveData(), c.ms, 0.7f,
                  c.divide, -1e9f, true, 0.0f, false, 0, y.data(), lse.data());
    expectAllNear(y, want, 1e-5, c.str().c_str());
    for (size_t r = 0; r < lse.size(); ++r) { // lse = log Σ exp z per row
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) sum += std::exp((double)z[r * T + j]);
      ASSERT_NEAR(lse[r], std::log(sum), 1e-5 * (1 + std::fabs(std::log(sum)))) << c.str() << " row " << r;
    }
  }
}

// nn.attention with a dropout of P drops exactly the elements nn.dropout of
// the unfused P drops, forward and backward: the fused kernels against the
// unfused sequence (scores, masked softmax, dropout, product; their
// gradients in turn), the mask bit for bit.
TEST(Attention, DropoutIsTheUnfusedDropout) {
  int seed = 300;
  const float ratio = 0.3f;
  const uint64_t key = pk::dropoutStreamKey(7, 3, 2, pk::dropoutOpId("/attn/attn_dropout/Dropout"));
  for (const AttentionCase &c : kAttentionCases) {
    const std::string what = c.str();
    auto q = randomVec(c.qs.numel(), seed++), k = randomVec(c.ks.numel(), seed++), v = randomVec(c.vs.numel(), seed++);
    const AttentionMasks masks = masksOf(c, seed++);
    const uint8_t *m = masks.maskData();
    const float *a = masks.additiveData();
    pk::Shape ss = c.qs; // the scores [L..., S, T]
    const int64_t T = c.ks.v[c.ks.size - 2], Dv = c.vs.v[c.vs.size - 1];
    ss.v[ss.size - 1] = T;
    const int64_t n = ss.numel(), rows = n / T;
    pk::Shape ys = c.qs;
    ys.v[ys.size - 1] = Dv;
    // The unfused forward: z, P, P dropped out, the product.
    std::vector<float> s(n), z(n), p(n), dropped(n), want(rows * Dv);
    std::vector<uint8_t> kept(n);
    pk::matmul(q.data(), c.qs, k.data(), c.ks, s.data(), false, true);
    const std::vector<int64_t> maskDims(c.ms.v, c.ms.v + c.ms.size);
    std::vector<uint8_t> maskedAt(n, 0);
    int64_t e = 0;
    kt::forEachIndex(kt::vecOf(ss), [&](const std::vector<int64_t> &index) {
      const int64_t at = c.masked ? bcastOffset(index, maskDims) : 0;
      const float scaled = c.divide ? s[e] / 0.7f : s[e] * 0.7f;
      maskedAt[e] = c.masked && !c.additive && masks.mask[at];
      z[e] = !c.masked ? scaled : c.additive ? scaled + masks.additive[at] : maskedAt[e] ? -1e9f : scaled;
      ++e;
    });
    pk::softmax(z.data(), ss, -1, p.data());
    pk::dropout(p.data(), n, dropped.data(), kept.data(), ratio, true, key);
    pk::matmul(dropped.data(), ss, v.data(), c.vs, want.data());
    std::vector<float> y(want.size()), lse(rows);
    pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.7f, c.divide, -1e9f, true, ratio, true,
                  key, y.data(), lse.data());
    expectAllNear(y, want, 1e-5, ("y " + what).c_str());

    // The mask bit for bit: with v the identity y is the dropped P itself,
    // 0 exactly where the dropout dropped an (unmasked, positive) P.
    pk::Shape is = c.vs;
    is.v[is.size - 1] = T;
    std::vector<float> identity(is.numel(), 0.0f), droppedP(n), l(rows);
    for (int64_t e = 0; e < is.numel(); ++e) identity[e] = (e / T) % T == e % T ? 1.0f : 0.0f;
    pk::attention(q.data(), c.qs, k.data(), c.ks, identity.data(), is, m, a, c.ms, 0.7f, c.divide, -1e9f, true, ratio,
                  true, key, droppedP.data(), l.data());
    int64_t droppedCount = 0;
    for (e = 0; e < n; ++e) {
      if (maskedAt[e]) continue;
      ASSERT_EQ(droppedP[e] != 0.0f, kept[e] != 0) << what << " element " << e;
      droppedCount += !kept[e];
    }
    EXPECT_GT(droppedCount, 0) << what;
    expectAllNear(droppedP, dropped, 1e-5, ("dropped P " + what).c_str());

    // Inference drops nothing: the bits of the op without dropout.
    std::vector<float> plain(y.size()), inferred(y.size());
    pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.7f, c.divide, -1e9f, true, 0.0f, false,
                  0, plain.data(), l.data());
    pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.7f, c.divide, -1e9f, true, ratio, false,
                  key, inferred.data(), l.data());
    ASSERT_EQ(plain, inferred) << what;

    // The unfused backward: the products' gradients, dropout's, the softmax's.
    const auto dy = randomVec(want.size(), seed++);
    std::vector<float> dDropped(n), dp(n), dz(n), wantDq(q.size()), wantDk(k.size()), wantDv(v.size());
    pk::matmul(dy.data(), ys, v.data(), c.vs, dDropped.data(), false, true);
    pk::dropoutGrad(dDropped.data(), kept.data(), n, dp.data(), ratio, true);
    if (m) {
      pk::maskedSoftmaxGrad(dp.data(), p.data(), ss, m, c.ms, 0.7f, c.divide, true, dz.data());
    } else {
      pk::softmaxGrad(dp.data(), p.data(), ss, -1, dz.data());
      for (float &g : dz) g = c.divide ? g / 0.7f : g * 0.7f;
    }
    pk::matmul(dz.data(), ss, k.data(), c.ks, wantDq.data());
    pk::matmul(dz.data(), ss, q.data(), c.qs, wantDk.data(), true, false);
    pk::matmul(dropped.data(), ss, dy.data(), ys, wantDv.data(), true, false);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    pk::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, y.data(), lse.data(),
                      0.7f, c.divide, -1e9f, true, ratio, true, key, dq.data(), dk.data(), dv.data());
    expectAllNear(dq, wantDq, 1e-4, ("dq " + what).c_str());
    expectAllNear(dk, wantDk, 1e-4, ("dk " + what).c_str());
    expectAllNear(dv, wantDv, 1e-5, ("dv " + what).c_str());
  }
}

TEST(Gradients, AttentionQueryKeyValue) {
  int seed = 120;
  for (const AttentionCase &c : kAttentionCases) {
    if (c.qs.v[c.qs.size - 2] > 8) continue; // the finite differences of one block suffice
    auto q = randomVec(c.qs.numel(), seed++), k = randomVec(c.ks.numel(), seed++), v = randomVec(c.vs.numel(), seed++);
    const AttentionMasks masks = masksOf(c, seed++);
    const uint8_t *m = masks.maskData();
    const float *a = masks.additiveData();
    const int64_t rows = c.qs.numel() / c.qs.v[c.qs.size - 1];
    std::vector<float> y(rows * c.vs.v[c.vs.size - 1]), lse(rows);
    auto dy = randomVec(y.size(), seed++);
    // Every other case with a dropout of P: the same mask in each evaluation.
    const float ratio = seed % 2 ? 0.25f : 0.0f;
    const uint64_t key = pk::dropoutStreamKey(1, 2, 3, 4);
    pk::attention(q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, 0.7f, c.divide, -1e9f, true, ratio, true,
                  key, y.data(), lse.data());
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    pk::attentionGrad(dy.data(), q.data(), c.qs, k.data(), c.ks, v.data(), c.vs, m, a, c.ms, y.data(), lse.data(),
                      0.7f, c.divide, -1e9f, true, ratio, true, key, dq.data(), dk.data(), dv.data());
    auto fwd = [&](const float *qp, const float *kp, const float *vp, std::vector<float> &out) {
      std::vector<float> l(rows);
      pk::attention(qp, c.qs, kp, c.ks, vp, c.vs, m, a, c.ms, 0.7f, c.divide, -1e9f, true, ratio, true, key, out.data(),
                    l.data());
    };
    const std::string what = c.str() + (ratio > 0 ? " dropout" : "");
    checkGradient(q, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(in.data(), k.data(), v.data(), out);
    }, dq, 1e-2f, 3e-3, 1e-2, ("dq " + what).c_str());
    checkGradient(k, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(q.data(), in.data(), v.data(), out);
    }, dk, 1e-2f, 3e-3, 1e-2, ("dk " + what).c_str());
    checkGradient(v, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
      fwd(q.data(), k.data(), in.data(), out);
    }, dv, 1e-2f, 3e-3, 1e-2, ("dv " + what).c_str());
  }
  EXPECT_THROW(pk::attention(nullptr, pk::Shape{2, 3}, nullptr, pk::Shape{4, 2}, nullptr, pk::Shape{4, 1}, nullptr,
                             nullptr, pk::Shape{}, 1.0f, false, 0.0f, true, 0.0f, false, 0, nullptr, nullptr),
               std::exception);
}
