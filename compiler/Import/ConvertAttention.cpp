// The language-model operators of opset 23 (RMSNormalization,
// RotaryEmbedding, Attention), lowered at import into `nn` ops that pipec
// already differentiates, costs and emits (RMSNormalization is the
// uncentred nn.layer_norm); -O2 recognizes the masked softmax and fuses the
// element-wise chains (docs/importer.md, docs/optimization.md). Semantics follow ONNX's operator definitions.
#include "compiler/Import/ImporterImpl.h"

#include <cmath>
#include <limits>

using namespace mlir;

namespace pipec::import::detail {

Value OnnxImporter::reshapeTo(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> shape) {
  auto type = RankedTensorType::get(shape, typeOf(input).getElementType());
  if (type == input.getType())
    return input;
  return createVerified(node, nn::ReshapeOp::getOperationName(), {input}, {type}, {})->getResult(0);
}

Value OnnxImporter::expandTo(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> shape) {
  auto type = RankedTensorType::get(shape, typeOf(input).getElementType());
  if (type == input.getType())
    return input;
  return createVerified(node, nn::ExpandOp::getOperationName(), {input}, {type}, {})->getResult(0);
}

Value OnnxImporter::concatAlong(const onnx::NodeProto &node, ArrayRef<Value> values,
                                int64_t axis) {
  if (values.size() == 1)
    return values.front();
  return build<nn::ConcatOp>(node, values,
                             {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))});
}

Value OnnxImporter::transposeBy(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> perm) {
  bool identity = true;
  for (auto [position, axis] : llvm::enumerate(perm))
    identity = identity && axis == static_cast<int64_t>(position);
  if (identity)
    return input;
  return build<nn::TransposeOp>(node, {input},
                                {builder.getNamedAttr("perm", builder.getDenseI64ArrayAttr(perm))});
}

void OnnxImporter::convertRMSNormalization(const onnx::NodeProto &node) {
  // y = x / sqrt(mean(x^2 over axis..rank-1) + epsilon) * scale: the fused
  // row normalization without centring.
  Value input = operand(node, 0), scale = operand(node, 1);
  int64_t axis = normalizedAxes(node, {intAttr(node, "axis", -1)}, typeOf(input).getRank())[0];
  Value normalized = createInferred<nn::LayerNormOp>(
                         node, {input, scale},
                         {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis)),
                          builder.getNamedAttr("epsilon", builder.getF32FloatAttr(
                                                              floatAttr(node, "epsilon", 1e-5f))),
                          builder.getNamedAttr("centered", builder.getBoolAttr(false))})
                         ->getResult(0);
  define(node, 0, normalized);
}

void OnnxImporter::convertRotaryEmbedding(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  Value cosCache = operand(node, 1), sinCache = operand(node, 2);
  auto shape = typeOf(input).getShape();
  if (shape.size() != 3 && shape.size() != 4)
    fail(node, "input must be 3-D (batch, sequence, hidden) or 4-D (batch, heads, sequence, "
               "head size), got " +
                   shapeText(shape));
  // Work in (batch, sequence, heads, head size), as ONNX's definition does.
  Value x = input;
  int64_t batch = shape[0], heads, sequence, headSize;
  if (shape.size() == 4) {
    heads = shape[1], sequence = shape[2], headSize = shape[3];
    x = transposeBy(node, x, {0, 2, 1, 3});
  } else {
    heads = intAttr(node, "num_heads", 0);
    if (heads <= 0 || shape[2] % heads != 0)
      fail(node,
           "a 3-D input needs num_heads dividing its hidden size " + std::to_string(shape[2]));
    sequence = shape[1], headSize = shape[2] / heads;
    x = reshapeTo(node, x, {batch, sequence, heads, headSize});
  }
  int64_t rotated = intAttr(node, "rotary_embedding_dim", 0);
  if (rotated == 0)
    rotated = headSize;
  if (rotated < 2 || rotated > headSize || rotated % 2 != 0)
    fail(node, "rotary_embedding_dim " + std::to_string(rotated) +
                   " must be even and at most the head size " + std::to_string(headSize));
  int64_t half = rotated / 2;
  if (hasInput(node, 3)) {
    Value positions = operand(node, 3);
    auto gather = [&](Value cache) {
      return build<nn::GatherOp>(node, {cache, positions},
                                 {builder.getNamedAttr("axis", builder.getI64IntegerAttr(0))});
    };
    cosCache = gather(cosCache);
    sinCache = gather(sinCache);
  }
  // ONNX's definition uses the first rotary_embedding_dim / 2 entries of
  // each cache row (a cache may be as wide as head_size / 2).
  for (Value *cache : {&cosCache, &sinCache}) {
    auto cacheShape = typeOf(*cache).getShape();
    if (cacheShape.size() != 3 || cacheShape[0] != batch || cacheShape[1] != sequence ||
        cacheShape[2] < half)
      fail(node, "the cos and sin caches must be (batch, sequence, at least rotary_embedding_dim / 2) = " +
                     shapeText(std::vector<int64_t>{batch, sequence, half}) +
                     " (after position_ids), got " + shapeText(cacheShape));
    if (cacheShape[2] > half)
      *cache = build<nn::SliceOp>(
          node, {*cache},
          {builder.getNamedAttr("starts", builder.getDenseI64ArrayAttr({0, 0, 0})),
           builder.getNamedAttr("ends", builder.getDenseI64ArrayAttr({batch, sequence, half})),
           builder.getNamedAttr("steps", builder.getDenseI64ArrayAttr({1, 1, 1}))});
  }
  // The caches at full rotated width, (batch, sequence, 1, rotated), to
  // broadcast over the heads: each value serves both elements it rotates
  // (the two halves, or the two of a pair when interleaved).
  bool interleaved = intAttr(node, "interleaved", 0) != 0;
  auto fullWidth = [&](Value cache) {
    if (!interleaved)
      return reshapeTo(node, concatAlong(node, {cache, cache}, 2), {batch, sequence, 1, rotated});
    Value pairs = reshapeTo(node, cache, {batch, sequence, 1, half, 1});
    return reshapeTo(node, concatAlong(node, {pairs, pairs}, 4), {batch, sequence, 1, rotated});
  };
  auto slice = [&](Value value, int64_t start, int64_t end) {
    std::vector<int64_t> starts{0, 0, 0, start}, ends{batch, sequence, heads, end}, steps{1, 1, 1, 1};
    return build<nn::SliceOp>(node, {value},
                              {builder.getNamedAttr("starts", builder.getDenseI64ArrayAttr(starts)),
                               builder.getNamedAttr("ends", builder.getDenseI64ArrayAttr(ends)),
                               builder.getNamedAttr("steps", builder.getDenseI64ArrayAttr(steps))});
  };
  // One statement each: the IR's order must not depend on the order in
  // which a compiler evaluates arguments.
  Value cos = fullWidth(cosCache);
  Value sin = fullWidth(sinCache);
  Value rotatedPart = rotated < headSize ? slice(x, 0, rotated) : x;
  Value result = build<nn::RotaryOp>(node, {rotatedPart, cos, sin},
                                     {builder.getNamedAttr("interleaved", builder.getBoolAttr(interleaved))});
  if (rotated < headSize)
    result = concatAlong(node, {result, slice(x, rotated, headSize)}, 3);
  if (shape.size() == 4)
    result = transposeBy(node, result, {0, 2, 1, 3});
  else
    result = reshapeTo(node, result, shape);
  define(node, 0, result);
}

void OnnxImporter::convertAttention(const onnx::NodeProto &node) {
  for (int index : {4, 5, 6})
    if (hasInput(node, index))
      fail(node, std::string(index == 6 ? "nonpad_kv_seqlen" : "past_key / past_value") +
                     " (a key-value cache for inference) is not supported in training");
  rejectUsedOutputs(node, 1, "present key / value or qk_matmul_output");
  for (const char *window : {"left_window_size", "right_window_size"})
    if (intAttr(node, window, -1) != -1)
      fail(node, std::string(window) + " (sliding-window attention) is not supported");
  Value q = operand(node, 0), k = operand(node, 1), v = operand(node, 2);
  auto qShape = typeOf(q).getShape();
  int64_t rank = qShape.size();
  if ((rank != 3 && rank != 4) || typeOf(k).getRank() != rank || typeOf(v).getRank() != rank)
    fail(node, "Q, K and V must all be 3-D (batch, sequence, hidden) or all 4-D (batch, heads, "
               "sequence, head size)");
  int64_t batch = qShape[0];
  // To (batch, heads, sequence, head size).
  auto toHeads = [&](Value value, int64_t heads) {
    auto shape = typeOf(value).getShape();
    if (heads <= 0 || shape[2] % heads != 0)
      fail(node, "3-D inputs need q_num_heads and kv_num_heads dividing their hidden sizes");
    Value split = reshapeTo(node, value, {shape[0], shape[1], heads, shape[2] / heads});
    return transposeBy(node, split, {0, 2, 1, 3});
  };
  if (rank == 3) {
    q = toHeads(q, intAttr(node, "q_num_heads", 0));
    int64_t kvHeads = intAttr(node, "kv_num_heads", 0);
    k = toHeads(k, kvHeads);
    v = toHeads(v, kvHeads);
  }
  int64_t queryHeads = typeOf(q).getDimSize(1), keyHeads = typeOf(k).getDimSize(1);
  int64_t querySequence = typeOf(q).getDimSize(2), keySequence = typeOf(k).getDimSize(2);
  if (typeOf(v).getDimSize(1) != keyHeads || keyHeads <= 0 || queryHeads % keyHeads != 0)
    fail(node, "the query heads (" + std::to_string(queryHeads) +
                   ") must be a multiple of the key and value heads (" + std::to_string(keyHeads) +
                   ")");
  if (queryHeads != keyHeads) {
    // Grouped-query attention: query head h reads key/value head
    // h / (queryHeads / keyHeads), each key/value head repeated in place.
    int64_t repeats = queryHeads / keyHeads;
    auto repeat = [&](Value value) {
      auto shape = typeOf(value).getShape();
      Value lifted = reshapeTo(node, value, {shape[0], shape[1], 1, shape[2], shape[3]});
      Value expanded = expandTo(node, lifted, {shape[0], shape[1], repeats, shape[2], shape[3]});
      return reshapeTo(node, expanded, {shape[0], queryHeads, shape[2], shape[3]});
    };
    k = repeat(k);
    v = repeat(v);
  }
  Location loc = locationOf(node);
  Value scores = build<nn::MatMulOp>(node, {q, transposeBy(node, k, {0, 1, 3, 2})}, {});
  double scale = 1.0 / std::sqrt(static_cast<double>(typeOf(q).getDimSize(3)));
  if (const onnx::AttributeProto *given = attribute(node, "scale"))
    scale = given->f();
  scores = build<nn::MulOp>(node, {scores, scalarLike(node, q, scale)});
  if (float softcap = floatAttr(node, "softcap", 0.0f); softcap > 0) {
    Value capped = build<nn::DivOp>(node, {scores, scalarLike(node, q, softcap)});
    capped = createVerified(node, nn::TanhOp::getOperationName(), {capped}, {capped.getType()}, {})
                 ->getResult(0);
    scores = build<nn::MulOp>(node, {capped, scalarLike(node, q, softcap)});
  }
  // The additive bias: 0 where attended, -inf where masked.
  const double masked = -std::numeric_limits<double>::infinity();
  if (hasInput(node, 3)) {
    Value mask = operand(node, 3);
    if (typeOf(mask).getDimSize(typeOf(mask).getRank() - 1) != keySequence)
      fail(node, "the mask's last dimension must be the key sequence length " +
                     std::to_string(keySequence));
    if (typeOf(mask).getElementType().isInteger(1))
      mask = build<nn::WhereOp>(node, {mask, scalarLike(node, q, 0.0), scalarLike(node, q, masked)},
                                {});
    scores = build<nn::AddOp>(node, {scores, mask});
  }
  if (intAttr(node, "is_causal", 0) != 0) {
    // Query i attends keys j <= i (no cache: the frontier starts at 0).
    std::vector<double> bias(querySequence * keySequence, 0.0);
    for (int64_t i = 0; i < querySequence; ++i)
      for (int64_t j = i + 1; j < keySequence; ++j)
        bias[i * keySequence + j] = masked;
    auto kind = *pipec::import::elementKindOf(typeOf(q).getElementType());
    scores = build<nn::AddOp>(
        node, {scores, materialize(HostTensor::ofFloats(kind, {querySequence, keySequence},
                                                        std::move(bias)),
                                   loc)});
  }
  Value probabilities = build<nn::SoftmaxOp>(
      node, {scores}, {builder.getNamedAttr("axis", builder.getI64IntegerAttr(-1))});
  Value result = build<nn::MatMulOp>(node, {probabilities, v}, {});
  if (rank == 3) {
    result = transposeBy(node, result, {0, 2, 1, 3});
    auto shape = typeOf(result).getShape();
    result = reshapeTo(node, result, {batch, shape[1], shape[2] * shape[3]});
  }
  define(node, 0, result);
}

} // namespace pipec::import::detail
