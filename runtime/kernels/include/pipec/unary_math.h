// The element-wise unary functions' formulas in fp32, shared by the CPU
// kernels (elementwise.cpp) and the CUDA kernels (elementwise.cu), so that a
// new function is written once for both (docs/adding-an-op.md). The list of
// functions, their spellings and which forward value a derivative reads are
// pipec/vocabulary.h's table.
#pragma once

#include "pipec/float_math.h"
#include "pipec/host_device.h"
#include "pipec/vocabulary.h"

#include <math.h>
#include <type_traits>

namespace pipec::kernels {

namespace unary_constants {
constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kTwoOverSqrtPi = 1.12837916709551257390f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluTanhC = 0.044715f;
} // namespace unary_constants

template <Unary> struct UnaryWithoutFormula : std::false_type {};

/// e^v and erf(v): on the host the branch-free versions of
/// pipec/float_math.h, which vectorize; on a GPU, CUDA's.
PIPEC_HOST_DEVICE float unaryExp(float v) {
#ifdef __CUDA_ARCH__
  return expf(v);
#else
  return expFloat(v);
#endif
}
PIPEC_HOST_DEVICE float unaryErf(float v) {
#ifdef __CUDA_ARCH__
  return erff(v);
#else
  return erfFloat(v);
#endif
}

/// f(v).
template <Unary U> PIPEC_HOST_DEVICE float unaryValue(float v) {
  using namespace unary_constants;
  // NaN propagates (it is not <= 0) and -0 becomes +0; one compare and
  // select, which vectorizes.
  if constexpr (U == Unary::Relu) return v <= 0.0f ? 0.0f : v;
  else if constexpr (U == Unary::Relu6) return v <= 0.0f ? 0.0f : (v >= 6.0f ? 6.0f : v); // Clip's wheres: NaN stays
  else if constexpr (U == Unary::Tanh) return tanhf(v);
  else if constexpr (U == Unary::Sigmoid) return 1.0f / (1.0f + unaryExp(-v));
  else if constexpr (U == Unary::Erf) return unaryErf(v);
  else if constexpr (U == Unary::Sqrt) return sqrtf(v);
  else if constexpr (U == Unary::Gelu) return 0.5f * v * (1.0f + unaryErf(v * kSqrt1_2));
  else if constexpr (U == Unary::GeluTanh)
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluTanhC * v * v * v)));
  else if constexpr (U == Unary::Neg) return -v;
  else if constexpr (U == Unary::Reciprocal) return 1.0f / v;
  else if constexpr (U == Unary::Abs) return fabsf(v);
  else if constexpr (U == Unary::Exp) return unaryExp(v);
  else if constexpr (U == Unary::Log) return logf(v);
  else if constexpr (U == Unary::Sin) return sinf(v);
  else if constexpr (U == Unary::Cos) return cosf(v);
  else if constexpr (U == Unary::Softplus) // log(1 + e^v) without overflow for large v
    return (v > 0.0f ? v : 0.0f) + log1pf(unaryExp(-fabsf(v)));
  else if constexpr (U == Unary::Softsign) return v / (1.0f + fabsf(v));
  else if constexpr (U == Unary::Floor) return floorf(v);
  else if constexpr (U == Unary::Ceil) return ceilf(v);
  else if constexpr (U == Unary::Round) return rintf(v); // the default rounding mode: halves to even
  else if constexpr (U == Unary::Sign) return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v); // 0 and NaN stay
  else if constexpr (U == Unary::Tan) return tanf(v);
  else if constexpr (U == Unary::Atan) return atanf(v);
  else if constexpr (U == Unary::Asin) return asinf(v);
  else if constexpr (U == Unary::Acos) return acosf(v);
  else if constexpr (U == Unary::Sinh) return sinhf(v);
  else if constexpr (U == Unary::Cosh) return coshf(v);
  else if constexpr (U == Unary::Asinh) return asinhf(v);
  else if constexpr (U == Unary::Acosh) return acoshf(v);
  else if constexpr (U == Unary::Atanh) return atanhf(v);
  else static_assert(UnaryWithoutFormula<U>::value, "a unary function of vocabulary.h has no formula here");
}

/// dy * f'(x), where y = f(x); each function reads the forward value
/// vocabulary.h's table names (the other may be anything).
template <Unary U> PIPEC_HOST_DEVICE float unaryGradient(float g, float x, float y) {
  using namespace unary_constants;
  if constexpr (U == Unary::Relu) return y > 0.0f ? g : 0.0f; // y > 0 exactly where x > 0 (NaN: neither)
  // ONNX Clip's exclusive bounds, as PyTorch's relu6 (hardtanh) backward:
  // 0 where x <= 0 (y = 0) or x >= 6 (y = 6); NaN passes g, as its wheres do.
  else if constexpr (U == Unary::Relu6) return y <= 0.0f || y >= 6.0f ? 0.0f : g;
  else if constexpr (U == Unary::Tanh) return g * (1.0f - y * y);
  else if constexpr (U == Unary::Sigmoid) return g * y * (1.0f - y);
  else if constexpr (U == Unary::Erf) return g * kTwoOverSqrtPi * unaryExp(-x * x);
  else if constexpr (U == Unary::Sqrt) return g / (2.0f * y);
  else if constexpr (U == Unary::Gelu) {
    const float cdf = 0.5f * (1.0f + unaryErf(x * kSqrt1_2));
    const float pdf = kInvSqrt2Pi * unaryExp(-0.5f * x * x);
    return g * (cdf + x * pdf);
  } else if constexpr (U == Unary::GeluTanh) {
    const float t = tanhf(kSqrt2OverPi * (x + kGeluTanhC * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhC * x * x);
    return g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  } else if constexpr (U == Unary::Neg) return -g;
  else if constexpr (U == Unary::Reciprocal) return -g * y * y;
  else if constexpr (U == Unary::Abs) return x > 0.0f ? g : (x < 0.0f ? -g : 0.0f);
  else if constexpr (U == Unary::Exp) return g * y;
  else if constexpr (U == Unary::Log) return g / x;
  else if constexpr (U == Unary::Sin) return g * cosf(x);
  else if constexpr (U == Unary::Cos) return -g * sinf(x);
  else if constexpr (U == Unary::Softplus) return g / (1.0f + unaryExp(-x)); // sigmoid(x)
  else if constexpr (U == Unary::Softsign) {
    const float d = 1.0f + fabsf(x);
    return g / (d * d);
  } else if constexpr (U == Unary::Floor || U == Unary::Ceil || U == Unary::Round || U == Unary::Sign)
    return 0.0f;
  else if constexpr (U == Unary::Tan) return g * (1.0f + y * y);
  else if constexpr (U == Unary::Atan) return g / (1.0f + x * x);
  else if constexpr (U == Unary::Asin) return g / sqrtf(1.0f - x * x);
  else if constexpr (U == Unary::Acos) return -g / sqrtf(1.0f - x * x);
  else if constexpr (U == Unary::Sinh) return g * coshf(x);
  else if constexpr (U == Unary::Cosh) return g * sinhf(x);
  else if constexpr (U == Unary::Asinh) return g / sqrtf(x * x + 1.0f);
  else if constexpr (U == Unary::Acosh) return g / sqrtf(x * x - 1.0f);
  else if constexpr (U == Unary::Atanh) return g / (1.0f - x * x);
  else static_assert(UnaryWithoutFormula<U>::value, "a unary function of vocabulary.h has no derivative here");
}

/// An epilogue's activation, as the batch-norm kernels of both libraries
/// and the CUDA convolutions apply it (pipec-fuse-norm-epilogue): none,
/// ReLU or ReLU6.
enum class EpilogueActivation : unsigned char { None, Relu, Relu6 };

/// The activation's value at v, and the gradient it passes back from its
/// output y: unaryValue and unaryGradient of its function.
PIPEC_HOST_DEVICE float epilogueActivationValue(EpilogueActivation a, float v) {
  return a == EpilogueActivation::Relu ? unaryValue<Unary::Relu>(v)
                                   : a == EpilogueActivation::Relu6 ? unaryValue<Unary::Relu6>(v) : v;
}
PIPEC_HOST_DEVICE float epilogueActivationGradient(EpilogueActivation a, float g, float y) {
  return a == EpilogueActivation::Relu ? unaryGradient<Unary::Relu>(g, 0.0f, y)
                                   : a == EpilogueActivation::Relu6 ? unaryGradient<Unary::Relu6>(g, 0.0f, y) : g;
}

/// Calls f(std::integral_constant<Unary, op>{}): one switch over the table,
/// so that the loop (or kernel launch) inside f is compiled once per function.
/// Host code.
template <class F> auto dispatchUnary(Unary op, F &&f) {
  switch (op) {
#define PIPEC_CASE(name, spelling, reads, flops, derivativeFlops)                                  \
  case Unary::name:                                                                                \
    return f(std::integral_constant<Unary, Unary::name>{});
    PIPEC_UNARY_FUNCTIONS(PIPEC_CASE)
#undef PIPEC_CASE
  }
  return f(std::integral_constant<Unary, Unary::Relu>{}); // not reached: every enumerator has a case
}

/// Whether function U's derivative reads the forward input x (else the result y).
template <Unary U> constexpr bool derivativeReadsInput() {
  return pipec::derivativeReadsInput(U);
}

/// Refuses a missing forward value the function's derivative reads (null x
/// or y); the message names the one it needs.
inline const char *missingForwardValue(Unary op, const float *x, const float *y) {
  const bool readsInput = pipec::derivativeReadsInput(op);
  if (readsInput ? x == nullptr : y == nullptr)
    return readsInput ? "this kind needs the forward input x" : "this kind needs the forward result y";
  return nullptr;
}

} // namespace pipec::kernels
