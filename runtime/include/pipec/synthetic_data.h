// The values of piperun's synthetic data set (docs/dataset-format.md,
// "Synthetic default"), one definition for the host generator
// (io::SyntheticData, pipec/dataset.h) and the CUDA kernel that writes a
// micro-batch straight into device memory (pipec::kernels::cuda::
// syntheticData, pipec/cuda_kernels.h), so that both write the same bits.
// No allocation, no library calls but floor: device code includes it.
#pragma once

#include "pipec/host_device.h"
#include "pipec/stage_abi.h" // PIPEC_F32 ...

#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace pipec::io {

// splitmix64's finalizer: the data set's (and TokenFile's) counter-based hash.
PIPEC_HOST_DEVICE uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// What the values of one field depend on besides the sample and element
// indices. The hash of (seed, field) and high - low are computed once per
// field, the sample's hash once per sample, outside the element loop: on an
// H200, generating a micro-batch of 4,096 x 1,024 floats element by element
// took longer than its forward and backward pass (docs/gpu-runs.md).
struct SyntheticField {
  uint64_t key = 0;           // syntheticFieldKey(seed, field index)
  uint64_t samples = 1;       // of the data set: sample indices wrap modulo it
  int64_t sampleElements = 0; // elements of one sample
  int dtype = PIPEC_F32;      // f32 f64 i64 i32 bool
  double low = 0, span = 1;   // values in [low, low + span)
};

PIPEC_HOST_DEVICE uint64_t syntheticFieldKey(uint64_t seed, uint64_t field) {
  return mix64(seed ^ (field * 0x1000193ULL));
}

// The key of sample `sample` (any index: it wraps here).
PIPEC_HOST_DEVICE uint64_t syntheticSampleKey(const SyntheticField &f, uint64_t sample) {
  return mix64(f.key ^ (sample % f.samples));
}

// Element e's value in [0, 1): 53 hashed bits, exact in a double.
PIPEC_HOST_DEVICE double syntheticUniform(uint64_t sampleKey, int64_t e) {
  return (double)(mix64(sampleKey ^ (uint64_t)e) >> 11) * (1.0 / 9007199254740992.0);
}

// Element e of the sample of key `sampleKey`, as T (float, double, int64_t,
// int32_t or uint8_t for the dtypes above): low + u * span, rounded to
// float or floored to an integer; a bool is u >= 0.5.
template <class T> PIPEC_HOST_DEVICE T syntheticValue(const SyntheticField &f, uint64_t sampleKey, int64_t e) {
  const double u = syntheticUniform(sampleKey, e);
  if constexpr (sizeof(T) == 1) {
    return (T)(u < 0.5 ? 0 : 1);
  } else {
#ifdef __CUDA_ARCH__
    // Two roundings, as on the host: nvcc would fuse a multiply-add.
    const double v = __dadd_rn(f.low, __dmul_rn(u, f.span));
#else
    const double v = f.low + u * f.span;
#endif
    if constexpr (std::is_floating_point_v<T>)
      return (T)v;
    else
      return (T)floor(v);
  }
}

// Calls f(T{}) with T the C++ type of `dtype`'s elements (float, double,
// int64_t, int32_t; uint8_t for bool): the host generator's and the
// kernel's one dispatch. False, without a call, for any other dtype.
template <class F> bool withSyntheticType(int dtype, F &&f) {
  switch (dtype) {
  case PIPEC_F32: f(float{}); return true;
  case PIPEC_F64: f(double{}); return true;
  case PIPEC_I64: f(int64_t{}); return true;
  case PIPEC_I32: f(int32_t{}); return true;
  case PIPEC_BOOL: f(uint8_t{}); return true;
  }
  return false;
}

} // namespace pipec::io
