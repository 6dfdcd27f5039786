// Softmax, its gradient, and softmax cross-entropy with its gradient, as the
// CPU kernels (runtime/kernels/src/reduce.cpp): the max in float, every
// exponential in float, their sums, the loss's log-sum-exp and the gradient
// dot products in double. A segment (the values along the
// axis of one position) is walked by one block (contiguous rows, or few
// segments) or one thread (strided segments); scalar losses are reduced by
// a single block. All reductions are fixed-order: deterministic.
#include "gemm.cuh"
#include "kernel_plan.h"
#include "nn_common.cuh"

#include <cmath>

namespace pipec::kernels::cuda {

namespace {

using namespace nn;

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

/// One segment's softmax: y[i·stride] = softmax of z[i·stride], i < size,
/// by P's lanes (each reads only the elements it writes: z may be y); lse,
/// when given, gets log Σ exp z (from the first lane).
template <class P>
__device__ void softmaxSegment(const float *z, float *y, int64_t size, int64_t stride, float *lse = nullptr) {
  float m = -INFINITY;
  for (int64_t i = P::lane(); i < size; i += P::lanes()) m = z[i * stride] > m ? z[i * stride] : m;
  m = P::reduce(m, MaxOp{});
  double sum = 0;
  for (int64_t i = P::lane(); i < size; i += P::lanes()) {
    const float e = expf(z[i * stride] - m);
    y[i * stride] = e;
    sum += e;
  }
  sum = P::reduce(sum, SumOp{});
  const float inv = (float)(1.0 / sum);
  for (int64_t i = P::lane(); i < size; i += P::lanes()) y[i * stride] *= inv;
  if (lse && P::lane() == 0) *lse = (float)(m + log(sum));
}

template <class P> __global__ void softmaxKernel(const float *x, float *y, int64_t segments, int64_t size, int64_t inner) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t o = seg / inner, in = seg - o * inner;
    softmaxSegment<P>(x + o * size * inner + in, y + o * size * inner + in, size, inner);
  }
}

template <class P>
__global__ void softmaxGradKernel(const float *dy, const float *y, float *dx, int64_t segments, int64_t size,
                                  int64_t inner) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t o = seg / inner, in = seg - o * inner;
    const int64_t base = o * size * inner + in;
    double dot = 0;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i * inner;
      dot += (double)dy[j] * y[j];
    }
    dot = P::reduce(dot, SumOp{});
    const float fd = (float)dot;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i * inner;
      dx[j] = y[j] * (dy[j] - fd);
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

/// softmaxSegment along the last axis of z = masked ? fill : x * scale
/// (x / scale), written to y first.
template <class P>
__global__ void maskedSoftmaxKernel(const float *x, const uint8_t *mask, detail::IndexMap<1> map, float scale,
                                    bool divide, float fill, bool maskedWhen, float *y, int64_t segments,
                                    int64_t size) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t base = seg * size;
    for (int64_t i = P::lane(); i < size; i += P::lanes())
      y[base + i] = maskedAt(mask, map, base + i, maskedWhen) ? fill
                    : divide                                   ? x[base + i] / scale
                                                               : x[base + i] * scale;
    softmaxSegment<P>(y + base, y + base, size, 1);
  }
}

template <class P>
__global__ void maskedSoftmaxGradKernel(const float *dy, const float *y, const uint8_t *mask,
                                        detail::IndexMap<1> map, float scale, bool divide, bool maskedWhen,
                                        float *dx, int64_t segments, int64_t size) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    const int64_t base = seg * size;
    double dot = 0;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) dot += (double)dy[base + i] * y[base + i];
    dot = P::reduce(dot, SumOp{});
    const float fd = (float)dot;
    for (int64_t i = P::lane(); i < size; i += P::lanes()) {
      const int64_t j = base + i;
      const float g = maskedAt(mask, map, j, maskedWhen) ? 0.0f : y[j] * (dy[j] - fd);
      dx[j] = divide ? g / scale : g * scale;
    }
  }
}

//===----------------------------------------------------------------------===//
// Attention: blocks of score rows of every slice at once
//===----------------------------------------------------------------------===//

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

/// The forward's softmax of each row of the block, in place, and its lse;
/// then P's dropout (each lane on the elements it wrote).
template <class P>
__global__ void attentionSoftmaxKernel(float *z, ScoreBlock b, DropoutDraws drop, float *lse, int64_t segments) {
  for (int64_t seg = P::first(); seg < segments; seg += P::step()) {
    float *zr = z + b.offset(seg);
    for (int64_t j = P::lane(); j < b.T; j += P::lanes()) zr[j] = b.value(zr[j], seg, j);
    softmaxSegment<P>(zr, zr, b.T, 1, lse + b.row(seg));
    if (drop.active)
      for (int64_t j = P::lane(); j < b.T; j += P::lanes())
        zr[j] = drop.apply(zr[j], drop.kept(b.row(seg) * b.T + j));
  }
}

/// The gradient's P = exp(z - lse), in place (n = L · rows · T elements).
__global__ void attentionProbabilitiesKernel(float *z, ScoreBlock b, const float *lse, int64_t n) {
  for (int64_t e = detail::firstIndex(); e < n; e += detail::gridStride()) {
    const int64_t seg = e / b.T, j = e - seg * b.T, at = b.offset(seg) + j;
    z[at] = expf(b.value(z[at], seg, j) - lse[b.row(seg)]);
  }
}

/// dot[r] = Σ_e dy[r, e] · y[r, e] per row, in double.
template <class P> __global__ void rowDotKernel(const float *dy, const float *y, float *dot, int64_t rows, int64_t n) {
  for (int64_t r = P::first(); r < rows; r += P::step()) {
    double sum = 0;
    for (int64_t e = P::lane(); e < n; e += P::lanes()) sum += (double)dy[r * n + e] * y[r * n + e];
    sum = P::reduce(sum, SumOp{});
    if (P::lane() == 0) dot[r] = (float)sum;
  }
}

/// dz = P ⊙ (dP - dot) (0 where masked), times or divided by scale, into dp.
/// With dropout, dP first goes through dropout's gradient and P, after its
/// use here, is dropped out in place for dv's product (dot = rowsum(dy ⊙ y)
/// is still rowsum(P ⊙ dP): docs/cuda-kernels.md).
__global__ void attentionScoreGradKernel(float *p, float *dp, ScoreBlock b, DropoutDraws drop, const float *dot,
                                         int64_t n) {
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

/// The log-sum-exp of one element's class scores s[c * inner], c in [0, C)
/// (every lane of P gets it): max in float, exponentials and sum in double.
template <class P> __device__ double logSumExp(const float *s, int64_t C, int64_t inner) {
  float m = -INFINITY;
  for (int64_t c = P::lane(); c < C; c += P::lanes()) m = s[c * inner] > m ? s[c * inner] : m;
  m = P::reduce(m, MaxOp{});
  double sum = 0;
  for (int64_t c = P::lane(); c < C; c += P::lanes()) sum += expf(s[c * inner] - m);
  sum = P::reduce(sum, SumOp{});
  return m + log(sum);
}

/// ignoreIndex as the kernels see it.
struct Ignore {
  bool has;
  int64_t value;
};

/// Per element e = (n, d...): lossE[e] = -w[label] * logProb[label] and
/// weightE[e] = w[label] (0 for an ignored element or a label out of
/// range, which is reported); loss[e] = (float)lossE[e] for Reduction::None.
/// logProb (optional) gets every class's score - lse.
template <class P, class L>
__global__ void lossKernel(const float *scores, const L *labels, const float *weights, int64_t segments, int64_t C,
                           int64_t inner, Ignore ignore, int *errorFlag, float *loss, double *lossE,
                           double *weightE, float *logProb) {
  for (int64_t e = P::first(); e < segments; e += P::step()) {
    const int64_t n = e / inner, in = e - n * inner;
    const float *s = scores + n * C * inner + in;
    const double lse = logSumExp<P>(s, C, inner);
    if (logProb) {
      float *lp = logProb + n * C * inner + in;
      for (int64_t c = P::lane(); c < C; c += P::lanes()) lp[c * inner] = (float)(s[c * inner] - lse);
    }
    if (P::leader()) {
      double l = 0, w = 0;
      const int64_t label = (int64_t)labels[e];
      if (!(ignore.has && label == ignore.value)) {
        if (label < 0 || label >= C) {
          detail::raiseDevice(errorFlag, detail::kLossLabelOutOfRange);
        } else {
          w = weights ? (double)weights[label] : 1.0;
          l = -w * ((double)s[label * inner] - lse);
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
__global__ void weightSumKernel(const L *labels, const float *weights, int64_t count, int64_t C, Ignore ignore,
                                int *errorFlag, double *weightSum) {
  double w = 0;
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int64_t label = (int64_t)labels[e];
    if (ignore.has && label == ignore.value) continue;
    if (label < 0 || label >= C) {
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
template <class P, class L>
__global__ void lossGradKernel(const float *dloss, const float *scores, const L *labels, const float *weights,
                               int64_t segments, int64_t C, int64_t inner, Ignore ignore, int *errorFlag,
                               bool none, const double *weightSum, float *dscores) {
  double scale = none ? 1.0 : (double)dloss[0];
  if (weightSum) scale /= *weightSum;
  for (int64_t e = P::first(); e < segments; e += P::step()) {
    const int64_t n = e / inner, in = e - n * inner;
    const float *s = scores + n * C * inner + in;
    float *ds = dscores + n * C * inner + in;
    const int64_t label = (int64_t)labels[e]; // the same for every lane: uniform branches
    const bool ignored = ignore.has && label == ignore.value;
    const bool bad = !ignored && (label < 0 || label >= C);
    if (ignored || bad) {
      if (bad && P::leader()) detail::raiseDevice(errorFlag, detail::kLossLabelOutOfRange);
      for (int64_t c = P::lane(); c < C; c += P::lanes()) ds[c * inner] = 0.0f;
      continue;
    }
    const double lse = logSumExp<P>(s, C, inner);
    const double k = (weights ? (double)weights[label] : 1.0) * scale * (none ? (double)dloss[e] : 1.0);
    for (int64_t c = P::lane(); c < C; c += P::lanes()) {
      const double p = expf((float)((double)s[c * inner] - lse));
      ds[c * inner] = (float)(k * (p - (c == label ? 1.0 : 0.0)));
    }
  }
}

AxisView lossView(const char *op, const Shape &ss) {
  checkRank(op, ss, 2, "the scores (N, C, ...)");
  return viewAround(ss, 1);
}

Ignore ignoreOf(const std::optional<int64_t> &ignoreIndex) {
  return ignoreIndex ? Ignore{true, *ignoreIndex} : Ignore{false, 0};
}

constexpr unsigned kReduceThreads = 1024;

} // namespace

//===----------------------------------------------------------------------===//
// nn.softmax, nn.softmax_grad
//===----------------------------------------------------------------------===//

void softmax(const float *x, const Shape &xs, int64_t axis, float *y) {
  const char *op = "nn.softmax";
  checkRank(op, xs, 1, "the input");
  const AxisView v = viewAround(xs, (int)normalizeAxis(op, axis, xs.size));
  const int64_t segments = v.outer * v.inner;
  if (segments == 0 || v.size == 0) return;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    softmaxKernel<P><<<grid, block, 0, detail::stream()>>>(x, y, segments, v.size, v.inner);
  });
  detail::checkLaunch(op);
}

void softmaxGrad(const float *dy, const float *y, const Shape &s, int64_t axis, float *dx) {
  const char *op = "nn.softmax_grad";
  checkRank(op, s, 1, "the input");
  const AxisView v = viewAround(s, (int)normalizeAxis(op, axis, s.size));
  const int64_t segments = v.outer * v.inner;
  if (segments == 0 || v.size == 0) return;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    softmaxGradKernel<P><<<grid, block, 0, detail::stream()>>>(dy, y, dx, segments, v.size, v.inner);
  });
  detail::checkLaunch(op);
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
} // namespace

void maskedSoftmax(const float *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                   float fill, bool maskedWhen, float *y) {
  const char *op = "nn.masked_softmax";
  const detail::IndexMap<1> map = maskMap(op, xs, ms);
  const int64_t size = xs.v[xs.size - 1], segments = size == 0 ? 0 : xs.numel() / size;
  if (segments == 0) return;
  launchPerSegment(segments, size, 1, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    maskedSoftmaxKernel<P><<<grid, block, 0, detail::stream()>>>(x, mask, map, scale, divide, fill, maskedWhen, y,
                                                                  segments, size);
  });
  detail::checkLaunch(op);
}

void maskedSoftmaxGrad(const float *dy, const float *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, float *dx) {
  const char *op = "nn.masked_softmax_grad";
  const detail::IndexMap<1> map = maskMap(op, s, ms);
  const int64_t size = s.v[s.size - 1], segments = size == 0 ? 0 : s.numel() / size;
  if (segments == 0) return;
  launchPerSegment(segments, size, 1, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    maskedSoftmaxGradKernel<P><<<grid, block, 0, detail::stream()>>>(dy, y, mask, map, scale, divide, maskedWhen,
                                                                      dx, segments, size);
  });
  detail::checkLaunch(op);
}

//===----------------------------------------------------------------------===//
// nn.attention, nn.attention_grad
//===----------------------------------------------------------------------===//

namespace {
ScoreBlock scoreBlock(const AttentionView &a, const uint8_t *mask, const float *additive, const Shape &ms,
                      float scale, bool divide, float fill, bool maskedWhen) {
  ScoreBlock b{a.S, a.T, plan::attentionRowsPerBlock(a.S), 0, 0, mask, additive, {}, scale, fill, divide, maskedWhen};
  if (a.masked) b.map = detail::makeIndexMap<1>(a.scores, {detail::broadcastStrides(ms, a.scores)});
  return b;
}

} // namespace

void attention(const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float dropoutRatio, bool training, uint64_t dropoutStreamKey, float *y, float *lse,
               const Workspace &workspace) {
  const char *op = "nn.attention";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr);
  const DropoutDraws drop = kernels::dropoutDraws(op, dropoutRatio, training, dropoutStreamKey);
  Scratch scratch(op, workspace, attentionScratch(ScratchTarget::Cuda, qs, ks, vs));
  const int64_t block = plan::attentionRowsPerBlock(a.S);
  float *z = scratch.shared<float>(a.L * block * a.T);
  ScoreBlock b = scoreBlock(a, mask, additive, ms, scale, divide, fill, maskedWhen);
  for (b.r0 = 0; b.r0 < a.S; b.r0 += block) {
    b.rows = std::min(block, a.S - b.r0);
    nn::sgemmStridedBatched(op, false, true, b.rows, a.T, a.D, 1.0f, q + b.r0 * a.D, a.D, a.S * a.D, k, a.D,
                            a.T * a.D, 0.0f, z, a.T, block * a.T, a.L);
    const int64_t segments = a.L * b.rows;
    if (a.T > 0) {
      launchPerSegment(segments, a.T, 1, [&](auto lanes, unsigned grid, unsigned threads) {
        using P = decltype(lanes);
        attentionSoftmaxKernel<P><<<grid, threads, 0, detail::stream()>>>(z, b, drop, lse, segments);
      });
      detail::checkLaunch(op);
    }
    nn::sgemmStridedBatched(op, false, false, b.rows, a.Dv, a.T, 1.0f, z, a.T, block * a.T, v, a.Dv, a.T * a.Dv,
                            0.0f, y + b.r0 * a.Dv, a.Dv, a.S * a.Dv, a.L);
  }
}

void attentionGrad(const float *dy, const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const float *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                   bool training, uint64_t dropoutStreamKey, float *dq, float *dk, float *dv,
                   const Workspace &workspace) {
  const char *op = "nn.attention_grad";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr);
  const DropoutDraws drop = kernels::dropoutDraws(op, dropoutRatio, training, dropoutStreamKey);
  Scratch scratch(op, workspace, attentionGradScratch(ScratchTarget::Cuda, qs, ks, vs));
  const int64_t block = plan::attentionRowsPerBlock(a.S);
  float *p = scratch.shared<float>(a.L * block * a.T), *dz = scratch.shared<float>(a.L * block * a.T);
  float *dot = scratch.shared<float>(a.L * a.S);
  if (a.S == 0) { // no rows: the key and value gradients are sums of nothing
    nn::sgemmStridedBatched(op, true, false, a.T, a.D, 0, 1.0f, dz, a.T, 0, q, a.D, 0, 0.0f, dk, a.D, a.T * a.D, a.L);
    nn::sgemmStridedBatched(op, true, false, a.T, a.Dv, 0, 1.0f, p, a.T, 0, dy, a.Dv, 0, 0.0f, dv, a.Dv,
                            a.T * a.Dv, a.L);
    return;
  }
  launchPerSegment(a.L * a.S, a.Dv, 1, [&](auto lanes, unsigned grid, unsigned threads) {
    using P = decltype(lanes);
    rowDotKernel<P><<<grid, threads, 0, detail::stream()>>>(dy, y, dot, a.L * a.S, a.Dv);
  });
  detail::checkLaunch(op);
  ScoreBlock b = scoreBlock(a, mask, additive, ms, scale, divide, fill, maskedWhen);
  for (b.r0 = 0; b.r0 < a.S; b.r0 += block) {
    b.rows = std::min(block, a.S - b.r0);
    const float beta = b.r0 == 0 ? 0.0f : 1.0f;
    const int64_t n = a.L * b.rows * a.T;
    nn::sgemmStridedBatched(op, false, true, b.rows, a.T, a.D, 1.0f, q + b.r0 * a.D, a.D, a.S * a.D, k, a.D,
                            a.T * a.D, 0.0f, p, a.T, block * a.T, a.L);
    if (n > 0) {
      attentionProbabilitiesKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(p, b, lse, n);
      detail::checkLaunch(op);
    }
    // dP = dy · vᵀ; dz (and P dropped out, with dropout); dv += Pᵀ · dy;
    // dq = dz · k; dk += dzᵀ · q.
    nn::sgemmStridedBatched(op, false, true, b.rows, a.T, a.Dv, 1.0f, dy + b.r0 * a.Dv, a.Dv, a.S * a.Dv, v, a.Dv,
                            a.T * a.Dv, 0.0f, dz, a.T, block * a.T, a.L);
    if (n > 0) {
      attentionScoreGradKernel<<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(p, dz, b, drop, dot,
                                                                                                  n);
      detail::checkLaunch(op);
    }
    nn::sgemmStridedBatched(op, true, false, a.T, a.Dv, b.rows, 1.0f, p, a.T, block * a.T, dy + b.r0 * a.Dv, a.Dv,
                            a.S * a.Dv, beta, dv, a.Dv, a.T * a.Dv, a.L);
    nn::sgemmStridedBatched(op, false, false, b.rows, a.D, a.T, 1.0f, dz, a.T, block * a.T, k, a.D, a.T * a.D, 0.0f,
                            dq + b.r0 * a.D, a.D, a.S * a.D, a.L);
    nn::sgemmStridedBatched(op, true, false, a.T, a.D, b.rows, 1.0f, dz, a.T, block * a.T, q + b.r0 * a.D, a.D,
                            a.S * a.D, beta, dk, a.D, a.T * a.D, a.L);
  }
}

//===----------------------------------------------------------------------===//
// nn.softmax_cross_entropy_loss (+ _grad)
//===----------------------------------------------------------------------===//

template <class L>
void softmaxCrossEntropyLoss(const float *scores, const Shape &ss, const L *labels, const float *weights,
                             Reduction reduction, std::optional<int64_t> ignoreIndex, float *loss, float *logProb,
                             const Workspace &workspace) {
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
    lossKernel<P, L><<<grid, block, 0, detail::stream()>>>(scores, labels, weights, segments, v.size, v.inner,
                                                           ignoreOf(ignoreIndex), flag, none ? loss : nullptr, lossE,
                                                           weightE, logProb);
  });
  detail::checkLaunch(op);
  if (!none) {
    lossReduceKernel<<<1, kReduceThreads, 0, detail::stream()>>>(lossE, weightE, segments,
                                                                 reduction == Reduction::Mean, loss);
    detail::checkLaunch(op);
  }
}

template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const float *scores, const Shape &ss, const L *labels,
                                 const float *weights, Reduction reduction, std::optional<int64_t> ignoreIndex,
                                 float *dscores, const Workspace &workspace) {
  const char *op = "nn.softmax_cross_entropy_loss_grad";
  const AxisView v = lossView(op, ss);
  const int64_t segments = v.outer * v.inner;
  if (segments == 0) return;
  const Ignore ignore = ignoreOf(ignoreIndex);
  int *flag = detail::errorFlag();
  Scratch scratch(op, workspace, softmaxCrossEntropyScratch(ScratchTarget::Cuda, ss, reduction, true));
  double *weightSum = reduction == Reduction::Mean ? scratch.shared<double>(1) : nullptr;
  if (reduction == Reduction::Mean) {
    weightSumKernel<L><<<1, kReduceThreads, 0, detail::stream()>>>(labels, weights, segments, v.size, ignore, flag,
                                                                   weightSum);
    detail::checkLaunch(op);
  }
  const bool none = reduction == Reduction::None;
  launchPerSegment(segments, v.size, v.inner, [&](auto lanes, unsigned grid, unsigned block) {
    using P = decltype(lanes);
    lossGradKernel<P, L><<<grid, block, 0, detail::stream()>>>(dloss, scores, labels, weights, segments, v.size,
                                                               v.inner, ignore, flag, none, weightSum,
                                                               dscores);
  });
  detail::checkLaunch(op);
}

template void softmaxCrossEntropyLoss<int64_t>(const float *, const Shape &, const int64_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, float *, const Workspace &);
template void softmaxCrossEntropyLoss<int32_t>(const float *, const Shape &, const int32_t *, const float *, Reduction,
                                               std::optional<int64_t>, float *, float *, const Workspace &);
template void softmaxCrossEntropyLossGrad<int64_t>(const float *, const float *, const Shape &, const int64_t *,
                                                   const float *, Reduction, std::optional<int64_t>, float *,
                                                   const Workspace &);
template void softmaxCrossEntropyLossGrad<int32_t>(const float *, const float *, const Shape &, const int32_t *,
                                                   const float *, Reduction, std::optional<int64_t>, float *,
                                                   const Workspace &);

} // namespace pipec::kernels::cuda
