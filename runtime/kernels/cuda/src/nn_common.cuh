// Helpers shared by the linear-algebra, convolution, normalization, pooling
// and softmax kernels (linalg.cu, conv.cu, norm.cu, pool.cu, softmax.cu):
// host-side shape checks mirroring the CPU library's
// (runtime/kernels/src/detail.h), deterministic block reductions, and the
// two ways a kernel walks "segments" (a row of classes, a normalized row):
// one block per segment or one thread per segment.
#ifndef PIPEC_CUDA_KERNELS_NN_COMMON_CUH
#define PIPEC_CUDA_KERNELS_NN_COMMON_CUH

#include "detail.cuh"

#include <string>

namespace pipec::kernels::cuda::nn {

using detail::fail;

//===----------------------------------------------------------------------===//
// Host-side checks (as runtime/kernels/src/detail.h)
//===----------------------------------------------------------------------===//

inline void checkRank(const char *op, const Shape &s, int atLeast, const char *what) {
  if (s.size < atLeast || s.size > kMaxRank)
    fail(op, std::string(what) + " " + s.str() + " needs rank in [" + std::to_string(atLeast) + ", " +
                 std::to_string(kMaxRank) + "]");
  for (int i = 0; i < s.size; ++i)
    if (s.v[i] < 0) fail(op, std::string(what) + " " + s.str() + " has a negative dimension");
}

inline int64_t normalizeAxis(const char *op, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    fail(op, "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

inline int64_t productOf(const Shape &s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= s.v[i];
  return n;
}

/// Does `in` broadcast to exactly `out`?
inline bool broadcastsTo(const Shape &in, const Shape &out) {
  if (in.size > out.size) return false;
  const int lead = out.size - in.size;
  for (int i = 0; i < in.size; ++i)
    if (in.v[i] != 1 && in.v[i] != out.v[i + lead]) return false;
  return true;
}

/// Stream-ordered scratch memory for one kernel call; nothing allocated
/// (a null pointer) for 0 bytes.
class Buffer {
public:
  explicit Buffer(size_t bytes) : p_(bytes ? deviceAllocate(bytes) : nullptr) {}
  ~Buffer() {
    if (p_) deviceFree(p_);
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
  template <class T> T *as() const { return static_cast<T *>(p_); }

private:
  void *p_;
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

__device__ __forceinline__ int64_t globalThread() {
  return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t globalThreads() { return (int64_t)gridDim.x * blockDim.x; }

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
};
/// One thread per segment: a single lane, reductions are the identity.
struct ThreadLanes {
  __device__ static int64_t first() { return globalThread(); }
  __device__ static int64_t step() { return globalThreads(); }
  __device__ static int64_t lane() { return 0; }
  __device__ static int64_t lanes() { return 1; }
  __device__ static bool leader() { return true; }
  template <class T, class Op> __device__ static T reduce(T v, Op) { return v; }
};

/// Segments of `size` elements `stride` apart (the [outer, size, inner] view
/// of a shape has outer * inner segments, stride inner): one block per
/// segment when the segments are contiguous rows or too few to fill the
/// device, else one thread per segment (neighbouring threads then read
/// neighbouring addresses).
inline bool blockPerSegment(int64_t segments, int64_t inner) { return inner == 1 || segments < 2048; }

} // namespace pipec::kernels::cuda::nn

#endif // PIPEC_CUDA_KERNELS_NN_COMMON_CUH
