// Softmax, softmax cross-entropy, reductions.
#include "detail.h"
#include "kernel_plan.h"
#include "pipec/kernel_scratch.h"
#include "pipec/float_math.h"

#include <cmath>
#include <limits>
#include <vector>

namespace pipec::kernels {

using namespace detail;

namespace {
/// Σ e^(z[i·st] - m) over i < n, each term in float, the sum in double
/// (laneSum per block, blocks in order); each term is also stored to
/// terms[i·st] when terms is not null.
/// The exponentials are taken a block at a time so that they vectorize.
double sumOfExponentials(const float *z, int64_t n, int64_t st, float m, float *terms) {
  constexpr int64_t kBlock = 256;
  float block[kBlock];
  double sum = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t len = std::min(kBlock, n - begin);
    const float *zb = z + begin * st;
    withWidestVectors(
        [&](int64_t lo, int64_t hi) {
          if (st == 1) // the common case, a contiguous row
            for (int64_t j = lo; j < hi; ++j) block[j] = expFloat(zb[j] - m);
          else
            for (int64_t j = lo; j < hi; ++j) block[j] = expFloat(zb[j * st] - m);
        },
        0, len);
    sum += laneSum<double>(len, [&](int64_t j) { return block[j]; });
    if (terms)
      for (int64_t j = 0; j < len; ++j) terms[(begin + j) * st] = block[j];
  }
  return sum;
}

/// The largest z[i·st], i < n (-inf for none; a NaN never wins, as in
/// `z > m ? z : m`). A contiguous row runs eight lanes, which the compiler
/// vectorizes; a maximum is exact in any order (a zero's sign may differ,
/// which nothing downstream can tell: z - m and m + log s are the same).
float rowMax(const float *z, int64_t n, int64_t st) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  float m = kLow;
  int64_t i = 0;
  if (st == 1) {
    float lanes[8] = {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow};
    for (; i + 8 <= n; i += 8)
      for (int l = 0; l < 8; ++l) lanes[l] = z[i + l] > lanes[l] ? z[i + l] : lanes[l];
    for (int l = 0; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  }
  for (; i < n; ++i) m = z[i * st] > m ? z[i * st] : m;
  return m;
}

/// One softmax row: y[i·st] = softmax of z[i·st], i < n (the max subtracted
/// first, exponentials in float, their sum in double). z may be y.
void softmaxRow(const float *z, float *y, int64_t n, int64_t st) {
  const float m = rowMax(z, n, st);
  const double sum = sumOfExponentials(z, n, st, m, y);
  const float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) y[i * st] *= inv;
}
} // namespace

void softmax(const float *x, const Shape &xs, int64_t axis, float *y) {
  checkRank("nn.softmax", xs, 1, "the input");
  const AxisView v = viewAround(xs, (int)normalizeAxis("nn.softmax", axis, xs.size));
  // One softmax per (outer, inner) pair, each on one thread as before.
  parallelRanges(v.outer * v.inner, xs.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t o = row / v.inner, in = row % v.inner;
      softmaxRow(x + o * v.size * v.inner + in, y + o * v.size * v.inner + in, v.size, v.inner);
    }
  });
}

void softmaxGrad(const float *dy, const float *y, const Shape &s, int64_t axis, float *dx) {
  checkRank("nn.softmax_grad", s, 1, "the input");
  const AxisView v = viewAround(s, (int)normalizeAxis("nn.softmax_grad", axis, s.size));
  parallelRanges(v.outer * v.inner, s.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t o = row / v.inner, in = row % v.inner;
      const int64_t base = o * v.size * v.inner + in, st = v.inner;
      double dot = 0;
      for (int64_t i = 0; i < v.size; ++i) dot += (double)dy[base + i * st] * y[base + i * st];
      const float fd = (float)dot;
      for (int64_t i = 0; i < v.size; ++i) dx[base + i * st] = y[base + i * st] * (dy[base + i * st] - fd);
    }
  });
}


namespace {
/// Rows (positions but the last axis) of x and, for each, where its mask
/// row starts; the mask broadcasts to x (maskedSoftmaxShapeError in the
/// nn dialect checks the IR, this the call).
struct MaskedRows {
  int64_t rows, size, maskInner; // maskInner: the mask's stride along the last axis (0 or 1)
  int rank;
  int64_t dims[kMaxRank];
  std::array<int64_t, kMaxRank> st; // the mask's broadcast strides
  int64_t maskOffset(int64_t row) const {
    int64_t off = 0;
    for (int a = rank - 2; a >= 0; --a) {
      off += (row % dims[a]) * st[a];
      row /= dims[a];
    }
    return off;
  }
};

MaskedRows maskedRows(const char *op, const Shape &xs, const Shape &ms) {
  checkRank(op, xs, 1, "the input");
  if (!broadcastsTo(ms, xs)) fail(op, "mask of shape " + ms.str() + " does not broadcast to " + xs.str());
  MaskedRows r;
  r.rank = xs.size;
  r.size = xs.v[xs.size - 1];
  r.rows = r.size == 0 ? 0 : xs.numel() / r.size;
  r.st = broadcastStrides(ms, xs);
  r.maskInner = r.st[xs.size - 1];
  for (int a = 0; a < xs.size; ++a) r.dims[a] = xs.v[a];
  return r;
}
} // namespace

void maskedSoftmax(const float *x, const Shape &xs, const uint8_t *mask, const Shape &ms, float scale, bool divide,
                   float fill, bool maskedWhen, float *y) {
  const MaskedRows v = maskedRows("nn.masked_softmax", xs, ms);
  parallelRanges(v.rows, xs.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const float *xr = x + row * v.size;
      float *yr = y + row * v.size;
      const uint8_t *mr = mask + v.maskOffset(row);
      // z, as the unfused scale and where write it, then its softmax in place
      for (int64_t i = 0; i < v.size; ++i)
        yr[i] = (mr[i * v.maskInner] != 0) == maskedWhen ? fill : divide ? xr[i] / scale : xr[i] * scale;
      softmaxRow(yr, yr, v.size, 1);
    }
  });
}

void maskedSoftmaxGrad(const float *dy, const float *y, const Shape &s, const uint8_t *mask, const Shape &ms,
                       float scale, bool divide, bool maskedWhen, float *dx) {
  const MaskedRows v = maskedRows("nn.masked_softmax_grad", s, ms);
  parallelRanges(v.rows, s.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t base = row * v.size;
      const uint8_t *mr = mask + v.maskOffset(row);
      double dot = 0;
      for (int64_t i = 0; i < v.size; ++i) dot += (double)dy[base + i] * y[base + i];
      const float fd = (float)dot;
      for (int64_t i = 0; i < v.size; ++i) {
        const float g = (mr[i * v.maskInner] != 0) == maskedWhen ? 0.0f : y[base + i] * (dy[base + i] - fd);
        dx[base + i] = divide ? g / scale : g * scale;
      }
    }
  });
}


namespace {
/// One block of an attention's z: rows [r0, r0 + rows) of the scores of
/// slice l (z = q · kᵀ), scaled and masked as nn.masked_softmax writes them
/// (or, with an additive mask, the scaled scores plus the mask). The
/// operands' rows are read where the view's layout puts them (a.queryRowOffset,
/// a.queryRowStride as the leading dimension, a.keyRowOffset for k: no copies);
/// z, the mask, lse and the dropout draws are indexed by the logical row
/// l * S + i either way.
void attentionScores(const AttentionView &a, const MaskedRows &m, const float *q, const float *k, const uint8_t *mask,
                     const float *additive, float scale, bool divide, float fill, bool maskedWhen, int64_t l,
                     int64_t r0, int64_t rows, float *z) {
  sgemm(false, true, rows, a.T, a.D, 1.0f, q + a.queryRowOffset(l, r0, a.S, a.D), a.queryRowStride(a.D),
        k + a.keyRowOffset(l, 0, a.T, a.D), a.keyRowStride(a.D), 0.0f, z, a.T);
  for (int64_t i = 0; i < rows; ++i) {
    float *zr = z + i * a.T;
    const int64_t offset = m.maskOffset(l * a.S + r0 + i);
    const uint8_t *mr = mask ? mask + offset : nullptr;
    const float *ar = additive ? additive + offset : nullptr;
    for (int64_t j = 0; j < a.T; ++j) {
      if (mr && (mr[j * m.maskInner] != 0) == maskedWhen) {
        zr[j] = fill;
        continue;
      }
      zr[j] = divide ? zr[j] / scale : zr[j] * scale;
      if (ar) zr[j] += ar[j * m.maskInner];
    }
  }
}
} // namespace

void attention(const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v, const Shape &vs,
               const uint8_t *mask, const float *additive, const Shape &ms, float scale, bool divide, float fill,
               bool maskedWhen, float dropoutRatio, bool training, uint64_t dropoutStreamKey, float *y, float *lse,
               const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  const char *op = "nn.attention";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr, layout, jointHeads);
  const MaskedRows m = maskedRows(op, a.scores, a.masked ? ms : Shape{});
  const DropoutDraws drop = dropoutDraws(op, dropoutRatio, training, dropoutStreamKey);
  Scratch scratch(op, workspace, attentionScratch(ScratchTarget::Cpu, qs, ks, vs, layout));
  const int64_t block = plan::attentionRowsPerBlock(a.S), blocks = block == 0 ? 0 : (a.S + block - 1) / block;
  if (a.T == 0) { // softmax over nothing: P · v is empty sums (y is dense in either layout)
    std::fill(y, y + a.L * a.S * a.Dv, 0.0f);
    std::fill(lse, lse + a.L * a.S, -std::numeric_limits<float>::infinity());
    return;
  }
  parallelRanges(a.L * blocks, a.L * a.S * a.T * (a.D + a.Dv) / 64 + 1, [&](int64_t lo, int64_t hi) {
    float *z = scratch.thread().take<float>(block * a.T);
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t l = item / blocks, r0 = item % blocks * block, rows = std::min(block, a.S - r0);
      attentionScores(a, m, q, k, mask, additive, scale, divide, fill, maskedWhen, l, r0, rows, z);
      for (int64_t i = 0; i < rows; ++i) { // softmax in place, as nn.masked_softmax's rows
        float *zr = z + i * a.T;
        const float mx = rowMax(zr, a.T, 1);
        const double sum = sumOfExponentials(zr, a.T, 1, mx, zr);
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < a.T; ++j) zr[j] *= inv;
        lse[l * a.S + r0 + i] = (float)(mx + std::log(sum));
        if (drop.active) { // P's dropout, element by element as nn.dropout's
          const uint64_t first = (uint64_t)((l * a.S + r0 + i) * a.T);
          for (int64_t j = 0; j < a.T; ++j) zr[j] = drop.apply(zr[j], drop.kept(first + (uint64_t)j));
        }
      }
      sgemm(false, false, rows, a.Dv, a.T, 1.0f, z, a.T, v + a.keyRowOffset(l, 0, a.T, a.Dv), a.keyRowStride(a.Dv), 0.0f,
            y + a.rowOffset(l, r0, a.S, a.Dv), a.rowStride(a.Dv));
    }
  });
}

void attentionGrad(const float *dy, const float *q, const Shape &qs, const float *k, const Shape &ks, const float *v,
                   const Shape &vs, const uint8_t *mask, const float *additive, const Shape &ms, const float *y,
                   const float *lse, float scale, bool divide, float fill, bool maskedWhen, float dropoutRatio,
                   bool training, uint64_t dropoutStreamKey, float *dq, float *dk, float *dv,
                   const Workspace &workspace, AttentionLayout layout, int64_t jointHeads) {
  const char *op = "nn.attention_grad";
  const AttentionView a = attentionView(op, qs, ks, vs, ms, mask != nullptr, additive != nullptr, layout, jointHeads);
  const MaskedRows m = maskedRows(op, a.scores, a.masked ? ms : Shape{});
  const DropoutDraws drop = dropoutDraws(op, dropoutRatio, training, dropoutStreamKey);
  Scratch scratch(op, workspace, attentionGradScratch(ScratchTarget::Cpu, qs, ks, vs, layout));
  // Between rows: of q and dq (ldD), of y and dy (ldDv), of k, dk, v, dv (keyLd).
  const int64_t ldD = a.queryRowStride(a.D), ldDv = a.rowStride(a.Dv), keyLdD = a.keyRowStride(a.D),
                keyLdDv = a.keyRowStride(a.Dv);
  const int64_t block = plan::attentionRowsPerBlock(a.S);
  // One key/value slice per task: its dk and dv sum over its group's query
  // slices and their row blocks in order, so the bits do not depend on the
  // thread count (sequence-major, the slices' rows interleave in memory,
  // but no row belongs to two slices).
  const int64_t keySlices = a.L / a.group;
  parallelRanges(keySlices, a.L * a.S * a.T * (3 * a.D + 2 * a.Dv) / 64 + 1, [&](int64_t lo, int64_t hi) {
    Scratch::Thread part = scratch.thread();
    float *p = part.take<float>(block * a.T), *dz = part.take<float>(block * a.T);
    for (int64_t l = lo * a.group; l < hi * a.group; ++l) {
      const float *kl = k + a.keyRowOffset(l, 0, a.T, a.D), *vl = v + a.keyRowOffset(l, 0, a.T, a.Dv);
      float *dkl = dk + a.keyRowOffset(l, 0, a.T, a.D), *dvl = dv + a.keyRowOffset(l, 0, a.T, a.Dv);
      const bool firstOfGroup = l % a.group == 0;
      if (a.S == 0 && firstOfGroup)
        for (int64_t j = 0; j < a.T; ++j) {
          std::fill(dkl + j * keyLdD, dkl + j * keyLdD + a.D, 0.0f);
          std::fill(dvl + j * keyLdDv, dvl + j * keyLdDv + a.Dv, 0.0f);
        }
      for (int64_t r0 = 0; r0 < a.S; r0 += block) {
        const int64_t rows = std::min(block, a.S - r0), row0 = l * a.S + r0; // row0: logical (lse, mask, dropout)
        const float beta = r0 == 0 && firstOfGroup ? 0.0f : 1.0f;
        const float *dyBlock = dy + a.rowOffset(l, r0, a.S, a.Dv), *yBlock = y + a.rowOffset(l, r0, a.S, a.Dv);
        attentionScores(a, m, q, k, mask, additive, scale, divide, fill, maskedWhen, l, r0, rows, p);
        for (int64_t i = 0; i < rows; ++i) {
          float *pr = p + i * a.T;
          const float shift = lse[row0 + i];
          for (int64_t j = 0; j < a.T; ++j) pr[j] = expFloat(pr[j] - shift);
        }
        // dP = dy · vᵀ; dz from it; then dv += Pᵀ · dy (P dropped out by
        // then, when the forward dropped it).
        sgemm(false, true, rows, a.T, a.Dv, 1.0f, dyBlock, ldDv, vl, keyLdDv, 0.0f, dz, a.T);
        for (int64_t i = 0; i < rows; ++i) {
          const float *dyr = dyBlock + i * ldDv, *yr = yBlock + i * ldDv;
          float *pr = p + i * a.T;
          const uint8_t *mr = mask ? mask + m.maskOffset(row0 + i) : nullptr;
          // rowsum(P ⊙ dP) = dy · y, with dropout too: dP is then
          // (dy · vᵀ) ⊙ M/(1-p) and y = (P ⊙ M/(1-p)) · v.
          double dot = 0;
          for (int64_t e = 0; e < a.Dv; ++e) dot += (double)dyr[e] * yr[e];
          const float fd = (float)dot;
          float *dzr = dz + i * a.T;
          const uint64_t first = (uint64_t)((row0 + i) * a.T);
          for (int64_t j = 0; j < a.T; ++j) {
            // dropoutGrad of dP, and P dropped out for dv, under the forward's mask
            const bool keep = drop.active && drop.kept(first + (uint64_t)j);
            const float dp = drop.active ? drop.apply(dzr[j], keep) : dzr[j];
            const float g = mr && (mr[j * m.maskInner] != 0) == maskedWhen ? 0.0f : pr[j] * (dp - fd);
            dzr[j] = divide ? g / scale : g * scale;
            if (drop.active) pr[j] = drop.apply(pr[j], keep);
          }
        }
        sgemm(true, false, a.T, a.Dv, rows, 1.0f, p, a.T, dyBlock, ldDv, beta, dvl, keyLdDv);
        // dq = dz · k; dk += dzᵀ · q.
        sgemm(false, false, rows, a.D, a.T, 1.0f, dz, a.T, kl, keyLdD, 0.0f, dq + a.queryRowOffset(l, r0, a.S, a.D), ldD);
        sgemm(true, false, a.T, a.D, rows, 1.0f, dz, a.T, q + a.queryRowOffset(l, r0, a.S, a.D), ldD, beta, dkl, keyLdD);
      }
    }
  });
}

namespace {
/// Per (n, d...) element: the log-sum-exp of its class scores.
void logSumExp(const float *scores, const AxisView &v, double *lse) {
  parallelRanges(v.outer * v.inner, v.outer * v.size * v.inner, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t n = row / v.inner, in = row % v.inner;
      const float *s = scores + n * v.size * v.inner + in;
      const float m = rowMax(s, v.size, v.inner);
      // Each term in float (as softmax's), their sum in double.
      const double sum = sumOfExponentials(s, v.size, v.inner, m, nullptr);
      lse[n * v.inner + in] = m + std::log(sum);
    }
  });
}

AxisView lossView(const char *op, const Shape &ss, const float *weights) {
  (void)weights;
  checkRank(op, ss, 2, "the scores (N, C, ...)");
  return viewAround(ss, 1);
}

template <class L> int64_t checkedLabel(const char *op, L label, int64_t classes) {
  if (label < 0 || (int64_t)label >= classes)
    fail(op, "label " + std::to_string((int64_t)label) + " out of range [0, " + std::to_string(classes) + ")");
  return (int64_t)label;
}
} // namespace

template <class L>
void softmaxCrossEntropyLoss(const float *scores, const Shape &ss, const L *labels, const float *weights,
                             Reduction reduction, std::optional<int64_t> ignoreIndex, float *loss, float *logProb,
                             const Workspace &workspace, int64_t classes) {
  const char *op = "nn.softmax_cross_entropy_loss";
  const AxisView v = lossView(op, ss, weights);
  const int64_t bound = lossLabelBound(op, v.size, classes);
  Scratch scratch(op, workspace, softmaxCrossEntropyScratch(ScratchTarget::Cpu, ss, reduction, false));
  double *lse = scratch.shared<double>(v.outer * v.inner);
  logSumExp(scores, v, lse);
  if (logProb)
    parallelVectorRanges(v.outer, v.outer * v.size * v.inner, [&](int64_t nBegin, int64_t nEnd) {
      for (int64_t n = nBegin; n < nEnd; ++n)
        if (v.inner == 1) { // [N, C]: a contiguous row per sample, which vectorizes
          const float *row = scores + n * v.size;
          float *out = logProb + n * v.size;
          const double l = lse[n];
          for (int64_t c = 0; c < v.size; ++c) out[c] = (float)(row[c] - l);
        } else {
          for (int64_t c = 0; c < v.size; ++c)
            for (int64_t in = 0; in < v.inner; ++in) {
              const int64_t i = (n * v.size + c) * v.inner + in;
              logProb[i] = (float)(scores[i] - lse[n * v.inner + in]);
            }
        }
    });
  double lossSum = 0, weightSum = 0;
  for (int64_t n = 0; n < v.outer; ++n)
    for (int64_t in = 0; in < v.inner; ++in) {
      const int64_t e = n * v.inner + in;
      double l = 0;
      if (!(ignoreIndex && (int64_t)labels[e] == *ignoreIndex)) {
        const int64_t label = checkedLabel(op, labels[e], bound);
        const double w = weights ? weights[label] : 1.0;
        l = -w * ((double)scores[(n * v.size + label) * v.inner + in] - lse[e]);
        lossSum += l;
        weightSum += w;
      }
      if (reduction == Reduction::None) loss[e] = (float)l;
    }
  // "mean" over no counted element is 0/0 = NaN, as ONNX's reference and PyTorch.
  if (reduction == Reduction::Sum) loss[0] = (float)lossSum;
  if (reduction == Reduction::Mean) loss[0] = (float)(lossSum / weightSum);
}

template <class L>
void softmaxCrossEntropyLossGrad(const float *dloss, const float *scores, const Shape &ss, const L *labels,
                                 const float *weights, Reduction reduction, std::optional<int64_t> ignoreIndex,
                                 float *dscores, const Workspace &workspace, int64_t classes) {
  const char *op = "nn.softmax_cross_entropy_loss_grad";
  const AxisView v = lossView(op, ss, weights);
  const int64_t bound = lossLabelBound(op, v.size, classes);
  Scratch scratch(op, workspace, softmaxCrossEntropyScratch(ScratchTarget::Cpu, ss, reduction, true));
  double *lse = scratch.shared<double>(v.outer * v.inner);
  logSumExp(scores, v, lse);
  double scale = reduction == Reduction::None ? 1.0 : (double)dloss[0];
  if (reduction == Reduction::Mean) {
    double weightSum = 0;
    for (int64_t e = 0; e < v.outer * v.inner; ++e)
      if (!(ignoreIndex && (int64_t)labels[e] == *ignoreIndex))
        weightSum += weights ? weights[checkedLabel(op, labels[e], bound)] : 1.0;
    scale /= weightSum;
  }
  // Labels checked here: the loop below runs on several threads and must not throw.
  for (int64_t e = 0; e < v.outer * v.inner; ++e)
    if (!(ignoreIndex && (int64_t)labels[e] == *ignoreIndex)) (void)checkedLabel(op, labels[e], bound);
  parallelRanges(v.outer * v.inner, v.outer * v.size * v.inner, [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t n = row / v.inner, in = row % v.inner;
      const int64_t e = n * v.inner + in;
      if (ignoreIndex && (int64_t)labels[e] == *ignoreIndex) {
        for (int64_t c = 0; c < v.size; ++c) dscores[(n * v.size + c) * v.inner + in] = 0.0f;
        continue;
      }
      const int64_t label = (int64_t)labels[e];
      const double k = (weights ? weights[label] : 1.0) * scale * (reduction == Reduction::None ? dloss[e] : 1.0);
      // k·(p - 1) at the label, k·p elsewhere; the label's is written last.
      const auto gradientAt = [&](int64_t c, double target) {
        const int64_t i = (n * v.size + c) * v.inner + in;
        const double p = expFloat((float)((double)scores[i] - lse[e]));
        dscores[i] = (float)(k * (p - target));
      };
      withWidestVectors(
          [&](int64_t lo, int64_t hi) {
            if (v.inner == 1) { // [N, C]: the same terms over a contiguous row, which vectorizes
              const float *row = scores + n * v.size;
              float *out = dscores + n * v.size;
              const double l = lse[e];
              for (int64_t c = lo; c < hi; ++c) out[c] = (float)(k * (double)expFloat((float)((double)row[c] - l)));
            } else {
              for (int64_t c = lo; c < hi; ++c) gradientAt(c, 0.0);
            }
          },
          0, v.size);
      gradientAt(label, 1.0);
    }
  });
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

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

namespace {
/// Sums x over the marked axes into y (double accumulation); returns the
/// number of elements summed into each output.
int64_t sumAxes(const char *op, const float *x, const Shape &xs, const Dims &axes, bool emptyMeansAll, float *y,
                double divide, const Workspace &workspace, bool accumulate = false) {
  const Shape kept = reducedShape(op, xs, axes, emptyMeansAll);
  const int64_t outN = kept.numel(), inN = xs.numel();
  const int64_t count = outN ? inN / outN : 0;
  Scratch scratch(op, workspace, reduceScratch(ScratchTarget::Cpu, xs, axes, emptyMeansAll));
  double *acc = scratch.shared<double>(outN);
  std::fill(acc, acc + outN, 0.0);
  // The kept axis to split across threads: the longest (the first of equals).
  int split = -1;
  for (int a = 0; a < xs.size; ++a)
    if (kept.v[a] > 1 && (split < 0 || xs.v[a] > xs.v[split])) split = a; // a kept axis
  if (split < 0 || threadsFor(inN, xs.v[split]) <= 1) {
    broadcastLoop<2>(xs, {&xs, &kept}, [&](int64_t, const std::array<int64_t, 2> &o) { acc[o[1]] += x[o[0]]; });
  } else {
    // Each thread takes a range of the kept axis `split` and sums the
    // elements of x in that range in row-major order, as the loop above: an
    // output element gets the same terms in the same order (they all share
    // its index on `split`), and no output is summed by two threads.
    const auto xSt = stridesOf(xs), keptSt = broadcastStrides(kept, xs);
    double *accp = acc;
    parallelRanges(xs.v[split], inN, [&](int64_t lo, int64_t hi) {
      Shape part = xs;
      part.v[split] = hi - lo;
      std::array<std::array<int64_t, kMaxRank>, 2> st{xSt, keptSt};
      const float *xp = x + lo * xSt[split];
      double *ap = accp + lo * keptSt[split];
      const int64_t rows = part.numel() / part.v[part.size - 1];
      auto add = [&](int64_t, const std::array<int64_t, 2> &o) { ap[o[1]] += xp[o[0]]; };
      broadcastRows<2>(part, st, 0, rows, add);
    });
  }
  const double k = divide ? 1.0 / ((double)count * divide) : 1.0;
  for (int64_t i = 0; i < outN; ++i) {
    const float v = (float)(divide ? acc[i] * k : acc[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
  return count;
}
} // namespace

void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y, const Workspace &workspace,
               bool accumulate) {
  sumAxes("nn.reduce_sum", x, xs, axes, false, y, 0.0, workspace, accumulate);
}

void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y, const Workspace &workspace) {
  sumAxes("nn.reduce_mean", x, xs, axes, true, y, 1.0, workspace);
}

} // namespace pipec::kernels
