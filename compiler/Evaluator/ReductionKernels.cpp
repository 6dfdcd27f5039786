// Reference kernels that reduce along axes, and their gradients: softmax,
// softmax cross-entropy loss, ReduceMean and ReduceSum.
#include "compiler/Evaluator/KernelsInternal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace pipec::eval::kernels {

using namespace detail;
using import::isFloating;

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

namespace {

/// Along the axis at (o, in): the maximum and the sum of exp(x - maximum).
/// Subtracting the maximum keeps exp() finite; softmax is unchanged by it.
std::pair<double, double> maxAndExpSum(const Tensor &input, const AxisView &view, int64_t o,
                                       int64_t in) {
  double maximum = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < view.size; ++i)
    maximum = std::max(maximum, input.floats[view.at(o, i, in)]);
  double sum = 0;
  for (int64_t i = 0; i < view.size; ++i)
    sum += std::exp(input.floats[view.at(o, i, in)] - maximum);
  return {maximum, sum};
}

/// log(softmax(x)) along `axis`, in double, unrounded.
std::vector<double> logSoftmax(const Tensor &input, int64_t axis) {
  AxisView view = viewAround(input.shape, axis);
  std::vector<double> out(input.floats.size());
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      auto [maximum, sum] = maxAndExpSum(input, view, o, in);
      double logSum = maximum + std::log(sum);
      for (int64_t i = 0; i < view.size; ++i)
        out[view.at(o, i, in)] = input.floats[view.at(o, i, in)] - logSum;
    }
  return out;
}

} // namespace

Tensor softmax(const Tensor &input, int64_t axis) {
  requireFloating(input, "the input");
  axis = normalizeAxis(axis, static_cast<int64_t>(input.shape.size()));
  AxisView view = viewAround(input.shape, axis);
  Tensor out = zeros(input.kind, input.shape);
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      auto [maximum, sum] = maxAndExpSum(input, view, o, in);
      for (int64_t i = 0; i < view.size; ++i)
        out.floats[view.at(o, i, in)] = std::exp(input.floats[view.at(o, i, in)] - maximum) / sum;
    }
  return finish(std::move(out));
}

Tensor softmaxGrad(const Tensor &dy, const Tensor &y, int64_t axis) {
  requireFloating(dy, "dy");
  requireSameShape(dy, y, "dy and y differ");
  axis = normalizeAxis(axis, static_cast<int64_t>(dy.shape.size()));
  AxisView view = viewAround(dy.shape, axis);
  Tensor out = zeros(dy.kind, dy.shape);
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t in = 0; in < view.inner; ++in) {
      double dot = 0;
      for (int64_t i = 0; i < view.size; ++i)
        dot += dy.floats[view.at(o, i, in)] * y.floats[view.at(o, i, in)];
      for (int64_t i = 0; i < view.size; ++i)
        out.floats[view.at(o, i, in)] =
            y.floats[view.at(o, i, in)] * (dy.floats[view.at(o, i, in)] - dot);
    }
  return finish(std::move(out));
}

Tensor maskedSoftmax(const Tensor &input, const Tensor &mask, double scale, bool divide, double fill,
                     bool maskedWhen) {
  Tensor factor = Tensor::ofFloats(input.kind, {}, {scale});
  Tensor filler = Tensor::ofFloats(input.kind, {}, {fill});
  Tensor z = binary(divide ? BinaryOp::Div : BinaryOp::Mul, input, factor);
  z = maskedWhen ? where(mask, filler, z) : where(mask, z, filler);
  return softmax(z, -1);
}

Tensor maskedSoftmaxGrad(const Tensor &dy, const Tensor &y, const Tensor &mask, double scale, bool divide,
                         bool maskedWhen) {
  Tensor g = softmaxGrad(dy, y, -1);
  Tensor zero = Tensor::ofFloats(g.kind, {}, {0.0});
  Tensor factor = Tensor::ofFloats(g.kind, {}, {scale});
  g = maskedWhen ? where(mask, zero, g) : where(mask, g, zero);
  return binary(divide ? BinaryOp::Div : BinaryOp::Mul, g, factor);
}

namespace {
/// x with its last two axes swapped.
Tensor swapLastAxes(const Tensor &x) {
  std::vector<int64_t> perm(x.shape.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(x, perm);
}

/// Query slices per key/value head: the query's heads (axis -3) over the
/// key's, which may be a divisor of them (grouped-query heads).
int64_t headGroup(const Tensor &query, const Tensor &key) {
  const size_t rank = query.shape.size();
  if (rank < 3 || key.shape.size() != rank || key.shape[rank - 3] == query.shape[rank - 3])
    return 1;
  const int64_t queryHeads = query.shape[rank - 3], keyHeads = key.shape[rank - 3];
  if (keyHeads <= 0 || queryHeads % keyHeads != 0)
    throw EvalError("the key's " + std::to_string(keyHeads) + " heads do not divide the query's " +
                    std::to_string(queryHeads));
  return queryHeads / keyHeads;
}

/// x [L..., Hkv, T, D] with each head repeated `group` times in place:
/// [L..., Hkv·group, T, D], as ONNX Attention repeats grouped heads.
Tensor repeatHeads(const Tensor &x, int64_t group) {
  if (group == 1)
    return x;
  std::vector<int64_t> lifted(x.shape), repeated(x.shape);
  lifted.insert(lifted.end() - 2, 1);
  std::vector<int64_t> expanded(lifted);
  expanded[expanded.size() - 3] = group;
  repeated[repeated.size() - 3] *= group;
  return reshape(expand(reshape(x, lifted), expanded), repeated);
}

/// The gradient of repeatHeads: each group of `group` consecutive heads summed.
Tensor sumHeadGroups(const Tensor &dx, int64_t group) {
  if (group == 1)
    return dx;
  std::vector<int64_t> grouped(dx.shape), summed(dx.shape);
  grouped[grouped.size() - 3] /= group;
  grouped.insert(grouped.end() - 2, group);
  summed[summed.size() - 3] /= group;
  return reshape(reduceSum(reshape(dx, grouped), {(int64_t)grouped.size() - 3}, false), summed);
}

/// The attention's z (scaled, masked scores) and P.
std::pair<Tensor, Tensor> attentionProbabilities(const Tensor &query, const Tensor &key, const Tensor *mask,
                                                 double scale, bool divide, double fill, bool maskedWhen) {
  Tensor scores = matmul(query, swapLastAxes(key));
  Tensor factor = Tensor::ofFloats(scores.kind, {}, {scale});
  Tensor z = binary(divide ? BinaryOp::Div : BinaryOp::Mul, scores, factor);
  if (mask && isFloating(mask->kind)) {
    z = binary(BinaryOp::Add, z, *mask); // an additive mask
  } else if (mask) {
    Tensor filler = Tensor::ofFloats(scores.kind, {}, {fill});
    z = maskedWhen ? where(*mask, filler, z) : where(*mask, z, filler);
  }
  Tensor p = softmax(z, -1);
  return {std::move(z), std::move(p)};
}
} // namespace

AttentionResults attention(const Tensor &query, const Tensor &key, const Tensor &value, const Tensor *mask,
                           double scale, bool divide, double fill, bool maskedWhen, double dropoutRatio,
                           uint64_t dropoutStreamKey) {
  requireRank(query, 2, "the query [L..., S, D]");
  const int64_t group = headGroup(query, key);
  auto [z, p] = attentionProbabilities(query, repeatHeads(key, group), mask, scale, divide, fill, maskedWhen);
  // log Σ exp z per row, shifted by the row's maximum.
  const int64_t width = z.shape.back(), rows = width == 0 ? 0 : z.numElements() / width;
  std::vector<int64_t> rowShape = z.shape;
  rowShape.back() = 1;
  Tensor lse = zeros(z.kind, rowShape);
  for (int64_t row = 0; row < rows; ++row) {
    const double *zr = z.floats.data() + row * width;
    const double m = *std::max_element(zr, zr + width);
    double sum = 0;
    for (int64_t j = 0; j < width; ++j)
      sum += std::exp(zr[j] - m);
    lse.floats[row] = m + std::log(sum);
  }
  if (dropoutRatio > 0) // nn.dropout of P, the same mask
    p = dropout(p, dropoutRatio, true, dropoutStreamKey).output;
  return {matmul(p, repeatHeads(value, group)), finish(std::move(lse))};
}

AttentionGrads attentionGrad(const Tensor &dy, const Tensor &query, const Tensor &key, const Tensor &value,
                             const Tensor *mask, double scale, bool divide, double fill, bool maskedWhen,
                             double dropoutRatio, uint64_t dropoutStreamKey) {
  const int64_t group = headGroup(query, key);
  const Tensor keys = repeatHeads(key, group);
  auto [z, p] = attentionProbabilities(query, keys, mask, scale, divide, fill, maskedWhen);
  Tensor dp = matmul(dy, swapLastAxes(repeatHeads(value, group)));
  // The dropout's own gradient rule between the product's and the softmax's;
  // the product's value gradient reads the dropped P.
  Tensor dropped = p;
  if (dropoutRatio > 0) {
    DropoutResults results = dropout(p, dropoutRatio, true, dropoutStreamKey);
    dp = dropoutGrad(dp, results.mask, dropoutRatio, true);
    dropped = std::move(results.output);
  }
  Tensor dz;
  if (mask && !isFloating(mask->kind)) {
    dz = maskedSoftmaxGrad(dp, p, *mask, scale, divide, maskedWhen);
  } else {
    Tensor factor = Tensor::ofFloats(dp.kind, {}, {scale});
    dz = binary(divide ? BinaryOp::Div : BinaryOp::Mul, softmaxGrad(dp, p, -1), factor);
  }
  return {matmul(dz, keys), sumHeadGroups(matmul(swapLastAxes(dz), query), group),
          sumHeadGroups(matmul(swapLastAxes(dropped), dy), group)};
}

//===----------------------------------------------------------------------===//
// Softmax cross-entropy loss
//===----------------------------------------------------------------------===//

namespace {

/// The operand checks softmax_cross_entropy_loss and its gradient share;
/// returns the labels' shape (N, d1, ...).
std::vector<int64_t> checkLossOperands(const Tensor &scores, const Tensor &labels,
                                       const Tensor *weights, const std::string &reduction) {
  requireFloating(scores, "the scores");
  requireRank(scores, 2, "the scores (N, C, ...)");
  if (isFloating(labels.kind))
    throw EvalError("labels must be integers");
  int64_t classes = scores.shape[1];
  std::vector<int64_t> labelShape{scores.shape[0]};
  labelShape.insert(labelShape.end(), scores.shape.begin() + 2, scores.shape.end());
  if (labels.shape != labelShape)
    throw EvalError("labels must have shape " + shapeToString(labelShape) + ", got " +
                    shapeToString(labels.shape));
  if (weights && weights->shape != std::vector<int64_t>{classes})
    throw EvalError("weights must have shape [" + std::to_string(classes) + "]");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    throw EvalError("reduction must be mean, sum or none, got " + reduction);
  return labelShape;
}

/// The weight of every element of the labels (its class's weight, 1 without
/// weights; 0 when its label is ignoreIndex) and the sum over the elements
/// not ignored. Throws on a label out of range.
struct LabelWeights {
  std::vector<double> weights;
  double sum = 0;
};

/// The labels' bound: `classes`, or the whole class axis for 0 (the kernels'
/// pk::lossLabelBound, written again: the evaluator is the reference the
/// kernels are checked against, sharing none of their code).
int64_t labelBound(const Tensor &scores, int64_t classes) {
  if (classes < 0 || classes > scores.shape[1])
    throw EvalError(std::to_string(classes) + " classes for a class axis of " + std::to_string(scores.shape[1]));
  return classes == 0 ? scores.shape[1] : classes;
}

LabelWeights labelWeights(const Tensor &labels, int64_t classes, const Tensor *weights,
                          std::optional<int64_t> ignoreIndex) {
  LabelWeights result{std::vector<double>(labels.numElements(), 0.0), 0};
  for (int64_t flat = 0; flat < labels.numElements(); ++flat) {
    int64_t label = labels.ints[flat];
    if (ignoreIndex && label == *ignoreIndex)
      continue; // contributes 0 and weighs nothing
    if (label < 0 || label >= classes)
      throw EvalError("label " + std::to_string(label) + " out of range [0, " +
                      std::to_string(classes) + ")");
    result.weights[flat] = weights ? weights->floats[label] : 1.0;
    result.sum += result.weights[flat];
  }
  return result;
}

} // namespace

SoftmaxCrossEntropyResults softmaxCrossEntropyLoss(const Tensor &scores, const Tensor &labels,
                                                   const Tensor *weights,
                                                   const std::string &reduction,
                                                   std::optional<int64_t> ignoreIndex, int64_t classes) {
  std::vector<int64_t> labelShape = checkLossOperands(scores, labels, weights, reduction);
  LabelWeights weighted = labelWeights(labels, labelBound(scores, classes), weights, ignoreIndex);

  std::vector<double> logProb = logSoftmax(scores, 1);
  AxisView view = viewAround(scores.shape, 1); // outer = N, inner = d1*d2*...
  std::vector<double> losses(labels.numElements());
  double lossSum = 0;
  for (int64_t n = 0; n < view.outer; ++n)
    for (int64_t in = 0; in < view.inner; ++in) {
      int64_t flat = n * view.inner + in;
      int64_t label = labels.ints[flat];
      if (ignoreIndex && label == *ignoreIndex)
        continue;
      losses[flat] = -weighted.weights[flat] * logProb[view.at(n, label, in)];
      lossSum += losses[flat];
    }

  SoftmaxCrossEntropyResults results;
  if (reduction == "none") {
    results.loss = Tensor::ofFloats(scores.kind, labelShape, losses);
  } else {
    // "mean" over no counted element is 0/0 = NaN, as in ONNX's reference
    // and PyTorch.
    double value = reduction == "sum" ? lossSum : lossSum / weighted.sum;
    results.loss = Tensor::ofFloats(scores.kind, {}, {value});
  }
  results.logProb = Tensor::ofFloats(scores.kind, scores.shape, logProb);
  roundToElementType(results.loss);
  roundToElementType(results.logProb);
  return results;
}

Tensor softmaxCrossEntropyLossGrad(const Tensor &dloss, const Tensor &scores,
                                   const Tensor &labels, const Tensor *weights,
                                   const std::string &reduction,
                                   std::optional<int64_t> ignoreIndex, int64_t labelClasses) {
  std::vector<int64_t> labelShape = checkLossOperands(scores, labels, weights, reduction);
  int64_t classes = scores.shape[1];
  requireFloating(dloss, "dloss");
  std::vector<int64_t> lossShape = reduction == "none" ? labelShape : std::vector<int64_t>{};
  if (dloss.shape != lossShape)
    throw EvalError("dloss must have the loss's shape " + shapeToString(lossShape) + ", got " +
                    shapeToString(dloss.shape));

  std::vector<double> logProb = logSoftmax(scores, 1);
  AxisView view = viewAround(scores.shape, 1);
  LabelWeights weighted = labelWeights(labels, labelBound(scores, labelClasses), weights, ignoreIndex);
  Tensor out = zeros(scores.kind, scores.shape);
  for (int64_t n = 0; n < view.outer; ++n)
    for (int64_t in = 0; in < view.inner; ++in) {
      int64_t flat = n * view.inner + in;
      if (weighted.weights[flat] == 0.0)
        continue;
      double upstream = reduction == "none" ? dloss.floats[flat] : dloss.floats[0];
      double factor =
          upstream * weighted.weights[flat] / (reduction == "mean" ? weighted.sum : 1.0);
      for (int64_t c = 0; c < classes; ++c) {
        double p = std::exp(logProb[view.at(n, c, in)]);
        out.floats[view.at(n, c, in)] = factor * (p - (c == labels.ints[flat] ? 1.0 : 0.0));
      }
    }
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

namespace {
/// The result shape with keepdims (reduced axes as 1) and without.
std::pair<std::vector<int64_t>, std::vector<int64_t>>
reducedShapes(const std::vector<int64_t> &shape, const std::vector<bool> &reduced, bool keepdims) {
  std::vector<int64_t> keptShape, outShape;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    keptShape.push_back(reduced[axis] ? 1 : shape[axis]);
    if (!reduced[axis] || keepdims)
      outShape.push_back(keptShape.back());
  }
  return {keptShape, outShape};
}
} // namespace

Tensor reduceMean(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t axis : axes) {
    if (axis < 0 || axis >= rank)
      throw EvalError("axis " + std::to_string(axis) + " out of range for rank " +
                      std::to_string(rank));
    reduced[axis] = true;
  }
  auto [keptShape, outShape] = reducedShapes(input.shape, reduced, keepdims);
  std::vector<double> sums = sumToShape(input.floats, input.shape, keptShape);
  double count = static_cast<double>(input.numElements()) /
                 static_cast<double>(std::max<int64_t>(product(keptShape), 1));
  for (double &sum : sums)
    sum /= count;
  return finish(Tensor::ofFloats(input.kind, outShape, sums));
}

Tensor reduceSum(const Tensor &input, const std::vector<int64_t> &axes, bool keepdims) {
  requireFloating(input, "the input");
  int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<bool> reduced(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || axes[i] >= rank || (i && axes[i - 1] >= axes[i]))
      throw EvalError("axes must be sorted, unique and in [0, " + std::to_string(rank) + ")");
    reduced[axes[i]] = true;
  }
  auto [keptShape, outShape] = reducedShapes(input.shape, reduced, keepdims);
  return finish(
      Tensor::ofFloats(input.kind, outShape, sumToShape(input.floats, input.shape, keptShape)));
}

} // namespace pipec::eval::kernels
