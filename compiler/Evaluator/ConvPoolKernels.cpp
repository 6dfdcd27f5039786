// Sliding-window reference kernels and their gradients: N-d convolution and
// the max, average and global average pools.
#include "compiler/Evaluator/KernelsInternal.h"

#include <algorithm>
#include <limits>

namespace pipec::eval::kernels {

using namespace detail;

namespace {

/// A window's geometry over the spatial axes of an (N, C, spatial...) input,
/// shared by the convolution and the pools.
struct Window {
  std::vector<int64_t> kernel, strides, pads, dilations;
  std::vector<int64_t> inputSpatial, outputSpatial;
  size_t spatial() const { return kernel.size(); }
};

/// The window over an input of shape `inputShape` (N, C, spatial...).
Window makeWindow(const std::vector<int64_t> &inputShape, std::vector<int64_t> kernel,
                  std::vector<int64_t> strides, std::vector<int64_t> pads,
                  std::vector<int64_t> dilations, bool ceilMode) {
  if (inputShape.size() < 3)
    throw EvalError("the input (N, C, spatial...) needs rank >= 3, got " +
                    shapeToString(inputShape));
  Window window{std::move(kernel), std::move(strides), std::move(pads), std::move(dilations),
                {}, {}};
  size_t spatial = inputShape.size() - 2;
  if (window.kernel.size() != spatial || window.strides.size() != spatial ||
      window.dilations.size() != spatial || window.pads.size() != 2 * spatial)
    throw EvalError("window attributes do not match " + std::to_string(spatial) +
                    " spatial axes");
  for (size_t axis = 0; axis < spatial; ++axis) {
    int64_t size = inputShape[axis + 2];
    window.inputSpatial.push_back(size);
    int64_t out = windowOutputSize(size, window.kernel[axis], window.strides[axis],
                                   window.pads[axis], window.pads[axis + spatial],
                                   window.dilations[axis], ceilMode);
    if (out <= 0)
      throw EvalError("window larger than the padded input " + shapeToString(inputShape));
    window.outputSpatial.push_back(out);
  }
  return window;
}

/// Calls visit(outputFlat, inputOffset, weightOffset) for every product of
/// nn.conv: the output element, the input element and the weight element it
/// multiplies (positions in the zero padding are skipped), in row-major
/// order of the output, then the input channels, then the kernel positions.
template <typename Visit>
void forEachConvTap(const std::vector<int64_t> &inputShape, const std::vector<int64_t> &weightShape,
                    const std::vector<int64_t> &outShape, const Window &window, int64_t group,
                    Visit visit) {
  size_t spatial = window.spatial();
  int64_t groupChannels = weightShape[1], filtersPerGroup = weightShape[0] / group;
  std::vector<int64_t> kernel(weightShape.begin() + 2, weightShape.end());
  std::vector<int64_t> inStrides = stridesOf(inputShape), wStrides = stridesOf(weightShape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &o) {
    int64_t n = o[0], f = o[1], g = f / filtersPerGroup;
    for (int64_t c = 0; c < groupChannels; ++c)
      forEachIndex(kernel, [&](const std::vector<int64_t> &k) {
        int64_t inOffset = n * inStrides[0] + (g * groupChannels + c) * inStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis) {
          int64_t position = o[axis + 2] * window.strides[axis] - window.pads[axis] +
                             k[axis] * window.dilations[axis];
          if (position < 0 || position >= window.inputSpatial[axis])
            return; // in the zero padding
          inOffset += position * inStrides[axis + 2];
        }
        int64_t wOffset = f * wStrides[0] + c * wStrides[1];
        for (size_t axis = 0; axis < spatial; ++axis)
          wOffset += k[axis] * wStrides[axis + 2];
        visit(flat, inOffset, wOffset);
      });
    ++flat;
  });
}

/// Checks the shapes of a conv gradient and returns its window.
Window convGradWindow(const Tensor &dy, const std::vector<int64_t> &inputShape,
                      const std::vector<int64_t> &weightShape,
                      const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                      const std::vector<int64_t> &dilations, int64_t group) {
  requireFloating(dy, "dy");
  requireRank(dy, 3, "dy (N, F, spatial...)");
  if (inputShape.size() != dy.shape.size() || weightShape.size() != dy.shape.size())
    throw EvalError("dy " + shapeToString(dy.shape) + ", input " + shapeToString(inputShape) +
                    " and weight " + shapeToString(weightShape) + " differ in rank");
  if (group <= 0 || inputShape[1] != weightShape[1] * group || weightShape[0] % group ||
      dy.shape[1] != weightShape[0] || dy.shape[0] != inputShape[0])
    throw EvalError("dy " + shapeToString(dy.shape) + ", input " + shapeToString(inputShape) +
                    ", weight " + shapeToString(weightShape) + " and group " +
                    std::to_string(group) + " do not match");
  std::vector<int64_t> kernel(weightShape.begin() + 2, weightShape.end());
  Window window = makeWindow(inputShape, kernel, strides, pads, dilations, false);
  for (size_t axis = 0; axis < window.spatial(); ++axis)
    if (window.outputSpatial[axis] != dy.shape[axis + 2])
      throw EvalError("dy " + shapeToString(dy.shape) + " is not the conv result of input " +
                      shapeToString(inputShape) + " and weight " + shapeToString(weightShape));
  return window;
}

} // namespace

//===----------------------------------------------------------------------===//
// Convolution
//===----------------------------------------------------------------------===//

Tensor conv(const Tensor &input, const Tensor &weight, const Tensor *bias,
            const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
            const std::vector<int64_t> &dilations, int64_t group) {
  requireFloating(input, "the input");
  requireRank(input, 3, "the input (N, C, spatial...)");
  if (weight.shape.size() != input.shape.size())
    throw EvalError("weight " + shapeToString(weight.shape) + " and input " +
                    shapeToString(input.shape) + " differ in rank");
  int64_t batch = input.shape[0], channels = input.shape[1], filters = weight.shape[0];
  int64_t groupChannels = weight.shape[1];
  if (group <= 0 || channels != groupChannels * group || filters % group)
    throw EvalError(std::to_string(channels) + " input channels, group " +
                    std::to_string(group) + " and weight " + shapeToString(weight.shape) +
                    " do not match");
  std::vector<int64_t> kernel(weight.shape.begin() + 2, weight.shape.end());
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, false);

  std::vector<int64_t> outShape{batch, filters};
  outShape.insert(outShape.end(), window.outputSpatial.begin(), window.outputSpatial.end());
  Tensor out = zeros(input.kind, outShape);
  // Each sum starts from the filter's bias, then adds the products in order.
  if (bias) {
    int64_t flat = 0;
    forEachIndex(outShape, [&](const std::vector<int64_t> &o) {
      out.floats[flat++] = bias->floats[o[1]];
    });
  }
  forEachConvTap(input.shape, weight.shape, outShape, window, group,
                 [&](int64_t outFlat, int64_t inOffset, int64_t wOffset) {
                   out.floats[outFlat] += input.floats[inOffset] * weight.floats[wOffset];
                 });
  return finish(std::move(out));
}

Tensor convInputGrad(const Tensor &dy, const Tensor &weight, const std::vector<int64_t> &inputShape,
                     const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                     const std::vector<int64_t> &dilations, int64_t group) {
  Window window = convGradWindow(dy, inputShape, weight.shape, strides, pads, dilations, group);
  Tensor out = zeros(dy.kind, inputShape);
  forEachConvTap(inputShape, weight.shape, dy.shape, window, group,
                 [&](int64_t outFlat, int64_t inOffset, int64_t wOffset) {
                   out.floats[inOffset] += dy.floats[outFlat] * weight.floats[wOffset];
                 });
  return finish(std::move(out));
}

Tensor convWeightGrad(const Tensor &dy, const Tensor &input,
                      const std::vector<int64_t> &weightShape,
                      const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                      const std::vector<int64_t> &dilations, int64_t group) {
  Window window = convGradWindow(dy, input.shape, weightShape, strides, pads, dilations, group);
  Tensor out = zeros(dy.kind, weightShape);
  forEachConvTap(input.shape, weightShape, dy.shape, window, group,
                 [&](int64_t outFlat, int64_t inOffset, int64_t wOffset) {
                   out.floats[wOffset] += dy.floats[outFlat] * input.floats[inOffset];
                 });
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Pooling
//===----------------------------------------------------------------------===//

namespace {

std::vector<int64_t> pooledShape(const std::vector<int64_t> &inputShape, const Window &window) {
  std::vector<int64_t> shape{inputShape[0], inputShape[1]};
  shape.insert(shape.end(), window.outputSpatial.begin(), window.outputSpatial.end());
  return shape;
}

/// A pool's gradient takes dy of the pooled shape.
void requirePooledShape(const Tensor &dy, const std::vector<int64_t> &inputShape,
                        const Window &window) {
  std::vector<int64_t> pooled = pooledShape(inputShape, window);
  if (dy.shape != pooled)
    throw EvalError("dy " + shapeToString(dy.shape) + " is not the pooled shape " +
                    shapeToString(pooled));
}

/// Calls visit(outputFlat, positions) for every output element of a pool
/// over an input of shape `inputShape`, in row-major order; positions are
/// the window's input offsets (-1 in the padding), each with whether it lies
/// within the padded input.
template <typename Visit>
void forEachWindow(const std::vector<int64_t> &inputShape, const Window &window, Visit visit) {
  std::vector<int64_t> inStrides = stridesOf(inputShape);
  size_t spatial = window.spatial();
  int64_t flat = 0;
  forEachIndex(pooledShape(inputShape, window), [&](const std::vector<int64_t> &o) {
    int64_t channelBase = o[0] * inStrides[0] + o[1] * inStrides[1];
    std::vector<std::pair<int64_t, bool>> positions;
    forEachIndex(window.kernel, [&](const std::vector<int64_t> &k) {
      int64_t offset = channelBase;
      bool inside = true, insidePadded = true;
      for (size_t axis = 0; axis < spatial; ++axis) {
        int64_t p = o[axis + 2] * window.strides[axis] - window.pads[axis] +
                    k[axis] * window.dilations[axis];
        if (p < 0 || p >= window.inputSpatial[axis])
          inside = false;
        if (p < -window.pads[axis] ||
            p >= window.inputSpatial[axis] + window.pads[axis + spatial])
          insidePadded = false;
        offset += p * inStrides[axis + 2];
      }
      positions.push_back({inside ? offset : -1, insidePadded});
    });
    visit(flat++, positions);
  });
}

/// out[flat] = reduce(positions) for every output element of a pool.
template <typename Reduce>
Tensor pool(const Tensor &input, const Window &window, Reduce reduce) {
  Tensor out = zeros(input.kind, pooledShape(input.shape, window));
  forEachWindow(input.shape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  out.floats[flat] = reduce(positions);
                });
  return finish(std::move(out));
}

/// Average pooling has no dilations.
Window averageWindow(const std::vector<int64_t> &inputShape, const std::vector<int64_t> &kernel,
                     const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                     bool ceilMode) {
  return makeWindow(inputShape, kernel, strides, pads, std::vector<int64_t>(kernel.size(), 1),
                    ceilMode);
}

} // namespace

Tensor maxPool(const Tensor &input, const std::vector<int64_t> &kernel,
               const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
               const std::vector<int64_t> &dilations, bool ceilMode) {
  requireFloating(input, "the input");
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, ceilMode);
  return pool(input, window, [&](const std::vector<std::pair<int64_t, bool>> &positions) {
    double best = -std::numeric_limits<double>::infinity();
    for (auto [offset, insidePadded] : positions)
      if (offset >= 0)
        best = std::max(best, input.floats[offset]);
    return best;
  });
}

Tensor averagePool(const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   bool ceilMode, bool countIncludePad) {
  requireFloating(input, "the input");
  Window window = averageWindow(input.shape, kernel, strides, pads, ceilMode);
  return pool(input, window, [&](const std::vector<std::pair<int64_t, bool>> &positions) {
    double sum = 0;
    int64_t count = 0;
    for (auto [offset, insidePadded] : positions) {
      if (offset >= 0)
        sum += input.floats[offset];
      if (countIncludePad ? insidePadded : offset >= 0)
        ++count;
    }
    return sum / static_cast<double>(count);
  });
}

Tensor globalAveragePool(const Tensor &input) {
  requireFloating(input, "the input");
  requireRank(input, 3, "the input (N, C, spatial...)");
  std::vector<int64_t> outShape(input.shape.size(), 1);
  outShape[0] = input.shape[0];
  outShape[1] = input.shape[1];
  Tensor out = zeros(input.kind, outShape);
  int64_t planes = input.shape[0] * input.shape[1];
  int64_t inner = input.numElements() / std::max<int64_t>(planes, 1);
  for (int64_t plane = 0; plane < planes; ++plane) {
    double sum = 0;
    for (int64_t i = 0; i < inner; ++i)
      sum += input.floats[plane * inner + i];
    out.floats[plane] = sum / static_cast<double>(inner);
  }
  return finish(std::move(out));
}

Tensor maxPoolGrad(const Tensor &dy, const Tensor &input, const std::vector<int64_t> &kernel,
                   const std::vector<int64_t> &strides, const std::vector<int64_t> &pads,
                   const std::vector<int64_t> &dilations, bool ceilMode) {
  requireFloating(dy, "dy");
  requireFloating(input, "the input");
  Window window = makeWindow(input.shape, kernel, strides, pads, dilations, ceilMode);
  requirePooledShape(dy, input.shape, window);
  Tensor out = zeros(dy.kind, input.shape);
  forEachWindow(input.shape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  int64_t best = -1;
                  for (auto [offset, insidePadded] : positions)
                    if (offset >= 0 && (best < 0 || input.floats[offset] > input.floats[best]))
                      best = offset;
                  if (best >= 0)
                    out.floats[best] += dy.floats[flat];
                });
  return finish(std::move(out));
}

Tensor averagePoolGrad(const Tensor &dy, const std::vector<int64_t> &inputShape,
                       const std::vector<int64_t> &kernel, const std::vector<int64_t> &strides,
                       const std::vector<int64_t> &pads, bool ceilMode, bool countIncludePad) {
  requireFloating(dy, "dy");
  Window window = averageWindow(inputShape, kernel, strides, pads, ceilMode);
  requirePooledShape(dy, inputShape, window);
  Tensor out = zeros(dy.kind, inputShape);
  forEachWindow(inputShape, window,
                [&](int64_t flat, const std::vector<std::pair<int64_t, bool>> &positions) {
                  int64_t count = 0;
                  for (auto [offset, insidePadded] : positions)
                    if (countIncludePad ? insidePadded : offset >= 0)
                      ++count;
                  for (auto [offset, insidePadded] : positions)
                    if (offset >= 0)
                      out.floats[offset] += dy.floats[flat] / static_cast<double>(count);
                });
  return finish(std::move(out));
}

} // namespace pipec::eval::kernels
