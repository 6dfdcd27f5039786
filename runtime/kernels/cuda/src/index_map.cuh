// Index arithmetic shared by all the kernels (included directly by
// context.cu, elementwise.cu, movement.cu, reduce.cu and optim.cu, through
// nn_common.cuh by the others): host-side shape checks mirroring the CPU
// library's (runtime/kernels/src/detail.h), grid-stride indices, and
// IndexMap, which maps the flat row-major index of an output to offsets
// into N operands through per-axis strides (0 on broadcast axes).
#ifndef PIPEC_CUDA_KERNELS_INDEX_MAP_CUH
#define PIPEC_CUDA_KERNELS_INDEX_MAP_CUH

#include "detail.cuh"

#include <array>
#include <string>

namespace pipec::kernels::cuda::detail {

using Strides = std::array<int64_t, kMaxRank>;

using kernels::checkRank;
using kernels::normalizeAxis;

/// Row-major strides.
inline Strides stridesOf(const Shape &s) {
  Strides st{};
  int64_t acc = 1;
  for (int i = s.size - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s.v[i];
  }
  return st;
}

inline int64_t productOf(const Shape &s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= s.v[i];
  return n;
}

/// Broadcast strides of `in` (right-aligned) against the output shape `out`:
/// 0 along axes where `in` has size 1 or is missing.
inline Strides broadcastStrides(const Shape &in, const Shape &out) {
  Strides st{};
  const Strides own = stridesOf(in);
  const int lead = out.size - in.size;
  for (int i = 0; i < out.size; ++i) {
    if (i < lead) continue;
    st[i] = in.v[i - lead] == 1 ? 0 : own[i - lead];
  }
  return st;
}

using kernels::broadcastsTo; // pipec/kernel_types.h, shared with the CPU library

/// The flat row-major index i of a tensor of shape `dims` seen as offsets
/// sum_a idx[a] * st[k][a] into N operands. Passed to kernels by value.
/// Built by makeIndexMap, which drops size-1 axes and merges adjacent axes
/// that every operand walks contiguously, so that the common cases (same
/// shapes, a trailing bias) cost at most one division per element.
template <int N> struct IndexMap {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t st[N][kMaxRank] = {};

  /// Requires 0 <= i < the product of dims.
  __host__ __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[N]) const {
PIPEC_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
    // Fully unrolled so that every index into the (kernel parameter) arrays
    // is a constant.
PIPEC_UNROLL
    for (int a = kMaxRank - 1; a > 0; --a) {
      if (a < rank) {
        const int64_t q = i / dims[a], r = i - q * dims[a];
        i = q;
PIPEC_UNROLL
        for (int k = 0; k < N; ++k) off[k] += r * st[k][a];
      }
    }
    if (rank > 0) {
PIPEC_UNROLL
      for (int k = 0; k < N; ++k) off[k] += i * st[k][0];
    }
  }
};

template <int N>
IndexMap<N> makeIndexMap(const Shape &dims, const std::array<Strides, N> &strides) {
  IndexMap<N> m;
  // Walk from the innermost axis outwards, appending to the map in reverse.
  int64_t rdims[kMaxRank];
  int64_t rst[N][kMaxRank];
  int count = 0;
  for (int a = dims.size - 1; a >= 0; --a) {
    if (dims.v[a] == 1) continue;
    if (count > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (strides[k][a] != rst[k][count - 1] * rdims[count - 1]) merge = false;
      if (merge) {
        rdims[count - 1] *= dims.v[a];
        continue;
      }
    }
    rdims[count] = dims.v[a];
    for (int k = 0; k < N; ++k) rst[k][count] = strides[k][a];
    ++count;
  }
  m.rank = count;
  for (int j = 0; j < count; ++j) {
    m.dims[j] = rdims[count - 1 - j];
    for (int k = 0; k < N; ++k) m.st[k][j] = rst[k][count - 1 - j];
  }
  return m;
}

using cuda::fromF; // storage to float32 and back: pipec/cuda_row_norm.cuh
using cuda::toF;

__device__ __forceinline__ int64_t firstIndex() {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridStride() { return (int64_t)gridDim.x * blockDim.x; }

} // namespace pipec::kernels::cuda::detail

#endif // PIPEC_CUDA_KERNELS_INDEX_MAP_CUH
