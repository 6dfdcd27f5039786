// Batch normalization on channels-last tensors (x [N, d..., C], issue 47),
// seen as rows = N·d… rows of C channels. The sums, statistics and
// coefficients are batch_norm.cuh's, as on NCHW tensors (norm.cu); only the
// traversal differs: neighbouring threads take neighbouring channels (packs
// of them), so that every load and store is coalesced. Deterministic: each
// sum's order depends on the shape alone. Two launches a call (the
// parameter gradient one): the pass that sums also finishes the channels'
// sums and what follows from them, in the last block of each tile.
#include "batch_norm.cuh"
#include "kernel_plan.h"

#include <type_traits>

namespace pipec::kernels::cuda::bn {

namespace {

/// Threads of the blocks that walk rows (partial sums, apply passes), and
/// the most packs of channels a tile has: a warp's lanes across a row.
constexpr unsigned kRowThreads = 256;
constexpr int64_t kTilePacks = 32;
/// The lanes a channel's chunks are added in ("A channel's chunks" below).
constexpr int kSumLanes = 32;

/// Calls launch(std::integral_constant<int, V>): V channels a pack,
/// kPackOf<T> when that divides C, else 1. From the shape alone, so that
/// the sums' order does not depend on the pointers; their alignment only
/// picks 16-byte or element-wise moves.
template <class T, class Launch> void withChannelPacks(int64_t C, Launch &&launch) {
  if (C % kPackOf<T> == 0)
    launch(std::integral_constant<int, kPackOf<T>>{});
  else
    launch(std::integral_constant<int, 1>{});
}

/// V elements from `at` as floats, and back: one aligned move or V single ones.
template <int V, class T> __device__ __forceinline__ void loadFloats(const T *at, bool aligned, float (&f)[V]) {
  const Packed<T, V> p = aligned ? loadPacked<V>(at) : loadElements<V>(at);
PIPEC_UNROLL
  for (int e = 0; e < V; ++e) f[e] = toF(p.v[e]);
}
template <int V, class T> __device__ __forceinline__ void storeFloats(T *at, bool aligned, const float (&f)[V]) {
  Packed<T, V> p;
PIPEC_UNROLL
  for (int e = 0; e < V; ++e) p.v[e] = fromF<T>(f[e]);
  if (aligned)
    storePacked(at, p);
  else
    storeElements(at, p);
}

/// incomingGradient's V gradients from offset `at`.
template <int V, class T>
__device__ __forceinline__ void incomingGradients(const T *dy, const T *y, EpilogueActivation act, int64_t at,
                                                  bool aligned, float (&g)[V]) {
  loadFloats<V>(dy + at, aligned, g);
  if (act == EpilogueActivation::None) return;
  float out[V];
  loadFloats<V>(y + at, aligned, out);
PIPEC_UNROLL
  for (int e = 0; e < V; ++e) g[e] = epilogueActivationGradient(act, g[e], out[e]);
}

/// How a pass covers rows × C channels in packs of V: tiles of `width`
/// packs (at most kTilePacks, the tiles as even as they go), thread t of a
/// block taking pack t % width of its tile in row lane t / width (rowLanes
/// lanes; lane l walks rows l, l + rowLanes, ... of the chunk); chunks of
/// chunkRows rows (plan::cudaBatchNormRowChunks), a block per (tile,
/// chunk). A warp reads whole tile rows, consecutive elements across rows
/// when one tile holds every channel. Narrow tiles rather than short chunks
/// fill the GPU when the channels are many and the rows few.
struct RowTiles {
  int64_t rows, C, packs, tiles, width, rowLanes, chunks, chunkRows;
  __device__ int64_t rowEnd(int64_t k) const { return (k + 1) * chunkRows < rows ? (k + 1) * chunkRows : rows; }
  /// Lanes with chunks ("A channel's chunks"); more chunks than lanes take two levels.
  __host__ __device__ int64_t sumLanes() const { return chunks < kSumLanes ? chunks : kSumLanes; }
  __host__ __device__ bool twoLevels() const { return chunks > kSumLanes; }
};
template <int V> RowTiles rowTiles(const ChannelView &v) {
  RowTiles g{};
  g.rows = v.N;
  g.C = v.C;
  g.packs = v.C / V;
  g.tiles = (g.packs + kTilePacks - 1) / kTilePacks;
  g.width = (g.packs + g.tiles - 1) / g.tiles;
  g.rowLanes = kRowThreads / g.width;
  const int64_t chunks = plan::cudaBatchNormRowChunks(g.tiles, g.width * V, g.rows);
  g.chunkRows = g.rows > 0 ? (g.rows + chunks - 1) / chunks : 1;
  g.chunks = g.rows > 0 ? (g.rows + g.chunkRows - 1) / g.chunkRows : 1; // none empty
  return g;
}

// A channel's chunks, summed in a fixed order without a launch of their
// own: lane l of 32 adds chunks l, l + 32, ... in order from 0,
// then the lanes' sums are added in warpReduce's order (that of the warp
// per channel this pass had before). The last block of a tile to finish
// (counted by an atomic after a fence: the CUDA programming guide's
// "last block" sum, threadfence) adds its channels' lane sums and hands
// them to the call's Finish. With more than 32 chunks, the last block of
// each lane's chunks first adds that lane's partials, so that no block
// adds more than 32 terms a sum: a ResNet's first batch norm has 1,024
// chunks in its one tile (plan::cudaBatchNormRowChunks).

/// Counts this block's arrival at *counter (every thread calls it, after
/// its writes the last block reads): true in every thread of the last of
/// `arrivals` blocks, which resets the counter for the next launch
/// (detail::zeroedCounters). Its barriers also order the block's shared
/// memory: what was read before it may be overwritten after it.
__device__ inline bool lastToArrive(unsigned *counter, unsigned arrivals) {
  __shared__ unsigned arrived;
  __threadfence(); // this thread's writes, visible before the block's arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    arrived = atomicAdd(counter, 1u) + 1;
    if (arrived == arrivals) *counter = 0; // every block it counts is in
  }
  __syncthreads();
  const bool last = arrived == arrivals;
  if (last) __threadfence(); // the others' writes, before this block reads them
  return last;
}

/// Lane l's sums of channels [c0, c1): chunks l, l + 32, ... of partial
/// added in order from 0, into laneTotals. The block's threads take the
/// (channel, sum) pairs, with 8 loads in flight each; L2 loads (__ldcg):
/// other blocks wrote them.
__device__ inline void addLaneChunks(const double *partial, const RowTiles &g, int64_t c0, int64_t c1, int64_t l,
                                     double *laneTotals) {
  const int64_t stride = g.C * kChannelSums; // a chunk's partials
  for (int64_t o = c0 * kChannelSums + threadIdx.x; o < c1 * kChannelSums; o += blockDim.x) {
    double s = 0;
    int64_t k = l;
    for (; k + 7 * kSumLanes < g.chunks; k += 8 * kSumLanes) {
      double p[8];
PIPEC_UNROLL
      for (int e = 0; e < 8; ++e) p[e] = __ldcg(partial + (k + e * kSumLanes) * stride + o);
PIPEC_UNROLL
      for (int e = 0; e < 8; ++e) s += p[e];
    }
    for (; k < g.chunks; k += kSumLanes) s += __ldcg(partial + k * stride + o);
    laneTotals[l * stride + o] = s;
  }
}

/// Channels [c0, c1)'s sums from their lanes' (0 past g.sumLanes()), a
/// thread per channel, handed to finish(c, sums). Each sum adds the 32
/// lanes' in warpReduce's tree (lane l adds lane l + offset's for offset
/// 16, 8, 4, 2, 1): the quarter of lanes r, r + 4, ..., r + 28 adds as
/// below, then lane 0 holds (quarter 0 + quarter 2) + (quarter 1 + quarter
/// 3). A half at a time (16 loads in flight), so that the registers this
/// takes do not cost the kernel's hot loop its occupancy.
template <class Finish>
__device__ void finishChannels(const double *laneTotals, const RowTiles &g, int64_t c0, int64_t c1,
                               const Finish &finish) {
  const int64_t lanes = g.sumLanes(), stride = g.C * kChannelSums;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
    double t[kChannelSums];
#pragma unroll 1
    for (int q = 0; q < kChannelSums; ++q) {
      const double *at = laneTotals + c * kChannelSums + q;
      const auto v = [&](int l) { return l < lanes ? __ldcg(at + l * stride) : 0.0; };
      const auto quarter = [&](int r) {
        return ((v(r) + v(r + 16)) + (v(r + 8) + v(r + 24))) + ((v(r + 4) + v(r + 20)) + (v(r + 12) + v(r + 28)));
      };
      double sum = 0;
#pragma unroll 1
      for (int h = 0; h < 2; ++h) {
        const double half = quarter(h) + quarter(h + 2);
        sum = h == 0 ? half : sum + half;
      }
      t[q] = sum;
    }
    ChannelSums sums;
    sums.shifted = t[0];
    sums.squares = t[1];
    sums.dy = t[2];
    sums.dyShifted = t[3];
    finish(c, sums);
  }
}

/// Sum q (ChannelSums' order) of channel c over chunk k, as norm.cu's
/// channelPartialsKernel (dy may be null; the gradient through the
/// activation `act`, y its output, written to masked as well when that is
/// not null), then each channel's sums over every chunk to finish(c, sums)
/// ("A channel's chunks"). A thread sums its pack's channels over its row lane's
/// rows in LaneSum<T>; then the lanes' sums of each channel are added in
/// lane order, in double, into partial[(k · C + c) · kChannelSums + q], or
/// with no more chunks than lanes directly into lane k's total (a sum from
/// 0 is never -0, so 0 + it is itself). counters: the tiles', then with
/// two levels each tile's lanes'.
template <int V, class T, class Finish>
__global__ void rowSumsKernel(const T *x, const T *dy, const T *y, EpilogueActivation act, T *masked, RowTiles g,
                              bool aligned, double *partial, double *laneTotals, unsigned *counters, Finish finish) {
  __shared__ LaneSum<T> laneSums[kChannelSums][kRowThreads * V];
  const int64_t p = threadIdx.x % g.width, lane = threadIdx.x / g.width, tileChannels = g.width * V;
  double *chunkSums = g.twoLevels() ? partial : laneTotals;
  for (int64_t b = blockIdx.x; b < g.tiles * g.chunks; b += gridDim.x) {
    const int64_t tile = b % g.tiles, k = b / g.tiles, pack = tile * g.width + p;
    const int64_t c0 = tile * tileChannels, c1 = c0 + tileChannels < g.C ? c0 + tileChannels : g.C;
    LaneSum<T> s[kChannelSums][V] = {};
    if (lane < g.rowLanes && pack < g.packs) {
      float f[V], d[V];
      loadFloats<V>(x + pack * V, aligned, f); // row 0: the channels' pivots (channelPivot)
      LaneSum<T> pivot[V];
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) pivot[e] = (LaneSum<T>)f[e];
      for (int64_t r = k * g.chunkRows + lane, r1 = g.rowEnd(k); r < r1; r += g.rowLanes) {
        const int64_t at = r * g.C + pack * V;
        loadFloats<V>(x + at, aligned, f);
        if (dy) {
          incomingGradients<V>(dy, y, act, at, aligned, d);
          if (masked) storeFloats<V>(masked + at, aligned, d);
        }
PIPEC_UNROLL
        for (int e = 0; e < V; ++e) {
          const LaneSum<T> shifted = (LaneSum<T>)f[e] - pivot[e];
          s[0][e] += shifted;
          s[1][e] += shifted * shifted;
          if (dy) {
            s[2][e] += d[e];
            s[3][e] += (LaneSum<T>)d[e] * shifted;
          }
        }
      }
    }
PIPEC_UNROLL
    for (int q = 0; q < kChannelSums; ++q)
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) laneSums[q][threadIdx.x * V + e] = s[q][e];
    __syncthreads();
    // Work item o: sum o / tileChannels of the tile's channel o % tileChannels.
    for (int64_t o = threadIdx.x; o < kChannelSums * tileChannels; o += blockDim.x) {
      const int64_t q = o / tileChannels, j = o - q * tileChannels, c = c0 + j;
      if (c >= g.C) continue;
      double total = 0;
      for (int64_t l = 0; l < g.rowLanes; ++l) total += laneSums[q][l * tileChannels + j];
      chunkSums[(k * g.C + c) * kChannelSums + q] = total;
    }
    // lastToArrive's barriers keep the next block's sums off laneSums until
    // every thread has read them.
    bool laneDone = true;
    if (g.twoLevels()) {
      const int64_t l = k % kSumLanes;
      laneDone = lastToArrive(counters + g.tiles + tile * kSumLanes + l,
                              (unsigned)((g.chunks - 1 - l) / kSumLanes + 1));
      if (laneDone) addLaneChunks(partial, g, c0, c1, l, laneTotals);
    }
    if (laneDone && lastToArrive(counters + tile, (unsigned)g.sumLanes()))
      finishChannels(laneTotals, g, c0, c1, finish);
  }
}

/// What y's coefficients come from besides the sums (batchNormLast's
/// arguments).
struct NormParams {
  const float *scale, *bias, *runningMean, *runningVar;
  float *newMean, *newVar;
  float epsilon, momentum;
  bool training;
};

/// Training's forward, per channel from its sums: the batch statistics,
/// the new running ones, and y's coefficients a[c], shift[c] (norm.cu's
/// batchNormApplyKernel's, once per channel).
template <class T> struct NormFinish {
  const T *x;
  ChannelView v;
  NormParams p;
  float *a, *shift;
  __device__ void operator()(int64_t c, const ChannelSums &t) const {
    const ChannelStats st = batchStats(x, v, c, t);
    updateRunningStats(st, p.runningMean, p.runningVar, p.newMean, p.newVar, p.momentum, true, c);
    const AffineCoefficients q = affineCoefficients(st, p.scale, p.bias, p.epsilon, c);
    a[c] = q.a;
    shift[c] = q.shift;
  }
};

/// y = act(x · a[c] + shift[c] (+ residual)) over block b's tile and chunk,
/// each thread's channel coefficients loaded once. Without a (inference,
/// an empty batch) each thread computes its channels' from the running
/// statistics, or zeros, and chunk 0's first row lane writes the new
/// running statistics, as norm.cu's batchNormApplyKernel: in inference only
/// where they move (in place, other blocks are reading them).
template <int V, class T>
__global__ void lastNormApplyKernel(const T *x, RowTiles g, const float *a, const float *shift, NormParams np,
                                    const T *residual, EpilogueActivation act, T *y, bool aligned) {
  const int64_t p = threadIdx.x % g.width, lane = threadIdx.x / g.width;
  if (lane >= g.rowLanes) return;
  for (int64_t b = blockIdx.x; b < g.tiles * g.chunks; b += gridDim.x) {
    const int64_t tile = b % g.tiles, k = b / g.tiles, pack = tile * g.width + p;
    if (pack >= g.packs) continue;
    float av[V], sv[V], f[V], r[V];
    if (a) {
      loadFloats<V>(a + pack * V, true, av); // scratch: aligned for any V
      loadFloats<V>(shift + pack * V, true, sv);
    } else {
      const bool moves = np.training || np.newMean != np.runningMean || np.newVar != np.runningVar;
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) {
        const int64_t c = pack * V + e;
        ChannelStats st{0, 0};
        if (!np.training) st = {np.runningMean[c], np.runningVar[c]};
        if (k == 0 && lane == 0 && moves)
          updateRunningStats(st, np.runningMean, np.runningVar, np.newMean, np.newVar, np.momentum, np.training, c);
        const AffineCoefficients q = affineCoefficients(st, np.scale, np.bias, np.epsilon, c);
        av[e] = q.a;
        sv[e] = q.shift;
      }
    }
    for (int64_t i = k * g.chunkRows + lane, i1 = g.rowEnd(k); i < i1; i += g.rowLanes) {
      const int64_t at = i * g.C + pack * V;
      loadFloats<V>(x + at, aligned, f);
      if (residual) loadFloats<V>(residual + at, aligned, r);
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) {
        float value = f[e] * av[e] + sv[e];
        if (residual) value += r[e];
        f[e] = epilogueActivationValue(act, value);
      }
      storeFloats<V>(y + at, aligned, f);
    }
  }
}

/// Training's gradient coefficients of channel c from its sums.
template <class T> struct GradFinish {
  const T *x;
  ChannelView v;
  const float *scale;
  float epsilon;
  GradCoefficients *coefficients;
  __device__ void operator()(int64_t c, const ChannelSums &t) const {
    coefficients[c] = gradCoefficients(x, v, c, t, scale, epsilon);
  }
};

/// Training's dx over block b's tile and chunk (gradValue, as norm.cu's
/// batchNormGradApplyKernel).
template <int V, class T>
__global__ void lastNormGradApplyKernel(const T *dy, const T *y, EpilogueActivation act, const T *x, RowTiles g,
                                        const GradCoefficients *coefficients, T *dx, bool aligned) {
  const int64_t p = threadIdx.x % g.width, lane = threadIdx.x / g.width;
  if (lane >= g.rowLanes) return;
  for (int64_t b = blockIdx.x; b < g.tiles * g.chunks; b += gridDim.x) {
    const int64_t tile = b % g.tiles, k = b / g.tiles, pack = tile * g.width + p;
    if (pack >= g.packs) continue;
    GradCoefficients q[V];
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) q[e] = coefficients[pack * V + e];
    float f[V], d[V];
    for (int64_t i = k * g.chunkRows + lane, i1 = g.rowEnd(k); i < i1; i += g.rowLanes) {
      const int64_t at = i * g.C + pack * V;
      loadFloats<V>(x + at, aligned, f);
      incomingGradients<V>(dy, y, act, at, aligned, d);
PIPEC_UNROLL
      for (int e = 0; e < V; ++e) f[e] = gradValue(q[e], f[e], d[e]);
      storeFloats<V>(dx + at, aligned, f);
    }
  }
}

/// dscale[c] and dbias[c] from channel c's sums (writeParamGrads).
template <class T> struct ParamFinish {
  const T *x;
  ChannelView v;
  const float *runningMean, *runningVar;
  float *dscale, *dbias;
  float epsilon;
  bool training, accumulate;
  __device__ void operator()(int64_t c, const ChannelSums &t) const {
    writeParamGrads(x, v, c, t, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate);
  }
};

/// The sums pass's scratch, last in a call's ScratchNeed: the chunks'
/// partials (with two levels only) and the lanes' totals.
void addSums(const RowTiles &g, ScratchNeed &need) {
  need.addShared<double>(g.twoLevels() ? g.C * g.chunks * kChannelSums : 0);
  need.addShared<double>(g.C * g.sumLanes() * kChannelSums);
}

/// One launch: the channels' sums of x (and dy), each channel's handed to
/// finish in the last block of its tile (rowSumsKernel).
template <int V, class T, class Finish>
void rowSums(const char *op, const T *x, const T *dy, const T *y, EpilogueActivation act, T *masked, const RowTiles &g,
             bool aligned, Scratch &scratch, const Finish &finish) {
  double *partial = scratch.shared<double>(g.twoLevels() ? g.C * g.chunks * kChannelSums : 0);
  double *laneTotals = scratch.shared<double>(g.C * g.sumLanes() * kChannelSums);
  unsigned *counters = detail::zeroedCounters((size_t)(g.tiles * (g.twoLevels() ? 1 + kSumLanes : 1)));
  rowSumsKernel<V, T, Finish><<<segmentBlocks(g.tiles * g.chunks), kRowThreads, 0, detail::stream()>>>(
      x, dy, y, act, masked, g, aligned, partial, laneTotals, counters, finish);
  detail::checkLaunch(op);
}

} // namespace

template <class T>
void batchNormLast(const char *op, const T *x, const ChannelView &v, const float *scale, const float *bias,
                   const float *runningMean, const float *runningVar, T *y, float *newMean, float *newVar,
                   float epsilon, float momentum, bool training, const T *residual, EpilogueActivation act) {
  withChannelPacks<T>(v.C, [&](auto pack) {
    constexpr int V = decltype(pack)::value;
    const RowTiles g = rowTiles<V>(v);
    const bool aligned = packedAligned<V>(x, y, residual);
    const NormParams np{scale, bias, runningMean, runningVar, newMean, newVar, epsilon, momentum, training};
    float *a = nullptr, *shift = nullptr; // training's, from the sums
    if (training && v.count() > 0) {
      ScratchNeed need;
      need.addShared<float>(v.C);
      need.addShared<float>(v.C);
      addSums(g, need);
      Scratch scratch(op, Workspace{}, need);
      a = scratch.shared<float>(v.C);
      shift = scratch.shared<float>(v.C);
      rowSums<V, T>(op, x, nullptr, nullptr, EpilogueActivation::None, nullptr, g, aligned, scratch,
                    NormFinish<T>{x, v, np, a, shift});
    }
    lastNormApplyKernel<V, T><<<segmentBlocks(g.tiles * g.chunks), kRowThreads, 0, detail::stream()>>>(
        x, g, a, shift, np, residual, act, y, aligned);
    detail::checkLaunch(op);
  });
}

template <class T>
void batchNormGradLast(const char *op, const T *dy, const T *x, const ChannelView &v, const float *scale, T *dx,
                       float epsilon, const T *y, EpilogueActivation act, T *masked) {
  withChannelPacks<T>(v.C, [&](auto pack) {
    constexpr int V = decltype(pack)::value;
    const RowTiles g = rowTiles<V>(v);
    const bool aligned = packedAligned<V>(dy, x, dx, y, masked);
    ScratchNeed need;
    need.addShared<GradCoefficients>(v.C);
    addSums(g, need);
    Scratch scratch(op, Workspace{}, need);
    GradCoefficients *coefficients = scratch.shared<GradCoefficients>(v.C);
    rowSums<V, T>(op, x, dy, y, act, masked, g, aligned, scratch, GradFinish<T>{x, v, scale, epsilon, coefficients});
    // The apply pass reads the masked gradient where the first wrote it.
    const bool reread = masked != nullptr;
    lastNormGradApplyKernel<V, T><<<segmentBlocks(g.tiles * g.chunks), kRowThreads, 0, detail::stream()>>>(
        reread ? masked : dy, y, reread ? EpilogueActivation::None : act, x, g, coefficients, dx, aligned);
    detail::checkLaunch(op);
  });
}

template <class T>
void batchNormParamGradLast(const char *op, const T *dy, const T *x, const ChannelView &v, const float *runningMean,
                            const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                            bool accumulate) {
  withChannelPacks<T>(v.C, [&](auto pack) {
    constexpr int V = decltype(pack)::value;
    const RowTiles g = rowTiles<V>(v);
    ScratchNeed need;
    addSums(g, need);
    Scratch scratch(op, Workspace{}, need);
    rowSums<V, T>(op, x, dy, nullptr, EpilogueActivation::None, nullptr, g, packedAligned<V>(dy, x), scratch,
                  ParamFinish<T>{x, v, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate});
  });
}

// The two storages norm.cu calls them with.
template void batchNormLast<float>(const char *, const float *, const ChannelView &, const float *, const float *,
                                   const float *, const float *, float *, float *, float *, float, float, bool,
                                   const float *, EpilogueActivation);
template void batchNormLast<bf16>(const char *, const bf16 *, const ChannelView &, const float *, const float *,
                                  const float *, const float *, bf16 *, float *, float *, float, float, bool,
                                  const bf16 *, EpilogueActivation);
template void batchNormGradLast<float>(const char *, const float *, const float *, const ChannelView &,
                                       const float *, float *, float, const float *, EpilogueActivation, float *);
template void batchNormGradLast<bf16>(const char *, const bf16 *, const bf16 *, const ChannelView &, const float *,
                                      bf16 *, float, const bf16 *, EpilogueActivation, bf16 *);
template void batchNormParamGradLast<float>(const char *, const float *, const float *, const ChannelView &,
                                            const float *, const float *, float *, float *, float, bool, bool);
template void batchNormParamGradLast<bf16>(const char *, const bf16 *, const bf16 *, const ChannelView &,
                                           const float *, const float *, float *, float *, float, bool, bool);

} // namespace pipec::kernels::cuda::bn
