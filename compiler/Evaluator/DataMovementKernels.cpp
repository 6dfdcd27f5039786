// Data-movement and indexing reference kernels, and their gradients: gather,
// reshape, expand, transpose, concat, split, slice and pad. They copy
// elements of any kind unchanged.
#include "compiler/Evaluator/KernelsInternal.h"

#include <algorithm>

namespace pipec::eval::kernels {

using namespace detail;
using import::isFloating;

//===----------------------------------------------------------------------===//
// Gather
//===----------------------------------------------------------------------===//

namespace {

/// Gather's result shape: data's axes with `axis` replaced by the indices'.
std::vector<int64_t> gatheredShape(const std::vector<int64_t> &dataShape, const Tensor &indices,
                                   int64_t axis) {
  std::vector<int64_t> shape(dataShape.begin(), dataShape.begin() + axis);
  shape.insert(shape.end(), indices.shape.begin(), indices.shape.end());
  shape.insert(shape.end(), dataShape.begin() + axis + 1, dataShape.end());
  return shape;
}

/// Calls visit(dataOffset) for every element of gather's result, in
/// row-major order: the offset in data (viewed around the gathered axis) of
/// the element it reads.
template <typename Visit>
void forEachGathered(const AxisView &view, const Tensor &indices, Visit visit) {
  int64_t count = indices.numElements();
  for (int64_t o = 0; o < view.outer; ++o)
    for (int64_t j = 0; j < count; ++j) {
      int64_t index = indices.ints[j];
      if (index < -view.size || index >= view.size)
        throw EvalError("index " + std::to_string(index) + " out of range for axis size " +
                        std::to_string(view.size));
      if (index < 0)
        index += view.size;
      for (int64_t in = 0; in < view.inner; ++in)
        visit(view.at(o, index, in));
    }
}

} // namespace

Tensor gather(const Tensor &data, const Tensor &indices, int64_t axis) {
  if (isFloating(indices.kind))
    throw EvalError("indices must be integers");
  int64_t rank = static_cast<int64_t>(data.shape.size());
  axis = normalizeAxis(axis, rank);
  Tensor out = zeros(data.kind, gatheredShape(data.shape, indices, axis));
  int64_t flat = 0;
  forEachGathered(viewAround(data.shape, axis), indices,
                  [&](int64_t offset) { copyElement(out, flat++, data, offset); });
  return out;
}

Tensor gatherGrad(const Tensor &dy, const Tensor &indices, int64_t axis,
                  const std::vector<int64_t> &dataShape) {
  requireFloating(dy, "dy");
  if (isFloating(indices.kind))
    throw EvalError("indices must be integers");
  axis = normalizeAxis(axis, static_cast<int64_t>(dataShape.size()));
  std::vector<int64_t> dyShape = gatheredShape(dataShape, indices, axis);
  if (dy.shape != dyShape)
    throw EvalError("dy must have the gather's result shape " + shapeToString(dyShape) +
                    ", got " + shapeToString(dy.shape));
  Tensor out = zeros(dy.kind, dataShape);
  int64_t flat = 0;
  forEachGathered(viewAround(dataShape, axis), indices,
                  [&](int64_t offset) { out.floats[offset] += dy.floats[flat++]; });
  return finish(std::move(out));
}

//===----------------------------------------------------------------------===//
// Reshape, expand, transpose, concat, split
//===----------------------------------------------------------------------===//

namespace {
/// Copies `size` positions along the axis both views split around:
/// from[o, fromStart + i, in] to to[o, toStart + i, in] (concat and split).
void copyAxisRange(Tensor &to, const AxisView &toView, int64_t toStart, const Tensor &from,
                   const AxisView &fromView, int64_t fromStart, int64_t size) {
  for (int64_t o = 0; o < fromView.outer; ++o)
    for (int64_t i = 0; i < size; ++i)
      for (int64_t in = 0; in < fromView.inner; ++in)
        copyElement(to, toView.at(o, toStart + i, in), from, fromView.at(o, fromStart + i, in));
}
} // namespace

Tensor reshape(const Tensor &input, const std::vector<int64_t> &shape) {
  if (product(shape) != input.numElements())
    throw EvalError("cannot reshape " + shapeToString(input.shape) + " into " +
                    shapeToString(shape));
  Tensor out = input;
  out.shape = shape;
  return out;
}

Tensor expand(const Tensor &input, const std::vector<int64_t> &shape) {
  std::vector<int64_t> target = broadcastTwo(input.shape, shape);
  Tensor out = zeros(input.kind, target);
  int64_t flat = 0;
  forEachIndex(target, [&](const std::vector<int64_t> &index) {
    copyElement(out, flat++, input, broadcastOffset(index, input.shape));
  });
  return out;
}

Tensor transpose(const Tensor &input, const std::vector<int64_t> &perm) {
  size_t rank = input.shape.size();
  std::vector<bool> seen(rank, false);
  if (perm.size() != rank)
    throw EvalError("perm has " + std::to_string(perm.size()) + " entries for rank " +
                    std::to_string(rank));
  std::vector<int64_t> outShape;
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[axis])
      throw EvalError("perm is not a permutation");
    seen[axis] = true;
    outShape.push_back(input.shape[axis]);
  }
  std::vector<int64_t> inStrides = stridesOf(input.shape);
  Tensor out = zeros(input.kind, outShape);
  int64_t flat = 0;
  // Output axis i walks input axis perm[i].
  forEachIndex(outShape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t i = 0; i < rank; ++i)
      offset += index[i] * inStrides[perm[i]];
    copyElement(out, flat++, input, offset);
  });
  return out;
}

Tensor concat(const std::vector<const Tensor *> &inputs, int64_t axis) {
  if (inputs.empty())
    throw EvalError("needs at least one input");
  const Tensor &first = *inputs.front();
  axis = normalizeAxis(axis, static_cast<int64_t>(first.shape.size()));
  std::vector<int64_t> outShape = first.shape;
  outShape[axis] = 0;
  for (const Tensor *input : inputs) {
    std::vector<int64_t> expected = first.shape;
    expected[axis] = input->shape.size() == first.shape.size() ? input->shape[axis] : -1;
    if (input->kind != first.kind || input->shape != expected)
      throw EvalError("inputs " + shapeToString(first.shape) + " and " +
                      shapeToString(input->shape) + " differ outside axis " +
                      std::to_string(axis));
    outShape[axis] += input->shape[axis];
  }
  Tensor out = zeros(first.kind, outShape);
  AxisView outView = viewAround(outShape, axis);
  int64_t offset = 0; // where the current input starts along the axis
  for (const Tensor *input : inputs) {
    AxisView view = viewAround(input->shape, axis);
    copyAxisRange(out, outView, offset, *input, view, 0, view.size);
    offset += view.size;
  }
  return out;
}

std::vector<Tensor> split(const Tensor &input, int64_t axis, const std::vector<int64_t> &sizes) {
  axis = normalizeAxis(axis, static_cast<int64_t>(input.shape.size()));
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      throw EvalError("negative piece size");
    total += size;
  }
  if (total != input.shape[axis])
    throw EvalError("piece sizes sum to " + std::to_string(total) + " but axis " +
                    std::to_string(axis) + " has size " + std::to_string(input.shape[axis]));
  AxisView view = viewAround(input.shape, axis);
  std::vector<Tensor> pieces;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    std::vector<int64_t> shape = input.shape;
    shape[axis] = size;
    Tensor piece = zeros(input.kind, shape);
    copyAxisRange(piece, viewAround(shape, axis), 0, input, view, offset, size);
    pieces.push_back(std::move(piece));
    offset += size;
  }
  return pieces;
}

//===----------------------------------------------------------------------===//
// Slice and pad
//===----------------------------------------------------------------------===//

namespace {

/// The result shape of a slice with normalized per-axis bounds; throws on
/// bounds that are not normalized.
std::vector<int64_t> slicedShape(const std::vector<int64_t> &inputShape,
                                 const std::vector<int64_t> &starts,
                                 const std::vector<int64_t> &ends,
                                 const std::vector<int64_t> &steps) {
  size_t rank = inputShape.size();
  if (starts.size() != rank || ends.size() != rank || steps.size() != rank)
    throw EvalError("starts, ends and steps need one entry per axis (" + std::to_string(rank) +
                    ")");
  std::vector<int64_t> outShape;
  for (size_t axis = 0; axis < rank; ++axis) {
    int64_t dim = inputShape[axis], start = starts[axis], end = ends[axis], step = steps[axis];
    if (step == 0)
      throw EvalError("step 0 on axis " + std::to_string(axis));
    bool valid = step > 0 ? (start >= 0 && start <= dim && end >= 0 && end <= dim)
                          : (start >= -1 && start < dim && end >= -1 && end < dim);
    if (!valid)
      throw EvalError("bounds of axis " + std::to_string(axis) +
                      " are not normalized for size " + std::to_string(dim));
    int64_t size = step > 0 ? (end - start + step - 1) / step : (start - end - step - 1) / -step;
    outShape.push_back(std::max<int64_t>(size, 0));
  }
  return outShape;
}

/// Calls visit(flat, inputOffset) for every element of a slice's result of
/// shape `outShape`, in row-major order, with the offset of the input
/// element it is.
template <typename Visit>
void forEachSliced(const std::vector<int64_t> &inputShape, const std::vector<int64_t> &outShape,
                   const std::vector<int64_t> &starts, const std::vector<int64_t> &steps,
                   Visit visit) {
  std::vector<int64_t> inStrides = stridesOf(inputShape);
  int64_t flat = 0;
  forEachIndex(outShape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < inputShape.size(); ++axis)
      offset += (starts[axis] + index[axis] * steps[axis]) * inStrides[axis];
    visit(flat++, offset);
  });
}

} // namespace

Tensor slice(const Tensor &input, const std::vector<int64_t> &starts,
             const std::vector<int64_t> &ends, const std::vector<int64_t> &steps) {
  std::vector<int64_t> outShape = slicedShape(input.shape, starts, ends, steps);
  Tensor out = zeros(input.kind, outShape);
  forEachSliced(input.shape, outShape, starts, steps, [&](int64_t flat, int64_t offset) {
    copyElement(out, flat, input, offset);
  });
  return out;
}

Tensor sliceGrad(const Tensor &dy, const std::vector<int64_t> &starts,
                 const std::vector<int64_t> &ends, const std::vector<int64_t> &steps,
                 const std::vector<int64_t> &inputShape) {
  requireFloating(dy, "dy");
  std::vector<int64_t> outShape = slicedShape(inputShape, starts, ends, steps);
  if (dy.shape != outShape)
    throw EvalError("dy must have the slice's result shape " + shapeToString(outShape) +
                    ", got " + shapeToString(dy.shape));
  Tensor out = zeros(dy.kind, inputShape);
  forEachSliced(inputShape, outShape, starts, steps, [&](int64_t flat, int64_t offset) {
    out.floats[offset] += dy.floats[flat];
  });
  return out;
}

Tensor pad(const Tensor &input, const std::vector<int64_t> &pads, double value) {
  size_t rank = input.shape.size();
  if (pads.size() != 2 * rank)
    throw EvalError("pads needs " + std::to_string(2 * rank) + " entries for rank " +
                    std::to_string(rank));
  std::vector<int64_t> outShape = input.shape;
  for (size_t axis = 0; axis < rank; ++axis) {
    if (pads[axis] < 0 || pads[axis + rank] < 0)
      throw EvalError("pads must be non-negative");
    outShape[axis] += pads[axis] + pads[axis + rank];
  }
  Tensor out = zeros(input.kind, outShape);
  if (isFloating(input.kind))
    std::fill(out.floats.begin(), out.floats.end(), value);
  else
    std::fill(out.ints.begin(), out.ints.end(), static_cast<int64_t>(value));
  std::vector<int64_t> outStrides = stridesOf(outShape);
  int64_t flat = 0;
  forEachIndex(input.shape, [&](const std::vector<int64_t> &index) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < rank; ++axis)
      offset += (index[axis] + pads[axis]) * outStrides[axis];
    copyElement(out, offset, input, flat++);
  });
  return finish(std::move(out));
}

} // namespace pipec::eval::kernels
