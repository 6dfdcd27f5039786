// Batch normalization's per-channel math, shared by its kernels on NCHW
// tensors (norm.cu) and on channels-last ones (batch_norm_nhwc.cu): the
// view of x as channels, the shifted sums with the channel's first element
// as pivot, the statistics and the coefficients every pass applies. Both
// layouts compute the same quantities from these; only the traversal
// differs (docs/cuda-kernels.md, "Algorithms", batch norm).
#ifndef PIPEC_CUDA_KERNELS_BATCH_NORM_CUH
#define PIPEC_CUDA_KERNELS_BATCH_NORM_CUH

#include "nn_common.cuh"
#include "pipec/unary_math.h"

#include <cmath>

namespace pipec::kernels::cuda::bn {

using namespace nn;

/// x as N · C · inner: NCHW [N, C, D1..Dk] (inner = D1·…·Dk), or
/// channels-last [N, D1..Dk, C] seen as N·D1·…·Dk rows of C channels
/// (N the rows, inner 1).
struct ChannelView {
  int64_t N, C, inner;
  __host__ __device__ int64_t count() const { return N * inner; }
};
inline ChannelView channelView(const char *op, const Shape &xs, bool channelsLast) {
  checkRank(op, xs, 2, channelsLast ? "the input (N, ..., C)" : "the input (N, C, ...)");
  if (channelsLast) return {productOf(xs, 0, xs.size - 1), xs.v[xs.size - 1], 1};
  return {xs.v[0], xs.v[1], productOf(xs, 2, xs.size)};
}

/// Element (n, c, i) of x [N, C, inner].
__device__ __forceinline__ int64_t elementOffset(const ChannelView &v, int64_t n, int64_t c, int64_t i) {
  return (n * v.C + c) * v.inner + i;
}
/// Flat position j in [0, N * inner) of channel c.
__device__ __forceinline__ int64_t channelOffset(const ChannelView &v, int64_t c, int64_t j) {
  const int64_t n = j / v.inner;
  return elementOffset(v, n, c, j - n * v.inner);
}

/// The element channel c's sums are shifted by: its first.
template <class T> __device__ __forceinline__ double channelPivot(const T *x, const ChannelView &v, int64_t c) {
  return toF(x[channelOffset(v, c, 0)]);
}

/// The sums a channel's statistics and gradients need, over x shifted by
/// the channel's first element (which keeps E[x²] - E[x]² well conditioned
/// when the mean is far from 0): Σ(x - p), Σ(x - p)², and with dy Σdy,
/// Σdy·(x - p). Doubles.
constexpr int kChannelSums = 4;
struct ChannelSums {
  double shifted = 0, squares = 0, dy = 0, dyShifted = 0;
};

/// The gradient a batch norm's backward reads at i: dy, or through the
/// activation of its epilogue (ReLU: y > 0 ? dy : 0; nn.unary_grad's
/// formulas).
template <class T>
__device__ __forceinline__ float incomingGradient(const T *dy, const T *y, EpilogueActivation act, int64_t i) {
  return act == EpilogueActivation::None ? toF(dy[i]) : epilogueActivationGradient(act, toF(dy[i]), toF(y[i]));
}

/// Σdy·(x - mean) from the shifted sums: Σdy·(x - p) - (mean - p)·Σdy.
__device__ __forceinline__ double centredDySum(const ChannelSums &t, double mean, double pivot) {
  return t.dyShifted - (mean - pivot) * t.dy;
}

/// A channel's batch mean and population variance from its sums.
struct ChannelStats {
  double mean, var;
};
template <class T>
__device__ inline ChannelStats batchStats(const T *x, const ChannelView &v, int64_t c, const ChannelSums &t) {
  const double n = (double)v.count(), shift = n > 0 ? t.shifted / n : 0.0;
  const double var = n > 0 ? t.squares / n - shift * shift : 0.0;
  return {channelPivot(x, v, c) + shift, var > 0 ? var : 0.0};
}

/// Channel c's new running statistics: training, momentum · running +
/// (1 - momentum) · batch; inference, the running ones (st) copied. Reads
/// runningMean[c] and runningVar[c] before it writes, so newMean and newVar
/// may alias them.
__device__ inline void updateRunningStats(const ChannelStats &st, const float *runningMean, const float *runningVar,
                                          float *newMean, float *newVar, float momentum, bool training, int64_t c) {
  if (training) {
    const double rm = runningMean[c], rv = runningVar[c];
    newMean[c] = (float)(momentum * rm + (1.0 - (double)momentum) * st.mean);
    newVar[c] = (float)(momentum * rv + (1.0 - (double)momentum) * st.var);
  } else {
    newMean[c] = (float)st.mean;
    newVar[c] = (float)st.var;
  }
}

/// y = x · a + shift for channel c, before the residual and the activation.
struct AffineCoefficients {
  float a, shift;
};
__device__ __forceinline__ AffineCoefficients affineCoefficients(const ChannelStats &st, const float *scale,
                                                                 const float *bias, float epsilon, int64_t c) {
  const double invStd = 1.0 / sqrt(st.var + (double)epsilon);
  return {(float)(invStd * scale[c]), (float)(bias[c] - st.mean * invStd * scale[c])};
}

/// Training's dx = k · (dy - mean(dy) - x̂ · mean(dy · x̂)), x̂ = (x - mean) ·
/// invStd, for channel c from its sums.
struct GradCoefficients {
  float k, meanDy, meanDyXhat, mean, invStd;
};
template <class T>
__device__ inline GradCoefficients gradCoefficients(const T *x, const ChannelView &v, int64_t c, const ChannelSums &t,
                                                    const float *scale, float epsilon) {
  const ChannelStats st = batchStats(x, v, c, t);
  const double n = (double)v.count(), invStd = 1.0 / sqrt(st.var + (double)epsilon);
  const double dyCentred = centredDySum(t, st.mean, channelPivot(x, v, c));
  return {(float)(scale[c] * invStd), (float)(t.dy / n), (float)(dyCentred * invStd / n), (float)st.mean,
          (float)invStd};
}
__device__ __forceinline__ float gradValue(const GradCoefficients &q, float x, float g) {
  const float xhat = (x - q.mean) * q.invStd;
  return q.k * (g - q.meanDy - xhat * q.meanDyXhat);
}

/// dscale[c] = Σ dy·(x - mean)·invStd, dbias[c] = Σ dy from channel c's
/// sums, with the batch statistics in training, the running ones else;
/// added into dscale and dbias with accumulate.
template <class T>
__device__ inline void writeParamGrads(const T *x, const ChannelView &v, int64_t c, const ChannelSums &t,
                                       const float *runningMean, const float *runningVar, float *dscale,
                                       float *dbias, float epsilon, bool training, bool accumulate) {
  const ChannelStats st = training ? batchStats(x, v, c, t) : ChannelStats{runningMean[c], runningVar[c]};
  const double invStd = 1.0 / sqrt(st.var + (double)epsilon);
  const float scaleGrad = (float)(centredDySum(t, st.mean, channelPivot(x, v, c)) * invStd),
              biasGrad = (float)t.dy;
  dscale[c] = accumulate ? dscale[c] + scaleGrad : scaleGrad;
  dbias[c] = accumulate ? dbias[c] + biasGrad : biasGrad;
}

// The channels-last passes (batch_norm_nhwc.cu; v = channelView(op, xs,
// true), at least one channel), for float and bf16 storage. The gradient's
// is training's only: inference's is element-wise, norm.cu's kernel.
template <class T>
void batchNormLast(const char *op, const T *x, const ChannelView &v, const float *scale, const float *bias,
                   const float *runningMean, const float *runningVar, T *y, float *newMean, float *newVar,
                   float epsilon, float momentum, bool training, const T *residual, EpilogueActivation act);
template <class T>
void batchNormGradLast(const char *op, const T *dy, const T *x, const ChannelView &v, const float *scale, T *dx,
                       float epsilon, const T *y, EpilogueActivation act, T *masked);
template <class T>
void batchNormParamGradLast(const char *op, const T *dy, const T *x, const ChannelView &v, const float *runningMean,
                            const float *runningVar, float *dscale, float *dbias, float epsilon, bool training,
                            bool accumulate);

} // namespace pipec::kernels::cuda::bn

#endif // PIPEC_CUDA_KERNELS_BATCH_NORM_CUH
