// Folders: shape sub-graphs whose inputs are all known at import time are
// evaluated on the host (HostTensor.cpp) instead of becoming `nn` ops.
#include "compiler/Import/ImporterImpl.h"

#include <cmath>
#include "pipec/input_file.h"

using namespace mlir;

namespace pipec::import::detail {

std::vector<HostTensor> OnnxImporter::foldConstant(const onnx::NodeProto &node) {
  for (const auto &attr : node.attribute()) {
    const std::string &name = attr.name();
    if (name == "value")
      return {readTensor(attr.t(), "Constant '" + node.name() + "'")};
    if (name == "value_float")
      return {HostTensor::ofFloats(ElementKind::Float32, {}, {attr.f()})};
    if (name == "value_floats")
      return {HostTensor::ofFloats(ElementKind::Float32, {attr.floats_size()},
                                   {attr.floats().begin(), attr.floats().end()})};
    if (name == "value_int")
      return {HostTensor::ofInts(ElementKind::Int64, {}, {attr.i()})};
    if (name == "value_ints")
      return {HostTensor::ofInts(ElementKind::Int64, {attr.ints_size()},
                                 {attr.ints().begin(), attr.ints().end()})};
  }
  fail(node, "has no supported value attribute (value, value_float(s), value_int(s))");
}

std::vector<HostTensor> OnnxImporter::foldShape(const onnx::NodeProto &node) {
  std::vector<int64_t> shape = shapeOfInput(node, 0);
  int64_t rank = shape.size();
  int64_t start = intAttr(node, "start", 0), end = intAttr(node, "end", rank);
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  std::vector<int64_t> dims(shape.begin() + start, shape.begin() + std::max(start, end));
  int64_t count = dims.size();
  return {HostTensor::ofInts(ElementKind::Int64, {count}, dims)};
}

std::vector<HostTensor> OnnxImporter::foldSize(const onnx::NodeProto &node) {
  auto count = pipec::io::checkedElementCount(shapeOfInput(node, 0));
  if (!count)
    fail(node, "the input's element count overflows int64");
  return {HostTensor::ofInts(ElementKind::Int64, {}, {*count})};
}

std::vector<HostTensor> OnnxImporter::foldConstantOfShape(const onnx::NodeProto &node) {
  std::vector<int64_t> shape = constantInput(node, 0, "shape").toInts();
  foldedElementCount(shape, "ConstantOfShape"); // before anything is allocated
  HostTensor fill = HostTensor::ofFloats(ElementKind::Float32, {1}, {0.0});
  if (const auto *value = attribute(node, "value"))
    fill = readTensor(value->t(), "ConstantOfShape value");
  return {fold::expand(fold::reshape(fill, {}), shape)};
}

std::vector<HostTensor> OnnxImporter::foldBinary(const onnx::NodeProto &node) {
  // Mod's fmod=1 follows C's fmod (the sign of the dividend).
  std::string op = node.op_type() == "Mod" && intAttr(node, "fmod", 0) ? "FMod" : node.op_type();
  return {fold::binary(op, constantInput(node, 0, "first"), constantInput(node, 1, "second"))};
}

std::vector<HostTensor> OnnxImporter::foldVariadic(const onnx::NodeProto &node) {
  // Max, Min, Sum and Mean of any number of inputs, left to right.
  std::string op = node.op_type() == "Sum" || node.op_type() == "Mean" ? "Add" : node.op_type();
  if (node.input_size() < 1)
    fail(node, "needs at least one input");
  HostTensor result = constantInput(node, 0, "first");
  for (int i = 1; i < node.input_size(); ++i)
    result = fold::binary(op, result, constantInput(node, i, "next"));
  if (node.op_type() == "Mean" && node.input_size() > 1) {
    HostTensor count = isFloating(result.kind)
                           ? HostTensor::ofFloats(result.kind, {}, {double(node.input_size())})
                           : HostTensor::ofInts(result.kind, {}, {node.input_size()});
    result = fold::binary("Div", result, count);
  }
  return {result};
}

std::vector<HostTensor> OnnxImporter::foldIsInf(const onnx::NodeProto &node) {
  const HostTensor &x = constantInput(node, 0, "first");
  if (!isFloating(x.kind))
    fail(node, "IsInf needs a floating-point input");
  bool positive = intAttr(node, "detect_positive", 1) != 0, negative = intAttr(node, "detect_negative", 1) != 0;
  std::vector<int64_t> flags;
  for (double v : x.floats)
    flags.push_back(std::isinf(v) && (v > 0 ? positive : negative));
  return {HostTensor::ofInts(ElementKind::Bool, x.shape, flags)};
}

std::vector<HostTensor> OnnxImporter::foldCastLike(const onnx::NodeProto &node) {
  return {fold::cast(constantInput(node, 0, "first"), constantInput(node, 1, "second").kind)};
}

std::vector<HostTensor> OnnxImporter::foldUnary(const onnx::NodeProto &node) {
  return {fold::unary(node.op_type(), constantInput(node, 0, "first"))};
}

std::vector<HostTensor> OnnxImporter::foldCast(const onnx::NodeProto &node) {
  auto kind = elementKindOf(static_cast<int32_t>(intAttr(node, "to", 0)));
  if (!kind)
    fail(node, "casts to an unsupported element type");
  return {fold::cast(constantInput(node, 0, "first"), *kind)};
}

std::vector<HostTensor> OnnxImporter::foldWhere(const onnx::NodeProto &node) {
  return {fold::where(constantInput(node, 0, "condition"), constantInput(node, 1, "X"),
                      constantInput(node, 2, "Y"))};
}

std::vector<HostTensor> OnnxImporter::foldGather(const onnx::NodeProto &node) {
  return {fold::gather(constantInput(node, 0, "data"), constantInput(node, 1, "indices"),
                       intAttr(node, "axis", 0))};
}

std::vector<HostTensor> OnnxImporter::foldConcat(const onnx::NodeProto &node) {
  std::vector<const HostTensor *> inputs;
  for (int i = 0; i < node.input_size(); ++i)
    inputs.push_back(&constantInput(node, i, "concatenated"));
  return {fold::concat(inputs, intAttr(node, "axis", 0))};
}

std::vector<HostTensor> OnnxImporter::foldUnsqueeze(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  std::vector<int64_t> axes = unsqueezeAxes(node, input.shape.size());
  int64_t outRank = input.shape.size() + axes.size();
  std::vector<int64_t> shape;
  auto next = input.shape.begin();
  for (int64_t d = 0; d < outRank; ++d)
    shape.push_back(std::binary_search(axes.begin(), axes.end(), d) ? 1 : *next++);
  return {fold::reshape(input, shape)};
}

std::vector<HostTensor> OnnxImporter::foldSqueeze(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  std::vector<int64_t> axes;
  if (auto given = squeezeAxes(node))
    axes = normalizedAxes(node, *given, input.shape.size());
  std::vector<int64_t> shape;
  for (size_t d = 0; d < input.shape.size(); ++d) {
    bool squeezed = axes.empty() ? input.shape[d] == 1 : llvm::is_contained(axes, d);
    if (squeezed && input.shape[d] != 1)
      fail(node, "axis " + std::to_string(d) + " has size " + std::to_string(input.shape[d]) +
                     ", not 1");
    if (!squeezed)
      shape.push_back(input.shape[d]);
  }
  return {fold::reshape(input, shape)};
}

std::vector<HostTensor> OnnxImporter::foldReshape(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  return {fold::reshape(input, resolveReshape(input.shape, constantInput(node, 1, "shape").toInts(),
                                              intAttr(node, "allowzero", 0) != 0))};
}

std::vector<HostTensor> OnnxImporter::foldFlatten(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  int64_t rank = input.shape.size();
  int64_t axis = intAttr(node, "axis", 1);
  if (axis < 0)
    axis += rank;
  if (axis < 0 || axis > rank)
    fail(node, "axis out of range");
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= input.shape[d];
  return {fold::reshape(input, {outer, input.numElements() / std::max<int64_t>(outer, 1)})};
}

std::vector<HostTensor> OnnxImporter::foldExpand(const onnx::NodeProto &node) {
  return {fold::expand(constantInput(node, 0, "data"), constantInput(node, 1, "shape").toInts())};
}

std::vector<HostTensor> OnnxImporter::foldTranspose(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  return {fold::transpose(input, transposePerm(node, input.shape.size()))};
}

std::vector<HostTensor> OnnxImporter::foldSlice(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  SliceWindow window = sliceWindow(node, input.shape, /*folding=*/true);
  return {fold::slice(input, window.starts, window.ends, window.steps)};
}

std::vector<HostTensor> OnnxImporter::foldRange(const onnx::NodeProto &node) {
  return {fold::range(constantInput(node, 0, "start"), constantInput(node, 1, "limit"),
                      constantInput(node, 2, "delta"))};
}

std::vector<HostTensor> OnnxImporter::foldIdentity(const onnx::NodeProto &node) {
  return {constantInput(node, 0, "input")};
}

std::vector<HostTensor> OnnxImporter::foldTrilu(const onnx::NodeProto &node) {
  int64_t k = 0;
  if (auto given = optionalScalarInput(node, 1, "k"))
    k = given->asInt(0);
  return {fold::trilu(constantInput(node, 0, "input"), k, intAttr(node, "upper", 1) != 0)};
}

std::vector<HostTensor> OnnxImporter::foldCumSum(const onnx::NodeProto &node) {
  const HostTensor &axis = constantInput(node, 1, "axis");
  if (axis.numElements() != 1)
    fail(node, "axis must hold one value");
  return {fold::cumSum(constantInput(node, 0, "x"), axis.asInt(0),
                       intAttr(node, "exclusive", 0) != 0, intAttr(node, "reverse", 0) != 0)};
}

std::vector<HostTensor> OnnxImporter::foldTile(const onnx::NodeProto &node) {
  return {fold::tile(constantInput(node, 0, "input"), constantInput(node, 1, "repeats").toInts())};
}

std::vector<HostTensor> OnnxImporter::foldGatherElements(const onnx::NodeProto &node) {
  return {fold::gatherAlongAxis(constantInput(node, 0, "data"), constantInput(node, 1, "indices"),
                                intAttr(node, "axis", 0))};
}

std::vector<HostTensor> OnnxImporter::foldScatterElements(const onnx::NodeProto &node) {
  return {fold::scatterAlongAxis(constantInput(node, 0, "data"), constantInput(node, 1, "indices"),
                                 constantInput(node, 2, "updates"), intAttr(node, "axis", 0),
                                 stringAttr(node, "reduction", "none"))};
}

std::vector<HostTensor> OnnxImporter::foldGatherND(const onnx::NodeProto &node) {
  return {fold::gatherND(constantInput(node, 0, "data"), constantInput(node, 1, "indices"),
                         intAttr(node, "batch_dims", 0))};
}

std::vector<HostTensor> OnnxImporter::foldScatterND(const onnx::NodeProto &node) {
  return {fold::scatterND(constantInput(node, 0, "data"), constantInput(node, 1, "indices"),
                          constantInput(node, 2, "updates"), stringAttr(node, "reduction", "none"))};
}

std::vector<HostTensor> OnnxImporter::foldReduce(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  auto axes = reductionAxes(node, static_cast<int64_t>(input.shape.size()),
                            node.op_type() == "ReduceSum" ? 13 : 18);
  if (!axes) // noop_with_empty_axes: the input as it is (ONNX)
    return {input};
  return {fold::reduce(node.op_type(), input, *axes, intAttr(node, "keepdims", 1) != 0)};
}

} // namespace pipec::import::detail
