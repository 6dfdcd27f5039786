#include "TestUtil.h"

#include <cstring>
#include <limits>

using namespace kt;

namespace {

TEST(Elementwise, BinaryBroadcastMatchesReference) {
  struct Case { pk::Shape a, b; };
  const Case cases[] = {{{2, 3}, {2, 3}}, {{2, 3}, {3}},       {{2, 1, 4}, {3, 1}}, {{4}, {}},
                        {{}, {2, 2}},     {{1, 3, 1}, {2, 1, 5}}, {{5, 4}, {1, 1}}, {{2, 3, 4}, {2, 1, 4}}};
  const pk::Binary ops[] = {pk::Binary::Add, pk::Binary::Sub, pk::Binary::Mul, pk::Binary::Div, pk::Binary::Pow};
  int seed = 1;
  for (const Case &c : cases)
    for (pk::Binary op : ops) {
      auto a = randomVec(c.a.numel(), seed++, 0.5f, 2.0f), b = randomVec(c.b.numel(), seed++, 0.5f, 2.0f);
      const pk::Shape os = pk::broadcastShape(c.a, c.b);
      std::vector<float> out(os.numel()), want;
      pk::binary(op, a.data(), c.a, b.data(), c.b, out.data());
      forEachIndex(vecOf(os), [&](const std::vector<int64_t> &idx) {
        const float x = a[bcastOffset(idx, vecOf(c.a))], y = b[bcastOffset(idx, vecOf(c.b))];
        switch (op) {
        case pk::Binary::Add: want.push_back(x + y); break;
        case pk::Binary::Sub: want.push_back(x - y); break;
        case pk::Binary::Mul: want.push_back(x * y); break;
        case pk::Binary::Div: want.push_back(x / y); break;
        case pk::Binary::Pow: want.push_back(std::pow(x, y)); break;
        }
      });
      expectAllNear(out, want, 1e-6, c.a.str().c_str());
    }
}

// Every function of vocabulary.h's binary table against a double-precision
// formula written here: the arithmetic ones on floats (pk::binary), the
// comparisons on floats and the logical ones on bools (pk::compare).
TEST(Elementwise, EveryBinaryFunction) {
  const pk::Shape as{2, 3}, bs{3};
  // Ties, signs and a NaN, so that Max/Min, Mod and the comparisons meet them.
  const std::vector<float> a{1.5f, -2.0f, 3.0f, 0.5f, std::nanf(""), -7.5f}, b{1.5f, 3.0f, -2.0f};
  const std::vector<uint8_t> p{1, 0, 1, 0, 0, 1}, q{1, 1, 0};
  for (int k = 0; k < pipec::kNumBinaryFunctions; ++k) {
    const pk::Binary op = pk::Binary(k);
    const char *name = pipec::kBinaryFunctions[k].spelling;
    std::vector<float> out(6);
    std::vector<uint8_t> flags(6);
    if (pipec::takesBool(op))
      pk::compare(op, p.data(), as, q.data(), bs, flags.data());
    else if (pipec::givesBool(op))
      pk::compare(op, a.data(), as, b.data(), bs, flags.data());
    else
      pk::binary(op, a.data(), as, b.data(), bs, out.data());
    for (int i = 0; i < 6; ++i) {
      const double x = a[i], y = b[i % 3];
      const bool u = p[i], v = q[i % 3];
      double want = 0;
      switch (op) {
      case pk::Binary::Add: want = x + y; break;
      case pk::Binary::Sub: want = x - y; break;
      case pk::Binary::Mul: want = x * y; break;
      case pk::Binary::Div: want = x / y; break;
      case pk::Binary::Pow: want = std::pow(x, y); break;
      case pk::Binary::Max: want = std::isnan(x) ? x : std::max(x, y); break;
      case pk::Binary::Min: want = std::isnan(x) ? x : std::min(x, y); break;
      case pk::Binary::Mod: want = x - y * std::floor(x / y); break;
      case pk::Binary::FMod: want = std::fmod(x, y); break;
      case pk::Binary::Equal: want = x == y; break;
      case pk::Binary::Less: want = x < y; break;
      case pk::Binary::LessOrEqual: want = x <= y; break;
      case pk::Binary::Greater: want = x > y; break;
      case pk::Binary::GreaterOrEqual: want = x >= y; break;
      case pk::Binary::And: want = u && v; break;
      case pk::Binary::Or: want = u || v; break;
      case pk::Binary::Xor: want = u != v; break;
      }
      const double got = pipec::givesBool(op) ? flags[i] : out[i];
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got)) << name << " element " << i;
      else
        EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << name << " element " << i;
    }
  }
  // A function of the other kind is refused, naming the op.
  std::vector<float> out(6);
  std::vector<uint8_t> flags(6);
  EXPECT_THROW(pk::binary(pk::Binary::Less, a.data(), as, b.data(), bs, out.data()), pk::KernelError);
  EXPECT_THROW(pk::compare(pk::Binary::Add, a.data(), as, b.data(), bs, flags.data()), pk::KernelError);
}

TEST(Elementwise, IntegerModMaxMin) {
  const int64_t a[4] = {7, -7, 7, -7}, b[4] = {3, 3, -3, -3};
  int64_t out[4];
  pk::binary(pk::Binary::Mod, a, {4}, b, {4}, out); // the sign of the divisor (Python)
  EXPECT_EQ(std::vector<int64_t>(out, out + 4), (std::vector<int64_t>{1, 2, -2, -1}));
  pk::binary(pk::Binary::FMod, a, {4}, b, {4}, out); // the sign of the dividend (C)
  EXPECT_EQ(std::vector<int64_t>(out, out + 4), (std::vector<int64_t>{1, -1, 1, -1}));
  pk::binary(pk::Binary::Max, a, {4}, b, {4}, out);
  EXPECT_EQ(std::vector<int64_t>(out, out + 4), (std::vector<int64_t>{7, 3, 7, -3}));
  const int64_t zero = 0;
  EXPECT_THROW(pk::binary(pk::Binary::Mod, a, {4}, &zero, {}, out), pk::KernelError);
}

TEST(Elementwise, BroadcastShapesAndErrors) {
  EXPECT_EQ(pk::broadcastShape({2, 1, 4}, {3, 1}), (pk::Shape{2, 3, 4}));
  EXPECT_EQ(pk::broadcastShape({}, {}), pk::Shape{});
  EXPECT_THROW(pk::broadcastShape({2, 3}, {4}), pk::KernelError);
  float a[6] = {}, b[4] = {}, out[8];
  EXPECT_THROW(pk::add(a, {2, 3}, b, {4}, out), pk::KernelError);
}

TEST(Elementwise, PowSquareAndSpecialValues) {
  const float x[4] = {-3.0f, 0.0f, 2.5f, -0.5f}, two = 2.0f;
  float y[4];
  pk::pow(x, {4}, &two, {}, y);
  EXPECT_EQ(y[0], 9.0f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 6.25f);
  const float half = 0.5f;
  pk::pow(x, {4}, &half, {}, y);
  EXPECT_TRUE(std::isnan(y[0])); // negative base, fractional exponent
  EXPECT_FLOAT_EQ(y[2], std::sqrt(2.5f));
}

TEST(Elementwise, IntegerBinaryTruncatesAndWraps) {
  const int64_t a[4] = {7, -7, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  const int64_t b[4] = {2, 2, 1, -1};
  int64_t out[4];
  pk::binary(pk::Binary::Div, a, {4}, b, {4}, out);
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], -3); // toward zero
  EXPECT_EQ(out[3], std::numeric_limits<int64_t>::min());
  pk::binary(pk::Binary::Add, a, {4}, b, {4}, out);
  EXPECT_EQ(out[2], std::numeric_limits<int64_t>::min()); // wraps
  const int64_t zero = 0;
  EXPECT_THROW(pk::binary(pk::Binary::Div, a, {4}, &zero, {}, out), pk::KernelError);
  const int64_t three = 3;
  pk::binary(pk::Binary::Pow, a, {2}, &three, {}, out);
  EXPECT_EQ(out[0], 343);
  EXPECT_EQ(out[1], -343);
}

TEST(Elementwise, EqualAndWhereBroadcast) {
  const int64_t a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {1, 5, 3};
  uint8_t eq[6];
  pk::equal(a, {2, 3}, b, {3}, eq);
  const uint8_t wantEq[6] = {1, 0, 1, 0, 1, 0};
  EXPECT_EQ(0, std::memcmp(eq, wantEq, 6));
  const float fa[2] = {0.5f, -0.0f}, fb[1] = {0.0f};
  uint8_t feq[2];
  pk::equal(fa, {2}, fb, {}, feq);
  EXPECT_EQ(feq[0], 0);
  EXPECT_EQ(feq[1], 1); // -0 == 0

  // cond [2,1], x [1,3], y scalar -> [2,3]
  const uint8_t cond[2] = {1, 0};
  const float x[3] = {1, 2, 3}, y = -1.0f;
  float out[6];
  pk::where(cond, {2, 1}, x, {1, 3}, &y, {}, out);
  const float want[6] = {1, 2, 3, -1, -1, -1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], want[i]);
  // Same shapes (the fast path) with int64 values.
  const uint8_t c3[3] = {0, 1, 0};
  const int64_t xi[3] = {10, 20, 30}, yi[3] = {-1, -2, -3};
  int64_t oi[3];
  pk::where(c3, {3}, xi, {3}, yi, {3}, oi);
  EXPECT_EQ(oi[0], -1);
  EXPECT_EQ(oi[1], 20);
  EXPECT_EQ(oi[2], -3);
}

TEST(Elementwise, UnaryKnownValues) {
  const float x[5] = {-2.0f, -0.5f, 0.0f, 0.5f, 3.0f};
  float y[5];
  pk::unary(pk::Unary::Relu, x, 5, y);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], 0.5f);
  pk::unary(pk::Unary::Tanh, x, 5, y);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], std::tanh((double)x[i]), 1e-7);
  pk::unary(pk::Unary::Sigmoid, x, 5, y);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], 1.0 / (1.0 + std::exp(-(double)x[i])), 1e-7);
  pk::unary(pk::Unary::Erf, x, 5, y);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], std::erf((double)x[i]), 1e-7);
  pk::unary(pk::Unary::Gelu, x, 5, y);
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(y[i], 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0))), 1e-6);
  EXPECT_NEAR(y[4], 2.9959502, 1e-6); // torch.nn.functional.gelu(3.0)
  float t[5];
  pk::unary(pk::Unary::GeluTanh, x, 5, t);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(t[i], y[i], 1e-3); // the approximation is close to the exact form
    const double v = x[i];
    EXPECT_NEAR(t[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-6);
  }
  const float sq[3] = {4.0f, 2.0f, -1.0f};
  pk::unary(pk::Unary::Sqrt, sq, 3, y);
  EXPECT_EQ(y[0], 2.0f);
  EXPECT_FLOAT_EQ(y[1], std::sqrt(2.0f));
  EXPECT_TRUE(std::isnan(y[2]));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  pk::unary(pk::Unary::Relu, &nan, 1, y);
  EXPECT_TRUE(std::isnan(y[0])); // NaN propagates as in the evaluator
  EXPECT_EQ(pk::unaryKind("gelu_tanh"), pk::Unary::GeluTanh);
  EXPECT_EQ(pk::unaryKind("softplus"), pk::Unary::Softplus);
  EXPECT_THROW(pk::unaryKind("softmax"), pk::KernelError);
}

TEST(Elementwise, CastTruncatesSaturatesAndBools) {
  const float f[6] = {2.7f, -2.7f, 1e20f, -1e20f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  int32_t i32[6];
  pk::cast(f, 6, i32);
  EXPECT_EQ(i32[0], 2);
  EXPECT_EQ(i32[1], -2);
  EXPECT_EQ(i32[2], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(i32[3], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(i32[4], 0);
  int64_t i64[6];
  pk::cast(f, 6, i64);
  EXPECT_EQ(i64[2], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64[3], std::numeric_limits<int64_t>::min());
  uint8_t b[6];
  pk::cast(f, 6, b);
  const uint8_t wantB[6] = {1, 1, 1, 1, 1, 0}; // NaN != 0
  EXPECT_EQ(0, std::memcmp(b, wantB, 6));
  const int64_t big[2] = {(int64_t)1 << 33 | 5, -1};
  int32_t wrapped[2];
  pk::cast(big, 2, wrapped);
  EXPECT_EQ(wrapped[0], 5); // integer narrowing wraps
  EXPECT_EQ(wrapped[1], -1);
  float back[2];
  pk::cast(b, 2, back);
  EXPECT_EQ(back[0], 1.0f);
  double d[1];
  pk::cast(f, 1, d);
  EXPECT_EQ(d[0], (double)2.7f);
}

// The generator must be bit-identical to the evaluator's
// (compiler/Evaluator/ElementwiseKernels.cpp). The values below were produced by the
// evaluator's own functions (pipec::eval::kernels::mix64, dropoutStreamKey,
// dropoutUniform, dropout); test/unit/evaluator/KernelsTest.cpp pins the
// first of them there.
TEST(Dropout, GeneratorMatchesTheEvaluatorBits) {
  static_assert(pk::dropoutMix64(0x9E3779B97F4A7C15ull) == 0xE220A8397B1DCDAFull, "SplitMix64(0) first output");
  EXPECT_EQ(pk::dropoutStreamKey(0, 0, 0, 0), 0xc213c59a64d9cf09ull);
  EXPECT_EQ(pk::dropoutStreamKey(1, 2, 3, 4), 0x7790d7370d409cbeull);
  EXPECT_EQ(pk::dropoutStreamKey(42, 7, 5, 0xcbf29ce484222325ull), 0x8ad9d3ace0550263ull);
  EXPECT_EQ(pk::dropoutUniform(0xc213c59a64d9cf09ull, 0), 0x1.a0e793ac28c2ap-2);
  EXPECT_EQ(pk::dropoutUniform(0x7790d7370d409cbeull, 5), 0x1.299f02d784d4p-6);
  EXPECT_EQ(pk::dropoutUniform(0x8ad9d3ace0550263ull, 1000), 0x1.462c5221274dep-2);
  // The evaluator's formula, spelled out (docs/evaluator.md).
  const uint64_t key = pk::dropoutStreamKey(0, 0, 0, 0);
  EXPECT_EQ(pk::dropoutUniform(key, 0),
            static_cast<double>(pk::dropoutMix64(key + 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53);
  // FNV-1a: the empty name is the offset basis, "a" a published test vector.
  EXPECT_EQ(pk::dropoutOpId(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(pk::dropoutOpId("a"), 0xaf63dc4c8601ec8cull);
}

TEST(Dropout, MaskAndValuesMatchTheEvaluator) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = (float)(0.1 * i - 3.0);
  std::vector<float> y(64);
  std::vector<uint8_t> mask(64);
  pk::dropout(x.data(), 64, y.data(), mask.data(), 0.25f, true, pk::dropoutStreamKey(1, 2, 3, 4));
  uint64_t bits = 0;
  for (int i = 0; i < 64; ++i) bits |= (uint64_t)mask[i] << i;
  EXPECT_EQ(bits, 0xd737d978dfbcff59ull); // pipec::eval::kernels::dropout, same key and ratio
  EXPECT_EQ(y[0], -0x1p+2f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], -0x1.cccccep+1f);
  EXPECT_EQ(y[4], -0x1.bbbbbap+1f);
  // A float ratio that is not exact in binary: compared as a double.
  pk::dropout(x.data(), 64, y.data(), mask.data(), 0.1f, true,
              pk::dropoutStreamKey(42, 7, 5, 0xcbf29ce484222325ull));
  bits = 0;
  for (int i = 0; i < 64; ++i) bits |= (uint64_t)mask[i] << i;
  EXPECT_EQ(bits, 0xeffeeebffbfe6dffull);
  EXPECT_EQ(y[0], -0x1.aaaaaap+1f);
  // Kept elements are scaled, dropped ones are zero.
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(y[i], mask[i] ? (float)((double)x[i] / (1.0 - (double)0.1f)) : 0.0f);
}

// The kernel's integer comparison against the evaluator's double one, on
// ratios whose r·2^53 is an integer (the boundary) and ones that are not,
// and a long tensor (several blocks, a ragged end) element by element.
TEST(Dropout, IntegerThresholdAgreesWithTheUniform) {
  const double ratios[] = {0x1p-53, 0.25, 0.5, (double)0.1f, (double)0.999f, 1.0 - 0x1p-53, 1e-300};
  const uint64_t key = pk::dropoutStreamKey(3, 1, 4, 1);
  for (double r : ratios) {
    const uint64_t threshold = pk::dropoutKeepThreshold(r);
    for (uint64_t i = 0; i < 20000; ++i) {
      ASSERT_EQ(pk::dropoutDraw(key, i) >= threshold, pk::dropoutUniform(key, i) >= r) << "ratio " << r << " index " << i;
    }
    // Draws exactly at the threshold and one below it.
    ASSERT_GE((double)threshold * 0x1p-53, r);
    if (threshold > 0) ASSERT_LT((double)(threshold - 1) * 0x1p-53, r);
  }
  const int64_t n = 1000;
  std::vector<float> x(n, 1.5f), y(n);
  std::vector<uint8_t> mask(n);
  pk::dropout(x.data(), n, y.data(), mask.data(), 0.3f, true, key);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = pk::dropoutUniform(key, (uint64_t)i) >= (double)0.3f;
    ASSERT_EQ(mask[i], keep ? 1 : 0) << i;
    ASSERT_EQ(y[i], keep ? (float)(1.5 * (1.0 / (1.0 - (double)0.3f))) : 0.0f) << i;
  }
}

TEST(Dropout, IdentityOutsideTrainingAndRatioChecked) {
  auto x = randomVec(100, 3);
  std::vector<float> y(100);
  std::vector<uint8_t> mask(100, 7);
  pk::dropout(x.data(), 100, y.data(), mask.data(), 0.5f, false, 123);
  EXPECT_EQ(x, y);
  for (uint8_t m : mask) EXPECT_EQ(m, 1);
  pk::dropout(x.data(), 100, y.data(), nullptr, 0.0f, true, 123);
  EXPECT_EQ(x, y);
  EXPECT_THROW(pk::dropout(x.data(), 100, y.data(), nullptr, 1.0f, true, 1), pk::KernelError);
  // Every key part changes the mask; the rate is about the ratio.
  std::vector<uint8_t> m1(4000), m2(4000);
  std::vector<float> big(4000, 1.0f), out(4000);
  pk::dropout(big.data(), 4000, out.data(), m1.data(), 0.3f, true, pk::dropoutStreamKey(1, 1, 1, 1));
  int kept = 0;
  for (uint8_t m : m1) kept += m;
  EXPECT_NEAR(kept, 2800, 120);
  for (uint64_t key : {pk::dropoutStreamKey(2, 1, 1, 1), pk::dropoutStreamKey(1, 2, 1, 1),
                       pk::dropoutStreamKey(1, 1, 2, 1), pk::dropoutStreamKey(1, 1, 1, 2)}) {
    pk::dropout(big.data(), 4000, out.data(), m2.data(), 0.3f, true, key);
    EXPECT_NE(m1, m2);
  }
}

TEST(Dropout, GradientUsesTheMask) {
  auto x = randomVec(50, 4);
  std::vector<float> y(50), dx(50);
  std::vector<uint8_t> mask(50);
  const uint64_t key = pk::dropoutStreamKey(5, 6, 7, 8);
  pk::dropout(x.data(), 50, y.data(), mask.data(), 0.4f, true, key);
  auto dy = randomVec(50, 5);
  pk::dropoutGrad(dy.data(), mask.data(), 50, dx.data(), 0.4f, true);
  // The forward is linear in x for a fixed mask: the FD check is exact up to rounding.
  checkGradient(x, dy, [&](const std::vector<float> &in, std::vector<float> &out) {
    pk::dropout(in.data(), 50, out.data(), nullptr, 0.4f, true, key);
  }, dx, 1e-2f, 1e-4, 1e-4, "dropout");
  // Without the mask: drawn again from the forward's key, the same bits.
  std::vector<float> redrawn(50);
  pk::dropoutGradRedrawn(dy.data(), 50, redrawn.data(), 0.4f, true, key);
  EXPECT_EQ(redrawn, dx);
  pk::dropoutGrad(dy.data(), mask.data(), 50, dx.data(), 0.4f, false);
  EXPECT_EQ(dx, dy);
  pk::dropoutGradRedrawn(dy.data(), 50, redrawn.data(), 0.4f, false, key);
  EXPECT_EQ(redrawn, dy);
}

} // namespace
