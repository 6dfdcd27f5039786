// Batch and layer normalization with their input and parameter gradients.
// As the CPU kernels (runtime/kernels/src/norm.cpp): statistics accumulate in
// double, element-wise work is float. Every reduction is a fixed-order tree
// (one block per row, or per-chunk partial sums combined in a fixed order):
// deterministic, no atomics. Batch norm reads its input once for the
// statistics (shifted sums, one pass) and once to apply them, each pass a
// block per (channel, chunk). Both norms' kernels are templated on the
// storage of x, y, dy and dx (float, or bf16 with float parameters and
// statistics: docs/cuda-kernels.md). Channels-last batch norms run
// batch_norm_nhwc.cu's passes on batch_norm.cuh's math.
#include "batch_norm.cuh"
#include "gemm.cuh"
#include "kernel_plan.h"
#include "nn_common.cuh"
#include "pipec/unary_math.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace pipec::kernels::cuda {

namespace {

using namespace nn;
using namespace bn;

//===----------------------------------------------------------------------===//
// Batch normalization: blocks per (channel, chunk), partial sums in scratch
//===----------------------------------------------------------------------===//

/// A thread's walk over positions start, start + step, ... of a channel's
/// N·inner elements: the sample n and inner index i of position j kept up
/// to date by additions, so that no element costs a 64-bit division (the
/// batch norms were instruction-bound on them: ResNet-50's took 12.4 ms of
/// a 17 ms micro-batch on the 2026-11-28 H200, docs/gpu-runs.md).
struct ChannelWalk {
  int64_t j, n, i, step, stepN, stepI;
  __device__ ChannelWalk(const ChannelView &v, int64_t start, int64_t step)
      : j(start), n(start / v.inner), i(start % v.inner), step(step), stepN(step / v.inner), stepI(step % v.inner) {}
  __device__ void next(const ChannelView &v) {
    j += step;
    n += stepN;
    i += stepI;
    if (i >= v.inner) {
      i -= v.inner;
      ++n;
    }
  }
};

/// Calls f(offset in x) for this thread's positions j0 + threadIdx.x,
/// + blockDim.x, ... < j1 of channel c (none, and no division by an inner
/// of 0, when the range is empty for it).
template <class F>
__device__ __forceinline__ void forChannelRange(const ChannelView &v, int64_t c, int64_t j0, int64_t j1, F &&f) {
  if (j0 + threadIdx.x >= j1) return;
  for (ChannelWalk w(v, j0 + threadIdx.x, blockDim.x); w.j < j1; w.next(v)) f(elementOffset(v, w.n, c, w.i));
}

/// The chunks of every channel (plan::cudaBatchNormChunks) and block b's
/// channel, and its elements [j0, j1) of that channel.
struct ChannelChunks {
  int64_t chunks, length; // elements per chunk (the last may have fewer)
  __device__ int64_t channel(int64_t b) const { return b / chunks; }
  __device__ int64_t chunk(int64_t b) const { return b % chunks; }
  __device__ void range(const ChannelView &v, int64_t b, int64_t &j0, int64_t &j1) const {
    const int64_t count = v.count();
    j0 = chunk(b) * length < count ? chunk(b) * length : count;
    j1 = j0 + length < count ? j0 + length : count;
  }
};
ChannelChunks channelChunks(const ChannelView &v) {
  const int64_t chunks = plan::cudaBatchNormChunks(v.C, v.count());
  return {chunks, (v.count() + chunks - 1) / chunks};
}

/// partial[b · kChannelSums + s]: sum s over block b's chunk (dy may be
/// null); the gradient through the activation `act` (y its output), written
/// to masked as well when that is not null.
template <class T>
__global__ void channelPartialsKernel(const T *x, const T *dy, const T *y, EpilogueActivation act, T *masked, ChannelView v,
                                      ChannelChunks cc, double *partial) {
  for (int64_t b = blockIdx.x; b < v.C * cc.chunks; b += gridDim.x) {
    const int64_t c = cc.channel(b);
    int64_t j0, j1;
    cc.range(v, b, j0, j1);
    // A thread's own sums in LaneSum<T>: double for float storage; for bf16
    // float, where x - pivot (two bf16 values) is exact.
    const LaneSum<T> pivot = (LaneSum<T>)channelPivot(x, v, c);
    LaneSum<T> s[kChannelSums] = {0, 0, 0, 0};
    forChannelRange(v, c, j0, j1, [&](int64_t i) {
      const LaneSum<T> d = (LaneSum<T>)toF(x[i]) - pivot;
      s[0] += d;
      s[1] += d * d;
      if (dy) {
        const float g = incomingGradient(dy, y, act, i);
        if (masked) masked[i] = fromF<T>(g);
        s[2] += g;
        s[3] += (LaneSum<T>)g * d;
      }
    });
    for (int q = 0; q < kChannelSums; ++q) {
      const double total = blockSum((double)s[q]);
      if (threadIdx.x == 0) partial[b * kChannelSums + q] = total;
    }
  }
}

/// Channel c's sums from its chunks' partials, in chunk order.
__device__ ChannelSums channelSums(const double *partial, ChannelChunks cc, int64_t c) {
  ChannelSums t;
  for (int64_t k = 0; k < cc.chunks; ++k) {
    const double *p = partial + (c * cc.chunks + k) * kChannelSums;
    t.shifted += p[0], t.squares += p[1], t.dy += p[2], t.dyShifted += p[3];
  }
  return t;
}

/// y over block b's chunk with the batch statistics (training) or the
/// running ones, plus the residual (if any), through the activation `act`; the
/// chunk-0 block of each channel writes its new running statistics. Only
/// that block reads the running statistics in training, so newMean/newVar
/// may alias them.
template <class T>
__global__ void batchNormApplyKernel(const T *x, ChannelView v, ChannelChunks cc, const double *partial,
                                     const float *scale, const float *bias, const float *runningMean,
                                     const float *runningVar, T *y, float *newMean, float *newVar,
                                     float epsilon, float momentum, bool training, const T *residual,
                                     EpilogueActivation act) {
  for (int64_t b = blockIdx.x; b < v.C * cc.chunks; b += gridDim.x) {
    const int64_t c = cc.channel(b);
    const bool first = cc.chunk(b) == 0;
    ChannelStats st{0, 0}; // an empty batch's (count 0)
    if (!training) st = {runningMean[c], runningVar[c]};
    else if (v.count() > 0) st = batchStats(x, v, c, channelSums(partial, cc, c));
    // Inference copies the running statistics only where they move: in place,
    // other blocks of the channel are reading them.
    if (first && threadIdx.x == 0 && (training || newMean != runningMean || newVar != runningVar))
      updateRunningStats(st, runningMean, runningVar, newMean, newVar, momentum, training, c);
    const AffineCoefficients q = affineCoefficients(st, scale, bias, epsilon, c);
    int64_t j0, j1;
    cc.range(v, b, j0, j1);
    forChannelRange(v, c, j0, j1, [&](int64_t i) {
      float value = toF(x[i]) * q.a + q.shift;
      if (residual) value += toF(residual[i]);
      value = epilogueActivationValue(act, value);
      y[i] = fromF<T>(value);
    });
  }
}

/// Training: dx = scale · invStd · (dy - mean(dy) - x̂ · mean(dy · x̂)) over
/// block b's chunk, from the channel's sums.
template <class T>
__global__ void batchNormGradApplyKernel(const T *dy, const T *y, EpilogueActivation act, const T *x, ChannelView v,
                                         ChannelChunks cc, const double *partial, const float *scale, T *dx,
                                         float epsilon) {
  for (int64_t b = blockIdx.x; b < v.C * cc.chunks; b += gridDim.x) {
    const int64_t c = cc.channel(b);
    const GradCoefficients q = gradCoefficients(x, v, c, channelSums(partial, cc, c), scale, epsilon);
    int64_t j0, j1;
    cc.range(v, b, j0, j1);
    forChannelRange(v, c, j0, j1,
                    [&](int64_t i) { dx[i] = fromF<T>(gradValue(q, toF(x[i]), incomingGradient(dy, y, act, i))); });
  }
}

/// Inference: dx = dy * scale / sqrt(runningVar + eps), element-wise (either
/// layout: a channels-last view has inner 1).
template <class T>
__global__ void batchNormGradInferenceKernel(const T *dy, const T *y, EpilogueActivation act, T *masked, ChannelView v,
                                             const float *scale, const float *runningVar, T *dx, float epsilon) {
  const int64_t total = v.N * v.C * v.inner;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t c = (i / v.inner) % v.C;
    const float a = (float)(scale[c] / sqrt((double)runningVar[c] + (double)epsilon));
    const float g = incomingGradient(dy, y, act, i);
    if (masked) masked[i] = fromF<T>(g);
    dx[i] = fromF<T>(g * a);
  }
}

/// dscale = Σ dy·(x - mean)·invStd, dbias = Σ dy per channel (a thread per
/// channel), with the batch statistics in training, the running ones else;
/// added into dscale and dbias with accumulate.
template <class T>
__global__ void batchNormParamFinishKernel(const T *x, ChannelView v, ChannelChunks cc, const double *partial,
                                           const float *runningMean, const float *runningVar, float *dscale,
                                           float *dbias, float epsilon, bool training, bool accumulate) {
  for (int64_t c = firstIndex(); c < v.C; c += gridStride())
    writeParamGrads(x, v, c, channelSums(partial, cc, c), runningMean, runningVar, dscale, dbias, epsilon, training,
                    accumulate);
}

/// The channels' partial sums of x (and dy) in the call's scratch: one
/// launch, a block per (channel, chunk).
template <class T>
const double *channelPartials(const char *op, const T *x, const T *dy, const ChannelView &v, const ChannelChunks &cc,
                              Scratch &scratch, const T *y = nullptr, EpilogueActivation act = EpilogueActivation::None,
                              T *masked = nullptr) {
  double *partial = scratch.shared<double>(v.C * cc.chunks * kChannelSums);
  channelPartialsKernel<T><<<segmentBlocks(v.C * cc.chunks), segmentThreads(cc.length), 0, detail::stream()>>>(
      x, dy, y, act, masked, v, cc, partial);
  detail::checkLaunch(op);
  return partial;
}

ScratchNeed channelPartialsNeed(const ChannelView &v, const ChannelChunks &cc) {
  ScratchNeed need;
  need.addShared<double>(v.C * cc.chunks * kChannelSums);
  return need;
}

//===----------------------------------------------------------------------===//
// Layer normalization: one block per row
//===----------------------------------------------------------------------===//


/// A parameter of shape ps expanded to the normalized shape: the pointer
/// itself when it already has every element, else a copy in scratch.
const float *expandedParam(const char *op, const float *p, const Shape &ps, const RowView &v, Scratch &scratch) {
  if (!broadcastsTo(ps, v.normalized))
    fail(op, "scale/bias of shape " + ps.str() + " does not broadcast to " + v.normalized.str());
  if (ps.numel() == v.inner) return p;
  float *buffer = scratch.shared<float>(v.inner);
  expandTo(op, p, ps, buffer, v.normalized);
  return buffer;
}

// The row kernels: one row per lane group P (a warp or a block, rowLaunch),
// V elements at a time; the rows' math is pipec/cuda_row_norm.cuh's, which
// a stage's generated kernels that join an element-wise loop to a norm share.

template <class P, int V, class T>
__global__ void layerNormKernel(const T *x, int64_t rows, int64_t inner, const float *g, const float *b, T *y,
                                float *mean, float *invStd, float epsilon, RowNorm norm) {
  for (int64_t r = P::first(); r < rows; r += P::step())
    layerNormRow<P, V>(x + r * inner, inner, g, b, y + r * inner, r, mean, invStd, epsilon, norm);
}

template <class P, int V, class T>
__global__ void layerNormGradKernel(const T *dy, const T *x, int64_t rows, int64_t inner, const float *g, T *dx,
                                    float epsilon, RowNorm norm) {
  for (int64_t r = P::first(); r < rows; r += P::step()) {
    T *dxr = dx + r * inner;
    layerNormGradRow<P, V>(dy + r * inner, x + r * inner, inner, g, epsilon, norm,
                           [&](int64_t j, const float (&d)[V]) {
                             Packed<T, V> out;
PIPEC_UNROLL
                             for (int e = 0; e < V; ++e) out.v[e] = fromF<T>(d[e]);
                             storePacked(dxr + j * V, out);
                           });
  }
}

/// Warps of layerNormChunkPartialKernel's blocks.
constexpr unsigned kChunkPartialWarps = 8;

/// Block (k, t): partial[k, c] = Σ over the rows r of chunk k (in order of
/// the block's warps, then of the warps' partial sums) of dy·x̂ (and dy), in
/// double, for the columns c of tile t (32 packs of V columns, a pack a
/// lane). The chunk's row statistics first ((float)mean and (float)invStd,
/// the values the CPU's parameter gradient uses), a warp per row, into
/// shared memory; then warp w sums rows w, w + 8, ... of its tile, and the
/// warps' sums are added in warp order. (A thread per column summing the
/// chunk's rows one after another, 2 bytes a load, on about sqrt(rows)
/// blocks, took 0.1 ms for GPT-2's [16,384, 768] on an H200.)
template <int V, class T>
__global__ void layerNormChunkPartialKernel(const T *dy, const T *x, int64_t rows, int64_t inner,
                                            int64_t rowsPerChunk, int64_t chunks, int64_t tiles, float epsilon,
                                            RowNorm norm, double *partialScale, double *partialBias) {
  __shared__ float chunkMean[plan::kCudaLayerNormMaxRowsPerChunk], chunkInv[plan::kCudaLayerNormMaxRowsPerChunk];
  __shared__ double warpScale[kChunkPartialWarps][32 * V], warpBias[kChunkPartialWarps][32 * V];
  const int64_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, packs = inner / V;
  for (int64_t block = blockIdx.x; block < chunks * tiles; block += gridDim.x) {
    const int64_t k = block / tiles, t = block - k * tiles;
    const int64_t r0 = k * rowsPerChunk, r1 = r0 + rowsPerChunk < rows ? r0 + rowsPerChunk : rows;
    for (int64_t r = r0 + warp; r < r1; r += kChunkPartialWarps) {
      double m, inv;
      rowStats<WarpLanes, V>(x + r * inner, inner, epsilon, norm, m, inv);
      if (WarpLanes::leader()) {
        chunkMean[r - r0] = (float)m;
        chunkInv[r - r0] = (float)inv;
      }
    }
    __syncthreads();
    const int64_t j = t * 32 + lane; // this lane's pack
    LaneSum<T> s[V] = {}, b[V] = {};
    if (j < packs)
      for (int64_t r = r0 + warp; r < r1; r += kChunkPartialWarps) {
        float f[V], d[V];
        loadWide<V>(x + r * inner, j, f);
        loadWide<V>(dy + r * inner, j, d);
        const float fm = chunkMean[r - r0], fi = chunkInv[r - r0];
PIPEC_UNROLL
        for (int e = 0; e < V; ++e) {
          s[e] += d[e] * ((f[e] - fm) * fi);
          b[e] += d[e];
        }
      }
PIPEC_UNROLL
    for (int e = 0; e < V; ++e) {
      warpScale[warp][lane * V + e] = s[e];
      warpBias[warp][lane * V + e] = b[e];
    }
    __syncthreads();
    // Thread q adds column q of the tile over the warps, in order.
    for (int64_t q = threadIdx.x; q < 32 * V; q += blockDim.x) {
      const int64_t c = t * 32 * V + q;
      if (c >= inner) continue;
      double sumS = 0, sumB = 0;
      for (unsigned w = 0; w < kChunkPartialWarps; ++w) {
        sumS += warpScale[w][q];
        sumB += warpBias[w][q];
      }
      partialScale[k * inner + c] = sumS;
      if (partialBias) partialBias[k * inner + c] = sumB;
    }
    __syncthreads(); // the next block's statistics and sums overwrite these
  }
}

/// How the normalized shape sums down to the parameter shape: output j (a
/// row-major index of the parameter shape aligned to the normalized rank)
/// sums the normalized positions that broadcast to it.
struct SumDown {
  int rank = 0;
  int64_t nDims[kMaxRank] = {}, nStr[kMaxRank] = {}, pDims[kMaxRank] = {};
  bool reduced[kMaxRank] = {};
  int64_t reducedCount = 1;
};

/// out[j] = Σ over chunks k (in order) and the positions q of j (row-major)
/// of partial[k, q].
__global__ void layerNormFinishKernel(const double *partialScale, const double *partialBias, int64_t chunks,
                                      int64_t inner, SumDown m, int64_t outCount, float *dscale, float *dbias,
                                      bool accumulate) {
  for (int64_t j = firstIndex(); j < outCount; j += gridStride()) {
    int64_t base = 0;
    {
      int64_t rest = j;
      for (int a = m.rank - 1; a >= 0; --a) {
        const int64_t q = rest / m.pDims[a];
        base += (rest - q * m.pDims[a]) * m.nStr[a];
        rest = q;
      }
    }
    double s = 0, b = 0;
    for (int64_t t = 0; t < m.reducedCount; ++t) {
      int64_t rest = t, off = base;
      for (int a = m.rank - 1; a >= 0; --a) {
        if (!m.reduced[a]) continue;
        const int64_t q = rest / m.nDims[a];
        off += (rest - q * m.nDims[a]) * m.nStr[a];
        rest = q;
      }
      for (int64_t k = 0; k < chunks; ++k) {
        s += partialScale[k * inner + off];
        if (dbias) b += partialBias[k * inner + off];
      }
    }
    // Added into a gradient buffer: the bits of a separate sum and accumulate.
    dscale[j] = accumulate ? dscale[j] + (float)s : (float)s;
    if (dbias) dbias[j] = accumulate ? dbias[j] + (float)b : (float)b;
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Batch normalization
//===----------------------------------------------------------------------===//

namespace {
// One body per call for float and bf16 storage of x, y, dy and dx; the
// parameters, statistics and parameter gradients are float either way.
template <class T>
void batchNormT(const T *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
                const float *runningVar, T *y, float *newMean, float *newVar, float epsilon, float momentum,
                bool training, const T *residual, std::optional<Unary> activation, bool channelsLast) {
  const char *op = "nn.batch_norm";
  const ChannelView v = channelView(op, xs, channelsLast);
  const EpilogueActivation act = epilogueActivation(op, activation);
  if (v.C == 0) return;
  if (channelsLast)
    return batchNormLast(op, x, v, scale, bias, runningMean, runningVar, y, newMean, newVar, epsilon, momentum,
                         training, residual, act);
  const ChannelChunks cc = channelChunks(v);
  std::optional<Scratch> scratch; // the partial sums, in training only
  const double *partial = nullptr;
  if (training && v.count() > 0) {
    scratch.emplace(op, Workspace{}, channelPartialsNeed(v, cc));
    partial = channelPartials<T>(op, x, nullptr, v, cc, *scratch);
  }
  batchNormApplyKernel<T><<<segmentBlocks(v.C * cc.chunks), segmentThreads(cc.length), 0, detail::stream()>>>(
      x, v, cc, partial, scale, bias, runningMean, runningVar, y, newMean, newVar, epsilon, momentum, training,
      residual, act);
  detail::checkLaunch(op);
}

template <class T>
void batchNormGradT(const T *dy, const T *x, const Shape &xs, const float *scale, const float *runningVar, T *dx,
                    float epsilon, bool training, const T *y, std::optional<Unary> activation, T *masked,
                    bool channelsLast) {
  const char *op = "nn.batch_norm_grad";
  const ChannelView v = channelView(op, xs, channelsLast);
  const EpilogueActivation act = epilogueActivation(op, activation);
  if (act != EpilogueActivation::None && !y) fail(op, "the activation's gradient needs its output y");
  const int64_t total = v.N * v.C * v.inner;
  if (total == 0) return;
  if (training && channelsLast) return batchNormGradLast(op, dy, x, v, scale, dx, epsilon, y, act, masked);
  if (training) {
    const ChannelChunks cc = channelChunks(v);
    Scratch scratch(op, {}, channelPartialsNeed(v, cc));
    const double *partial = channelPartials(op, x, dy, v, cc, scratch, y, act, masked);
    // The apply pass reads the masked gradient where the first wrote it.
    const bool reread = masked != nullptr;
    batchNormGradApplyKernel<T><<<segmentBlocks(v.C * cc.chunks), segmentThreads(cc.length), 0, detail::stream()>>>(
        reread ? masked : dy, y, reread ? EpilogueActivation::None : act, x, v, cc, partial, scale, dx, epsilon);
  } else {
    batchNormGradInferenceKernel<T><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(
        dy, y, act, masked, v, scale, runningVar, dx, epsilon);
  }
  detail::checkLaunch(op);
}

template <class T>
void batchNormParamGradT(const T *dy, const T *x, const Shape &xs, const float *runningMean, const float *runningVar,
                         float *dscale, float *dbias, float epsilon, bool training, bool accumulate,
                         bool channelsLast) {
  const char *op = "nn.batch_norm_param_grad";
  const ChannelView v = channelView(op, xs, channelsLast);
  if (v.C == 0 || (v.count() == 0 && accumulate)) return; // accumulate: adding sums of nothing
  if (v.count() == 0) { // sums of nothing
    detail::check(cudaMemsetAsync(dscale, 0, (size_t)v.C * sizeof(float), detail::stream()), op);
    detail::check(cudaMemsetAsync(dbias, 0, (size_t)v.C * sizeof(float), detail::stream()), op);
    return;
  }
  if (channelsLast)
    return batchNormParamGradLast(op, dy, x, v, runningMean, runningVar, dscale, dbias, epsilon, training,
                                  accumulate);
  const ChannelChunks cc = channelChunks(v);
  Scratch scratch(op, {}, channelPartialsNeed(v, cc));
  const double *partial = channelPartials(op, x, dy, v, cc, scratch);
  batchNormParamFinishKernel<T><<<detail::blocksFor(v.C), detail::kThreads, 0, detail::stream()>>>(
      x, v, cc, partial, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate);
  detail::checkLaunch(op);
}
} // namespace

// The float overloads without channelsLast are kernel_api.inc's, which the
// CPU library shares: NCHW.
void batchNorm(const float *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, float *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const float *residual, std::optional<Unary> activation) {
  batchNormT(x, xs, scale, bias, runningMean, runningVar, y, newMean, newVar, epsilon, momentum, training, residual,
             activation, false);
}
void batchNorm(const float *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, float *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const float *residual, std::optional<Unary> activation, bool channelsLast) {
  batchNormT(x, xs, scale, bias, runningMean, runningVar, y, newMean, newVar, epsilon, momentum, training, residual,
             activation, channelsLast);
}
void batchNorm(const bf16 *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, bf16 *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const bf16 *residual, std::optional<Unary> activation, bool channelsLast) {
  batchNormT(x, xs, scale, bias, runningMean, runningVar, y, newMean, newVar, epsilon, momentum, training, residual,
             activation, channelsLast);
}
void batchNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const float *,
                   const float *runningVar, float *dx, float epsilon, bool training, const float *y,
                   std::optional<Unary> activation, float *maskedDy) {
  batchNormGradT(dy, x, xs, scale, runningVar, dx, epsilon, training, y, activation, maskedDy, false);
}
void batchNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const float *,
                   const float *runningVar, float *dx, float epsilon, bool training, const float *y,
                   std::optional<Unary> activation, float *maskedDy, bool channelsLast) {
  batchNormGradT(dy, x, xs, scale, runningVar, dx, epsilon, training, y, activation, maskedDy, channelsLast);
}
void batchNormGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *scale, const float *,
                   const float *runningVar, bf16 *dx, float epsilon, bool training, const bf16 *y,
                   std::optional<Unary> activation, bf16 *maskedDy, bool channelsLast) {
  batchNormGradT(dy, x, xs, scale, runningVar, dx, epsilon, training, y, activation, maskedDy, channelsLast);
}
void batchNormParamGrad(const float *dy, const float *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate) {
  batchNormParamGradT(dy, x, xs, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate, false);
}
void batchNormParamGrad(const float *dy, const float *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate, bool channelsLast) {
  batchNormParamGradT(dy, x, xs, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate,
                      channelsLast);
}
void batchNormParamGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate, bool channelsLast) {
  batchNormParamGradT(dy, x, xs, runningMean, runningVar, dscale, dbias, epsilon, training, accumulate,
                      channelsLast);
}

//===----------------------------------------------------------------------===//
// Layer normalization
//===----------------------------------------------------------------------===//

namespace {
/// Calls launch(std::integral_constant<int, V>) with V = kPackOf<T> when
/// rows of `inner` elements of T, at these pointers (the float parameters
/// may be null), move in packs of that many elements, else V = 1.
template <class T, class Launch, class... Pointers>
void withRowPacks(int64_t inner, Launch &&launch, const Pointers *...pointers) {
  constexpr int V = kPackOf<T>;
  if (inner % V == 0 && (... && (pointers == nullptr || packedAligned<V>(pointers))))
    launch(std::integral_constant<int, V>{});
  else
    launch(std::integral_constant<int, 1>{});
}

// One body per call for float and bf16 storage; the scratch (expanded
// parameters, statistics, partial sums) is float whatever the storage, so
// bf16 needs what float needs (pipec/kernel_scratch.h).
template <class T>
void layerNormT(const T *x, const Shape &xs, const float *scale, const Shape &ss, const float *bias, const Shape &bs,
                T *y, float *mean, float *invStd, int64_t axis, float epsilon, RowNorm norm,
                const Workspace &workspace) {
  const char *op = "nn.layer_norm";
  const RowView v = rowView(op, xs, axis);
  Scratch scratch(op, workspace, layerNormScratch(ScratchTarget::Cuda, xs, ss, bias ? &bs : nullptr, axis));
  const float *g = expandedParam(op, scale, ss, v, scratch);
  const float *b = bias ? expandedParam(op, bias, bs, v, scratch) : nullptr;
  if (v.rows == 0) return;
  launchPerRow(v.rows, v.inner, [&](auto lanes, unsigned grid, unsigned threads) {
    using P = decltype(lanes);
    withRowPacks<T>(v.inner, [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      layerNormKernel<P, V, T><<<grid, threads, 0, detail::stream()>>>(x, v.rows, v.inner, g, b, y, mean, invStd,
                                                                       epsilon, norm);
    }, x, y, g, b);
  });
  detail::checkLaunch(op);
}

template <class T>
void layerNormGradT(const T *dy, const T *x, const Shape &xs, const float *scale, const Shape &ss, T *dx, int64_t axis,
                    float epsilon, RowNorm norm, const Workspace &workspace) {
  const char *op = "nn.layer_norm_grad";
  const RowView v = rowView(op, xs, axis);
  Scratch scratch(op, workspace, layerNormGradScratch(ScratchTarget::Cuda, xs, ss, axis));
  const float *g = expandedParam(op, scale, ss, v, scratch);
  if (v.rows == 0 || v.inner == 0) return;
  launchPerRow(v.rows, v.inner, [&](auto lanes, unsigned grid, unsigned threads) {
    using P = decltype(lanes);
    withRowPacks<T>(v.inner, [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      layerNormGradKernel<P, V, T><<<grid, threads, 0, detail::stream()>>>(dy, x, v.rows, v.inner, g, dx, epsilon,
                                                                           norm);
    }, dy, x, dx, g);
  });
  detail::checkLaunch(op);
}

template <class T>
void layerNormParamGradT(const T *dy, const T *x, const Shape &xs, const Shape &ps, float *dscale, float *dbias,
                         int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace, bool accumulate) {
  const char *op = "nn.layer_norm_param_grad";
  const RowView v = rowView(op, xs, axis);
  if (!broadcastsTo(ps, v.normalized))
    fail(op, "parameter shape " + ps.str() + " does not broadcast to " + v.normalized.str());
  const int64_t outCount = ps.numel();
  if (outCount == 0) return;

  // How the normalized shape sums down to ps (no reduced axis when ps has
  // every element).
  SumDown m;
  m.rank = v.normalized.size;
  {
    const int lead = v.normalized.size - ps.size;
    int64_t acc = 1;
    for (int a = m.rank - 1; a >= 0; --a) {
      m.nDims[a] = v.normalized.v[a];
      m.nStr[a] = acc;
      acc *= m.nDims[a];
      m.pDims[a] = a >= lead ? ps.v[a - lead] : 1;
      m.reduced[a] = m.pDims[a] == 1 && m.nDims[a] != 1;
      if (m.reduced[a]) m.reducedCount *= m.nDims[a];
    }
  }

  // Rows in chunks of about sqrt(rows) rows (at most
  // plan::kCudaLayerNormMaxRowsPerChunk): partial column sums per chunk,
  // then the chunks combined in order.
  const int64_t rowsPerChunk = plan::cudaLayerNormRowsPerChunk(v.rows);
  const int64_t chunks = plan::cudaLayerNormChunks(v.rows);
  const int64_t partials = chunks * v.inner;
  Scratch scratch(op, workspace, layerNormParamGradScratch(ScratchTarget::Cuda, xs, ps, axis, dbias != nullptr));
  double *pScale = scratch.shared<double>(partials);
  double *pBias = dbias ? scratch.shared<double>(partials) : nullptr;
  if (partials > 0) {
    withRowPacks<T>(v.inner, [&](auto pack) {
      constexpr int V = decltype(pack)::value;
      const int64_t tiles = (v.inner / V + 31) / 32; // 32 packs of V columns each
      layerNormChunkPartialKernel<V, T><<<segmentBlocks(chunks * tiles), 32 * kChunkPartialWarps, 0,
                                          detail::stream()>>>(dy, x, v.rows, v.inner, rowsPerChunk, chunks, tiles,
                                                              epsilon, norm, pScale, pBias);
    }, dy, x);
    detail::checkLaunch(op);
  }
  layerNormFinishKernel<<<detail::blocksFor(outCount), detail::kThreads, 0, detail::stream()>>>(
      pScale, pBias, partials > 0 ? chunks : 0, v.inner, m, outCount, dscale, dbias, accumulate);
  detail::checkLaunch(op);
}
} // namespace

void layerNorm(const float *x, const Shape &xs, const float *scale, const Shape &ss, const float *bias, const Shape &bs,
               float *y, float *mean, float *invStd, int64_t axis, float epsilon, RowNorm norm,
               const Workspace &workspace) {
  layerNormT(x, xs, scale, ss, bias, bs, y, mean, invStd, axis, epsilon, norm, workspace);
}
void layerNorm(const bf16 *x, const Shape &xs, const float *scale, const Shape &ss, const float *bias, const Shape &bs,
               bf16 *y, float *mean, float *invStd, int64_t axis, float epsilon, RowNorm norm,
               const Workspace &workspace) {
  layerNormT(x, xs, scale, ss, bias, bs, y, mean, invStd, axis, epsilon, norm, workspace);
}
void layerNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const Shape &ss, float *dx,
                   int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace) {
  layerNormGradT(dy, x, xs, scale, ss, dx, axis, epsilon, norm, workspace);
}
void layerNormGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const float *scale, const Shape &ss, bf16 *dx,
                   int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace) {
  layerNormGradT(dy, x, xs, scale, ss, dx, axis, epsilon, norm, workspace);
}
void layerNormParamGrad(const float *dy, const float *x, const Shape &xs, const Shape &ps, float *dscale, float *dbias,
                        int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace, bool accumulate) {
  layerNormParamGradT(dy, x, xs, ps, dscale, dbias, axis, epsilon, norm, workspace, accumulate);
}
void layerNormParamGrad(const bf16 *dy, const bf16 *x, const Shape &xs, const Shape &ps, float *dscale, float *dbias,
                        int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace, bool accumulate) {
  layerNormParamGradT(dy, x, xs, ps, dscale, dbias, axis, epsilon, norm, workspace, accumulate);
}

} // namespace pipec::kernels::cuda
