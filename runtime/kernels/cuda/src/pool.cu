// Max, average and global average pooling with their gradients (N-d), as
// the CPU kernels (runtime/kernels/src/pool.cpp). Forward: one thread per
// output element walking its window in row-major order. Gradients: one
// thread per input element gathering from the windows that contain it, in
// row-major output order (the CPU kernel's accumulation order): no atomics,
// deterministic. Global average pooling: one block per plane, double sum.
// Every kernel is templated on the storage (float, or bf16 widened on load
// and rounded once on store). Channels-last (NHWC) tensors have kernels of
// their own, in which the threads of a warp take consecutive channels.
#include "kernel_plan.h"
#include "nn_common.cuh"

#include <algorithm>
#include <cmath>

namespace pipec::kernels::cuda {

namespace {

using namespace nn;

using kernels::PoolGeom;
using kernels::poolGeom;

/// The spatial axes: SP when the kernel is instantiated for them (1, 2 or
/// 3: loops over axes unroll, so that the per-axis arrays below stay in
/// registers; with a run-time count they lived in a 256-512 byte stack
/// frame per thread), else g.sp (SP 0).
template <int SP> __device__ __forceinline__ int spatialAxes(const PoolGeom &g) { return SP > 0 ? SP : g.sp; }

/// Window `o` along axis a: its start in the input (begin pad subtracted),
/// the kernel indices [lo, hi) inside the input, and how many kernel
/// indices lie inside the padded input (CPU poolGeom).
__device__ __forceinline__ void windowAxis(const PoolGeom &g, int a, int64_t o, int64_t &st, int64_t &lo,
                                           int64_t &hi, int64_t &padded) {
  st = o * g.s[a] - g.pb[a];
  const int64_t d = g.d[a], k = g.k[a], start = st;
  auto firstAtLeast = [&](int64_t bound) -> int64_t { // smallest k with st + k*d >= bound
    return start >= bound ? 0 : (bound - start + d - 1) / d;
  };
  lo = min(firstAtLeast(0), k);
  hi = max(lo, min(firstAtLeast(g.in[a]), k));
  padded = min(firstAtLeast(g.in[a] + g.pe[a]), k);
}

/// The window of flat output position o (within a plane).
struct Window {
  int64_t st[kMaxRank], lo[kMaxRank], hi[kMaxRank], padded[kMaxRank];
};
template <int SP> __device__ __forceinline__ void outputWindow(const PoolGeom &g, int64_t o, Window &w) {
PIPEC_UNROLL
  for (int a = spatialAxes<SP>(g) - 1; a >= 0; --a) {
    const int64_t oa = o % g.out[a];
    o /= g.out[a];
    windowAxis(g, a, oa, w.st[a], w.lo[a], w.hi[a], w.padded[a]);
  }
}

/// Calls f(input offset) for the window positions inside the input, in
/// row-major kernel order (CPU forEachInWindow).
template <int SP, class F> __device__ void forEachInWindow(const PoolGeom &g, const Window &w, F &&f) {
  int64_t kidx[kMaxRank];
  const int sp = spatialAxes<SP>(g), last = sp - 1;
PIPEC_UNROLL
  for (int a = 0; a < sp; ++a) {
    if (w.lo[a] >= w.hi[a]) return;
    kidx[a] = w.lo[a];
  }
  for (;;) {
    int64_t base = 0;
PIPEC_UNROLL
    for (int a = 0; a < last; ++a) base += (w.st[a] + kidx[a] * g.d[a]) * g.inStr[a];
    base += w.st[last];
    for (int64_t kk = w.lo[last]; kk < w.hi[last]; ++kk) f(base + kk * g.d[last]);
    bool carried = true; // past the window's last position along every outer axis
PIPEC_UNROLL
    for (int a = last - 1; a >= 0; --a) {
      if (!carried) continue;
      if (++kidx[a] < w.hi[a]) carried = false;
      else kidx[a] = w.lo[a];
    }
    if (carried) return;
  }
}

/// The divisor of one average-pool window (CPU windowCount).
template <int SP>
__device__ __forceinline__ int64_t windowCount(const PoolGeom &g, const Window &w, bool countIncludePad) {
  int64_t count = 1;
PIPEC_UNROLL
  for (int a = 0; a < spatialAxes<SP>(g); ++a) count *= countIncludePad ? w.padded[a] : w.hi[a] - w.lo[a];
  return count;
}

/// The output positions whose windows may contain input position q of a
/// plane: per axis [first, last] (both inside [0, out)); false when none.
struct OutputRange {
  int64_t pos[kMaxRank], first[kMaxRank], last[kMaxRank];
};
template <int SP> __device__ __forceinline__ bool outputRange(const PoolGeom &g, int64_t q, OutputRange &r) {
  bool any = true;
PIPEC_UNROLL
  for (int a = spatialAxes<SP>(g) - 1; a >= 0; --a) {
    const int64_t p = q % g.in[a];
    q /= g.in[a];
    r.pos[a] = p;
    // Window o covers o*s - pb + kk*d, kk in [0, k): o*s in [p + pb - (k-1)*d, p + pb].
    const int64_t lowest = p + g.pb[a] - (g.k[a] - 1) * g.d[a];
    const int64_t first = lowest <= 0 ? 0 : (lowest + g.s[a] - 1) / g.s[a];
    const int64_t last = min((p + g.pb[a]) / g.s[a], g.out[a] - 1);
    r.first[a] = first;
    r.last[a] = last;
    if (first > last) any = false;
  }
  return any;
}

/// Calls f(flat output position, per-axis output index) for every output
/// position of the range, in row-major order.
template <int SP, class F> __device__ void forEachInRange(const PoolGeom &g, const OutputRange &r, F &&f) {
  int64_t oidx[kMaxRank];
  const int sp = spatialAxes<SP>(g);
PIPEC_UNROLL
  for (int a = 0; a < sp; ++a) oidx[a] = r.first[a];
  for (;;) {
    int64_t o = 0;
PIPEC_UNROLL
    for (int a = 0; a < sp; ++a) o += oidx[a] * g.outStr[a];
    f(o, oidx);
    bool carried = true; // past the range's last position along every axis
PIPEC_UNROLL
    for (int a = sp - 1; a >= 0; --a) {
      if (!carried) continue;
      if (++oidx[a] <= r.last[a]) carried = false;
      else oidx[a] = r.first[a];
    }
    if (carried) return;
  }
}

template <class T, int SP> __global__ void maxPoolKernel(PoolGeom g, const T *x, T *y) {
  const int64_t total = g.planes * g.outSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t p = i / g.outSize, o = i - p * g.outSize;
    const T *xp = x + p * g.inSize;
    Window w;
    outputWindow<SP>(g, o, w);
    float best = -INFINITY;
    forEachInWindow<SP>(g, w, [&](int64_t off) {
      const float v = toF(xp[off]);
      best = v > best ? v : best;
    });
    y[i] = fromF<T>(best);
  }
}

/// The first maximum of each window (in-plane input offset, -1 for a window
/// with no position inside the input), as the CPU gradient picks it.
template <class T, int SP> __global__ void maxPoolArgKernel(PoolGeom g, const T *x, int64_t *args) {
  const int64_t total = g.planes * g.outSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t p = i / g.outSize, o = i - p * g.outSize;
    const T *xp = x + p * g.inSize;
    Window w;
    outputWindow<SP>(g, o, w);
    int64_t arg = -1;
    float best = 0.0f;
    forEachInWindow<SP>(g, w, [&](int64_t off) {
      const float v = toF(xp[off]);
      if (arg < 0 || v > best) {
        arg = off;
        best = v;
      }
    });
    args[i] = arg;
  }
}

/// dx[p, q] = Σ dy[p, o] over the windows o (row-major) whose first maximum is q.
template <class T, int SP> __global__ void maxPoolGradKernel(PoolGeom g, const T *dy, const int64_t *args, T *dx) {
  const int64_t total = g.planes * g.inSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t p = i / g.inSize, q = i - p * g.inSize;
    const T *dyp = dy + p * g.outSize;
    const int64_t *argp = args + p * g.outSize;
    float sum = 0.0f;
    OutputRange r;
    if (outputRange<SP>(g, q, r))
      forEachInRange<SP>(g, r, [&](int64_t o, const int64_t *) {
        if (argp[o] == q) sum += toF(dyp[o]);
      });
    dx[i] = fromF<T>(sum);
  }
}

template <class T, int SP> __global__ void averagePoolKernel(PoolGeom g, const T *x, T *y, bool countIncludePad) {
  const int64_t total = g.planes * g.outSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t p = i / g.outSize, o = i - p * g.outSize;
    const T *xp = x + p * g.inSize;
    Window w;
    outputWindow<SP>(g, o, w);
    float sum = 0.0f;
    forEachInWindow<SP>(g, w, [&](int64_t off) { sum += toF(xp[off]); });
    y[i] = fromF<T>(sum / (float)windowCount<SP>(g, w, countIncludePad));
  }
}

/// dx[p, q] = Σ dy[p, o] / count(o) over the windows o (row-major) that
/// contain q.
template <class T, int SP> __global__ void averagePoolGradKernel(PoolGeom g, const T *dy, T *dx, bool countIncludePad) {
  const int64_t total = g.planes * g.inSize;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t p = i / g.inSize, q = i - p * g.inSize;
    const T *dyp = dy + p * g.outSize;
    float sum = 0.0f;
    OutputRange r;
    if (outputRange<SP>(g, q, r))
      forEachInRange<SP>(g, r, [&](int64_t o, const int64_t *oidx) {
        Window w;
        bool inside = true;
PIPEC_UNROLL
        for (int a = 0; a < spatialAxes<SP>(g); ++a) {
          windowAxis(g, a, oidx[a], w.st[a], w.lo[a], w.hi[a], w.padded[a]);
          const int64_t t = r.pos[a] - w.st[a]; // = kk * d for a kernel index kk
          if (t < 0 || t % g.d[a] != 0 || t / g.d[a] >= g.k[a]) inside = false;
        }
        if (inside) sum += toF(dyp[o]) / (float)windowCount<SP>(g, w, countIncludePad);
      });
    dx[i] = fromF<T>(sum);
  }
}

template <class T> __global__ void globalAveragePoolKernel(const T *x, T *y, int64_t planes, int64_t inner) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    const T *xp = x + p * inner;
    double sum = 0;
    for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) sum += toF(xp[i]);
    sum = blockSum(sum);
    if (threadIdx.x == 0) y[p] = fromF<T>((float)(sum / (double)inner));
  }
}

//===----------------------------------------------------------------------===//
// Channels-last: x, y, dy, dx [N, d..., C]
//===----------------------------------------------------------------------===//
// A thread per (sample, position, V consecutive channels), channels fastest:
// a warp's threads take consecutive channels of one position, V at a time
// (one 16-byte load) when C is a multiple of kPackOf<T> and the tensors are
// aligned for it. Each channel's window or output range is walked in the
// order of the kernels above, so the results are theirs bit for bit.

/// The work item of element (n, position, channel c) of [N, positions, C]:
/// t = n * positions + position, c its first channel.
template <int V> __device__ __forceinline__ void lastItem(int64_t i, int64_t C, int64_t &t, int64_t &c) {
  const int64_t packs = C / V;
  t = i / packs;
  c = (i - t * packs) * V;
}

template <class T, int SP, int V>
__global__ void maxPoolLastKernel(PoolGeom g, int64_t N, int64_t C, const T *x, T *y) {
  const int64_t total = N * g.outSize * (C / V);
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    int64_t t, c;
    lastItem<V>(i, C, t, c);
    const int64_t n = t / g.outSize;
    const T *xn = x + n * g.inSize * C + c;
    Window w;
    outputWindow<SP>(g, t - n * g.outSize, w);
    float best[V];
    for (int e = 0; e < V; ++e) best[e] = -INFINITY;
    forEachInWindow<SP>(g, w, [&](int64_t off) {
      const Packed<T, V> p = loadPacked<V>(xn + off * C);
      for (int e = 0; e < V; ++e) {
        const float v = toF(p.v[e]);
        best[e] = v > best[e] ? v : best[e];
      }
    });
    Packed<T, V> out;
    for (int e = 0; e < V; ++e) out.v[e] = fromF<T>(best[e]);
    storePacked(y + t * C + c, out);
  }
}

/// args [N, out..., C]: the first maximum of each channel's window (its
/// in-plane input position, -1 for none), as maxPoolArgKernel.
template <class T, int SP, int V>
__global__ void maxPoolArgLastKernel(PoolGeom g, int64_t N, int64_t C, const T *x, int64_t *args) {
  const int64_t total = N * g.outSize * (C / V);
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    int64_t t, c;
    lastItem<V>(i, C, t, c);
    const int64_t n = t / g.outSize;
    const T *xn = x + n * g.inSize * C + c;
    Window w;
    outputWindow<SP>(g, t - n * g.outSize, w);
    int64_t arg[V];
    float best[V];
    for (int e = 0; e < V; ++e) arg[e] = -1, best[e] = 0.0f;
    forEachInWindow<SP>(g, w, [&](int64_t off) {
      const Packed<T, V> p = loadPacked<V>(xn + off * C);
      for (int e = 0; e < V; ++e) {
        const float v = toF(p.v[e]);
        if (arg[e] < 0 || v > best[e]) {
          arg[e] = off;
          best[e] = v;
        }
      }
    });
    for (int e = 0; e < V; ++e) args[t * C + c + e] = arg[e];
  }
}

template <class T, int SP, int V>
__global__ void maxPoolGradLastKernel(PoolGeom g, int64_t N, int64_t C, const T *dy, const int64_t *args, T *dx) {
  const int64_t total = N * g.inSize * (C / V);
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    int64_t t, c;
    lastItem<V>(i, C, t, c);
    const int64_t n = t / g.inSize, q = t - n * g.inSize, first = n * g.outSize * C + c;
    float sum[V] = {};
    OutputRange r;
    if (outputRange<SP>(g, q, r))
      forEachInRange<SP>(g, r, [&](int64_t o, const int64_t *) {
        const Packed<T, V> d = loadPacked<V>(dy + first + o * C);
        for (int e = 0; e < V; ++e)
          if (args[first + o * C + e] == q) sum[e] += toF(d.v[e]);
      });
    Packed<T, V> out;
    for (int e = 0; e < V; ++e) out.v[e] = fromF<T>(sum[e]);
    storePacked(dx + t * C + c, out);
  }
}

template <class T, int SP, int V>
__global__ void averagePoolLastKernel(PoolGeom g, int64_t N, int64_t C, const T *x, T *y, bool countIncludePad) {
  const int64_t total = N * g.outSize * (C / V);
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    int64_t t, c;
    lastItem<V>(i, C, t, c);
    const int64_t n = t / g.outSize;
    const T *xn = x + n * g.inSize * C + c;
    Window w;
    outputWindow<SP>(g, t - n * g.outSize, w);
    float sum[V] = {};
    forEachInWindow<SP>(g, w, [&](int64_t off) {
      const Packed<T, V> p = loadPacked<V>(xn + off * C);
      for (int e = 0; e < V; ++e) sum[e] += toF(p.v[e]);
    });
    const float count = (float)windowCount<SP>(g, w, countIncludePad);
    Packed<T, V> out;
    for (int e = 0; e < V; ++e) out.v[e] = fromF<T>(sum[e] / count);
    storePacked(y + t * C + c, out);
  }
}

template <class T, int SP, int V>
__global__ void averagePoolGradLastKernel(PoolGeom g, int64_t N, int64_t C, const T *dy, T *dx,
                                          bool countIncludePad) {
  const int64_t total = N * g.inSize * (C / V);
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    int64_t t, c;
    lastItem<V>(i, C, t, c);
    const int64_t n = t / g.inSize, q = t - n * g.inSize;
    const T *dyn = dy + n * g.outSize * C + c;
    float sum[V] = {};
    OutputRange r;
    if (outputRange<SP>(g, q, r))
      forEachInRange<SP>(g, r, [&](int64_t o, const int64_t *oidx) {
        Window w;
        bool inside = true;
PIPEC_UNROLL
        for (int a = 0; a < spatialAxes<SP>(g); ++a) {
          windowAxis(g, a, oidx[a], w.st[a], w.lo[a], w.hi[a], w.padded[a]);
          const int64_t k = r.pos[a] - w.st[a]; // = kk * d for a kernel index kk
          if (k < 0 || k % g.d[a] != 0 || k / g.d[a] >= g.k[a]) inside = false;
        }
        if (!inside) return;
        const float count = (float)windowCount<SP>(g, w, countIncludePad);
        const Packed<T, V> d = loadPacked<V>(dyn + o * C);
        for (int e = 0; e < V; ++e) sum[e] += toF(d.v[e]) / count;
      });
    Packed<T, V> out;
    for (int e = 0; e < V; ++e) out.v[e] = fromF<T>(sum[e]);
    storePacked(dx + t * C + c, out);
  }
}

/// y [N, C] = the mean of x [N, P, C] over P: a block per (sample, tile of
/// 32 channels), lane l of every warp on channel tile * 32 + l, warp w
/// summing positions w, w + kGlobalPoolWarps, ... in double; the warps'
/// sums then added in warp order (fixed by the shape alone).
constexpr int kGlobalPoolWarps = 8;
template <class T>
__global__ void __launch_bounds__(32 * kGlobalPoolWarps)
    globalAveragePoolLastKernel(const T *x, T *y, int64_t N, int64_t P, int64_t C, int64_t tiles) {
  __shared__ double warpSum[kGlobalPoolWarps][32];
  const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32;
  for (int64_t b = blockIdx.x; b < N * tiles; b += gridDim.x) {
    const int64_t n = b / tiles, c = (b - n * tiles) * 32 + lane;
    double sum = 0;
    if (c < C)
      for (int64_t p = warp; p < P; p += kGlobalPoolWarps) sum += toF(x[(n * P + p) * C + c]);
    warpSum[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && c < C) {
      double total = 0;
      for (int w = 0; w < kGlobalPoolWarps; ++w) total += warpSum[w][lane];
      y[n * C + c] = fromF<T>((float)(total / (double)P));
    }
    __syncthreads(); // warpSum is read before the next tile reuses it
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// nn.max_pool, nn.average_pool (+ _grad), nn.global_average_pool
//===----------------------------------------------------------------------===//

namespace {

/// Calls launch(std::integral_constant<int, SP>) with SP = g.sp for 1-3
/// spatial axes (the kernels' unrolled instances), else 0 (a run-time count).
template <class Launch> void forSpatialAxes(const PoolGeom &g, Launch &&launch) {
  switch (g.sp) {
  case 1: launch(std::integral_constant<int, 1>{}); break;
  case 2: launch(std::integral_constant<int, 2>{}); break;
  case 3: launch(std::integral_constant<int, 3>{}); break;
  default: launch(std::integral_constant<int, 0>{}); break;
  }
}

/// A pooling call's geometry and, channels-last, x's channels and samples.
struct PoolCall {
  PoolGeom g;
  bool last;
  int64_t N = 0, C = 0;
  PoolCall(const char *op, const Shape &xs, const Dims &kernel, const Dims &strides, const Dims &pads,
           const Dims &dilations, bool ceilMode, bool channelsLast)
      : g(poolGeom(op, channelsLast ? plan::channelsFirstShape(xs) : xs, kernel, strides, pads, dilations,
                   ceilMode)),
        last(channelsLast) {
    if (last) N = xs.v[0], C = xs.v[xs.size - 1];
  }
  /// Calls launch(SP, V, grid) for the channels-last kernels over `positions`
  /// per sample: V = kPackOf<T> channels a thread when C is a multiple of it
  /// and every tensor is aligned for it, else 1.
  template <class T, class Launch> void launchLast(int64_t positions, Launch &&launch, const T *a, const T *b) const {
    constexpr int kPack = kPackOf<T>;
    const bool packs = C % kPack == 0 && packedAligned<kPack>(a, b);
    forSpatialAxes(g, [&](auto axes) {
      if (packs)
        launch(axes, std::integral_constant<int, kPack>{}, detail::blocksFor(N * positions * (C / kPack)));
      else
        launch(axes, std::integral_constant<int, 1>{}, detail::blocksFor(N * positions * C));
    });
  }
};

template <class T>
void maxPoolT(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,
             const Dims &dilations, bool ceilMode, bool channelsLast) {
  const char *op = "nn.max_pool";
  const PoolCall call(op, xs, kernel, strides, pads, dilations, ceilMode, channelsLast);
  const PoolGeom &g = call.g;
  const int64_t total = g.planes * g.outSize;
  if (total == 0) return;
  if (call.last) {
    call.launchLast<T>(g.outSize, [&](auto axes, auto pack, unsigned grid) {
      constexpr int SP = decltype(axes)::value, V = decltype(pack)::value;
      maxPoolLastKernel<T, SP, V><<<grid, detail::kThreads, 0, detail::stream()>>>(g, call.N, call.C, x, y);
    }, x, y);
  } else {
    forSpatialAxes(g, [&](auto axes) {
      constexpr int SP = decltype(axes)::value;
      maxPoolKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, x, y);
    });
  }
  detail::checkLaunch(op);
}

template <class T>
void maxPoolGradT(const T *dy, const T *x, const Shape &xs, T *dx, const Dims &kernel, const Dims &strides,
                 const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &workspace,
                 bool channelsLast) {
  const char *op = "nn.max_pool_grad";
  const PoolCall call(op, xs, kernel, strides, pads, dilations, ceilMode, channelsLast);
  const PoolGeom &g = call.g;
  const int64_t outputs = g.planes * g.outSize, inputs = g.planes * g.inSize;
  if (inputs == 0) return;
  Scratch scratch(op, workspace,
                  poolScratch(ScratchTarget::Cuda, xs, kernel, strides, pads, dilations, ceilMode, true, channelsLast));
  int64_t *args = scratch.shared<int64_t>(outputs);
  if (call.last) {
    // The arg max per window, x's layout (dy's), then the gathers.
    call.launchLast<T>(g.outSize, [&](auto axes, auto pack, unsigned grid) {
      constexpr int SP = decltype(axes)::value, V = decltype(pack)::value;
      maxPoolArgLastKernel<T, SP, V><<<grid, detail::kThreads, 0, detail::stream()>>>(g, call.N, call.C, x, args);
    }, x, x);
    detail::checkLaunch(op);
    call.launchLast<T>(g.inSize, [&](auto axes, auto pack, unsigned grid) {
      constexpr int SP = decltype(axes)::value, V = decltype(pack)::value;
      maxPoolGradLastKernel<T, SP, V><<<grid, detail::kThreads, 0, detail::stream()>>>(g, call.N, call.C, dy, args,
                                                                                       dx);
    }, dy, dx);
  } else {
    forSpatialAxes(g, [&](auto axes) {
      constexpr int SP = decltype(axes)::value;
      maxPoolArgKernel<T, SP><<<detail::blocksFor(outputs), detail::kThreads, 0, detail::stream()>>>(g, x, args);
      detail::checkLaunch(op);
      maxPoolGradKernel<T, SP><<<detail::blocksFor(inputs), detail::kThreads, 0, detail::stream()>>>(g, dy, args,
                                                                                                    dx);
    });
  }
  detail::checkLaunch(op);
}

template <class T>
void averagePoolT(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,
                 bool ceilMode, bool countIncludePad, bool channelsLast) {
  const char *op = "nn.average_pool";
  const PoolCall call(op, xs, kernel, strides, pads, Dims{}, ceilMode, channelsLast);
  const PoolGeom &g = call.g;
  const int64_t total = g.planes * g.outSize;
  if (total == 0) return;
  if (call.last) {
    call.launchLast<T>(g.outSize, [&](auto axes, auto pack, unsigned grid) {
      constexpr int SP = decltype(axes)::value, V = decltype(pack)::value;
      averagePoolLastKernel<T, SP, V><<<grid, detail::kThreads, 0, detail::stream()>>>(g, call.N, call.C, x, y,
                                                                                       countIncludePad);
    }, x, y);
  } else {
    forSpatialAxes(g, [&](auto axes) {
      constexpr int SP = decltype(axes)::value;
      averagePoolKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, x, y,
                                                                                                  countIncludePad);
    });
  }
  detail::checkLaunch(op);
}

template <class T>
void averagePoolGradT(const T *dy, T *dx, const Shape &xs, const Dims &kernel, const Dims &strides,
                     const Dims &pads, bool ceilMode, bool countIncludePad, bool channelsLast) {
  const char *op = "nn.average_pool_grad";
  const PoolCall call(op, xs, kernel, strides, pads, Dims{}, ceilMode, channelsLast);
  const PoolGeom &g = call.g;
  const int64_t total = g.planes * g.inSize;
  if (total == 0) return;
  if (call.last) {
    call.launchLast<T>(g.inSize, [&](auto axes, auto pack, unsigned grid) {
      constexpr int SP = decltype(axes)::value, V = decltype(pack)::value;
      averagePoolGradLastKernel<T, SP, V><<<grid, detail::kThreads, 0, detail::stream()>>>(g, call.N, call.C, dy,
                                                                                           dx, countIncludePad);
    }, dy, dx);
  } else {
    forSpatialAxes(g, [&](auto axes) {
      constexpr int SP = decltype(axes)::value;
      averagePoolGradKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(
          g, dy, dx, countIncludePad);
    });
  }
  detail::checkLaunch(op);
}

template <class T> void globalAveragePoolT(const T *x, const Shape &xs, T *y, bool channelsLast) {
  const char *op = "nn.global_average_pool";
  checkRank(op, xs, 3, "the input (N, C, spatial...)");
  if (channelsLast) { // x [N, d..., C], y [N, 1..., C]
    const int64_t N = xs.v[0], C = xs.v[xs.size - 1], P = productOf(xs, 1, xs.size - 1), tiles = (C + 31) / 32;
    if (N * C == 0) return;
    globalAveragePoolLastKernel<T><<<segmentBlocks(N * tiles), 32 * kGlobalPoolWarps, 0, detail::stream()>>>(
        x, y, N, P, C, tiles);
    detail::checkLaunch(op);
    return;
  }
  const int64_t planes = xs.v[0] * xs.v[1], inner = productOf(xs, 2, xs.size);
  if (planes == 0) return;
  globalAveragePoolKernel<T><<<segmentBlocks(planes), segmentThreads(inner), 0, detail::stream()>>>(x, y, planes,
                                                                                                 inner);
  detail::checkLaunch(op);
}

} // namespace

#define PIPEC_POOLING_FOR(T)                                                                                           \
  void maxPool(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,          \
               const Dims &dilations, bool ceilMode, bool channelsLast) {                                              \
    maxPoolT(x, xs, y, kernel, strides, pads, dilations, ceilMode, channelsLast);                                      \
  }                                                                                                                    \
  void maxPoolGrad(const T *dy, const T *x, const Shape &xs, T *dx, const Dims &kernel, const Dims &strides,          \
                   const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &workspace,                 \
                   bool channelsLast) {                                                                                \
    maxPoolGradT(dy, x, xs, dx, kernel, strides, pads, dilations, ceilMode, workspace, channelsLast);                  \
  }                                                                                                                    \
  void averagePool(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,      \
                   bool ceilMode, bool countIncludePad, bool channelsLast) {                                           \
    averagePoolT(x, xs, y, kernel, strides, pads, ceilMode, countIncludePad, channelsLast);                            \
  }                                                                                                                    \
  void averagePoolGrad(const T *dy, T *dx, const Shape &xs, const Dims &kernel, const Dims &strides,                  \
                       const Dims &pads, bool ceilMode, bool countIncludePad, bool channelsLast) {                     \
    averagePoolGradT(dy, dx, xs, kernel, strides, pads, ceilMode, countIncludePad, channelsLast);                      \
  }                                                                                                                    \
  void globalAveragePool(const T *x, const Shape &xs, T *y, bool channelsLast) {                                       \
    globalAveragePoolT(x, xs, y, channelsLast);                                                                        \
  }
PIPEC_POOLING_FOR(float)
PIPEC_POOLING_FOR(bf16)
#undef PIPEC_POOLING_FOR

// The channels-first float calls pipec/kernel_api.inc declares for both
// libraries (without channelsLast).
void maxPoolGrad(const float *dy, const float *x, const Shape &xs, float *dx, const Dims &kernel,
                 const Dims &strides, const Dims &pads, const Dims &dilations, bool ceilMode,
                 const Workspace &workspace) {
  maxPoolGradT(dy, x, xs, dx, kernel, strides, pads, dilations, ceilMode, workspace, false);
}
void globalAveragePool(const float *x, const Shape &xs, float *y) { globalAveragePoolT(x, xs, y, false); }

} // namespace pipec::kernels::cuda
