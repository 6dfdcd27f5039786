// Data movement: gather (and its scatter-add gradient), copy, transpose,
// concat, split, slice (and its gradient), pad, expand.
#include "detail.h"

#include <algorithm>
#include <cstring>

namespace pipec::kernels {

using namespace detail;

template <class T, class I>
void gather(const T *data, const Shape &ds, const I *indices, const Shape &is, int64_t axis, T *out) {
  checkRank("nn.gather", ds, 1, "the data");
  const AxisView v = viewAround(ds, (int)normalizeAxis("nn.gather", axis, ds.size));
  const int64_t count = is.numel();
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      int64_t index = (int64_t)indices[j];
      if (index < -v.size || index >= v.size)
        fail("nn.gather", "index " + std::to_string(index) + " out of range for axis size " + std::to_string(v.size));
      if (index < 0) index += v.size;
      std::memcpy(out + (o * count + j) * v.inner, data + (o * v.size + index) * v.inner, (size_t)v.inner * sizeof(T));
    }
}

template <class I>
void gatherGrad(const float *dy, const I *indices, const Shape &is, int64_t axis, float *dx, const Shape &xs) {
  checkRank("nn.gather_grad", xs, 1, "the data");
  const AxisView v = viewAround(xs, (int)normalizeAxis("nn.gather_grad", axis, xs.size));
  const int64_t count = is.numel();
  std::fill(dx, dx + xs.numel(), 0.0f);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      int64_t index = (int64_t)indices[j];
      if (index < -v.size || index >= v.size)
        fail("nn.gather_grad", "index " + std::to_string(index) + " out of range for axis size " +
                                   std::to_string(v.size));
      if (index < 0) index += v.size;
      float *dst = dx + (o * v.size + index) * v.inner;
      const float *src = dy + (o * count + j) * v.inner;
      for (int64_t in = 0; in < v.inner; ++in) dst[in] += src[in];
    }
}

void copy(const void *src, size_t bytes, void *dst) {
  if (src != dst && bytes) std::memmove(dst, src, bytes);
}

template <class T> void transpose(const T *x, const Shape &xs, const Dims &perm, T *y) {
  checkRank("nn.transpose", xs, 0, "the input");
  const int r = xs.size;
  if (perm.size != r) fail("nn.transpose", "perm " + perm.str() + " for rank " + std::to_string(r));
  bool seen[kMaxRank] = {};
  Shape ys;
  for (int i = 0; i < r; ++i) {
    if (perm.v[i] < 0 || perm.v[i] >= r || seen[perm.v[i]]) fail("nn.transpose", perm.str() + " is not a permutation");
    seen[perm.v[i]] = true;
    ys.push(xs.v[perm.v[i]]);
  }
  const int64_t total = xs.numel();
  if (total == 0) return;
  if (r == 0) {
    y[0] = x[0];
    return;
  }
  const auto xst = stridesOf(xs);
  int64_t st[kMaxRank];
  for (int i = 0; i < r; ++i) st[i] = xst[perm.v[i]];
  const int64_t inner = ys.v[r - 1], innerSt = st[r - 1];
  // Rows of y (runs of its innermost axis) in parallel ranges.
  parallelRanges(total / inner, total, [&](int64_t rowBegin, int64_t rowEnd) {
    int64_t idx[kMaxRank] = {}, off = 0;
    for (int64_t rest = rowBegin, a = r - 2; a >= 0; --a) {
      idx[a] = rest % ys.v[a];
      rest /= ys.v[a];
      off += idx[a] * st[a];
    }
    for (int64_t row = rowBegin; row < rowEnd; ++row) {
      const T *src = x + off;
      T *dst = y + row * inner;
      if (innerSt == 1)
        std::memcpy(dst, src, (size_t)inner * sizeof(T));
      else
        for (int64_t j = 0; j < inner; ++j) dst[j] = src[j * innerSt];
      for (int a = r - 2; a >= 0; --a) {
        off += st[a];
        if (++idx[a] < ys.v[a]) break;
        off -= st[a] * ys.v[a];
        idx[a] = 0;
      }
    }
  });
}

template <class T> void concat(const T *const *inputs, const Shape *shapes, int count, int64_t axis, T *out) {
  if (count <= 0) fail("nn.concat", "needs at least one input");
  const Shape &first = shapes[0];
  checkRank("nn.concat", first, 1, "an input");
  const int a = (int)normalizeAxis("nn.concat", axis, first.size);
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    Shape expected = first;
    expected.v[a] = shapes[i].size == first.size ? shapes[i].v[a] : -1;
    if (shapes[i] != expected)
      fail("nn.concat", "inputs " + first.str() + " and " + shapes[i].str() + " differ outside axis " + std::to_string(a));
    total += shapes[i].v[a];
  }
  const int64_t outer = productOf(first, 0, a), inner = productOf(first, a + 1, first.size);
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t chunk = shapes[i].v[a] * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out + o * total * inner + offset, inputs[i] + o * chunk, (size_t)chunk * sizeof(T));
    offset += chunk;
  }
}

template <class T> void split(const T *x, const Shape &xs, int64_t axis, const Dims &sizes, T *const *outs) {
  checkRank("nn.split", xs, 1, "the input");
  const int a = (int)normalizeAxis("nn.split", axis, xs.size);
  int64_t sum = 0;
  for (int i = 0; i < sizes.size; ++i) {
    if (sizes.v[i] < 0) fail("nn.split", "negative piece size");
    sum += sizes.v[i];
  }
  if (sum != xs.v[a])
    fail("nn.split", "piece sizes " + sizes.str() + " do not sum to axis size " + std::to_string(xs.v[a]));
  const int64_t outer = productOf(xs, 0, a), inner = productOf(xs, a + 1, xs.size);
  int64_t offset = 0;
  for (int i = 0; i < sizes.size; ++i) {
    const int64_t chunk = sizes.v[i] * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(outs[i] + o * chunk, x + o * xs.v[a] * inner + offset, (size_t)chunk * sizeof(T));
    offset += chunk;
  }
}


namespace {
/// Calls f(outBase, inOffset, innerCount, innerStride) for runs of the
/// innermost axis of a slice.
template <class F> void forEachSliceRun(const Shape &xs, const Dims &starts, const Dims &steps, const Shape &ys, F &&f) {
  const int r = xs.size;
  const int64_t total = ys.numel();
  if (total == 0) return;
  const auto xst = stridesOf(xs);
  if (r == 0) {
    f(int64_t(0), int64_t(0), int64_t(1), int64_t(1));
    return;
  }
  int64_t off = 0;
  for (int a = 0; a < r; ++a) off += starts.v[a] * xst[a];
  const int64_t inner = ys.v[r - 1], innerSt = steps.v[r - 1] * xst[r - 1];
  int64_t idx[kMaxRank] = {};
  for (int64_t base = 0; base < total; base += inner) {
    f(base, off, inner, innerSt);
    for (int a = r - 2; a >= 0; --a) {
      off += steps.v[a] * xst[a];
      if (++idx[a] < ys.v[a]) break;
      off -= steps.v[a] * xst[a] * ys.v[a];
      idx[a] = 0;
    }
  }
}
} // namespace

template <class T>
void slice(const T *x, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps, T *y) {
  const Shape ys = sliceShape(xs, starts, ends, steps);
  forEachSliceRun(xs, starts, steps, ys, [&](int64_t base, int64_t off, int64_t n, int64_t st) {
    for (int64_t j = 0; j < n; ++j) y[base + j] = x[off + j * st];
  });
}

void sliceGrad(const float *dy, float *dx, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps) {
  const Shape ys = sliceShape(xs, starts, ends, steps);
  std::fill(dx, dx + xs.numel(), 0.0f);
  forEachSliceRun(xs, starts, steps, ys, [&](int64_t base, int64_t off, int64_t n, int64_t st) {
    for (int64_t j = 0; j < n; ++j) dx[off + j * st] = dy[base + j];
  });
}

template <class T> void pad(const T *x, const Shape &xs, const Dims &pads, T value, T *y) {
  checkRank("nn.pad", xs, 0, "the input");
  const int r = xs.size;
  if (pads.size != 2 * r) fail("nn.pad", "pads needs " + std::to_string(2 * r) + " entries for rank " + std::to_string(r));
  Shape ys;
  for (int a = 0; a < r; ++a) {
    if (pads.v[a] < 0 || pads.v[a + r] < 0) fail("nn.pad", "pads must be non-negative");
    ys.push(xs.v[a] + pads.v[a] + pads.v[a + r]);
  }
  std::fill(y, y + ys.numel(), value);
  const int64_t total = xs.numel();
  if (total == 0) return;
  if (r == 0) {
    y[0] = x[0];
    return;
  }
  const auto yst = stridesOf(ys);
  int64_t off = 0;
  for (int a = 0; a < r; ++a) off += pads.v[a] * yst[a];
  const int64_t inner = xs.v[r - 1];
  int64_t idx[kMaxRank] = {};
  for (int64_t base = 0; base < total; base += inner) {
    std::memcpy(y + off, x + base, (size_t)inner * sizeof(T));
    for (int a = r - 2; a >= 0; --a) {
      off += yst[a];
      if (++idx[a] < xs.v[a]) break;
      off -= yst[a] * xs.v[a];
      idx[a] = 0;
    }
  }
}

template <class T> void expand(const T *x, const Shape &xs, T *y, const Shape &ys) {
  if (!broadcastsTo(xs, ys)) fail("nn.expand", xs.str() + " does not broadcast to " + ys.str());
  if (xs.numel() == ys.numel()) {
    copy(x, (size_t)ys.numel() * sizeof(T), y);
    return;
  }
  parallelBroadcastLoop<1>(ys, {&xs}, [&](int64_t i, const std::array<int64_t, 1> &o) { y[i] = x[o[0]]; });
}

#define PIPEC_MOVEMENT(T)                                                                                              \
  template void gather<T, int64_t>(const T *, const Shape &, const int64_t *, const Shape &, int64_t, T *);           \
  template void gather<T, int32_t>(const T *, const Shape &, const int32_t *, const Shape &, int64_t, T *);           \
  template void transpose<T>(const T *, const Shape &, const Dims &, T *);                                             \
  template void concat<T>(const T *const *, const Shape *, int, int64_t, T *);                                        \
  template void split<T>(const T *, const Shape &, int64_t, const Dims &, T *const *);                                \
  template void slice<T>(const T *, const Shape &, const Dims &, const Dims &, const Dims &, T *);                     \
  template void pad<T>(const T *, const Shape &, const Dims &, T, T *);                                                \
  template void expand<T>(const T *, const Shape &, T *, const Shape &);
PIPEC_MOVEMENT(float)
PIPEC_MOVEMENT(double)
PIPEC_MOVEMENT(int64_t)
PIPEC_MOVEMENT(int32_t)
PIPEC_MOVEMENT(uint8_t)
#undef PIPEC_MOVEMENT

template void gatherGrad<int64_t>(const float *, const int64_t *, const Shape &, int64_t, float *, const Shape &);
template void gatherGrad<int32_t>(const float *, const int32_t *, const Shape &, int64_t, float *, const Shape &);

} // namespace pipec::kernels
