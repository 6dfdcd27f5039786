// The element-wise binary functions' fp32 formulas and their gradients,
// shared by the CPU kernels, the CUDA kernels and the loops and kernels
// pipec generates for pipe.fused (docs/optimization.md), so that fused and
// unfused code compute the same values.
#pragma once

#include "pipec/kernel_types.h"
#include "pipec/unary_math.h" // PIPEC_HOST_DEVICE

#include <math.h>

namespace pipec::kernels {

template <Binary> struct BinaryWithoutFormula : std::false_type {};

/// a op b.
template <Binary B> PIPEC_HOST_DEVICE float binaryValue(float a, float b) {
  if constexpr (B == Binary::Add) return a + b;
  else if constexpr (B == Binary::Sub) return a - b;
  else if constexpr (B == Binary::Mul) return a * b;
  else if constexpr (B == Binary::Div) return a / b;
  else if constexpr (B == Binary::Pow) return b == 2.0f ? a * a : powf(a, b); // PyTorch's decomposed LayerNorm squares
  else static_assert(BinaryWithoutFormula<B>::value, "a binary function has no formula here");
}

template <BinaryGrad> struct BinaryGradWithoutFormula : std::false_type {};

/// The gradient with respect to one operand of a op b, from dy = g.
/// As PyTorch: a zero exponent contributes 0 to the base's gradient (not
/// 0 * 0^-1 = NaN), and a zero base with a non-negative exponent 0 to the
/// exponent's (not 0 * log 0).
template <BinaryGrad K> PIPEC_HOST_DEVICE float binaryGradient(float g, float a, float b) {
  if constexpr (K == BinaryGrad::SubRhs) return -g;
  else if constexpr (K == BinaryGrad::DivRhs) return -g * a / (b * b);
  else if constexpr (K == BinaryGrad::PowLhs) return b == 0.0f ? 0.0f : g * b * powf(a, b - 1.0f);
  else if constexpr (K == BinaryGrad::PowRhs) return (a == 0.0f && b >= 0.0f) ? 0.0f : g * powf(a, b) * logf(a);
  else static_assert(BinaryGradWithoutFormula<K>::value, "a binary gradient has no formula here");
}

} // namespace pipec::kernels
