// Indexing operators on run-time values, lowered at import into `nn` ops
// that exist on both targets and have gradients (docs/importer.md):
// CumSum as a log-step scan of shifted adds, GatherElements and GatherND as
// one Gather of the flattened data at computed flat indices. Position ids
// and token types computed from the input tokens (RoBERTa, BERT) and masks
// built at run time need them. Constant inputs fold instead (FoldShape.cpp).
#include "compiler/Import/ImporterImpl.h"

#include <numeric>

using namespace mlir;

namespace pipec::import::detail {

Value OnnxImporter::sliceAxis(const onnx::NodeProto &node, Value input, int64_t axis, int64_t start,
                              int64_t end, int64_t step) {
  auto shape = typeOf(input).getShape();
  std::vector<int64_t> starts(shape.size(), 0), ends(shape.begin(), shape.end()),
      steps(shape.size(), 1);
  starts[axis] = start, ends[axis] = end, steps[axis] = step;
  return build<nn::SliceOp>(node, {input},
                            {builder.getNamedAttr("starts", builder.getDenseI64ArrayAttr(starts)),
                             builder.getNamedAttr("ends", builder.getDenseI64ArrayAttr(ends)),
                             builder.getNamedAttr("steps", builder.getDenseI64ArrayAttr(steps))});
}

Value OnnxImporter::int64Indices(const onnx::NodeProto &node, Value indices, int64_t size) {
  indices = castTo(node, indices, builder.getI64Type());
  // ONNX counts negative indices from the end of the dimension.
  Value zero = scalarLike(node, indices, 0), extent = scalarLike(node, indices, size);
  Value negative = build<nn::LessOp>(node, {indices, zero});
  return build<nn::WhereOp>(node, {negative, build<nn::AddOp>(node, {indices, extent}), indices});
}

void OnnxImporter::convertCumSum(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  const HostTensor &axisValue = constantInput(node, 1, "axis");
  if (axisValue.numElements() != 1)
    fail(node, "axis must hold one value");
  auto shape = typeOf(input).getShape();
  int64_t axis = normalizedAxes(node, {axisValue.asInt(0)}, shape.size())[0];
  int64_t length = shape[axis];
  bool reverse = intAttr(node, "reverse", 0) != 0, exclusive = intAttr(node, "exclusive", 0) != 0;
  // Integer arithmetic runs in int64 (buildWidened); the result converts back.
  Type element = typeOf(input).getElementType();
  Value value = isNarrowInteger(element) ? castTo(node, input, builder.getI64Type()) : input;
  if (reverse)
    value = sliceAxis(node, value, axis, length - 1, -1, -1);
  // Prepends `count` zeros along the axis and drops as many at the end.
  auto shifted = [&](Value v, int64_t count) {
    std::vector<int64_t> zeroShape(shape.begin(), shape.end());
    zeroShape[axis] = count;
    return concatAlong(node, {filledLike(node, v, zeroShape, 0.0),
                              sliceAxis(node, v, axis, 0, length - count, 1)},
                       axis);
  };
  // Hillis-Steele scan: after the step of distance d, each element holds
  // the sum of the 2d elements ending at it.
  for (int64_t distance = 1; distance < length; distance *= 2)
    value = build<nn::AddOp>(node, {value, shifted(value, distance)});
  if (exclusive && length > 0)
    value = shifted(value, 1);
  if (reverse)
    value = sliceAxis(node, value, axis, length - 1, -1, -1);
  define(node, 0, castTo(node, value, element));
}

void OnnxImporter::convertGatherElements(const onnx::NodeProto &node) {
  Value data = operand(node, 0);
  define(node, 0,
         gatherAlongAxis(node, data, operand(node, 1),
                         normalizedAxes(node, {intAttr(node, "axis", 0)}, typeOf(data).getRank())[0]));
}

Value OnnxImporter::gatherAlongAxis(const onnx::NodeProto &node, Value data, Value indices,
                                    int64_t axis) {
  auto dataShape = typeOf(data).getShape();
  auto indexShape = typeOf(indices).getShape();
  int64_t rank = dataShape.size();
  if (static_cast<int64_t>(indexShape.size()) != rank)
    fail(node, "indices must have the rank of data");
  for (int64_t d = 0; d < rank; ++d)
    if (d != axis && indexShape[d] > dataShape[d])
      fail(node, "indices are larger than data outside the axis");
  // data[p with p_axis = index] is flat element index * stride_axis + the
  // offset of p's other coordinates, a constant.
  std::vector<int64_t> strides = stridesOf({dataShape.begin(), dataShape.end()});
  int64_t count =
      std::accumulate(indexShape.begin(), indexShape.end(), int64_t{1}, std::multiplies<int64_t>());
  std::vector<int64_t> offsets(count);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat, offset = 0;
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (d != axis)
        offset += (rest % indexShape[d]) * strides[d];
      rest /= indexShape[d];
    }
    offsets[flat] = offset;
  }
  Location loc = locationOf(node);
  Value index = int64Indices(node, indices, dataShape[axis]);
  index = build<nn::MulOp>(node, {index, scalarLike(node, index, strides[axis])});
  index = build<nn::AddOp>(
      node, {index, materialize(HostTensor::ofInts(ElementKind::Int64,
                                                   {indexShape.begin(), indexShape.end()}, offsets),
                                loc)});
  int64_t size =
      std::accumulate(dataShape.begin(), dataShape.end(), int64_t{1}, std::multiplies<int64_t>());
  return build<nn::GatherOp>(node, {reshapeTo(node, data, {size}), index},
                             {builder.getNamedAttr("axis", builder.getI64IntegerAttr(0))});
}

/// NegativeLogLikelihoodLoss (PyTorch's nll_loss, and cross_entropy as the
/// dynamo exporter writes it after LogSoftmax): minus the input at each
/// target class, times the class weight, 0 where the target is ignore_index;
/// the mean divides by the weights' sum, as ONNX and PyTorch do.
void OnnxImporter::convertNegativeLogLikelihoodLoss(const onnx::NodeProto &node) {
  Value input = operand(node, 0), target = castTo(node, operand(node, 1), builder.getI64Type());
  auto inputShape = typeOf(input).getShape();
  auto targetShape = typeOf(target).getShape();
  const int64_t rank = inputShape.size();
  std::vector<int64_t> expected{inputShape[0]};
  if (rank >= 2)
    expected.insert(expected.end(), inputShape.begin() + 2, inputShape.end());
  if (rank < 2 || ArrayRef<int64_t>(expected) != targetShape)
    fail(node, "input must be (N, C, d...) and target (N, d...)");
  const std::string reduction = stringAttr(node, "reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    fail(node, "unknown reduction '" + reduction + "' (mean, sum or none)");
  const auto *ignore = attribute(node, "ignore_index");
  Value ignored, classes = target;
  if (ignore) {
    ignored = build<nn::EqualOp>(node, {target, scalarLike(node, target, ignore->i())});
    // Ignored positions read class 0, then weigh 0.
    classes = build<nn::WhereOp>(node, {ignored, scalarLike(node, target, 0), target});
  }
  std::vector<int64_t> lifted(targetShape.begin(), targetShape.end());
  lifted.insert(lifted.begin() + 1, 1);
  Value picked = gatherAlongAxis(node, input, reshapeTo(node, classes, lifted), 1);
  Value loss = build<nn::NegOp>(node, {reshapeTo(node, picked, targetShape)});
  Value weight;
  if (hasInput(node, 2))
    weight = build<nn::GatherOp>(node, {operand(node, 2), int64Indices(node, classes, inputShape[1])},
                                 {builder.getNamedAttr("axis", builder.getI64IntegerAttr(0))});
  if (ignore)
    weight = build<nn::WhereOp>(
        node, {ignored, scalarLike(node, loss, 0.0), weight ? weight : scalarLike(node, loss, 1.0)});
  if (weight) {
    weight = expandTo(node, weight, targetShape);
    loss = build<nn::MulOp>(node, {loss, weight});
  }
  if (reduction == "none") {
    define(node, 0, loss);
    return;
  }
  std::vector<int64_t> all(targetShape.size());
  std::iota(all.begin(), all.end(), 0);
  if (reduction == "mean" && !weight) {
    define(node, 0, sumOver(node, loss, all, /*keepdims=*/false, /*mean=*/true));
    return;
  }
  Value total = sumOver(node, loss, all, /*keepdims=*/false);
  if (reduction == "mean")
    total = build<nn::DivOp>(node, {total, sumOver(node, weight, all, /*keepdims=*/false)});
  define(node, 0, total);
}

void OnnxImporter::convertGatherND(const onnx::NodeProto &node) {
  Value data = operand(node, 0), indices = operand(node, 1);
  auto dataShape = typeOf(data).getShape();
  auto indexShape = typeOf(indices).getShape();
  int64_t rank = dataShape.size(), indexRank = indexShape.size();
  int64_t batchDims = intAttr(node, "batch_dims", 0);
  if (indexRank < 1 || batchDims < 0 || batchDims >= std::min(rank, indexRank))
    fail(node, "batch_dims must be below the ranks of data and indices");
  int64_t depth = indexShape.back();
  if (depth < 1 || depth > rank - batchDims)
    fail(node, "the index tuples are longer than data's rank allows");
  for (int64_t d = 0; d < batchDims; ++d)
    if (dataShape[d] != indexShape[d])
      fail(node, "the batch dimensions of data and indices differ");
  // Data viewed as (batch and indexed dimensions flattened, slice...): one
  // flat index per tuple, the sum of its coordinates times their strides,
  // plus the batch's offset.
  std::vector<int64_t> viewed{1};
  for (int64_t d = 0; d < batchDims + depth; ++d)
    viewed[0] *= dataShape[d];
  viewed.insert(viewed.end(), dataShape.begin() + batchDims + depth, dataShape.end());
  std::vector<int64_t> indexed(dataShape.begin() + batchDims,
                               dataShape.begin() + batchDims + depth);
  std::vector<int64_t> strides = stridesOf(indexed);
  std::vector<int64_t> tupleShape(indexShape.begin(), indexShape.end() - 1);
  Location loc = locationOf(node);
  Value flat;
  for (int64_t j = 0; j < depth; ++j) {
    Value coordinate =
        reshapeTo(node, sliceAxis(node, indices, indexRank - 1, j, j + 1, 1), tupleShape);
    coordinate = int64Indices(node, coordinate, indexed[j]);
    if (strides[j] != 1)
      coordinate = build<nn::MulOp>(node, {coordinate, scalarLike(node, coordinate, strides[j])});
    flat = flat ? build<nn::AddOp>(node, {flat, coordinate}) : coordinate;
  }
  if (batchDims > 0) {
    int64_t tuples = std::accumulate(tupleShape.begin(), tupleShape.end(), int64_t{1},
                                     std::multiplies<int64_t>());
    int64_t perBatch = std::accumulate(tupleShape.begin() + batchDims, tupleShape.end(), int64_t{1},
                                       std::multiplies<int64_t>());
    int64_t batchStride =
        std::accumulate(indexed.begin(), indexed.end(), int64_t{1}, std::multiplies<int64_t>());
    std::vector<int64_t> offsets(tuples);
    for (int64_t t = 0; t < tuples; ++t)
      offsets[t] = (t / perBatch) * batchStride;
    flat = build<nn::AddOp>(
        node,
        {flat, materialize(HostTensor::ofInts(ElementKind::Int64, tupleShape, offsets), loc)});
  }
  defineInferred<nn::GatherOp>(node, {reshapeTo(node, data, viewed), flat},
                               {builder.getNamedAttr("axis", builder.getI64IntegerAttr(0))});
}

} // namespace pipec::import::detail

namespace pipec::import::detail {

/// ScatterND and ScatterElements with indices known at import (slice
/// assignments, `x[..., a:b] = y`, on run-time values): every output element
/// is one element of data or of updates, so the result is one Gather of
/// their concatenation at a constant selector, found by scattering the
/// positions of updates over those of data on the host (the last write
/// wins, as ONNX's reduction "none"). Gradients reach both through Gather.
void OnnxImporter::convertScatter(const onnx::NodeProto &node) {
  std::string reduction = stringAttr(node, "reduction", "none");
  if (reduction != "none")
    fail(node, "reduction '" + reduction + "' on run-time values is not supported (only 'none')");
  Value data = operand(node, 0), updates = operand(node, 2);
  const HostTensor &indices = constantInput(node, 1, "indices");
  auto dataShape = typeOf(data).getShape();
  auto updateShape = typeOf(updates).getShape();
  int64_t dataSize = typeOf(data).getNumElements(), updateSize = typeOf(updates).getNumElements();
  std::vector<int64_t> dataPositions(dataSize), updatePositions(updateSize);
  std::iota(dataPositions.begin(), dataPositions.end(), 0);
  std::iota(updatePositions.begin(), updatePositions.end(), dataSize);
  HostTensor positions =
      HostTensor::ofInts(ElementKind::Int64, {dataShape.begin(), dataShape.end()}, dataPositions);
  HostTensor sources = HostTensor::ofInts(
      ElementKind::Int64, {updateShape.begin(), updateShape.end()}, updatePositions);
  HostTensor selector;
  try {
    selector =
        node.op_type() == "ScatterND"
            ? fold::scatterND(positions, indices, sources, "none")
            : fold::scatterAlongAxis(positions, indices, sources, intAttr(node, "axis", 0), "none");
  } catch (const FoldError &error) {
    fail(node, error.what());
  }
  Value pool = concatAlong(
      node, {reshapeTo(node, data, {dataSize}), reshapeTo(node, updates, {updateSize})}, 0);
  defineInferred<nn::GatherOp>(node, {pool, materialize(selector, locationOf(node))},
                               {builder.getNamedAttr("axis", builder.getI64IntegerAttr(0))});
}

} // namespace pipec::import::detail

namespace pipec::import::detail {

/// ONNX Resize (nearest, linear, cubic) with static sizes: separable, one
/// axis at a time, each output element a weighted sum of a few input
/// elements along the axis whose indices and weights are constants computed
/// here as ONNX's reference does (edge elements repeat beyond the borders).
/// A tap is a Gather at constant indices times a constant weight, so the
/// gradient reaches the input through Gather (docs/importer.md).
void OnnxImporter::convertResize(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  int64_t rank = shape.size();
  std::string mode = stringAttr(node, "mode", "nearest");
  std::string transform = stringAttr(node, "coordinate_transformation_mode",
                                     nodeVersion >= 11 ? "half_pixel" : "asymmetric");
  std::string nearestMode =
      stringAttr(node, "nearest_mode", nodeVersion >= 11 ? "round_prefer_floor" : "floor");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    fail(node, "mode '" + mode + "' is not supported (nearest, linear, cubic)");
  if (transform == "tf_crop_and_resize")
    fail(node, "coordinate_transformation_mode 'tf_crop_and_resize' is not supported");
  static const std::set<std::string> transforms{"align_corners", "asymmetric", "pytorch_half_pixel",
                                                "half_pixel", "half_pixel_symmetric"};
  if (!transforms.count(transform))
    fail(node, "unknown coordinate_transformation_mode '" + transform + "'");
  static const std::set<std::string> nearestModes{"round_prefer_floor", "round_prefer_ceil", "floor",
                                                  "ceil"};
  if (mode == "nearest" && !nearestModes.count(nearestMode))
    fail(node, "unknown nearest_mode '" + nearestMode + "'");
  if (stringAttr(node, "keep_aspect_ratio_policy", "stretch") != "stretch")
    fail(node, "keep_aspect_ratio_policy other than 'stretch' is not supported");
  std::vector<int64_t> axes(rank);
  std::iota(axes.begin(), axes.end(), 0);
  if (auto given = intsAttr(node, "axes"))
    axes = normalizedAxes(node, *given, rank);
  // Per axis: the output size and the scale the coordinates use.
  std::vector<int64_t> outSize(shape.begin(), shape.end());
  std::vector<double> scale(rank, 1.0);
  int scalesInput = nodeVersion >= 11 ? 2 : 1;
  auto sizes = nodeVersion >= 11 ? optionalConstantInput(node, 3, "sizes") : std::nullopt;
  auto scales = optionalConstantInput(node, scalesInput, "scales");
  if (scales && scales->numElements() == 0)
    scales.reset();
  if (sizes && scales)
    fail(node, "gives both scales and sizes");
  if (!sizes && !scales)
    fail(node, "needs scales or sizes known at import time");
  int64_t given = (sizes ? sizes->numElements() : scales->numElements());
  if (given != static_cast<int64_t>(axes.size()))
    fail(node, "scales or sizes must have one value per resized axis");
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t axis = axes[k];
    if (sizes) {
      outSize[axis] = sizes->asInt(k);
      scale[axis] = static_cast<double>(outSize[axis]) / shape[axis];
    } else {
      scale[axis] = scales->asDouble(k);
      outSize[axis] = static_cast<int64_t>(std::floor(shape[axis] * scale[axis]));
    }
    if (outSize[axis] < 1 || !(scale[axis] > 0))
      fail(node, "resizes axis " + std::to_string(axis) + " to nothing");
    if (intAttr(node, "antialias", 0) && mode != "nearest" && scale[axis] < 1)
      fail(node, "antialias when downsampling is not supported");
  }
  double cubicA = floatAttr(node, "cubic_coeff_a", -0.75f);
  bool excludeOutside = intAttr(node, "exclude_outside", 0) != 0;
  auto kind = *pipec::import::elementKindOf(typeOf(input).getElementType());
  Location loc = locationOf(node);
  Value value = input;
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (outSize[axis] == shape[axis] && scale[axis] == 1.0)
      continue;
    int64_t in = shape[axis], out = outSize[axis];
    double s = scale[axis];
    int taps = mode == "cubic" ? 4 : 2;
    std::vector<std::vector<int64_t>> index(taps, std::vector<int64_t>(out));
    std::vector<std::vector<double>> weight(taps, std::vector<double>(out));
    for (int64_t i = 0; i < out; ++i) {
      double x;
      double outWidth = s * in;
      if (transform == "align_corners")
        x = outWidth == 1 ? 0.0 : i * (in - 1.0) / (outWidth - 1.0);
      else if (transform == "asymmetric")
        x = i / s;
      else if (transform == "pytorch_half_pixel")
        x = outWidth == 1 ? -0.5 : (i + 0.5) / s - 0.5;
      else if (transform == "half_pixel")
        x = (i + 0.5) / s - 0.5;
      else // half_pixel_symmetric
        x = in / 2.0 * (1 - out / outWidth) + (i + 0.5) / s - 0.5;
      double floorX = std::floor(x);
      double ratio = x == floorX ? 1.0 : x - floorX;
      std::vector<double> coefficients;
      if (mode == "nearest") {
        // The right tap for a whole x (ratio 1), else as nearest_mode rounds.
        bool right = ratio == 1.0 || nearestMode == "ceil" ||
                     (nearestMode == "round_prefer_floor" && ratio > 0.5) ||
                     (nearestMode == "round_prefer_ceil" && ratio >= 0.5);
        coefficients = {right ? 0.0 : 1.0, right ? 1.0 : 0.0};
      } else if (mode == "linear") {
        coefficients = {1 - ratio, ratio};
      } else {
        double A = cubicA, r = ratio;
        coefficients = {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                        ((A + 2) * r - (A + 3)) * r * r + 1,
                        ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                        ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) -
                            4 * A};
      }
      // The taps: the `taps` input positions nearest x, the left one first
      // (ratio in (0, 1]); positions beyond the borders repeat the edge.
      int64_t first = ratio == 1.0 ? static_cast<int64_t>(x) - taps / 2
                                   : static_cast<int64_t>(floorX) - (taps / 2 - 1);
      double total = 0;
      for (int t = 0; t < taps; ++t) {
        int64_t position = first + t;
        if (excludeOutside && (position < 0 || position >= in))
          coefficients[t] = 0;
        total += coefficients[t];
        index[t][i] = std::clamp<int64_t>(position, 0, in - 1);
      }
      for (int t = 0; t < taps; ++t)
        weight[t][i] = excludeOutside && total != 0 ? coefficients[t] / total : coefficients[t];
    }
    std::vector<int64_t> weightShape(rank, 1);
    weightShape[axis] = out;
    Value sum;
    for (int t = 0; t < taps; ++t) {
      if (std::all_of(weight[t].begin(), weight[t].end(), [](double w) { return w == 0; }))
        continue;
      Value picked = build<nn::GatherOp>(
          node, {value, materialize(HostTensor::ofInts(ElementKind::Int64, {out}, index[t]), loc)},
          {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))});
      bool unit = std::all_of(weight[t].begin(), weight[t].end(), [](double w) { return w == 1; });
      Value term =
          unit ? picked
               : build<nn::MulOp>(
                     node, {picked,
                            materialize(HostTensor::ofFloats(kind, weightShape, weight[t]), loc)});
      sum = sum ? build<nn::AddOp>(node, {sum, term}) : term;
    }
    value = sum;
  }
  define(node, 0, value);
}

} // namespace pipec::import::detail
