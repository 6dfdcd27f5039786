// The row normalizations' device code (nn.layer_norm, centered or RMS, and
// its input gradient), shared by the kernel library (norm.cu) and the
// kernels generated for a pipe.fused loop that runs inside a norm's kernel
// (docs/cuda-codegen.md, "Norms with their element-wise loops"): one body,
// so that the joined kernel gives the library's bits. Also the lane groups
// a row is walked by and their fixed-order reductions, which every kernel of
// the library that reduces a segment uses (nn_common.cuh).
#ifndef PIPEC_CUDA_ROW_NORM_CUH
#define PIPEC_CUDA_ROW_NORM_CUH

#include "pipec/cuda_kernels.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

// `#pragma unroll` for device code only (host compilers warn about it).
#ifdef __CUDA_ARCH__
#define PIPEC_UNROLL _Pragma("unroll")
#else
#define PIPEC_UNROLL
#endif

namespace pipec::kernels::cuda {

/// Storage to float32 and back: kernels templated on the storage type
/// (float, or bf16 for --precision bf16 stages: docs/cuda-kernels.md) load
/// with toF and store with fromF, so one body serves both and the float
/// instantiation keeps its bits (both are the identity on float).
template <class T> __host__ __device__ __forceinline__ float toF(T v) { return static_cast<float>(v); }
template <class T> __host__ __device__ __forceinline__ T fromF(float v) { return T(v); }

/// Elements of T in one 16-byte load or store (Packed<T, kPackOf<T>>): the
/// width every kernel that moves whole aligned pieces uses.
template <class T> constexpr int kPackOf = 16 / sizeof(T);

/// Grid of a block-per-segment launch (grid-stride loops cover the rest).
constexpr unsigned segmentBlocks(int64_t segments) {
  constexpr int64_t kMax = 1 << 20;
  return (unsigned)(segments < 1 ? 1 : segments < kMax ? segments : kMax);
}
/// Threads of a block-per-segment launch for segments of `size` elements: a
/// power of two in [32, 512].
constexpr unsigned segmentThreads(int64_t size) {
  unsigned t = 32;
  while ((int64_t)t < size && t < 512) t *= 2;
  return t;
}

/// How `rows` contiguous rows of `inner` elements are walked: a warp per
/// row (8 rows a block) for rows up to kWarpRowMaxElements, else a block
/// per row (a constant expression: generated code instantiates its kernel
/// for the one lane group its static shape takes). Rows of at most this many elements take a warp each: 24
/// elements a lane for GPT-2's 768-wide LayerNorm, where a block per row
/// spent its time in two block-wide reductions per row.
constexpr int64_t kWarpRowMaxElements = 4096;
struct RowLaunch {
  bool warpPerRow;
  unsigned grid, threads;
};
constexpr RowLaunch rowLaunch(int64_t rows, int64_t inner) {
  constexpr int64_t kRowsPerBlock = 8;
  if (inner <= kWarpRowMaxElements)
    return {true, segmentBlocks((rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(32 * kRowsPerBlock)};
  return {false, segmentBlocks(rows), segmentThreads(inner)};
}

#if defined(__CUDACC__) || defined(PIPEC_CUDA_EMULATION)

struct SumOp {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
/// What one lane sums its own terms in before the lanes' sums are added in
/// double: double for float storage (the CPU kernels' double sums), float
/// for bf16, whose results are rounded to 8 bits. A conversion to double and
/// a double operation per element (H100/H200: 16 conversions per clock per
/// SM) kept the bf16 cross-entropy at about half its bytes' time
/// (docs/cuda-kernels.md).
template <class T> using LaneSum = std::conditional_t<std::is_same_v<T, bf16>, float, double>;

/// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) in a
/// fixed order; every thread gets the result. Every thread of the block must
/// call it (it synchronizes).
template <class T, class Op> __device__ T blockReduce(T v, Op op) {
  __shared__ T partial[32];
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); // the previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    v = partial[lane < warps ? lane : 0];
    for (int offset = 16; offset > 0; offset >>= 1) {
      const T other = __shfl_down_sync(0xffffffffu, v, offset);
      if (lane + offset < warps) v = op(v, other);
    }
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  return partial[0];
}

/// Reduces v over the warp in a fixed order (down the lanes, then lane 0's
/// result to every lane). Every lane of the warp must call it.
template <class T, class Op> __device__ T warpReduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) + offset < 32) v = op(v, other);
  }
  return __shfl_sync(0xffffffffu, v, 0);
}

/// One block per segment: lanes are the block's threads; reductions are
/// block-wide (every thread of a block walks the same segments).
struct BlockLanes {
  __device__ static int64_t first() { return blockIdx.x; }
  __device__ static int64_t step() { return gridDim.x; }
  __device__ static int64_t lane() { return threadIdx.x; }
  __device__ static int64_t lanes() { return blockDim.x; }
  __device__ static bool leader() { return threadIdx.x == 0; }
  template <class T, class Op> __device__ static T reduce(T v, Op op) { return blockReduce(v, op); }
  /// Barrier over the segment's lanes (every lane must call it); what a
  /// lane wrote before it, the others read after it.
  __device__ static void sync() { __syncthreads(); }
};
/// One warp per segment (rows short enough that 32 lanes cover them; no
/// block-wide barrier per reduction): reductions are warp-wide. Launched
/// with blockDim.x a multiple of 32.
struct WarpLanes {
  __device__ static int64_t first() { return (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; }
  __device__ static int64_t step() { return ((int64_t)gridDim.x * blockDim.x) >> 5; }
  __device__ static int64_t lane() { return threadIdx.x & 31; }
  __device__ static int64_t lanes() { return 32; }
  __device__ static bool leader() { return (threadIdx.x & 31) == 0; }
  template <class T, class Op> __device__ static T reduce(T v, Op op) { return warpReduce(v, op); }
  __device__ static void sync() { __syncwarp(); }
};

/// Pack j of a row as floats.
template <int V, class T> __device__ __forceinline__ void loadWide(const T *row, int64_t j, float (&f)[V]) {
  const Packed<T, V> p = loadPacked<V>(row + j * V);
PIPEC_UNROLL
  for (int e = 0; e < V; ++e) f[e] = toF(p.v[e]);
}

// The row functions below are collective over P's lanes: every lane of the
// row's group calls them. They move V elements at a time: V = kPackOf<T>
// (16-byte loads and stores) when the row's length is a multiple of it and
// every pointer is aligned, else 1. A 2-byte load a lane kept GPT-2's bf16
// norms near 1 TB/s on an H200 (docs/gpu-runs.md); the math per element is
// the same at either width.

/// Mean (0 under RowNorm::Rms) and 1/sqrt(var + eps) of one row, as the
/// CPU's rowStats: the squares are float (x - (float)mean)², sums in double
/// (each lane's own terms in LaneSum<T>).
template <class P, int V, class T>
__device__ void rowStats(const T *x, int64_t inner, float epsilon, RowNorm norm, double &mean, double &invStd) {
  const int64_t packs = inner / V;
  mean = 0;
  if (norm == RowNorm::Layer) {
    LaneSum<T> sum = 0;
    for (int64_t j = P::lane(); j < packs; j += P::lanes()) {
      float f[V];
      loadWide<V>(x, j, f);
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) sum += f[e];
    }
    mean = P::reduce((double)sum, SumOp{}) / (double)inner;
  }
  const float fm = (float)mean;
  LaneSum<T> sq = 0;
  for (int64_t j = P::lane(); j < packs; j += P::lanes()) {
    float f[V];
    loadWide<V>(x, j, f);
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) {
      const float d = f[e] - fm;
      sq += d * d;
    }
  }
  invStd = 1.0 / sqrt(P::reduce((double)sq, SumOp{}) / (double)inner + (double)epsilon);
}

/// nn.layer_norm of row r (xr, yr: its first element): y = (x - mean) ·
/// invStd · g (+ b), g and b of `inner` elements (b may be null); mean[r]
/// and invStd[r] written where not null.
template <class P, int V, class T>
__device__ void layerNormRow(const T *xr, int64_t inner, const float *g, const float *b, T *yr, int64_t r,
                             float *mean, float *invStd, float epsilon, RowNorm norm) {
  const int64_t packs = inner / V;
  double m, inv;
  rowStats<P, V>(xr, inner, epsilon, norm, m, inv);
  if (P::leader()) {
    if (mean) mean[r] = (float)m;
    if (invStd) invStd[r] = (float)inv;
  }
  const float fm = (float)m, fi = (float)inv;
  for (int64_t j = P::lane(); j < packs; j += P::lanes()) {
    float f[V], gs[V], bs[V] = {};
    loadWide<V>(xr, j, f);
    loadWide<V>(g, j, gs);
    if (b) loadWide<V>(b, j, bs);
    Packed<T, V> out;
PIPEC_UNROLL
    for (int e = 0; e < V; ++e)
      out.v[e] = fromF<T>(b ? (f[e] - fm) * fi * gs[e] + bs[e] : (f[e] - fm) * fi * gs[e]);
    storePacked(yr + j * V, out);
  }
}

/// nn.layer_norm_grad's dx of one row, handed pack by pack to
/// `store(j, dx)` (pack j of the row: elements j·V to j·V + V - 1, as
/// floats before rounding to the storage): the library stores them, a
/// joined kernel runs its element-wise loop on them.
template <class P, int V, class T, class Store>
__device__ void layerNormGradRow(const T *dyr, const T *xr, int64_t inner, const float *g, float epsilon,
                                 RowNorm norm, Store &&store) {
  const int64_t packs = inner / V;
  double m, inv;
  rowStats<P, V>(xr, inner, epsilon, norm, m, inv);
  const float fm = (float)m, fi = (float)inv;
  LaneSum<T> laneG = 0, laneGX = 0;
  for (int64_t j = P::lane(); j < packs; j += P::lanes()) {
    float f[V], d[V], gs[V];
    loadWide<V>(xr, j, f);
    loadWide<V>(dyr, j, d);
    loadWide<V>(g, j, gs);
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) {
      if (norm == RowNorm::Layer) laneG += d[e] * gs[e];
      laneGX += d[e] * gs[e] * ((f[e] - fm) * fi);
    }
  }
  const double sumG = P::reduce((double)laneG, SumOp{}), sumGX = P::reduce((double)laneGX, SumOp{});
  const float mG = (float)(sumG / (double)inner), mGX = (float)(sumGX / (double)inner);
  for (int64_t j = P::lane(); j < packs; j += P::lanes()) {
    float f[V], d[V], gs[V], dx[V];
    loadWide<V>(xr, j, f);
    loadWide<V>(dyr, j, d);
    loadWide<V>(g, j, gs);
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) {
      const float xhat = (f[e] - fm) * fi;
      // Rounded as a store would round it: a joined loop's add must not
      // contract with this product into one fused multiply-add.
      dx[e] = __fmul_rn(fi, d[e] * gs[e] - mG - xhat * mGX);
    }
    store(j, dx);
  }
}

#endif // __CUDACC__ || PIPEC_CUDA_EMULATION

} // namespace pipec::kernels::cuda

#endif // PIPEC_CUDA_ROW_NORM_CUH
