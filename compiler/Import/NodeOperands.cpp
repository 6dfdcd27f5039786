// What converters and folders share: operands (values translated so far or
// known at import time), results, attributes, axes arguments, and the
// creation of `nn` ops with their shape, type and verifier errors turned
// into import errors naming the node.
#include "compiler/Import/ImporterImpl.h"

#include "mlir/IR/Verifier.h"
#include "llvm/Support/ErrorHandling.h"

using namespace mlir;

namespace pipec::import::detail {

std::string join(const std::vector<int64_t> &values, const char *separator) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? separator : "") + std::to_string(values[i]);
  return text;
}

Type mlirElementType(MLIRContext &context, ElementKind kind) {
  Builder b(&context);
  switch (trainingKind(kind)) {
  case ElementKind::Float32: return b.getF32Type();
  case ElementKind::Float64: return b.getF64Type();
  case ElementKind::Float16: return b.getF16Type();
  case ElementKind::BFloat16: return b.getBF16Type();
  case ElementKind::Int64: return b.getI64Type();
  case ElementKind::Int32: return b.getI32Type();
  case ElementKind::Int8: return b.getIntegerType(8);
  case ElementKind::UInt8: return b.getIntegerType(8, /*isSigned=*/false);
  case ElementKind::Bool: return b.getI1Type();
  }
  llvm_unreachable("every ElementKind has its case in mlirElementType");
}

DiagnosticCapture::DiagnosticCapture(MLIRContext &context)
    : handler(&context, [this](Diagnostic &diagnostic) {
        if (!captured.empty())
          captured += "; ";
        captured += diagnostic.str();
        return success();
      }) {}

//===----------------------------------------------------------------------===//
// Operands and results
//===----------------------------------------------------------------------===//

Location OnnxImporter::locationOf(const onnx::NodeProto &node) {
  std::string name = node.name().empty() ? node.op_type() + "#" + std::to_string(currentNodeIndex)
                                         : node.name();
  return NameLoc::get(builder.getStringAttr(name),
                      FileLineColLoc::get(&context, path, currentNodeIndex + 1, 0));
}

Value OnnxImporter::operand(const onnx::NodeProto &node, int index) {
  if (!hasInput(node, index))
    fail(node, "input " + std::to_string(index) + " is required");
  const std::string &name = node.input(index);
  if (auto it = values.find(name); it != values.end())
    return it->second;
  if (auto it = constants.find(name); it != constants.end()) {
    auto cached = materializedConstants.find(name);
    if (cached != materializedConstants.end())
      return cached->second;
    OpBuilder::InsertionGuard guard(builder);
    Value value = materialize(it->second, NameLoc::get(builder.getStringAttr(name)));
    materializedConstants[name] = value;
    return value;
  }
  fail(node, "input '" + name + "' is not defined before this node (the graph must be "
             "topologically sorted)");
}

const HostTensor &OnnxImporter::constantInput(const onnx::NodeProto &node, int index,
                                              const char *role) {
  if (!hasInput(node, index))
    fail(node, std::string("the ") + role + " input is required");
  auto it = constants.find(node.input(index));
  if (it == constants.end())
    fail(node, std::string("the ") + role + " input '" + node.input(index) +
                   "' must be computable at import time, but it depends on run-time values");
  return it->second;
}

std::optional<HostTensor> OnnxImporter::optionalConstantInput(const onnx::NodeProto &node,
                                                              int index, const char *role) {
  if (!hasInput(node, index))
    return std::nullopt;
  return constantInput(node, index, role);
}

std::optional<HostTensor> OnnxImporter::optionalScalarInput(const onnx::NodeProto &node,
                                                            int index, const char *role) {
  auto value = optionalConstantInput(node, index, role);
  if (value && value->numElements() != 1)
    fail(node, std::string("the ") + role + " input must hold one value, not " +
                   std::to_string(value->numElements()));
  return value;
}

std::vector<int64_t> OnnxImporter::shapeOfInput(const onnx::NodeProto &node, int index) {
  if (hasInput(node, index)) {
    if (auto it = constants.find(node.input(index)); it != constants.end())
      return it->second.shape;
  }
  auto shape = typeOf(operand(node, index)).getShape();
  return {shape.begin(), shape.end()};
}

Value OnnxImporter::materialize(const HostTensor &given, Location loc) {
  // Widened to float32 only when it is another floating kind (no copy otherwise).
  std::optional<HostTensor> widened;
  if (given.kind != trainingKind(given.kind))
    widened = inTrainingKind(given);
  const HostTensor &tensor = widened ? *widened : given;
  Type element = mlirElementType(context, tensor.kind);
  auto type = RankedTensorType::get(tensor.shape, element);
  DenseElementsAttr attr;
  switch (tensor.kind) {
  case ElementKind::Float32: {
    std::vector<float> data(tensor.floats.begin(), tensor.floats.end());
    attr = DenseElementsAttr::get(type, llvm::ArrayRef(data));
    break;
  }
  case ElementKind::Float64:
    attr = DenseElementsAttr::get(type, llvm::ArrayRef(tensor.floats));
    break;
  case ElementKind::Float16:
  case ElementKind::BFloat16: {
    std::vector<APFloat> data;
    for (double value : tensor.floats) {
      APFloat converted(value);
      bool lost;
      converted.convert(llvm::cast<FloatType>(element).getFloatSemantics(),
                        APFloat::rmNearestTiesToEven, &lost);
      data.push_back(converted);
    }
    attr = DenseElementsAttr::get(type, data);
    break;
  }
  case ElementKind::Bool: {
    std::vector<bool> data(tensor.ints.begin(), tensor.ints.end());
    llvm::SmallVector<bool> flags(data.begin(), data.end());
    attr = DenseElementsAttr::get(type, llvm::ArrayRef<bool>(flags));
    break;
  }
  default: {
    unsigned width = element.getIntOrFloatBitWidth();
    std::vector<APInt> data;
    for (int64_t value : tensor.ints)
      data.emplace_back(width, static_cast<uint64_t>(value), /*isSigned=*/true,
                        /*implicitTrunc=*/true);
    attr = DenseElementsAttr::get(type, data);
    break;
  }
  }
  return nn::ConstantOp::create(builder, loc, attr);
}

void OnnxImporter::define(const onnx::NodeProto &node, int index, Value value) {
  if (index < node.output_size() && !node.output(index).empty())
    values[node.output(index)] = value;
}

void OnnxImporter::defineResults(const onnx::NodeProto &node, Operation *op, size_t count) {
  for (size_t i = 0; i < count && i < op->getNumResults(); ++i)
    define(node, static_cast<int>(i), op->getResult(i));
}

void OnnxImporter::rejectUsedOutputs(const onnx::NodeProto &node, size_t from,
                                     const char *what) {
  for (int i = static_cast<int>(from); i < node.output_size(); ++i)
    if (!node.output(i).empty() && useCounts[node.output(i)] > 0)
      fail(node, std::string("output ") + std::to_string(i) + " ('" + node.output(i) +
                     "', " + what + ") is used, which pipec does not support");
}

//===----------------------------------------------------------------------===//
// Attributes and axes
//===----------------------------------------------------------------------===//

bool hasInput(const onnx::NodeProto &node, int index) {
  return index < node.input_size() && !node.input(index).empty();
}

const onnx::AttributeProto *attribute(const onnx::NodeProto &node, const char *name) {
  for (const auto &attr : node.attribute())
    if (attr.name() == name)
      return &attr;
  return nullptr;
}

int64_t intAttr(const onnx::NodeProto &node, const char *name, int64_t fallback) {
  const auto *attr = attribute(node, name);
  return attr ? attr->i() : fallback;
}

float floatAttr(const onnx::NodeProto &node, const char *name, float fallback) {
  const auto *attr = attribute(node, name);
  return attr ? attr->f() : fallback;
}

std::string stringAttr(const onnx::NodeProto &node, const char *name,
                       const std::string &fallback) {
  const auto *attr = attribute(node, name);
  return attr ? attr->s() : fallback;
}

std::optional<std::vector<int64_t>> intsAttr(const onnx::NodeProto &node, const char *name) {
  const auto *attr = attribute(node, name);
  if (!attr)
    return std::nullopt;
  return std::vector<int64_t>(attr->ints().begin(), attr->ints().end());
}

std::vector<int64_t> OnnxImporter::normalizedAxes(const onnx::NodeProto &node,
                                                  std::vector<int64_t> axes, int64_t rank,
                                                  bool sortAndCheckUnique) {
  for (int64_t &axis : axes) {
    if (axis < -rank || axis >= rank)
      fail(node, "axis " + std::to_string(axis) + " is out of range for rank " +
                     std::to_string(rank));
    if (axis < 0)
      axis += rank;
  }
  if (sortAndCheckUnique) {
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
      fail(node, "axes [" + join(axes) + "] repeat an axis");
  }
  return axes;
}

std::optional<std::vector<int64_t>> OnnxImporter::squeezeAxes(const onnx::NodeProto &node) {
  if (nodeVersion < 13)
    return intsAttr(node, "axes");
  if (auto given = optionalConstantInput(node, 1, "axes"))
    return given->toInts();
  return std::nullopt;
}

std::vector<int64_t> OnnxImporter::unsqueezeAxes(const onnx::NodeProto &node, int64_t inputRank) {
  auto given = squeezeAxes(node);
  if (!given)
    fail(node, "axes are required");
  std::vector<int64_t> axes = *given;
  int64_t outRank = inputRank + static_cast<int64_t>(axes.size());
  return normalizedAxes(node, axes, outRank);
}

std::vector<int64_t> OnnxImporter::transposePerm(const onnx::NodeProto &node, int64_t rank) {
  if (auto given = intsAttr(node, "perm"))
    return normalizedAxes(node, *given, rank, /*sortAndCheckUnique=*/false);
  std::vector<int64_t> perm;
  for (int64_t axis = rank - 1; axis >= 0; --axis)
    perm.push_back(axis);
  return perm;
}

OnnxImporter::SliceWindow OnnxImporter::sliceWindow(const onnx::NodeProto &node,
                                                    ArrayRef<int64_t> shape, bool folding) {
  int64_t rank = shape.size();
  std::vector<int64_t> starts = constantInput(node, 1, "starts").toInts();
  std::vector<int64_t> ends = constantInput(node, 2, "ends").toInts();
  std::vector<int64_t> axes;
  if (auto given = optionalConstantInput(node, 3, "axes"))
    axes = normalizedAxes(node, given->toInts(), rank, /*sortAndCheckUnique=*/false);
  else
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  std::vector<int64_t> steps(starts.size(), 1);
  if (auto given = optionalConstantInput(node, 4, "steps"))
    steps = given->toInts();
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(node, "starts, ends, axes and steps differ in length");
  SliceWindow window{std::vector<int64_t>(rank, 0),
                     std::vector<int64_t>(shape.begin(), shape.end()),
                     std::vector<int64_t>(rank, 1)};
  for (size_t i = 0; i < axes.size(); ++i) {
    // The folder's message never named the axis; both are kept as they were.
    if (steps[i] == 0)
      fail(node, folding ? "step 0" : "step 0 on axis " + std::to_string(axes[i]));
    auto [start, end] = normalizeSliceBounds(starts[i], ends[i], steps[i], shape[axes[i]]);
    window.starts[axes[i]] = start;
    window.ends[axes[i]] = end;
    window.steps[axes[i]] = steps[i];
  }
  return window;
}

//===----------------------------------------------------------------------===//
// Op creation
//===----------------------------------------------------------------------===//

Operation *OnnxImporter::createVerified(const onnx::NodeProto &node, StringRef name,
                                        ValueRange operands, TypeRange types,
                                        ArrayRef<NamedAttribute> attributes) {
  OperationState state(locationOf(node), name, operands, types, attributes);
  Operation *op = builder.create(state);
  verifyCreated(node, op);
  return op;
}

void OnnxImporter::verifyCreated(const onnx::NodeProto &node, Operation *op) {
  DiagnosticCapture diagnostics(context);
  if (failed(mlir::verify(op)))
    fail(node, diagnostics.text());
}

} // namespace pipec::import::detail
