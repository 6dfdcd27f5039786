// Softmax, its gradient, and softmax cross-entropy with its gradient, as the
// CPU kernels (runtime/kernels/src/reduce.cpp): the max in float, every
// exponential in float, their sums, the loss's log-sum-exp and the gradient
// dot products in double. A segment (the values along the
// axis of one position) is walked by one block (contiguous rows, or few
// segments) or one thread (strided segments); scalar losses are reduced by
// a single block. All reductions are fixed-order: deterministic. The
// softmax, attention and loss kernels are templated on the storage of their
// tensors (float, or bf16 with float math: docs/cuda-kernels.md).
#include "flash_attention.cuh"
#include "gemm.cuh"
#include "kernel_plan.h"
#include "nn_common.cuh"

#include <cmath>
#include <type_traits>

namespace pipec::kernels::cuda {

namespace {

using namespace nn;

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

/// z[i · stride] of a segment, widened to float.
template <class T> struct StridedScores {
  const T *z;
  int64_t stride;
  __device__ float operator()(int64_t i) const { return toF(z[i * stride]); }
};

/// One segment's softmax: y[i·stride] = softmax of z(i), i < size, by P's
/// lanes (each reads only the elements it writes: z may read y); lse, when
/// given, gets log Σ exp z (from the first lane). A float y holds the
/// exponentials until they are scaled; a bf16 y is written once, from the
/// exponential recomputed in float (one rounding).
template <class P, class Z, class TY>
__device__ void softmaxSegment(const Z &z, TY *y, int64_t size, int64_t stride, float *lse = nullptr) {
  float m = -INFINITY;
  for (int64_t i = P::lane(); i < size; i += P::lanes()) {
    const float v = z(i);
    m = v > m ? v : m;
  }
  m = P::reduce(m, MaxOp{});
  double sum = 0;
  for (int64_t i = P::lane(); i < size; i += P::lanes()) {
    const float e = expf(z(i) - m);
    if constexpr (std::is_same_v<TY, float>) y[i * stride] = e;
    sum += e;
  }
  sum = P::reduce(sum, SumOp{});
  const float inv = (float)(1.0 / sum);
  for (int64_t i = P::lane(); i < size; i += P::lanes()) {
    if constexpr (std::is_same_v<TY, float>)
      y[i * stride] *= inv;
    else
      y[i * stride] = fromF<TY>(expf(z(i) - m) * inv);
  }
  if (lse && P::lane() == 0) *lse = (float)(m + log(sum));
}

template <class P, class T>
__global__ void softmaxKernel(const T *x, T *y, int64_t segments, int64_t size, int64_t inner) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t o = seg / inner, in = seg - o * inner;
    softmaxSegment<P>(StridedScores<T>{x + o * size * inner + in, inner}, y + o * size * inner + in, size, inner);
  }
}

template <class P, class T>
__global__ void softmaxGradKernel(const T *dy, const T *y, T *dx, int64_t segments, int64_t size, int64_t inner) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t o = seg / inner, in = seg - o * inner;
    const int64_t base = o * size * inner + in;
    double dot = 0;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i * inner;
      dot += (double)toF(dy[j]) * toF(y[j]);
    }
    dot = P::reduce(dot, SumOp{});
    const float fd = (float)dot;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i * inner;
      dx[j] = fromF<T>(toF(y[j]) * (toF(dy[j]) - fd));
    }
  }
}

/// Whether element j (flat, of the input) is masked: map gives its mask offset.
__device__ __forceinline__ bool maskedAt(const uint8_t *mask, const detail::IndexMap<1> &map, int64_t j,
                                         bool maskedWhen) {
  int64_t off[1];
  map.offsets(j, off);
  return (mask[off[0]] != 0) == maskedWhen;
}

/// z = masked ? fill : x * scale (x / scale) of element j.
template <class T> struct MaskedScores {
  const T *x;
  const uint8_t *mask;
  detail::IndexMap<1> map;
  float scale, fill;
  bool divide, maskedWhen;
  int64_t base;
  __device__ float operator()(int64_t i) const {
    const int64_t j = base + i;
    return maskedAt(mask, map, j, maskedWhen) ? fill : divide ? toF(x[j]) / scale : toF(x[j]) * scale;
  }
};

/// softmaxSegment along the last axis of z = masked ? fill : x * scale
/// (x / scale): a float y holds z first; for a bf16 y, z is recomputed on
/// each pass (y holds only the rounded result).
template <class P, class T>
__global__ void maskedSoftmaxKernel(const T *x, const uint8_t *mask, detail::IndexMap<1> map, float scale,
                                    bool divide, float fill, bool maskedWhen, T *y, int64_t segments,
                                    int64_t size) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t base = seg * size;
    const MaskedScores<T> z{x, mask, map, scale, fill, divide, maskedWhen, base};
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t i = P::lane(); i < size; i += P::lanes()) y[base + i] = z(i);
      softmaxSegment<P>(StridedScores<float>{y + base, 1}, y + base, size, 1);
    } else {
      softmaxSegment<P>(z, y + base, size, 1);
    }
  }
}

template <class P, class T>
__global__ void maskedSoftmaxGradKernel(const T *dy, const T *y, const uint8_t *mask, detail::IndexMap<1> map,
                                        float scale, bool divide, bool maskedWhen, T *dx, int64_t segments,
                                        int64_t size) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t base = seg * size;
    double dot = 0;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) dot += (double)toF(dy[base + i]) * toF(y[base + i]);
    dot = P::reduce(dot, SumOp{});
    const float fd = (float)dot;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i;
      const float g = maskedAt(mask, map, j, maskedWhen) ? 0.0f : toF(y[j]) * (toF(dy[j]) - fd);
      dx[j] = fromF<T>(divide ? g / scale : g * scale);
    }
  }
}

//===----------------------------------------------------------------------===//
// Attention: blocks of score rows of every slice at once
//===----------------------------------------------------------------------===//

/// Where each query slice's matrix of an attention operand (or of the
/// scratch's score block) lies: query slice l reads matrix m = l / share
/// (share: 1, or for key and value the query slices per key/value head),
/// at first + (m / group) * groupStride + (m % group) * sliceStride, its
/// rows ld apart. The host fills it from AttentionView's row offsets and
/// strides (resultSlices, querySlices, keySlices below); matrices of one group share
/// one stride, so one strided-batched GEMM takes them: group = 1 head-major
/// (all slices in one GEMM), H sequence-major (a GEMM per outer index, its
/// H heads' rows interleaved).
template <class T> struct SliceMatrices {
  T *first;
  int64_t ld, sliceStride, group, groupStride, share = 1;
  __host__ __device__ T *slice(int64_t l) const {
    const int64_t m = l / share;
    return first + (m / group) * groupStride + (m % group) * sliceStride;
  }
  /// The distance between the matrices of query slices l and l + step
  /// (step a multiple of share, both slices in one group).
  int64_t stride(int64_t step) const { return step / share * sliceStride; }
};

/// A block of an attention's scores, z [L, rows, T] (slice l's rows r0 ...
/// of the whole [L, S, T]): the scaled, masked value of each element, the
/// way nn.masked_softmax writes it; `map` gives the mask offset of an
/// element of the whole scores.
struct ScoreBlock {
  int64_t S, T, block, r0, rows; // the buffer holds `block` rows per slice, `rows` of them in use
  const uint8_t *mask;
  const float *additive; // or an additive mask (same map), or neither
  detail::IndexMap<1> map;
  float scale, fill;
  bool divide, maskedWhen;
  /// The whole scores' row of the block's segment `seg` (l * rows + i).
  __device__ int64_t row(int64_t seg) const { return seg / rows * S + r0 + seg % rows; }
  /// Where segment `seg` starts in the buffer.
  __device__ int64_t offset(int64_t seg) const { return (seg / rows * block + seg % rows) * T; }
  __device__ float value(float s, int64_t seg, int64_t j) const {
    if (mask && maskedAt(mask, map, row(seg) * T + j, maskedWhen)) return fill;
    const float scaled = divide ? s / scale : s * scale;
    if (!additive) return scaled;
    int64_t off[1];
    map.offsets(row(seg) * T + j, off);
    return scaled + additive[off[0]];
  }
};

/// bf16 storage: P and dz must be bf16 for the products with bf16 v, k, q
/// (cuBLAS takes A and B of one type), and the float scratch has no other
/// room for them (docs/cuda-kernels.md, "bf16 storage"). A row's n floats
/// become n bf16 in the first half of the same storage: element j lands in
/// float j / 2 <= j. In each round every lane reads its float before the
/// barrier and writes after it; a round writes only floats that this or an
/// earlier round read, and reads only floats no round has written yet.
/// Before the call, each lane's floats were last written by that lane or by
/// an earlier launch.
template <class P> __device__ void packRowBf16(float *row, int64_t n) {
  bf16 *packed = reinterpret_cast<bf16 *>(row);
  for (int64_t r0 = 0; r0 < n; r0 += P::lanes()) { // the same rounds in every lane: uniform barriers
    const int64_t j = r0 + P::lane();
    const float v = j < n ? row[j] : 0.0f;
    P::sync();
    if (j < n) packed[j] = fromF<bf16>(v);
  }
}

/// The forward's softmax of each row of the block, in place, and its lse;
/// then P's dropout (each lane on the elements it wrote); for bf16 storage
/// (E) the row is then packed to bf16 for the product with v.
template <class P, class E>
__global__ void attentionSoftmaxKernel(float *z, ScoreBlock b, DropoutDraws drop, StreamKey key, float *lse,
                                       int64_t segments) {
  if (drop.active) drop.streamKey = key.resolve();
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    float *zr = z + b.offset(seg);
    for (int64_t j = P::lane(); j < b.T; j += P::lanes()) zr[j] = b.value(zr[j], seg, j);
    softmaxSegment<P>(StridedScores<float>{zr, 1}, zr, b.T, 1, lse + b.row(seg));
    if (drop.active)
      for (int64_t j = P::lane(); j < b.T; j += P::lanes())
        zr[j] = drop.apply(zr[j], drop.kept(b.row(seg) * b.T + j));
    if constexpr (std::is_same_v<E, bf16>) packRowBf16<P>(zr, b.T);
  }
}

/// The gradient's P (dropped out) and dz rows of the block packed to bf16.
template <class P> __global__ void packScoreRowsKernel(float *p, float *dz, ScoreBlock b, int64_t segments) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    packRowBf16<P>(p + b.offset(seg), b.T);
    packRowBf16<P>(dz + b.offset(seg), b.T);
  }
}

/// The gradient's P = exp(z - lse), in place (n = L · rows · T elements).
__global__ void attentionProbabilitiesKernel(float *z, ScoreBlock b, const float *lse, int64_t n) {
  for (int64_t e = detail::firstIndex(); e < n; e += detail::gridStride()) {
    const int64_t seg = e / b.T, j = e - seg * b.T, at = b.offset(seg) + j;
    z[at] = expf(b.value(z[at], seg, j) - lse[b.row(seg)]);
  }
}

/// dot[r] = Σ_e dy[r, e] · y[r, e] per logical row r = l * S + i (of
/// rows), in double; dy and y's rows of n elements lie where their slices say.
template <class P, class E>
__global__ void rowDotKernel(SliceMatrices<const E> dy, SliceMatrices<const E> y, float *dot, int64_t rows,
                             int64_t S, int64_t n) {
  for (int64_t r = P::first(); r < rows; r += P::step()) {
    const int64_t l = r / S, i = r - l * S;
    const E *dyr = dy.slice(l) + i * dy.ld, *yr = y.slice(l) + i * y.ld;
    double sum = 0;
    for (int64_t e = P::lane(); e < n; e += P::lanes()) sum += (double)toF(dyr[e]) * toF(yr[e]);
    sum = P::reduce(sum, SumOp{});
    if (P::lane() == 0) dot[r] = (float)sum;
  }
}

/// dz = P ⊙ (dP - dot) (0 where masked), times or divided by scale, into dp.
/// With dropout, dP first goes through dropout's gradient and P, after its
/// use here, is dropped out in place for dv's product (dot = rowsum(dy ⊙ y)
/// is still rowsum(P ⊙ dP): docs/cuda-kernels.md).
__global__ void attentionScoreGradKernel(float *p, float *dp, ScoreBlock b, DropoutDraws drop, StreamKey key,
                                         const float *dot, int64_t n) {
  if (drop.active) drop.streamKey = key.resolve();
  for (int64_t e = detail::firstIndex(); e < n; e += detail::gridStride()) {
    const int64_t seg = e / b.T, j = e - seg * b.T, at = b.offset(seg) + j;
    const bool masked = b.mask && maskedAt(b.mask, b.map, b.row(seg) * b.T + j, b.maskedWhen);
    const bool keep = drop.active && drop.kept(b.row(seg) * b.T + j);
    const float dpe = drop.active ? drop.apply(dp[at], keep) : dp[at];
    const float g = masked ? 0.0f : p[at] * (dpe - dot[b.row(seg)]);
    dp[at] = b.divide ? g / b.scale : g * b.scale;
    if (drop.active) p[at] = drop.apply(p[at], keep);
  }
}

//===----------------------------------------------------------------------===//
// Softmax cross-entropy
//===----------------------------------------------------------------------===//

/// A contiguous row of C elements at s, split for 16-byte loads: `head`
/// elements before its first 16-byte boundary (all C when s is not even
/// aligned to T), `packs` whole 16-byte packs after them, the rest from
/// `tail` on.
struct RowParts {
  int64_t head, packs, tail;
};
template <class T> __device__ RowParts rowParts(const T *s, int64_t C) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(s);
  int64_t head = address % sizeof(T) ? C : (int64_t)((16 - address % 16) % 16 / sizeof(T));
  head = head < C ? head : C;
  const int64_t packs = (C - head) / kPackOf<T>;
  return {head, packs, head + packs * kPackOf<T>};
}

/// Calls f(c, value) once for every class c in [0, C) of one element's
/// scores s[c * inner], the lanes of P sharing them. A contiguous row
/// (inner 1) is read 16 bytes at a time from its first 16-byte boundary
/// (a 50,257-class bf16 row starts anywhere), the few classes before it
/// and after the last whole 16 bytes one at a time.
template <class P, class T, class F> __device__ void forEachClass(const T *s, int64_t C, int64_t inner, F &&f) {
  if (inner != 1) {
    for (int64_t c = P::lane(); c < C; c += P::lanes()) f(c, toF(s[c * inner]));
    return;
  }
  constexpr int kPack = kPackOf<T>;
  const RowParts row = rowParts(s, C);
  for (int64_t c = P::lane(); c < row.head; c += P::lanes()) f(c, toF(s[c]));
  for (int64_t i = P::lane(); i < row.packs; i += P::lanes()) {
    const int64_t c0 = row.head + i * kPack;
    const Packed<T, kPack> pack = loadPacked<kPack>(s + c0);
#pragma unroll
    for (int j = 0; j < kPack; ++j) f(c0 + j, toF(pack.v[j]));
  }
  for (int64_t c = row.tail + P::lane(); c < C; c += P::lanes()) f(c, toF(s[c]));
}

/// out[c * inner] = g(c, s[c * inner]) for every class c in [0, C), as
/// forEachClass reads them; a contiguous row whose output lies at the same
/// offset from a 16-byte boundary is also written 16 bytes at a time.
template <class P, class T, class G> __device__ void mapClasses(const T *s, T *out, int64_t C, int64_t inner, G &&g) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(s);
  if (inner != 1 || address % sizeof(T) || address % 16 != reinterpret_cast<uintptr_t>(out) % 16) {
    forEachClass<P>(s, C, inner, [&](int64_t c, float v) { out[c * inner] = fromF<T>(g(c, v)); });
    return;
  }
  constexpr int kPack = kPackOf<T>;
  const RowParts row = rowParts(s, C);
  for (int64_t c = P::lane(); c < row.head; c += P::lanes()) out[c] = fromF<T>(g(c, toF(s[c])));
  for (int64_t i = P::lane(); i < row.packs; i += P::lanes()) {
    const int64_t c0 = row.head + i * kPack;
    const Packed<T, kPack> in = loadPacked<kPack>(s + c0);
    Packed<T, kPack> result;
#pragma unroll
    for (int j = 0; j < kPack; ++j) result.v[j] = fromF<T>(g(c0 + j, toF(in.v[j])));
    storePacked(out + c0, result);
  }
  for (int64_t c = row.tail + P::lane(); c < C; c += P::lanes()) out[c] = fromF<T>(g(c, toF(s[c])));
}

/// The log-sum-exp of one element's class scores s[c * inner], c in [0, C)
/// (every lane of P gets it), in one pass: each lane keeps its running
/// maximum and its sum of exponentials relative to it (a float exponential
/// per score, the sums in double), and the lanes' sums are rescaled to the
/// maximum of all before they are added. As the CPU's two passes: NaN if a
/// score is NaN or +inf, or every score -inf; a -inf score adds nothing.
template <class P, class T> __device__ double logSumExp(const T *s, int64_t C, int64_t inner) {
  float m = -INFINITY;
  LaneSum<T> sum = 0;
  forEachClass<P>(s, C, inner, [&](int64_t, float v) {
    if (v > m) {
      sum = sum * (LaneSum<T>)expf(m - v) + 1;
      m = v;
    } else if (v != -INFINITY) {
      sum += expf(v - m); // NaN for a NaN score, and for a second +inf
    }
  });
  const float top = P::reduce(m, MaxOp{});
  if (top == INFINITY || top == -INFINITY) return NAN; // exp(inf - inf) or exp(-inf + inf) in the CPU's sum
  double total = sum == 0 ? 0.0 : (double)sum * (double)expf(m - top);
  total = P::reduce(total, SumOp{});
  return top + log(total);
}

/// ignoreIndex as the kernels see it.
/// Which labels count: all but `ignored` (when `ignores`), each below
/// `bound` (the class axis, or the classes before its padding).
struct LabelRule {
  bool ignores;
  int64_t ignored;
  int64_t bound;
};

/// Per element e = (n, d...): lossE[e] = -w[label] * logProb[label] and
/// weightE[e] = w[label] (0 for an ignored element or a label out of
/// range, which is reported); loss[e] = (float)lossE[e] for Reduction::None.
/// logProb (optional) gets every class's score - lse.
template <class P, class L, class T>
__global__ void lossKernel(const T *scores, const L *labels, const float *weights, int64_t segments, int64_t C,
                           int64_t inner, LabelRule rule, int *errorFlag, float *loss, double *lossE,
                           double *weightE, T *logProb) {
  for (int64_t e = P::first(); e < segments; e += P::step()) {
    const int64_t n = e / inner, in = e - n * inner;
    const T *s = scores + n * C * inner + in;
    const double lse = logSumExp<P>(s, C, inner);
    if (logProb) {
      T *lp = logProb + n * C * inner + in;
      mapClasses<P>(s, lp, C, inner, [&](int64_t, float v) { return (float)(v - lse); });
    }
    if (P::leader()) {
      double l = 0, w = 0;
      const int64_t label = (int64_t)labels[e];
      if (!(rule.ignores && label == rule.ignored)) {
        if (label < 0 || label >= rule.bound) {
          detail::raiseDevice(errorFlag, detail::kLossLabelOutOfRange);
        } else {
          w = weights ? (double)weights[label] : 1.0;
          l = -w * ((double)toF(s[label * inner]) - lse);
        }
      }
      if (loss) loss[e] = (float)l;
      if (lossE) {
        lossE[e] = l;
        weightE[e] = w;
      }
    }
  }
}

/// Single block: loss[0] = Σ lossE (Sum) or Σ lossE / Σ weightE (Mean; 0/0 =
/// NaN when nothing counted, as the CPU kernel).
__global__ void lossReduceKernel(const double *lossE, const double *weightE, int64_t count, bool mean, float *loss) {
  double l = 0, w = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    l += lossE[e];
    w += weightE[e];
  }
  l = blockSum(l);
  w = blockSum(w);
  if (threadIdx.x == 0) loss[0] = mean ? (float)(l / w) : (float)l;
}

/// Single block: *weightSum = Σ w[label] over the counted elements (labels
/// out of range are reported and count 0).
template <class L>
__global__ void weightSumKernel(const L *labels, const float *weights, int64_t count, LabelRule rule,
                                int *errorFlag, double *weightSum) {
  double w = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t label = (int64_t)labels[e];
    if (rule.ignores && label == rule.ignored) continue;
    if (label < 0 || label >= rule.bound) {
      detail::raiseDevice(errorFlag, detail::kLossLabelOutOfRange);
      continue;
    }
    w += weights ? (double)weights[label] : 1.0;
  }
  w = blockSum(w);
  if (threadIdx.x == 0) *weightSum = w;
}

/// dscores = (softmax - onehot(label)) * w[label] * scale * (dloss[e] for
/// None); 0 for ignored elements and labels out of range (reported).
template <class P, class L, class T>
__global__ void lossGradKernel(const float *dloss, const T *scores, const L *labels, const float *weights,
                               int64_t segments, int64_t C, int64_t inner, LabelRule rule, int *errorFlag,
                               bool none, const double *weightSum, T *dscores) {
  double scale = none ? 1.0 : (double)dloss[0];
  if (weightSum) scale /= *weightSum;
  for (int64_t e = P::first(); e < segments; e += P::step()) {
    const int64_t n = e / inner, in = e - n * inner;
    const T *s = scores + n * C * inner + in;
    T *ds = dscores + n * C * inner + in;
    const int64_t label = (int64_t)labels[e]; // the same for every lane: uniform branches
    const bool ignored = rule.ignores && label == rule.ignored;
    const bool bad = !ignored && (label < 0 || label >= rule.bound);
    if (ignored || bad) {
      if (bad && P::leader()) detail::raiseDevice(errorFlag, detail::kLossLabelOutOfRange);
      for (int64_t c = P::lane(); c < C; c += P::lanes()) ds[c * inner] = fromF<T>(0.0f);
      continue;
    }
    const double lse = logSumExp<P>(s, C, inner);
    const double k = (weights ? (double)weights[label] : 1.0) * scale * (none ? (double)dloss[e] : 1.0);
    if constexpr (std::is_same_v<LaneSum<T>, float>) { // bf16 scores: the gradient in float as well
      const float lseF = (float)lse, kF = (float)k;
      mapClasses<P>(s, ds, C, inner, [&](int64_t c, float v) {
        return kF * (expf(v - lseF) - (c == label ? 1.0f : 0.0f));
      });
    } else {
      mapClasses<P>(s, ds, C, inner, [&](int64_t c, float v) {
        const double p = expf((float)((double)v - lse));
        return (float)(k * (p - (c == label ? 1.0 : 0.0)));
      });
    }
  }
}

AxisView lossView(const char *op, const Shape &ss) {
  checkRank(op, ss, 2, "the scores (N, C, ...)");
  return viewAround(ss, 1);
}

LabelRule labelRule(const char *op, const AxisView &v, const std::optional<int64_t> &ignoreIndex, int64_t classes) {
  return LabelRule{ignoreIndex.has_value(), ignoreIndex.value_or(0), lossLabelBound(op, v.size, classes)};
}

constexpr unsigned kReduceThreads = 1024;

} // namespace

//===----------------------------------------------------------------------===//
// nn.softmax, nn.softmax_grad
//===----------------------------------------------------------------------===//

namespace {
template <class T> void softmaxT(const T *x, const Shape &xs, int64_t axis, T *y) {
  const char *op = "nn.softmax";
  checkRank(op, xs, 1, "the input");
  const AxisView v = viewAround(xs, (int)normalizeAxis(op, axis, xs.size));
  const int64_t segments = v.outer * v.inner;
  if (segments == 0 || v.size == 0) return;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    softmaxKernel<P, T><<<grid, block, 0, detail::stream()>>>(x, y, segments, v.size, v.inner);
  });
  detail::checkLaunch(op);
}

template <class T> void softmaxGradT(const T *dy, const T *y, const Shape &s, int64_t axis, T *dx) {
  const char *op = "nn.softmax_grad";
  checkRank(op, s, 1, "the input");
  const AxisView v = viewAround(s, (int)normalizeAxis(op, axis, s.size));
  const int64_t segments = v.outer * v.inner;
  if (segments == 0 || v.size == 0) return;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    softmaxGradKernel<P, T><<<grid, block, 0, detail::stream()>>>(dy, y, dx, segments, v.size, v.inner);
  });
  detail::checkLaunch(op);
}
} // namespace

void softmax(const float *x, const Shape &xs, int64_t axis, float *y) { softmaxT(x, xs, axis, y); }
void softmax(const bf16 *x, const Shape &xs, int64_t axis, bf16 *y) { softmaxT(x, xs, axis, y); }
void softmaxGrad(const float *dy, const float *y, const Shape &s, int64_t axis, float *dx) {
  softmaxGradT(dy, y, s, axis, dx);
}
void softmaxGrad(const bf16 *dy, const bf16 *y, const Shape &s, int64_t axis, bf16 *dx) {
  softmaxGradT(dy, y, s, axis, dx);
}

//===----------------------------------------------------------------------===//
// nn.masked_softmax, nn.masked_softmax_grad
//===----------------------------------------------------------------------===//

namespace {
/// The mask's offsets for every element of xs (it broadcasts to xs).
detail::IndexMap<1> maskMap(const char *op, const Shape &xs, const Shape &ms) {
  checkRank(op, xs, 1, "the input");
  if (!detail::broadcastsTo(ms, xs))
    fail(op, "mask of shape " + ms.str() + " does not broadcast to " + xs.str());
  return detail::makeIndexMap<1>(xs, {detail::broadcastStrides(ms, xs)});
}

template <class T>
void maskedSoftmaxT(const T *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                    float fill, bool maskedWhen, T *y) {
  const char *op = "nn.masked_softmax";
  const detail::IndexMap<1> map = maskMap(op, xs, ms);
  const int64_t size = xs.v[xs.size - 1], segments = size == 0 ? 0 : xs.numel() / size;
  if (segments == 0) return;
  launchPerSegment(segments, size, 1, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    maskedSoftmaxKernel<P, T><<<grid, block, 0, detail::stream()>>>(x, mask, map, scale, divide, fill, maskedWhen, y,
                                                                  segments, size);
  });
  detail::checkLaunch(op);
}

template <class T>
void maskedSoftmaxGradT(const T *dy, const T *y, const Shape &s, const uint8_t *mask, const Shape &ms, float scale,
                        bool divide, bool maskedWhen, T *dx) {
  const char *op = "nn.masked_softmax_grad";
  const detail::IndexMap<1> map = maskMap(op, s, ms);
  const int64_t size = s.v[s.size - 1], segments = size == 0 ? 0 : s.numel() / size;
  if (segments == 0) return;
  launchPerSegment(segments, size, 1, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    maskedSoftmaxGradKernel<P, T><<<grid, block, 0, detail::stream()>>>(dy, y, mask, map, scale, divide,
                                                                         maskedWhen, dx, segments, size);
  });
  detail::checkLaunch(op);
}
} // namespace

void maskedSoftmax(const float *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                   float fill, bool maskedWhen, float *y) {
  maskedSoftmaxT(x, xs, mask, ms, scale, divide, fill, maskedWhen, y);
}
void maskedSoftmax(const bf16 *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                   float fill, bool maskedWhen, bf16 *y) {
  maskedSoftmaxT(x, xs, mask, ms, scale, divide, fill, maskedWhen, y);
}
void maskedSoftmaxGrad(const float *dy, const float *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, float *dx) {
  maskedSoftmaxGradT(dy, y, s, mask, ms, scale, divide, maskedWhen, dx);
}
void maskedSoftmaxGrad(const bf16 *dy, const bf16 *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, bf16 *dx) {
  maskedSoftmaxGradT(dy, y, s, mask, ms, scale, divide, maskedWhen, dx);
}

//===----------------------------------------------------------------------===//
// nn.attention, nn.attention_grad
//===----------------------------------------------------------------------===//

namespace {
ScoreBlock scoreBlock(const AttentionView &a, const uint8_t *mask, const float *additive, const Shape &ms,
                      float scale, bool divide, float fill, bool maskedWhen) {
  ScoreBlock b{a.S, a.T, plan::cudaAttentionRowsPerBlock(a.L, a.S, a.T), 0, 0, mask, additive, {}, scale,
               fill, divide, maskedWhen};
  if (a.masked) b.map = detail::makeIndexMap<1>(a.scores, {detail::broadcastStrides(ms, a.scores)});
  return b;
}

/// The storage a P or dz block is multiplied from: the float rows, or (bf16
/// storage) the bf16 rows packed into their first halves, 2T bf16 apart.
template <class E> struct PackedRows {
  static constexpr int64_t kWiden = std::is_same_v<E, bf16> ? 2 : 1; // elements of E per float
  static const E *of(const float *rows) { return reinterpret_cast<const E *>(rows); }
};

/// The slices of a result-side operand of `rows` rows of `width` per slice
/// (y and dy), from row `row0` of each: where the view's layout puts them,
/// read and written in place.
template <class T>
SliceMatrices<T> resultSlices(const AttentionView &a, T *base, int64_t rows, int64_t width, int64_t row0 = 0) {
  return {base + a.rowOffset(0, row0, rows, width), a.rowStride(width), a.rowOffset(1, 0, rows, width), a.interleave,
          a.rowOffset(a.interleave, 0, rows, width)};
}

/// The same for q and dq (windows of a joint value, with a.jointHeads).
template <class T>
SliceMatrices<T> querySlices(const AttentionView &a, T *base, int64_t rows, int64_t width, int64_t row0 = 0) {
  return {base + a.queryRowOffset(0, row0, rows, width), a.queryRowStride(width), a.queryRowOffset(1, 0, rows, width),
          a.interleave, a.queryRowOffset(a.interleave, 0, rows, width)};
}

/// The slices of a key-side operand (k, v and their gradients; `rows` rows
/// of `width` per key/value head), as the query slices read them.
template <class T> SliceMatrices<T> keySlices(const AttentionView &a, T *base, int64_t rows, int64_t width) {
  return {base, a.keyRowStride(width), a.keyRowOffset(a.group, 0, rows, width), a.keyInterleave,
          a.keyRowOffset(a.group * a.keyInterleave, 0, rows, width), a.group};
}

/// The slices of the scratch's score block (P, z or dz: `block` rows of T
/// per slice, slice after slice), as elements of T, `widen` per float.
template <class T>
SliceMatrices<T> blockSlices(const AttentionView &a, T *block, int64_t rowsPerBlock, int64_t widen = 1) {
  const int64_t sliceStride = widen * rowsPerBlock * a.T;
  return {block, widen * a.T, sliceStride, a.interleave, a.interleave * sliceStride};
}

/// C = op(A) op(B) + beta C for every slice of the attention (M x N x K
/// each): one strided-batched GEMM over all L slices head-major, as before
/// the layouts; sequence-major, one per outer index over its H slices (a
/// batched GEMM has one stride between its matrices, and the heads'
/// matrices are D apart within an outer index but S·H·D between them).
/// Grouped-query heads (group g > 1): g GEMMs per such call, the j-th over
/// query slices j, j + g, ..., which read consecutive key/value heads; a
/// key-side C (dk, dv) sums the g calls (beta 1 after the first).
template <class T, class TC>
void sliceGemms(const char *op, const AttentionView &a, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                const SliceMatrices<const T> &A, const SliceMatrices<const T> &B, float beta,
                const SliceMatrices<TC> &C) {
  const int64_t perCall = a.interleave == 1 ? a.L : a.interleave, g = a.group;
  for (int64_t l0 = 0; l0 < a.L; l0 += perCall)
    for (int64_t j = 0; j < g; ++j) {
      const int64_t l = l0 + j;
      const float b = j > 0 && C.share > 1 ? 1.0f : beta;
      nn::gemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A.slice(l), A.ld, A.stride(g), B.slice(l), B.ld,
                             B.stride(g), b, C.slice(l), C.ld, C.stride(g), perCall / g);
    }
}

// E: the storage of q, k, v, y (and dy, dq, dk, dv): float, or bf16 with
// the same float math (scores, softmax, lse, dz in float scratch; every GEMM
// accumulates in float32). The scratch is the float call's for both, and
// the same in either layout: only the GEMMs' and rowDotKernel's addressing
// of the operands differs.
template <class E>
void attentionT(const E *q, const Shape &qs, const E *k, const Shape &ks, const E *v, const Shape &vs,
                const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
                bool maskedWhen, float dropoutRatio, bool training, StreamKey dropoutStreamKey, E *y, float *lse,
                const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  const char *op = "nn.attention";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr, layout,
                                        jointHeads);
  const DropoutDraws drop = kernels::dropoutDraws(op, dropoutRatio, training, 0) /* key: on the device */;
  Scratch scratch(op, workspace, attentionScratch(ScratchTarget::Cuda, qs, ks, vs, layout));
  const int64_t block = plan::cudaAttentionRowsPerBlock(a.L, a.S, a.T);
  float *z = scratch.shared<float>(a.L * block * a.T);
  const int64_t w = PackedRows<E>::kWiden;
  ScoreBlock b = scoreBlock(a, mask, additive, ms, scale, divide, fill, maskedWhen);
  for (b.r0 = 0; b.r0 < a.S; b.r0 += block) {
    b.rows = std::min(block, a.S - b.r0);
    sliceGemms<E, float>(op, a, false, true, b.rows, a.T, a.D, querySlices(a, q, a.S, a.D, b.r0),
                         keySlices(a, k, a.T, a.D), 0.0f, blockSlices(a, z, block));
    const int64_t segments = a.L * b.rows;
    if (a.T > 0) {
      launchPerSegment(segments, a.T, 1, [&](auto lanes, unsigned grid, unsigned threads) {
        using P = decltype(lanes);
        attentionSoftmaxKernel<P, E><<<grid, threads, 0, detail::stream()>>>(z, b, drop, dropoutStreamKey, lse,
                                                                             segments);
      });
      detail::checkLaunch(op);
    }
    sliceGemms<E, E>(op, a, false, false, b.rows, a.Dv, a.T, blockSlices(a, PackedRows<E>::of(z), block, w),
                     keySlices(a, v, a.T, a.Dv), 0.0f, resultSlices(a, y, a.S, a.Dv, b.r0));
  }
}

// dk and dv sum over the row blocks (and grouped-query heads' over their
// group's query heads). Float storage: in place (beta 1). bf16 storage:
// also in place, into the bf16 outputs: float accumulators (L·T·(D + Dv)
// floats) do not fit the planned scratch, which the bf16 call must not
// exceed. Each block's product is accumulated in float32 and added to the
// bf16 partial sum in float32, then rounded: one bf16 rounding per block of
// query rows (plan::cudaAttentionRowsPerBlock; one block, like every other
// output, when they all fit) and query head of a group. cuDNN, which runs
// bf16 attention wherever it can, accumulates in float32.
template <class E>
void attentionGradT(const E *dy, const E *q, const Shape &qs, const E *k, const Shape &ks, const E *v,
                    const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const E *y,
                    const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                    bool training, StreamKey dropoutStreamKey, E *dq, E *dk, E *dv, const Workspace &workspace,
                    AttentionLayout layout, int64_t jointHeads) {
  const char *op = "nn.attention_grad";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr, layout,
                                        jointHeads);
  const DropoutDraws drop = kernels::dropoutDraws(op, dropoutRatio, training, 0) /* key: on the device */;
  Scratch scratch(op, workspace, attentionGradScratch(ScratchTarget::Cuda, qs, ks, vs, layout));
  const int64_t block = plan::cudaAttentionRowsPerBlock(a.L, a.S, a.T);
  float *p = scratch.shared<float>(a.L * block * a.T), *dz = scratch.shared<float>(a.L * block * a.T);
  float *dot = scratch.shared<float>(a.L * a.S);
  const int64_t w = PackedRows<E>::kWiden;
  const SliceMatrices<const E> pE = blockSlices(a, PackedRows<E>::of(p), block, w),
                               dzE = blockSlices(a, PackedRows<E>::of(dz), block, w);
  const SliceMatrices<E> dkSlices = keySlices(a, dk, a.T, a.D), dvSlices = keySlices(a, dv, a.T, a.Dv);
  if (a.S == 0) { // no rows: the key and value gradients are sums of nothing
    sliceGemms<E, E>(op, a, true, false, a.T, a.D, 0, dzE, querySlices(a, q, a.S, a.D), 0.0f, dkSlices);
    sliceGemms<E, E>(op, a, true, false, a.T, a.Dv, 0, pE, resultSlices(a, dy, a.S, a.Dv), 0.0f, dvSlices);
    return;
  }
  launchPerSegment(a.L * a.S, a.Dv, 1, [&](auto lanes, unsigned grid, unsigned threads) {
    using P = decltype(lanes);
    rowDotKernel<P, E><<<grid, threads, 0, detail::stream()>>>(
        resultSlices(a, dy, a.S, a.Dv), resultSlices(a, y, a.S, a.Dv), dot, a.L * a.S, a.S, a.Dv);
  });
  detail::checkLaunch(op);
  ScoreBlock b = scoreBlock(a, mask, additive, ms, scale, divide, fill, maskedWhen);
  for (b.r0 = 0; b.r0 < a.S; b.r0 += block) {
    b.rows = std::min(block, a.S - b.r0);
    const float beta = b.r0 == 0 ? 0.0f : 1.0f;
    const int64_t n = a.L * b.rows * a.T;
    const SliceMatrices<const E> qBlock = querySlices(a, q, a.S, a.D, b.r0),
                                 dyBlock = resultSlices(a, dy, a.S, a.Dv, b.r0);
    sliceGemms<E, float>(op, a, false, true, b.rows, a.T, a.D, qBlock, keySlices(a, k, a.T, a.D), 0.0f,
                         blockSlices(a, p, block));
    if (n > 0) {
      attentionProbabilitiesKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(p, b, lse, n);
      detail::checkLaunch(op);
    }
    // dP = dy · vᵀ; dz (and P dropped out, with dropout); dv += Pᵀ · dy;
    // dq = dz · k; dk += dzᵀ · q.
    sliceGemms<E, float>(op, a, false, true, b.rows, a.T, a.Dv, dyBlock, keySlices(a, v, a.T, a.Dv), 0.0f,
                         blockSlices(a, dz, block));
    if (n > 0) {
      attentionScoreGradKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(
          p, dz, b, drop, dropoutStreamKey, dot, n);
      detail::checkLaunch(op);
      if constexpr (std::is_same_v<E, bf16>) {
        const int64_t segments = a.L * b.rows;
        launchPerSegment(segments, a.T, 1, [&](auto lanes, unsigned grid, unsigned threads) {
          using P = decltype(lanes);
          packScoreRowsKernel<P><<<grid, threads, 0, detail::stream()>>>(p, dz, b, segments);
        });
        detail::checkLaunch(op);
      }
    }
    sliceGemms<E, E>(op, a, true, false, a.T, a.Dv, b.rows, pE, dyBlock, beta, dvSlices);
    sliceGemms<E, E>(op, a, false, false, b.rows, a.D, a.T, dzE, keySlices(a, k, a.T, a.D), 0.0f,
                     querySlices(a, dq, a.S, a.D, b.r0));
    sliceGemms<E, E>(op, a, true, false, a.T, a.D, b.rows, dzE, qBlock, beta, dkSlices);
  }
}

} // namespace

void attention(const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float dropoutRatio, bool training, StreamKey dropoutStreamKey, float *y, float *lse,
               const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  attentionT(q, qs, k, ks, v, vs, mask, additive, ms, scale, divide, fill, maskedWhen, dropoutRatio, training,
             dropoutStreamKey, y, lse, workspace, layout, jointHeads);
}
void attention(const bf16 *q, const Shape &qs, const bf16 *k, const Shape &ks, const bf16 *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float dropoutRatio, bool training, StreamKey dropoutStreamKey, bf16 *y, float *lse,
               const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  // cuDNN's flash attention first (attention_cudnn.cu); pipec's kernels for what it declines.
  const flash::AttentionOperands operands{
      q, k, v, qs, ks, vs, mask, additive, ms, scale, divide, fill, maskedWhen, dropoutRatio, training,
      dropoutStreamKey, workspace, layout, jointHeads};
  if (flash::attention(operands, y, lse)) return;
  attentionT(q, qs, k, ks, v, vs, mask, additive, ms, scale, divide, fill, maskedWhen, dropoutRatio, training,
             dropoutStreamKey, y, lse, workspace, layout, jointHeads);
}

void attentionGrad(const float *dy, const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const float *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                   bool training, StreamKey dropoutStreamKey, float *dq, float *dk, float *dv,
                   const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  attentionGradT(dy, q, qs, k, ks, v, vs, mask, additive, ms, y, lse, scale, divide, fill, maskedWhen, dropoutRatio,
                 training, dropoutStreamKey, dq, dk, dv, workspace, layout, jointHeads);
}
void attentionGrad(const bf16 *dy, const bf16 *q, const Shape &qs, const bf16 *k, const Shape &ks, const bf16 *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const bf16 *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                   bool training, StreamKey dropoutStreamKey, bf16 *dq, bf16 *dk, bf16 *dv,
                   const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  const flash::AttentionOperands operands{
      q, k, v, qs, ks, vs, mask, additive, ms, scale, divide, fill, maskedWhen, dropoutRatio, training,
      dropoutStreamKey, workspace, layout, jointHeads};
  if (flash::attentionGrad(operands, dy, y, lse, dq, dk, dv)) return;
  attentionGradT(dy, q, qs, k, ks, v, vs, mask, additive, ms, y, lse, scale, divide, fill, maskedWhen, dropoutRatio,
                 training, dropoutStreamKey, dq, dk, dv, workspace, layout, jointHeads);
}

//===----------------------------------------------------------------------===//
// nn.softmax_cross_entropy_loss (+ _grad)
//===----------------------------------------------------------------------===//

namespace {
// The scratch (per-element loss terms, the weight sum) is double whatever
// the scores' storage: bf16 needs what float needs.
template <class L, class T>
void lossT(const T *scores, const Shape &ss, const L *labels, const float *weights, Reduction reduction,
           std::optional<int64_t> ignoreIndex, float *loss, T *logProb, const Workspace &workspace, int64_t classes) {
  const char *op = "nn.softmax_cross_entropy_loss";
  const AxisView v = lossView(op, ss);
  const int64_t segments = v.outer * v.inner; // loss elements (n, d...)
  const bool none = reduction == Reduction::None;
  if (segments == 0) {
    if (!none) { // an empty sum is 0, an empty mean 0/0
      lossReduceKernel<<<1, 32, 0, detail::stream()>>>(nullptr, nullptr, 0, reduction == Reduction::Mean, loss);
      detail::checkLaunch(op);
    }
    return;
  }
  Scratch scratch(op, workspace, softmaxCrossEntropyScratch(ScratchTarget::Cuda, ss, reduction, false));
  double *lossE = none ? nullptr : scratch.shared<double>(2 * segments);
  double *weightE = none ? nullptr : lossE + segments;
  int *flag = detail::errorFlag();
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    lossKernel<P, L, T><<<grid, block, 0, detail::stream()>>>(scores, labels, weights, segments, v.size, v.inner,
                                                           labelRule(op, v, ignoreIndex, classes), flag,
                                                           none ? loss : nullptr, lossE,
                                                           weightE, logProb);
  });
  detail::checkLaunch(op);
  if (!none) {
    lossReduceKernel<<<1, kReduceThreads, 0, detail::stream()>>>(lossE, weightE, segments,
                                                                 reduction == Reduction::Mean, loss);
    detail::checkLaunch(op);
  }
}

template <class L, class T>
void lossGradT(const float *dloss, const T *scores, const Shape &ss, const L *labels, const float *weights,
               Reduction reduction, std::optional<int64_t> ignoreIndex, T *dscores, const Workspace &workspace,
               int64_t classes) {
  const char *op = "nn.softmax_cross_entropy_loss_grad";
  const AxisView v = lossView(op, ss);
  const int64_t segments = v.outer * v.inner;
  if (segments == 0) return;
  const LabelRule rule = labelRule(op, v, ignoreIndex, classes);
  int *flag = detail::errorFlag();
  Scratch scratch(op, workspace, softmaxCrossEntropyScratch(ScratchTarget::Cuda, ss, reduction, true));
  double *weightSum = reduction == Reduction::Mean ? scratch.shared<double>(1) : nullptr;
  if (reduction == Reduction::Mean) {
    weightSumKernel<L><<<1, kReduceThreads, 0, detail::stream()>>>(labels, weights, segments, rule, flag,
                                                                   weightSum);
    detail::checkLaunch(op);
  }
  const bool none = reduction == Reduction::None;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    lossGradKernel<P, L, T><<<grid, block, 0, detail::stream()>>>(dloss, scores, labels, weights, segments,
                                                                  v.size, v.inner, rule, flag, none, weightSum,
                                                                  dscores);
  });
  detail::checkLaunch(op);
}
} // namespace

template <class L>
void softmaxCrossEntropyLoss(const float *scores, const Shape &ss, const L *labels, const float *weights,
                             Reduction reduction, std::optional<int64_t> ignoreIndex, float *loss, float *logProb,
                             const Workspace &workspace, int64_t classes) {
  lossT(scores, ss, labels, weights, reduction, ignoreIndex, loss, logProb, workspace, classes);
}
template <class L>
void softmaxCrossEntropyLoss(const bf16 *scores, const Shape &ss, const L *labels, const float *weights,
                             Reduction reduction, std::optional<int64_t> ignoreIndex, float *loss, bf16 *logProb,
                             const Workspace &workspace, int64_t classes) {
  lossT(scores, ss, labels, weights, reduction, ignoreIndex, loss, logProb, workspace, classes);
}
template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const float *scores, const Shape &ss, const L *labels,
                                 const float *weights, Reduction reduction, std::optional<int64_t> ignoreIndex,
                                 float *dscores, const Workspace &workspace, int64_t classes) {
  lossGradT(dloss, scores, ss, labels, weights, reduction, ignoreIndex, dscores, workspace, classes);
}
template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const bf16 *scores, const Shape &ss, const L *labels,
                                 const float *weights, Reduction reduction, std::optional<int64_t> ignoreIndex,
                                 bf16 *dscores, const Workspace &workspace, int64_t classes) {
  lossGradT(dloss, scores, ss, labels, weights, reduction, ignoreIndex, dscores, workspace, classes);
}

template void softmaxCrossEntropyLoss<int64_t>(const float *, const Shape &, const int64_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, float *, const Workspace &, int64_t);
template void softmaxCrossEntropyLoss<int32_t>(const float *, const Shape &, const int32_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, float *, const Workspace &, int64_t);
template void softmaxCrossEntropyLossGrad<int64_t>(const float *, const float *, const Shape &, const int64_t *,
                                                   const float *, Reduction, std::optional<int64_t>, float *,
                                                   const Workspace &, int64_t);
template void softmaxCrossEntropyLossGrad<int32_t>(const float *, const float *, const Shape &, const int32_t *,
                                                   const float *, Reduction, std::optional<int64_t>, float *,
                                                   const Workspace &, int64_t);
template void softmaxCrossEntropyLoss<int64_t>(const bf16 *, const Shape &, const int64_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, bf16 *, const Workspace &, int64_t);
template void softmaxCrossEntropyLoss<int32_t>(const bf16 *, const Shape &, const int32_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, bf16 *, const Workspace &, int64_t);
template void softmaxCrossEntropyLossGrad<int64_t>(const float *, const bf16 *, const Shape &, const int64_t *,
                                                   const float *, Reduction, std::optional<int64_t>, bf16 *,
                                                   const Workspace &, int64_t);
template void softmaxCrossEntropyLossGrad<int32_t>(const float *, const bf16 *, const Shape &, const int32_t *,
                                                   const float *, Reduction, std::optional<int64_t>, bf16 *,
                                                   const Workspace &, int64_t);

} // namespace pipec::kernels::cuda
