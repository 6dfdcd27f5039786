// Max, average and global average pooling with their gradients (N-d), as
// the CPU kernels (runtime/kernels/src/pool.cpp). Forward: one thread per
// output element walking its window in row-major order. Gradients: one
// thread per input element gathering from the windows that contain it, in
// row-major output order (the CPU kernel's accumulation order): no atomics,
// deterministic. Global average pooling: one block per plane, double sum.
// Every kernel is templated on the storage (float, or bf16 widened on load
// and rounded once on store).
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

template <class T>
void maxPoolT(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,
             const Dims &dilations, bool ceilMode) {
  const char *op = "nn.max_pool";
  const PoolGeom g = poolGeom(op, xs, kernel, strides, pads, dilations, ceilMode);
  const int64_t total = g.planes * g.outSize;
  if (total == 0) return;
  forSpatialAxes(g, [&](auto axes) {
    constexpr int SP = decltype(axes)::value;
    maxPoolKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, x, y);
  });
  detail::checkLaunch(op);
}

template <class T>
void maxPoolGradT(const T *dy, const T *x, const Shape &xs, T *dx, const Dims &kernel, const Dims &strides,
                 const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &workspace) {
  const char *op = "nn.max_pool_grad";
  const PoolGeom g = poolGeom(op, xs, kernel, strides, pads, dilations, ceilMode);
  const int64_t outputs = g.planes * g.outSize, inputs = g.planes * g.inSize;
  if (inputs == 0) return;
  Scratch scratch(op, workspace, poolScratch(ScratchTarget::Cuda, xs, kernel, strides, pads, dilations, ceilMode, true));
  int64_t *args = scratch.shared<int64_t>(outputs);
  forSpatialAxes(g, [&](auto axes) {
    constexpr int SP = decltype(axes)::value;
    maxPoolArgKernel<T, SP><<<detail::blocksFor(outputs), detail::kThreads, 0, detail::stream()>>>(g, x, args);
    detail::checkLaunch(op);
    maxPoolGradKernel<T, SP><<<detail::blocksFor(inputs), detail::kThreads, 0, detail::stream()>>>(g, dy, args, dx);
  });
  detail::checkLaunch(op);
}

template <class T>
void averagePoolT(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,
                 bool ceilMode, bool countIncludePad) {
  const char *op = "nn.average_pool";
  const PoolGeom g = poolGeom(op, xs, kernel, strides, pads, Dims{}, ceilMode);
  const int64_t total = g.planes * g.outSize;
  if (total == 0) return;
  forSpatialAxes(g, [&](auto axes) {
    constexpr int SP = decltype(axes)::value;
    averagePoolKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(g, x, y,
                                                                                                countIncludePad);
  });
  detail::checkLaunch(op);
}

template <class T>
void averagePoolGradT(const T *dy, T *dx, const Shape &xs, const Dims &kernel, const Dims &strides,
                     const Dims &pads, bool ceilMode, bool countIncludePad) {
  const char *op = "nn.average_pool_grad";
  const PoolGeom g = poolGeom(op, xs, kernel, strides, pads, Dims{}, ceilMode);
  const int64_t total = g.planes * g.inSize;
  if (total == 0) return;
  forSpatialAxes(g, [&](auto axes) {
    constexpr int SP = decltype(axes)::value;
    averagePoolGradKernel<T, SP><<<detail::blocksFor(total), detail::kThreads, 0, detail::stream()>>>(
        g, dy, dx, countIncludePad);
  });
  detail::checkLaunch(op);
}

template <class T> void globalAveragePoolT(const T *x, const Shape &xs, T *y) {
  const char *op = "nn.global_average_pool";
  checkRank(op, xs, 3, "the input (N, C, spatial...)");
  const int64_t planes = xs.v[0] * xs.v[1], inner = productOf(xs, 2, xs.size);
  if (planes == 0) return;
  globalAveragePoolKernel<T><<<segmentBlocks(planes), segmentThreads(inner), 0, detail::stream()>>>(x, y, planes,
                                                                                                 inner);
  detail::checkLaunch(op);
}

} // namespace

#define PIPEC_POOLING_FOR(T)                                                                                           \
  void maxPool(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,          \
               const Dims &dilations, bool ceilMode) {                                                                 \
    maxPoolT(x, xs, y, kernel, strides, pads, dilations, ceilMode);                                                    \
  }                                                                                                                    \
  void maxPoolGrad(const T *dy, const T *x, const Shape &xs, T *dx, const Dims &kernel, const Dims &strides,          \
                   const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &workspace) {               \
    maxPoolGradT(dy, x, xs, dx, kernel, strides, pads, dilations, ceilMode, workspace);                                \
  }                                                                                                                    \
  void averagePool(const T *x, const Shape &xs, T *y, const Dims &kernel, const Dims &strides, const Dims &pads,      \
                   bool ceilMode, bool countIncludePad) {                                                              \
    averagePoolT(x, xs, y, kernel, strides, pads, ceilMode, countIncludePad);                                          \
  }                                                                                                                    \
  void averagePoolGrad(const T *dy, T *dx, const Shape &xs, const Dims &kernel, const Dims &strides,                  \
                       const Dims &pads, bool ceilMode, bool countIncludePad) {                                        \
    averagePoolGradT(dy, dx, xs, kernel, strides, pads, ceilMode, countIncludePad);                                    \
  }                                                                                                                    \
  void globalAveragePool(const T *x, const Shape &xs, T *y) { globalAveragePoolT(x, xs, y); }
PIPEC_POOLING_FOR(float)
PIPEC_POOLING_FOR(bf16)
#undef PIPEC_POOLING_FOR

} // namespace pipec::kernels::cuda
