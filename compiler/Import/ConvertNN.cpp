// Converters of arithmetic and network layers: each turns one ONNX node into
// `nn` ops located at the node, with ONNX's defaults and version differences
// resolved here (docs/importer.md). Binary and unary element-wise converters
// are templates in ImporterImpl.h.
#include "compiler/Import/ImporterImpl.h"

#include <limits>

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

//===----------------------------------------------------------------------===//
// Element-wise operators lowered into the binary and unary table's ops
// (docs/importer.md): no kernels of their own, and -O2's element-wise fusion
// makes each one loop again.
//===----------------------------------------------------------------------===//

Value OnnxImporter::filledLike(const onnx::NodeProto &node, Value like, ArrayRef<int64_t> shape,
                               double value) {
  auto kind = pipec::import::elementKindOf(typeOf(like).getElementType());
  if (!kind)
    fail(node, "has an operand of an unsupported element type");
  std::vector<int64_t> dims(shape.begin(), shape.end());
  int64_t count =
      std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
  HostTensor filled =
      isFloating(*kind)
          ? HostTensor::ofFloats(*kind, dims, std::vector<double>(count, value))
          : HostTensor::ofInts(*kind, dims, std::vector<int64_t>(count, static_cast<int64_t>(value)));
  return materialize(filled, locationOf(node));
}

Value OnnxImporter::rectify(const onnx::NodeProto &node, Value x, Value threshold,
                            llvm::function_ref<Value(Value)> negative) {
  Value positive = build<nn::GreaterOp>(node, {x, threshold});
  Value nonPositivePart = build<nn::WhereOp>(node, {positive, scalarLike(node, x, 0.0), x});
  return build<nn::WhereOp>(node, {positive, x, negative(nonPositivePart)});
}

Value OnnxImporter::clip(const onnx::NodeProto &node, Value x, Value low, Value high, bool inclusive) {
  Value result = x;
  // Below the low bound: low; then above the high bound: high (so high wins
  // when low > high, as ONNX says). A bound itself takes the bound's branch
  // when exclusive, whose gradient to x is 0.
  if (low) {
    Value below = inclusive ? build<nn::LessOp>(node, {result, low})
                            : build<nn::LessOrEqualOp>(node, {result, low});
    result = build<nn::WhereOp>(node, {below, low, result});
  }
  if (high) {
    Value above = inclusive ? build<nn::GreaterOp>(node, {result, high})
                            : build<nn::GreaterOrEqualOp>(node, {result, high});
    result = build<nn::WhereOp>(node, {above, high, result});
  }
  return result;
}

void OnnxImporter::convertMean(const onnx::NodeProto &node) {
  if (node.input_size() < 1)
    fail(node, "needs at least one input");
  Value sum = operand(node, 0);
  for (int i = 1; i < node.input_size(); ++i)
    sum = build<nn::AddOp>(node, {sum, operand(node, i)});
  define(node, 0, node.input_size() == 1 ? sum : build<nn::DivOp>(node, {sum, scalarLike(node, sum, node.input_size())}));
}

void OnnxImporter::convertNeg(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (llvm::isa<FloatType>(typeOf(x).getElementType()))
    return convertUnary<nn::NegOp>(node);
  define(node, 0, build<nn::SubOp>(node, {scalarLike(node, x, 0), x})); // integers wrap, as C++
}

void OnnxImporter::convertAbs(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (llvm::isa<FloatType>(typeOf(x).getElementType()))
    return convertUnary<nn::AbsOp>(node);
  define(node, 0, build<nn::MaxOp>(node, {x, build<nn::SubOp>(node, {scalarLike(node, x, 0), x})}));
}

void OnnxImporter::convertSign(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (llvm::isa<FloatType>(typeOf(x).getElementType()))
    return convertUnary<nn::SignOp>(node);
  // Integers: (x > 0) - (x < 0), in int64 and back (no gradient flows).
  Type element = typeOf(x).getElementType();
  Value zero = scalarLike(node, x, 0);
  Value positive = castTo(node, build<nn::GreaterOp>(node, {x, zero}), builder.getI64Type());
  Value negative = castTo(node, build<nn::LessOp>(node, {x, zero}), builder.getI64Type());
  define(node, 0, castTo(node, build<nn::SubOp>(node, {positive, negative}), element));
}

void OnnxImporter::convertMod(const onnx::NodeProto &node) {
  Value lhs = operand(node, 0), rhs = operand(node, 1);
  bool fmod = intAttr(node, "fmod", 0) != 0;
  if (!fmod && llvm::isa<FloatType>(typeOf(lhs).getElementType()))
    fail(node, "Mod of floating-point operands needs fmod = 1 (ONNX)");
  define(node, 0, fmod ? build<nn::FModOp>(node, {lhs, rhs}) : build<nn::ModOp>(node, {lhs, rhs}));
}

void OnnxImporter::convertNot(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (!typeOf(x).getElementType().isInteger(1))
    fail(node, "Not needs a bool input");
  define(node, 0, build<nn::XorOp>(node, {x, scalarLike(node, x, 1)}));
}

void OnnxImporter::convertIsNaN(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (!llvm::isa<FloatType>(typeOf(x).getElementType()))
    fail(node, "IsNaN needs a floating-point input");
  Value ordered = build<nn::EqualOp>(node, {x, x}); // false exactly for NaN
  define(node, 0, build<nn::XorOp>(node, {ordered, scalarLike(node, ordered, 1)}));
}

void OnnxImporter::convertIsInf(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  if (!llvm::isa<FloatType>(typeOf(x).getElementType()))
    fail(node, "IsInf needs a floating-point input");
  bool positive = intAttr(node, "detect_positive", 1) != 0;
  bool negative = intAttr(node, "detect_negative", 1) != 0;
  const double inf = std::numeric_limits<double>::infinity();
  Value result;
  if (positive && negative)
    result = build<nn::EqualOp>(node, {build<nn::AbsOp>(node, {x}), scalarLike(node, x, inf)});
  else if (positive || negative)
    result = build<nn::EqualOp>(node, {x, scalarLike(node, x, positive ? inf : -inf)});
  else // detects nothing: x < x is false everywhere
    result = build<nn::LessOp>(node, {x, x});
  define(node, 0, result);
}

void OnnxImporter::convertClip(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value low, high;
  if (nodeVersion < 11) {
    // Attributes; absent means none (version 6's defaults are float's range).
    if (attribute(node, "min"))
      low = scalarLike(node, x, floatAttr(node, "min", 0));
    if (attribute(node, "max"))
      high = scalarLike(node, x, floatAttr(node, "max", 0));
  } else {
    // Optional inputs, empty names for none; they may be run-time values.
    for (int index : {1, 2}) {
      if (!hasInput(node, index))
        continue;
      Value bound = operand(node, index);
      if (typeOf(bound).getNumElements() != 1)
        fail(node, std::string(index == 1 ? "min" : "max") + " must hold one value");
      if (typeOf(bound).getRank() != 0)
        bound = createVerified(node, nn::ReshapeOp::getOperationName(), {bound},
                               {RankedTensorType::get({}, typeOf(bound).getElementType())}, {})
                    ->getResult(0);
      (index == 1 ? low : high) = bound;
    }
  }
  // Bounds 0 and 6 on floats (PyTorch's relu6, and hardtanh(0, 6)): one
  // nn.relu6, whose gradient is the wheres' (0 on the bounds), and which a
  // batch norm before it takes as its epilogue (docs/optimization.md).
  auto constantBound = [](Value bound) -> std::optional<double> {
    while (bound && bound.getDefiningOp<nn::ReshapeOp>())
      bound = bound.getDefiningOp<nn::ReshapeOp>().getInput();
    auto constant = bound ? bound.getDefiningOp<nn::ConstantOp>() : nn::ConstantOp();
    auto dense = constant ? llvm::dyn_cast<DenseFPElementsAttr>(constant.getValue()) : DenseFPElementsAttr();
    if (!dense || dense.getNumElements() != 1)
      return std::nullopt;
    return (*dense.getValues<APFloat>().begin()).convertToDouble();
  };
  if (llvm::isa<FloatType>(typeOf(x).getElementType()) && constantBound(low) == 0.0 &&
      constantBound(high) == 6.0) {
    if (nodeVersion < 11) // the attributes' constants, made for this node alone
      for (Value bound : {low, high})
        bound.getDefiningOp()->erase();
    return define(node, 0, build<nn::Relu6Op>(node, {x}));
  }
  define(node, 0, clip(node, x, low, high, /*inclusive=*/false));
}

void OnnxImporter::convertHardSigmoid(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value linear = build<nn::AddOp>(
      node, {build<nn::MulOp>(node, {x, scalarLike(node, x, floatAttr(node, "alpha", 0.2f))}),
             scalarLike(node, x, floatAttr(node, "beta", 0.5f))});
  // Exclusive: PyTorch's hardsigmoid passes the gradient for -3 < x < 3 only.
  define(node, 0, clip(node, linear, scalarLike(node, x, 0), scalarLike(node, x, 1), false));
}

void OnnxImporter::convertHardSwish(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value linear = build<nn::AddOp>(
      node, {build<nn::MulOp>(node, {x, scalarLike(node, x, 1.0 / 6.0)}), scalarLike(node, x, 0.5)});
  // Inclusive: PyTorch's hardswish derivative is x / 3 + 1/2 on [-3, 3],
  // its ends included (-1/2 at -3, 3/2 at 3).
  Value gate = clip(node, linear, scalarLike(node, x, 0), scalarLike(node, x, 1), true);
  define(node, 0, build<nn::MulOp>(node, {x, gate}));
}

void OnnxImporter::convertLeakyRelu(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value alpha = scalarLike(node, x, floatAttr(node, "alpha", 0.01f));
  // x > 0 ? x : alpha x, and so the gradient (alpha at 0, as PyTorch).
  define(node, 0, build<nn::WhereOp>(node, {build<nn::GreaterOp>(node, {x, scalarLike(node, x, 0)}), x,
                                           build<nn::MulOp>(node, {x, alpha})}));
}

void OnnxImporter::convertPRelu(const onnx::NodeProto &node) {
  Value x = operand(node, 0), slope = operand(node, 1);
  // Unidirectional broadcasting: the slope broadcasts to x, never x to it.
  auto shape = nn::broadcastShapes(typeOf(x).getShape(), typeOf(slope).getShape());
  if (failed(shape) || ArrayRef<int64_t>(*shape) != typeOf(x).getShape())
    fail(node, "slope of shape " + shapeText(typeOf(slope).getShape()) +
                   " does not broadcast to the input's " + shapeText(typeOf(x).getShape()));
  define(node, 0, build<nn::WhereOp>(node, {build<nn::GreaterOp>(node, {x, scalarLike(node, x, 0)}), x,
                                           build<nn::MulOp>(node, {x, slope})}));
}

void OnnxImporter::convertElu(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  double alpha = floatAttr(node, "alpha", 1.0f);
  // alpha (e^x - 1) for x <= 0: the gradient at 0 is alpha, as PyTorch.
  define(node, 0, rectify(node, x, scalarLike(node, x, 0), [&](Value part) {
           Value expm1 = build<nn::SubOp>(node, {build<nn::ExpOp>(node, {part}), scalarLike(node, x, 1)});
           return build<nn::MulOp>(node, {expm1, scalarLike(node, x, alpha)});
         }));
}

void OnnxImporter::convertSelu(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  double alpha = floatAttr(node, "alpha", 1.67326319217681884765625f);
  double gamma = floatAttr(node, "gamma", 1.05070102214813232421875f);
  Value elu = rectify(node, x, scalarLike(node, x, 0), [&](Value part) {
    Value expm1 = build<nn::SubOp>(node, {build<nn::ExpOp>(node, {part}), scalarLike(node, x, 1)});
    return build<nn::MulOp>(node, {expm1, scalarLike(node, x, alpha)});
  });
  define(node, 0, build<nn::MulOp>(node, {elu, scalarLike(node, x, gamma)}));
}

void OnnxImporter::convertCelu(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  double alpha = floatAttr(node, "alpha", 1.0f);
  if (alpha == 0)
    fail(node, "alpha must not be 0");
  // alpha (e^(x / alpha) - 1) for x <= 0: the gradient at 0 is 1, as PyTorch.
  define(node, 0, rectify(node, x, scalarLike(node, x, 0), [&](Value part) {
           Value scaled = build<nn::DivOp>(node, {part, scalarLike(node, x, alpha)});
           Value expm1 = build<nn::SubOp>(node, {build<nn::ExpOp>(node, {scaled}), scalarLike(node, x, 1)});
           return build<nn::MulOp>(node, {expm1, scalarLike(node, x, alpha)});
         }));
}

void OnnxImporter::convertMish(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value gate = build<nn::TanhOp>(node, {build<nn::SoftplusOp>(node, {x})});
  define(node, 0, build<nn::MulOp>(node, {x, gate}));
}

void OnnxImporter::convertThresholdedRelu(const onnx::NodeProto &node) {
  Value x = operand(node, 0);
  Value above = build<nn::GreaterOp>(node, {x, scalarLike(node, x, floatAttr(node, "alpha", 1.0f))});
  define(node, 0, build<nn::WhereOp>(node, {above, x, scalarLike(node, x, 0)}));
}

Value OnnxImporter::castTo(const onnx::NodeProto &node, Value value, Type element) {
  if (typeOf(value).getElementType() == element)
    return value;
  return createVerified(node, nn::CastOp::getOperationName(), {value},
                        {RankedTensorType::get(typeOf(value).getShape(), element)}, {})
      ->getResult(0);
}

void OnnxImporter::convertCastLike(const onnx::NodeProto &node) {
  define(node, 0, castTo(node, operand(node, 0), typeOf(operand(node, 1)).getElementType()));
}

void OnnxImporter::convertCast(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto kind = elementKindOf(static_cast<int32_t>(intAttr(node, "to", 0)));
  if (!kind)
    fail(node, "casts to an unsupported element type (" + std::to_string(intAttr(node, "to", 0)) +
                   ")");
  define(node, 0, castTo(node, input, mlirElementType(context, *kind)));
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

std::vector<int64_t> OnnxImporter::convolutionKernel(const onnx::NodeProto &node,
                                                     ArrayRef<int64_t> inputShape,
                                                     ArrayRef<int64_t> weightShape) {
  if (inputShape.size() < 3 || weightShape.size() != inputShape.size())
    fail(node, "input and weight must be (N,C,spatial...) of the same rank");
  std::vector<int64_t> kernel =
      intsAttr(node, "kernel_shape")
          .value_or(std::vector<int64_t>(weightShape.begin() + 2, weightShape.end()));
  if (ArrayRef<int64_t>(kernel) != weightShape.drop_front(2))
    fail(node, "kernel_shape [" + join(kernel) + "] differs from the weight's spatial shape");
  return kernel;
}

void OnnxImporter::convertConv(const onnx::NodeProto &node) {
  Value input = operand(node, 0), weight = operand(node, 1);
  auto inputShape = typeOf(input).getShape();
  std::vector<int64_t> kernel = convolutionKernel(node, inputShape, typeOf(weight).getShape());
  int64_t spatial = inputShape.size() - 2;
  SmallVector<NamedAttribute> attributes;
  windowAttributes(node, spatial, inputShape, kernel, attributes, true);
  attributes.push_back(builder.getNamedAttr("group", builder.getI64IntegerAttr(intAttr(node, "group", 1))));
  SmallVector<Value> operands{input, weight};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  // input, weight, bias, no residual (an epilogue is made after autodiff).
  attributes.push_back(builder.getNamedAttr(
      "operandSegmentSizes",
      builder.getDenseI32ArrayAttr({1, 1, static_cast<int32_t>(operands.size() - 2), 0})));
  defineInferred<nn::ConvOp>(node, operands, attributes);
}

/// ConvTranspose is the gradient of a convolution with respect to its input:
/// the weight (C_in, C_out/group, kernel...) is that convolution's
/// (M, C/group, kernel...) as it is, so it becomes nn.conv_input_grad with
/// the ConvTranspose's output as the convolution's input (docs/importer.md).
void OnnxImporter::convertConvTranspose(const onnx::NodeProto &node) {
  Value input = operand(node, 0), weight = operand(node, 1);
  auto inputShape = typeOf(input).getShape();
  auto weightShape = typeOf(weight).getShape();
  const std::vector<int64_t> kernel = convolutionKernel(node, inputShape, weightShape);
  const int64_t spatial = inputShape.size() - 2, group = intAttr(node, "group", 1);
  if (group < 1 || inputShape[1] != weightShape[0] || weightShape[0] % group)
    fail(node, "input channels " + std::to_string(inputShape[1]) + ", group " +
                   std::to_string(group) + " and weight [" + join(weightShape) +
                   "] do not match (weight: C_in, C_out/group, kernel...)");
  auto spatialAttr = [&](const char *name, int64_t fallback) {
    std::vector<int64_t> values =
        intsAttr(node, name).value_or(std::vector<int64_t>(spatial, fallback));
    if (static_cast<int64_t>(values.size()) != spatial)
      fail(node, std::string(name) + " needs " + std::to_string(spatial) + " entries");
    return values;
  };
  std::vector<int64_t> strides = spatialAttr("strides", 1), dilations = spatialAttr("dilations", 1),
                       outputPadding = spatialAttr("output_padding", 0);
  std::vector<int64_t> pads = intsAttr(node, "pads").value_or(std::vector<int64_t>(2 * spatial, 0));
  if (static_cast<int64_t>(pads.size()) != 2 * spatial)
    fail(node, "pads needs " + std::to_string(2 * spatial) + " entries");
  std::string autoPad = stringAttr(node, "auto_pad", "NOTSET");
  if (autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" &&
      autoPad != "SAME_LOWER")
    fail(node, "unknown auto_pad '" + autoPad + "'");
  std::optional<std::vector<int64_t>> outputShape = intsAttr(node, "output_shape");
  if (outputShape && outputShape->size() == inputShape.size()) // (N, C, spatial...) spelled out
    outputShape->erase(outputShape->begin(), outputShape->begin() + 2);
  if (outputShape && (static_cast<int64_t>(outputShape->size()) != spatial ||
                      llvm::any_of(*outputShape, [](int64_t size) { return size < 1; })))
    fail(node, "output_shape needs " + std::to_string(spatial) + " positive spatial entries");

  std::vector<int64_t> resultShape{inputShape[0], weightShape[1] * group};
  for (int64_t axis = 0; axis < spatial; ++axis) {
    if (strides[axis] < 1 || dilations[axis] < 1 || kernel[axis] < 1 || outputPadding[axis] < 0)
      fail(node, "strides [" + join(strides) + "], dilations [" + join(dilations) +
                     "] and kernel_shape [" + join(kernel) +
                     "] must be positive and output_padding non-negative");
    // In 128 bits: the attributes are the model's and may be huge.
    __int128 full = __int128(strides[axis]) * (inputShape[axis + 2] - 1) + outputPadding[axis] +
                    (__int128(kernel[axis]) - 1) * dilations[axis] + 1;
    __int128 wanted = -1;
    if (outputShape)
      wanted = (*outputShape)[axis];
    else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER")
      wanted = __int128(inputShape[axis + 2]) * strides[axis];
    __int128 begin = pads[axis], end = pads[axis + spatial];
    if (autoPad == "VALID")
      begin = end = 0;
    if (wanted >= 0) { // ONNX's rule: the total padding split, the odd one at the end for SAME_UPPER
      __int128 total = full - wanted, half = total >= 0 ? total / 2 : -((1 - total) / 2);
      begin = autoPad == "SAME_UPPER" ? half : total - half;
      end = autoPad == "SAME_UPPER" ? total - half : half;
    }
    // Output rows past every window (output_padding, a negative end pad)
    // are zeros the convolution's input may have as long as they are fewer
    // than a stride: more would change the size it maps back to.
    __int128 extra = outputPadding[axis] + (end < 0 ? -end : 0);
    if (begin < 0 || extra >= strides[axis] || full - begin - end < 1 || full - begin - end > INT64_MAX)
      fail(node, "spatial axis " + std::to_string(axis) + ": pads " +
                     std::to_string(static_cast<int64_t>(begin)) + " and " +
                     std::to_string(static_cast<int64_t>(end)) + " with output_padding " +
                     std::to_string(outputPadding[axis]) + " and stride " +
                     std::to_string(strides[axis]) +
                     ": supported are a non-negative begin pad and fewer extra end rows "
                     "(output_padding, negative end pad) than the stride");
    resultShape.push_back(static_cast<int64_t>(full - begin - end));
    pads[axis] = static_cast<int64_t>(begin);
    pads[axis + spatial] = static_cast<int64_t>(end < 0 ? 0 : end);
  }
  auto resultType = RankedTensorType::get(resultShape, typeOf(input).getElementType());
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("strides", builder.getDenseI64ArrayAttr(strides)),
      builder.getNamedAttr("pads", builder.getDenseI64ArrayAttr(pads)),
      builder.getNamedAttr("dilations", builder.getDenseI64ArrayAttr(dilations)),
      builder.getNamedAttr("group", builder.getI64IntegerAttr(group))};
  Value result = createVerified(node, nn::ConvInputGradOp::getOperationName(), {input, weight},
                                {resultType}, attributes)
                     ->getResult(0);
  if (hasInput(node, 2)) {
    Value bias = operand(node, 2);
    if (typeOf(bias).getShape() != ArrayRef<int64_t>{resultShape[1]})
      fail(node, "bias must have shape [" + std::to_string(resultShape[1]) + "]");
    std::vector<int64_t> biasShape(resultShape.size(), 1);
    biasShape[1] = resultShape[1];
    result = build<nn::AddOp>(node, {result, reshapeTo(node, bias, biasShape)});
  }
  define(node, 0, result);
}

void OnnxImporter::convertBatchNorm(const onnx::NodeProto &node) {
  SmallVector<Value> operands;
  for (int i = 0; i < 5; ++i)
    operands.push_back(operand(node, i));
  // --batchnorm decides: exporters write inference form even from train()
  // (ExporterArtifacts.cpp notes it). As exported: opset 14+ says
  // training_mode; before, PyTorch's 5-output form trains.
  bool training = options.batchNorm == BatchNormStatistics::AsExported
                      ? (nodeVersion >= 14 ? intAttr(node, "training_mode", 0) != 0
                                           : node.output_size() > 1)
                      : options.batchNorm == BatchNormStatistics::Batch;
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
  if (ratio == 0.0f || !training) {
    // The identity (Hugging Face's attention_dropout = 0.0 is exported as a
    // training Dropout of ratio 0): its input, and a mask keeping everything,
    // so that nothing between a softmax and its product hides the attention.
    Value input = operand(node, 0);
    define(node, 0, input);
    if (node.output_size() > 1 && !node.output(1).empty()) {
      auto shape = typeOf(input).getShape();
      std::vector<int64_t> dims(shape.begin(), shape.end());
      std::vector<int64_t> keep(typeOf(input).getNumElements(), 1);
      define(node, 1, materialize(HostTensor::ofInts(ElementKind::Bool, dims, keep), locationOf(node)));
    }
    return;
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

void OnnxImporter::convertGroupNormalization(const onnx::NodeProto &node) {
  Value input = operand(node, 0), scale = operand(node, 1), bias = operand(node, 2);
  auto shape = typeOf(input).getShape();
  if (shape.size() < 2)
    fail(node, "the input must be (N, C, ...)");
  int64_t batch = shape[0], channels = shape[1];
  bool instance = node.op_type() == "InstanceNormalization";
  int64_t groups = instance ? channels : intAttr(node, "num_groups", 0);
  if (groups < 1 || channels % groups != 0)
    fail(node, "num_groups " + std::to_string(groups) + " must divide the " +
                   std::to_string(channels) + " channels");
  // Normalize each (sample, group) over its channels and positions: one
  // layer normalization of the last axis of (N, groups, rest), with unit
  // scale; then the per-channel affine.
  int64_t rest = typeOf(input).getNumElements() / (batch * groups);
  Value ones = filledLike(node, input, {rest}, 1.0);
  Value normalized = createInferred<nn::LayerNormOp>(
                         node, {reshapeTo(node, input, {batch, groups, rest}), ones},
                         {builder.getNamedAttr("axis", builder.getI64IntegerAttr(-1)),
                          builder.getNamedAttr("epsilon", builder.getF32FloatAttr(
                                                              floatAttr(node, "epsilon", 1e-5f)))})
                         ->getResult(0);
  normalized = reshapeTo(node, normalized, shape);
  // Scale and bias per channel (opset 21), or per group (GroupNormalization
  // 18: each group's value serves its channels).
  std::vector<int64_t> perChannel(shape.size(), 1);
  perChannel[1] = channels;
  auto affine = [&](Value parameter) {
    int64_t size = typeOf(parameter).getNumElements();
    if (size == groups && groups != channels) {
      parameter = expandTo(node, reshapeTo(node, parameter, {groups, 1}), {groups, channels / groups});
    } else if (size != channels) {
      fail(node, "scale and bias must have one value per channel (or per group before opset "
                 "21)");
    }
    return reshapeTo(node, parameter, perChannel);
  };
  Value scaled = build<nn::MulOp>(node, {normalized, affine(scale)});
  define(node, 0, build<nn::AddOp>(node, {scaled, affine(bias)}));
}

} // namespace pipec::import::detail
