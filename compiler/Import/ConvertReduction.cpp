// Reductions and contractions lowered at import into `nn` ops that exist on
// both targets and have gradients (docs/importer.md): the ONNX Reduce*
// family as sums and means around element-wise ops, maxima as a max pool
// whose window is the reduced axes, LogSoftmax from those, ArgMax/ArgMin
// as the first (or last) position holding the maximum, and Einsum as
// transposes, reshapes and one batched matrix product per pair of operands.
#include "compiler/Import/ImporterImpl.h"

#include <cctype>
#include <cmath>
#include <numeric>

using namespace mlir;

namespace pipec::import::detail {
namespace {

int64_t productOf(ArrayRef<int64_t> dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<int64_t>());
}

/// `shape` with the reduced axes kept as 1 or dropped.
std::vector<int64_t> reducedShape(ArrayRef<int64_t> shape, ArrayRef<int64_t> axes, bool keepdims) {
  std::vector<int64_t> out;
  for (int64_t axis = 0; axis < static_cast<int64_t>(shape.size()); ++axis) {
    if (!llvm::is_contained(axes, axis))
      out.push_back(shape[axis]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

} // namespace

Value OnnxImporter::inFloat32(const onnx::NodeProto &node, Value value) {
  Type element = typeOf(value).getElementType();
  if (llvm::isa<FloatType>(element))
    return value;
  if (!element.isInteger(1) && element.getIntOrFloatBitWidth() > 16) // else exact in float32
    importNotes.push_back("node '" + nodeName(currentNodeIndex) + "' (" + node.op_type() +
                          ") computes on its integer values in float32: exact for magnitudes "
                          "up to 2^24 = 16777216");
  return castTo(node, value, builder.getF32Type());
}

std::optional<std::vector<int64_t>> OnnxImporter::reductionAxes(const onnx::NodeProto &node,
                                                                 int64_t rank,
                                                                 int64_t axesInputSince) {
  std::vector<int64_t> axes;
  if (nodeVersion >= axesInputSince) {
    if (auto given = optionalConstantInput(node, 1, "axes"))
      axes = given->toInts();
  } else {
    axes = intsAttr(node, "axes").value_or(std::vector<int64_t>{});
  }
  if (axes.empty() && intAttr(node, "noop_with_empty_axes", 0))
    return std::nullopt;
  if (axes.empty())
    for (int64_t axis = 0; axis < rank; ++axis)
      axes.push_back(axis);
  return normalizedAxes(node, axes, rank);
}

Value OnnxImporter::sumOver(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> axes,
                            bool keepdims, bool mean) {
  int64_t count = 1;
  for (int64_t axis : axes)
    count *= typeOf(input).getDimSize(axis);
  if (count == 0) // the sum of nothing (the mean of nothing is NaN, as ONNX's)
    return filledLike(node, input, reducedShape(typeOf(input).getShape(), axes, keepdims),
                      mean ? std::nan("") : 0.0);
  Value reduced = build<nn::ReduceMeanOp>(
      node, {input},
      {builder.getNamedAttr("axes", builder.getDenseI64ArrayAttr(axes)),
       builder.getNamedAttr("keepdims", builder.getBoolAttr(keepdims))});
  // The sum is the mean times the count: nn.reduce_mean has the gradient.
  if (mean || count == 1)
    return reduced;
  return build<nn::MulOp>(node, {reduced, scalarLike(node, reduced, count)});
}

Value OnnxImporter::maxOver(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> axes,
                            bool keepdims, bool minimum) {
  auto type = typeOf(input);
  auto shape = type.getShape();
  const int64_t rank = type.getRank();
  // The reduced axes last, then (kept, 1, reduced) for a 1-D max pool whose
  // window is the whole reduced extent: max pool has kernels on both
  // targets and a gradient (to one maximum per window; see docs/importer.md).
  std::vector<int64_t> perm;
  for (int64_t axis = 0; axis < rank; ++axis)
    if (!llvm::is_contained(axes, axis))
      perm.push_back(axis);
  const int64_t keptAxes = perm.size();
  perm.insert(perm.end(), axes.begin(), axes.end());
  int64_t kept = 1, window = 1;
  for (int64_t position = 0; position < rank; ++position)
    (position < keptAxes ? kept : window) *= shape[perm[position]];
  Type element = type.getElementType();
  if (!llvm::isa<FloatType>(element)) {
    // Integers (token ids) and booleans are compared as float32: exact for
    // integers up to 2^24, which the import notes for wide integers.
    if (window == 0)
      fail(node, "reduces an empty axis of integer values (no maximum)");
    return castTo(node, maxOver(node, inFloat32(node, input), axes, keepdims, minimum), element);
  }
  if (window == 0) // ONNX: the maximum of nothing is -inf (the minimum's +inf)
    return filledLike(node, input, reducedShape(shape, axes, keepdims),
                      minimum ? INFINITY : -INFINITY);
  Value x = reshapeTo(node, transposeBy(node, input, perm), {kept, 1, window});
  if (minimum)
    x = build<nn::NegOp>(node, {x});
  Value pooled = build<nn::MaxPoolOp>(
      node, {x},
      {builder.getNamedAttr("kernel_shape", builder.getDenseI64ArrayAttr({window})),
       builder.getNamedAttr("strides", builder.getDenseI64ArrayAttr({1})),
       builder.getNamedAttr("pads", builder.getDenseI64ArrayAttr({0, 0})),
       builder.getNamedAttr("dilations", builder.getDenseI64ArrayAttr({1})),
       builder.getNamedAttr("ceil_mode", builder.getBoolAttr(false))});
  if (minimum)
    pooled = build<nn::NegOp>(node, {pooled});
  return reshapeTo(node, pooled, reducedShape(shape, axes, keepdims));
}

void OnnxImporter::convertReduce(const onnx::NodeProto &node) {
  const std::string &op = node.op_type();
  Value input = operand(node, 0);
  const bool keepdims = intAttr(node, "keepdims", 1) != 0;
  auto axes = reductionAxes(node, typeOf(input).getRank(), op == "ReduceSum" ? 13 : 18);
  if (!axes) { // noop_with_empty_axes: the input as it is, whatever the reduction (ONNX)
    define(node, 0, input);
    return;
  }
  ArrayRef<int64_t> over = *axes;
  Type element = typeOf(input).getElementType();
  // Integer sums (a mask's count of tokens) run in float32 and are cast
  // back; integer maxima do so inside maxOver.
  const bool integerSum = !llvm::isa<FloatType>(element) && op != "ReduceMax" && op != "ReduceMin";
  if (integerSum && op != "ReduceSum" && op != "ReduceMean" && op != "ReduceSumSquare" &&
      op != "ReduceL1")
    fail(node, "of integer run-time values is not supported");
  Value x = integerSum ? inFloat32(node, input) : input;
  auto sum = [&](Value value) { return over.empty() ? value : sumOver(node, value, over, keepdims); };
  Value result;
  if (op == "ReduceMean")
    result = over.empty() ? x : sumOver(node, x, over, keepdims, /*mean=*/true);
  else if (op == "ReduceSum")
    result = sum(x);
  else if (op == "ReduceSumSquare")
    result = sum(build<nn::MulOp>(node, {x, x}));
  else if (op == "ReduceL1")
    result = sum(build<nn::AbsOp>(node, {x}));
  else if (op == "ReduceL2")
    result = build<nn::SqrtOp>(node, {sum(build<nn::MulOp>(node, {x, x}))});
  else if (op == "ReduceLogSum")
    result = build<nn::LogOp>(node, {sum(x)});
  else if (op == "ReduceMax" || op == "ReduceMin")
    result = over.empty() ? x : maxOver(node, x, over, keepdims, op == "ReduceMin");
  else if (op == "ReduceLogSumExp")
    result = over.empty() ? x : logSumExp(node, x, over, keepdims);
  else
    fail(node, "is not a reduction pipec lowers");
  define(node, 0, integerSum ? castTo(node, result, element) : result);
}

Value OnnxImporter::logSumExp(const onnx::NodeProto &node, Value input, ArrayRef<int64_t> axes,
                              bool keepdims) {
  // m + log(sum(exp(x - m))) with m the maximum: no overflow. The gradient
  // through m cancels (d/dm is 1 - sum(softmax) = 0).
  Value peak = maxOver(node, input, axes, /*keepdims=*/true);
  // An infinite maximum (a row of -inf, or one holding +inf) shifts by 0:
  // the result is then -inf or +inf, not inf - inf.
  Value infinite = build<nn::EqualOp>(
      node, {build<nn::AbsOp>(node, {peak}), scalarLike(node, peak, INFINITY)});
  peak = build<nn::WhereOp>(node, {infinite, scalarLike(node, peak, 0.0), peak});
  Value shifted = build<nn::SubOp>(node, {input, peak});
  Value sum = sumOver(node, build<nn::ExpOp>(node, {shifted}), axes, /*keepdims=*/true);
  Value result = build<nn::AddOp>(node, {build<nn::LogOp>(node, {sum}), peak});
  return reshapeTo(node, result, reducedShape(typeOf(input).getShape(), axes, keepdims));
}

void OnnxImporter::convertLogSoftmax(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto type = typeOf(input);
  int64_t axis = normalizedAxes(node, {intAttr(node, "axis", nodeVersion < 13 ? 1 : -1)},
                                type.getRank())[0];
  Value x = input;
  if (nodeVersion < 13) {
    // Versions 1 and 11 normalize over all axes from `axis` on, as Softmax.
    int64_t outer = productOf(type.getShape().take_front(axis));
    x = reshapeTo(node, input, {outer, type.getNumElements() / std::max<int64_t>(outer, 1)});
    axis = 1;
  }
  // (x - m) - log(sum(exp(x - m))) with m the maximum over the axis: x -
  // logsumexp(x) would round logsumexp at the magnitude of x.
  Value shifted = build<nn::SubOp>(node, {x, maxOver(node, x, {axis}, /*keepdims=*/true)});
  Value sum = sumOver(node, build<nn::ExpOp>(node, {shifted}), {axis}, /*keepdims=*/true);
  Value result = build<nn::SubOp>(node, {shifted, build<nn::LogOp>(node, {sum})});
  define(node, 0, reshapeTo(node, result, type.getShape()));
}

void OnnxImporter::convertArgMax(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto type = typeOf(input);
  const int64_t rank = type.getRank();
  const int64_t axis = normalizedAxes(node, {intAttr(node, "axis", 0)}, rank)[0];
  const bool keepdims = intAttr(node, "keepdims", 1) != 0;
  const bool last = intAttr(node, "select_last_index", 0) != 0;
  const bool minimum = node.op_type() == "ArgMin";
  // Integers (CLIP's end-of-text position from the token ids) compare as
  // float32, exact up to 2^24; beyond, values that round alike tie, and the
  // index is still one of them.
  Value x = inFloat32(node, input);
  Value extreme = maxOver(node, x, {axis}, /*keepdims=*/true, minimum);
  Value chosen = positionOf(node, x, extreme, axis, positionsAlong(node, type.getShape(), axis), last);
  if (!keepdims)
    chosen = reshapeTo(node, chosen, reducedShape(type.getShape(), {axis}, false));
  define(node, 0, castTo(node, chosen, builder.getI64Type()));
}

Value OnnxImporter::positionsAlong(const onnx::NodeProto &node, ArrayRef<int64_t> shape,
                                   int64_t axis) {
  std::vector<int64_t> positionShape(shape.size(), 1);
  positionShape[axis] = shape[axis];
  std::vector<double> positions(shape[axis]);
  std::iota(positions.begin(), positions.end(), 0.0);
  return materialize(HostTensor::ofFloats(ElementKind::Float32, positionShape, positions),
                     locationOf(node));
}

Value OnnxImporter::positionOf(const onnx::NodeProto &node, Value x, Value extreme, int64_t axis,
                               Value positions, bool last) {
  // The positions holding the extreme value; of those, the first (or last):
  // the smallest (or largest) position, a maximum over positions where the
  // others are replaced by a value no position reaches.
  const int64_t size = typeOf(x).getDimSize(axis);
  Value holds = build<nn::EqualOp>(node, {x, extreme});
  Value outside = scalarLike(node, positions, last ? -1.0 : static_cast<double>(size));
  Value candidates = build<nn::WhereOp>(node, {holds, positions, outside});
  return maxOver(node, candidates, {axis}, /*keepdims=*/true, /*minimum=*/!last);
}

/// TopK: k rounds of the extreme value, its first position, and that
/// position taken out (set to an infinity no value passes): the values are
/// differentiable (each round's maximum routes its gradient to the element it
/// took), the indices are not. Ties go to the lower index, as ONNX says.
void OnnxImporter::convertTopK(const onnx::NodeProto &node) {
  Value input = operand(node, 0);
  auto type = typeOf(input);
  const int64_t rank = type.getRank();
  const int64_t axis = normalizedAxes(node, {intAttr(node, "axis", -1)}, rank)[0];
  int64_t k = intAttr(node, "k", -1);
  if (nodeVersion >= 10) {
    const HostTensor &given = constantInput(node, 1, "K");
    if (given.numElements() != 1)
      fail(node, "K must hold one value");
    k = given.asInt(0);
  }
  const int64_t size = type.getDimSize(axis);
  constexpr int64_t kMostRounds = 64; // the lowering grows by ~8 ops a round
  if (k < 0 || k > size || k > kMostRounds)
    fail(node, "k = " + std::to_string(k) + " must be in [0, " + std::to_string(size) +
                   "] (the axis) and at most " + std::to_string(kMostRounds) +
                   " (TopK is unrolled, one round per element)");
  if (k == 0)
    fail(node, "k = 0 gives empty outputs");
  const bool largest = intAttr(node, "largest", 1) != 0;
  Value x = inFloat32(node, input);
  Value positions = positionsAlong(node, type.getShape(), axis);
  Value taken = scalarLike(node, x, largest ? -INFINITY : INFINITY);
  SmallVector<Value> values, indices;
  Value remaining = x;
  for (int64_t round = 0; round < k; ++round) {
    Value extreme = maxOver(node, remaining, {axis}, /*keepdims=*/true, /*minimum=*/!largest);
    Value index = positionOf(node, remaining, extreme, axis, positions, /*last=*/false);
    values.push_back(extreme);
    indices.push_back(index);
    if (round + 1 < k)
      remaining = build<nn::WhereOp>(
          node, {build<nn::EqualOp>(node, {positions, index}), taken, remaining});
  }
  define(node, 0, castTo(node, concatAlong(node, values, axis), type.getElementType()));
  if (node.output_size() > 1 && !node.output(1).empty())
    define(node, 1, castTo(node, concatAlong(node, indices, axis), builder.getI64Type()));
}

namespace {
/// One operand of an Einsum equation: a label per axis; ellipsis axes get
/// labels of their own, numbered from the right so that they broadcast.
struct EinsumTerm {
  std::vector<std::string> labels;
};

constexpr const char *kEllipsisPrefix = "...";

/// The operands' terms as written: the comma-separated list before the arrow.
std::vector<std::string> operandTexts(const std::string &equation, size_t arrow) {
  std::string inputsText = equation.substr(0, arrow);
  std::vector<std::string> inputTexts;
  for (size_t start = 0;;) {
    size_t comma = inputsText.find(',', start);
    inputTexts.push_back(inputsText.substr(start, comma - start));
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return inputTexts;
}

/// Parses one term against its operand's rank; `rank` < 0 for the output.
/// `ellipsisRank`: the most axes an operand's ellipsis stands for so far.
EinsumTerm parseEinsumTerm(OnnxImporter &im, const onnx::NodeProto &node, const std::string &equation,
                           const std::string &text, int64_t rank, int64_t &ellipsisRank) {
  EinsumTerm term;
  size_t dots = text.find("...");
  int64_t letters = 0;
  for (char c : text)
    if (std::isalpha(static_cast<unsigned char>(c)))
      ++letters;
    else if (c != '.')
      im.fail(node, "equation '" + equation + "': '" + std::string(1, c) + "' is not a label");
  if (letters + (dots == std::string::npos ? 0 : 3) != static_cast<int64_t>(text.size()) ||
      (dots != std::string::npos && text.find("...", dots + 1) != std::string::npos))
    im.fail(node, "equation '" + equation + "': malformed term '" + text + "'");
  int64_t extra = dots == std::string::npos ? 0 : (rank >= 0 ? rank - letters : ellipsisRank);
  if (rank >= 0 && (extra < 0 || (dots == std::string::npos && letters != rank)))
    im.fail(node, "equation '" + equation + "': term '" + text + "' does not fit rank " +
                      std::to_string(rank));
  if (rank >= 0)
    ellipsisRank = std::max(ellipsisRank, extra);
  for (size_t i = 0; i < text.size(); ++i) {
    if (i == dots) {
      for (int64_t e = extra; e > 0; --e)
        term.labels.push_back(kEllipsisPrefix + std::to_string(e));
      i += 2;
    } else {
      term.labels.push_back(std::string(1, text[i]));
    }
  }
  return term;
}

/// A label repeated within one operand takes the diagonal: the two axes
/// side by side, merged, and gathered at every (size + 1)-th position.
/// Returns the operand without the repeats, and drops them from `labels`.
Value takeDiagonals(OnnxImporter &im, const onnx::NodeProto &node, const std::string &equation, Value value,
                    std::vector<std::string> &labels) {
  for (size_t second = 1; second < labels.size(); ++second) {
    size_t first = std::find(labels.begin(), labels.end(), labels[second]) - labels.begin();
    if (first == second)
      continue;
    auto shape = im.typeOf(value).getShape();
    if (shape[first] != shape[second])
      im.fail(node, "equation '" + equation + "': label '" + labels[first] + "' has sizes " +
                        std::to_string(shape[first]) + " and " + std::to_string(shape[second]));
    std::vector<int64_t> perm;
    for (size_t axis = 0; axis < labels.size(); ++axis)
      if (axis != second)
        perm.push_back(axis);
    perm.insert(perm.begin() + first + 1, second);
    Value adjacent = im.transposeBy(node, value, perm);
    std::vector<int64_t> merged;
    for (size_t position = 0; position < perm.size(); ++position)
      if (position == first + 1)
        merged.back() *= shape[perm[position]];
      else
        merged.push_back(shape[perm[position]]);
    const int64_t size = shape[first];
    std::vector<int64_t> diagonal(size);
    for (int64_t i = 0; i < size; ++i)
      diagonal[i] = i * (size + 1);
    Value indices = im.materialize(HostTensor::ofInts(ElementKind::Int64, {size}, diagonal),
                                   im.locationOf(node));
    Builder attributes(value.getContext());
    value = im.build<nn::GatherOp>(
        node, {im.reshapeTo(node, adjacent, merged), indices},
        {attributes.getNamedAttr("axis", attributes.getI64IntegerAttr(static_cast<int64_t>(first)))});
    labels.erase(labels.begin() + second);
    --second;
  }
  return value;
}

/// Records each label's size; sizes of one label must agree, but for 1,
/// which broadcasts.
void recordLabelSizes(OnnxImporter &im, const onnx::NodeProto &node, const std::string &equation, Value value,
                      const std::vector<std::string> &labels, std::map<std::string, int64_t> &sizes) {
  for (auto [axis, label] : llvm::enumerate(labels)) {
    int64_t size = im.typeOf(value).getDimSize(axis);
    auto [it, inserted] = sizes.insert({label, size});
    if (!inserted && it->second != size) {
      if (it->second != 1 && size != 1)
        im.fail(node, "equation '" + equation + "': label '" + label + "' has sizes " +
                          std::to_string(it->second) + " and " + std::to_string(size));
      it->second = std::max(it->second, size);
    }
  }
}

/// The output's labels: as written after the arrow, else (implicit output)
/// the ellipsis axes, then the labels used once, sorted.
EinsumTerm einsumOutput(OnnxImporter &im, const onnx::NodeProto &node, const std::string &equation, size_t arrow,
                        int64_t ellipsisRank, const std::map<std::string, int> &uses,
                        const std::map<std::string, int64_t> &sizes) {
  EinsumTerm output;
  if (arrow != std::string::npos) {
    output = parseEinsumTerm(im, node, equation, equation.substr(arrow + 2), -1, ellipsisRank);
    for (const std::string &label : output.labels)
      if (!sizes.count(label))
        im.fail(node, "equation '" + equation + "': output label '" + label +
                          "' is in no operand");
  } else {
    // Implicit output: the ellipsis axes, then the labels used once, sorted.
    for (int64_t e = ellipsisRank; e > 0; --e)
      output.labels.push_back(kEllipsisPrefix + std::to_string(e));
    for (const auto &[label, count] : uses)
      if (count == 1 && label.rfind(kEllipsisPrefix, 0) != 0)
        output.labels.push_back(label);
  }
  return output;
}

/// The operands contracted left to right, one batched matrix product per
/// pair, each label summed out as soon as nothing later needs it.
class EinsumContraction {
public:
  EinsumContraction(OnnxImporter &im, const onnx::NodeProto &node, const std::string &equation,
                    const std::vector<EinsumTerm> &terms, const EinsumTerm &output,
                    const std::map<std::string, int64_t> &sizes)
      : im(im), node(node), equation(equation), terms(terms), output(output), sizes(sizes) {}

  Value run(const std::vector<Value> &values) {
    Value result = values[0];
    std::vector<std::string> labels = terms[0].labels;
    {
      std::set<std::string> keep = neededAfter(0);
      result = sumOut(result, labels, keep);
    }
    for (size_t index = 1; index < terms.size(); ++index)
      result = multiply(result, labels, index, values[index]);
    // The output: sum what it lacks, broadcast what a single operand had as 1.
    std::set<std::string> outputLabels(output.labels.begin(), output.labels.end());
    result = sumOut(result, labels, outputLabels);
    if (labels.size() != output.labels.size())
      im.fail(node, "equation '" + equation + "': the output repeats a label");
    result = arrangeLabels(result, labels, output.labels);
    return im.expandTo(node, result, shapeOf(output.labels));
  }

private:
  std::vector<int64_t> shapeOf(const std::vector<std::string> &labels) const {
    std::vector<int64_t> shape;
    for (const std::string &label : labels)
      shape.push_back(sizes.at(label));
    return shape;
  }
  // Labels still needed after operand `index`: the output's and later operands'.
  std::set<std::string> neededAfter(size_t index) const {
    std::set<std::string> needed(output.labels.begin(), output.labels.end());
    for (size_t later = index + 1; later < terms.size(); ++later)
      needed.insert(terms[later].labels.begin(), terms[later].labels.end());
    return needed;
  }
  // Sums out the labels of `labels` that are not in `keep`.
  Value sumOut(Value value, std::vector<std::string> &labels, const std::set<std::string> &keep) {
    std::vector<int64_t> axes;
    std::vector<std::string> rest;
    for (auto [axis, label] : llvm::enumerate(labels))
      if (keep.count(label))
        rest.push_back(label);
      else
        axes.push_back(axis);
    labels = rest;
    return axes.empty() ? value : im.sumOver(node, value, axes, /*keepdims=*/false);
  }
  // Transposes `value` (labelled `from`) into the order `to`, a permutation.
  Value arrangeLabels(Value value, const std::vector<std::string> &from, const std::vector<std::string> &to) {
    std::vector<int64_t> perm;
    for (const std::string &label : to)
      perm.push_back(std::find(from.begin(), from.end(), label) - from.begin());
    return im.transposeBy(node, value, perm);
  }
  // The product so far (labelled `labels`, updated) times operand `index`.
  Value multiply(Value result, std::vector<std::string> &labels, size_t index, Value operandValue) {
    std::set<std::string> needed = neededAfter(index);
    // Labels only this operand has and nothing later needs: summed first.
    std::vector<std::string> right = terms[index].labels;
    std::set<std::string> rightKeep(needed);
    rightKeep.insert(labels.begin(), labels.end());
    Value other = sumOut(operandValue, right, rightKeep);
    std::set<std::string> leftKeep(needed);
    leftKeep.insert(right.begin(), right.end());
    result = sumOut(result, labels, leftKeep);
    // batch: in both and needed; contracted: in both, not needed; then each
    // side's own labels (all needed after the sums above).
    std::vector<std::string> batch, contracted, leftOnly, rightOnly;
    for (const std::string &label : labels) {
      bool shared = llvm::is_contained(right, label);
      (shared ? (needed.count(label) ? batch : contracted) : leftOnly).push_back(label);
    }
    for (const std::string &label : right)
      if (!llvm::is_contained(labels, label))
        rightOnly.push_back(label);
    // Broadcast size-1 batch axes to the common size.
    std::vector<std::string> leftOrder = batch, rightOrder = batch;
    leftOrder.insert(leftOrder.end(), leftOnly.begin(), leftOnly.end());
    leftOrder.insert(leftOrder.end(), contracted.begin(), contracted.end());
    rightOrder.insert(rightOrder.end(), contracted.begin(), contracted.end());
    rightOrder.insert(rightOrder.end(), rightOnly.begin(), rightOnly.end());
    Value lhs = im.expandTo(node, arrangeLabels(result, labels, leftOrder), shapeOf(leftOrder));
    Value rhs = im.expandTo(node, arrangeLabels(other, right, rightOrder), shapeOf(rightOrder));
    const int64_t batchSize = productOf(shapeOf(batch)), m = productOf(shapeOf(leftOnly)),
                  k = productOf(shapeOf(contracted)), n = productOf(shapeOf(rightOnly));
    Value product = im.build<nn::MatMulOp>(node, {im.reshapeTo(node, lhs, {batchSize, m, k}),
                                                  im.reshapeTo(node, rhs, {batchSize, k, n})});
    labels = batch;
    labels.insert(labels.end(), leftOnly.begin(), leftOnly.end());
    labels.insert(labels.end(), rightOnly.begin(), rightOnly.end());
    return im.reshapeTo(node, product, shapeOf(labels));
  }

  OnnxImporter &im;
  const onnx::NodeProto &node;
  const std::string &equation;
  const std::vector<EinsumTerm> &terms;
  const EinsumTerm &output;
  const std::map<std::string, int64_t> &sizes;
};

} // namespace

void OnnxImporter::convertEinsum(const onnx::NodeProto &node) {
  std::string equation = stringAttr(node, "equation", "");
  equation.erase(std::remove(equation.begin(), equation.end(), ' '), equation.end());
  const size_t arrow = equation.find("->");
  const std::vector<std::string> inputTexts = operandTexts(equation, arrow);
  if (static_cast<int>(inputTexts.size()) != node.input_size())
    fail(node, "equation '" + equation + "' names " + std::to_string(inputTexts.size()) +
                   " operands, the node has " + std::to_string(node.input_size()));

  int64_t ellipsisRank = 0;
  std::vector<EinsumTerm> terms;
  std::vector<Value> values;
  std::map<std::string, int> uses;
  std::map<std::string, int64_t> sizes;
  for (int index = 0; index < node.input_size(); ++index) {
    Value value = operand(node, index);
    if (!llvm::isa<FloatType>(typeOf(value).getElementType()))
      fail(node, "Einsum on integer operands is not supported");
    terms.push_back(parseEinsumTerm(*this, node, equation, inputTexts[index], typeOf(value).getRank(), ellipsisRank));
    auto &labels = terms.back().labels;
    for (const std::string &label : labels) // as written: a diagonal's label is used twice
      ++uses[label];
    value = takeDiagonals(*this, node, equation, value, labels);
    values.push_back(value);
    recordLabelSizes(*this, node, equation, value, labels, sizes);
  }
  const EinsumTerm output = einsumOutput(*this, node, equation, arrow, ellipsisRank, uses, sizes);
  define(node, 0, EinsumContraction(*this, node, equation, terms, output, sizes).run(values));
}

} // namespace pipec::import::detail
