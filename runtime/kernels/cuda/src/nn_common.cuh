// Helpers shared by the linear-algebra, convolution, normalization, pooling
// and softmax kernels (linalg.cu, conv.cu, norm.cu, pool.cu, softmax.cu):
// stream-ordered scratch buffers, deterministic block reductions, and the
// two ways a kernel walks "segments" (a row of classes, a normalized row):
// one block per segment or one thread per segment. The host-side shape
// checks and the grid-stride indices are index_map.cuh's.
#ifndef PIPEC_CUDA_KERNELS_NN_COMMON_CUH
#define PIPEC_CUDA_KERNELS_NN_COMMON_CUH

#include "detail.cuh"
#include "index_map.cuh"

namespace pipec::kernels::cuda::nn {

using detail::broadcastsTo;
using detail::checkRank;
using detail::fail;
using detail::firstIndex;
using detail::gridStride;
using detail::normalizeAxis;
using detail::productOf;
using detail::fromF;
using detail::kPackOf;
using detail::toF;

/// One kernel call's scratch (pipec/kernel_scratch.h): the caller's
/// Workspace (device memory in the stage's arena) when it bound one, else
/// this thread's growable device buffer (detail::scratch slot 0: grown once,
/// then reused). Buffers are taken in the order the call's ScratchNeed lists
/// them; a buffer of no elements is a null pointer.
class Scratch {
public:
  Scratch(const char *op, const Workspace &ws, const ScratchNeed &need) {
    if (ws.bound()) {
      if (ws.sharedBytes < need.shared)
        fail(op, "the workspace holds " + std::to_string(ws.sharedBytes) + " bytes, the call needs " +
                     std::to_string(need.shared));
      next_ = static_cast<char *>(ws.shared);
    } else if (need.shared > 0) {
      next_ = static_cast<char *>(detail::scratch(0, (size_t)need.shared));
    }
  }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  template <class T> T *shared(int64_t count) {
    if (count <= 0) return nullptr;
    char *p = next_;
    next_ += ScratchNeed::alignedScratchBytes(count * (int64_t)sizeof(T));
    return reinterpret_cast<T *>(p);
  }

private:
  char *next_ = nullptr;
};

/// A shape seen around one axis: [outer, size, inner].
struct AxisView {
  int64_t outer, size, inner;
};
inline AxisView viewAround(const Shape &s, int axis) {
  return {productOf(s, 0, axis), s.v[axis], productOf(s, axis + 1, s.size)};
}

/// Grid of a block-per-segment launch (grid-stride loops cover the rest).
inline unsigned segmentBlocks(int64_t segments) {
  constexpr int64_t kMax = 1 << 20;
  return (unsigned)(segments < 1 ? 1 : segments < kMax ? segments : kMax);
}
/// Threads of a block-per-segment launch for segments of `size` elements: a
/// power of two in [32, 512].
inline unsigned segmentThreads(int64_t size) {
  unsigned t = 32;
  while ((int64_t)t < size && t < 512) t *= 2;
  return t;
}

//===----------------------------------------------------------------------===//
// Device: deterministic reductions
//===----------------------------------------------------------------------===//

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
/// The CPU kernels' running maximum `m = v > m ? v : m` (NaN never wins).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

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

template <class T> __device__ __forceinline__ T blockSum(T v) { return blockReduce(v, SumOp{}); }

/// Reduces v over the warp in a fixed order (down the lanes, then lane 0's
/// result to every lane). Every lane of the warp must call it.
template <class T, class Op> __device__ T warpReduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) + offset < 32) v = op(v, other);
  }
  return __shfl_sync(0xffffffffu, v, 0);
}

//===----------------------------------------------------------------------===//
// Device: segment walks
//===----------------------------------------------------------------------===//

/// One block per segment: lanes are the block's threads; reductions are
/// block-wide (every thread of a block walks the same segments).
struct BlockLanes {
  __device__ static int64_t first() { return blockIdx.x; }
  __device__ static int64_t step() { return gridDim.x; }
  __device__ static int64_t lane() { return threadIdx.x; }
  __device__ static int64_t lanes() { return blockDim.x; }
  __device__ static bool leader() { return threadIdx.x == 0; }
  template <class T, class Op> __device__ static T reduce(T v, Op op) { return blockReduce(v, op); }
  /// Barrier over the segment's lanes (every lane must call it).
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
};
/// One thread per segment: a single lane, reductions are the identity.
struct ThreadLanes {
  __device__ static int64_t first() { return firstIndex(); }
  __device__ static int64_t step() { return gridStride(); }
  __device__ static int64_t lane() { return 0; }
  __device__ static int64_t lanes() { return 1; }
  __device__ static bool leader() { return true; }
  template <class T, class Op> __device__ static T reduce(T v, Op) { return v; }
  __device__ static void sync() {}
};

/// Segments of `size` elements `stride` apart (the [outer, size, inner] view
/// of a shape has outer * inner segments, stride inner): one block per
/// segment when the segments are contiguous rows or too few to fill the
/// device, else one thread per segment (neighbouring threads then read
/// neighbouring addresses).
inline bool blockPerSegment(int64_t segments, int64_t inner) { return inner == 1 || segments < 2048; }

/// Calls launch(P{}, grid, block) with the lanes blockPerSegment chooses:
/// BlockLanes with a block per segment, else ThreadLanes with a thread per
/// segment. `launch` starts the kernel instantiated for P.
/// Rows of at most this many elements take a warp each (launchPerRow): 24
/// elements a lane for GPT-2's 768-wide LayerNorm, where a block per row
/// spent its time in two block-wide reductions per row.
constexpr int64_t kWarpRowMaxElements = 4096;

/// Calls launch(P{}, grid, block) for `rows` contiguous rows of `size`
/// elements: WarpLanes (8 rows a block) for rows up to kWarpRowMaxElements,
/// else BlockLanes.
template <class Launch> void launchPerRow(int64_t rows, int64_t size, Launch &&launch) {
  if (size <= kWarpRowMaxElements) {
    constexpr int64_t kRowsPerBlock = 8;
    launch(WarpLanes{}, segmentBlocks((rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(32 * kRowsPerBlock));
  } else {
    launch(BlockLanes{}, segmentBlocks(rows), segmentThreads(size));
  }
}

template <class Launch> void launchPerSegment(int64_t segments, int64_t size, int64_t inner, Launch &&launch) {
  if (blockPerSegment(segments, inner))
    launch(BlockLanes{}, segmentBlocks(segments), segmentThreads(size));
  else
    launch(ThreadLanes{}, detail::blocksFor(segments), (unsigned)detail::kThreads);
}

} // namespace pipec::kernels::cuda::nn

#endif // PIPEC_CUDA_KERNELS_NN_COMMON_CUH
