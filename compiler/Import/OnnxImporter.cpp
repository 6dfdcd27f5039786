// ONNX → `nn` importer. Phases, each reporting every problem it finds before
// stopping: load (file, protobuf, opset), analysis (supported ops, which
// initializers are trained, which values are known at import time, input
// shapes), then translation node by node (shape sub-graphs folded on the
// host, everything else becomes one `nn` op located at its node), then a
// cross-check against ONNX's own shape inference and a final verify.
#include "compiler/Import/OnnxImporter.h"
#include "compiler/Import/HostTensor.h"
#include "compiler/Import/ModelValidation.h"
#include "dialects/nn/NNDialect.h"
#include "pipec/input_file.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"

#include <onnx/defs/parser.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

using namespace mlir;
namespace fs = std::filesystem;

namespace pipec::import {
namespace {

// Models may declare any opset up to the newest one pipec knows; each node is
// then checked against the operator versions pipec translates (see
// operatorVersions below). 13 and newer are the exporters' usual choice.
constexpr int64_t kMinOpset = 1;
constexpr int64_t kMaxOpset = 20;

/// The opsets at which an operator's definition changed, and the oldest
/// version pipec translates. The version a node follows is the newest change
/// at or below the model's opset.
struct OperatorVersions {
  std::vector<int64_t> changes;
  int64_t oldestSupported;
};

const std::map<std::string, OperatorVersions> &operatorVersions() {
  static const std::map<std::string, OperatorVersions> table = {
      {"Add", {{1, 6, 7, 13, 14}, 7}},        {"Sub", {{1, 6, 7, 13, 14}, 7}},
      {"Mul", {{1, 6, 7, 13, 14}, 7}},        {"Div", {{1, 6, 7, 13, 14}, 7}},
      {"Pow", {{1, 7, 12, 13, 15}, 7}},       {"Equal", {{1, 7, 11, 13, 19}, 7}},
      {"Gemm", {{1, 6, 7, 9, 11, 13}, 7}},    {"BatchNormalization", {{1, 6, 7, 9, 14, 15}, 9}},
      {"Dropout", {{1, 6, 7, 10, 12, 13}, 7}}, {"Softmax", {{1, 11, 13}, 1}},
      {"Split", {{1, 2, 11, 13, 18}, 2}},     {"Squeeze", {{1, 11, 13}, 1}},
      {"Unsqueeze", {{1, 11, 13}, 1}},        {"ReduceMean", {{1, 11, 13, 18}, 1}},
      {"Slice", {{1, 10, 11, 13}, 10}},       {"Pad", {{1, 2, 11, 13, 18, 19}, 11}},
      {"Reshape", {{1, 5, 13, 14, 19}, 5}},   {"Concat", {{1, 4, 11, 13}, 4}},
      {"Where", {{9, 16}, 9}},                {"Expand", {{8, 13}, 8}},
      {"ConstantOfShape", {{9}, 9}},          {"LayerNormalization", {{17}, 17}},
      {"Gelu", {{20}, 20}},                   {"SoftmaxCrossEntropyLoss", {{12, 13}, 12}},
      {"Erf", {{9, 13}, 9}},                  {"Range", {{11}, 11}},
  };
  return table;
}

/// The version of `opType` a model at `opset` uses; 0 when the operator does
/// not exist yet at that opset.
int64_t resolvedVersion(const std::string &opType, int64_t opset) {
  auto it = operatorVersions().find(opType);
  if (it == operatorVersions().end())
    return opset;
  int64_t version = 0;
  for (int64_t change : it->second.changes)
    if (change <= opset)
      version = change;
  return version;
}

/// Thrown to abandon the import after the errors have been recorded.
struct ImportAborted {};

std::string join(const std::vector<int64_t> &values, const char *separator = ",") {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? separator : "") + std::to_string(values[i]);
  return text;
}

std::optional<ElementKind> elementKindOf(int32_t onnxType) {
  using T = onnx::TensorProto_DataType;
  switch (onnxType) {
  case T::TensorProto_DataType_FLOAT: return ElementKind::Float32;
  case T::TensorProto_DataType_DOUBLE: return ElementKind::Float64;
  case T::TensorProto_DataType_FLOAT16: return ElementKind::Float16;
  case T::TensorProto_DataType_BFLOAT16: return ElementKind::BFloat16;
  case T::TensorProto_DataType_INT64: return ElementKind::Int64;
  case T::TensorProto_DataType_INT32: return ElementKind::Int32;
  case T::TensorProto_DataType_INT8: return ElementKind::Int8;
  case T::TensorProto_DataType_UINT8: return ElementKind::UInt8;
  case T::TensorProto_DataType_BOOL: return ElementKind::Bool;
  default: return std::nullopt;
  }
}

int64_t byteWidth(ElementKind kind) {
  switch (kind) {
  case ElementKind::Float64: case ElementKind::Int64: return 8;
  case ElementKind::Float32: case ElementKind::Int32: return 4;
  case ElementKind::Float16: case ElementKind::BFloat16: return 2;
  default: return 1;
  }
}

Type mlirElementType(MLIRContext &context, ElementKind kind) {
  Builder b(&context);
  switch (kind) {
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
  return {};
}

} // namespace

std::optional<ElementKind> elementKindOf(Type type) {
  if (type.isF32()) return ElementKind::Float32;
  if (type.isF64()) return ElementKind::Float64;
  if (type.isF16()) return ElementKind::Float16;
  if (type.isBF16()) return ElementKind::BFloat16;
  if (type.isInteger(64)) return ElementKind::Int64;
  if (type.isInteger(32)) return ElementKind::Int32;
  if (type.isInteger(1)) return ElementKind::Bool;
  if (type.isUnsignedInteger(8)) return ElementKind::UInt8;
  if (type.isInteger(8)) return ElementKind::Int8;
  return std::nullopt;
}

namespace {

float halfBitsToFloat(uint16_t bits, bool bfloat) {
  if (bfloat) {
    uint32_t word = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, 4);
    return value;
  }
  llvm::APFloat value(llvm::APFloat::IEEEhalf(), llvm::APInt(16, bits));
  return value.convertToFloat();
}

/// One ONNX operator the importer translates into `nn`.
class OnnxImporter;
using Converter = void (OnnxImporter::*)(const onnx::NodeProto &);
struct OpRule {
  const char *opType;
  Converter convert;
  /// Input positions through which gradients flow; decides which
  /// initializers are trained. Empty means none (e.g. Equal).
  std::vector<int> differentiableInputs;
};

/// Shape sub-graph operators folded on the host when all inputs are known.
using Folder = std::vector<HostTensor> (OnnxImporter::*)(const onnx::NodeProto &);

class OnnxImporter {
public:
  OnnxImporter(MLIRContext &context, std::string path, const ImportOptions &options,
               std::vector<std::string> &errors)
      : context(context), builder(&context), path(std::move(path)), options(options),
        errors(errors) {}

  OwningOpRef<ModuleOp> run();
  bool readInitializers(std::map<std::string, HostTensor> &values);

  // Converters (one per supported ONNX operator).
  template <typename OpT> void convertBinary(const onnx::NodeProto &node);
  template <typename OpT> void convertUnary(const onnx::NodeProto &node);
  void convertWhere(const onnx::NodeProto &node);
  void convertGelu(const onnx::NodeProto &node);
  void convertCast(const onnx::NodeProto &node);
  void convertGemm(const onnx::NodeProto &node);
  void convertMatMul(const onnx::NodeProto &node);
  void convertConv(const onnx::NodeProto &node);
  void convertBatchNorm(const onnx::NodeProto &node);
  void convertLayerNorm(const onnx::NodeProto &node);
  void convertMaxPool(const onnx::NodeProto &node);
  void convertAveragePool(const onnx::NodeProto &node);
  void convertGlobalAveragePool(const onnx::NodeProto &node);
  void convertDropout(const onnx::NodeProto &node);
  void convertSoftmax(const onnx::NodeProto &node);
  void convertSoftmaxCrossEntropyLoss(const onnx::NodeProto &node);
  void convertReduceMean(const onnx::NodeProto &node);
  void convertGather(const onnx::NodeProto &node);
  void convertReshape(const onnx::NodeProto &node);
  void convertFlatten(const onnx::NodeProto &node);
  void convertUnsqueeze(const onnx::NodeProto &node);
  void convertSqueeze(const onnx::NodeProto &node);
  void convertExpand(const onnx::NodeProto &node);
  void convertTranspose(const onnx::NodeProto &node);
  void convertConcat(const onnx::NodeProto &node);
  void convertPad(const onnx::NodeProto &node);
  void convertSplit(const onnx::NodeProto &node);
  void convertSlice(const onnx::NodeProto &node);
  void convertIdentity(const onnx::NodeProto &node);

  // Folders (shape computations).
  std::vector<HostTensor> foldConstant(const onnx::NodeProto &node);
  std::vector<HostTensor> foldShape(const onnx::NodeProto &node);
  std::vector<HostTensor> foldSize(const onnx::NodeProto &node);
  std::vector<HostTensor> foldConstantOfShape(const onnx::NodeProto &node);
  std::vector<HostTensor> foldBinary(const onnx::NodeProto &node);
  std::vector<HostTensor> foldUnary(const onnx::NodeProto &node);
  std::vector<HostTensor> foldCast(const onnx::NodeProto &node);
  std::vector<HostTensor> foldWhere(const onnx::NodeProto &node);
  std::vector<HostTensor> foldGather(const onnx::NodeProto &node);
  std::vector<HostTensor> foldConcat(const onnx::NodeProto &node);
  std::vector<HostTensor> foldUnsqueeze(const onnx::NodeProto &node);
  std::vector<HostTensor> foldSqueeze(const onnx::NodeProto &node);
  std::vector<HostTensor> foldReshape(const onnx::NodeProto &node);
  std::vector<HostTensor> foldFlatten(const onnx::NodeProto &node);
  std::vector<HostTensor> foldExpand(const onnx::NodeProto &node);
  std::vector<HostTensor> foldTranspose(const onnx::NodeProto &node);
  std::vector<HostTensor> foldSlice(const onnx::NodeProto &node);
  std::vector<HostTensor> foldRange(const onnx::NodeProto &node);
  std::vector<HostTensor> foldIdentity(const onnx::NodeProto &node);

private:
  // Loading and analysis.
  bool loadModel();
  bool checkOpsets();
  bool analyzeGraph();
  bool resolveInputTypes();
  /// Checks an initializer's type, shape and data size (external data
  /// included, without reading it); returns its element count.
  int64_t checkTensorData(const onnx::TensorProto &tensor, const std::string &what);
  HostTensor readTensor(const onnx::TensorProto &tensor, const std::string &what);
  /// Checks the external data of `tensor` (location inside the model's
  /// folder, a regular file, offset and length inside it, length equal to
  /// `expectedBytes`) and, when `read`, returns its bytes.
  std::string readExternalData(const onnx::TensorProto &tensor, const std::string &what,
                               uint64_t expectedBytes, bool read);
  void crossCheckShapeInference();

  // Errors.
  std::string nodeLabel(const onnx::NodeProto &node) const;
  [[noreturn]] void fail(const onnx::NodeProto &node, const std::string &reason);
  [[noreturn]] void failFile(const std::string &reason);

  // Operands.
  Location locationOf(const onnx::NodeProto &node);
  bool hasInput(const onnx::NodeProto &node, int index) const;
  Value operand(const onnx::NodeProto &node, int index);
  const HostTensor &constantInput(const onnx::NodeProto &node, int index, const char *role);
  std::optional<HostTensor> optionalConstantInput(const onnx::NodeProto &node, int index,
                                                  const char *role);
  /// An optional operand known at import time that must hold one value.
  std::optional<HostTensor> optionalScalarInput(const onnx::NodeProto &node, int index,
                                                const char *role);
  RankedTensorType typeOf(Value value) { return llvm::cast<RankedTensorType>(value.getType()); }
  std::vector<int64_t> shapeOfInput(const onnx::NodeProto &node, int index);
  Value materialize(const HostTensor &tensor, Location loc);
  void define(const onnx::NodeProto &node, int index, Value value);
  void defineResults(const onnx::NodeProto &node, Operation *op, size_t count);
  void rejectUsedOutputs(const onnx::NodeProto &node, size_t from, const char *what);

  // Attributes.
  const onnx::AttributeProto *attribute(const onnx::NodeProto &node, const char *name) const;
  int64_t intAttr(const onnx::NodeProto &node, const char *name, int64_t fallback) const;
  float floatAttr(const onnx::NodeProto &node, const char *name, float fallback) const;
  std::string stringAttr(const onnx::NodeProto &node, const char *name,
                         const std::string &fallback) const;
  std::optional<std::vector<int64_t>> intsAttr(const onnx::NodeProto &node,
                                               const char *name) const;
  /// Squeeze/Unsqueeze axes: an attribute before version 13, an input since.
  std::optional<std::vector<int64_t>> squeezeAxes(const onnx::NodeProto &node);
  std::vector<int64_t> normalizedAxes(const onnx::NodeProto &node, std::vector<int64_t> axes,
                                      int64_t rank, bool sortAndCheckUnique = true);

  /// Creates an op whose result types the op infers; a shape or type error
  /// becomes an import error naming the node.
  template <typename OpT>
  Operation *createInferred(const onnx::NodeProto &node, ValueRange operands,
                            ArrayRef<NamedAttribute> attributes);
  /// Creates an op with given result types and verifies it.
  Operation *createVerified(const onnx::NodeProto &node, StringRef name, ValueRange operands,
                            TypeRange types, ArrayRef<NamedAttribute> attributes);
  void verifyCreated(const onnx::NodeProto &node, Operation *op);
  void windowAttributes(const onnx::NodeProto &node, int64_t spatial,
                        ArrayRef<int64_t> inputShape, ArrayRef<int64_t> kernel,
                        SmallVectorImpl<NamedAttribute> &attributes, bool withDilations);

  MLIRContext &context;
  OpBuilder builder;
  std::string path;
  const ImportOptions &options;
  std::vector<std::string> &errors;

  onnx::ModelProto model;
  int64_t opset = 0;
  /// Version of the operator of the node being translated (resolvedVersion).
  int64_t nodeVersion = 0;
  fs::path modelDirectory;
  std::string capturedDiagnostics;

  std::map<std::string, const onnx::TensorProto *> initializers;
  std::set<std::string> parameterNames, bufferNames;
  std::set<std::string> knownAtImport; // values folded on the host
  std::map<std::string, RankedTensorType> inputTypes;
  std::map<std::string, HostTensor> constants;
  std::map<std::string, Value> values;
  std::map<std::string, Value> materializedConstants;
  std::map<std::string, int> useCounts;
  int currentNodeIndex = 0;
};

//===----------------------------------------------------------------------===//
// The tables
//===----------------------------------------------------------------------===//

const std::vector<int> kAll = {0, 1, 2, 3, 4, 5, 6, 7};

const std::vector<OpRule> &opRules() {
  static const std::vector<OpRule> rules = {
      {"Add", &OnnxImporter::convertBinary<nn::AddOp>, kAll},
      {"Sub", &OnnxImporter::convertBinary<nn::SubOp>, kAll},
      {"Mul", &OnnxImporter::convertBinary<nn::MulOp>, kAll},
      {"Div", &OnnxImporter::convertBinary<nn::DivOp>, kAll},
      {"Pow", &OnnxImporter::convertBinary<nn::PowOp>, kAll},
      {"Equal", &OnnxImporter::convertBinary<nn::EqualOp>, {}},
      {"Where", &OnnxImporter::convertWhere, {1, 2}},
      {"Relu", &OnnxImporter::convertUnary<nn::ReluOp>, kAll},
      {"Tanh", &OnnxImporter::convertUnary<nn::TanhOp>, kAll},
      {"Sigmoid", &OnnxImporter::convertUnary<nn::SigmoidOp>, kAll},
      {"Erf", &OnnxImporter::convertUnary<nn::ErfOp>, kAll},
      {"Sqrt", &OnnxImporter::convertUnary<nn::SqrtOp>, kAll},
      {"Gelu", &OnnxImporter::convertGelu, kAll},
      {"Cast", &OnnxImporter::convertCast, kAll},
      {"Gemm", &OnnxImporter::convertGemm, kAll},
      {"MatMul", &OnnxImporter::convertMatMul, kAll},
      {"Conv", &OnnxImporter::convertConv, kAll},
      {"BatchNormalization", &OnnxImporter::convertBatchNorm, {0, 1, 2}},
      {"LayerNormalization", &OnnxImporter::convertLayerNorm, kAll},
      {"MaxPool", &OnnxImporter::convertMaxPool, {0}},
      {"AveragePool", &OnnxImporter::convertAveragePool, {0}},
      {"GlobalAveragePool", &OnnxImporter::convertGlobalAveragePool, {0}},
      {"Dropout", &OnnxImporter::convertDropout, {0}},
      {"Softmax", &OnnxImporter::convertSoftmax, {0}},
      {"SoftmaxCrossEntropyLoss", &OnnxImporter::convertSoftmaxCrossEntropyLoss, {0}},
      {"ReduceMean", &OnnxImporter::convertReduceMean, {0}},
      {"Gather", &OnnxImporter::convertGather, {0}},
      {"Reshape", &OnnxImporter::convertReshape, {0}},
      {"Flatten", &OnnxImporter::convertFlatten, {0}},
      {"Unsqueeze", &OnnxImporter::convertUnsqueeze, {0}},
      {"Squeeze", &OnnxImporter::convertSqueeze, {0}},
      {"Expand", &OnnxImporter::convertExpand, {0}},
      {"Transpose", &OnnxImporter::convertTranspose, {0}},
      {"Concat", &OnnxImporter::convertConcat, kAll},
      {"Pad", &OnnxImporter::convertPad, {0}},
      {"Split", &OnnxImporter::convertSplit, {0}},
      {"Slice", &OnnxImporter::convertSlice, {0}},
      {"Identity", &OnnxImporter::convertIdentity, {0}},
  };
  return rules;
}

const std::map<std::string, Folder> &folders() {
  static const std::map<std::string, Folder> table = {
      {"Constant", &OnnxImporter::foldConstant},
      {"Shape", &OnnxImporter::foldShape},
      {"Size", &OnnxImporter::foldSize},
      {"ConstantOfShape", &OnnxImporter::foldConstantOfShape},
      {"Add", &OnnxImporter::foldBinary},
      {"Sub", &OnnxImporter::foldBinary},
      {"Mul", &OnnxImporter::foldBinary},
      {"Div", &OnnxImporter::foldBinary},
      {"Pow", &OnnxImporter::foldBinary},
      {"Mod", &OnnxImporter::foldBinary},
      {"Max", &OnnxImporter::foldBinary},
      {"Min", &OnnxImporter::foldBinary},
      {"Equal", &OnnxImporter::foldBinary},
      {"Less", &OnnxImporter::foldBinary},
      {"Greater", &OnnxImporter::foldBinary},
      {"LessOrEqual", &OnnxImporter::foldBinary},
      {"GreaterOrEqual", &OnnxImporter::foldBinary},
      {"And", &OnnxImporter::foldBinary},
      {"Or", &OnnxImporter::foldBinary},
      {"Not", &OnnxImporter::foldUnary},
      {"Neg", &OnnxImporter::foldUnary},
      {"Abs", &OnnxImporter::foldUnary},
      {"Sqrt", &OnnxImporter::foldUnary},
      {"Reciprocal", &OnnxImporter::foldUnary},
      {"Floor", &OnnxImporter::foldUnary},
      {"Ceil", &OnnxImporter::foldUnary},
      {"Relu", &OnnxImporter::foldUnary},
      {"Cast", &OnnxImporter::foldCast},
      {"Where", &OnnxImporter::foldWhere},
      {"Gather", &OnnxImporter::foldGather},
      {"Concat", &OnnxImporter::foldConcat},
      {"Unsqueeze", &OnnxImporter::foldUnsqueeze},
      {"Squeeze", &OnnxImporter::foldSqueeze},
      {"Reshape", &OnnxImporter::foldReshape},
      {"Flatten", &OnnxImporter::foldFlatten},
      {"Expand", &OnnxImporter::foldExpand},
      {"Transpose", &OnnxImporter::foldTranspose},
      {"Slice", &OnnxImporter::foldSlice},
      {"Range", &OnnxImporter::foldRange},
      {"Identity", &OnnxImporter::foldIdentity},
  };
  return table;
}

const OpRule *findRule(const onnx::NodeProto &node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx")
    return nullptr;
  for (const OpRule &rule : opRules())
    if (node.op_type() == rule.opType)
      return &rule;
  return nullptr;
}

bool isDefaultDomain(const std::string &domain) {
  return domain.empty() || domain == "ai.onnx";
}

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

std::string OnnxImporter::nodeLabel(const onnx::NodeProto &node) const {
  std::string name = node.name().empty()
                         ? "#" + std::to_string(currentNodeIndex) + " (unnamed)"
                         : "'" + node.name() + "'";
  return path + ": node " + name + " (" + node.op_type() + ")";
}

void OnnxImporter::fail(const onnx::NodeProto &node, const std::string &reason) {
  errors.push_back(nodeLabel(node) + ": " + reason);
  throw ImportAborted{};
}

void OnnxImporter::failFile(const std::string &reason) {
  errors.push_back(path + ": " + reason);
  throw ImportAborted{};
}

bool OnnxImporter::loadModel() {
  std::error_code error;
  if (!fs::exists(path, error))
    failFile("no such file");
  if (fs::is_directory(path, error))
    failFile("is a directory, not an ONNX model");
  modelDirectory = fs::absolute(path).parent_path();
  bool text = llvm::StringRef(path).ends_with(".onnxtext");
  // A regular file of bounded size, opened without blocking: a FIFO, a device
  // such as /dev/zero or an oversized file is refused before anything is read.
  std::string bytes;
  try {
    bytes = pipec::io::readInputFile(path, text ? "ONNX text model" : "ONNX model",
                                     text ? pipec::io::kMaxTextFileBytes
                                          : pipec::io::kMaxModelFileBytes);
  } catch (const pipec::io::InputError &problem) {
    errors.push_back(problem.what());
    throw ImportAborted{};
  }
  if (text) {
    onnx::OnnxParser parser(bytes.c_str());
    auto status = parser.Parse(model);
    if (!status.IsOK())
      failFile("is not valid ONNX text format: " + status.ErrorMessage());
  } else if (bytes.empty() || !model.ParseFromString(bytes)) {
    failFile(bytes.empty() ? "is empty, not an ONNX model"
                           : "is not a valid ONNX protobuf (truncated or corrupt file?)");
  }
  if (!model.has_graph() || model.graph().node_size() == 0)
    failFile("holds no graph (is it an ONNX model?)");
  return true;
}

bool OnnxImporter::checkOpsets() {
  bool found = false;
  for (const auto &entry : model.opset_import()) {
    if (!isDefaultDomain(entry.domain()))
      continue;
    found = true;
    opset = entry.version();
  }
  if (!found)
    failFile("imports no opset of the default ONNX domain");
  if (opset < kMinOpset || opset > kMaxOpset)
    failFile("uses opset " + std::to_string(opset) +
             " of the default ONNX domain, which pipec does not know; pipec supports "
             "opsets up to " + std::to_string(kMaxOpset) +
             " (re-export the model with an opset in that range)");
  return true;
}

/// Decides, before translating anything, which initializers are trained
/// parameters, which are buffers (BatchNormalization statistics) and which
/// values are known at import time; then lists every unsupported node.
bool OnnxImporter::analyzeGraph() {
  const onnx::GraphProto &graph = model.graph();
  for (const auto &tensor : graph.initializer())
    initializers[tensor.name()] = &tensor;
  for (const auto &node : graph.node())
    for (const auto &input : node.input())
      if (!input.empty())
        ++useCounts[input];
  for (const auto &output : graph.output())
    ++useCounts[output.name()];

  // Gradient flow, from the graph outputs backwards through differentiable inputs.
  std::set<std::string> carriesGradient;
  for (const auto &output : graph.output())
    carriesGradient.insert(output.name());
  for (int i = graph.node_size() - 1; i >= 0; --i) {
    const auto &node = graph.node(i);
    bool needed = llvm::any_of(node.output(), [&](const std::string &name) {
      return carriesGradient.count(name) > 0;
    });
    if (!needed)
      continue;
    const OpRule *rule = findRule(node);
    for (int index = 0; index < node.input_size(); ++index) {
      bool differentiable = !rule || llvm::is_contained(rule->differentiableInputs, index);
      if (differentiable && !node.input(index).empty())
        carriesGradient.insert(node.input(index));
    }
  }
  for (const auto &node : graph.node())
    if (node.op_type() == "BatchNormalization" && isDefaultDomain(node.domain()))
      for (int index : {3, 4})
        if (index < node.input_size() && initializers.count(node.input(index)))
          bufferNames.insert(node.input(index));
  for (const auto &tensor : graph.initializer()) {
    auto kind = elementKindOf(tensor.data_type());
    bool floating = kind && isFloating(*kind);
    // A scalar is a constant (eps, scale factors), never a trained weight.
    bool scalar = tensor.dims_size() == 0;
    if (floating && !scalar && carriesGradient.count(tensor.name()) &&
        !bufferNames.count(tensor.name()))
      parameterNames.insert(tensor.name());
  }
  for (const auto &tensor : graph.initializer())
    if (!parameterNames.count(tensor.name()) && !bufferNames.count(tensor.name()))
      knownAtImport.insert(tensor.name());

  // Values known at import time, and the nodes nothing can translate.
  std::vector<std::string> unsupported;
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto &node = graph.node(i);
    currentNodeIndex = i;
    bool foldable = isDefaultDomain(node.domain()) && folders().count(node.op_type()) &&
                    (node.op_type() == "Shape" ||
                     llvm::all_of(node.input(), [&](const std::string &name) {
                       return name.empty() || knownAtImport.count(name) > 0;
                     }));
    if (foldable) {
      for (const auto &output : node.output())
        knownAtImport.insert(output);
      continue;
    }
    if (isDefaultDomain(node.domain()) && operatorVersions().count(node.op_type())) {
      int64_t version = resolvedVersion(node.op_type(), opset);
      int64_t oldest = operatorVersions().at(node.op_type()).oldestSupported;
      if (version < oldest) {
        unsupported.push_back(
            "node '" + (node.name().empty() ? "#" + std::to_string(i) : node.name()) + "' (" +
            node.op_type() +
            (version == 0 ? " does not exist at opset " + std::to_string(opset)
                          : " version " + std::to_string(version) + " of opset " +
                                std::to_string(opset) + "; pipec translates version " +
                                std::to_string(oldest) + " and newer") +
            ")");
        continue;
      }
    }
    bool hasSubgraph = llvm::any_of(node.attribute(), [](const onnx::AttributeProto &a) {
      return a.has_g() || a.graphs_size() > 0;
    });
    if (!findRule(node) || hasSubgraph) {
      std::string domain = isDefaultDomain(node.domain()) ? "" : node.domain() + "::";
      std::string reason = folders().count(node.op_type()) && isDefaultDomain(node.domain())
                               ? " (only supported when its inputs are known at import time)"
                               : "";
      unsupported.push_back("node '" + (node.name().empty() ? "#" + std::to_string(i)
                                                            : node.name()) +
                            "' (" + domain + node.op_type() + ")" + reason);
    }
  }
  if (!unsupported.empty()) {
    std::string message = path + ": " + std::to_string(unsupported.size()) +
                          " unsupported operator node(s) (opset " + std::to_string(opset) +
                          "): ";
    for (size_t i = 0; i < unsupported.size(); ++i)
      message += (i ? "; " : "") + unsupported[i];
    message += ". pipec translates: ";
    auto supported = supportedOnnxOps();
    for (size_t i = 0; i < supported.size(); ++i)
      message += (i ? ", " : "") + supported[i];
    message += " (and folds shape computations known at import time).";
    errors.push_back(message);
    throw ImportAborted{};
  }
  return true;
}

bool OnnxImporter::resolveInputTypes() {
  std::vector<std::string> problems;
  std::set<std::string> graphInputs;
  for (const auto &input : model.graph().input()) {
    if (initializers.count(input.name()))
      continue; // older exporters list initializers as inputs too
    graphInputs.insert(input.name());
    const auto &type = input.type();
    if (!type.has_tensor_type()) {
      problems.push_back("input '" + input.name() + "' is not a tensor");
      continue;
    }
    auto kind = elementKindOf(type.tensor_type().elem_type());
    if (!kind) {
      problems.push_back("input '" + input.name() + "' has an unsupported element type (" +
                         std::to_string(type.tensor_type().elem_type()) + ")");
      continue;
    }
    auto given = options.inputShapes.find(input.name());
    std::vector<int64_t> shape;
    if (!type.tensor_type().has_shape() && given == options.inputShapes.end()) {
      problems.push_back("input '" + input.name() +
                         "' has no shape; give one with --input-shape " + input.name() +
                         "=d0,d1,...");
      continue;
    }
    const auto &dims = type.tensor_type().shape().dim();
    if (given != options.inputShapes.end()) {
      shape = given->second;
      if (type.tensor_type().has_shape() && dims.size() != static_cast<int>(shape.size())) {
        problems.push_back("--input-shape gives rank " + std::to_string(shape.size()) +
                           " for input '" + input.name() + "' of rank " +
                           std::to_string(dims.size()));
        continue;
      }
      for (int d = 0; d < dims.size() && type.tensor_type().has_shape(); ++d)
        if (dims[d].has_dim_value() && dims[d].dim_value() != shape[d])
          problems.push_back("--input-shape sets dimension " + std::to_string(d) +
                             " of input '" + input.name() + "' to " +
                             std::to_string(shape[d]) + " but the model fixes it to " +
                             std::to_string(dims[d].dim_value()));
    } else {
      std::vector<std::string> symbolic;
      for (int d = 0; d < dims.size(); ++d) {
        if (dims[d].has_dim_value() && dims[d].dim_value() >= 0)
          shape.push_back(dims[d].dim_value());
        else
          symbolic.push_back(dims[d].has_dim_param() ? "'" + dims[d].dim_param() + "'"
                                                     : "dimension " + std::to_string(d));
      }
      if (!symbolic.empty()) {
        std::string list;
        for (size_t i = 0; i < symbolic.size(); ++i)
          list += (i ? ", " : "") + symbolic[i];
        problems.push_back("input '" + input.name() + "' has dynamic dimensions (" + list +
                           "); give static ones with --input-shape " + input.name() +
                           "=d0,d1,...");
        continue;
      }
    }
    inputTypes[input.name()] =
        RankedTensorType::get(shape, mlirElementType(context, *kind));
  }
  for (const auto &[name, shape] : options.inputShapes)
    if (!graphInputs.count(name))
      problems.push_back("--input-shape names '" + name + "', which is not an input of the "
                         "model");
  if (!problems.empty()) {
    for (const auto &problem : problems)
      errors.push_back(path + ": " + problem);
    throw ImportAborted{};
  }
  return true;
}

std::string OnnxImporter::readExternalData(const onnx::TensorProto &tensor,
                                           const std::string &what, uint64_t expectedBytes,
                                           bool read) {
  std::string location;
  std::optional<uint64_t> offset, length;
  for (const auto &entry : tensor.external_data()) {
    std::optional<uint64_t> *field = entry.key() == "offset" ? &offset
                                     : entry.key() == "length" ? &length
                                                               : nullptr;
    if (entry.key() == "location") {
      if (!location.empty())
        failFile(what + " names its external data location twice");
      location = entry.value();
    } else if (field) {
      // A non-negative decimal integer that fits int64 (ONNX stores it as text).
      const std::string &text = entry.value();
      bool digits = !text.empty() && text.size() <= 19 &&
                    llvm::all_of(text, [](char c) { return c >= '0' && c <= '9'; });
      unsigned long long value = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
      if (!digits || value > static_cast<unsigned long long>(INT64_MAX))
        failFile(what + " has external data " + entry.key() + " '" + text +
                 "', which is not a non-negative 64-bit integer");
      if (*field)
        failFile(what + " gives its external data " + entry.key() + " twice");
      *field = value;
    }
  }
  if (location.empty())
    failFile(what + " is stored externally but names no location");
  fs::path relative(location);
  bool escapes = relative.is_absolute() ||
                 llvm::any_of(relative, [](const fs::path &part) { return part == ".."; });
  fs::path full = modelDirectory / relative;
  std::error_code error;
  if (!escapes && fs::exists(full, error)) {
    // Links must not lead out of the model's folder either.
    fs::path real = fs::canonical(full, error);
    fs::path root = fs::canonical(modelDirectory, error);
    auto mismatch = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
    escapes = mismatch.first != root.end();
  }
  if (escapes)
    failFile(what + " refers to external data '" + location +
             "' outside the model's folder; only files in or below " +
             modelDirectory.string() + " are read");
  if (!fs::exists(full, error))
    failFile(what + " refers to external data file '" + location + "', which is missing");
  // A regular file only (a FIFO would block, a device never ends), opened
  // without blocking; offset and length checked without overflow.
  std::optional<pipec::io::InputFile> file;
  try {
    file.emplace(full.string(), "external data file", pipec::io::kMaxTensorFileBytes);
  } catch (const pipec::io::InputError &problem) {
    failFile(what + " refers to external data file '" + location + "': " + problem.what());
  }
  uint64_t size = file->size();
  uint64_t start = offset.value_or(0);
  auto describe = [&] {
    return what + " expects " + std::to_string(expectedBytes) + " bytes of external data at offset " +
           std::to_string(start) + " of '" + location + "' (" + std::to_string(size) + " bytes)";
  };
  if (start > size)
    failFile(describe() + ", but the offset lies past the end of the file");
  if (length && *length != expectedBytes)
    failFile(describe() + ", but its external data length is " + std::to_string(*length));
  // Without a length the data runs to the end of the file (as ONNX reads it).
  if (!length && size - start != expectedBytes)
    failFile(describe() + ", but it gives no length and the file holds " +
             std::to_string(size - start) + " bytes from that offset");
  if (!pipec::io::rangeWithin(start, expectedBytes, size))
    failFile(describe() + ", but the file ends " +
             std::to_string(expectedBytes - (size - start)) + " bytes short of that");
  if (!read)
    return {};
  std::string bytes(static_cast<size_t>(expectedBytes), '\0');
  try {
    file->readAt(start, bytes.data(), expectedBytes, "external data");
  } catch (const pipec::io::InputError &problem) {
    failFile(what + ": " + problem.what());
  }
  return bytes;
}

int64_t OnnxImporter::checkTensorData(const onnx::TensorProto &tensor, const std::string &what) {
  auto kind = elementKindOf(tensor.data_type());
  if (!kind)
    failFile(what + " has an unsupported element type (" + std::to_string(tensor.data_type()) +
             ")");
  std::vector<int64_t> dims(tensor.dims().begin(), tensor.dims().end());
  for (int64_t dim : dims)
    if (dim < 0)
      failFile(what + " has a negative dimension (shape [" + join(dims) + "])");
  auto count = pipec::io::checkedElementCount(dims);
  auto bytes = count ? pipec::io::checkedMul<int64_t>(*count, byteWidth(*kind)) : std::nullopt;
  if (!bytes)
    failFile(what + " has the shape [" + join(dims) + "], whose size overflows 64 bits");
  if (tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL) {
    (void)readExternalData(tensor, what, static_cast<uint64_t>(*bytes), /*read=*/false);
    return *count;
  }
  if (tensor.has_raw_data()) {
    int64_t stored = static_cast<int64_t>(tensor.raw_data().size());
    if (stored != *bytes)
      failFile(what + " holds " + std::to_string(stored) + " bytes of data for " +
               std::to_string(*count) + " elements (" + std::to_string(*bytes) + " expected)");
    return *count;
  }
  // Typed fields: each element type has its own (float16 and the small
  // integers travel in int32_data).
  int64_t fields = 0;
  const char *field = "int32_data";
  switch (*kind) {
  case ElementKind::Float32: fields = tensor.float_data_size(); field = "float_data"; break;
  case ElementKind::Float64: fields = tensor.double_data_size(); field = "double_data"; break;
  case ElementKind::Int64: fields = tensor.int64_data_size(); field = "int64_data"; break;
  default: fields = tensor.int32_data_size(); break;
  }
  if (fields != *count)
    failFile(what + " holds " + std::to_string(fields) + " values in " + field + " for " +
             std::to_string(*count) + " elements of shape [" + join(dims) + "]");
  return *count;
}

HostTensor OnnxImporter::readTensor(const onnx::TensorProto &tensor, const std::string &what) {
  int64_t count = checkTensorData(tensor, what);
  ElementKind kind = *elementKindOf(tensor.data_type());
  std::vector<int64_t> shape(tensor.dims().begin(), tensor.dims().end());
  std::string external;
  bool isExternal = tensor.data_location() == onnx::TensorProto_DataLocation_EXTERNAL;
  bool fromBytes = tensor.has_raw_data() || isExternal;
  if (isExternal)
    external = readExternalData(tensor, what, static_cast<uint64_t>(count * byteWidth(kind)),
                                /*read=*/true);
  const std::string &raw = isExternal ? external : tensor.raw_data();
  HostTensor out;
  out.kind = kind;
  out.shape = shape;
  if (isFloating(kind))
    out.floats.reserve(count);
  else
    out.ints.reserve(count);
  auto rawAt = [&](int64_t i, auto sample) {
    decltype(sample) value;
    std::memcpy(&value, raw.data() + i * sizeof(value), sizeof(value));
    return value;
  };
  for (int64_t i = 0; i < count; ++i) {
    switch (kind) {
    case ElementKind::Float32:
      out.floats.push_back(fromBytes ? rawAt(i, float()) : tensor.float_data(i));
      break;
    case ElementKind::Float64:
      out.floats.push_back(fromBytes ? rawAt(i, double()) : tensor.double_data(i));
      break;
    case ElementKind::Float16:
    case ElementKind::BFloat16: {
      uint16_t bits = fromBytes ? rawAt(i, uint16_t()) : tensor.int32_data(i);
      out.floats.push_back(halfBitsToFloat(bits, kind == ElementKind::BFloat16));
      break;
    }
    case ElementKind::Int64:
      out.ints.push_back(fromBytes ? rawAt(i, int64_t()) : tensor.int64_data(i));
      break;
    case ElementKind::Int32:
      out.ints.push_back(fromBytes ? rawAt(i, int32_t()) : tensor.int32_data(i));
      break;
    case ElementKind::Int8:
      out.ints.push_back(fromBytes ? rawAt(i, int8_t()) : tensor.int32_data(i));
      break;
    case ElementKind::UInt8:
    case ElementKind::Bool:
      out.ints.push_back(fromBytes ? rawAt(i, uint8_t()) : tensor.int32_data(i));
      break;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Operands, results, attributes
//===----------------------------------------------------------------------===//

Location OnnxImporter::locationOf(const onnx::NodeProto &node) {
  std::string name = node.name().empty() ? node.op_type() + "#" + std::to_string(currentNodeIndex)
                                         : node.name();
  return NameLoc::get(builder.getStringAttr(name),
                      FileLineColLoc::get(&context, path, currentNodeIndex + 1, 0));
}

bool OnnxImporter::hasInput(const onnx::NodeProto &node, int index) const {
  return index < node.input_size() && !node.input(index).empty();
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

Value OnnxImporter::materialize(const HostTensor &tensor, Location loc) {
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

const onnx::AttributeProto *OnnxImporter::attribute(const onnx::NodeProto &node,
                                                    const char *name) const {
  for (const auto &attr : node.attribute())
    if (attr.name() == name)
      return &attr;
  return nullptr;
}

int64_t OnnxImporter::intAttr(const onnx::NodeProto &node, const char *name,
                              int64_t fallback) const {
  const auto *attr = attribute(node, name);
  return attr ? attr->i() : fallback;
}

float OnnxImporter::floatAttr(const onnx::NodeProto &node, const char *name,
                              float fallback) const {
  const auto *attr = attribute(node, name);
  return attr ? attr->f() : fallback;
}

std::string OnnxImporter::stringAttr(const onnx::NodeProto &node, const char *name,
                                     const std::string &fallback) const {
  const auto *attr = attribute(node, name);
  return attr ? attr->s() : fallback;
}

std::optional<std::vector<int64_t>> OnnxImporter::intsAttr(const onnx::NodeProto &node,
                                                           const char *name) const {
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

template <typename OpT>
Operation *OnnxImporter::createInferred(const onnx::NodeProto &node, ValueRange operands,
                                        ArrayRef<NamedAttribute> attributes) {
  Location loc = locationOf(node);
  DictionaryAttr dictionary = builder.getDictionaryAttr(attributes);
  typename OpT::Properties properties;
  capturedDiagnostics.clear();
  if (failed(OpT::setPropertiesFromAttr(properties, dictionary,
                                        [&] { return mlir::emitError(loc); })))
    fail(node, "invalid attributes: " + capturedDiagnostics);
  SmallVector<Type> types;
  if (failed(OpT::inferReturnTypes(&context, loc, operands, dictionary,
                                   OpaqueProperties(&properties), {}, types)))
    fail(node, capturedDiagnostics.empty() ? "invalid operands" : capturedDiagnostics);
  return createVerified(node, OpT::getOperationName(), operands, types, attributes);
}

Operation *OnnxImporter::createVerified(const onnx::NodeProto &node, StringRef name,
                                        ValueRange operands, TypeRange types,
                                        ArrayRef<NamedAttribute> attributes) {
  OperationState state(locationOf(node), name, operands, types, attributes);
  Operation *op = builder.create(state);
  verifyCreated(node, op);
  return op;
}

void OnnxImporter::verifyCreated(const onnx::NodeProto &node, Operation *op) {
  capturedDiagnostics.clear();
  if (failed(mlir::verify(op)))
    fail(node, capturedDiagnostics);
}

//===----------------------------------------------------------------------===//
// Converters
//===----------------------------------------------------------------------===//

template <typename OpT> void OnnxImporter::convertBinary(const onnx::NodeProto &node) {
  Value lhs = operand(node, 0), rhs = operand(node, 1);
  // ONNX allows Pow's exponent (and constant operands of exporters) in another
  // type; a constant operand is converted so that both sides agree.
  Type lhsElement = typeOf(lhs).getElementType(), rhsElement = typeOf(rhs).getElementType();
  if (lhsElement != rhsElement) {
    auto convertConstant = [&](int index, Type to) -> std::optional<Value> {
      auto it = constants.find(node.input(index));
      auto kind = pipec::import::elementKindOf(to); // the public overload (Type)
      if (it == constants.end() || !kind)
        return std::nullopt;
      return materialize(fold::cast(it->second, *kind), locationOf(node));
    };
    if (auto converted = convertConstant(1, lhsElement))
      rhs = *converted;
    else if (auto converted = convertConstant(0, rhsElement))
      lhs = *converted;
    else if (node.op_type() == "Pow" && llvm::isa<FloatType>(lhsElement))
      // Pow(float, integer): the exponent converts exactly enough to float.
      rhs = createVerified(node, nn::CastOp::getOperationName(), {rhs},
                           {RankedTensorType::get(typeOf(rhs).getShape(), lhsElement)}, {})
                ->getResult(0);
  }
  defineResults(node, createInferred<OpT>(node, {lhs, rhs}, {}), 1);
}

template <typename OpT> void OnnxImporter::convertUnary(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  defineResults(node, createVerified(node, OpT::getOperationName(), {input},
                                     {input.getType()}, {}),
                1);
}

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
  defineResults(node,
                createInferred<nn::WhereOp>(
                    node, {operand(node, 0), operand(node, 1), operand(node, 2)}, {}),
                1);
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
  defineResults(node, createInferred<nn::GemmOp>(node, operands, attributes), 1);
}

void OnnxImporter::convertMatMul(const onnx::NodeProto &node) {
  defineResults(node, createInferred<nn::MatMulOp>(node, {operand(node, 0), operand(node, 1)}, {}),
                1);
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
  defineResults(node, createInferred<nn::ConvOp>(node, operands, attributes), 1);
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
  defineResults(node, createInferred<nn::BatchNormOp>(node, operands, attributes), 3);
}

void OnnxImporter::convertLayerNorm(const onnx::NodeProto &node) {
  SmallVector<Value> operands{operand(node, 0), operand(node, 1)};
  if (hasInput(node, 2))
    operands.push_back(operand(node, 2));
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", -1))),
      builder.getNamedAttr("epsilon", builder.getF32FloatAttr(floatAttr(node, "epsilon", 1e-5f)))};
  defineResults(node, createInferred<nn::LayerNormOp>(node, operands, attributes), 3);
}

void OnnxImporter::convertMaxPool(const onnx::NodeProto &node) {
  rejectUsedOutputs(node, 1, "indices");
  if (intAttr(node, "storage_order", 0) != 0)
    fail(node, "storage_order=1 is not supported");
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
  windowAttributes(node, inputShape.size() - 2, inputShape, *kernel, attributes, true);
  defineResults(node, createInferred<nn::MaxPoolOp>(node, {input}, attributes), 1);
}

void OnnxImporter::convertAveragePool(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto inputShape = typeOf(input).getShape();
  if (inputShape.size() < 3)
    fail(node, "input must be (N,C,spatial...)");
  auto kernel = intsAttr(node, "kernel_shape");
  if (!kernel)
    fail(node, "kernel_shape is required");
  SmallVector<NamedAttribute> attributes{
      builder.getNamedAttr("kernel_shape", builder.getDenseI64ArrayAttr(*kernel)),
      builder.getNamedAttr("ceil_mode", builder.getBoolAttr(intAttr(node, "ceil_mode", 0) != 0)),
      builder.getNamedAttr("count_include_pad",
                           builder.getBoolAttr(intAttr(node, "count_include_pad", 0) != 0))};
  windowAttributes(node, inputShape.size() - 2, inputShape, *kernel, attributes, false);
  defineResults(node, createInferred<nn::AveragePoolOp>(node, {input}, attributes), 1);
}

void OnnxImporter::convertGlobalAveragePool(const onnx::NodeProto &node) {
  defineResults(node, createInferred<nn::GlobalAveragePoolOp>(node, {operand(node, 0)}, {}), 1);
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
  defineResults(node, createInferred<nn::DropoutOp>(node, {operand(node, 0)}, attributes), 2);
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
  defineResults(node,
                createInferred<nn::SoftmaxOp>(
                    node, {operand(node, 0)},
                    {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", -1)))}),
                1);
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
  defineResults(node, createInferred<nn::SoftmaxCrossEntropyLossOp>(node, operands, attributes),
                2);
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
  defineResults(node,
                createInferred<nn::ReduceMeanOp>(
                    node, {input},
                    {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes)),
                     builder.getNamedAttr("keepdims",
                                          builder.getBoolAttr(intAttr(node, "keepdims", 1) != 0))}),
                1);
}

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
  defineResults(node,
                createInferred<nn::GatherOp>(
                    node, {data, indices},
                    {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))}),
                1);
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
  defineResults(node,
                createInferred<nn::FlattenOp>(
                    node, {operand(node, 0)},
                    {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", 1)))}),
                1);
}


void OnnxImporter::convertUnsqueeze(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto given = squeezeAxes(node);
  if (!given)
    fail(node, "axes are required");
  std::vector<int64_t> axes = *given;
  int64_t outRank = typeOf(input).getRank() + static_cast<int64_t>(axes.size());
  axes = normalizedAxes(node, axes, outRank);
  defineResults(node,
                createInferred<nn::UnsqueezeOp>(
                    node, {input}, {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes))}),
                1);
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
  defineResults(node,
                createInferred<nn::SqueezeOp>(
                    node, {input}, {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes))}),
                1);
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
  auto type = RankedTensorType::get(shape, typeOf(input).getElementType());
  if (type == input.getType()) {
    define(node, 0, input);
    return;
  }
  defineResults(node, createVerified(node, nn::ExpandOp::getOperationName(), {input}, {type}, {}),
                1);
}

void OnnxImporter::convertTranspose(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  int64_t rank = typeOf(input).getRank();
  std::vector<int64_t> perm;
  if (auto given = intsAttr(node, "perm")) {
    perm = normalizedAxes(node, *given, rank, /*sortAndCheckUnique=*/false);
  } else {
    for (int64_t axis = rank - 1; axis >= 0; --axis)
      perm.push_back(axis);
  }
  defineResults(node,
                createInferred<nn::TransposeOp>(
                    node, {input}, {builder.getNamedAttr("perm", builder.getDenseI64ArrayAttr(perm))}),
                1);
}

void OnnxImporter::convertConcat(const onnx::NodeProto &node) {
  SmallVector<Value> inputs;
  for (int i = 0; i < node.input_size(); ++i)
    inputs.push_back(operand(node, i));
  if (!attribute(node, "axis"))
    fail(node, "axis is required");
  defineResults(node,
                createInferred<nn::ConcatOp>(
                    node, inputs,
                    {builder.getNamedAttr("axis", builder.getI64IntegerAttr(intAttr(node, "axis", 0)))}),
                1);
}

void OnnxImporter::convertPad(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  int64_t rank = typeOf(input).getRank();
  std::string mode = stringAttr(node, "mode", "constant");
  if (mode != "constant")
    fail(node, "mode '" + mode + "' is not supported (only constant padding)");
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
  defineResults(node,
                createInferred<nn::PadOp>(
                    node, {input},
                    {builder.getNamedAttr("pads", builder.getDenseI64ArrayAttr(pads)),
                     builder.getNamedAttr("value", builder.getF64FloatAttr(value))}),
                1);
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
  Operation *op = createInferred<nn::SplitOp>(
      node, {input},
      {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis)),
       builder.getNamedAttr("sizes", builder.getDenseI64ArrayAttr(sizes))});
  defineResults(node, op, sizes.size());
}

void OnnxImporter::convertSlice(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
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
  std::vector<int64_t> allStarts(rank, 0), allEnds(shape.begin(), shape.end()), allSteps(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] == 0)
      fail(node, "step 0 on axis " + std::to_string(axes[i]));
    auto [start, end] = normalizeSliceBounds(starts[i], ends[i], steps[i], shape[axes[i]]);
    allStarts[axes[i]] = start;
    allEnds[axes[i]] = end;
    allSteps[axes[i]] = steps[i];
  }
  defineResults(node,
                createInferred<nn::SliceOp>(
                    node, {input},
                    {builder.getNamedAttr("starts", builder.getDenseI64ArrayAttr(allStarts)),
                     builder.getNamedAttr("ends", builder.getDenseI64ArrayAttr(allEnds)),
                     builder.getNamedAttr("steps", builder.getDenseI64ArrayAttr(allSteps))}),
                1);
}

void OnnxImporter::convertIdentity(const onnx::NodeProto &node) {
  define(node, 0, operand(node, 0));
}

//===----------------------------------------------------------------------===//
// Folders
//===----------------------------------------------------------------------===//

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
  auto given = squeezeAxes(node);
  if (!given)
    fail(node, "axes are required");
  std::vector<int64_t> axes = *given;
  int64_t outRank = input.shape.size() + axes.size();
  axes = normalizedAxes(node, axes, outRank);
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
  int64_t rank = input.shape.size();
  std::vector<int64_t> perm;
  if (auto given = intsAttr(node, "perm"))
    perm = normalizedAxes(node, *given, rank, false);
  else
    for (int64_t d = rank - 1; d >= 0; --d)
      perm.push_back(d);
  return {fold::transpose(input, perm)};
}

std::vector<HostTensor> OnnxImporter::foldSlice(const onnx::NodeProto &node) {
  const HostTensor &input = constantInput(node, 0, "data");
  int64_t rank = input.shape.size();
  std::vector<int64_t> starts = constantInput(node, 1, "starts").toInts();
  std::vector<int64_t> ends = constantInput(node, 2, "ends").toInts();
  std::vector<int64_t> axes, steps(starts.size(), 1);
  if (auto given = optionalConstantInput(node, 3, "axes"))
    axes = normalizedAxes(node, given->toInts(), rank, false);
  else
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  if (auto given = optionalConstantInput(node, 4, "steps"))
    steps = given->toInts();
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(node, "starts, ends, axes and steps differ in length");
  std::vector<int64_t> allStarts(rank, 0), allEnds(input.shape), allSteps(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (steps[i] == 0)
      fail(node, "step 0");
    auto [start, end] = normalizeSliceBounds(starts[i], ends[i], steps[i], input.shape[axes[i]]);
    allStarts[axes[i]] = start;
    allEnds[axes[i]] = end;
    allSteps[axes[i]] = steps[i];
  }
  return {fold::slice(input, allStarts, allEnds, allSteps)};
}

std::vector<HostTensor> OnnxImporter::foldRange(const onnx::NodeProto &node) {
  return {fold::range(constantInput(node, 0, "start"), constantInput(node, 1, "limit"),
                      constantInput(node, 2, "delta"))};
}

std::vector<HostTensor> OnnxImporter::foldIdentity(const onnx::NodeProto &node) {
  return {constantInput(node, 0, "input")};
}

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

/// Compares our static types with those ONNX's shape inference found; a
/// disagreement means a translation bug or an inconsistent model.
void OnnxImporter::crossCheckShapeInference() {
  // A copy for ONNX to annotate, without the data of trained parameters and
  // buffers (only their types matter to shape inference): the weights are
  // not duplicated in memory.
  onnx::ModelProto inferred;
  {
    google::protobuf::RepeatedPtrField<onnx::TensorProto> initializerList;
    initializerList.Swap(model.mutable_graph()->mutable_initializer());
    inferred = model;
    initializerList.Swap(model.mutable_graph()->mutable_initializer());
  }
  for (const auto &tensor : model.graph().initializer()) {
    onnx::TensorProto *copy = inferred.mutable_graph()->add_initializer();
    if (knownAtImport.count(tensor.name())) {
      *copy = tensor;
    } else {
      copy->set_name(tensor.name());
      copy->set_data_type(tensor.data_type());
      *copy->mutable_dims() = tensor.dims();
    }
  }
  try {
    onnx::ShapeInferenceOptions inferenceOptions{/*check_type=*/false, /*error_mode=*/0,
                                                 /*enable_data_propagation=*/false};
    onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                       inferenceOptions);
  } catch (const std::exception &) {
    return; // ONNX could not infer; our own inference stands alone
  }
  for (const auto &info : inferred.graph().value_info()) {
    auto it = values.find(info.name());
    if (it == values.end() || !info.type().has_tensor_type() ||
        !info.type().tensor_type().has_shape())
      continue;
    std::vector<int64_t> theirs;
    bool isStatic = true;
    for (const auto &dim : info.type().tensor_type().shape().dim()) {
      isStatic &= dim.has_dim_value();
      theirs.push_back(dim.dim_value());
    }
    auto ours = typeOf(it->second).getShape();
    if (isStatic && ArrayRef<int64_t>(theirs) != ours)
      errors.push_back(path + ": value '" + info.name() + "' has shape [" +
                       join(std::vector<int64_t>(ours.begin(), ours.end())) +
                       "] here but ONNX shape inference says [" + join(theirs) + "]");
  }
}

bool OnnxImporter::readInitializers(std::map<std::string, HostTensor> &values) {
  try {
    loadModel();
    for (const auto &tensor : model.graph().initializer())
      values[tensor.name()] = readTensor(tensor, "initializer '" + tensor.name() + "'");
    return true;
  } catch (const ImportAborted &) {
    return false;
  }
}

OwningOpRef<ModuleOp> OnnxImporter::run() {
  context.loadDialect<nn::NNDialect, func::FuncDialect>();
  ScopedDiagnosticHandler capture(&context, [&](Diagnostic &diagnostic) {
    if (!capturedDiagnostics.empty())
      capturedDiagnostics += "; ";
    capturedDiagnostics += diagnostic.str();
    return success();
  });
  try {
    loadModel();
    checkOpsets();
    if (!validateModel(model, path, opset, options.inputShapes, errors))
      throw ImportAborted{};
    analyzeGraph();
    resolveInputTypes();
    const onnx::GraphProto &graph = model.graph();

    // Initializers: trained parameters and buffers become arguments, the
    // rest are constants for folding.
    for (const auto &tensor : graph.initializer()) {
      std::string what = "initializer '" + tensor.name() + "'";
      if (knownAtImport.count(tensor.name()))
        constants[tensor.name()] = readTensor(tensor, what);
      else
        checkTensorData(tensor, what);
    }

    auto fileLoc = FileLineColLoc::get(&context, path, 0, 0);
    OwningOpRef<ModuleOp> module = ModuleOp::create(fileLoc);
    module->getOperation()->setAttr("nn.source", builder.getStringAttr(path));
    module->getOperation()->setAttr("nn.opset", builder.getI64IntegerAttr(opset));
    if (!model.producer_name().empty())
      module->getOperation()->setAttr(
          "nn.producer",
          builder.getStringAttr(model.producer_name() + " " + model.producer_version()));

    SmallVector<Type> argumentTypes;
    SmallVector<std::pair<std::string, const char *>> arguments;
    for (const auto &tensor : graph.initializer()) {
      if (knownAtImport.count(tensor.name()))
        continue;
      std::vector<int64_t> shape(tensor.dims().begin(), tensor.dims().end());
      argumentTypes.push_back(RankedTensorType::get(
          shape, mlirElementType(context, *elementKindOf(tensor.data_type()))));
      arguments.push_back({tensor.name(), bufferNames.count(tensor.name()) ? "buffer" : "param"});
    }
    for (const auto &input : graph.input()) {
      if (initializers.count(input.name()))
        continue;
      argumentTypes.push_back(inputTypes.at(input.name()));
      arguments.push_back({input.name(), "input"});
    }

    builder.setInsertionPointToEnd(module->getBody());
    // All argument attributes at once: setting them one by one rebuilds the
    // whole attribute array each time (quadratic in the parameter count).
    SmallVector<DictionaryAttr> argumentAttributes;
    argumentAttributes.reserve(arguments.size());
    for (const auto &argument : arguments)
      argumentAttributes.push_back(builder.getDictionaryAttr(
          {builder.getNamedAttr("nn.name", builder.getStringAttr(argument.first)),
           builder.getNamedAttr("nn.role", builder.getStringAttr(argument.second))}));
    auto function = func::FuncOp::create(builder, fileLoc, "forward",
                                         builder.getFunctionType(argumentTypes, {}),
                                         ArrayRef<NamedAttribute>{}, argumentAttributes);
    Block *body = function.addEntryBlock();
    for (auto [index, argument] : llvm::enumerate(arguments)) {
      body->getArgument(index).setLoc(
          NameLoc::get(builder.getStringAttr(argument.first), fileLoc));
      values[argument.first] = body->getArgument(index);
    }
    builder.setInsertionPointToEnd(body);

    for (int i = 0; i < graph.node_size(); ++i) {
      const auto &node = graph.node(i);
      currentNodeIndex = i;
      nodeVersion = resolvedVersion(node.op_type(), opset);
      bool folded = node.output_size() > 0 && llvm::all_of(node.output(), [&](const std::string &name) {
        return name.empty() || knownAtImport.count(name) > 0;
      });
      if (folded) {
        std::vector<HostTensor> results;
        try {
          results = (this->*folders().at(node.op_type()))(node);
        } catch (const FoldError &error) {
          fail(node, error.what());
        }
        for (size_t r = 0; r < results.size() && static_cast<int>(r) < node.output_size(); ++r)
          if (!node.output(r).empty())
            constants[node.output(r)] = std::move(results[r]);
        continue;
      }
      (this->*findRule(node)->convert)(node);
      for (const auto &output : node.output())
        if (!output.empty() && !values.count(output) && useCounts[output] > 0)
          fail(node, "output '" + output + "' is used but this translation does not produce it");
    }

    SmallVector<Value> results;
    SmallVector<Type> resultTypes;
    for (const auto &output : graph.output()) {
      auto it = values.find(output.name());
      Value value;
      if (it != values.end()) {
        value = it->second;
      } else if (auto constant = constants.find(output.name()); constant != constants.end()) {
        value = materialize(constant->second, NameLoc::get(builder.getStringAttr(output.name())));
      } else {
        failFile("graph output '" + output.name() + "' is produced by no node");
      }
      results.push_back(value);
      resultTypes.push_back(value.getType());
    }
    func::ReturnOp::create(builder, fileLoc, results);
    function.setFunctionType(builder.getFunctionType(argumentTypes, resultTypes));
    SmallVector<DictionaryAttr> resultAttributes;
    for (const auto &output : graph.output())
      resultAttributes.push_back(builder.getDictionaryAttr(
          {builder.getNamedAttr("nn.name", builder.getStringAttr(output.name()))}));
    function.setAllResultAttrs(resultAttributes);

    crossCheckShapeInference();
    checkInferredModel(model, path, *module, values, constants, errors);
    if (!errors.empty())
      return nullptr;
    capturedDiagnostics.clear();
    if (failed(mlir::verify(*module))) {
      errors.push_back(path + ": the imported module does not verify: " + capturedDiagnostics);
      return nullptr;
    }
    return module;
  } catch (const ImportAborted &) {
    return nullptr;
  } catch (const std::exception &error) {
    errors.push_back(path + ": " + error.what());
    return nullptr;
  }
}

} // namespace

bool parseInputShape(const std::string &text, ImportOptions &options, std::string &error) {
  auto equals = text.find('=');
  if (equals == std::string::npos || equals == 0) {
    error = "--input-shape expects name=d0,d1,..., got '" + text + "'";
    return false;
  }
  std::string name = text.substr(0, equals);
  std::vector<int64_t> dims;
  std::stringstream stream(text.substr(equals + 1));
  std::string item;
  while (std::getline(stream, item, ',')) {
    char *end = nullptr;
    long long value = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value <= 0) {
      error = "--input-shape " + name + ": '" + item + "' is not a positive dimension";
      return false;
    }
    dims.push_back(value);
  }
  options.inputShapes[name] = dims;
  return true;
}

bool readInitializerValues(const std::string &path, std::map<std::string, HostTensor> &values,
                           std::vector<std::string> &errors) {
  MLIRContext context;
  OnnxImporter importer(context, path, ImportOptions(), errors);
  return importer.readInitializers(values);
}

std::vector<std::string> supportedOnnxOps() {
  std::vector<std::string> names;
  for (const OpRule &rule : opRules())
    names.push_back(rule.opType);
  std::sort(names.begin(), names.end());
  return names;
}

OwningOpRef<ModuleOp> importOnnxModel(MLIRContext &context, const std::string &path,
                                      const ImportOptions &options,
                                      std::vector<std::string> &errors) {
  OnnxImporter importer(context, path, options, errors);
  return importer.run();
}

} // namespace pipec::import
