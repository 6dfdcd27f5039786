// Reductions (nn.reduce_sum, nn.reduce_mean): deterministic, without
// atomics, accumulating in double like the CPU kernels
// (runtime/kernels/src/reduce.cpp).
//
// Four schedules, chosen from the shapes alone (so a given call always
// rounds the same way):
// - one thread per output element, summing its inputs in row-major order:
//   the CPU kernel's order exactly, hence the same float result; used when
//   there are enough outputs to fill the GPU and the reduced axes are not
//   innermost (reads coalesce across neighbouring outputs);
// - one block per 8 neighbouring outputs, each output's inputs split
//   over kColumnGroups threads and their partial sums added in a fixed
//   order: used when the reduced axes are not innermost but the outputs are
//   too few to fill the GPU, such as a bias gradient (the sum over 4,096
//   token rows of [4096, 3072] took 0.55 ms on an H200 with one thread per
//   output; docs/cuda-kernels.md);
// - when those outputs are a contiguous suffix of x's axes and the reduced
//   axes the prefix before it (x is [rows, outputs]: every bias gradient),
//   chunks of rows: a block sums one chunk of rows for 32 neighbouring
//   columns (a warp reads 32 neighbours of one row, whole memory sectors)
//   into the library's scratch, and a second kernel adds the chunks in
//   order. The per-columns schedule reads 8 neighbours of 4 rows per warp
//   access and gives a bias gradient of [16384, 768..3072] bf16 96-384
//   blocks: about 0.1 ms more per call than its GEMM on the 2026-11-28 H200
//   (docs/gpu-runs.md);
// - one block per output element with a fixed tree reduction: used when
//   the reduced axes include the innermost one and the reductions are long.
// The last three sum in double in another order than the CPU, which may
// differ in the last bits of the double and almost never changes the float
// result. The kernels are templated on the input's storage (float, or bf16
// summed into float: bias gradients of bf16 stages, docs/cuda-kernels.md).
#include "detail.cuh"
#include "index_map.cuh"

#include <type_traits>

namespace pipec::kernels::cuda {

using namespace detail;

namespace {

/// The sum of the `count` elements x[base + offset of j] in row-major order
/// of the reduced axes (the CPU kernel's order), in double.
template <class T>
__host__ __device__ inline double sumInOrder(const T *x, int64_t base, const IndexMap<1> &reduced,
                                             int64_t count) {
  const int rank = reduced.rank;
  const int64_t inner = rank ? reduced.dims[rank - 1] : 1, innerSt = rank ? reduced.st[0][rank - 1] : 0;
  int64_t off = base;
  int64_t idx[kMaxRank] = {};
  double acc = 0;
  for (int64_t done = 0; done < count; done += inner) {
    for (int64_t j = 0; j < inner; ++j) acc += toF(x[off + j * innerSt]);
    for (int a = rank - 2; a >= 0; --a) {
      off += reduced.st[0][a];
      if (++idx[a] < reduced.dims[a]) break;
      off -= reduced.st[0][a] * reduced.dims[a];
      idx[a] = 0;
    }
  }
  return acc;
}

/// Output i's sum (rounded to float) written, or added into y[i] (a
/// parameter's gradient buffer: the bits of a separate sum and accumulate).
__device__ inline void store(float *y, int64_t i, float v, bool accumulate) { y[i] = accumulate ? y[i] + v : v; }

/// y[i] = (float)(scale ? sum * k : sum), the sum over the reduced axes of
/// output i in row-major order.
template <class T>
__global__ void reduceThreadKernel(const T *x, float *y, int64_t outN, int64_t count, IndexMap<1> kept,
                                   IndexMap<1> reduced, bool scale, double k, bool accumulate) {
  for (int64_t i = firstIndex(); i < outN; i += gridStride()) {
    int64_t base[1];
    kept.offsets(i, base);
    const double acc = sumInOrder(x, base[0], reduced, count);
    store(y, i, (float)(scale ? acc * k : acc), accumulate);
  }
}

constexpr int kReduceBlock = 256;

template <class T>
__global__ void __launch_bounds__(kReduceBlock)
    reduceBlockKernel(const T *x, float *y, int64_t outN, int64_t count, IndexMap<1> kept, IndexMap<1> reduced,
                      bool scale, double k, bool accumulate) {
  __shared__ double partial[kReduceBlock];
  for (int64_t i = blockIdx.x; i < outN; i += gridDim.x) {
    int64_t base[1];
    kept.offsets(i, base);
    double acc = 0;
    for (int64_t j = threadIdx.x; j < count; j += kReduceBlock) {
      int64_t off[1];
      reduced.offsets(j, off);
      acc += toF(x[base[0] + off[0]]);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int width = kReduceBlock / 2; width > 0; width /= 2) {
      if ((int)threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const double sum = partial[0];
      store(y, i, (float)(scale ? sum * k : sum), accumulate);
    }
    __syncthreads(); // partial[0] is read before the next output reuses the buffer
  }
}

// Neighbouring outputs of one block: 8 floats are one 32-byte memory sector,
// so a warp's reads stay sector-efficient while a [4096, 768] bias gradient
// still gets 96 blocks (32 outputs per block gave 24 and was slower than
// one block per output; docs/gpu-runs.md).
constexpr int kColumnLanes = 8;
constexpr int kColumnGroups = 64; // threads that share one output's inputs
constexpr int kColumnBlock = kColumnLanes * kColumnGroups;

/// Output i = first + lane of the block's kColumnLanes outputs: thread
/// (group, lane) sums inputs j = group, group + kColumnGroups, ... in double;
/// the group's partial sums are then added in group order.
template <class T>
__global__ void __launch_bounds__(kColumnBlock)
    reduceColumnsKernel(const T *x, float *y, int64_t outN, int64_t count, IndexMap<1> kept,
                        IndexMap<1> reduced, bool scale, double k, bool accumulate) {
  __shared__ double partial[kColumnBlock];
  const int lane = (int)threadIdx.x % kColumnLanes, group = (int)threadIdx.x / kColumnLanes;
  for (int64_t first = (int64_t)blockIdx.x * kColumnLanes; first < outN; first += (int64_t)gridDim.x * kColumnLanes) {
    const int64_t i = first + lane;
    double acc = 0;
    if (i < outN) {
      int64_t base[1];
      kept.offsets(i, base);
      for (int64_t j = group; j < count; j += kColumnGroups) {
        int64_t off[1];
        reduced.offsets(j, off);
        acc += toF(x[base[0] + off[0]]);
      }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (group == 0 && i < outN) {
      double sum = 0;
      for (int g = 0; g < kColumnGroups; ++g) sum += partial[g * kColumnLanes + lane];
      store(y, i, (float)(scale ? sum * k : sum), accumulate);
    }
    __syncthreads(); // partial is read before the next outputs reuse it
  }
}

// Row chunks: a block is kRowChunkLanes neighbouring columns (a warp's lanes)
// by kRowChunkWarps warps, which take the chunk's rows in turn.
constexpr int kRowChunkLanes = 32;
constexpr int kRowChunkWarps = 8;
/// Blocks the chunks aim at (an H100/H200 has 132 multiprocessors, 8 such
/// blocks each at most), and the fewest rows worth a chunk.
constexpr int64_t kRowChunkTargetBlocks = 2048;
constexpr int64_t kRowChunkMinRows = 64;

/// partial[k, c] = the sum over chunk k's rows of x[r, c] in double (warp w
/// takes rows r0 + w, r0 + w + kRowChunkWarps, ...; the warps' sums are then
/// added in warp order). Work item b = k * tiles + tile covers chunk k's
/// columns tile * 32 ... + 31.
template <class T>
__global__ void __launch_bounds__(kRowChunkLanes *kRowChunkWarps)
    rowChunkPartialsKernel(const T *x, int64_t rows, int64_t cols, int64_t rowsPerChunk, int64_t chunks,
                           int64_t tiles, double *partial) {
  __shared__ double warpSum[kRowChunkWarps][kRowChunkLanes];
  const int lane = (int)threadIdx.x % kRowChunkLanes, warp = (int)threadIdx.x / kRowChunkLanes;
  for (int64_t b = blockIdx.x; b < chunks * tiles; b += gridDim.x) {
    const int64_t k = b / tiles, c = (b - k * tiles) * kRowChunkLanes + lane;
    const int64_t r0 = k * rowsPerChunk, r1 = r0 + rowsPerChunk < rows ? r0 + rowsPerChunk : rows;
    double acc = 0;
    if (c < cols) {
#pragma unroll 4
      for (int64_t r = r0 + warp; r < r1; r += kRowChunkWarps) acc += toF(x[r * cols + c]);
    }
    warpSum[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < cols) {
      double sum = 0;
      for (int w = 0; w < kRowChunkWarps; ++w) sum += warpSum[w][lane];
      partial[k * cols + c] = sum;
    }
    __syncthreads(); // warpSum is read before the next chunk reuses it
  }
}

/// y[c] = the chunks' partial sums of column c, added in chunk order.
__global__ void rowChunkFinishKernel(const double *partial, int64_t cols, int64_t chunks, float *y, bool scale,
                                     double k, bool accumulate) {
  for (int64_t c = firstIndex(); c < cols; c += gridStride()) {
    double sum = 0;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) sum += partial[chunk * cols + c];
    store(y, c, (float)(scale ? sum * k : sum), accumulate);
  }
}

/// Below this many outputs one thread per output leaves most of the GPU idle
/// (an H100/H200 holds about 270,000 resident threads).
constexpr int64_t kFewOutputs = 65536;

/// How one reduction runs, from the shapes alone.
struct ReducePlan {
  int64_t outN = 0, count = 0; // outputs; inputs summed into each
  IndexMap<1> kept, reduced;   // output index -> base offset; j -> offset
  double k = 1.0;              // the mean's factor
  bool copy = false;           // nothing summed: y = x
  enum class Schedule { PerThread, PerColumns, RowChunks, PerBlock } schedule = Schedule::PerThread;
  int64_t rowsPerChunk = 0, chunks = 0; // RowChunks: x seen as [count, outN]
};

/// Whether every reduced axis (extent > 1) comes before every kept one: x is
/// then [count, outN] row-major.
bool reducesLeadingRows(const Shape &xs, const Shape &keptShape) {
  bool keptSeen = false;
  for (int a = 0; a < xs.size; ++a) {
    if (xs.v[a] == 1) continue;
    const bool reduced = keptShape.v[a] == 1;
    if (reduced && keptSeen) return false;
    keptSeen |= !reduced;
  }
  return true;
}

/// Checks as the CPU kernel; with `mean`, the factor divides by the number
/// of elements summed into each output.
ReducePlan planReduce(const char *op, const Shape &xs, const Dims &axes, bool emptyMeansAll, bool mean) {
  const Shape keptShape = kernels::reducedShape(op, xs, axes, emptyMeansAll);
  Shape summedShape; // the reduced axes' extents, 1 elsewhere
  for (int a = 0; a < xs.size; ++a) summedShape.push(keptShape.v[a] == 1 ? xs.v[a] : 1);
  ReducePlan plan;
  plan.outN = keptShape.numel();
  if (plan.outN == 0) return plan;
  plan.count = xs.numel() / plan.outN;
  plan.copy = plan.count == 1; // exactly what the division by 1 gives
  // CPU: k = 1 / (count * divide) with divide = 1 for the mean (1/0 = inf
  // when nothing is summed, so the mean of nothing is 0 * inf = NaN).
  plan.k = mean ? 1.0 / ((double)plan.count * 1.0) : 1.0;
  const Strides xst = stridesOf(xs);
  plan.kept = makeIndexMap<1>(keptShape, {xst});
  plan.reduced = makeIndexMap<1>(summedShape, {xst});
  int lastAxis = xs.size - 1; // the innermost axis that is not 1
  while (lastAxis >= 0 && xs.v[lastAxis] == 1) --lastAxis;
  const bool innermostReduced = lastAxis >= 0 && keptShape.v[lastAxis] == 1; // its extent is > 1
  if (innermostReduced)
    plan.schedule = plan.count >= 256 ? ReducePlan::Schedule::PerBlock : ReducePlan::Schedule::PerThread;
  else
    plan.schedule = plan.count >= 64 && plan.outN < kFewOutputs ? ReducePlan::Schedule::PerColumns
                                                                : ReducePlan::Schedule::PerThread;
  if (plan.schedule == ReducePlan::Schedule::PerColumns && reducesLeadingRows(xs, keptShape)) {
    const int64_t tiles = (plan.outN + kRowChunkLanes - 1) / kRowChunkLanes;
    const int64_t most = plan.count / kRowChunkMinRows;
    int64_t chunks = (kRowChunkTargetBlocks + tiles - 1) / tiles;
    chunks = chunks < most ? chunks : most;
    if (chunks >= 2) { // else the per-columns kernel, in one launch
      plan.schedule = ReducePlan::Schedule::RowChunks;
      plan.rowsPerChunk = (plan.count + chunks - 1) / chunks;
      plan.chunks = (plan.count + plan.rowsPerChunk - 1) / plan.rowsPerChunk;
    }
  }
  return plan;
}

template <class T>
void sumAxes(const char *op, const T *x, const Shape &xs, const Dims &axes, bool emptyMeansAll, float *y,
             bool mean, bool accumulate = false) {
  const ReducePlan p = planReduce(op, xs, axes, emptyMeansAll, mean);
  if (p.outN == 0) return;
  // A sum of one element is that element: copied (float) or summed by the
  // per-thread schedule, which widens it exactly (bf16).
  if constexpr (std::is_same_v<T, float>) {
    if (p.copy && accumulate) {
      cuda::accumulate(y, x, p.outN);
      return;
    }
    if (p.copy) {
      check(cudaMemcpyAsync(y, x, (size_t)p.outN * sizeof(float), cudaMemcpyDeviceToDevice, stream()), op);
      return;
    }
  }
  switch (p.schedule) {
  case ReducePlan::Schedule::PerBlock: {
    const unsigned blocks = (unsigned)(p.outN < 65536 ? p.outN : 65536);
    reduceBlockKernel<T><<<blocks, kReduceBlock, 0, stream()>>>(x, y, p.outN, p.count, p.kept, p.reduced, mean, p.k,
                                                                   accumulate);
    break;
  }
  case ReducePlan::Schedule::PerColumns: {
    const unsigned blocks = (unsigned)((p.outN + kColumnLanes - 1) / kColumnLanes);
    reduceColumnsKernel<T><<<blocks, kColumnBlock, 0, stream()>>>(x, y, p.outN, p.count, p.kept, p.reduced, mean,
                                                               p.k, accumulate);
    break;
  }
  case ReducePlan::Schedule::RowChunks: {
    // The chunks' sums in the library's scratch (slot 0: no other call holds it meanwhile).
    double *partial = static_cast<double *>(detail::scratch(0, (size_t)(p.chunks * p.outN) * sizeof(double)));
    const int64_t tiles = (p.outN + kRowChunkLanes - 1) / kRowChunkLanes;
    rowChunkPartialsKernel<T><<<(unsigned)(tiles * p.chunks), kRowChunkLanes * kRowChunkWarps, 0, stream()>>>(
        x, p.count, p.outN, p.rowsPerChunk, p.chunks, tiles, partial);
    checkLaunch(op);
    rowChunkFinishKernel<<<blocksFor(p.outN), kThreads, 0, stream()>>>(partial, p.outN, p.chunks, y, mean, p.k,
                                                                      accumulate);
    break;
  }
  case ReducePlan::Schedule::PerThread:
    reduceThreadKernel<T><<<blocksFor(p.outN), kThreads, 0, stream()>>>(x, y, p.outN, p.count, p.kept, p.reduced, mean,
                                                                    p.k, accumulate);
    break;
  }
  checkLaunch(op);
}

} // namespace

void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y, bool accumulate) {
  sumAxes("nn.reduce_sum", x, xs, axes, false, y, false, accumulate);
}

void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y) {
  sumAxes("nn.reduce_mean", x, xs, axes, true, y, true);
}

void reduceSum(const bf16 *x, const Shape &xs, const Dims &axes, float *y, bool accumulate) {
  sumAxes("nn.reduce_sum", x, xs, axes, false, y, false, accumulate);
}

void reduceMean(const bf16 *x, const Shape &xs, const Dims &axes, float *y) {
  sumAxes("nn.reduce_mean", x, xs, axes, true, y, true);
}

} // namespace pipec::kernels::cuda
