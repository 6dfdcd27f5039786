// Re-specialization: the per-op shape rules of the walk (RespecializeInternal.h).
#include "compiler/Import/RespecializeInternal.h"

namespace pipec::import::detail::respecialize {


void Respecializer::reshapeRule(int nodeIndex) {
  const auto &node = model.graph().node(nodeIndex);
  SymTensor input = operand(nodeIndex, 0);
  std::vector<SymDim> target;
  if (node.input_size() > 1)
    target = valuesOf(nodeIndex, 1, "the target shape");
  else if (auto shape = intsAttr(node, "shape"))
    for (int64_t v : *shape)
      target.push_back(fixed(v));
  SymTensor out;
  out.known = true;
  out.dims = reshapeTargets(node, input.dims, target, intAttr(node, "allowzero", 0) != 0);
  out.values = input.values;
  define(node, 0, out);
}

void Respecializer::sliceRule(int nodeIndex) {
  const auto &node = model.graph().node(nodeIndex);
  SymTensor data = operand(nodeIndex, 0);
  std::vector<SymDim> starts, ends;
  std::vector<int64_t> axes, steps;
  if (node.input_size() > 1) {
    starts = valuesOf(nodeIndex, 1, "Slice's starts");
    ends = valuesOf(nodeIndex, 2, "Slice's ends");
    if (hasInput(node, 3))
      axes = constantInts(nodeIndex, 3, "Slice's axes");
    if (hasInput(node, 4))
      steps = constantInts(nodeIndex, 4, "Slice's steps");
  } else {
    for (int64_t v : intsAttr(node, "starts").value_or(std::vector<int64_t>{}))
      starts.push_back(fixed(v));
    for (int64_t v : intsAttr(node, "ends").value_or(std::vector<int64_t>{}))
      ends.push_back(fixed(v));
    axes = intsAttr(node, "axes").value_or(std::vector<int64_t>{});
  }
  const int64_t rank = static_cast<int64_t>(data.dims.size());
  if (axes.empty())
    for (size_t k = 0; k < starts.size(); ++k)
      axes.push_back(static_cast<int64_t>(k));
  if (steps.empty())
    steps.assign(starts.size(), 1);
  if (starts.size() != ends.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(node, "starts, ends, axes and steps differ in length");
  SymTensor out = data;
  out.values.reset();
  constexpr int64_t kOpenEnd = int64_t(1) << 40; // exporters write INT64_MAX (or INT32_MAX) for "to the end"
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t axis = axes[k] < 0 ? axes[k] + rank : axes[k];
    if (axis < 0 || axis >= rank)
      fail(node, "axis out of range");
    const SymDim &dim = data.dims[axis];
    const int64_t size = tracedValue(dim.poly);
    const int64_t step = steps[k];
    const int64_t s = tracedValue(starts[k].poly), e = tracedValue(ends[k].poly);
    bool symbolicBounds = !starts[k].poly.isConstant() || !ends[k].poly.isConstant();
    if (dim.poly.isConstant() && !symbolicBounds) {
      // A fixed dimension: the result is fixed too, unless the window is a
      // constant prefix [0, e) that a later use ties to a symbol.
      int64_t begin = s < 0 ? std::max<int64_t>(0, s + size) : std::min(s, size);
      int64_t end = e < 0 ? std::max<int64_t>(0, e + size) : std::min(e, size);
      SymDim d = fixed(step == 1 ? std::max<int64_t>(0, end - begin) : 0);
      if (step == 1 && e >= 0 && e <= size && s >= 0 && ends[k].slot >= 0) {
        d.slot = ends[k].slot;
        d.offset = -s;
      }
      if (step != 1)
        d = fixed(step > 0 ? std::max<int64_t>(0, (end - begin + step - 1) / step)
                           : std::max<int64_t>(0, (begin - end - step - 1) / -step));
      out.dims[axis] = d;
      continue;
    }
    if (step != 1) {
      bool whole = step == -1 && s >= size - 1 && e <= -size - 1;
      if (!whole)
        fail(node, "a slice with step " + std::to_string(step) + " over " + describe(dim.poly) +
                       " (a dimension that changes)");
      continue; // reversed: the same size
    }
    // Bounds relative to the (symbolic) dimension.
    auto bound = [&](const SymDim &b, int64_t v, bool isEnd) -> Poly {
      if (!b.poly.isConstant())
        return b.poly;
      if (v < 0)
        return dim.poly + constant(std::max(v, -size)); // from the end
      if (v >= kOpenEnd)
        return isEnd ? dim.poly : constant(v);
      if (v == size && !dim.poly.isConstant()) {
        // The traced size written as a number: it follows the dimension.
        if (!bind(b, dim.poly))
          fail(node, std::string(isEnd ? "the end" : "the start") + " of the slice is the traced " +
                         describe(dim.poly) + " (" + std::to_string(v) + "), computed in a way pipec does not follow");
        return dim.poly;
      }
      if (v > size && isEnd)
        fail(node, "the slice ends at " + std::to_string(v) + ", beyond the traced " + describe(dim.poly) +
                       " (" + std::to_string(size) + "): whether it follows the new size is unknown");
      return constant(v); // a fixed offset from the start
    };
    Poly begin = bound(starts[k], s, false), end = bound(ends[k], e, true);
    out.dims[axis] = SymDim{end - begin, -1, 0};
  }
  // A window of a small 1-D value (a shape vector) keeps its elements.
  if (data.values && rank == 1 && axes.size() == 1 && starts[0].poly.isConstant() && ends[0].poly.isConstant()) {
    const int64_t size = static_cast<int64_t>(data.values->size());
    int64_t s = tracedValue(starts[0].poly), e = tracedValue(ends[0].poly), step = steps[0];
    std::vector<SymDim> picked;
    if (step > 0) {
      s = s < 0 ? std::max<int64_t>(0, s + size) : std::min(s, size);
      e = e < 0 ? std::max<int64_t>(0, e + size) : std::min(e, size);
      for (int64_t i = s; i < e; i += step)
        picked.push_back((*data.values)[i]);
    } else if (step < 0) {
      s = s < 0 ? std::max<int64_t>(-1, s + size) : std::min(s, size - 1);
      e = e < 0 ? std::max<int64_t>(-1, e + size) : std::min(e, size - 1);
      for (int64_t i = s; i > e; i += step)
        picked.push_back((*data.values)[i]);
    }
    out.values = picked;
  }
  define(node, 0, out);
}

const SymTensor &Respecializer::in(int k) const {
  static const SymTensor absent;
  return k < static_cast<int>(inputs.size()) ? inputs[k] : absent;
}

int64_t Respecializer::normalize(int64_t axis, int64_t rank) const {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    fail(model.graph().node(currentNode),
         "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return a;
}

SymTensor Respecializer::known(std::vector<SymDim> dims) {
  SymTensor t;
  t.known = true;
  t.dims = std::move(dims);
  return t;
}

/// Follows one node by its operator's shape rule (OnnxOps.cpp).
void Respecializer::convert(int nodeIndex) {
  const auto &node = model.graph().node(nodeIndex);
  inputs.clear();
  currentNodeSymbolic = false;
  for (int k = 0; k < node.input_size(); ++k) {
    inputs.push_back(operand(nodeIndex, k));
    currentNodeSymbolic = currentNodeSymbolic || anySymbolic(inputs.back());
  }
  if (!isDefaultDomain(node.domain()) || !in(0).known) {
    if (currentNodeSymbolic)
      fail(node, "pipec does not know how this operator carries a dimension that changes");
    for (int k = 0; k < node.output_size(); ++k)
      define(node, k, fromTraced(node.output(k)));
    return;
  }
  const OnnxOp *row = findOnnxOp(node);
  if (!row)
    return unfollowedRule(node);
  switch (row->shape) {
  case ShapeRule::Unfollowed: return unfollowedRule(node);
  case ShapeRule::SameShape: return sameShapeRule(node, /*values=*/false, /*outputs=*/1);
  case ShapeRule::SameShapeAndValues: return sameShapeRule(node, /*values=*/true, /*outputs=*/1);
  case ShapeRule::SameShapeWithMask: return sameShapeRule(node, /*values=*/false, /*outputs=*/2);
  case ShapeRule::Broadcast: return broadcastRule(node);
  case ShapeRule::Reshape: return reshapeRule(nodeIndex);
  case ShapeRule::Slice: return sliceRule(nodeIndex);
  case ShapeRule::Flatten: return flattenRule(node);
  case ShapeRule::Transpose: return transposeRule(node);
  case ShapeRule::Concat: return concatRule(node);
  case ShapeRule::Split: return splitRule(node, nodeIndex);
  case ShapeRule::SplitToSequence: return splitToSequenceRule(node);
  case ShapeRule::SequenceAt: return sequenceAtRule(node);
  case ShapeRule::Gather: return gatherRule(node);
  case ShapeRule::GatherElements: return gatherElementsRule(node);
  case ShapeRule::GatherND: return gatherNDRule(node);
  case ShapeRule::Unsqueeze: return squeezeOrUnsqueezeRule(node, nodeIndex, /*unsqueeze=*/true);
  case ShapeRule::Squeeze: return squeezeOrUnsqueezeRule(node, nodeIndex, /*unsqueeze=*/false);
  case ShapeRule::Expand: return expandRule(node, nodeIndex);
  case ShapeRule::Tile: return tileRule(node, nodeIndex);
  case ShapeRule::Shape: return shapeOrSizeRule(node, /*size=*/false);
  case ShapeRule::Size: return shapeOrSizeRule(node, /*size=*/true);
  case ShapeRule::ConstantOfShape: return constantOfShapeRule(node, nodeIndex);
  case ShapeRule::Range: return rangeRule(node, nodeIndex);
  case ShapeRule::MatMul: return matMulRule(node);
  case ShapeRule::Gemm: return gemmRule(node);
  case ShapeRule::Windowed: return spatialRule(node, /*windowed=*/true);
  case ShapeRule::Spatial: return spatialRule(node, /*windowed=*/false);
  case ShapeRule::Reduce: return reductionRule(node, nodeIndex, /*argReduce=*/false);
  case ShapeRule::ArgReduce: return reductionRule(node, nodeIndex, /*argReduce=*/true);
  case ShapeRule::Pad: return padRule(node, nodeIndex);
  case ShapeRule::Einsum: return einsumRule(node);
  case ShapeRule::Recurrent: return recurrentRule(node);
  case ShapeRule::Attention: return attentionRule(node);
  case ShapeRule::Loss: return lossRule(node);
  }
}

void Respecializer::unfollowedRule(const onnx::NodeProto &node) {
  if (currentNodeSymbolic)
    fail(node, "pipec does not know how " + node.op_type() + " carries a dimension that changes");
  for (int k = 0; k < node.output_size(); ++k)
    define(node, k, fromTraced(node.output(k)));
}

/// The first `outputs` results have input 0's shape (and its values when
/// `values`); the others (statistics of a normalization) their traced one.
void Respecializer::sameShapeRule(const onnx::NodeProto &node, bool values, int outputs) {
  for (int k = 0; k < outputs && k < node.output_size(); ++k) {
    SymTensor out = known(in(0).dims);
    if (values)
      out.values = in(0).values;
    define(node, k, out);
  }
  for (int k = outputs; k < node.output_size(); ++k)
    define(node, k, fromTraced(node.output(k)));
}

void Respecializer::broadcastRule(const onnx::NodeProto &node) {
  const std::string &op = node.op_type();
  std::vector<std::vector<SymDim>> shapes;
  for (const auto &t : inputs)
    shapes.push_back(t.dims);
  SymTensor out = known(broadcast(node, shapes));
  // Small integer arithmetic on shape values.
  bool allValues = !inputs.empty() && std::all_of(inputs.begin(), inputs.end(), [](const SymTensor &t) { return t.values.has_value(); });
  int64_t count = 1;
  for (const auto &d : out.dims)
    count *= tracedValue(d.poly);
  if (allValues && count <= kFollowedElements &&
      (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Where" || op == "Max" || op == "Min" || op == "Equal")) {
    std::vector<SymDim> values;
    bool ok = true;
    for (int64_t i = 0; i < count && ok; ++i) {
      // The element of each operand that broadcasts to position i.
      std::vector<SymDim> at;
      for (const auto &t : inputs) {
        int64_t index = 0, stride = 1, rest = i;
        std::vector<int64_t> coords(out.dims.size());
        for (size_t d = out.dims.size(); d-- > 0;) {
          coords[d] = rest % tracedValue(out.dims[d].poly);
          rest /= tracedValue(out.dims[d].poly);
        }
        for (size_t d = t.dims.size(); d-- > 0;) {
          int64_t size = tracedValue(t.dims[d].poly);
          int64_t c = coords[d + out.dims.size() - t.dims.size()];
          index += (size == 1 ? 0 : c) * stride;
          stride *= size;
        }
        at.push_back((*t.values)[index]);
      }
      const Poly &a = at[0].poly;
      if (op == "Where") {
        if (!a.isConstant()) {
          ok = false;
          break;
        }
        values.push_back(tracedValue(a) ? at[1] : at[2]);
        continue;
      }
      const Poly &b = at[1].poly;
      if (op == "Add")
        values.push_back(SymDim{a + b, -1, 0});
      else if (op == "Sub")
        values.push_back(SymDim{a - b, -1, 0});
      else if (op == "Mul")
        values.push_back(SymDim{a * b, -1, 0});
      else if (op == "Div") {
        auto q = b.isConstant() && tracedValue(b) != 0 ? a.dividedBy(b) : std::nullopt;
        if (q)
          values.push_back(SymDim{*q, -1, 0});
        else if (a.isConstant() && b.isConstant())
          values.push_back(fixed(tracedValue(a) / tracedValue(b)));
        else
          ok = false;
      } else if (op == "Equal") {
        if (a == b)
          values.push_back(fixed(1));
        else if (a.isConstant() && b.isConstant())
          values.push_back(fixed(0));
        else if ((a.isConstant() && tracedValue(a) <= 0) || (b.isConstant() && tracedValue(b) <= 0))
          values.push_back(fixed(0)); // a size is never 0 or negative
        else
          ok = false;
      } else { // Max, Min
        if (a == b)
          values.push_back(at[0]);
        else if (a.isConstant() && b.isConstant())
          values.push_back(fixed(op == "Max" ? std::max(tracedValue(a), tracedValue(b))
                                             : std::min(tracedValue(a), tracedValue(b))));
        else if ((op == "Max" && ((a.isConstant() && tracedValue(a) <= 1) || (b.isConstant() && tracedValue(b) <= 1))))
          values.push_back(a.isConstant() ? at[1] : at[0]); // a size is at least 1
        else
          ok = false;
      }
    }
    if (ok)
      out.values = values;
  }
  define(node, 0, out);
  return;
}

void Respecializer::flattenRule(const onnx::NodeProto &node) {
  int64_t axis = intAttr(node, "axis", 1);
  axis = axis < 0 ? axis + rankOf(0) : axis;
  Poly a = constant(1), b = constant(1);
  for (int64_t k = 0; k < rankOf(0); ++k)
    (k < axis ? a : b) = (k < axis ? a : b) * in(0).dims[k].poly;
  return define(node, 0, known({SymDim{a, -1, 0}, SymDim{b, -1, 0}}));
}

void Respecializer::transposeRule(const onnx::NodeProto &node) {
  std::vector<int64_t> perm = intsAttr(node, "perm").value_or(std::vector<int64_t>{});
  if (perm.empty())
    for (int64_t k = rankOf(0); k-- > 0;)
      perm.push_back(k);
  std::vector<SymDim> dims;
  for (int64_t p : perm)
    dims.push_back(in(0).dims.at(normalize(p, rankOf(0))));
  return define(node, 0, known(dims));
}

void Respecializer::concatRule(const onnx::NodeProto &node) {
  int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
  std::vector<SymDim> dims = in(0).dims;
  Poly along = constant(0);
  bool values = true;
  std::vector<SymDim> joined;
  for (const auto &t : inputs) {
    if (t.dims.size() != dims.size())
      fail(node, "inputs of different ranks");
    for (size_t k = 0; k < dims.size(); ++k)
      if (static_cast<int64_t>(k) != axis)
        dims[k] = unify(node, dims[k], t.dims[k], "concatenated inputs");
    along = along + t.dims[axis].poly;
    if (t.values && dims.size() == 1)
      joined.insert(joined.end(), t.values->begin(), t.values->end());
    else
      values = false;
  }
  dims[axis] = SymDim{along, -1, 0};
  SymTensor out = known(dims);
  if (values)
    out.values = joined;
  return define(node, 0, out);
}

void Respecializer::splitRule(const onnx::NodeProto &node, int nodeIndex) {
  int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
  const SymDim &dim = in(0).dims[axis];
  if (dim.poly.isConstant()) {
    for (int k = 0; k < node.output_size(); ++k) {
      SymTensor out = known(in(0).dims);
      if (const auto *shape = tracedShape(node.output(k)))
        out.dims[axis] = fixed((*shape)[axis]);
      define(node, k, out);
    }
    return;
  }
  auto part = dim.poly.dividedBy(constant(node.output_size()));
  if (!part)
    fail(node, "splits " + describe(dim.poly) + ", a dimension that changes, into " + std::to_string(node.output_size()) + " parts");
  if (hasInput(node, 1)) {
    std::vector<SymDim> sizes = valuesOf(nodeIndex, 1, "Split's sizes");
    for (const auto &s : sizes)
      if (!(s.poly == *part) && !bind(s, *part))
        fail(node, "the split sizes of " + describe(dim.poly) + " are not equal parts held by a constant");
  } else if (auto sizes = intsAttr(node, "split")) {
    if (std::adjacent_find(sizes->begin(), sizes->end(), std::not_equal_to<>()) != sizes->end())
      fail(node, "unequal split sizes (an attribute) of " + describe(dim.poly));
    fail(node, "the split sizes of " + describe(dim.poly) + " are an attribute, which pipec does not rewrite");
  }
  for (int k = 0; k < node.output_size(); ++k) {
    SymTensor out = known(in(0).dims);
    out.dims[axis] = SymDim{*part, -1, 0};
    define(node, k, out);
  }
  return;
}

void Respecializer::splitToSequenceRule(const onnx::NodeProto &node) {
  // The pieces' shape, with the split axis taken from each SequenceAt's
  // traced result; a split of a changing dimension is not followed.
  int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
  if (!in(0).dims[axis].poly.isConstant() || intAttr(node, "keepdims", 1) == 0)
    fail(node, "splits " + describe(in(0).dims[axis].poly) + " (or drops the split axis), which pipec does not follow");
  SymTensor pieces = known(in(0).dims);
  pieces.dims[axis] = fixed(-1);
  symbolic[node.output(0)] = pieces;
  sequenceAxis[node.output(0)] = axis;
  return;
}

void Respecializer::gatherRule(const onnx::NodeProto &node) {
  int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
  const SymDim &dim = in(0).dims[axis];
  if (!dim.poly.isConstant() && isConstantSource(node.input(1)) && tracedValue(dim.poly) > 1) {
    // Constant indices that reach the traced end of a changing axis were
    // written for the traced size (an index of the last position, or an
    // as_strided rearrangement of the whole axis); -1 would follow it.
    const HostTensor &indices = constantValue(node.input(1));
    for (int64_t i = 0; i < indices.numElements() && !isFloating(indices.kind); ++i)
      if (indices.ints[i] == tracedValue(dim.poly) - 1)
        fail(node, "reads position " + std::to_string(indices.ints[i]) + " of " + describe(dim.poly) +
                       ", the traced last one, through constant indices ('" + node.input(1) +
                       "'): they were written for the traced size and do not follow the new one");
  }
  std::vector<SymDim> dims(in(0).dims.begin(), in(0).dims.begin() + axis);
  dims.insert(dims.end(), in(1).dims.begin(), in(1).dims.end());
  dims.insert(dims.end(), in(0).dims.begin() + axis + 1, in(0).dims.end());
  SymTensor out = known(dims);
  if (in(0).values && rankOf(0) == 1 && in(1).values) {
    std::vector<SymDim> picked;
    for (const auto &v : *in(1).values) {
      if (!v.poly.isConstant())
        break;
      int64_t index = tracedValue(v.poly);
      index = index < 0 ? index + static_cast<int64_t>(in(0).values->size()) : index;
      if (index < 0 || index >= static_cast<int64_t>(in(0).values->size()))
        break;
      picked.push_back((*in(0).values)[index]);
    }
    if (picked.size() == in(1).values->size())
      out.values = picked;
  }
  return define(node, 0, out);
}

void Respecializer::gatherElementsRule(const onnx::NodeProto &node) {
  // Outside the axis, the indices cover the data (as exporters write it: equal).
  int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
  std::vector<SymDim> dims = in(1).dims;
  for (int64_t k = 0; k < rankOf(0) && k < static_cast<int64_t>(dims.size()); ++k)
    if (k != axis && tracedValue(dims[k].poly) == tracedValue(in(0).dims[k].poly))
      dims[k] = unify(node, in(0).dims[k], dims[k], "GatherElements' data and indices");
  return define(node, 0, known(dims));
}

void Respecializer::gatherNDRule(const onnx::NodeProto &node) {
  int64_t batchDims = intAttr(node, "batch_dims", 0);
  int64_t r = tracedValue(in(1).dims.back().poly);
  std::vector<SymDim> dims(in(1).dims.begin(), in(1).dims.end() - 1);
  dims.insert(dims.end(), in(0).dims.begin() + batchDims + r, in(0).dims.end());
  return define(node, 0, known(dims));
}

void Respecializer::expandRule(const onnx::NodeProto &node, int nodeIndex) {
  std::vector<SymDim> shape = valuesOf(nodeIndex, 1, "Expand's shape");
  SymTensor out = known(broadcast(node, {in(0).dims, shape}));
  if (in(0).values && in(0).values->size() == 1 && out.dims.size() <= 1) {
    int64_t count = out.dims.empty() ? 1 : tracedValue(out.dims[0].poly);
    if (count <= kFollowedElements && out.dims.size() == 1 && out.dims[0].poly.isConstant())
      out.values = std::vector<SymDim>(count, (*in(0).values)[0]);
  } else if (in(0).values && out.dims.size() == in(0).dims.size()) {
    bool same = true;
    for (size_t k = 0; k < out.dims.size(); ++k)
      same = same && tracedValue(out.dims[k].poly) == tracedValue(in(0).dims[k].poly);
    if (same)
      out.values = in(0).values;
  }
  return define(node, 0, out);
}

void Respecializer::tileRule(const onnx::NodeProto &node, int nodeIndex) {
  std::vector<SymDim> repeats = valuesOf(nodeIndex, 1, "Tile's repeats");
  std::vector<SymDim> dims;
  for (int64_t k = 0; k < rankOf(0); ++k) {
    const SymDim &d = in(0).dims[k];
    if (d.poly.isConstant() && tracedValue(d.poly) == 1)
      dims.push_back(repeats.at(k));
    else
      dims.push_back(SymDim{d.poly * repeats.at(k).poly, -1, 0});
  }
  return define(node, 0, known(dims));
}

void Respecializer::constantOfShapeRule(const onnx::NodeProto &node, int nodeIndex) {
  std::vector<SymDim> shape = valuesOf(nodeIndex, 0, "ConstantOfShape's shape");
  SymTensor out = known(shape);
  int64_t count = 1;
  for (const auto &d : shape)
    count *= tracedValue(d.poly);
  if (auto it = traced.constants.find(node.output(0)); it != traced.constants.end() &&
      !isFloating(it->second.kind) && count <= kFollowedElements && it->second.numElements() > 0) {
    out.values = std::vector<SymDim>(count, fixed(it->second.ints[0]));
  }
  return define(node, 0, out);
}

void Respecializer::rangeRule(const onnx::NodeProto &node, int nodeIndex) {
  std::vector<SymDim> start = valuesOf(nodeIndex, 0, "Range's start"),
                      limit = valuesOf(nodeIndex, 1, "Range's limit"),
                      delta = valuesOf(nodeIndex, 2, "Range's delta");
  if (start.size() != 1 || limit.size() != 1 || delta.size() != 1)
    fail(node, "Range's operands are not scalars");
  if (!start[0].poly.isConstant() || !delta[0].poly.isConstant() || tracedValue(delta[0].poly) != 1) {
    if (currentNodeSymbolic)
      fail(node, "a range whose start or step changes size, or whose step is not 1");
    return define(node, 0, fromTraced(node.output(0)));
  }
  SymDim length{limit[0].poly - start[0].poly, limit[0].slot, -tracedValue(start[0].poly)};
  if (!limit[0].poly.isConstant())
    length.slot = -1;
  return define(node, 0, known({length}));
}

void Respecializer::matMulRule(const onnx::NodeProto &node) {
  std::vector<SymDim> a = in(0).dims, b = in(1).dims;
  bool vectorA = a.size() == 1, vectorB = b.size() == 1;
  if (vectorA)
    a.insert(a.begin(), fixed(1));
  if (vectorB)
    b.push_back(fixed(1));
  unify(node, a.back(), b[b.size() - 2], "the contracted dimension");
  std::vector<SymDim> batchA(a.begin(), a.end() - 2), batchB(b.begin(), b.end() - 2);
  std::vector<SymDim> dims = broadcast(node, {batchA, batchB});
  if (!vectorA)
    dims.push_back(a[a.size() - 2]);
  if (!vectorB)
    dims.push_back(b.back());
  return define(node, 0, known(dims));
}

void Respecializer::gemmRule(const onnx::NodeProto &node) {
  bool ta = intAttr(node, "transA", 0), tb = intAttr(node, "transB", 0);
  const auto &a = in(0).dims, &b = in(1).dims;
  unify(node, a[ta ? 0 : 1], b[tb ? 1 : 0], "the contracted dimension");
  std::vector<SymDim> dims = {a[ta ? 1 : 0], b[tb ? 0 : 1]};
  if (hasInput(node, 2))
    dims = broadcast(node, {dims, in(2).dims});
  return define(node, 0, known(dims));
}

void Respecializer::padRule(const onnx::NodeProto &node, int nodeIndex) {
  std::vector<int64_t> pads = hasInput(node, 1) ? constantInts(nodeIndex, 1, "Pad's pads")
                                                : intsAttr(node, "pads").value_or(std::vector<int64_t>{});
  std::vector<int64_t> axes;
  if (hasInput(node, 3))
    axes = constantInts(nodeIndex, 3, "Pad's axes");
  else
    for (int64_t k = 0; k < rankOf(0); ++k)
      axes.push_back(k);
  std::vector<SymDim> dims = in(0).dims;
  for (size_t k = 0; k < axes.size() && 2 * axes.size() == pads.size(); ++k) {
    int64_t a = normalize(axes[k], rankOf(0));
    int64_t extra = pads[k] + pads[k + axes.size()];
    if (extra != 0)
      dims[a] = SymDim{dims[a].poly + constant(extra), -1, 0};
  }
  return define(node, 0, known(dims));
}

void Respecializer::einsumRule(const onnx::NodeProto &node) {
  std::string equation;
  if (const auto *a = attribute(node, "equation"))
    equation = a->s();
  equation.erase(std::remove(equation.begin(), equation.end(), ' '), equation.end());
  if (equation.find("...") != std::string::npos || equation.find("->") == std::string::npos) {
    if (currentNodeSymbolic)
      fail(node, "an equation with '...' or without '->' over a dimension that changes");
    return define(node, 0, fromTraced(node.output(0)));
  }
  std::map<char, SymDim> letters;
  std::string lhs = equation.substr(0, equation.find("->")), rhs = equation.substr(equation.find("->") + 2);
  size_t operandIndex = 0, axis = 0;
  for (char c : lhs) {
    if (c == ',') {
      ++operandIndex, axis = 0;
      continue;
    }
    const SymDim &d = in(static_cast<int>(operandIndex)).dims.at(axis++);
    auto it = letters.find(c);
    if (it == letters.end())
      letters[c] = d;
    else if (!(tracedValue(d.poly) == 1 && d.poly.isConstant()))
      it->second = tracedValue(it->second.poly) == 1 && it->second.poly.isConstant()
                       ? d
                       : unify(node, it->second, d, "a repeated subscript");
  }
  std::vector<SymDim> dims;
  for (char c : rhs)
    dims.push_back(letters.at(c));
  return define(node, 0, known(dims));
}

void Respecializer::attentionRule(const onnx::NodeProto &node) {
  // Q: [batch, (heads,) q_sequence, head size]; the mask broadcasts against
  // the scores [batch, heads, q_sequence, kv_sequence].
  const auto *shape = tracedShape(node.output(0));
  if (!shape)
    fail(node, "the traced import did not record its output");
  std::vector<SymDim> dims = in(0).dims;
  dims.back() = fixed(shape->back());
  if (rankOf(0) == 4 && rankOf(1) == 4) {
    std::vector<SymDim> scores = {in(0).dims[0], in(0).dims[1], in(0).dims[2], in(1).dims[2]};
    if (hasInput(node, 3))
      broadcast(node, {scores, in(3).dims});
  }
  define(node, 0, known(dims));
  for (int k = 1; k < node.output_size(); ++k)
    define(node, k, fromTraced(node.output(k)));
  return;
}

void Respecializer::sequenceAtRule(const onnx::NodeProto &node) {
  if (!sequenceAxis.count(node.input(0)))
    return unfollowedRule(node);
  SymTensor out = known(in(0).dims);
  int64_t axis = sequenceAxis.at(node.input(0));
  const auto *shape = tracedShape(node.output(0));
  if (!shape || static_cast<int64_t>(shape->size()) <= axis)
    fail(node, "the traced import did not record its output");
  out.dims[axis] = fixed((*shape)[axis]);
  return define(node, 0, out);
}

void Respecializer::squeezeOrUnsqueezeRule(const onnx::NodeProto &node, int nodeIndex, bool unsqueeze) {
  std::vector<int64_t> axes;
  if (node.input_size() > 1 && !node.input(1).empty())
    axes = constantInts(nodeIndex, 1, "the axes");
  else if (auto a = intsAttr(node, "axes"))
    axes = *a;
  std::vector<SymDim> dims = in(0).dims;
  if (unsqueeze) {
    int64_t rank = rankOf(0) + static_cast<int64_t>(axes.size());
    for (auto &a : axes)
      a = normalize(a, rank);
    std::sort(axes.begin(), axes.end());
    for (int64_t a : axes)
      dims.insert(dims.begin() + a, fixed(1));
  } else {
    for (auto &a : axes)
      a = normalize(a, rankOf(0));
    std::vector<SymDim> kept;
    for (int64_t k = 0; k < rankOf(0); ++k) {
      bool drop = axes.empty() ? tracedValue(dims[k].poly) == 1
                               : std::find(axes.begin(), axes.end(), k) != axes.end();
      if (drop && !dims[k].poly.isConstant())
        fail(node, "squeezes " + describe(dims[k].poly) + ", a dimension that changes (1 when traced)");
      if (!drop)
        kept.push_back(dims[k]);
    }
    dims = kept;
  }
  SymTensor out = known(dims);
  out.values = in(0).values;
  return define(node, 0, out);
}

void Respecializer::shapeOrSizeRule(const onnx::NodeProto &node, bool size) {
  int64_t rank = rankOf(0);
  int64_t start = intAttr(node, "start", 0), end = intAttr(node, "end", rank);
  start = std::clamp(start < 0 ? start + rank : start, int64_t(0), rank);
  end = std::clamp(end < 0 ? end + rank : end, int64_t(0), rank);
  std::vector<SymDim> values;
  if (size) {
    Poly product = constant(1);
    for (const auto &d : in(0).dims)
      product = product * d.poly;
    values.push_back(SymDim{product, -1, 0});
  } else {
    for (int64_t k = start; k < end; ++k)
      values.push_back(in(0).dims[k]); // a constant's dimension keeps its slot
  }
  SymTensor out = known(size ? std::vector<SymDim>{} : std::vector<SymDim>{fixed(static_cast<int64_t>(values.size()))});
  out.values = values;
  return define(node, 0, out);
}

void Respecializer::spatialRule(const onnx::NodeProto &node, bool windowed) {
  // The batch passes; a window over a dimension that changes keeps its
  // offset only with stride 1 (and no resampling).
  const auto *shape = tracedShape(node.output(0));
  if (!shape)
    fail(node, "the traced import did not record its output");
  std::vector<SymDim> dims;
  for (size_t k = 0; k < shape->size(); ++k) {
    if (k == 0 && !in(0).dims.empty()) {
      dims.push_back(in(0).dims[0]);
      continue;
    }
    const SymDim *d = k < in(0).dims.size() ? &in(0).dims[k] : nullptr;
    if (!d || d->poly.isConstant() || k == 1) {
      if (d && k == 1 && !d->poly.isConstant())
        fail(node, "its channels follow " + describe(d->poly));
      dims.push_back(fixed((*shape)[k]));
      continue;
    }
    auto strides = intsAttr(node, "strides").value_or(std::vector<int64_t>{});
    bool strided = std::any_of(strides.begin(), strides.end(), [](int64_t s) { return s != 1; });
    if (!windowed || strided)
      fail(node, "its spatial dimension " + std::to_string(k) + " follows " + describe(d->poly) +
                     ", and pipec re-specializes windows over a changing dimension only with stride 1");
    dims.push_back(SymDim{d->poly + constant((*shape)[k] - tracedValue(d->poly)), -1, 0});
  }
  SymTensor out = known(dims);
  define(node, 0, out);
  for (int k = 1; k < node.output_size(); ++k)
    define(node, k, fromTraced(node.output(k)));
  return;
}

void Respecializer::reductionRule(const onnx::NodeProto &node, int nodeIndex, bool argReduce) {
  const std::string &op = node.op_type();
  std::vector<int64_t> axes;
  bool keep = intAttr(node, "keepdims", 1) != 0;
  if (argReduce)
    axes = {intAttr(node, "axis", 0)};
  else if (node.input_size() > 1 && !node.input(1).empty())
    axes = constantInts(nodeIndex, 1, "the axes");
  else if (auto a = intsAttr(node, "axes"))
    axes = *a;
  if (axes.empty() && !intAttr(node, "noop_with_empty_axes", 0))
    for (int64_t k = 0; k < rankOf(0); ++k)
      axes.push_back(k);
  for (auto &a : axes)
    a = normalize(a, rankOf(0));
  std::vector<SymDim> dims;
  for (int64_t k = 0; k < rankOf(0); ++k) {
    bool reduced = std::find(axes.begin(), axes.end(), k) != axes.end();
    if (!reduced)
      dims.push_back(in(0).dims[k]);
    else if (keep)
      dims.push_back(fixed(1));
  }
  SymTensor out = known(dims);
  if (in(0).values && rankOf(0) == 1 && axes.size() == 1 && (op == "ReduceProd" || op == "ReduceSum")) {
    Poly total = constant(op == "ReduceProd" ? 1 : 0);
    for (const auto &v : *in(0).values)
      total = op == "ReduceProd" ? total * v.poly : total + v.poly;
    out.values = std::vector<SymDim>{SymDim{total, -1, 0}};
  }
  return define(node, 0, out);
}

void Respecializer::recurrentRule(const onnx::NodeProto &node) {
  bool batchFirst = intAttr(node, "layout", 0) != 0;
  SymDim seq = in(0).dims[batchFirst ? 1 : 0], batch = in(0).dims[batchFirst ? 0 : 1];
  // Initial states: [directions, batch, hidden] (batch first: [batch, directions, hidden]).
  for (int k : {5, 6})
    if (hasInput(node, k))
      batch = unify(node, batch, in(k).dims[batchFirst ? 0 : 1], "the batch of an initial state");
  for (int k = 0; k < node.output_size(); ++k) {
    const auto *shape = tracedShape(node.output(k));
    if (!shape)
      continue;
    std::vector<SymDim> dims;
    for (int64_t v : *shape)
      dims.push_back(fixed(v));
    if (k == 0) {
      dims[batchFirst ? 0 : 0] = batchFirst ? batch : seq;
      dims[batchFirst ? 1 : 2] = batchFirst ? seq : batch;
    } else {
      dims[batchFirst ? 0 : 1] = batch;
    }
    define(node, k, known(dims));
  }
  return;
}

void Respecializer::lossRule(const onnx::NodeProto &node) {
  if (stringAttr(node, "reduction", "mean") == "none")
    return define(node, 0, known(in(1).dims));
  define(node, 0, known({}));
  for (int k = 1; k < node.output_size(); ++k)
    define(node, k, known(in(0).dims));
  return;
}


} // namespace pipec::import::detail::respecialize
