// The ONNX operators pipec knows, one row each (docs/adding-an-op.md): the
// opsets at which the operator's definition changed and the oldest version
// pipec translates, its converter into `nn`, its fold on the host, how
// re-specialization follows its shapes, and the inputs gradients flow
// through. Everything in the importer that depends on the operator's type
// reads its row; nothing else keeps a list of operator names.
#ifndef PIPEC_COMPILER_IMPORT_ONNXOPS_H
#define PIPEC_COMPILER_IMPORT_ONNXOPS_H

#include "compiler/Import/HostTensor.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace pipec::import::detail {

class OnnxImporter;
/// Translates one node into `nn` ops.
using Converter = std::function<void(OnnxImporter &, const onnx::NodeProto &)>;
/// Computes one node whose inputs are known at import time, on the host.
using Folder = std::function<std::vector<HostTensor>(OnnxImporter &, const onnx::NodeProto &)>;

/// The opsets at which an operator's definition changed (ONNX's
/// `since_version`s up to the newest opset pipec reads), and the oldest
/// version pipec translates. The version a node follows is the newest change
/// at or below the model's opset.
struct OperatorVersions {
  std::vector<int64_t> changes;
  int64_t oldestSupported;
};

/// The input positions of an operator through which gradients flow; decides
/// which initializers are trained (docs/importer.md). `all()` covers any
/// number of inputs (Concat, Sum, Max): a list of positions would silently
/// stop at its end and freeze the parameters behind the later inputs.
class DifferentiableInputs {
public:
  static DifferentiableInputs all() { return DifferentiableInputs(true, {}); }
  static DifferentiableInputs none() { return DifferentiableInputs(false, {}); }
  DifferentiableInputs(std::initializer_list<int> positions)
      : every(false), positions(positions) {}
  bool contains(int index) const {
    return every || std::find(positions.begin(), positions.end(), index) != positions.end();
  }

private:
  DifferentiableInputs(bool every, std::vector<int> positions)
      : every(every), positions(std::move(positions)) {}
  bool every;
  std::vector<int> positions;
};

/// How re-specialization (docs/importer.md, "Another batch or sequence
/// length") follows a changing dimension through the operator; each is a
/// rule of RespecializeRules.cpp.
enum class ShapeRule {
  /// Outputs keep their traced shapes; a node that reads a changing
  /// dimension is refused, naming it.
  Unfollowed,
  /// Output 0 has input 0's shape (element-wise, normalizations, softmax).
  SameShape,
  /// Output 0 has input 0's shape and, for a small integer value, its
  /// elements (Identity, Cast).
  SameShapeAndValues,
  /// Outputs 0 and 1 (the mask) have input 0's shape (Dropout).
  SameShapeWithMask,
  /// Numpy broadcasting of every input; Add, Sub, Mul, Div, Max, Min, Equal
  /// and Where also follow the elements of small integer values.
  Broadcast,
  Reshape,
  Slice,
  Flatten,
  Transpose,
  Concat,
  Split,
  SplitToSequence,
  SequenceAt,
  Gather,
  GatherElements,
  GatherND,
  Unsqueeze,
  Squeeze,
  Expand,
  Tile,
  Shape,
  Size,
  ConstantOfShape,
  Range,
  MatMul,
  Gemm,
  /// Convolutions and pools: the batch follows, and a spatial dimension
  /// under a window of stride 1.
  Windowed,
  /// Global pools, depth/space rearrangements, Resize: the batch follows.
  Spatial,
  /// Reduce*: the axes an input or attribute, kept or dropped.
  Reduce,
  /// ArgMax, ArgMin: one `axis` attribute.
  ArgReduce,
  Pad,
  Einsum,
  /// RNN, GRU, LSTM: sequence and batch.
  Recurrent,
  Attention,
  /// SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss.
  Loss,
};

/// One ONNX operator of the default domain. Every part is required: the
/// constructor has no defaults, and a row without a converter and without a
/// fold, or with versions out of order, stops pipec at start-up naming it
/// (checkOnnxOp). `convert` or `fold` may be null (fold only: Shape,
/// Range; convert only: Conv), never both.
struct OnnxOp {
  OnnxOp(std::string type, OperatorVersions versions, Converter convert, Folder fold,
         ShapeRule shape, DifferentiableInputs differentiableInputs)
      : type(std::move(type)), versions(std::move(versions)), convert(std::move(convert)),
        fold(std::move(fold)), shape(shape), differentiableInputs(std::move(differentiableInputs)) {}

  std::string type;
  OperatorVersions versions;
  /// Null: the operator is only folded, and refused when an input is not
  /// known at import time.
  Converter convert;
  /// Null: never folded; the converter translates every node.
  Folder fold;
  ShapeRule shape;
  /// Decides which initializers are trained.
  DifferentiableInputs differentiableInputs;
};

/// Every row (OnnxOps.cpp), each checked once on first use.
const std::vector<OnnxOp> &onnxOps();
/// The row of `node`'s operator; null for other domains and unknown operators.
const OnnxOp *findOnnxOp(const onnx::NodeProto &node);
/// What is wrong with `row`, or "" (versions ascending and positive, the
/// oldest supported among them, a converter or a fold, a type).
std::string checkOnnxOp(const OnnxOp &row);
/// Adds a row after the built-in ones, for operators defined outside this
/// library (the tests' throw-away operator); false with `error` when
/// checkOnnxOp refuses it or its type has a row already.
bool registerOnnxOp(OnnxOp row, std::string &error);

inline bool isDefaultDomain(const std::string &domain) {
  return domain.empty() || domain == "ai.onnx";
}

/// The version of `opType` a model at `opset` uses; 0 when the operator does
/// not exist yet at that opset, `opset` for an operator without a row.
int64_t resolvedVersion(const std::string &opType, int64_t opset);

} // namespace pipec::import::detail

#endif // PIPEC_COMPILER_IMPORT_ONNXOPS_H
