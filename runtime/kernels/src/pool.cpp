// Max, average and global average pooling with their gradients (N-d).
#include "detail.h"

#include <cmath>
#include <limits>

namespace pipec::kernels {

using namespace detail;

namespace {
/// The shared geometry plus, per spatial axis and output index: where the
/// window starts in the input (begin pad subtracted), the kernel indices
/// [lo, hi) that land inside the input, and how many land inside the padded
/// input. The tables live in the call's scratch (poolScratch).
struct PoolWindows : PoolGeom {
  int64_t *start[kMaxRank] = {}, *lo[kMaxRank] = {}, *hi[kMaxRank] = {}, *padded[kMaxRank] = {};
};

PoolWindows poolWindows(const char *op, const Shape &xs, const Dims &kernel, const Dims &strides, const Dims &pads,
                        const Dims &dilations, bool ceilMode, Scratch &scratch) {
  PoolWindows g;
  static_cast<PoolGeom &>(g) = poolGeom(op, xs, kernel, strides, pads, dilations, ceilMode);
  for (int a = 0; a < g.sp; ++a) {
    g.start[a] = scratch.shared<int64_t>(g.out[a]);
    g.lo[a] = scratch.shared<int64_t>(g.out[a]);
    g.hi[a] = scratch.shared<int64_t>(g.out[a]);
    g.padded[a] = scratch.shared<int64_t>(g.out[a]);
    for (int64_t o = 0; o < g.out[a]; ++o) {
      const int64_t st = o * g.s[a] - g.pb[a];
      auto firstAtLeast = [&](int64_t bound) { // smallest k with st + k*d >= bound
        return st >= bound ? 0 : (bound - st + g.d[a] - 1) / g.d[a];
      };
      const int64_t l = std::min(firstAtLeast(0), g.k[a]);
      const int64_t h = std::max(l, std::min(firstAtLeast(g.in[a]), g.k[a]));
      const int64_t p = std::min(firstAtLeast(g.in[a] + g.pe[a]), g.k[a]); // from k = 0: st >= -pb
      g.start[a][o] = st;
      g.lo[a][o] = l;
      g.hi[a][o] = h;
      g.padded[a][o] = p;
    }
  }
  return g;
}

/// Calls f(outFlat, oidx) for every output position of one plane.
template <class F> void forEachOutput(const PoolWindows &g, F &&f) {
  int64_t oidx[kMaxRank] = {};
  for (int64_t o = 0; o < g.outSize; ++o) {
    f(o, oidx);
    for (int a = g.sp - 1; a >= 0; --a) {
      if (++oidx[a] < g.out[a]) break;
      oidx[a] = 0;
    }
  }
}

/// Calls f(inputOffset) for the window positions of output oidx that lie in
/// the input, in row-major kernel order.
template <class F> void forEachInWindow(const PoolWindows &g, const int64_t *oidx, F &&f) {
  int64_t kidx[kMaxRank], lo[kMaxRank], hi[kMaxRank], st[kMaxRank];
  for (int a = 0; a < g.sp; ++a) {
    lo[a] = g.lo[a][oidx[a]];
    hi[a] = g.hi[a][oidx[a]];
    st[a] = g.start[a][oidx[a]];
    if (lo[a] >= hi[a]) return;
    kidx[a] = lo[a];
  }
  const int last = g.sp - 1;
  for (;;) {
    int64_t base = 0;
    for (int a = 0; a < last; ++a) base += (st[a] + kidx[a] * g.d[a]) * g.inStr[a];
    base += st[last];
    for (int64_t kk = lo[last]; kk < hi[last]; ++kk) f(base + kk * g.d[last]);
    int a = last - 1;
    for (; a >= 0; --a) {
      if (++kidx[a] < hi[a]) break;
      kidx[a] = lo[a];
    }
    if (a < 0) return;
  }
}

/// The divisor of one average-pool window.
int64_t windowCount(const PoolWindows &g, const int64_t *oidx, bool countIncludePad) {
  int64_t count = 1;
  for (int a = 0; a < g.sp; ++a)
    count *= countIncludePad ? g.padded[a][oidx[a]] : g.hi[a][oidx[a]] - g.lo[a][oidx[a]];
  return count;
}

Shape poolOut(const Shape &xs, const PoolGeom &g) {
  Shape out{xs.v[0], xs.v[1]};
  for (int a = 0; a < g.sp; ++a) out.push(g.out[a]);
  return out;
}
} // namespace

Shape poolOutputShape(const Shape &x, const Dims &kernel, const Dims &strides, const Dims &pads, const Dims &dilations,
                      bool ceilMode) {
  return poolOut(x, poolGeom("pool", x, kernel, strides, pads, dilations, ceilMode));
}

void maxPool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides, const Dims &pads,
             const Dims &dilations, bool ceilMode, const Workspace &workspace) {
  Scratch scratch("nn.max_pool", workspace,
                  poolScratch(ScratchTarget::Cpu, xs, kernel, strides, pads, dilations, ceilMode, false));
  const PoolWindows g = poolWindows("nn.max_pool", xs, kernel, strides, pads, dilations, ceilMode, scratch);
  // Planes (n, c) are independent: one thread each.
  parallelRanges(g.planes, g.planes * (g.inSize + g.outSize), [&](int64_t pBegin, int64_t pEnd) {
    for (int64_t p = pBegin; p < pEnd; ++p) {
      const float *xp = x + p * g.inSize;
      float *yp = y + p * g.outSize;
      forEachOutput(g, [&](int64_t o, const int64_t *oidx) {
        float best = -std::numeric_limits<float>::infinity();
        forEachInWindow(g, oidx, [&](int64_t off) { best = xp[off] > best ? xp[off] : best; });
        yp[o] = best;
      });
    }
  });
}

void maxPoolGrad(const float *dy, const float *x, const Shape &xs, float *dx, const Dims &kernel, const Dims &strides,
                 const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &workspace) {
  Scratch scratch("nn.max_pool_grad", workspace,
                  poolScratch(ScratchTarget::Cpu, xs, kernel, strides, pads, dilations, ceilMode, true));
  const PoolWindows g = poolWindows("nn.max_pool_grad", xs, kernel, strides, pads, dilations, ceilMode, scratch);
  std::fill(dx, dx + xs.numel(), 0.0f);
  // Planes (n, c) are independent: one thread each.
  parallelRanges(g.planes, g.planes * (g.inSize + g.outSize), [&](int64_t pBegin, int64_t pEnd) {
    for (int64_t p = pBegin; p < pEnd; ++p) {
      const float *xp = x + p * g.inSize;
      const float *dyp = dy + p * g.outSize;
      float *dxp = dx + p * g.inSize;
      forEachOutput(g, [&](int64_t o, const int64_t *oidx) {
        int64_t arg = -1;
        float best = 0.0f;
        forEachInWindow(g, oidx, [&](int64_t off) {
          if (arg < 0 || xp[off] > best) {
            arg = off;
            best = xp[off];
          }
        });
        if (arg >= 0) dxp[arg] += dyp[o];
      });
    }
  });
}

void averagePool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides, const Dims &pads,
                 bool ceilMode, bool countIncludePad, const Workspace &workspace) {
  Scratch scratch("nn.average_pool", workspace,
                  poolScratch(ScratchTarget::Cpu, xs, kernel, strides, pads, Dims{}, ceilMode, false));
  const PoolWindows g = poolWindows("nn.average_pool", xs, kernel, strides, pads, Dims{}, ceilMode, scratch);
  // Planes (n, c) are independent: one thread each.
  parallelRanges(g.planes, g.planes * (g.inSize + g.outSize), [&](int64_t pBegin, int64_t pEnd) {
    for (int64_t p = pBegin; p < pEnd; ++p) {
      const float *xp = x + p * g.inSize;
      float *yp = y + p * g.outSize;
      forEachOutput(g, [&](int64_t o, const int64_t *oidx) {
        float sum = 0.0f;
        forEachInWindow(g, oidx, [&](int64_t off) { sum += xp[off]; });
        yp[o] = sum / (float)windowCount(g, oidx, countIncludePad);
      });
    }
  });
}

void averagePoolGrad(const float *dy, float *dx, const Shape &xs, const Dims &kernel, const Dims &strides,
                     const Dims &pads, bool ceilMode, bool countIncludePad, const Workspace &workspace) {
  Scratch scratch("nn.average_pool_grad", workspace,
                  poolScratch(ScratchTarget::Cpu, xs, kernel, strides, pads, Dims{}, ceilMode, false));
  const PoolWindows g = poolWindows("nn.average_pool_grad", xs, kernel, strides, pads, Dims{}, ceilMode, scratch);
  std::fill(dx, dx + xs.numel(), 0.0f);
  // Planes (n, c) are independent: one thread each.
  parallelRanges(g.planes, g.planes * (g.inSize + g.outSize), [&](int64_t pBegin, int64_t pEnd) {
    for (int64_t p = pBegin; p < pEnd; ++p) {
      const float *dyp = dy + p * g.outSize;
      float *dxp = dx + p * g.inSize;
      forEachOutput(g, [&](int64_t o, const int64_t *oidx) {
        const float share = dyp[o] / (float)windowCount(g, oidx, countIncludePad);
        forEachInWindow(g, oidx, [&](int64_t off) { dxp[off] += share; });
      });
    }
  });
}

void globalAveragePool(const float *x, const Shape &xs, float *y) {
  checkRank("nn.global_average_pool", xs, 3, "the input (N, C, spatial...)");
  const int64_t planes = xs.v[0] * xs.v[1], inner = productOf(xs, 2, xs.size);
  parallelRanges(planes, planes * inner, [&](int64_t pBegin, int64_t pEnd) {
    for (int64_t p = pBegin; p < pEnd; ++p) {
      double sum = 0;
      for (int64_t i = 0; i < inner; ++i) sum += x[p * inner + i];
      y[p] = (float)(sum / (double)inner);
    }
  });
}

} // namespace pipec::kernels
