// The ONNX sequence operators that exporters write for torch.split,
// torch.chunk and torch.unbind (SplitToSequence, SequenceAt,
// SequenceConstruct, ConcatFromSequence): lowered at import to ordinary
// tensors, since every sequence pipec meets has a length and element shapes
// known from static shapes (docs/importer.md).
#include "compiler/Import/ImporterImpl.h"

using namespace mlir;

namespace pipec::import::detail {

const std::vector<Value> &OnnxImporter::sequenceOperand(const onnx::NodeProto &node, int index) {
  if (!hasInput(node, index))
    fail(node, "input " + std::to_string(index) + " (a sequence) is required");
  auto it = sequences.find(node.input(index));
  if (it == sequences.end())
    fail(node, "input '" + node.input(index) +
                   "' is not a sequence built by SplitToSequence or SequenceConstruct "
                   "(the sequences pipec lowers)");
  return it->second;
}

void OnnxImporter::convertSplitToSequence(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto shape = typeOf(input).getShape();
  int64_t axis = normalizedAxes(node, {intAttr(node, "axis", 0)}, shape.size())[0];
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (auto split = optionalConstantInput(node, 1, "split")) {
    std::vector<int64_t> given = split->toInts();
    if (split->shape.empty()) {
      // A scalar: pieces of that size, the last one smaller.
      if (given[0] < 1)
        fail(node, "split " + std::to_string(given[0]) + " must be positive");
      for (int64_t left = shape[axis]; left > 0; left -= given[0])
        sizes.push_back(std::min(given[0], left));
    } else {
      sizes = given;
    }
  } else {
    // No split: pieces of size 1, squeezed unless keepdims.
    sizes.assign(shape[axis], 1);
    squeeze = intAttr(node, "keepdims", 1) == 0;
  }
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0)
      fail(node, "split sizes must not be negative");
    total += size;
  }
  if (total != shape[axis])
    fail(node, "split sizes add up to " + std::to_string(total) + " but axis " +
                   std::to_string(axis) + " has " + std::to_string(shape[axis]));
  Operation *split = createInferred<nn::SplitOp>(
      node, {input},
      {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis)),
       builder.getNamedAttr("sizes", builder.getDenseI64ArrayAttr(sizes))});
  std::vector<Value> pieces(split->getResults().begin(), split->getResults().end());
  if (squeeze)
    for (Value &piece : pieces)
      piece =
          createInferred<nn::SqueezeOp>(
              node, {piece}, {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr({axis}))})
              ->getResult(0);
  sequences[node.output(0)] = std::move(pieces);
}

void OnnxImporter::convertSequenceConstruct(const onnx::NodeProto &node) {
  std::vector<Value> elements;
  for (int i = 0; i < node.input_size(); ++i)
    elements.push_back(operand(node, i));
  sequences[node.output(0)] = std::move(elements);
}

void OnnxImporter::convertSequenceAt(const onnx::NodeProto &node) {
  const std::vector<Value> &sequence = sequenceOperand(node, 0);
  std::vector<int64_t> position = constantInput(node, 1, "position").toInts();
  if (position.size() != 1)
    fail(node, "position must hold one value");
  int64_t length = static_cast<int64_t>(sequence.size());
  int64_t index = position[0] < 0 ? position[0] + length : position[0];
  if (index < 0 || index >= length)
    fail(node, "position " + std::to_string(position[0]) + " is outside the sequence of " +
                   std::to_string(length) + " tensors");
  define(node, 0, sequence[index]);
}

void OnnxImporter::convertConcatFromSequence(const onnx::NodeProto &node) {
  std::vector<Value> elements = sequenceOperand(node, 0);
  if (elements.empty())
    fail(node, "the sequence is empty");
  if (!attribute(node, "axis"))
    fail(node, "axis is required");
  int64_t axis = intAttr(node, "axis", 0);
  if (intAttr(node, "new_axis", 0) != 0) {
    // Stacked: each element gains the axis (counted in the output's rank).
    int64_t normalized = normalizedAxes(node, {axis}, typeOf(elements[0]).getRank() + 1)[0];
    for (Value &element : elements)
      element = createInferred<nn::UnsqueezeOp>(
                    node, {element},
                    {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr({normalized}))})
                    ->getResult(0);
    axis = normalized;
  }
  defineInferred<nn::ConcatOp>(node, SmallVector<Value>(elements.begin(), elements.end()),
                               {builder.getNamedAttr("axis", builder.getI64IntegerAttr(axis))});
}

} // namespace pipec::import::detail
