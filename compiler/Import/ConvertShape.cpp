// Converters of operators that move data (gather, reshape, squeeze, expand,
// transpose, concat, pad, split, slice): shapes, axes and sizes arguments
// must be known at import time, as `nn` works on static shapes.
#include "compiler/Import/ImporterImpl.h"
#include "pipec/input_file.h"

using namespace mlir;

namespace pipec::import::detail {

void OnnxImporter::convertGather(const onnx::NodeProto &node) {
  Value data = operand(node, 0);
  int64_t rank = typeOf(data).getRank();
  int64_t axis = normalizedAxes(node, {intAttr(node, "axis", 0)}, rank)[0];
  Value indices;
  // Constant indices are normalized here (ONNX allows negative ones).
  if (auto it = constants.find(node.input(1)); it != constants.end()) {
    HostTensor normalized = fold::cast(it->second, ElementKind::Int64);
    int64_t size = typeOf(data).getDimSize(axis);
    for (int64_t &index : normalized.ints) {
      if (index < -size || index >= size)
        fail(node, "index " + std::to_string(index) + " is out of range for axis size " +
                       std::to_string(size));
      if (index < 0)
        index += size;
    }
    indices = materialize(normalized, locationOf(node));
  } else {
    indices = operand(node, 1);
  }
  defineInferred<nn::GatherOp>(node, {data, indices},
                               {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))});
}

void OnnxImporter::convertReshape(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  std::vector<int64_t> shape;
  try {
    shape = resolveReshape(shapeOfInput(node, 0), constantInput(node, 1, "shape").toInts(),
                           intAttr(node, "allowzero", 0) != 0);
  } catch (const FoldError &error) {
    fail(node, error.what());
  }
  auto type = RankedTensorType::get(shape, typeOf(input).getElementType());
  defineResults(node, createVerified(node, nn::ReshapeOp::getOperationName(), {input}, {type}, {}),
                1);
}

void OnnxImporter::convertFlatten(const onnx::NodeProto &node) {
  defineInferred<nn::FlattenOp>(
      node, {operand(node, 0)},
      {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", 1)))});
}

void OnnxImporter::convertUnsqueeze(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  std::vector<int64_t> axes = unsqueezeAxes(node, typeOf(input).getRank());
  defineInferred<nn::UnsqueezeOp>(
      node, {input}, {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes))});
}

void OnnxImporter::convertSqueeze(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  std::vector<int64_t> axes;
  if (auto given = squeezeAxes(node)) {
    axes = normalizedAxes(node, *given, shape.size());
  } else {
    for (size_t axis = 0; axis < shape.size(); ++axis)
      if (shape[axis] == 1)
        axes.push_back(axis);
  }
  defineInferred<nn::SqueezeOp>(node, {input},
                                {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes))});
}

void OnnxImporter::convertExpand(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  std::vector<int64_t> shape;
  try {
    shape = broadcastShape(shapeOfInput(node, 0), constantInput(node, 1, "shape").toInts());
  } catch (const FoldError &) {
    fail(node, "cannot expand [" + join(shapeOfInput(node, 0)) + "] to [" +
                   join(constantInput(node, 1, "shape").toInts()) + "]");
  }
  define(node, 0, expandTo(node, input, shape));
}

void OnnxImporter::convertTranspose(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  std::vector<int64_t> perm = transposePerm(node, typeOf(input).getRank());
  defineInferred<nn::TransposeOp>(
      node, {input}, {builder.getNamedAttr("perm", builder.getDenseI64ArrayAttr(perm))});
}

void OnnxImporter::convertConcat(const onnx::NodeProto &node) {
  SmallVector<Value> inputs;
  for (int i = 0; i < node.input_size(); ++i)
    inputs.push_back(operand(node, i));
  if (!attribute(node, "axis"))
    fail(node, "axis is required");
  defineInferred<nn::ConcatOp>(
      node, inputs,
      {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", 0)))});
}

void OnnxImporter::convertPad(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  int64_t rank = typeOf(input).getRank();
  std::string mode = stringAttr(node, "mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    fail(node, "unknown mode '" + mode + "' (constant, reflect, edge or wrap)");
  std::vector<int64_t> pads = constantInput(node, 1, "pads").toInts();
  double value = 0.0;
  if (auto given = optionalScalarInput(node, 2, "constant_value"))
    value = given->asDouble(0);
  if (auto axesInput = optionalConstantInput(node, 3, "axes")) {
    // Opset 18: pads cover only the listed axes.
    std::vector<int64_t> axes = normalizedAxes(node, axesInput->toInts(), rank, false);
    if (pads.size() != 2 * axes.size())
      fail(node, "pads needs two entries per listed axis");
    std::vector<int64_t> full(2 * rank, 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      full[axes[i]] = pads[i];
      full[axes[i] + rank] = pads[i + axes.size()];
    }
    pads = full;
  }
  if (static_cast<int64_t>(pads.size()) != 2 * rank)
    fail(node, "pads has " + std::to_string(pads.size()) + " entries for rank " +
                   std::to_string(rank));
  if (llvm::any_of(pads, [](int64_t pad) { return pad < 0; }))
    fail(node, "negative pads (cropping) are not supported");
  auto inputShape = typeOf(input).getShape();
  for (int64_t axis = 0; axis < rank; ++axis) {
    auto padded = pipec::io::checkedAdd(pads[axis], pads[axis + rank]);
    if (padded)
      padded = pipec::io::checkedAdd(*padded, inputShape[axis]);
    if (!padded)
      fail(node, "pads [" + join(pads) + "] make dimension " + std::to_string(axis) +
                     " overflow int64");
  }
  if (llvm::all_of(pads, [](int64_t pad) { return pad == 0; })) {
    define(node, 0, input);
    return;
  }
  if (mode != "constant") {
    // Reflect, edge and wrap read input positions: per padded axis, one
    // Gather at the positions each output row copies (gradients add up).
    Value padded = input;
    for (int64_t axis = 0; axis < rank; ++axis) {
      const int64_t size = inputShape[axis], before = pads[axis], after = pads[axis + rank];
      if (before == 0 && after == 0)
        continue;
      if (size == 0 || before + size + after > kMaxFoldedElements)
        fail(node, "cannot pad axis " + std::to_string(axis) + " of size " +
                       std::to_string(size) + " in mode '" + mode + "' by [" +
                       std::to_string(before) + ", " + std::to_string(after) + "]");
      std::vector<int64_t> positions;
      for (int64_t p = -before; p < size + after; ++p) {
        int64_t at = p;
        if (mode == "edge") {
          at = std::clamp<int64_t>(p, 0, size - 1);
        } else if (mode == "wrap") {
          at = ((p % size) + size) % size;
        } else { // reflect: mirrored at the edges, which are not repeated
          const int64_t period = std::max<int64_t>(2 * (size - 1), 1);
          at = ((p % period) + period) % period;
          if (at >= size)
            at = period - at;
        }
        positions.push_back(at);
      }
      const int64_t count = static_cast<int64_t>(positions.size());
      Value indices = materialize(HostTensor::ofInts(ElementKind::Int64, {count}, positions),
                                  locationOf(node));
      padded = build<nn::GatherOp>(
          node, {padded, indices}, {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))});
    }
    define(node, 0, padded);
    return;
  }
  defineInferred<nn::PadOp>(node, {input},
                            {builder.getNamedAttr("pads", builder.getDenseI64ArrayAttr(pads)),
                             builder.getNamedAttr("value", builder.getF64FloatAttr(value))});
}

void OnnxImporter::convertSplit(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  int64_t axis = normalizedAxes(node, {intAttr(node, "axis", 0)}, shape.size())[0];
  std::vector<int64_t> sizes;
  if (auto given = nodeVersion < 13 ? intsAttr(node, "split") : std::nullopt) {
    sizes = *given;
  } else if (auto given = nodeVersion >= 13 ? optionalConstantInput(node, 1, "split")
                                            : std::nullopt) {
    sizes = given->toInts();
  } else {
    // Equal pieces, the last one smaller when the size does not divide (opset 18).
    int64_t pieces = nodeVersion >= 18 && attribute(node, "num_outputs")
                         ? intAttr(node, "num_outputs", 1)
                         : node.output_size();
    if (pieces < 1 || pieces != node.output_size())
      fail(node, "splits into " + std::to_string(pieces) + " pieces but has " +
                     std::to_string(node.output_size()) + " outputs");
    int64_t chunk = (shape[axis] + pieces - 1) / pieces;
    for (int64_t i = 0, left = shape[axis]; i < pieces; ++i, left -= chunk)
      sizes.push_back(std::min(chunk, left));
  }
  if (static_cast<int>(sizes.size()) != node.output_size())
    fail(node, "splits into " + std::to_string(sizes.size()) + " pieces but has " +
                   std::to_string(node.output_size()) + " outputs");
  defineInferred<nn::SplitOp>(node, {input},
                              {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis)),
                               builder.getNamedAttr("sizes", builder.getDenseI64ArrayAttr(sizes))},
                              sizes.size());
}

void OnnxImporter::convertSlice(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  SliceWindow window = sliceWindow(node, typeOf(input).getShape(), /*folding=*/false);
  defineInferred<nn::SliceOp>(
      node, {input},
      {builder.getNamedAttr("starts", builder.getDenseI64ArrayAttr(window.starts)),
       builder.getNamedAttr("ends", builder.getDenseI64ArrayAttr(window.ends)),
       builder.getNamedAttr("steps", builder.getDenseI64ArrayAttr(window.steps))});
}

void OnnxImporter::convertIdentity(const onnx::NodeProto &node) {
  define(node, 0, operand(node, 0));
}

void OnnxImporter::convertTrilu(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  if (shape.size() < 2)
    fail(node, "the input must have rank 2 or more");
  int64_t k = 0;
  if (auto given = optionalScalarInput(node, 1, "k"))
    k = given->asInt(0);
  // The kept triangle as a constant mask over the last two dimensions.
  int64_t rows = shape[shape.size() - 2], columns = shape.back();
  HostTensor ones = HostTensor::ofInts(ElementKind::Bool, {rows, columns},
                                       std::vector<int64_t>(rows * columns, 1));
  HostTensor mask = fold::trilu(ones, k, intAttr(node, "upper", 1) != 0);
  Location loc = locationOf(node);
  defineInferred<nn::WhereOp>(node, {materialize(mask, loc), input, scalarLike(node, input, 0.0)},
                              {});
}

void OnnxImporter::convertTile(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  std::vector<int64_t> repeats = constantInput(node, 1, "repeats").toInts();
  if (repeats.size() != shape.size())
    fail(node, std::to_string(repeats.size()) + " repeats for an input of rank " +
                   std::to_string(shape.size()));
  // x[d0, d1, ...] -> [1, d0, 1, d1, ...] -> expand [r0, d0, r1, d1, ...]
  // -> [r0 * d0, r1 * d1, ...]: element i of an axis reads i mod d.
  std::vector<int64_t> lifted, expanded, tiled;
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    if (repeats[axis] < 1)
      fail(node, "repeats must be positive");
    lifted.insert(lifted.end(), {1, shape[axis]});
    expanded.insert(expanded.end(), {repeats[axis], shape[axis]});
    tiled.push_back(repeats[axis] * shape[axis]);
  }
  if (tiled == std::vector<int64_t>(shape.begin(), shape.end())) {
    define(node, 0, input);
    return;
  }
  Value value = reshapeTo(node, input, lifted);
  value = expandTo(node, value, expanded);
  define(node, 0, reshapeTo(node, value, tiled));
}

/// DepthToSpace (PixelShuffle) and SpaceToDepth: a reshape, a transpose
/// and a reshape, in the channel order of the node's mode.
void OnnxImporter::convertDepthToSpace(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  const int64_t block = intAttr(node, "blocksize", 0);
  if (shape.size() != 4 || block < 1)
    fail(node, "needs an (N, C, H, W) input and a positive blocksize");
  const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3];
  if (node.op_type() == "SpaceToDepth") {
    if (h % block || w % block)
      fail(node, "blocksize " + std::to_string(block) + " must divide H " + std::to_string(h) +
                     " and W " + std::to_string(w));
    Value split = reshapeTo(node, input, {n, c, h / block, block, w / block, block});
    Value moved = transposeBy(node, split, {0, 3, 5, 1, 2, 4});
    define(node, 0, reshapeTo(node, moved, {n, c * block * block, h / block, w / block}));
    return;
  }
  if (c % (block * block))
    fail(node, "blocksize² " + std::to_string(block * block) + " must divide the " +
                   std::to_string(c) + " channels");
  const int64_t out = c / (block * block);
  const std::string mode = stringAttr(node, "mode", "DCR");
  const bool crd = mode == "CRD";
  if (!crd && mode != "DCR")
    fail(node, "unknown mode '" + mode + "' (DCR or CRD)");
  Value split = crd ? reshapeTo(node, input, {n, out, block, block, h, w})
                    : reshapeTo(node, input, {n, block, block, out, h, w});
  Value moved = crd ? transposeBy(node, split, {0, 1, 4, 2, 5, 3})
                    : transposeBy(node, split, {0, 3, 4, 1, 5, 2});
  define(node, 0, reshapeTo(node, moved, {n, out, h * block, w * block}));
}

} // namespace pipec::import::detail
