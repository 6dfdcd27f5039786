// Fold kernels of the indexing operators exporters use to build masks,
// position tables and window indices from constants (Trilu, CumSum, Tile,
// GatherElements, GatherND, ScatterElements, ScatterND), following the ONNX
// specification; values known at import time become constants
// (docs/importer.md). Every index is checked: a hostile file gets a
// FoldError, never an out-of-bounds read.
#include "compiler/Import/HostTensor.h"

#include <algorithm>
#include <functional>

namespace pipec::import::fold {

namespace {

int64_t axisOf(int64_t axis, int64_t rank, const char *op) {
  if (axis < -rank || axis >= rank)
    throw FoldError(std::string(op) + ": axis " + std::to_string(axis) + " out of range for rank " +
                    std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

/// An index into a dimension of `size`, negative ones counting from the end.
int64_t indexInto(int64_t index, int64_t size, const char *op) {
  if (index < -size || index >= size)
    throw FoldError(std::string(op) + ": index " + std::to_string(index) +
                    " out of range for a dimension of " + std::to_string(size));
  return index < 0 ? index + size : index;
}

/// An empty tensor of `kind` with `shape`, its elements zero.
HostTensor zeros(ElementKind kind, std::vector<int64_t> shape, const char *op) {
  HostTensor out;
  out.kind = kind;
  out.shape = std::move(shape);
  int64_t count = foldedElementCount(out.shape, op);
  if (isFloating(kind))
    out.floats.assign(count, 0.0);
  else
    out.ints.assign(count, 0);
  return out;
}

/// Scatter's reductions (ONNX `reduction`: none, add, mul, max, min).
void combineElement(HostTensor &to, int64_t toIndex, const HostTensor &from, int64_t fromIndex,
                    const std::string &reduction, const char *op) {
  auto apply = [&](auto &target, auto value) {
    if (reduction == "none")
      target = value;
    else if (reduction == "add")
      target += value;
    else if (reduction == "mul")
      target *= value;
    else if (reduction == "max")
      target = std::max(target, value);
    else if (reduction == "min")
      target = std::min(target, value);
    else
      throw FoldError(std::string(op) + ": unknown reduction '" + reduction + "'");
  };
  if (isFloating(to.kind))
    apply(to.floats[toIndex], from.floats[fromIndex]);
  else
    apply(to.ints[toIndex], from.ints[fromIndex]);
  if (!isFloating(to.kind))
    to.ints[toIndex] = wrapInteger(to.kind, to.ints[toIndex]);
}

/// GatherElements / ScatterElements: the offset in data of element `flat`
/// of indices (its own coordinates, the axis's replaced by its index).
int64_t alongAxisOffset(int64_t flat, const HostTensor &indices, const std::vector<int64_t> &shape,
                        const std::vector<int64_t> &strides, int64_t axis, const char *op) {
  int64_t rest = flat, offset = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    int64_t coordinate = rest % indices.shape[d];
    rest /= indices.shape[d];
    if (d == axis)
      coordinate = indexInto(indices.asInt(flat), shape[d], op);
    else if (coordinate >= shape[d])
      throw FoldError(std::string(op) + ": indices are larger than data outside the axis");
    offset += coordinate * strides[d];
  }
  return offset;
}

} // namespace

HostTensor trilu(const HostTensor &input, int64_t k, bool upper) {
  if (input.shape.size() < 2)
    throw FoldError("Trilu: the input must have rank 2 or more");
  HostTensor out = input;
  int64_t rows = input.shape[input.shape.size() - 2], columns = input.shape.back();
  int64_t count = input.numElements();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t column = flat % columns, row = (flat / columns) % rows;
    bool kept = upper ? column - row >= k : column - row <= k;
    if (!kept) {
      if (isFloating(out.kind))
        out.floats[flat] = 0.0;
      else
        out.ints[flat] = 0;
    }
  }
  return out;
}

HostTensor cumSum(const HostTensor &input, int64_t axis, bool exclusive, bool reverse) {
  int64_t rank = static_cast<int64_t>(input.shape.size());
  axis = axisOf(axis, rank, "CumSum");
  HostTensor out = zeros(input.kind, input.shape, "CumSum");
  int64_t size = input.shape[axis], stride = stridesOf(input.shape)[axis];
  int64_t count = input.numElements();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t position = (flat / stride) % size;
    if (position != 0)
      continue; // each line along the axis starts at position 0
    // Walk the line in the summation order, keeping the running sum.
    double floatSum = 0.0;
    int64_t intSum = 0;
    for (int64_t step = 0; step < size; ++step) {
      int64_t at = reverse ? size - 1 - step : step;
      int64_t index = flat + at * stride;
      if (isFloating(input.kind)) {
        if (!exclusive)
          floatSum += input.floats[index];
        out.floats[index] = floatSum;
        if (exclusive)
          floatSum += input.floats[index];
      } else {
        if (!exclusive)
          intSum = wrapInteger(input.kind, intSum + input.ints[index]);
        out.ints[index] = intSum;
        if (exclusive)
          intSum = wrapInteger(input.kind, intSum + input.ints[index]);
      }
    }
  }
  return out;
}

HostTensor tile(const HostTensor &input, const std::vector<int64_t> &repeats) {
  if (repeats.size() != input.shape.size())
    throw FoldError("Tile: " + std::to_string(repeats.size()) + " repeats for rank " +
                    std::to_string(input.shape.size()));
  std::vector<int64_t> shape(input.shape.size());
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (repeats[axis] < 0)
      throw FoldError("Tile: negative repeats");
    shape[axis] = input.shape[axis] * repeats[axis];
  }
  HostTensor out = zeros(input.kind, shape, "Tile");
  std::vector<int64_t> inputStrides = stridesOf(input.shape);
  int64_t count = out.numElements();
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat, source = 0;
    for (int64_t axis = static_cast<int64_t>(shape.size()) - 1; axis >= 0; --axis) {
      int64_t coordinate = rest % shape[axis];
      rest /= shape[axis];
      source += (coordinate % input.shape[axis]) * inputStrides[axis];
    }
    copyElement(out, flat, input, source);
  }
  return out;
}

HostTensor gatherAlongAxis(const HostTensor &data, const HostTensor &indices, int64_t axis) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  axis = axisOf(axis, rank, "GatherElements");
  if (indices.shape.size() != data.shape.size())
    throw FoldError("GatherElements: indices and data must have the same rank");
  HostTensor out = zeros(data.kind, indices.shape, "GatherElements");
  std::vector<int64_t> dataStrides = stridesOf(data.shape);
  int64_t count = out.numElements();
  for (int64_t flat = 0; flat < count; ++flat)
    copyElement(out, flat, data,
                alongAxisOffset(flat, indices, data.shape, dataStrides, axis, "GatherElements"));
  return out;
}

HostTensor scatterAlongAxis(const HostTensor &data, const HostTensor &indices,
                            const HostTensor &updates, int64_t axis, const std::string &reduction) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  axis = axisOf(axis, rank, "ScatterElements");
  if (indices.shape != updates.shape || indices.shape.size() != data.shape.size())
    throw FoldError("ScatterElements: indices and updates must have one shape, of data's rank");
  HostTensor out = data;
  std::vector<int64_t> dataStrides = stridesOf(data.shape);
  int64_t count = indices.numElements();
  for (int64_t flat = 0; flat < count; ++flat)
    combineElement(out,
                   alongAxisOffset(flat, indices, data.shape, dataStrides, axis, "ScatterElements"),
                   updates, flat, reduction, "ScatterElements");
  return out;
}

namespace {
/// GatherND / ScatterND: the flat offset in `data` of the slice that the
/// index tuple at `tuple` (of `depth` entries) selects, after `batchOffset`.
int64_t sliceOffset(const HostTensor &data, const HostTensor &indices, int64_t tuple, int64_t depth,
                    int64_t batchDims, const std::vector<int64_t> &dataStrides, const char *op) {
  int64_t offset = 0;
  for (int64_t i = 0; i < depth; ++i) {
    int64_t d = batchDims + i;
    offset += indexInto(indices.asInt(tuple * depth + i), data.shape[d], op) * dataStrides[d];
  }
  return offset;
}
} // namespace

HostTensor gatherND(const HostTensor &data, const HostTensor &indices, int64_t batchDims) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  int64_t indexRank = static_cast<int64_t>(indices.shape.size());
  if (indexRank < 1 || batchDims < 0 || batchDims >= std::min(rank, indexRank))
    throw FoldError("GatherND: batch_dims must be below the ranks of data and indices");
  int64_t depth = indices.shape.back();
  if (depth < 1 || depth > rank - batchDims)
    throw FoldError("GatherND: the index tuples are longer than data's rank allows");
  for (int64_t d = 0; d < batchDims; ++d)
    if (data.shape[d] != indices.shape[d])
      throw FoldError("GatherND: the batch dimensions of data and indices differ");
  std::vector<int64_t> shape(indices.shape.begin(), indices.shape.end() - 1);
  shape.insert(shape.end(), data.shape.begin() + batchDims + depth, data.shape.end());
  HostTensor out = zeros(data.kind, shape, "GatherND");
  std::vector<int64_t> dataStrides = stridesOf(data.shape);
  int64_t sliceSize = 1;
  for (int64_t d = batchDims + depth; d < rank; ++d)
    sliceSize *= data.shape[d];
  int64_t tuplesPerBatch = 1;
  for (int64_t d = batchDims; d < indexRank - 1; ++d)
    tuplesPerBatch *= indices.shape[d];
  int64_t batchStride = batchDims > 0 ? dataStrides[batchDims - 1] : 0;
  int64_t tuples = indices.numElements() / depth;
  for (int64_t tuple = 0; tuple < tuples; ++tuple) {
    int64_t base = (tuple / tuplesPerBatch) * batchStride +
                   sliceOffset(data, indices, tuple, depth, batchDims, dataStrides, "GatherND");
    for (int64_t i = 0; i < sliceSize; ++i)
      copyElement(out, tuple * sliceSize + i, data, base + i);
  }
  return out;
}

HostTensor scatterND(const HostTensor &data, const HostTensor &indices, const HostTensor &updates,
                     const std::string &reduction) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  if (indices.shape.empty())
    throw FoldError("ScatterND: indices must have rank 1 or more");
  int64_t depth = indices.shape.back();
  if (depth < 1 || depth > rank)
    throw FoldError("ScatterND: the index tuples are longer than data's rank");
  std::vector<int64_t> expected(indices.shape.begin(), indices.shape.end() - 1);
  expected.insert(expected.end(), data.shape.begin() + depth, data.shape.end());
  if (updates.shape != expected)
    throw FoldError("ScatterND: updates have shape " + shapeText(updates.shape) + ", expected " +
                    shapeText(expected));
  HostTensor out = data;
  std::vector<int64_t> dataStrides = stridesOf(data.shape);
  int64_t sliceSize = depth < rank ? dataStrides[depth - 1] : 1;
  int64_t tuples = indices.numElements() / depth;
  for (int64_t tuple = 0; tuple < tuples; ++tuple) {
    int64_t base = sliceOffset(data, indices, tuple, depth, 0, dataStrides, "ScatterND");
    for (int64_t i = 0; i < sliceSize; ++i)
      combineElement(out, base + i, updates, tuple * sliceSize + i, reduction, "ScatterND");
  }
  return out;
}

} // namespace pipec::import::fold
