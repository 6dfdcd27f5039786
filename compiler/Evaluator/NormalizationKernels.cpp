// Normalization reference kernels and their gradients: batch norm (training
// and inference) and layer norm.
#include "compiler/Evaluator/KernelsInternal.h"

#include <algorithm>
#include <cmath>

namespace pipec::eval::kernels {

using namespace detail;

//===----------------------------------------------------------------------===//
// Batch normalization
//===----------------------------------------------------------------------===//

namespace {

/// An (N, C, ...) input seen as [batch, channels, inner], with what
/// nn.batch_norm normalizes each channel with: the batch's mean and
/// population variance in training, else the running ones.
struct ChannelStats {
  int64_t batch, channels, inner;
  std::vector<double> means, variances, invStds; // invStd = 1/sqrt(var + eps)
  int64_t at(int64_t n, int64_t c, int64_t i) const { return (n * channels + c) * inner + i; }
};

ChannelStats channelStats(const Tensor &input, const Tensor &runningMean,
                          const Tensor &runningVar, double epsilon, bool training) {
  requireFloating(input, "the input");
  requireRank(input, 2, "the input (N, C, ...)");
  int64_t batch = input.shape[0], channels = input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(batch * channels, 1);
  for (const Tensor *stat : {&runningMean, &runningVar})
    if (stat->shape != std::vector<int64_t>{channels})
      throw EvalError("mean and variance must have shape [" + std::to_string(channels) +
                      "], got " + shapeToString(stat->shape));
  ChannelStats stats{batch, channels, inner, {}, {}, {}};
  for (int64_t c = 0; c < channels; ++c) {
    double mean = runningMean.floats[c], variance = runningVar.floats[c];
    if (training) {
      double count = static_cast<double>(batch * inner), sum = 0, squares = 0;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i)
          sum += input.floats[stats.at(n, c, i)];
      mean = sum / count;
      for (int64_t n = 0; n < batch; ++n)
        for (int64_t i = 0; i < inner; ++i) {
          double d = input.floats[stats.at(n, c, i)] - mean;
          squares += d * d;
        }
      variance = squares / count;
    }
    stats.means.push_back(mean);
    stats.variances.push_back(variance);
    stats.invStds.push_back(1.0 / std::sqrt(variance + epsilon));
  }
  return stats;
}

} // namespace

BatchNormResults batchNorm(const Tensor &input, const Tensor &scale, const Tensor &bias,
                           const Tensor &runningMean, const Tensor &runningVar, double epsilon,
                           double momentum, bool training) {
  requireFloating(input, "the input");
  requireRank(input, 2, "the input (N, C, ...)");
  int64_t channels = input.shape[1];
  for (const Tensor *stat : {&scale, &bias, &runningMean, &runningVar})
    if (stat->shape != std::vector<int64_t>{channels})
      throw EvalError("scale, bias, mean and variance must have shape [" +
                      std::to_string(channels) + "], got " + shapeToString(stat->shape));
  ChannelStats stats = channelStats(input, runningMean, runningVar, epsilon, training);

  BatchNormResults results{zeros(input.kind, input.shape), runningMean, runningVar};
  for (int64_t c = 0; c < channels; ++c) {
    double mean = stats.means[c];
    if (training) {
      results.runningMean.floats[c] = momentum * runningMean.floats[c] + (1 - momentum) * mean;
      results.runningVar.floats[c] =
          momentum * runningVar.floats[c] + (1 - momentum) * stats.variances[c];
    }
    for (int64_t n = 0; n < stats.batch; ++n)
      for (int64_t i = 0; i < stats.inner; ++i)
        results.output.floats[stats.at(n, c, i)] =
            (input.floats[stats.at(n, c, i)] - mean) * stats.invStds[c] * scale.floats[c] +
            bias.floats[c];
  }
  roundToElementType(results.output);
  roundToElementType(results.runningMean);
  roundToElementType(results.runningVar);
  return results;
}

Tensor batchNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale,
                     const Tensor &runningMean, const Tensor &runningVar, double epsilon,
                     bool training) {
  requireSameShape(dy, input, "dy and input differ");
  ChannelStats stats = channelStats(input, runningMean, runningVar, epsilon, training);
  if (scale.shape != std::vector<int64_t>{stats.channels})
    throw EvalError("scale must have shape [" + std::to_string(stats.channels) + "]");
  Tensor out = zeros(dy.kind, dy.shape);
  for (int64_t c = 0; c < stats.channels; ++c) {
    double mean = stats.means[c], invStd = stats.invStds[c];
    double sumDy = 0, sumDyXhat = 0, count = static_cast<double>(stats.batch * stats.inner);
    for (int64_t n = 0; n < stats.batch; ++n)
      for (int64_t i = 0; i < stats.inner; ++i) {
        double xhat = (input.floats[stats.at(n, c, i)] - mean) * invStd;
        sumDy += dy.floats[stats.at(n, c, i)];
        sumDyXhat += dy.floats[stats.at(n, c, i)] * xhat;
      }
    for (int64_t n = 0; n < stats.batch; ++n)
      for (int64_t i = 0; i < stats.inner; ++i) {
        double g = dy.floats[stats.at(n, c, i)];
        if (training) {
          // The batch statistics depend on x: d/dx of (x - mean) * invStd.
          double xhat = (input.floats[stats.at(n, c, i)] - mean) * invStd;
          g = g - sumDy / count - xhat * sumDyXhat / count;
        }
        out.floats[stats.at(n, c, i)] = scale.floats[c] * invStd * g;
      }
  }
  return finish(std::move(out));
}

ParamGrads batchNormParamGrad(const Tensor &dy, const Tensor &input, const Tensor &runningMean,
                              const Tensor &runningVar, double epsilon, bool training) {
  requireSameShape(dy, input, "dy and input differ");
  ChannelStats stats = channelStats(input, runningMean, runningVar, epsilon, training);
  ParamGrads grads{zeros(dy.kind, {stats.channels}), zeros(dy.kind, {stats.channels})};
  for (int64_t n = 0; n < stats.batch; ++n)
    for (int64_t c = 0; c < stats.channels; ++c)
      for (int64_t i = 0; i < stats.inner; ++i) {
        int64_t flat = stats.at(n, c, i);
        grads.scale.floats[c] +=
            dy.floats[flat] * (input.floats[flat] - stats.means[c]) * stats.invStds[c];
        grads.bias.floats[c] += dy.floats[flat];
      }
  roundToElementType(grads.scale);
  roundToElementType(grads.bias);
  return grads;
}

//===----------------------------------------------------------------------===//
// Layer normalization
//===----------------------------------------------------------------------===//

namespace {

/// Rows of a layer norm: [outer, inner] around `axis` (normalized), with
/// each row's mean and 1/sqrt(var + eps).
struct LayerNormRows {
  int64_t axis, outer, inner;
  std::vector<int64_t> normalizedShape;
  std::vector<double> means, invStds;
};

LayerNormRows layerNormRows(const Tensor &input, int64_t axis, double epsilon, bool centered) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  LayerNormRows rows;
  rows.axis = normalizeAxis(axis, rank);
  rows.normalizedShape.assign(input.shape.begin() + rows.axis, input.shape.end());
  rows.outer =
      product(std::vector<int64_t>(input.shape.begin(), input.shape.begin() + rows.axis));
  rows.inner = product(rows.normalizedShape);
  for (int64_t row = 0; row < rows.outer; ++row) {
    const double *x = input.floats.data() + row * rows.inner;
    double mean = 0, variance = 0;
    for (int64_t i = 0; centered && i < rows.inner; ++i)
      mean += x[i];
    mean /= static_cast<double>(rows.inner);
    for (int64_t i = 0; i < rows.inner; ++i)
      variance += (x[i] - mean) * (x[i] - mean);
    variance /= static_cast<double>(rows.inner);
    rows.means.push_back(mean);
    rows.invStds.push_back(1.0 / std::sqrt(variance + epsilon));
  }
  return rows;
}

} // namespace

LayerNormResults layerNorm(const Tensor &input, const Tensor &scale, const Tensor *bias,
                           int64_t axis, double epsilon, bool centered) {
  LayerNormRows rows = layerNormRows(input, axis, epsilon, centered);
  const std::vector<int64_t> &normalizedShape = rows.normalizedShape;
  for (const Tensor *param : {&scale, bias})
    if (param && broadcastTwo(param->shape, normalizedShape) != normalizedShape)
      throw EvalError("scale/bias of shape " + shapeToString(param->shape) +
                      " does not broadcast to " + shapeToString(normalizedShape));
  std::vector<int64_t> statsShape = input.shape;
  std::fill(statsShape.begin() + rows.axis, statsShape.end(), 1);
  LayerNormResults results{zeros(input.kind, input.shape), zeros(input.kind, statsShape),
                           zeros(input.kind, statsShape)};
  for (int64_t row = 0; row < rows.outer; ++row) {
    const double *x = input.floats.data() + row * rows.inner;
    double mean = rows.means[row], invStd = rows.invStds[row];
    results.mean.floats[row] = mean;
    results.invStdDev.floats[row] = invStd;
    int64_t i = 0;
    forEachIndex(normalizedShape, [&](const std::vector<int64_t> &index) {
      double value = (x[i] - mean) * invStd * scale.floats[broadcastOffset(index, scale.shape)];
      if (bias)
        value += bias->floats[broadcastOffset(index, bias->shape)];
      results.output.floats[row * rows.inner + i] = value;
      ++i;
    });
  }
  roundToElementType(results.output);
  roundToElementType(results.mean);
  roundToElementType(results.invStdDev);
  return results;
}

Tensor layerNormGrad(const Tensor &dy, const Tensor &input, const Tensor &scale, int64_t axis,
                     double epsilon, bool centered) {
  requireSameShape(dy, input, "dy and input differ");
  LayerNormRows rows = layerNormRows(input, axis, epsilon, centered);
  if (broadcastTwo(scale.shape, rows.normalizedShape) != rows.normalizedShape)
    throw EvalError("scale of shape " + shapeToString(scale.shape) + " does not broadcast to " +
                    shapeToString(rows.normalizedShape));
  // g = dy * scale; dx = invStd * (g - mean(g) - xhat * mean(g * xhat)),
  // without mean(g) when not centered (the mean is no function of x then).
  std::vector<double> scaleFull(rows.inner);
  int64_t flat = 0;
  forEachIndex(rows.normalizedShape, [&](const std::vector<int64_t> &index) {
    scaleFull[flat++] = scale.floats[broadcastOffset(index, scale.shape)];
  });
  Tensor out = zeros(dy.kind, dy.shape);
  double count = static_cast<double>(rows.inner);
  for (int64_t row = 0; row < rows.outer; ++row) {
    int64_t base = row * rows.inner;
    double sumG = 0, sumGXhat = 0;
    for (int64_t i = 0; i < rows.inner; ++i) {
      double g = dy.floats[base + i] * scaleFull[i];
      double xhat = (input.floats[base + i] - rows.means[row]) * rows.invStds[row];
      sumG += g;
      sumGXhat += g * xhat;
    }
    for (int64_t i = 0; i < rows.inner; ++i) {
      double g = dy.floats[base + i] * scaleFull[i];
      double xhat = (input.floats[base + i] - rows.means[row]) * rows.invStds[row];
      out.floats[base + i] =
          rows.invStds[row] * (g - (centered ? sumG / count : 0.0) - xhat * sumGXhat / count);
    }
  }
  return finish(std::move(out));
}

ParamGrads layerNormParamGrad(const Tensor &dy, const Tensor &input, int64_t axis,
                              double epsilon, bool centered, const std::vector<int64_t> &scaleShape,
                              const std::vector<int64_t> &biasShape) {
  requireSameShape(dy, input, "dy and input differ");
  LayerNormRows rows = layerNormRows(input, axis, epsilon, centered);
  std::vector<double> dscale(rows.inner, 0.0), dbias(rows.inner, 0.0);
  for (int64_t row = 0; row < rows.outer; ++row)
    for (int64_t i = 0; i < rows.inner; ++i) {
      int64_t flat = row * rows.inner + i;
      double xhat = (input.floats[flat] - rows.means[row]) * rows.invStds[row];
      dscale[i] += dy.floats[flat] * xhat;
      dbias[i] += dy.floats[flat];
    }
  ParamGrads grads{
      Tensor::ofFloats(dy.kind, scaleShape, sumToShape(dscale, rows.normalizedShape, scaleShape)),
      Tensor::ofFloats(dy.kind, biasShape, sumToShape(dbias, rows.normalizedShape, biasShape))};
  roundToElementType(grads.scale);
  roundToElementType(grads.bias);
  return grads;
}

} // namespace pipec::eval::kernels
