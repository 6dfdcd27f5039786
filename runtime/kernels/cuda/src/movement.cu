// Data movement: gather (and its scatter-add gradient), copy, transpose,
// concat, split, slice (and its gradient), pad, expand. The checks and
// index rules are the CPU library's (runtime/kernels/src/movement.cpp).
// bf16 (docs/cuda-kernels.md): the templates move its bits; the gradients
// that scatter bf16 values are templated on the gradient's storage type.
#include "detail.cuh"
#include "index_map.cuh"
#include <vector>

namespace pipec::kernels::cuda {

using namespace detail;

namespace {

template <class K, class... Args> void launch(const char *op, int64_t n, K kernel, Args... args) {
  if (n <= 0) return;
  kernel<<<blocksFor(n), kThreads, 0, stream()>>>(args...);
  checkLaunch(op);
}

void zero(void *p, size_t bytes, const char *op) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, stream()), op);
}

/// out is [outer, count, inner], data [outer, size, inner].
template <class T, class I>
__global__ void gatherKernel(const T *data, const I *indices, T *out, int64_t total, int64_t count, int64_t size,
                             int64_t inner, int *flag) {
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t t = i / inner, in = i - t * inner;
    const int64_t o = t / count, j = t - o * count;
    int64_t index = (int64_t)indices[j];
    if (index < -size || index >= size) {
      raiseDevice(flag, kGatherIndexOutOfRange);
      out[i] = T(0.0f);
      continue;
    }
    if (index < 0) index += size;
    out[i] = data[(o * size + index) * inner + in];
  }
}

/// dx [outer, size, inner] += dy [outer, count, inner] at the indices.
template <class T, class I>
__global__ void gatherGradKernel(const T *dy, const I *indices, float *dx, int64_t total, int64_t count,
                                 int64_t size, int64_t inner, int *flag) {
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t t = i / inner, in = i - t * inner;
    const int64_t o = t / count, j = t - o * count;
    int64_t index = (int64_t)indices[j];
    if (index < -size || index >= size) {
      raiseDevice(flag, kGatherGradIndexOutOfRange);
      continue;
    }
    if (index < 0) index += size;
    atomicAdd(dx + (o * size + index) * inner + in, toF(dy[i]));
  }
}

/// y[i] = x[base + offset of i], V elements at a time (stridedCopy: the
/// offsets of V consecutive elements are consecutive and aligned).
template <class T, int V>
__global__ void stridedCopyKernel(const T *x, int64_t base, T *y, int64_t n, IndexMap<1> map) {
  for (int64_t i = firstIndex(); i < n / V; i += gridStride()) {
    int64_t o[1];
    map.offsets(i * V, o);
    storePacked(y + i * V, loadPacked<V>(x + base + o[0]));
  }
}

/// y[i] = x[base + offset of i] for i in [0, n): 16 bytes at a time when the
/// map's innermost axis is contiguous and a multiple of 16 bytes long and
/// every other stride a multiple of 16 bytes (a transpose that keeps the
/// last axis, as the heads' transposes of attention; an expand that repeats
/// whole rows, as grouped-query attention's), else an element at a time.
template <class T> void stridedCopy(const char *op, const T *x, int64_t base, T *y, int64_t n, const IndexMap<1> &map) {
  constexpr int V = kPackOf<T>;
  bool packs = map.rank > 0 && map.st[0][map.rank - 1] == 1 && map.dims[map.rank - 1] % V == 0 && base % V == 0 &&
               packedAligned<V>(x, y);
  for (int a = 0; a + 1 < map.rank && packs; ++a) packs = map.st[0][a] % V == 0;
  if (packs)
    launch(op, n / V, stridedCopyKernel<T, V>, x, base, y, n, map);
  else
    launch(op, n, stridedCopyKernel<T, 1>, x, base, y, n, map);
}

/// y[base + offset of i] = x[i].
template <class T>
__global__ void stridedScatterKernel(const T *x, T *y, int64_t base, int64_t n, IndexMap<1> map) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t o[1];
    map.offsets(i, o);
    y[base + o[0]] = x[i];
  }
}

/// Up to kMaxPieces pieces of a concat or split, copied by one launch: the
/// whole's columns [first, first + span) of its rows of `row` elements,
/// piece k's rows of width[k] elements holding its columns from offset[k].
constexpr int kMaxPieces = 8;
template <class T> struct Pieces {
  int count = 0;
  int64_t row = 0, first = 0, span = 0;
  int64_t offset[kMaxPieces] = {}, width[kMaxPieces] = {};
  T *piece[kMaxPieces] = {};
};

/// The group's outer x span elements, V at a time: element (r, c) of the
/// whole is element (r, c - offset[k]) of the piece k whose columns hold c.
/// `toPieces`: split (the whole is read), else concat (written).
template <class T, int V, bool toPieces>
__global__ void copyPiecesKernel(std::conditional_t<toPieces, const T *, T *> whole, Pieces<T> p, int64_t total) {
  for (int64_t i = firstIndex(); i < total / V; i += gridStride()) {
    const int64_t e = i * V, r = e / p.span, c = p.first + (e - r * p.span);
    int k = 0;
    while (k + 1 < p.count && c >= p.offset[k + 1]) ++k;
    T *piece = p.piece[k] + r * p.width[k] + (c - p.offset[k]);
    if constexpr (toPieces)
      storePacked(piece, loadPacked<V>(whole + r * p.row + c));
    else
      storePacked(whole + r * p.row + c, loadPacked<V>(piece));
  }
}

/// Concat (toPieces false) and split (true): the whole has `outer` rows of
/// the pieces' columns side by side, piece i (sizes[i] x inner columns, at
/// pointers[i]) `outer` rows of its own. One launch per kMaxPieces non-empty
/// pieces (GPT-2's q/k/v split and its gradient's concat were 3 launches
/// each per block), 16 bytes at a time when every piece's width and offset
/// and the pointers allow it.
template <class T, bool toPieces>
void copyPieces(const char *op, std::conditional_t<toPieces, const T *, T *> whole, int64_t outer, int64_t inner,
                const int64_t *sizes, int count, T *const *pointers) {
  constexpr int V = kPackOf<T>;
  Pieces<T> group;
  for (int i = 0; i < count; ++i) group.row += sizes[i] * inner;
  auto launchGroup = [&] {
    const int64_t total = outer * group.span;
    if (total > 0) {
      bool packs = group.row % V == 0 && group.first % V == 0 && group.span % V == 0 && packedAligned<V>(whole);
      for (int k = 0; k < group.count && packs; ++k)
        packs = group.offset[k] % V == 0 && group.width[k] % V == 0 && packedAligned<V>(group.piece[k]);
      if (packs)
        launch(op, total / V, copyPiecesKernel<T, V, toPieces>, whole, group, total);
      else
        launch(op, total, copyPiecesKernel<T, 1, toPieces>, whole, group, total);
    }
    group.count = 0;
    group.span = 0;
  };
  int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t width = sizes[i] * inner;
    if (width > 0) {
      if (group.count == 0) group.first = offset;
      group.offset[group.count] = offset;
      group.width[group.count] = width;
      group.piece[group.count++] = pointers[i];
      group.span = offset + width - group.first;
      if (group.count == kMaxPieces) launchGroup();
    }
    offset += width;
  }
  if (group.count > 0) launchGroup();
}

struct PadParams {
  int rank;
  int64_t ydims[kMaxRank];
  int64_t xdims[kMaxRank];
  int64_t begin[kMaxRank];
  int64_t xst[kMaxRank];
};

template <class T> __global__ void padKernel(const T *x, T *y, int64_t n, PadParams p, T value) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t rest = i, off = 0;
    bool inside = true;
#pragma unroll
    for (int a = kMaxRank - 1; a >= 0; --a) {
      if (a < p.rank) {
        const int64_t q = rest / p.ydims[a], c = rest - q * p.ydims[a] - p.begin[a];
        rest = q;
        if (c < 0 || c >= p.xdims[a]) inside = false;
        off += c * p.xst[a];
      }
    }
    y[i] = inside ? x[off] : value;
  }
}

/// The map from a slice's output index to the input offset (minus `base`).
IndexMap<1> sliceMap(const Shape &xs, const Dims &starts, const Dims &steps, const Shape &ys, int64_t &base) {
  const Strides xst = stridesOf(xs);
  Strides st{};
  base = 0;
  for (int a = 0; a < xs.size; ++a) {
    base += starts.v[a] * xst[a];
    st[a] = steps.v[a] * xst[a];
  }
  return makeIndexMap<1>(ys, {st});
}

} // namespace

template <class T, class I>
void gather(const T *data, const Shape &ds, const I *indices, const Shape &is, int64_t axis, T *out) {
  checkRank("nn.gather", ds, 1, "the data");
  const int a = (int)normalizeAxis("nn.gather", axis, ds.size);
  const int64_t outer = productOf(ds, 0, a), size = ds.v[a], inner = productOf(ds, a + 1, ds.size);
  const int64_t count = is.numel(), total = outer * count * inner;
  if (total <= 0) return;
  launch("nn.gather", total, gatherKernel<T, I>, data, indices, out, total, count, size, inner, errorFlag());
}

template <class T, class I>
void gatherGradT(const T *dy, const I *indices, const Shape &is, int64_t axis, float *dx, const Shape &xs) {
  checkRank("nn.gather_grad", xs, 1, "the data");
  const int a = (int)normalizeAxis("nn.gather_grad", axis, xs.size);
  const int64_t outer = productOf(xs, 0, a), size = xs.v[a], inner = productOf(xs, a + 1, xs.size);
  const int64_t count = is.numel(), total = outer * count * inner;
  zero(dx, (size_t)xs.numel() * sizeof(float), "nn.gather_grad");
  if (total <= 0) return;
  launch("nn.gather_grad", total, gatherGradKernel<T, I>, dy, indices, dx, total, count, size, inner, errorFlag());
}

void copy(const void *src, size_t bytes, void *dst) {
  if (src != dst && bytes)
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "nn.copy");
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
  const Strides xst = stridesOf(xs);
  Strides st{};
  for (int i = 0; i < r; ++i) st[i] = xst[perm.v[i]];
  stridedCopy("nn.transpose", x, int64_t(0), y, total, makeIndexMap<1>(ys, {st}));
}

template <class T> void concat(const T *const *inputs, const Shape *shapes, int count, int64_t axis, T *out) {
  if (count <= 0) fail("nn.concat", "needs at least one input");
  const Shape &first = shapes[0];
  checkRank("nn.concat", first, 1, "an input");
  const int a = (int)normalizeAxis("nn.concat", axis, first.size);
  std::vector<int64_t> sizes(count);
  for (int i = 0; i < count; ++i) {
    Shape expected = first;
    expected.v[a] = shapes[i].size == first.size ? shapes[i].v[a] : -1;
    if (shapes[i] != expected)
      fail("nn.concat", "inputs " + first.str() + " and " + shapes[i].str() + " differ outside axis " + std::to_string(a));
    sizes[i] = shapes[i].v[a];
  }
  const int64_t outer = productOf(first, 0, a), inner = productOf(first, a + 1, first.size);
  // The inputs are only read (toPieces false): Pieces holds them as T *.
  copyPieces<T, false>("nn.concat", out, outer, inner, sizes.data(), count, const_cast<T *const *>(inputs));
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
  copyPieces<T, true>("nn.split", x, outer, inner, sizes.v, sizes.size, outs);
}

template <class T>
void slice(const T *x, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps, T *y) {
  const Shape ys = sliceShape(xs, starts, ends, steps);
  const int64_t total = ys.numel();
  if (total == 0) return;
  int64_t base = 0;
  const IndexMap<1> map = sliceMap(xs, starts, steps, ys, base);
  stridedCopy("nn.slice", x, base, y, total, map);
}

template <class T>
void sliceGradT(const T *dy, T *dx, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps) {
  const Shape ys = sliceShape(xs, starts, ends, steps);
  zero(dx, (size_t)xs.numel() * sizeof(T), "nn.slice_grad"); // +0 in float and in bf16
  const int64_t total = ys.numel();
  if (total == 0) return;
  int64_t base = 0;
  const IndexMap<1> map = sliceMap(xs, starts, steps, ys, base);
  launch("nn.slice_grad", total, stridedScatterKernel<T>, dy, dx, base, total, map);
}

template <class I>
void gatherGrad(const float *dy, const I *indices, const Shape &is, int64_t axis, float *dx, const Shape &xs) {
  gatherGradT(dy, indices, is, axis, dx, xs);
}
template <class I>
void gatherGrad(const bf16 *dy, const I *indices, const Shape &is, int64_t axis, float *dx, const Shape &xs) {
  gatherGradT(dy, indices, is, axis, dx, xs);
}
void sliceGrad(const float *dy, float *dx, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps) {
  sliceGradT(dy, dx, xs, starts, ends, steps);
}
void sliceGrad(const bf16 *dy, bf16 *dx, const Shape &xs, const Dims &starts, const Dims &ends, const Dims &steps) {
  sliceGradT(dy, dx, xs, starts, ends, steps);
}

template <class T> void pad(const T *x, const Shape &xs, const Dims &pads, T value, T *y) {
  checkRank("nn.pad", xs, 0, "the input");
  const int r = xs.size;
  if (pads.size != 2 * r) fail("nn.pad", "pads needs " + std::to_string(2 * r) + " entries for rank " + std::to_string(r));
  PadParams p{};
  p.rank = r;
  Shape ys;
  for (int a = 0; a < r; ++a) {
    if (pads.v[a] < 0 || pads.v[a + r] < 0) fail("nn.pad", "pads must be non-negative");
    ys.push(xs.v[a] + pads.v[a] + pads.v[a + r]);
  }
  const Strides xst = stridesOf(xs);
  for (int a = 0; a < r; ++a) {
    p.ydims[a] = ys.v[a];
    p.xdims[a] = xs.v[a];
    p.begin[a] = pads.v[a];
    p.xst[a] = xst[a];
  }
  const int64_t total = ys.numel();
  launch("nn.pad", total, padKernel<T>, x, y, total, p, value);
}

template <class T> void expand(const T *x, const Shape &xs, T *y, const Shape &ys) {
  if (!broadcastsTo(xs, ys)) fail("nn.expand", xs.str() + " does not broadcast to " + ys.str());
  if (xs.numel() == ys.numel()) {
    copy(x, (size_t)ys.numel() * sizeof(T), y);
    return;
  }
  const int64_t total = ys.numel();
  stridedCopy("nn.expand", x, int64_t(0), y, total, makeIndexMap<1>(ys, {broadcastStrides(xs, ys)}));
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
PIPEC_MOVEMENT(bf16)
#undef PIPEC_MOVEMENT

template void gatherGrad<int64_t>(const float *, const int64_t *, const Shape &, int64_t, float *, const Shape &);
template void gatherGrad<int32_t>(const float *, const int32_t *, const Shape &, int64_t, float *, const Shape &);
template void gatherGrad<int64_t>(const bf16 *, const int64_t *, const Shape &, int64_t, float *, const Shape &);
template void gatherGrad<int32_t>(const bf16 *, const int32_t *, const Shape &, int64_t, float *, const Shape &);

} // namespace pipec::kernels::cuda
