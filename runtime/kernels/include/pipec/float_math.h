// exp and erf in fp32 without branches, so that a loop over them vectorizes
// (glibc's expf and erff are calls the compiler keeps scalar). Both are
// within 1.5 ulp of the exact value over the whole float range, NaN and ±inf
// included (test/kernels/FloatMathTest.cpp checks every 97th float
// against double precision). docs/cpu-kernels.md, "exp and erf", says why.
#pragma once

#include <cstdint>
#include <cstring>

namespace pipec::kernels {

namespace float_math_detail {

inline float fromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t toBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

/// exp(hi + lo) for |lo| much smaller than ulp(hi), hi already in
/// [-104, 88.75]: Cody-Waite reduction hi + lo = n·ln2 + r with |r| <= ln2/2,
/// a degree-7 polynomial for e^r, and 2^n applied in two halves so that a
/// denormal result is rounded once.
inline float expReduced(float hi, float lo) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;         // 12 bits: n·kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;      // ln 2 - kLn2Hi
  constexpr float kRoundMagic = 12582912.0f;     // 1.5·2^23: adding it rounds to an integer
  const float shifted = hi * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t ni = static_cast<int32_t>(toBits(shifted) - toBits(kRoundMagic));
  const float r = (hi - n * kLn2Hi) - n * kLn2Lo + lo;
  // Taylor coefficients 1/k!; |r| <= 0.347 makes the truncation 5e-9.
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r * r + r;
  const float er = 1.0f + p;
  const int32_t half = ni >> 1; // n in [-151, 128]: both halves are normal scales
  const float scale1 = fromBits(static_cast<uint32_t>(half + 127) << 23);
  const float scale2 = fromBits(static_cast<uint32_t>(ni - half + 127) << 23);
  return er * scale1 * scale2;
}

} // namespace float_math_detail

/// e^x in fp32.
inline float expFloat(float x) {
  using namespace float_math_detail;
  constexpr float kMaxArg = 88.7228394f;  // above: +inf
  constexpr float kMinArg = -104.0f;      // below: +0
  float clamped = x < kMinArg ? kMinArg : x;
  clamped = clamped > kMaxArg ? kMaxArg : clamped;
  float y = expReduced(clamped, 0.0f);
  y = x > kMaxArg ? fromBits(0x7f800000u) : y;
  y = x < kMinArg ? 0.0f : y;
  return x != x ? x : y;
}

/// erf(x) in fp32: x + x·P(x²) for |x| < 0.875; above, 1 - erfc(|x|) with
/// erfc(a) = e^(-a²)·R(1/(1 + a/2)), e^(-a²) taken from a² split exactly into
/// hi + lo so that its rounding does not reach erfc. Coefficients are
/// least-squares fits (relative error 2e-9 and 1.5e-9) to double erf/erfc.
inline float erfFloat(float x) {
  using namespace float_math_detail;
  const uint32_t sign = toBits(x) & 0x80000000u;
  const float a = fromBits(toBits(x) & 0x7fffffffu);
  // |x| < 0.875: x + x·(2/√π - 1 + s·P(s)), the leading x exact.
  const float s = x * x;
  float pa = 9.114876743e-05f;
  pa = pa * s - 8.305853916e-04f;
  pa = pa * s + 5.214340126e-03f;
  pa = pa * s - 2.686435560e-02f;
  pa = pa * s + 1.128377792e-01f;
  pa = pa * s - 3.761263865e-01f;
  const float small = x + x * (0.128379167f + s * pa);
  // |x| >= 0.875; erf(4) is 1.0f.
  const float ac = a < 4.0f ? a : 4.0f;
  const float u = 1.0f / (1.0f + 0.5f * ac);
  float r = 1.204505975e-01f;
  r = r * u - 4.751419442e-01f;
  r = r * u + 5.692473414e-01f;
  r = r * u - 1.085922810e-01f;
  r = r * u + 3.502632189e-01f;
  r = r * u + 2.589671206e-01f;
  r = r * u + 2.850283386e-01f;
  r = r * u - 1.620648149e-04f;
  const float acHigh = fromBits(toBits(ac) & 0xfffff000u); // 12 significant bits: acHigh² is exact
  const float erfc = expReduced(-acHigh * acHigh, -(ac - acHigh) * (ac + acHigh)) * r;
  const float large = fromBits(toBits(1.0f - erfc) | sign);
  const float y = a < 0.875f ? small : large;
  return x != x ? x : y;
}

} // namespace pipec::kernels
