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

using cuda::segmentBlocks; // pipec/cuda_row_norm.cuh, with the row walks below
using cuda::segmentThreads;

//===----------------------------------------------------------------------===//
// Device: deterministic reductions
//===----------------------------------------------------------------------===//

using cuda::LaneSum;
using cuda::SumOp;
/// The CPU kernels' running maximum `m = v > m ? v : m` (NaN never wins).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

using cuda::blockReduce;
using cuda::warpReduce;

template <class T> __device__ __forceinline__ T blockSum(T v) { return blockReduce(v, SumOp{}); }

//===----------------------------------------------------------------------===//
// Device: segment walks
//===----------------------------------------------------------------------===//

using cuda::BlockLanes;
using cuda::WarpLanes;
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

/// Calls launch(P{}, grid, block) for `rows` contiguous rows of `size`
/// elements, walked as rowLaunch says: WarpLanes or BlockLanes.
template <class Launch> void launchPerRow(int64_t rows, int64_t size, Launch &&launch) {
  const RowLaunch walk = rowLaunch(rows, size);
  if (walk.warpPerRow)
    launch(WarpLanes{}, walk.grid, walk.threads);
  else
    launch(BlockLanes{}, walk.grid, walk.threads);
}

/// Calls launch(P{}, grid, block) with the lanes blockPerSegment chooses:
/// BlockLanes with a block per segment, else ThreadLanes with a thread per
/// segment. `launch` starts the kernel instantiated for P.
template <class Launch> void launchPerSegment(int64_t segments, int64_t size, int64_t inner, Launch &&launch) {
  if (blockPerSegment(segments, inner))
    launch(BlockLanes{}, segmentBlocks(segments), segmentThreads(size));
  else
    launch(ThreadLanes{}, detail::blocksFor(segments), (unsigned)detail::kThreads);
}

} // namespace pipec::kernels::cuda::nn

#endif // PIPEC_CUDA_KERNELS_NN_COMMON_CUH
