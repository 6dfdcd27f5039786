// Host stand-in for CUDA's cuda_bf16.h (host emulation of pipec's CUDA
// kernels): __nv_bfloat16 as 16 bits of storage with the conversions the
// kernels use, bf16(float) rounding to nearest even (NaN stays a quiet NaN,
// overflow goes to infinity) and float(x) exact, as the real type's
// __float2bfloat16 / __bfloat162float. Deliberately no arithmetic
// operators: the kernels widen to float explicitly (the real type has
// operators and integer conversions, which make mixed expressions
// ambiguous).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(round(f)) {}
  operator float() const {
    const uint32_t u = (uint32_t)__x << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  static unsigned short round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u); // NaN: keep it, quiet
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable_v<__nv_bfloat16>,
              "bf16 is two bytes of storage");
