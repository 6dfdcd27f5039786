// Converters of arithmetic and network layers: each turns one ONNX node into
// `nn` ops located at the node, with ONNX's defaults and version differences
// resolved here (docs/importer.md). Binary and unary element-wise converters
// are templates in ImporterImpl.h.
#include "compiler/Import/ImporterImpl.h"

using namespace mlir;

namespace pipec::import::detail {

void OnnxImporter::convertGelu(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  NamedAttribute approximate =
      builder.getNamedAttr("approximate", builder.getStringAttr(stringAttr(node, "approximate",
                                                                           "none")));
  defineResults(node, createVerified(node, nn::GeluOp::getOperationName(), {input},
                                     {input.getType()}, {approximate}),
                1);
}

void OnnxImporter::convertWhere(const onnx::NodeProto &node) {
  defineInferred<nn::WhereOp>(node, {operand(node, 0), operand(node, 1), operand(node, 2)}, {});
}

void OnnxImporter::convertCast(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto kind = elementKindOf(static_cast<int32_t>(intAttr(node, "to", 0)));
  if (!kind)
    fail(node, "casts to an unsupported element type (" + std::to_string(intAttr(node, "to", 0)) +
                   ")");
  Type type = RankedTensorType::get(typeOf(input).getShape(), mlirElementType(context, *kind));
  if (type == input.getType()) {
    define(node, 0, input); // a no-op cast
    return;
  }
  defineResults(node, createVerified(node, nn::CastOp::getOperationName(), {input}, {type}, {}),
                1);
}

void OnnxImporter::convertGemm(const onnx::NodeProto &node) {
  SmallVector<Value> operands{operand(node, 0), operand(node, 1)};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("alpha", builder.getF32FloatAttr(floatAttr(node, "alpha", 1.0f))),
      builder.getNamedAttr("beta", builder.getF32FloatAttr(floatAttr(node, "beta", 1.0f))),
      builder.getNamedAttr("transA", builder.getBoolAttr(intAttr(node, "transA", 0) != 0)),
      builder.getNamedAttr("transB", builder.getBoolAttr(intAttr(node, "transB", 0) != 0))};
  defineInferred<nn::GemmOp>(node, operands, attributes);
}

void OnnxImporter::convertMatMul(const onnx::NodeProto &node) {
  defineInferred<nn::MatMulOp>(node, {operand(node, 0), operand(node, 1)}, {});
}

/// Resolves auto_pad and fills strides, pads (and dilations) with ONNX's defaults.
void OnnxImporter::windowAttributes(const onnx::NodeProto &node, int64_t spatial,
                                    ArrayRef<int64_t> inputShape, ArrayRef<int64_t> kernel,
                                    SmallVectorImpl<NamedAttribute> &attributes,
                                    bool withDilations) {
  std::vector<int64_t> strides = intsAttr(node, "strides").value_or(std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> dilations =
      intsAttr(node, "dilations").value_or(std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> pads = intsAttr(node, "pads").value_or(std::vector<int64_t>(2 * spatial, 0));
  if (static_cast<int64_t>(strides.size()) != spatial ||
      static_cast<int64_t>(dilations.size()) != spatial ||
      static_cast<int64_t>(pads.size()) != 2 * spatial ||
      static_cast<int64_t>(kernel.size()) != spatial)
    fail(node, "strides, dilations, kernel_shape need " + std::to_string(spatial) +
                   " entries and pads " + std::to_string(2 * spatial));
  for (int64_t axis = 0; axis < spatial; ++axis)
    if (strides[axis] < 1 || dilations[axis] < 1 || kernel[axis] < 1 ||
        pads[axis] < 0 || pads[axis + spatial] < 0)
      fail(node, "strides [" + join(strides) + "], dilations [" + join(dilations) +
                     "] and kernel_shape [" + join(kernel) + "] must be positive and pads [" +
                     join(pads) + "] non-negative");
  std::string autoPad = stringAttr(node, "auto_pad", "NOTSET");
  if (autoPad == "VALID") {
    std::fill(pads.begin(), pads.end(), 0);
  } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    for (int64_t axis = 0; axis < spatial; ++axis) {
      // In 128 bits: the attributes are the model's and may be huge.
      __int128 input = inputShape[axis + 2], stride = strides[axis];
      __int128 output = (input + stride - 1) / stride;
      __int128 effective = (__int128(kernel[axis]) - 1) * dilations[axis] + 1;
      __int128 needed = std::max<__int128>((output - 1) * stride + effective - input, 0);
      if (needed > INT64_MAX)
        fail(node, "the padding auto_pad=" + autoPad + " needs overflows int64");
      int64_t total = static_cast<int64_t>(needed);
      int64_t small = total / 2, large = total - small;
      pads[axis] = autoPad == "SAME_UPPER" ? small : large;
      pads[axis + spatial] = autoPad == "SAME_UPPER" ? large : small;
    }
  } else if (autoPad != "NOTSET") {
    fail(node, "unknown auto_pad '" + autoPad + "'");
  }
  attributes.push_back(builder.getNamedAttr("strides", builder.getDenseI64ArrayAttr(strides)));
  attributes.push_back(builder.getNamedAttr("pads", builder.getDenseI64ArrayAttr(pads)));
  if (withDilations)
    attributes.push_back(
        builder.getNamedAttr("dilations", builder.getDenseI64ArrayAttr(dilations)));
  else if (llvm::any_of(dilations, [](int64_t d) { return d != 1; }))
    fail(node, "dilations other than 1 are not supported by this operator");
}

void OnnxImporter::convertConv(const onnx::NodeProto &node) {
  Value input = operand(node, 0), weight = operand(node, 1);
  auto inputShape = typeOf(input).getShape();
  auto weightShape = typeOf(weight).getShape();
  if (inputShape.size() < 3 || weightShape.size() != inputShape.size())
    fail(node, "input and weight must be (N,C,spatial...) of the same rank");
  int64_t spatial = inputShape.size() - 2;
  std::vector<int64_t> kernel =
      intsAttr(node, "kernel_shape")
          .value_or(std::vector<int64_t>(weightShape.begin() + 2, weightShape.end()));
  if (ArrayRef<int64_t>(kernel) != weightShape.drop_front(2))
    fail(node, "kernel_shape [" + join(kernel) + "] differs from the weight's spatial shape");
  SmallVector<NamedAttribute> attributes;
  windowAttributes(node, spatial, inputShape, kernel, attributes, true);
  attributes.push_back(builder.getNamedAttr("group", builder.getI64IntegerAttr(intAttr(node, "group", 1))));
  SmallVector<Value> operands{input, weight};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  defineInferred<nn::ConvOp>(node, operands, attributes);
}

void OnnxImporter::convertBatchNorm(const onnx::NodeProto &node) {
  SmallVector<Value> operands;
  for (int i = 0; i < 5; ++i)
    operands.push_back(operand(node, i));
  // Opset 14+ says training_mode; before, training is signalled by the
  // optional running-statistics outputs (PyTorch's 5-output form).
  bool training = nodeVersion >= 14 ? intAttr(node, "training_mode", 0) != 0
                              : node.output_size() > 1;
  rejectUsedOutputs(node, 3, "saved batch statistics");
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("epsilon", builder.getF32FloatAttr(floatAttr(node, "epsilon", 1e-5f))),
      builder.getNamedAttr("momentum", builder.getF32FloatAttr(floatAttr(node, "momentum", 0.9f))),
      builder.getNamedAttr("training", builder.getBoolAttr(training))};
  defineInferred<nn::BatchNormOp>(node, operands, attributes, 3);
}

void OnnxImporter::convertLayerNorm(const onnx::NodeProto &node) {
  SmallVector<Value> operands{operand(node, 0), operand(node, 1)};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", -1))),
      builder.getNamedAttr("epsilon", builder.getF32FloatAttr(floatAttr(node, "epsilon", 1e-5f)))};
  defineInferred<nn::LayerNormOp>(node, operands, attributes, 3);
}

template <typename OpT>
Operation *OnnxImporter::createPool(const onnx::NodeProto &node, ArrayRef<NamedAttribute> extra,
                                    bool withDilations) {
  Value input = operand(node, 0);
  auto inputShape = typeOf(input).getShape();
  if (inputShape.size() < 3)
    fail(node, "input must be (N,C,spatial...)");
  auto kernel = intsAttr(node, "kernel_shape");
  if (!kernel)
    fail(node, "kernel_shape is required");
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("kernel_shape", builder.getDenseI64ArrayAttr(*kernel)),
      builder.getNamedAttr("ceil_mode", builder.getBoolAttr(intAttr(node, "ceil_mode", 0) != 0))};
  attributes.append(extra.begin(), extra.end());
  windowAttributes(node, inputShape.size() - 2, inputShape, *kernel, attributes, withDilations);
  return createInferred<OpT>(node, {input}, attributes);
}

void OnnxImporter::convertMaxPool(const onnx::NodeProto &node) {
  rejectUsedOutputs(node, 1, "indices");
  if (intAttr(node, "storage_order", 0) != 0)
    fail(node, "storage_order=1 is not supported");
  defineResults(node, createPool<nn::MaxPoolOp>(node, {}, /*withDilations=*/true), 1);
}

void OnnxImporter::convertAveragePool(const onnx::NodeProto &node) {
  NamedAttribute countIncludePad = builder.getNamedAttr(
      "count_include_pad", builder.getBoolAttr(intAttr(node, "count_include_pad", 0) != 0));
  defineResults(node,
                createPool<nn::AveragePoolOp>(node, {countIncludePad}, /*withDilations=*/false),
                1);
}

void OnnxImporter::convertGlobalAveragePool(const onnx::NodeProto &node) {
  defineInferred<nn::GlobalAveragePoolOp>(node, {operand(node, 0)}, {});
}

void OnnxImporter::convertDropout(const onnx::NodeProto &node) {
  float ratio = 0.5f;
  bool training = false;
  if (nodeVersion < 12) {
    // Before opset 12 the ratio is an attribute and Dropout only runs in
    // inference mode (is_test), where it is the identity.
    ratio = floatAttr(node, "ratio", 0.5f);
  } else {
    if (auto given = optionalScalarInput(node, 1, "ratio"))
      ratio = static_cast<float>(given->asDouble(0));
    if (auto given = optionalScalarInput(node, 2, "training_mode"))
      training = given->asInt(0) != 0;
  }
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("ratio", builder.getF32FloatAttr(ratio)),
      builder.getNamedAttr("training", builder.getBoolAttr(training))};
  if (const auto *seed = attribute(node, "seed"))
    attributes.push_back(builder.getNamedAttr("seed", builder.getI64IntegerAttr(seed->i())));
  defineInferred<nn::DropoutOp>(node, {operand(node, 0)}, attributes, 2);
}

void OnnxImporter::convertSoftmax(const onnx::NodeProto &node) {
  if (nodeVersion < 13) {
    // Versions 1 and 11 normalize over all axes from `axis` on (default 1):
    // flatten to 2-D, softmax the rows, restore the shape.
    Value input = operand(node, 0);
    auto type = typeOf(input);
    int64_t axis = normalizedAxes(node, {intAttr(node, "axis", 1)}, type.getRank())[0];
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= type.getDimSize(d);
    auto flatType = RankedTensorType::get({outer, type.getNumElements() / std::max<int64_t>(outer, 1)},
                                          type.getElementType());
    Value flat = createVerified(node, nn::ReshapeOp::getOperationName(), {input}, {flatType}, {})
                     ->getResult(0);
    Value soft = createInferred<nn::SoftmaxOp>(
                     node, {flat}, {builder.getNamedAttr("axis", builder.getI64IntegerAttr(1))})
                     ->getResult(0);
    defineResults(node, createVerified(node, nn::ReshapeOp::getOperationName(), {soft}, {type}, {}),
                  1);
    return;
  }
  defineInferred<nn::SoftmaxOp>(
      node, {operand(node, 0)},
      {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", -1)))});
}

void OnnxImporter::convertSoftmaxCrossEntropyLoss(const onnx::NodeProto &node) {
  SmallVector<Value> operands{operand(node, 0), operand(node, 1)};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  SmallVector<NamedAttribute> attributes{builder.getNamedAttr(
      "reduction", builder.getStringAttr(stringAttr(node, "reduction", "mean")))};
  if (const auto *ignore = attribute(node, "ignore_index"))
    attributes.push_back(
        builder.getNamedAttr("ignore_index", builder.getI64IntegerAttr(ignore->i())));
  defineInferred<nn::SoftmaxCrossEntropyLossOp>(node, operands, attributes, 2);
}

void OnnxImporter::convertReduceMean(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  int64_t rank = typeOf(input).getRank();
  std::vector<int64_t> axes;
  if (nodeVersion >= 18) {
    if (auto given = optionalConstantInput(node, 1, "axes"))
      axes = given->toInts();
  } else {
    axes = intsAttr(node, "axes").value_or(std::vector<int64_t>{});
  }
  if (axes.empty() && intAttr(node, "noop_with_empty_axes", 0)) {
    define(node, 0, input);
    return;
  }
  if (axes.empty())
    for (int64_t axis = 0; axis < rank; ++axis)
      axes.push_back(axis);
  axes = normalizedAxes(node, axes, rank);
  defineInferred<nn::ReduceMeanOp>(
      node, {input},
      {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes)),
       builder.getNamedAttr("keepdims", builder.getBoolAttr(intAttr(node, "keepdims", 1) != 0))});
}

} // namespace pipec::import::detail
