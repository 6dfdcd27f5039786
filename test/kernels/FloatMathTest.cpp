// expFloat and erfFloat (pipec/float_math.h) against double precision: every
// float of a dense sweep within 1.5 ulp, special values exact.
#include "pipec/float_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

namespace pk = pipec::kernels;

namespace {

/// |got - exact| in units of the last place of exact rounded to float (the
/// smallest denormal's spacing below the normal range).
double ulpError(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  const double spacing =
      std::nextafter(std::fabs(rounded), std::numeric_limits<float>::infinity()) - std::fabs(rounded);
  return std::fabs(static_cast<double>(got) - exact) / spacing;
}

/// Calls check(x) on every 97th finite float bit pattern, with both signs
/// (every exponent).
template <typename Check> void sweepFloats(Check check) {
  for (uint64_t bits = 0; bits < 0x7f800000ull; bits += 97) {
    check(pk::float_math_detail::fromBits(static_cast<uint32_t>(bits)));
    check(pk::float_math_detail::fromBits(static_cast<uint32_t>(bits) | 0x80000000u));
  }
}

} // namespace

TEST(FloatMath, ExpWithinOneAndAHalfUlpEverywhere) {
  double worst = 0;
  float worstAt = 0;
  sweepFloats([&](float x) {
    const double exact = std::exp(static_cast<double>(x));
    if (exact > std::numeric_limits<float>::max()) {
      ASSERT_EQ(pk::expFloat(x), std::numeric_limits<float>::infinity()) << x;
      return;
    }
    const double err = ulpError(pk::expFloat(x), exact);
    if (err > worst) worst = err, worstAt = x;
  });
  EXPECT_LE(worst, 1.5) << "at x = " << worstAt;
  std::printf("worst %.3f ulp at %.9g\n", worst, worstAt);
}

TEST(FloatMath, ErfWithinOneAndAHalfUlpEverywhere) {
  double worst = 0;
  float worstAt = 0;
  sweepFloats([&](float x) {
    const double err = ulpError(pk::erfFloat(x), std::erf(static_cast<double>(x)));
    if (err > worst) worst = err, worstAt = x;
  });
  EXPECT_LE(worst, 1.5) << "at x = " << worstAt;
  std::printf("worst %.3f ulp at %.9g\n", worst, worstAt);
}

TEST(FloatMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(pk::expFloat(0.0f), 1.0f);
  EXPECT_EQ(pk::expFloat(-0.0f), 1.0f);
  EXPECT_EQ(pk::expFloat(inf), inf);
  EXPECT_EQ(pk::expFloat(-inf), 0.0f);
  EXPECT_EQ(pk::expFloat(88.8f), inf);
  EXPECT_EQ(pk::expFloat(-200.0f), 0.0f);
  EXPECT_GT(pk::expFloat(-100.0f), 0.0f); // denormal, not flushed
  EXPECT_TRUE(std::isnan(pk::expFloat(nan)));
  EXPECT_EQ(pk::erfFloat(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(pk::erfFloat(-0.0f)));
  EXPECT_EQ(pk::erfFloat(inf), 1.0f);
  EXPECT_EQ(pk::erfFloat(-inf), -1.0f);
  EXPECT_EQ(pk::erfFloat(10.0f), 1.0f);
  EXPECT_LE(ulpError(pk::erfFloat(1e-30f), std::erf(static_cast<double>(1e-30f))), 1.0);
  EXPECT_TRUE(std::isnan(pk::erfFloat(nan)));
}
