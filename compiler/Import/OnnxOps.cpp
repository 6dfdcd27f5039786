// The ONNX operators pipec imports, one row each (OnnxOps.h,
// docs/adding-an-op.md). A row: the operator's type; the opsets at which its
// definition changed and the oldest version pipec translates; its converter
// into `nn` (ImporterImpl.h, Convert*.cpp); its fold on the host
// (FoldShape.cpp); how re-specialization follows its shapes
// (RespecializeRules.cpp); the inputs gradients flow through.
#include "compiler/Import/OnnxOps.h"
#include "compiler/Import/ImporterImpl.h"

#include "llvm/Support/ErrorHandling.h"

#include <map>

namespace pipec::import::detail {
namespace {

const DifferentiableInputs kAll = DifferentiableInputs::all();
const DifferentiableInputs kNone = DifferentiableInputs::none();

std::vector<OnnxOp> builtInOnnxOps() {
  // Element-wise versions that only add element types keep the semantics;
  // versions 1 to 6 differ by `consumed_inputs` (ignored) or by the old
  // `broadcast` attribute (refused: before 7); Max, Min, Sum and Mean before
  // 8 need equal shapes, a case of broadcasting. Reductions: 18 moves `axes`
  // to an input; 20 adds bool to ReduceMax/Min.
  return {
      {"Add", {{1, 6, 7, 13, 14}, 7}, &OnnxImporter::convertBinary<nn::AddOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kAll},
      {"Sub", {{1, 6, 7, 13, 14}, 7}, &OnnxImporter::convertBinary<nn::SubOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kAll},
      {"Mul", {{1, 6, 7, 13, 14}, 7}, &OnnxImporter::convertBinary<nn::MulOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kAll},
      {"Div", {{1, 6, 7, 13, 14}, 7}, &OnnxImporter::convertBinary<nn::DivOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kAll},
      {"Pow", {{1, 7, 12, 13, 15}, 7}, &OnnxImporter::convertBinary<nn::PowOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kAll},
      {"Max", {{1, 6, 8, 12, 13}, 1}, &OnnxImporter::convertVariadic<nn::MaxOp>, &OnnxImporter::foldVariadic, ShapeRule::Broadcast, kAll},
      {"Min", {{1, 6, 8, 12, 13}, 1}, &OnnxImporter::convertVariadic<nn::MinOp>, &OnnxImporter::foldVariadic, ShapeRule::Broadcast, kAll},
      {"Sum", {{1, 6, 8, 13}, 1}, &OnnxImporter::convertVariadic<nn::AddOp>, &OnnxImporter::foldVariadic, ShapeRule::Broadcast, kAll},
      {"Mean", {{1, 6, 8, 13}, 1}, &OnnxImporter::convertMean, &OnnxImporter::foldVariadic, ShapeRule::Broadcast, kAll},
      {"Mod", {{10, 13}, 10}, &OnnxImporter::convertMod, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Equal", {{1, 7, 11, 13, 19}, 7}, &OnnxImporter::convertBinary<nn::EqualOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Less", {{1, 7, 9, 13}, 7}, &OnnxImporter::convertBinary<nn::LessOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"LessOrEqual", {{12, 16}, 12}, &OnnxImporter::convertBinary<nn::LessOrEqualOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Greater", {{1, 7, 9, 13}, 7}, &OnnxImporter::convertBinary<nn::GreaterOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"GreaterOrEqual", {{12, 16}, 12}, &OnnxImporter::convertBinary<nn::GreaterOrEqualOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"And", {{1, 7}, 7}, &OnnxImporter::convertBinary<nn::AndOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Or", {{1, 7}, 7}, &OnnxImporter::convertBinary<nn::OrOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Xor", {{1, 7}, 7}, &OnnxImporter::convertBinary<nn::XorOp>, &OnnxImporter::foldBinary, ShapeRule::Broadcast, kNone},
      {"Not", {{1}, 1}, &OnnxImporter::convertNot, &OnnxImporter::foldUnary, ShapeRule::SameShape, kNone},
      {"IsNaN", {{9, 13, 20}, 9}, &OnnxImporter::convertIsNaN, &OnnxImporter::foldUnary, ShapeRule::SameShape, kNone},
      {"IsInf", {{10, 20}, 10}, &OnnxImporter::convertIsInf, &OnnxImporter::foldIsInf, ShapeRule::SameShape, kNone},
      {"Where", {{9, 16}, 9}, &OnnxImporter::convertWhere, &OnnxImporter::foldWhere, ShapeRule::Broadcast, {1, 2}},
      {"Relu", {{1, 6, 13, 14}, 1}, &OnnxImporter::convertUnary<nn::ReluOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Tanh", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::TanhOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Sigmoid", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::SigmoidOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Erf", {{9, 13}, 9}, &OnnxImporter::convertUnary<nn::ErfOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Sqrt", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::SqrtOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Gelu", {{20}, 20}, &OnnxImporter::convertGelu, nullptr, ShapeRule::SameShape, kAll},
      {"Neg", {{1, 6, 13}, 1}, &OnnxImporter::convertNeg, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Reciprocal", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::ReciprocalOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Abs", {{1, 6, 13}, 1}, &OnnxImporter::convertAbs, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Sign", {{9, 13}, 9}, &OnnxImporter::convertSign, nullptr, ShapeRule::SameShape, kAll},
      {"Exp", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::ExpOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Log", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::LogOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Sin", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::SinOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Cos", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::CosOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Softplus", {{1, 22}, 1}, &OnnxImporter::convertUnary<nn::SoftplusOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Softsign", {{1, 22}, 1}, &OnnxImporter::convertUnary<nn::SoftsignOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Tan", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::TanOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Atan", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::AtanOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Asin", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::AsinOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Acos", {{7, 22}, 7}, &OnnxImporter::convertUnary<nn::AcosOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Sinh", {{9, 22}, 9}, &OnnxImporter::convertUnary<nn::SinhOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Cosh", {{9, 22}, 9}, &OnnxImporter::convertUnary<nn::CoshOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Asinh", {{9, 22}, 9}, &OnnxImporter::convertUnary<nn::AsinhOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Acosh", {{9, 22}, 9}, &OnnxImporter::convertUnary<nn::AcoshOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Atanh", {{9, 22}, 9}, &OnnxImporter::convertUnary<nn::AtanhOp>, nullptr, ShapeRule::SameShape, kAll},
      {"Floor", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::FloorOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Ceil", {{1, 6, 13}, 1}, &OnnxImporter::convertUnary<nn::CeilOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Round", {{11, 22}, 11}, &OnnxImporter::convertUnary<nn::RoundOp>, &OnnxImporter::foldUnary, ShapeRule::SameShape, kAll},
      {"Clip", {{1, 6, 11, 12, 13}, 6}, &OnnxImporter::convertClip, nullptr, ShapeRule::SameShape, kAll},
      {"HardSigmoid", {{1, 6, 22}, 6}, &OnnxImporter::convertHardSigmoid, nullptr, ShapeRule::SameShape, kAll},
      {"HardSwish", {{14, 22}, 14}, &OnnxImporter::convertHardSwish, nullptr, ShapeRule::SameShape, kAll},
      {"LeakyRelu", {{1, 6, 16}, 6}, &OnnxImporter::convertLeakyRelu, nullptr, ShapeRule::SameShape, kAll},
      {"PRelu", {{1, 6, 7, 9, 16}, 7}, &OnnxImporter::convertPRelu, nullptr, ShapeRule::Broadcast, kAll},
      {"Elu", {{1, 6, 22}, 6}, &OnnxImporter::convertElu, nullptr, ShapeRule::SameShape, kAll},
      {"Selu", {{1, 6, 22}, 6}, &OnnxImporter::convertSelu, nullptr, ShapeRule::SameShape, kAll},
      {"Celu", {{12}, 12}, &OnnxImporter::convertCelu, nullptr, ShapeRule::SameShape, kAll},
      {"Mish", {{18, 22}, 18}, &OnnxImporter::convertMish, nullptr, ShapeRule::SameShape, kAll},
      {"ThresholdedRelu", {{10, 22}, 10}, &OnnxImporter::convertThresholdedRelu, nullptr, ShapeRule::SameShape, kAll},
      {"Cast", {{1, 6, 9, 13, 19, 21, 23, 24}, 1}, &OnnxImporter::convertCast, &OnnxImporter::foldCast, ShapeRule::SameShapeAndValues, kAll},
      {"CastLike", {{15, 19, 21, 23, 24}, 15}, &OnnxImporter::convertCastLike, &OnnxImporter::foldCastLike, ShapeRule::SameShapeAndValues, {0}},
      {"Gemm", {{1, 6, 7, 9, 11, 13}, 7}, &OnnxImporter::convertGemm, nullptr, ShapeRule::Gemm, kAll},
      {"MatMul", {{1, 9, 13}, 1}, &OnnxImporter::convertMatMul, nullptr, ShapeRule::MatMul, kAll},
      {"Conv", {{1, 11, 22}, 1}, &OnnxImporter::convertConv, nullptr, ShapeRule::Windowed, kAll},
      {"ConvTranspose", {{1, 11, 22}, 1}, &OnnxImporter::convertConvTranspose, nullptr, ShapeRule::Windowed, kAll},
      {"BatchNormalization", {{1, 6, 7, 9, 14, 15}, 9}, &OnnxImporter::convertBatchNorm, nullptr, ShapeRule::SameShape, {0, 1, 2}},
      {"LayerNormalization", {{17}, 17}, &OnnxImporter::convertLayerNorm, nullptr, ShapeRule::SameShape, kAll},
      {"MaxPool", {{1, 8, 10, 11, 12, 22}, 1}, &OnnxImporter::convertMaxPool, nullptr, ShapeRule::Windowed, {0}},
      {"AveragePool", {{1, 7, 10, 11, 19, 22}, 1}, &OnnxImporter::convertAveragePool, nullptr, ShapeRule::Windowed, {0}},
      {"GlobalAveragePool", {{1, 22}, 1}, &OnnxImporter::convertGlobalAveragePool, nullptr, ShapeRule::Spatial, {0}},
      {"Dropout", {{1, 6, 7, 10, 12, 13, 22}, 7}, &OnnxImporter::convertDropout, nullptr, ShapeRule::SameShapeWithMask, {0}},
      {"Softmax", {{1, 11, 13}, 1}, &OnnxImporter::convertSoftmax, nullptr, ShapeRule::SameShape, {0}},
      {"SoftmaxCrossEntropyLoss", {{12, 13}, 12}, &OnnxImporter::convertSoftmaxCrossEntropyLoss, nullptr, ShapeRule::Loss, {0}},
      {"ReduceMean", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceSum", {{1, 11, 13}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceSumSquare", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceL1", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceL2", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceLogSum", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceLogSumExp", {{1, 11, 13, 18}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceMax", {{1, 11, 12, 13, 18, 20}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"ReduceMin", {{1, 11, 12, 13, 18, 20}, 1}, &OnnxImporter::convertReduce, &OnnxImporter::foldReduce, ShapeRule::Reduce, {0}},
      {"LogSoftmax", {{1, 11, 13}, 1}, &OnnxImporter::convertLogSoftmax, nullptr, ShapeRule::SameShape, {0}},
      {"ArgMax", {{1, 11, 12, 13}, 1}, &OnnxImporter::convertArgMax, nullptr, ShapeRule::ArgReduce, kNone},
      {"ArgMin", {{1, 11, 12, 13}, 1}, &OnnxImporter::convertArgMax, nullptr, ShapeRule::ArgReduce, kNone},
      {"Einsum", {{12}, 12}, &OnnxImporter::convertEinsum, nullptr, ShapeRule::Einsum, kAll},
      {"TopK", {{1, 10, 11, 24}, 1}, &OnnxImporter::convertTopK, nullptr, ShapeRule::Unfollowed, {0}},
      {"DepthToSpace", {{1, 11, 13}, 1}, &OnnxImporter::convertDepthToSpace, nullptr, ShapeRule::Spatial, {0}},
      {"NegativeLogLikelihoodLoss", {{12, 13, 22}, 12}, &OnnxImporter::convertNegativeLogLikelihoodLoss, nullptr, ShapeRule::Loss, {0}},
      {"RNN", {{1, 7, 14, 22}, 7}, &OnnxImporter::convertRecurrent, nullptr, ShapeRule::Recurrent, {0, 1, 2, 3, 5}},
      {"GRU", {{1, 3, 7, 14, 22}, 7}, &OnnxImporter::convertRecurrent, nullptr, ShapeRule::Recurrent, {0, 1, 2, 3, 5}},
      {"LSTM", {{1, 7, 14, 22}, 7}, &OnnxImporter::convertRecurrent, nullptr, ShapeRule::Recurrent, {0, 1, 2, 3, 5, 6, 7}},
      {"SpaceToDepth", {{1, 13}, 1}, &OnnxImporter::convertDepthToSpace, nullptr, ShapeRule::Spatial, {0}},
      {"GroupNormalization", {{18, 21}, 18}, &OnnxImporter::convertGroupNormalization, nullptr, ShapeRule::SameShape, kAll},
      {"InstanceNormalization", {{1, 6, 22}, 6}, &OnnxImporter::convertGroupNormalization, nullptr, ShapeRule::SameShape, kAll},
      {"Gather", {{1, 11, 13}, 1}, &OnnxImporter::convertGather, &OnnxImporter::foldGather, ShapeRule::Gather, {0}},
      {"Reshape", {{1, 5, 13, 14, 19, 21, 23, 24}, 5}, &OnnxImporter::convertReshape, &OnnxImporter::foldReshape, ShapeRule::Reshape, {0}},
      {"Flatten", {{1, 9, 11, 13, 21, 23, 24}, 1}, &OnnxImporter::convertFlatten, &OnnxImporter::foldFlatten, ShapeRule::Flatten, {0}},
      {"Unsqueeze", {{1, 11, 13, 21, 23, 24}, 1}, &OnnxImporter::convertUnsqueeze, &OnnxImporter::foldUnsqueeze, ShapeRule::Unsqueeze, {0}},
      {"Squeeze", {{1, 11, 13, 21, 23, 24}, 1}, &OnnxImporter::convertSqueeze, &OnnxImporter::foldSqueeze, ShapeRule::Squeeze, {0}},
      {"Expand", {{8, 13}, 8}, &OnnxImporter::convertExpand, &OnnxImporter::foldExpand, ShapeRule::Expand, {0}},
      {"Transpose", {{1, 13, 21, 23, 24}, 1}, &OnnxImporter::convertTranspose, &OnnxImporter::foldTranspose, ShapeRule::Transpose, {0}},
      {"Concat", {{1, 4, 11, 13}, 4}, &OnnxImporter::convertConcat, &OnnxImporter::foldConcat, ShapeRule::Concat, kAll},
      {"Pad", {{1, 2, 11, 13, 18, 19, 21, 23, 24}, 11}, &OnnxImporter::convertPad, nullptr, ShapeRule::Pad, {0}},
      {"Split", {{1, 2, 11, 13, 18}, 2}, &OnnxImporter::convertSplit, nullptr, ShapeRule::Split, {0}},
      {"Slice", {{1, 10, 11, 13}, 10}, &OnnxImporter::convertSlice, &OnnxImporter::foldSlice, ShapeRule::Slice, {0}},
      {"Identity", {{1, 13, 14, 16, 19, 21, 23, 24}, 1}, &OnnxImporter::convertIdentity, &OnnxImporter::foldIdentity, ShapeRule::SameShapeAndValues, {0}},
      {"Trilu", {{14}, 14}, &OnnxImporter::convertTrilu, &OnnxImporter::foldTrilu, ShapeRule::SameShape, {0}},
      {"CumSum", {{11, 14}, 11}, &OnnxImporter::convertCumSum, &OnnxImporter::foldCumSum, ShapeRule::SameShape, {0}},
      {"GatherElements", {{11, 13}, 11}, &OnnxImporter::convertGatherElements, &OnnxImporter::foldGatherElements, ShapeRule::GatherElements, {0}},
      {"GatherND", {{11, 12, 13}, 11}, &OnnxImporter::convertGatherND, &OnnxImporter::foldGatherND, ShapeRule::GatherND, {0}},
      {"ScatterND", {{11, 13, 16, 18}, 11}, &OnnxImporter::convertScatter, &OnnxImporter::foldScatterND, ShapeRule::SameShape, {0, 2}},
      {"ScatterElements", {{11, 13, 16, 18}, 11}, &OnnxImporter::convertScatter, &OnnxImporter::foldScatterElements, ShapeRule::SameShape, {0, 2}},
      {"Resize", {{10, 11, 13, 18, 19}, 10}, &OnnxImporter::convertResize, nullptr, ShapeRule::Spatial, {0}},
      {"Tile", {{1, 6, 13}, 6}, &OnnxImporter::convertTile, &OnnxImporter::foldTile, ShapeRule::Tile, {0}},
      {"SplitToSequence", {{11, 24}, 11}, &OnnxImporter::convertSplitToSequence, nullptr, ShapeRule::SplitToSequence, {0}},
      {"SequenceConstruct", {{11}, 11}, &OnnxImporter::convertSequenceConstruct, nullptr, ShapeRule::Unfollowed, kAll},
      {"SequenceAt", {{11}, 11}, &OnnxImporter::convertSequenceAt, nullptr, ShapeRule::SequenceAt, {0}},
      {"ConcatFromSequence", {{11}, 11}, &OnnxImporter::convertConcatFromSequence, nullptr, ShapeRule::Unfollowed, {0}},
      {"RMSNormalization", {{23}, 23}, &OnnxImporter::convertRMSNormalization, nullptr, ShapeRule::SameShape, kAll},
      {"RotaryEmbedding", {{23}, 23}, &OnnxImporter::convertRotaryEmbedding, nullptr, ShapeRule::SameShape, {0}},
      // An attention mask is a bias, never a trained parameter.
      {"Attention", {{23, 24}, 23}, &OnnxImporter::convertAttention, nullptr, ShapeRule::Attention, {0, 1, 2}},
      {"Constant", {{1, 9, 11, 12, 13, 19, 21, 23, 24}, 1}, nullptr, &OnnxImporter::foldConstant, ShapeRule::Unfollowed, kNone},
      {"Shape", {{1, 13, 15, 19, 21, 23, 24}, 1}, nullptr, &OnnxImporter::foldShape, ShapeRule::Shape, kNone},
      {"Size", {{1, 13, 19, 21, 23, 24}, 1}, nullptr, &OnnxImporter::foldSize, ShapeRule::Size, kNone},
      {"ConstantOfShape", {{9, 20, 21, 23, 24}, 9}, nullptr, &OnnxImporter::foldConstantOfShape, ShapeRule::ConstantOfShape, kNone},
      {"ReduceProd", {{1, 11, 13, 18}, 1}, nullptr, &OnnxImporter::foldReduce, ShapeRule::Reduce, kNone},
      {"Range", {{11}, 11}, nullptr, &OnnxImporter::foldRange, ShapeRule::Range, kNone},
  };
}

/// The rows, and their index by type; every row checked (checkOnnxOp).
struct Registry {
  std::vector<OnnxOp> rows;
  std::map<std::string, size_t> byType;

  Registry() {
    for (OnnxOp &row : builtInOnnxOps()) {
      std::string error;
      if (!add(std::move(row), error))
        llvm::report_fatal_error(llvm::Twine("pipec's ONNX operator table: ") + error);
    }
  }
  bool add(OnnxOp row, std::string &error) {
    if (std::string problem = checkOnnxOp(row); !problem.empty()) {
      error = problem;
      return false;
    }
    if (byType.count(row.type)) {
      error = "operator " + row.type + " has two rows";
      return false;
    }
    byType[row.type] = rows.size();
    rows.push_back(std::move(row));
    return true;
  }
};

Registry &registry() {
  static Registry instance;
  return instance;
}

} // namespace

const std::vector<OnnxOp> &onnxOps() { return registry().rows; }

const OnnxOp *findOnnxOp(const onnx::NodeProto &node) {
  if (!isDefaultDomain(node.domain()))
    return nullptr;
  const Registry &rows = registry();
  auto it = rows.byType.find(node.op_type());
  return it == rows.byType.end() ? nullptr : &rows.rows[it->second];
}

std::string checkOnnxOp(const OnnxOp &row) {
  std::string name = "operator '" + row.type + "'";
  if (row.type.empty())
    return "an operator without a type";
  const std::vector<int64_t> &changes = row.versions.changes;
  if (changes.empty() || changes.front() < 1 ||
      !std::is_sorted(changes.begin(), changes.end(), std::less_equal<>()) ||
      std::adjacent_find(changes.begin(), changes.end()) != changes.end())
    return name + ": its versions are not positive and ascending";
  if (std::find(changes.begin(), changes.end(), row.versions.oldestSupported) == changes.end())
    return name + ": the oldest supported version " +
           std::to_string(row.versions.oldestSupported) + " is not one of its versions";
  if (!row.convert && !row.fold)
    return name + ": neither a converter nor a fold";
  return "";
}

bool registerOnnxOp(OnnxOp row, std::string &error) {
  return registry().add(std::move(row), error);
}

int64_t resolvedVersion(const std::string &opType, int64_t opset) {
  const Registry &rows = registry();
  auto it = rows.byType.find(opType);
  if (it == rows.byType.end())
    return opset;
  int64_t version = 0;
  for (int64_t change : rows.rows[it->second].versions.changes)
    if (change <= opset)
      version = change;
  return version;
}

} // namespace pipec::import::detail
