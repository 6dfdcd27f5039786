// The channels-last data the emulated tests of the NHWC kernels share
// (docs/cuda-kernels.md, "Channels last"): a channels-first shape's
// channels-last twin, values moved between the two layouts, and the strides
// cuDNN is given for either.
#pragma once
#include "pipec/cuda_kernels.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace emulayout {

using Shape = pipec::kernels::Shape;

/// [N, C, d...] -> [N, d..., C].
inline Shape channelsLastShape(const Shape &first) {
  Shape s;
  s.push(first.v[0]);
  for (int i = 2; i < first.size; ++i) s.push(first.v[i]);
  s.push(first.v[1]);
  return s;
}

/// The values of a tensor of channels-first shape `first` moved to
/// channels-last (toLast) or back.
template <class V> std::vector<V> moveChannels(const std::vector<V> &v, const Shape &first, bool toLast) {
  const int64_t B = first.v[0], C = first.v[1], Pn = B * C ? first.numel() / (B * C) : 0;
  std::vector<V> out(v.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < Pn; ++p) {
        const size_t f = (size_t)((b * C + c) * Pn + p), l = (size_t)((b * Pn + p) * C + c);
        if (toLast)
          out[l] = v[f];
        else
          out[f] = v[l];
      }
  return out;
}

/// The strides of logical dims [N, C, d...] channels-last or row-major.
inline std::vector<int64_t> stridesOf(const std::vector<int64_t> &dims, bool channelsLast) {
  std::vector<int64_t> s(dims.size(), 1);
  if (!channelsLast) {
    for (int i = (int)dims.size() - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
    return s;
  }
  int64_t step = dims[1];
  for (int i = (int)dims.size() - 1; i >= 2; --i) s[i] = step, step *= dims[i];
  s[0] = step;
  return s;
}

} // namespace emulayout
