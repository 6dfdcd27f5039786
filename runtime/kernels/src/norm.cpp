// Batch and layer normalization with their input and parameter gradients.
// Statistics accumulate in double; element-wise work is float.
#include "detail.h"
#include "pipec/unary_math.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace pipec::kernels {

using namespace detail;

namespace {
struct ChannelView {
  int64_t N, C, inner;
};
ChannelView channelView(const char *op, const Shape &xs) {
  checkRank(op, xs, 2, "the input (N, C, ...)");
  return {xs.v[0], xs.v[1], productOf(xs, 2, xs.size)};
}

/// Σ over channel c of f(offset of an element), f returning K floats (K
/// sums in one pass over the channel): per sum 32 float lanes (four AVX2
/// vectors: four add chains in flight) running across the samples' runs;
/// after kTermsPerLane terms each the lanes' sum moves to a double. A lane
/// never adds more than kTermsPerLane terms in float, so a channel of 10^5
/// and more elements keeps double's relative error between flushes
/// (docs/cpu-kernels.md). The order is fixed, and the same for each of the K
/// sums as for one alone: the bits do not depend on threads, on the vector
/// width or on K.
template <int K, class F> std::array<double, K> channelSums(const ChannelView &v, int64_t c, F f) {
  constexpr int64_t kLanes = 32, kTermsPerLane = 16;
  std::array<double, K> s{};
  float acc[K][kLanes] = {};
  int64_t terms = 0;
  auto flush = [&] {
    for (int k = 0; k < K; ++k) {
      for (int64_t half = kLanes / 2; half >= 8; half /= 2)
        for (int64_t l = 0; l < half; ++l) acc[k][l] += acc[k][l + half];
      for (int64_t l = 0; l < 8; ++l) s[k] += acc[k][l];
      for (int64_t l = 0; l < kLanes; ++l) acc[k][l] = 0;
    }
    terms = 0;
  };
  for (int64_t n = 0; n < v.N; ++n) {
    const int64_t base = (n * v.C + c) * v.inner;
    int64_t i = 0;
    while (v.inner - i >= kLanes) {
      const int64_t steps = std::min(kTermsPerLane - terms, (v.inner - i) / kLanes);
      for (int64_t step = 0; step < steps; ++step, i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) {
          const std::array<float, K> t = f(base + i + l);
          for (int k = 0; k < K; ++k) acc[k][l] += t[k];
        }
      if ((terms += steps) == kTermsPerLane) flush();
    }
    for (; i < v.inner; ++i) {
      const std::array<float, K> t = f(base + i);
      for (int k = 0; k < K; ++k) s[k] += t[k];
    }
  }
  flush();
  return s;
}

/// One sum of channelSums.
template <class F> double channelSum(const ChannelView &v, int64_t c, F f) {
  return channelSums<1>(v, c, [&](int64_t i) { return std::array<float, 1>{f(i)}; })[0];
}

/// Batch mean and population variance of channel c (two passes; the second
/// sums squared deviations from the float mean), and K more sums over the
/// channel that the second pass computes beside them: f(offset, float mean)
/// gives their terms. The variance has the same bits whatever K is.
template <int K, class F>
std::array<double, K> channelStatsAndSums(const float *x, const ChannelView &v, int64_t c, double &mean,
                                          double &var, F f) {
  const double count = (double)(v.N * v.inner);
  mean = count > 0 ? channelSum(v, c, [&](int64_t i) { return x[i]; }) / count : 0.0;
  const float m = (float)mean;
  const std::array<double, K + 1> sums = channelSums<K + 1>(v, c, [&](int64_t i) {
    const float d = x[i] - m;
    const std::array<float, K> more = f(i, m);
    std::array<float, K + 1> t;
    t[0] = d * d;
    for (int k = 0; k < K; ++k) t[k + 1] = more[k];
    return t;
  });
  var = count > 0 ? sums[0] / count : 0.0;
  std::array<double, K> rest;
  for (int k = 0; k < K; ++k) rest[k] = sums[k + 1];
  return rest;
}

void channelStats(const float *x, const ChannelView &v, int64_t c, double &mean, double &var) {
  channelStatsAndSums<0>(x, v, c, mean, var, [](int64_t, float) { return std::array<float, 0>{}; });
}

/// The gradient a batch norm's backward reads at offset i: dy, or through
/// the activation of its epilogue (ReLU: y > 0 ? dy : 0; nn.unary_grad's
/// formulas).
struct IncomingGradient {
  const float *dy, *y = nullptr;
  EpilogueActivation activation = EpilogueActivation::None;
  float operator()(int64_t i) const { return epilogueActivationGradient(activation, dy[i], y ? y[i] : 0.0f); }
};

/// Σ dy and Σ dy·(x - mean) over channel c, with the batch statistics in
/// training (one pass over x for the mean, one over x and dy for the rest)
/// or the running ones (mean and var given).
std::array<double, 2> channelGradientSums(const IncomingGradient &dy, const float *x, const ChannelView &v,
                                          int64_t c, bool training, double &mean, double &var) {
  auto terms = [&](int64_t i, float m) {
    const float g = dy(i);
    return std::array<float, 2>{g, g * (x[i] - m)};
  };
  if (training) return channelStatsAndSums<2>(x, v, c, mean, var, terms);
  const float m = (float)mean;
  return channelSums<2>(v, c, [&](int64_t i) { return terms(i, m); });
}
} // namespace

void batchNorm(const float *x, const Shape &xs, const float *scale, const float *bias, const float *runningMean,
               const float *runningVar, float *y, float *newMean, float *newVar, float epsilon, float momentum,
               bool training, const float *residual, std::optional<Unary> activation) {
  const ChannelView v = channelView("nn.batch_norm", xs);
  const EpilogueActivation act = epilogueActivation("nn.batch_norm", activation);
  // Channels are independent (statistics, running update, output): one thread each.
  parallelVectorRanges(v.C, xs.numel(), [&](int64_t cBegin, int64_t cEnd) {
    for (int64_t c = cBegin; c < cEnd; ++c) {
      const double rm = runningMean[c], rv = runningVar[c];
      double mean = rm, var = rv;
      if (training) {
        channelStats(x, v, c, mean, var);
        newMean[c] = (float)(momentum * rm + (1.0 - (double)momentum) * mean);
        newVar[c] = (float)(momentum * rv + (1.0 - (double)momentum) * var);
      } else {
        newMean[c] = (float)rm;
        newVar[c] = (float)rv;
      }
      const double invStd = 1.0 / std::sqrt(var + (double)epsilon);
      const float a = (float)(invStd * scale[c]);
      const float b = (float)(bias[c] - mean * invStd * scale[c]);
      for (int64_t n = 0; n < v.N; ++n) {
        const int64_t base = (n * v.C + c) * v.inner;
        const float *p = x + base;
        float *q = y + base;
        for (int64_t i = 0; i < v.inner; ++i) q[i] = p[i] * a + b;
        if (residual)
          for (int64_t i = 0; i < v.inner; ++i) q[i] += residual[base + i];
        if (act != EpilogueActivation::None)
          for (int64_t i = 0; i < v.inner; ++i) q[i] = epilogueActivationValue(act, q[i]);
      }
    }
  });
}

void batchNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const float *runningMean,
                   const float *runningVar, float *dx, float epsilon, bool training, const float *y,
                   std::optional<Unary> activation, float *maskedDy) {
  const char *op = "nn.batch_norm_grad";
  const ChannelView v = channelView(op, xs);
  (void)runningMean;
  const IncomingGradient g{dy, y, epilogueActivation(op, activation)};
  if (g.activation != EpilogueActivation::None && !y) fail(op, "the activation's gradient needs its output y");
  parallelVectorRanges(v.C, xs.numel(), [&](int64_t cBegin, int64_t cEnd) {
    for (int64_t c = cBegin; c < cEnd; ++c) {
      if (maskedDy)
        for (int64_t n = 0; n < v.N; ++n) {
          const int64_t base = (n * v.C + c) * v.inner;
          for (int64_t i = 0; i < v.inner; ++i) maskedDy[base + i] = g(base + i);
        }
      if (!training) {
        const float a = (float)(scale[c] / std::sqrt((double)runningVar[c] + (double)epsilon));
        for (int64_t n = 0; n < v.N; ++n) {
          const int64_t base = (n * v.C + c) * v.inner;
          for (int64_t i = 0; i < v.inner; ++i) dx[base + i] = g(base + i) * a;
        }
        continue;
      }
      double mean, var;
      const auto [sumDy, sumDyCentered] = channelGradientSums(g, x, v, c, true, mean, var);
      const double invStd = 1.0 / std::sqrt(var + (double)epsilon);
      const double count = (double)(v.N * v.inner);
      const float fMean = (float)mean, fInv = (float)invStd;
      // dx = scale * invStd * (dy - mean(dy) - x̂ * mean(dy * x̂))
      const float k = (float)(scale[c] * invStd);
      const float mDy = (float)(sumDy / count), mDyXhat = (float)(sumDyCentered * invStd / count);
      for (int64_t n = 0; n < v.N; ++n) {
        const int64_t base = (n * v.C + c) * v.inner;
        for (int64_t i = 0; i < v.inner; ++i) {
          const float xhat = (x[base + i] - fMean) * fInv;
          dx[base + i] = k * (g(base + i) - mDy - xhat * mDyXhat);
        }
      }
    }
  });
}

void batchNormParamGrad(const float *dy, const float *x, const Shape &xs, const float *runningMean,
                        const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                        bool accumulate) {
  const ChannelView v = channelView("nn.batch_norm_param_grad", xs);
  parallelVectorRanges(v.C, xs.numel(), [&](int64_t cBegin, int64_t cEnd) {
    for (int64_t c = cBegin; c < cEnd; ++c) {
      double mean = runningMean[c], var = runningVar[c];
      const auto [sumDy, sumDyCentered] = channelGradientSums(IncomingGradient{dy}, x, v, c, training, mean, var);
      const double invStd = 1.0 / std::sqrt(var + (double)epsilon);
      const float scaleGrad = (float)(sumDyCentered * invStd), biasGrad = (float)sumDy;
      dscale[c] = accumulate ? dscale[c] + scaleGrad : scaleGrad;
      dbias[c] = accumulate ? dbias[c] + biasGrad : biasGrad;
    }
  });
}

//===----------------------------------------------------------------------===//
// Layer normalization
//===----------------------------------------------------------------------===//

namespace {

/// A parameter of shape ps expanded to the normalized shape (the pointer
/// itself when it already has every element, else a copy in scratch).
const float *expandedParam(const char *op, const float *p, const Shape &ps, const RowView &v, Scratch &scratch) {
  if (!broadcastsTo(ps, v.normalized))
    fail(op, "scale/bias of shape " + ps.str() + " does not broadcast to " + v.normalized.str());
  if (ps.numel() == v.inner) return p;
  float *buf = scratch.shared<float>(v.inner);
  expand(p, ps, buf, v.normalized);
  return buf;
}

void rowStats(const float *x, int64_t inner, double &mean, double &invStd, float epsilon, RowNorm norm) {
  mean = norm == RowNorm::Layer ? laneSum(inner, [&](int64_t i) { return x[i]; }) / (double)inner : 0.0;
  const float fm = (float)mean;
  const double sq = laneSum(inner, [&](int64_t i) { return (x[i] - fm) * (x[i] - fm); });
  invStd = 1.0 / std::sqrt(sq / (double)inner + (double)epsilon);
}
} // namespace

void layerNorm(const float *x, const Shape &xs, const float *scale, const Shape &ss, const float *bias, const Shape &bs,
               float *y, float *mean, float *invStd, int64_t axis, float epsilon, RowNorm norm,
               const Workspace &workspace) {
  const RowView v = rowView("nn.layer_norm", xs, axis);
  Scratch scratch("nn.layer_norm", workspace,
                  layerNormScratch(ScratchTarget::Cpu, xs, ss, bias ? &bs : nullptr, axis));
  const float *g = expandedParam("nn.layer_norm", scale, ss, v, scratch);
  const float *b = bias ? expandedParam("nn.layer_norm", bias, bs, v, scratch) : nullptr;
  parallelVectorRanges(v.rows, v.rows * v.inner, [&](int64_t rBegin, int64_t rEnd) {
    for (int64_t r = rBegin; r < rEnd; ++r) {
      const float *xr = x + r * v.inner;
      float *yr = y + r * v.inner;
      double m, inv;
      rowStats(xr, v.inner, m, inv, epsilon, norm);
      if (mean) mean[r] = (float)m;
      if (invStd) invStd[r] = (float)inv;
      const float fm = (float)m, fi = (float)inv;
      if (b)
        for (int64_t i = 0; i < v.inner; ++i) yr[i] = (xr[i] - fm) * fi * g[i] + b[i];
      else
        for (int64_t i = 0; i < v.inner; ++i) yr[i] = (xr[i] - fm) * fi * g[i];
    }
  });
}

void layerNormGrad(const float *dy, const float *x, const Shape &xs, const float *scale, const Shape &ss, float *dx,
                   int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace) {
  const RowView v = rowView("nn.layer_norm_grad", xs, axis);
  Scratch scratch("nn.layer_norm_grad", workspace, layerNormGradScratch(ScratchTarget::Cpu, xs, ss, axis));
  const float *g = expandedParam("nn.layer_norm_grad", scale, ss, v, scratch);
  parallelVectorRanges(v.rows, v.rows * v.inner, [&](int64_t rBegin, int64_t rEnd) {
    for (int64_t r = rBegin; r < rEnd; ++r) {
      const float *xr = x + r * v.inner, *dyr = dy + r * v.inner;
      float *dxr = dx + r * v.inner;
      double m, inv;
      rowStats(xr, v.inner, m, inv, epsilon, norm);
      const float fm = (float)m, fi = (float)inv;
      const double sumG = norm == RowNorm::Layer ? laneSum(v.inner, [&](int64_t i) { return dyr[i] * g[i]; }) : 0.0;
      const double sumGX = laneSum(v.inner, [&](int64_t i) { return dyr[i] * g[i] * ((xr[i] - fm) * fi); });
      const float mG = (float)(sumG / (double)v.inner), mGX = (float)(sumGX / (double)v.inner);
      for (int64_t i = 0; i < v.inner; ++i) {
        const float xhat = (xr[i] - fm) * fi;
        dxr[i] = fi * (dyr[i] * g[i] - mG - xhat * mGX);
      }
    }
  });
}

void layerNormParamGrad(const float *dy, const float *x, const Shape &xs, const Shape &ps, float *dscale, float *dbias,
                        int64_t axis, float epsilon, RowNorm norm, const Workspace &workspace, bool accumulate) {
  const RowView v = rowView("nn.layer_norm_param_grad", xs, axis);
  if (!broadcastsTo(ps, v.normalized))
    fail("nn.layer_norm_param_grad", "parameter shape " + ps.str() + " does not broadcast to " + v.normalized.str());
  Scratch scratch("nn.layer_norm_param_grad", workspace,
                  layerNormParamGradScratch(ScratchTarget::Cpu, xs, ps, axis, dbias != nullptr, accumulate));
  const bool full = ps.numel() == v.inner;
  // Summed straight into the outputs, or into scratch when the parameters
  // broadcast or the sums are added into the outputs (as a separate sum
  // and accumulate would: the same bits).
  const bool direct = full && !accumulate;
  float *ds = direct ? dscale : scratch.shared<float>(v.inner);
  float *db = direct || !dbias ? dbias : scratch.shared<float>(v.inner);
  float *sumScale = full ? ds : accumulate ? scratch.shared<float>(ps.numel()) : dscale;
  float *sumBias = full || !dbias ? db : accumulate ? scratch.shared<float>(ps.numel()) : dbias;
  float *stats = scratch.shared<float>(2 * v.rows);
  std::fill(ds, ds + v.inner, 0.0f);
  if (db) std::fill(db, db + v.inner, 0.0f);
  const int64_t work = v.rows * v.inner;
  if (threadsFor(work, v.inner) <= 1) {
    for (int64_t r = 0; r < v.rows; ++r) {
      const float *xr = x + r * v.inner, *dyr = dy + r * v.inner;
      double m, inv;
      rowStats(xr, v.inner, m, inv, epsilon, norm);
      const float fm = (float)m, fi = (float)inv;
      for (int64_t i = 0; i < v.inner; ++i) ds[i] += dyr[i] * ((xr[i] - fm) * fi);
      if (db)
        for (int64_t i = 0; i < v.inner; ++i) db[i] += dyr[i];
    }
  } else {
    // The same sums split by column: every ds[i] and db[i] still adds its
    // rows in order 0, 1, ..., with the rows' statistics computed first (in
    // parallel over rows, each row as above).
    parallelVectorRanges(v.rows, work, [&](int64_t rBegin, int64_t rEnd) {
      for (int64_t r = rBegin; r < rEnd; ++r) {
        double m, inv;
        rowStats(x + r * v.inner, v.inner, m, inv, epsilon, norm);
        stats[2 * r] = (float)m, stats[2 * r + 1] = (float)inv;
      }
    });
    parallelVectorRanges(v.inner, work, [&](int64_t lo, int64_t hi) {
      for (int64_t r = 0; r < v.rows; ++r) {
        const float *xr = x + r * v.inner, *dyr = dy + r * v.inner;
        const float fm = stats[2 * r], fi = stats[2 * r + 1];
        for (int64_t i = lo; i < hi; ++i) ds[i] += dyr[i] * ((xr[i] - fm) * fi);
        if (db)
          for (int64_t i = lo; i < hi; ++i) db[i] += dyr[i];
      }
    });
  }
  if (!full) { // sum the broadcast axes away
    auto sumDown = [&](const float *src, float *dst) {
      std::fill(dst, dst + ps.numel(), 0.0f);
      const Shape &ns = v.normalized;
      broadcastLoop<2>(ns, {&ns, &ps}, [&](int64_t, const std::array<int64_t, 2> &o) { dst[o[1]] += src[o[0]]; });
    };
    sumDown(ds, sumScale);
    if (dbias) sumDown(db, sumBias);
  }
  if (accumulate) {
    for (int64_t i = 0; i < ps.numel(); ++i) dscale[i] += sumScale[i];
    if (dbias)
      for (int64_t i = 0; i < ps.numel(); ++i) dbias[i] += sumBias[i];
  }
}

} // namespace pipec::kernels
