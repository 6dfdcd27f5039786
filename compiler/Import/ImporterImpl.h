// Internal to the ONNX importer: the state one import shares between its
// phases (docs/importer.md), and the helpers its pieces have in common. Each
// responsibility has its own file:
//   OnnxImporter.cpp  the driver and the public entry points;
//   OnnxOps.cpp       the operator table, one row per ONNX operator (which
//                     op is translated or folded, and how; OnnxOps.h);
//   LoadModel.cpp     the file, its protobuf or text, the opset, initializer
//                     data (external data included) and the error path;
//   AnalyzeGraph.cpp  operator versions, trained parameters and buffers,
//                     values known at import time, unsupported nodes, input
//                     types;
//   NodeOperands.cpp  operands, results, attributes and op creation;
//   ConvertNN.cpp     converters of arithmetic and network layers;
//   ConvertShape.cpp  converters that move data (reshape, gather, slice...);
//   ConvertReduction.cpp  reductions, LogSoftmax, ArgMax and Einsum;
//   ConvertRecurrent.cpp  RNN, GRU and LSTM unrolled;
//   FoldShape.cpp     folders of shape sub-graphs on the host.
#ifndef PIPEC_COMPILER_IMPORT_IMPORTERIMPL_H
#define PIPEC_COMPILER_IMPORT_IMPORTERIMPL_H

#include "compiler/Import/HostTensor.h"
#include "compiler/Import/OnnxImporter.h"
#include "compiler/Import/OnnxOps.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace pipec::import::detail {

/// Thrown to abandon the import after the errors have been recorded.
struct ImportAborted {};

// Element types (LoadModel.cpp, NodeOperands.cpp).
std::optional<ElementKind> elementKindOf(int32_t onnxType);
mlir::Type mlirElementType(mlir::MLIRContext &context, ElementKind kind);

std::string join(const std::vector<int64_t> &values, const char *separator = ",");

// Attributes of a node; the fallback (or nullopt / null) when absent.
const onnx::AttributeProto *attribute(const onnx::NodeProto &node, const char *name);
int64_t intAttr(const onnx::NodeProto &node, const char *name, int64_t fallback);
float floatAttr(const onnx::NodeProto &node, const char *name, float fallback);
std::string stringAttr(const onnx::NodeProto &node, const char *name, const std::string &fallback);
std::optional<std::vector<int64_t>> intsAttr(const onnx::NodeProto &node, const char *name);
bool hasInput(const onnx::NodeProto &node, int index);

/// Collects the MLIR diagnostics emitted while it lives, joined by "; ", so
/// that an op or a module that does not build or verify becomes one import
/// error with the verifier's words.
class DiagnosticCapture {
public:
  explicit DiagnosticCapture(mlir::MLIRContext &context);
  const std::string &text() const { return captured; }

private:
  std::string captured;
  mlir::ScopedDiagnosticHandler handler;
};

/// One import: the model, what the analysis decided about it and the values
/// translated so far.
class OnnxImporter {
public:
  OnnxImporter(mlir::MLIRContext &context, std::string path, const ImportOptions &options,
               std::vector<std::string> &errors)
      : context(context), builder(&context), path(std::move(path)), options(options),
        errors(errors) {}

  mlir::OwningOpRef<mlir::ModuleOp> run();
  /// Every initializer's value (readInitializerValues).
  bool readInitializers(std::map<std::string, HostTensor> &values);
  /// Loads the model and names its initializers as run() does, without
  /// translating (InitializerReader); false with errors on bad input.
  bool loadOnly();
  /// One initializer's values in their training kind, in chunks of at most
  /// `chunkElements`; false, with an error recorded, when absent or
  /// unreadable (InitializerReader::readChunks).
  bool readInitializerChunks(const std::string &name, int64_t chunkElements,
                             const std::function<void(const HostTensor &)> &consume);
  /// Whether every graph input leaves its batch dimension free
  /// (batchDimensionIsFree).
  std::optional<bool> batchDimensionIsFree();
  void noteNarrowOrWideFloats();

  // Converters (one per supported ONNX operator).
  template <typename OpT> void convertBinary(const onnx::NodeProto &node);
  template <typename OpT> void convertUnary(const onnx::NodeProto &node);
  void convertWhere(const onnx::NodeProto &node);
  // Element-wise operators lowered into the table's ops (ConvertNN.cpp).
  template <typename OpT> void convertVariadic(const onnx::NodeProto &node);
  void convertMean(const onnx::NodeProto &node);
  void convertNeg(const onnx::NodeProto &node);
  void convertAbs(const onnx::NodeProto &node);
  void convertSign(const onnx::NodeProto &node);
  void convertMod(const onnx::NodeProto &node);
  void convertNot(const onnx::NodeProto &node);
  void convertIsNaN(const onnx::NodeProto &node);
  void convertIsInf(const onnx::NodeProto &node);
  void convertClip(const onnx::NodeProto &node);
  void convertHardSigmoid(const onnx::NodeProto &node);
  void convertHardSwish(const onnx::NodeProto &node);
  void convertLeakyRelu(const onnx::NodeProto &node);
  void convertPRelu(const onnx::NodeProto &node);
  void convertElu(const onnx::NodeProto &node);
  void convertSelu(const onnx::NodeProto &node);
  void convertCelu(const onnx::NodeProto &node);
  void convertMish(const onnx::NodeProto &node);
  void convertThresholdedRelu(const onnx::NodeProto &node);
  void convertCastLike(const onnx::NodeProto &node);
  void convertGelu(const onnx::NodeProto &node);
  void convertCast(const onnx::NodeProto &node);
  void convertGemm(const onnx::NodeProto &node);
  void convertMatMul(const onnx::NodeProto &node);
  /// Conv and ConvTranspose: checks that input and weight are (N, C,
  /// spatial...) of one rank and that kernel_shape agrees; the kernel.
  std::vector<int64_t> convolutionKernel(const onnx::NodeProto &node,
                                         mlir::ArrayRef<int64_t> inputShape,
                                         mlir::ArrayRef<int64_t> weightShape);
  void convertConv(const onnx::NodeProto &node);
  void convertConvTranspose(const onnx::NodeProto &node);
  void convertBatchNorm(const onnx::NodeProto &node);
  void convertLayerNorm(const onnx::NodeProto &node);
  void convertMaxPool(const onnx::NodeProto &node);
  void convertAveragePool(const onnx::NodeProto &node);
  void convertGlobalAveragePool(const onnx::NodeProto &node);
  void convertDropout(const onnx::NodeProto &node);
  void convertSoftmax(const onnx::NodeProto &node);
  void convertSoftmaxCrossEntropyLoss(const onnx::NodeProto &node);
  /// The Reduce* operators (ConvertReduction.cpp).
  void convertReduce(const onnx::NodeProto &node);
  void convertLogSoftmax(const onnx::NodeProto &node);
  /// ArgMax and ArgMin.
  void convertArgMax(const onnx::NodeProto &node);
  void convertEinsum(const onnx::NodeProto &node);
  void convertTopK(const onnx::NodeProto &node);
  /// 0, 1, ... along `axis` of `shape`, as float32 shaped to broadcast.
  mlir::Value positionsAlong(const onnx::NodeProto &node, mlir::ArrayRef<int64_t> shape,
                             int64_t axis);
  /// The first (or last) of `positions` where `x` equals `extreme` (kept axis).
  mlir::Value positionOf(const onnx::NodeProto &node, mlir::Value x, mlir::Value extreme,
                         int64_t axis, mlir::Value positions, bool last);
  /// GroupNormalization and InstanceNormalization (one group per channel).
  void convertGroupNormalization(const onnx::NodeProto &node);
  /// A reduction's axes, normalized (an attribute before `axesInputSince`,
  /// an input from it on; none: all); nullopt for noop_with_empty_axes.
  std::optional<std::vector<int64_t>> reductionAxes(const onnx::NodeProto &node, int64_t rank,
                                                    int64_t axesInputSince);
  /// `value` itself when floating, else cast to float32 (integers compared
  /// or summed there), with an import note when float32 is not exact for
  /// its integer type.
  mlir::Value inFloat32(const onnx::NodeProto &node, mlir::Value value);
  /// The sum (or mean) of `input` over normalized `axes`.
  mlir::Value sumOver(const onnx::NodeProto &node, mlir::Value input, mlir::ArrayRef<int64_t> axes,
                      bool keepdims, bool mean = false);
  /// The maximum (or minimum) of floating `input` over normalized `axes`.
  mlir::Value maxOver(const onnx::NodeProto &node, mlir::Value input, mlir::ArrayRef<int64_t> axes,
                      bool keepdims, bool minimum = false);
  /// log(sum(exp(input))) over normalized `axes`, without overflow.
  mlir::Value logSumExp(const onnx::NodeProto &node, mlir::Value input,
                        mlir::ArrayRef<int64_t> axes, bool keepdims);
  void convertGather(const onnx::NodeProto &node);
  void convertReshape(const onnx::NodeProto &node);
  void convertFlatten(const onnx::NodeProto &node);
  void convertUnsqueeze(const onnx::NodeProto &node);
  void convertSqueeze(const onnx::NodeProto &node);
  void convertExpand(const onnx::NodeProto &node);
  void convertTranspose(const onnx::NodeProto &node);
  void convertConcat(const onnx::NodeProto &node);
  void convertPad(const onnx::NodeProto &node);
  /// DepthToSpace and SpaceToDepth.
  void convertDepthToSpace(const onnx::NodeProto &node);
  void convertSplit(const onnx::NodeProto &node);
  void convertSlice(const onnx::NodeProto &node);
  void convertIdentity(const onnx::NodeProto &node);
  void convertTrilu(const onnx::NodeProto &node);
  void convertCumSum(const onnx::NodeProto &node);
  void convertGatherElements(const onnx::NodeProto &node);
  /// data[..., indices[...], ...] along `axis`: GatherElements' semantics.
  mlir::Value gatherAlongAxis(const onnx::NodeProto &node, mlir::Value data, mlir::Value indices,
                              int64_t axis);
  void convertNegativeLogLikelihoodLoss(const onnx::NodeProto &node);
  /// RNN, GRU and LSTM, unrolled over the sequence (ConvertRecurrent.cpp).
  void convertRecurrent(const onnx::NodeProto &node);
  void convertGatherND(const onnx::NodeProto &node);
  void convertScatter(const onnx::NodeProto &node);
  void convertResize(const onnx::NodeProto &node);
  void convertTile(const onnx::NodeProto &node);
  void convertSplitToSequence(const onnx::NodeProto &node);
  void convertSequenceConstruct(const onnx::NodeProto &node);
  void convertSequenceAt(const onnx::NodeProto &node);
  void convertConcatFromSequence(const onnx::NodeProto &node);
  void convertRMSNormalization(const onnx::NodeProto &node);
  void convertRotaryEmbedding(const onnx::NodeProto &node);
  void convertAttention(const onnx::NodeProto &node);

  // Folders (shape computations).
  std::vector<HostTensor> foldConstant(const onnx::NodeProto &node);
  std::vector<HostTensor> foldShape(const onnx::NodeProto &node);
  std::vector<HostTensor> foldSize(const onnx::NodeProto &node);
  std::vector<HostTensor> foldConstantOfShape(const onnx::NodeProto &node);
  std::vector<HostTensor> foldBinary(const onnx::NodeProto &node);
  std::vector<HostTensor> foldUnary(const onnx::NodeProto &node);
  std::vector<HostTensor> foldVariadic(const onnx::NodeProto &node);
  std::vector<HostTensor> foldIsInf(const onnx::NodeProto &node);
  std::vector<HostTensor> foldCast(const onnx::NodeProto &node);
  std::vector<HostTensor> foldCastLike(const onnx::NodeProto &node);
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
  std::vector<HostTensor> foldTrilu(const onnx::NodeProto &node);
  std::vector<HostTensor> foldCumSum(const onnx::NodeProto &node);
  std::vector<HostTensor> foldTile(const onnx::NodeProto &node);
  std::vector<HostTensor> foldGatherElements(const onnx::NodeProto &node);
  std::vector<HostTensor> foldScatterElements(const onnx::NodeProto &node);
  std::vector<HostTensor> foldGatherND(const onnx::NodeProto &node);
  std::vector<HostTensor> foldReduce(const onnx::NodeProto &node);
  std::vector<HostTensor> foldScatterND(const onnx::NodeProto &node);

private:
  // Loading and analysis.
  void loadModel();
  void checkOpsets();
  void analyzeGraph();
  void resolveInputTypes();
  /// Rewrites `model` for input sizes other than the ones it was traced at
  /// (Respecialize*.cpp), when the options ask for them.
  void respecializeIfAsked();
  /// Checks an initializer's type, shape and data size (external data
  /// included, without reading it); returns its element count.
  int64_t checkTensorData(const onnx::TensorProto &tensor, const std::string &what);
  HostTensor readTensor(const onnx::TensorProto &tensor, const std::string &what);
  /// `tensor`'s elements in chunks of at most `chunkElements`, in order,
  /// each given to `consume` (a shape-less HostTensor): a tensor larger
  /// than memory can be converted and written piece by piece.
  void readTensorChunks(const onnx::TensorProto &tensor, const std::string &what,
                        int64_t chunkElements, const std::function<void(const HostTensor &)> &consume);
  /// The nodes that read each value (analyzeGraph).
  using Readers = std::map<std::string, std::vector<const onnx::NodeProto *>>;
  /// `allZero`: an all-zero tensor counts too (one the exporter made, not a
  /// PyTorch parameter: the folded mask of an unpadded batch).
  bool isAdditiveAttentionMask(const onnx::TensorProto &tensor, const Readers &readers,
                               bool allZero);
  bool isZeroInitialState(const onnx::TensorProto &tensor, const Readers &readers);
  /// PyTorch's graph signature, as the dynamo exporter records it
  /// (ExporterArtifacts.cpp): the state-dict names of parameters and buffers.
  struct TorchSignature {
    std::set<std::string> parameters, buffers;
  };
  std::optional<TorchSignature> torchSignature() const;
  /// Gives every BatchNormalization running statistic that shares its
  /// initializer with another use a copy of its own (merged exports).
  void privatizeRunningStatistics();
  /// Records in importNotes what an exporter changed that training sees.
  void noteExporterArtifacts(const std::optional<TorchSignature> &signature);
  std::string readersOf(const std::string &name) const;
  /// The location of `tensor`'s external data when that file, in the
  /// model's folder, does not exist; nullopt otherwise (data inside the
  /// model, a present file, or a location readExternalData refuses).
  std::optional<std::string> absentExternalData(const onnx::TensorProto &tensor) const;
  /// Checks the external data of `tensor` (location inside the model's
  /// folder, a regular file, offset and length inside it, length equal to
  /// `expectedBytes`) and, when `read`, returns its bytes: all of them, or
  /// the `window` (offset and size within the tensor's data).
  std::string readExternalData(const onnx::TensorProto &tensor, const std::string &what,
                               uint64_t expectedBytes, bool read,
                               std::optional<std::pair<uint64_t, uint64_t>> window = std::nullopt);
  /// Elements [begin, begin + count) of `tensor`, whose data checkTensorData
  /// accepted: from `raw` (its bytes from element `begin` on) when it is
  /// stored as bytes, else from its typed fields.
  static HostTensor decodeElements(const onnx::TensorProto &tensor, ElementKind kind,
                                   const char *raw, int64_t begin, int64_t count);
  void crossCheckShapeInference();

public:
  // What converters and folds share: a row's converter or fold may be a
  // function of its own (OnnxOps.h) and uses these as the members do.

  // Errors: every problem becomes one entry of `errors`; the fail functions
  // then abandon the import (ImportAborted, caught by the entry points).
  /// Records "<file>: <problem>" and goes on.
  void report(const std::string &problem);
  [[noreturn]] void abandon();
  [[noreturn]] void fail(const onnx::NodeProto &node, const std::string &reason);
  [[noreturn]] void failFile(const std::string &reason);
  std::string nodeLabel(const onnx::NodeProto &node) const;
  /// Node `index`'s name, or "#index" when it has none (short lists).
  std::string nodeName(int index) const;

  // Operands.
  mlir::Location locationOf(const onnx::NodeProto &node);
  mlir::Value operand(const onnx::NodeProto &node, int index);
  /// The tensors of a sequence-valued input (ConvertSequence.cpp).
  const std::vector<mlir::Value> &sequenceOperand(const onnx::NodeProto &node, int index);
  const HostTensor &constantInput(const onnx::NodeProto &node, int index, const char *role);
  std::optional<HostTensor> optionalConstantInput(const onnx::NodeProto &node, int index,
                                                  const char *role);
  /// An optional operand known at import time that must hold one value.
  std::optional<HostTensor> optionalScalarInput(const onnx::NodeProto &node, int index,
                                                const char *role);
  mlir::RankedTensorType typeOf(mlir::Value value) {
    return llvm::cast<mlir::RankedTensorType>(value.getType());
  }
  std::vector<int64_t> shapeOfInput(const onnx::NodeProto &node, int index);
  mlir::Value materialize(const HostTensor &tensor, mlir::Location loc);
  void define(const onnx::NodeProto &node, int index, mlir::Value value);
  void defineResults(const onnx::NodeProto &node, mlir::Operation *op, size_t count);
  void rejectUsedOutputs(const onnx::NodeProto &node, size_t from, const char *what);

  // Axes arguments, read alike by converters and folders.
  /// Squeeze/Unsqueeze axes: an attribute before version 13, an input since.
  std::optional<std::vector<int64_t>> squeezeAxes(const onnx::NodeProto &node);
  std::vector<int64_t> normalizedAxes(const onnx::NodeProto &node, std::vector<int64_t> axes,
                                      int64_t rank, bool sortAndCheckUnique = true);
  /// Unsqueeze's axes (required), normalized for the output rank.
  std::vector<int64_t> unsqueezeAxes(const onnx::NodeProto &node, int64_t inputRank);
  /// Transpose's perm, reversing the axes by default.
  std::vector<int64_t> transposePerm(const onnx::NodeProto &node, int64_t rank);
  /// Slice's starts, ends, axes and steps (inputs 1 to 4) resolved against
  /// `shape`: one start, end and step per axis.
  struct SliceWindow {
    std::vector<int64_t> starts, ends, steps;
  };
  SliceWindow sliceWindow(const onnx::NodeProto &node, mlir::ArrayRef<int64_t> shape, bool folding);

  /// Creates an op whose result types the op infers; a shape or type error
  /// becomes an import error naming the node.
  template <typename OpT>
  mlir::Operation *createInferred(const onnx::NodeProto &node, mlir::ValueRange operands,
                                  mlir::ArrayRef<mlir::NamedAttribute> attributes);
  mlir::Value reshapeTo(const onnx::NodeProto &node, mlir::Value input,
                        mlir::ArrayRef<int64_t> shape);
  /// `values` joined along `axis` (nn.concat), or the one value itself.
  mlir::Value concatAlong(const onnx::NodeProto &node, mlir::ArrayRef<mlir::Value> values,
                          int64_t axis);
  /// `input` broadcast to `shape` (nn.expand), or itself when it has it.
  mlir::Value expandTo(const onnx::NodeProto &node, mlir::Value input,
                       mlir::ArrayRef<int64_t> shape);
  /// `input` transposed by `perm` (nn.transpose), or itself for the identity.
  mlir::Value transposeBy(const onnx::NodeProto &node, mlir::Value input,
                          mlir::ArrayRef<int64_t> perm);
  /// `input`[start:end:step] along one axis (nn.slice's normalized bounds).
  mlir::Value sliceAxis(const onnx::NodeProto &node, mlir::Value input, int64_t axis,
                        int64_t start, int64_t end, int64_t step);
  /// Run-time indices into a dimension of `size` as int64, negative ones
  /// counted from the end (ONNX's indexing operators).
  mlir::Value int64Indices(const onnx::NodeProto &node, mlir::Value indices, int64_t size);
  /// createInferred, then defines the node's first `count` outputs.
  template <typename OpT>
  void defineInferred(const onnx::NodeProto &node, mlir::ValueRange operands,
                      mlir::ArrayRef<mlir::NamedAttribute> attributes, size_t count = 1) {
    defineResults(node, createInferred<OpT>(node, operands, attributes), count);
  }
  /// The result of an op computed for `node` whose result type the op
  /// infers (the element-wise lowerings build several per node).
  template <typename OpT>
  mlir::Value build(const onnx::NodeProto &node, mlir::ValueRange operands,
                    mlir::ArrayRef<mlir::NamedAttribute> attributes = {}) {
    return createInferred<OpT>(node, operands, attributes)->getResult(0);
  }
  /// `build` of a binary op whose operands, integers narrower than 64 bits,
  /// are computed in int64 (the kernels' integer arithmetic).
  template <typename OpT>
  mlir::Value buildWidened(const onnx::NodeProto &node, mlir::Value lhs, mlir::Value rhs);
  static bool isNarrowInteger(mlir::Type element) {
    return element.isInteger() && !element.isInteger(1) && !element.isInteger(64);
  }
  /// `value` as `element` (nn.cast), or itself when it already is.
  mlir::Value castTo(const onnx::NodeProto &node, mlir::Value value, mlir::Type element);
  /// A constant of `like`'s element type and `shape`, every element `value`.
  mlir::Value filledLike(const onnx::NodeProto &node, mlir::Value like,
                         mlir::ArrayRef<int64_t> shape, double value);
  /// A 0-d constant of `like`'s element type.
  mlir::Value scalarLike(const onnx::NodeProto &node, mlir::Value like, double value) {
    return filledLike(node, like, {}, value);
  }
  /// where(x > 0, x, negative): the rectifiers' shape (LeakyRelu, PRelu,
  /// Elu, ...); `negative` is built from x's non-positive part (x where
  /// x <= 0, else 0), so that a branch that is not taken stays finite and
  /// its gradient zero (exp of a large x would give inf, and 0 * inf NaN).
  mlir::Value rectify(const onnx::NodeProto &node, mlir::Value x, mlir::Value threshold,
                      llvm::function_ref<mlir::Value(mlir::Value)> negative);
  /// min(max(x, low), high) written with comparisons and wheres so that the
  /// gradient reaches x exactly inside the bounds: exclusive (low < x <
  /// high: ONNX Clip, PyTorch's hardtanh and relu6) or inclusive (low <= x
  /// <= high: PyTorch's hardswish). A null bound is none.
  mlir::Value clip(const onnx::NodeProto &node, mlir::Value x, mlir::Value low, mlir::Value high,
                   bool inclusive);
  /// Creates an op with given result types and verifies it.
  mlir::Operation *createVerified(const onnx::NodeProto &node, mlir::StringRef name,
                                  mlir::ValueRange operands, mlir::TypeRange types,
                                  mlir::ArrayRef<mlir::NamedAttribute> attributes);
  void verifyCreated(const onnx::NodeProto &node, mlir::Operation *op);
  void windowAttributes(const onnx::NodeProto &node, int64_t spatial,
                        mlir::ArrayRef<int64_t> inputShape, mlir::ArrayRef<int64_t> kernel,
                        mlir::SmallVectorImpl<mlir::NamedAttribute> &attributes,
                        bool withDilations);
  /// MaxPool and AveragePool: the input, kernel_shape, ceil_mode, then
  /// `extra`, then the window attributes.
  template <typename OpT>
  mlir::Operation *createPool(const onnx::NodeProto &node,
                              mlir::ArrayRef<mlir::NamedAttribute> extra, bool withDilations);

private:
  mlir::MLIRContext &context;
  mlir::OpBuilder builder;
  std::string path;
  const ImportOptions &options;
  std::vector<std::string> &errors;

  onnx::ModelProto model;
  int64_t opset = 0;
  /// Version of the operator of the node being translated (resolvedVersion).
  int64_t nodeVersion = 0;
  std::filesystem::path modelDirectory;

  std::map<std::string, const onnx::TensorProto *> initializers;
  std::set<std::string> parameterNames, bufferNames;
  /// Floating initializers that are not trained, with the reason
  /// (recorded on the module as nn.frozen).
  std::map<std::string, std::string> frozenInitializers;
  /// What the user should know about the file (recorded as nn.import_notes).
  std::vector<std::string> importNotes;
  /// The input sizes a re-specialization changed ("'x' [2,16] -> [8,32]"), for errors.
  std::string respecializedTo;
  std::set<std::string> knownAtImport; // values folded on the host
  std::vector<bool> foldedNodes;        // by node index: analyzeGraph folds it on the host
  std::map<std::string, mlir::RankedTensorType> inputTypes;
  std::map<std::string, HostTensor> constants;
  std::map<std::string, mlir::Value> values;
  /// Sequence values (ConvertSequence.cpp), lowered to their tensors.
  std::map<std::string, std::vector<mlir::Value>> sequences;
  std::map<std::string, mlir::Value> materializedConstants;
  std::map<std::string, int> useCounts;
  int currentNodeIndex = 0;
};

//===----------------------------------------------------------------------===//
// Templates: here so that the operator tables can name their instances.
//===----------------------------------------------------------------------===//

template <typename OpT>
mlir::Operation *OnnxImporter::createInferred(const onnx::NodeProto &node,
                                              mlir::ValueRange operands,
                                              mlir::ArrayRef<mlir::NamedAttribute> attributes) {
  mlir::Location loc = locationOf(node);
  mlir::DictionaryAttr dictionary = builder.getDictionaryAttr(attributes);
  typename OpT::Properties properties;
  DiagnosticCapture diagnostics(context);
  if (mlir::failed(
          OpT::setPropertiesFromAttr(properties, dictionary, [&] { return mlir::emitError(loc); })))
    fail(node, "invalid attributes: " + diagnostics.text());
  mlir::SmallVector<mlir::Type> types;
  if (mlir::failed(OpT::inferReturnTypes(&context, loc, operands, dictionary,
                                         mlir::OpaqueProperties(&properties), {}, types)))
    fail(node, diagnostics.text().empty() ? "invalid operands" : diagnostics.text());
  return createVerified(node, OpT::getOperationName(), operands, types, attributes);
}

template <typename OpT> void OnnxImporter::convertBinary(const onnx::NodeProto &node) {
  mlir::Value lhs = operand(node, 0), rhs = operand(node, 1);
  // ONNX allows Pow's exponent (and constant operands of exporters) in another
  // type; a constant operand is converted so that both sides agree.
  mlir::Type lhsElement = typeOf(lhs).getElementType(), rhsElement = typeOf(rhs).getElementType();
  if (lhsElement != rhsElement) {
    auto convertConstant = [&](int index, mlir::Type to) -> std::optional<mlir::Value> {
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
    else if (node.op_type() == "Pow" && llvm::isa<mlir::FloatType>(lhsElement))
      // Pow(float, integer): the exponent converts exactly enough to float.
      rhs = castTo(node, rhs, lhsElement);
  }
  define(node, 0, buildWidened<OpT>(node, lhs, rhs));
}

template <typename OpT>
mlir::Value OnnxImporter::buildWidened(const onnx::NodeProto &node, mlir::Value lhs,
                                       mlir::Value rhs) {
  mlir::Type element = typeOf(lhs).getElementType();
  if (!isNarrowInteger(element))
    return build<OpT>(node, {lhs, rhs});
  // The kernels do integer arithmetic in int64: narrower integers widen,
  // and an arithmetic result converts back (wrapping, as ONNX's does).
  mlir::Value result = build<OpT>(node, {castTo(node, lhs, builder.getI64Type()),
                                         castTo(node, rhs, builder.getI64Type())});
  return typeOf(result).getElementType().isInteger(64) ? castTo(node, result, element) : result;
}

/// Sum, Max, Min of any number of inputs: a chain of the binary op,
/// left to right (one input: itself).
template <typename OpT> void OnnxImporter::convertVariadic(const onnx::NodeProto &node) {
  if (node.input_size() < 1)
    fail(node, "needs at least one input");
  mlir::Value result = operand(node, 0);
  for (int i = 1; i < node.input_size(); ++i)
    result = buildWidened<OpT>(node, result, operand(node, i));
  define(node, 0, result);
}

template <typename OpT> void OnnxImporter::convertUnary(const onnx::NodeProto &node) {
  mlir::Value input = operand(node, 0);
  defineResults(node, createVerified(node, OpT::getOperationName(), {input}, {input.getType()}, {}),
                1);
}

} // namespace pipec::import::detail

#endif // PIPEC_COMPILER_IMPORT_IMPORTERIMPL_H
