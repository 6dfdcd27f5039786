// The rotary embedding's per-element formula (nn.rotary), shared by the CPU
// and CUDA kernels so that both compute the same values.
#pragma once

#include "pipec/unary_math.h" // PIPEC_HOST_DEVICE

#include <stdint.h>

namespace pipec::kernels {

/// Where element j of a last axis of even length `width` finds its partner
/// in the rotation R (the other half, or the other of its pair), and
/// whether it is the first of the two (R negates the partner there).
struct RotaryPartner {
  int64_t offset; // partner index - j
  bool first;
};
PIPEC_HOST_DEVICE RotaryPartner rotaryPartner(int64_t j, int64_t width, bool interleaved) {
  if (interleaved)
    return (j & 1) == 0 ? RotaryPartner{1, true} : RotaryPartner{-1, false};
  const int64_t half = width / 2;
  return j < half ? RotaryPartner{half, true} : RotaryPartner{-half, false};
}

/// One output element: x·cos + R(x)·sin, or (transposed) x·cos + Rᵀ(x·sin),
/// from x and its partner xp, cos and sin at the element (c, s) and sin at
/// the partner (sp).
PIPEC_HOST_DEVICE float rotaryValue(float x, float xp, float c, float s, float sp, bool first, bool transposed) {
  if (transposed) return first ? x * c + xp * sp : x * c - xp * sp;
  return first ? x * c - xp * s : x * c + xp * s;
}

} // namespace pipec::kernels
