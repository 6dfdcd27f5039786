// The element-wise binary functions' formulas and their gradients, shared by
// the CPU kernels, the CUDA kernels and the loops and kernels pipec
// generates for pipe.fused (docs/optimization.md), so that fused and unfused
// code compute the same values. The list of functions, their spellings and
// result types are pipec/vocabulary.h's table.
#pragma once

#include "pipec/kernel_types.h"
#include "pipec/unary_math.h" // PIPEC_HOST_DEVICE

#include <math.h>
#include <stdint.h>

namespace pipec::kernels {

template <Binary> struct BinaryWithoutFormula : std::false_type {};

/// a op b on floating-point operands (float in the kernels and fused code),
/// and the comparisons on any operands: a T for arithmetic, a bool for the
/// functions the table says give one.
template <Binary B, class T> PIPEC_HOST_DEVICE auto binaryValue(T a, T b) {
  if constexpr (B == Binary::Add) return a + b;
  else if constexpr (B == Binary::Sub) return a - b;
  else if constexpr (B == Binary::Mul) return a * b;
  else if constexpr (B == Binary::Div) return a / b;
  else if constexpr (B == Binary::Pow) return b == T(2) ? a * a : powf(a, b); // PyTorch's decomposed LayerNorm squares
  // NaN in either operand gives NaN, as numpy's and PyTorch's maximum.
  else if constexpr (B == Binary::Max) return (a > b || a != a) ? a : b;
  else if constexpr (B == Binary::Min) return (a < b || a != a) ? a : b;
  else if constexpr (B == Binary::Mod) { // numpy's mod: the sign of the divisor
    const T r = fmodf(a, b);
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
  } else if constexpr (B == Binary::FMod) return fmodf(a, b);
  else if constexpr (B == Binary::Equal) return a == b;
  else if constexpr (B == Binary::Less) return a < b;
  else if constexpr (B == Binary::LessOrEqual) return a <= b;
  else if constexpr (B == Binary::Greater) return a > b;
  else if constexpr (B == Binary::GreaterOrEqual) return a >= b;
  else if constexpr (B == Binary::And) return bool(a) && bool(b);
  else if constexpr (B == Binary::Or) return bool(a) || bool(b);
  else if constexpr (B == Binary::Xor) return bool(a) != bool(b);
  else static_assert(BinaryWithoutFormula<B>::value, "a binary function of vocabulary.h has no formula here");
}

/// Why integer arithmetic failed (0: it did not); the CPU kernels throw with
/// this reason, the CUDA kernels raise it as a device error.
enum class IntegerFault : unsigned char { None, DivisionByZero, NegativeExponent };

/// a op b on int64 operands, for the functions giving the operands' type:
/// wrapping (two's complement) like C++ unsigned arithmetic, Div
/// truncating (INT64_MIN / -1 = INT64_MIN). Division by zero and negative
/// exponents set `fault` and give 0.
template <Binary B> PIPEC_HOST_DEVICE int64_t integerBinaryValue(int64_t a, int64_t b, IntegerFault &fault) {
  const uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  if constexpr (B == Binary::Add) return (int64_t)(ua + ub);
  else if constexpr (B == Binary::Sub) return (int64_t)(ua - ub);
  else if constexpr (B == Binary::Mul) return (int64_t)(ua * ub);
  else if constexpr (B == Binary::Div) {
    if (b == 0) return fault = IntegerFault::DivisionByZero, 0;
    return b == -1 ? (int64_t)(0 - ua) : a / b;
  } else if constexpr (B == Binary::Pow) {
    if (b < 0) return fault = IntegerFault::NegativeExponent, 0;
    // Square-and-multiply: the same product modulo 2^64 as b multiplications.
    uint64_t r = 1, base = ua;
    for (uint64_t e = ub; e; e >>= 1) {
      if (e & 1) r *= base;
      base *= base;
    }
    return (int64_t)r;
  } else if constexpr (B == Binary::Max) return a > b ? a : b;
  else if constexpr (B == Binary::Min) return a < b ? a : b;
  else if constexpr (B == Binary::Mod || B == Binary::FMod) {
    if (b == 0) return fault = IntegerFault::DivisionByZero, 0;
    int64_t r = b == -1 ? 0 : a % b; // INT64_MIN % -1 traps in C
    // Mod takes the sign of the divisor; r and b then differ in sign, so r + b cannot overflow.
    if (B == Binary::Mod && r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
  } else if constexpr (::pipec::givesBool(B)) return (int64_t)binaryValue<B>(a, b);
  else static_assert(BinaryWithoutFormula<B>::value, "a binary function of vocabulary.h has no integer formula here");
}

/// Calls f(std::integral_constant<Binary, op>{}): one switch over the table,
/// so that the loop (or kernel launch) inside f is compiled once per function.
/// Host code.
template <class F> auto dispatchBinary(Binary op, F &&f) {
  switch (op) {
#define PIPEC_CASE(name, spelling, result, operands, flops, gradientFlops)                         \
  case Binary::name:                                                                               \
    return f(std::integral_constant<Binary, Binary::name>{});
    PIPEC_BINARY_FUNCTIONS(PIPEC_CASE)
#undef PIPEC_CASE
  }
  return f(std::integral_constant<Binary, Binary::Add>{}); // not reached: every enumerator has a case
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
  // As PyTorch's maximum and minimum: ties split dy evenly; a NaN operand
  // (no order) passes dy to both.
  else if constexpr (K == BinaryGrad::MaxLhs) return a < b ? 0.0f : (a == b ? 0.5f * g : g);
  else if constexpr (K == BinaryGrad::MaxRhs) return a > b ? 0.0f : (a == b ? 0.5f * g : g);
  else if constexpr (K == BinaryGrad::MinLhs) return a > b ? 0.0f : (a == b ? 0.5f * g : g);
  else if constexpr (K == BinaryGrad::MinRhs) return a < b ? 0.0f : (a == b ? 0.5f * g : g);
  else static_assert(BinaryGradWithoutFormula<K>::value, "a binary gradient has no formula here");
}

/// Calls f(std::integral_constant<BinaryGrad, kind>{}), like dispatchBinary.
template <class F> auto dispatchBinaryGrad(BinaryGrad kind, F &&f) {
  switch (kind) {
#define PIPEC_CASE(name, spelling)                                                                 \
  case BinaryGrad::name:                                                                           \
    return f(std::integral_constant<BinaryGrad, BinaryGrad::name>{});
    PIPEC_BINARY_GRADIENTS(PIPEC_CASE)
#undef PIPEC_CASE
  }
  return f(std::integral_constant<BinaryGrad, BinaryGrad::SubRhs>{}); // not reached
}

} // namespace pipec::kernels
