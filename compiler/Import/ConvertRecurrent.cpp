// The recurrent operators (RNN, GRU, LSTM) unrolled at import over their
// static sequence length into `nn` ops that exist on both targets and have
// gradients (docs/importer.md): the input projection of every step is one
// matrix product, then each step adds the recurrent product and applies the
// gates, in ONNX's equations and gate order.
#include "compiler/Import/ImporterImpl.h"

using namespace mlir;

namespace pipec::import::detail {

void OnnxImporter::convertRecurrent(const onnx::NodeProto &node) {
  const std::string &op = node.op_type();
  const int64_t gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  Value x = operand(node, 0), w = operand(node, 1), r = operand(node, 2);
  const int64_t layout = intAttr(node, "layout", 0);
  if (layout != 0 && layout != 1)
    fail(node, "layout must be 0 or 1");
  if (typeOf(x).getRank() != 3)
    fail(node, "X must be 3-D");
  if (layout == 1) // (batch, sequence, input) -> (sequence, batch, input)
    x = transposeBy(node, x, {1, 0, 2});
  auto xShape = typeOf(x).getShape();
  const int64_t steps = xShape[0], batch = xShape[1], inputSize = xShape[2];
  const std::string direction = stringAttr(node, "direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    fail(node, "unknown direction '" + direction + "'");
  const int64_t directions = direction == "bidirectional" ? 2 : 1;
  const int64_t hidden = intAttr(node, "hidden_size", 0);
  if (hidden < 1 || steps < 1)
    fail(node, "needs a positive hidden_size and at least one step");
  auto wShape = typeOf(w).getShape(), rShape = typeOf(r).getShape();
  if (ArrayRef<int64_t>(wShape) != ArrayRef<int64_t>{directions, gates * hidden, inputSize} ||
      ArrayRef<int64_t>(rShape) != ArrayRef<int64_t>{directions, gates * hidden, hidden})
    fail(node, "W must be [" + std::to_string(directions) + "," + std::to_string(gates * hidden) +
                   "," + std::to_string(inputSize) + "] and R [" + std::to_string(directions) +
                   "," + std::to_string(gates * hidden) + "," + std::to_string(hidden) + "]");
  if (hasInput(node, 4)) {
    // Every sequence full length: the lengths change nothing; others are refused.
    auto lengths = optionalConstantInput(node, 4, "sequence_lens");
    if (!lengths || llvm::any_of(lengths->toInts(), [&](int64_t n) { return n != steps; }))
      fail(node, "sequence_lens other than the full length " + std::to_string(steps) +
                     " (padded batches) are not supported");
  }
  if (intAttr(node, "input_forget", 0) != 0)
    fail(node, "input_forget (coupled input and forget gates) is not supported");
  if (attribute(node, "activation_alpha") || attribute(node, "activation_beta"))
    fail(node, "activations with alpha or beta parameters are not supported");

  // The activations, per direction: f, g (and h for LSTM), ONNX's defaults.
  std::vector<std::string> defaults = op == "RNN"   ? std::vector<std::string>{"Tanh"}
                                      : op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                    : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  std::vector<std::string> activations;
  if (const auto *given = attribute(node, "activations"))
    activations.assign(given->strings().begin(), given->strings().end());
  else
    for (int64_t d = 0; d < directions; ++d)
      activations.insert(activations.end(), defaults.begin(), defaults.end());
  if (activations.size() != defaults.size() * directions)
    fail(node, "activations needs " + std::to_string(defaults.size() * directions) + " names");
  auto activate = [&](const std::string &name, Value value) -> Value {
    if (name == "Sigmoid")
      return build<nn::SigmoidOp>(node, {value});
    if (name == "Tanh")
      return build<nn::TanhOp>(node, {value});
    if (name == "Relu")
      return build<nn::ReluOp>(node, {value});
    fail(node, "activation '" + name + "' is not supported (Sigmoid, Tanh, Relu)");
  };
  std::optional<double> clipAt;
  if (attribute(node, "clip"))
    clipAt = floatAttr(node, "clip", 0.0f);
  auto clipped = [&](Value value) {
    return clipAt ? clip(node, value, scalarLike(node, value, -*clipAt),
                         scalarLike(node, value, *clipAt), /*inclusive=*/true)
                  : value;
  };
  const bool linearBeforeReset = intAttr(node, "linear_before_reset", 0) != 0;

  auto slice = [&](Value value, int64_t axis, int64_t start, int64_t end) {
    return sliceAxis(node, value, axis, start, end, 1);
  };
  // Slices [direction] of a [directions, ...] operand, as [...].
  auto ofDirection = [&](Value value, int64_t d) {
    auto shape = typeOf(value).getShape();
    return reshapeTo(node, slice(value, 0, d, d + 1), shape.drop_front());
  };
  auto gate = [&](Value value, int64_t index) { // the index-th block of `hidden` on the last axis
    int64_t axis = typeOf(value).getRank() - 1;
    return slice(value, axis, index * hidden, (index + 1) * hidden);
  };
  auto initial = [&](int index, int64_t d) -> Value {
    if (!hasInput(node, index))
      return filledLike(node, x, {batch, hidden}, 0.0);
    Value given = operand(node, index);
    if (layout == 1) // (batch, directions, hidden)
      given = transposeBy(node, given, {1, 0, 2});
    if (typeOf(given).getShape() != ArrayRef<int64_t>{directions, batch, hidden})
      fail(node, "initial states must be [" + std::to_string(directions) + "," +
                     std::to_string(batch) + "," + std::to_string(hidden) + "]");
    return ofDirection(given, d);
  };

  Value flatX = reshapeTo(node, x, {steps * batch, inputSize});
  std::vector<Value> outputs, lastHidden, lastCell;
  for (int64_t d = 0; d < directions; ++d) {
    const bool backwards = direction == "reverse" || d == 1;
    auto act = [&](size_t which) { return activations[d * defaults.size() + which]; };
    // Every step's input projection at once: X W^T (+ Wb), [steps, batch, gates*hidden].
    Value projected = build<nn::MatMulOp>(node, {flatX, transposeBy(node, ofDirection(w, d), {1, 0})});
    Value recurrentBias;
    if (hasInput(node, 3)) {
      Value bias = ofDirection(operand(node, 3), d); // [2 * gates * hidden]: Wb then Rb
      if (typeOf(bias).getShape() != ArrayRef<int64_t>{2 * gates * hidden})
        fail(node, "B must be [" + std::to_string(directions) + "," +
                       std::to_string(2 * gates * hidden) + "]");
      projected = build<nn::AddOp>(node, {projected, slice(bias, 0, 0, gates * hidden)});
      recurrentBias = slice(bias, 0, gates * hidden, 2 * gates * hidden);
    }
    projected = reshapeTo(node, projected, {steps, batch, gates * hidden});
    Value recurrent = transposeBy(node, ofDirection(r, d), {1, 0}); // [hidden, gates*hidden]
    // Loop-invariant slices, taken once: GRU's gates z and r (and, with
    // linear_before_reset, the candidate's) read H R^T; without it the
    // candidate reads (r ⊙ H) R_h^T + Rb_h. LSTM's peepholes P = [Pi, Po, Pf].
    const bool gruSplit = op == "GRU" && !linearBeforeReset;
    Value gruGatesR = gruSplit ? slice(recurrent, 1, 0, 2 * hidden) : recurrent;
    Value gruGatesBias =
        gruSplit && recurrentBias ? slice(recurrentBias, 0, 0, 2 * hidden) : recurrentBias;
    Value gruCandidateR = gruSplit ? slice(recurrent, 1, 2 * hidden, 3 * hidden) : Value();
    Value gruCandidateBias = gruSplit && recurrentBias ? gate(recurrentBias, 2) : Value();
    SmallVector<Value, 3> peepholes;
    if (hasInput(node, 7)) {
      Value all = ofDirection(operand(node, 7), d);
      for (int64_t index = 0; index < 3; ++index)
        peepholes.push_back(gate(all, index));
    }
    Value h = initial(5, d), c = op == "LSTM" ? initial(6, d) : Value();
    std::vector<Value> perStep(steps);
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t t = backwards ? steps - 1 - i : i;
      Value input = reshapeTo(node, slice(projected, 0, t, t + 1), {batch, gates * hidden});
      if (op == "GRU") {
        // Gates z, r, h; without linear_before_reset the candidate's
        // recurrent product needs r first.
        Value hr = build<nn::MatMulOp>(node, {h, gruGatesR});
        if (gruGatesBias)
          hr = build<nn::AddOp>(node, {hr, gruGatesBias});
        Value z = activate(act(0), clipped(build<nn::AddOp>(node, {gate(input, 0), gate(hr, 0)})));
        Value reset = activate(act(0), clipped(build<nn::AddOp>(node, {gate(input, 1), gate(hr, 1)})));
        Value candidate;
        if (linearBeforeReset) {
          candidate = build<nn::MulOp>(node, {reset, gate(hr, 2)});
        } else {
          Value product =
              build<nn::MatMulOp>(node, {build<nn::MulOp>(node, {reset, h}), gruCandidateR});
          candidate =
              gruCandidateBias ? build<nn::AddOp>(node, {product, gruCandidateBias}) : product;
        }
        Value ht = activate(act(1), clipped(build<nn::AddOp>(node, {gate(input, 2), candidate})));
        // H = (1 - z) h~ + z H = h~ + z (H - h~)
        h = build<nn::AddOp>(node, {ht, build<nn::MulOp>(node, {z, build<nn::SubOp>(node, {h, ht})})});
      } else {
        Value sum = build<nn::AddOp>(node, {input, build<nn::MatMulOp>(node, {h, recurrent})});
        if (recurrentBias)
          sum = build<nn::AddOp>(node, {sum, recurrentBias});
        if (op == "RNN") {
          h = activate(act(0), clipped(sum));
        } else {
          // Gates i, o, f, c; the peepholes read the cell.
          auto peep = [&](Value pre, int64_t index, Value cell) {
            return peepholes.empty()
                       ? pre
                       : build<nn::AddOp>(node,
                                          {pre, build<nn::MulOp>(node, {peepholes[index], cell})});
          };
          Value in = activate(act(0), clipped(peep(gate(sum, 0), 0, c)));
          Value forget = activate(act(0), clipped(peep(gate(sum, 2), 2, c)));
          Value cell = activate(act(1), clipped(gate(sum, 3)));
          c = build<nn::AddOp>(node, {build<nn::MulOp>(node, {forget, c}),
                                      build<nn::MulOp>(node, {in, cell})});
          Value out = activate(act(0), clipped(peep(gate(sum, 1), 1, c)));
          h = build<nn::MulOp>(node, {out, activate(act(2), c)});
        }
      }
      perStep[t] = reshapeTo(node, h, {1, 1, batch, hidden});
    }
    outputs.push_back(concatAlong(node, perStep, 0));
    lastHidden.push_back(reshapeTo(node, h, {1, batch, hidden}));
    if (c)
      lastCell.push_back(reshapeTo(node, c, {1, batch, hidden}));
  }
  Value y = concatAlong(node, outputs, 1);     // [steps, directions, batch, hidden]
  Value yh = concatAlong(node, lastHidden, 0); // [directions, batch, hidden]
  if (layout == 1) {
    y = transposeBy(node, y, {2, 0, 1, 3}); // [batch, steps, directions, hidden]
    yh = transposeBy(node, yh, {1, 0, 2});  // [batch, directions, hidden]
  }
  if (node.output_size() > 0 && !node.output(0).empty())
    define(node, 0, y);
  if (node.output_size() > 1 && !node.output(1).empty())
    define(node, 1, yh);
  if (op == "LSTM" && node.output_size() > 2 && !node.output(2).empty()) {
    Value yc = concatAlong(node, lastCell, 0);
    define(node, 2, layout == 1 ? transposeBy(node, yc, {1, 0, 2}) : yc);
  }
}

} // namespace pipec::import::detail
