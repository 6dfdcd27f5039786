// Re-specialization: the symbolic walk of the graph, binding constant
// dimensions and values to the symbols' polynomials (RespecializeInternal.h).
#include "compiler/Import/RespecializeInternal.h"

namespace pipec::import::detail::respecialize {


std::string Respecializer::describe(const Poly &p) const {
  if (p.isConstant())
    return std::to_string(tracedValue(p));
  std::string text;
  for (const auto &[exponents, coefficient] : p.terms) {
    std::string term;
    if (coefficient != 1 || std::all_of(exponents.begin(), exponents.end(), [](int e) { return e == 0; }))
      term = std::to_string(coefficient);
    for (size_t s = 0; s < exponents.size(); ++s)
      for (int e = 0; e < exponents[s]; ++e)
        term += (term.empty() ? "" : "*") + symbolNames[s];
    text += (text.empty() ? "" : " + ") + term;
  }
  return text;
}

std::string Respecializer::nodeLabel(const onnx::NodeProto &node) const {
  return "node '" + (node.name().empty() ? "#" + std::to_string(currentNode) : node.name()) + "' (" +
         node.op_type() + ")";
}

void Respecializer::fail(const onnx::NodeProto &node, const std::string &reason) const {
  throw Failure{nodeLabel(node) + ": " + reason};
}

const HostTensor &Respecializer::constantValue(const std::string &name) {
  if (auto it = traced.constants.find(name); it != traced.constants.end())
    return it->second;
  auto it = readConstants.find(name);
  if (it != readConstants.end())
    return it->second;
  if (auto init = initializerIndex.find(name); init != initializerIndex.end())
    return readConstants[name] = traced.read(model.graph().initializer(init->second));
  throw Failure{"constant '" + name + "' has no value at import"};
}

SymTensor Respecializer::fromTraced(const std::string &name) const {
  SymTensor t;
  if (const auto *shape = tracedShape(name)) {
    t.known = true;
    for (int64_t d : *shape)
      t.dims.push_back(fixed(d));
  }
  return t;
}

bool Respecializer::anySymbolic(const SymTensor &t) const {
  for (const auto &d : t.dims)
    if (!d.poly.isConstant())
      return true;
  if (t.values)
    for (const auto &v : *t.values)
      if (!v.poly.isConstant())
        return true;
  return false;
}

const SymTensor *Respecializer::changedInputShaped(const std::vector<int64_t> &shape) const {
  for (const auto &input : model.graph().input()) {
    auto it = symbolic.find(input.name());
    if (it == symbolic.end() || !anySymbolic(it->second) || it->second.dims.size() != shape.size())
      continue;
    bool same = true;
    for (size_t k = 0; k < shape.size() && same; ++k)
      same = tracedValue(it->second.dims[k].poly) == shape[k];
    if (same)
      return &it->second;
  }
  return nullptr;
}

bool Respecializer::allEqual(const HostTensor &value) {
  for (int64_t i = 1; i < value.numElements(); ++i)
    if (value.asDouble(i) != value.asDouble(0))
      return false;
  return value.numElements() > 1;
}

SymTensor Respecializer::operand(int nodeIndex, int index) {
  const auto &node = model.graph().node(nodeIndex);
  if (index >= node.input_size() || node.input(index).empty())
    return SymTensor{};
  const std::string &name = node.input(index);
  if (!isConstantSource(name)) {
    auto it = symbolic.find(name);
    return it == symbolic.end() ? SymTensor{} : it->second;
  }
  // A constant enters through this edge with a slot per dimension and, when
  // small and integer, per element.
  const HostTensor &value = constantValue(name);
  SymTensor t;
  t.known = true;
  auto slotted = [&](bool isValue, int64_t position, int64_t tracedV) {
    SlotKey key{name, nodeIndex, index, isValue, position};
    auto [it, added] = slotIndex.emplace(key, static_cast<int>(slots.size()));
    if (added)
      slots.push_back(key);
    SymDim d{constant(tracedV), it->second, 0};
    if (auto bound = bindings.find(it->second); bound != bindings.end())
      d.poly = bound->second;
    return d;
  };
  for (size_t axis = 0; axis < value.shape.size(); ++axis)
    t.dims.push_back(slotted(false, static_cast<int64_t>(axis), value.shape[axis]));
  // A constant of a changed input's traced shape whose elements are all
  // equal is what exporters fold ones_like(input) and zeros_like(input) into
  // (an all-ones attention mask, all-zero token types): it follows the input.
  if (const SymTensor *like = changedInputShaped(value.shape); like && allEqual(value))
    for (size_t axis = 0; axis < t.dims.size(); ++axis)
      if (!like->dims[axis].poly.isConstant() && t.dims[axis].poly.isConstant()) {
        bind(t.dims[axis], like->dims[axis].poly);
        t.dims[axis].poly = like->dims[axis].poly;
      }
  // Floating constants too when they hold whole numbers: exporters write a
  // size as a float and cast it (CastLike).
  bool whole = value.numElements() <= kFollowedElements;
  for (int64_t i = 0; whole && isFloating(value.kind) && i < value.numElements(); ++i)
    whole = wholeNumber(value.floats[i]).has_value();
  if (whole) {
    std::vector<SymDim> values;
    for (int64_t i = 0; i < value.numElements(); ++i)
      values.push_back(slotted(true, i, isFloating(value.kind) ? *wholeNumber(value.floats[i]) : value.ints[i]));
    t.values = values;
  }
  if (anySymbolic(SymTensor{true, t.dims, std::nullopt}))
    t.values.reset(); // extended at the new sizes: its elements are re-derived
  return t;
}

bool Respecializer::bind(const SymDim &dim, const Poly &to) {
  if (dim.slot < 0)
    return false;
  Poly value = to - constant(dim.offset);
  // Every slot found equal to this one follows too.
  std::vector<std::pair<int, Poly>> pending = {{dim.slot, value}};
  while (!pending.empty()) {
    auto [slot, poly] = pending.back();
    pending.pop_back();
    auto [it, added] = bindings.emplace(slot, poly);
    if (!added) {
      if (!(it->second == poly))
        throw Failure{"constant '" + slots[slot].constant + "' would have to follow both " +
                      describe(it->second) + " and " + describe(poly)};
      continue;
    }
    boundAnew = true;
    for (const auto &[other, offset] : equalSlots[slot])
      pending.push_back({other, poly + constant(offset)});
  }
  return true;
}

void Respecializer::noteEqual(const SymDim &a, const SymDim &b) {
  if (a.slot < 0 || b.slot < 0 || a.slot == b.slot)
    return;
  // value(a) + a.offset == value(b) + b.offset
  equalSlots[a.slot].insert({b.slot, a.offset - b.offset});
  equalSlots[b.slot].insert({a.slot, b.offset - a.offset});
  for (const auto &[x, y] : {std::pair{a, b}, std::pair{b, a}})
    if (auto bound = bindings.find(x.slot); bound != bindings.end())
      bind(y, bound->second + constant(x.offset));
}

SymDim Respecializer::unify(const onnx::NodeProto &node, const SymDim &a, const SymDim &b,
                            const char *what) {
  if (a.poly == b.poly) {
    noteEqual(a, b);
    return a.slot >= 0 ? a : b;
  }
  bool aSym = !a.poly.isConstant(), bSym = !b.poly.isConstant();
  if (aSym && bSym)
    fail(node, std::string(what) + ": " + describe(a.poly) + " and " + describe(b.poly) +
                   " must be equal, and are only at the traced sizes");
  const SymDim &symbolicSide = aSym ? a : b;
  const SymDim &constantSide = aSym ? b : a;
  if (!aSym && !bSym) // both constant and different: the traced import accepted it
    fail(node, std::string(what) + ": " + describe(a.poly) + " and " + describe(b.poly) + " differ");
  if (!bind(constantSide, symbolicSide.poly))
    fail(node, std::string(what) + ": a dimension fixed at " + std::to_string(tracedValue(constantSide.poly)) +
                   " must follow " + describe(symbolicSide.poly) +
                   ", and nothing in the file that could be rewritten holds it");
  return symbolicSide;
}

std::vector<SymDim> Respecializer::broadcast(const onnx::NodeProto &node,
                                             const std::vector<std::vector<SymDim>> &shapes) {
  size_t rank = 0;
  for (const auto &s : shapes)
    rank = std::max(rank, s.size());
  std::vector<SymDim> out;
  for (size_t k = 0; k < rank; ++k) {
    std::optional<SymDim> result;
    for (const auto &s : shapes) {
      if (k + s.size() < rank)
        continue;
      const SymDim &d = s[k + s.size() - rank];
      if (d.poly.isConstant() && tracedValue(d.poly) == 1)
        continue; // broadcasts
      result = result ? unify(node, *result, d, "broadcasting") : d;
    }
    out.push_back(result ? *result : fixed(1));
  }
  return out;
}

std::vector<int64_t> Respecializer::constantInts(int nodeIndex, int index, const char *role) {
  const auto &node = model.graph().node(nodeIndex);
  SymTensor t = operand(nodeIndex, index);
  if (!t.values)
    fail(node, std::string(role) + " is not a small integer tensor pipec can follow");
  std::vector<int64_t> out;
  for (const auto &v : *t.values) {
    if (!v.poly.isConstant())
      fail(node, std::string(role) + " follows " + describe(v.poly) + ", where pipec needs a constant");
    out.push_back(tracedValue(v.poly));
  }
  return out;
}

std::vector<SymDim> Respecializer::valuesOf(int nodeIndex, int index, const char *role) {
  SymTensor t = operand(nodeIndex, index);
  if (!t.values)
    fail(model.graph().node(nodeIndex), std::string(role) + " ('" + model.graph().node(nodeIndex).input(index) +
                                            "') is computed in a way pipec does not follow");
  return *t.values;
}

void Respecializer::define(const onnx::NodeProto &node, int output, SymTensor value) {
  if (output >= node.output_size() || node.output(output).empty())
    return;
  const std::string &name = node.output(output);
  // Every rule's result must be what the traced import found.
  if (const auto *shape = tracedShape(name)) {
    bool agrees = value.known && value.dims.size() == shape->size();
    for (size_t k = 0; agrees && k < shape->size(); ++k)
      agrees = tracedValue(value.dims[k].poly) == (*shape)[k];
    if (!agrees) {
      if (anySymbolic(value) || !value.known) {
        std::string got;
        for (const auto &d : value.dims)
          got += (got.empty() ? "" : ",") + describe(d.poly);
        fail(node, "pipec's rule gives output '" + name + "' the shape [" + got +
                       "], but the traced import found " + shapeText(*shape));
      }
      value = fromTraced(name);
    }
  }
  if (!value.values && !currentNodeSymbolic) {
    // Computed from values that do not change: what the traced import folded.
    auto it = traced.constants.find(name);
    if (it != traced.constants.end() && it->second.numElements() <= kFollowedElements) {
      const HostTensor &folded = it->second;
      bool whole = true;
      for (int64_t i = 0; i < folded.numElements() && whole; ++i)
        whole = !isFloating(folded.kind) || wholeNumber(folded.floats[i]).has_value();
      if (whole) {
        std::vector<SymDim> values;
        for (int64_t i = 0; i < folded.numElements(); ++i)
          values.push_back(fixed(isFloating(folded.kind) ? *wholeNumber(folded.floats[i]) : folded.ints[i]));
        value.values = values;
      }
    }
  }
  if (value.values) {
    auto it = traced.constants.find(name);
    bool agrees = it != traced.constants.end() &&
                  static_cast<int64_t>(value.values->size()) == it->second.numElements();
    for (size_t i = 0; agrees && i < value.values->size(); ++i)
      agrees = static_cast<double>(tracedValue((*value.values)[i].poly)) == it->second.asDouble(i);
    if (!agrees)
      value.values.reset();
  }
  if (std::getenv("PIPEC_RESPECIALIZE_TRACE")) {
    std::string text;
    for (const auto &d : value.dims)
      text += (text.empty() ? "" : ",") + describe(d.poly) + (d.slot >= 0 ? "@" + slots[d.slot].constant : "");
    std::string vals;
    if (value.values)
      for (const auto &d : *value.values)
        vals += (vals.empty() ? "" : ",") + describe(d.poly) + (d.slot >= 0 ? "@" + slots[d.slot].constant : "");
    fprintf(stderr, "%s %s: [%s]%s\n", node.op_type().c_str(), name.c_str(), text.c_str(),
            value.values ? (" = {" + vals + "}").c_str() : "");
  }
  symbolic[name] = std::move(value);
}

void Respecializer::walk() {
  symbolic.clear();
  boundAnew = false;
  const auto &graph = model.graph();
  for (const auto &input : graph.input()) {
    if (initializerIndex.count(input.name()))
      continue;
    SymTensor t;
    t.known = true;
    const auto &dims = input.type().tensor_type().shape().dim();
    const auto &wanted = newShapes.at(input.name());
    for (int d = 0; d < dims.size(); ++d) {
      int64_t before = dims[d].has_dim_value() ? dims[d].dim_value() : wanted[d];
      if (before == wanted[d]) {
        t.dims.push_back(fixed(before));
        continue;
      }
      size_t s = 0;
      while (s < symbolCount() && !(tracedSizes[s] == before && newSizes[s] == wanted[d]))
        ++s;
      t.dims.push_back(SymDim{Poly::symbol(s, symbolCount()), -1, 0});
    }
    symbolic[input.name()] = t;
  }
  firstFailure.reset();
  for (int i = 0; i < graph.node_size(); ++i) {
    currentNode = i;
    if (graph.node(i).op_type() == "Constant" && isDefaultDomain(graph.node(i).domain()))
      continue; // read at its uses, through operand()
    try {
      convert(i);
    } catch (const Failure &failure) {
      // A later node may bind what this one lacks: the walk goes on with the
      // traced shapes, and the failure stands only if no walk binds anew.
      if (!firstFailure)
        firstFailure = failure;
      for (int k = 0; k < graph.node(i).output_size(); ++k)
        if (!graph.node(i).output(k).empty())
          symbolic[graph.node(i).output(k)] = fromTraced(graph.node(i).output(k));
    }
  }
}

std::vector<SymDim> Respecializer::reshapeTargets(const onnx::NodeProto &node,
                                                  const std::vector<SymDim> &input,
                                                  std::vector<SymDim> target, bool allowZero) {
  // 0 copies the input's dimension; -1 is what remains.
  int inferred = -1;
  for (size_t j = 0; j < target.size(); ++j) {
    int64_t v = tracedValue(target[j].poly);
    if (target[j].poly.isConstant() && v == 0 && !allowZero) {
      if (j >= input.size())
        fail(node, "a 0 in the target copies a dimension the input lacks");
      target[j] = input[j];
    } else if (target[j].poly.isConstant() && v == -1) {
      inferred = static_cast<int>(j);
    }
  }
  Poly total = constant(1);
  for (const auto &d : input)
    total = total * d.poly;
  std::vector<int64_t> tracedTarget(target.size());
  {
    int64_t known = 1;
    for (size_t j = 0; j < target.size(); ++j)
      if (static_cast<int>(j) != inferred)
        known *= tracedValue(target[j].poly);
    for (size_t j = 0; j < target.size(); ++j)
      tracedTarget[j] = static_cast<int>(j) == inferred ? (known ? tracedValue(total) / known : 0)
                                                         : tracedValue(target[j].poly);
  }
  // Groups of consecutive input and target dimensions with equal traced
  // products: a reshape only merges and splits neighbours.
  size_t i = 0, j = 0;
  while (i < input.size() || j < target.size()) {
    size_t i0 = i, j0 = j;
    if (i < input.size() && j < target.size() && tracedValue(input[i].poly) == 1 && tracedTarget[j] == 1) {
      ++i, ++j;
    } else if (i < input.size() && tracedValue(input[i].poly) == 1 && input[i].poly.isConstant()) {
      ++i;
      continue;
    } else if (j < target.size() && tracedTarget[j] == 1) {
      ++j;
      continue;
    } else {
      int64_t pi = 1, pj = 1;
      if (i < input.size())
        pi *= tracedValue(input[i++].poly);
      if (j < target.size())
        pj *= tracedTarget[j++];
      while (pi != pj) {
        if (pi < pj && i < input.size())
          pi *= tracedValue(input[i++].poly);
        else if (pj < pi && j < target.size())
          pj *= tracedTarget[j++];
        else
          fail(node, "the target's element count differs from the input's");
      }
      // Trailing 1s of the input stay with this group.
    }
    Poly groupInput = constant(1);
    for (size_t k = i0; k < i; ++k)
      groupInput = groupInput * input[k].poly;
    if (groupInput.isConstant())
      continue; // nothing here changes size
    // The target elements already symbolic, and the inferred one, take their share.
    Poly rest = groupInput;
    std::vector<size_t> open;
    bool absorbs = false;
    for (size_t k = j0; k < j; ++k) {
      if (static_cast<int>(k) == inferred)
        absorbs = true;
      else if (!target[k].poly.isConstant()) {
        auto q = rest.dividedBy(target[k].poly);
        if (!q)
          fail(node, "target element " + std::to_string(k) + " (" + describe(target[k].poly) +
                         ") does not divide " + describe(groupInput));
        rest = *q;
      } else {
        open.push_back(k);
      }
    }
    if (absorbs || rest.isConstant())
      continue;
    if (open.size() == 1 && tracedTarget[open[0]] == tracedValue(rest)) {
      // One constant element holds the whole rest (a sum such as S - 1 too).
      if (!bind(target[open[0]], rest))
        fail(node, "target element " + std::to_string(open[0]) + " (" + std::to_string(tracedTarget[open[0]]) +
                       ") must follow " + describe(rest) + ", and it is computed, not a constant of the file");
      target[open[0]].poly = rest;
      continue;
    }
    // Hand the remaining symbols to the constant elements, in order, each the
    // symbols whose traced product it equals (or divides).
    if (rest.terms.size() != 1)
      fail(node, "the input's dimensions " + describe(groupInput) + " cannot be split among the target's");
    std::vector<int> exponents = rest.terms.begin()->first;
    int64_t coefficient = rest.terms.begin()->second;
    for (size_t k : open) {
      int64_t want = tracedTarget[k];
      // Candidate sub-monomials: every exponent vector below `exponents`.
      std::vector<int> best;
      int bestDegree = -1;
      std::vector<int> e(exponents.size(), 0);
      while (true) {
        int64_t value = 1;
        int degree = 0;
        for (size_t s = 0; s < e.size(); ++s)
          for (int n = 0; n < e[s]; ++n)
            value *= tracedSizes[s], ++degree;
        if (value > 0 && want % value == 0 && degree > bestDegree && (want / value == 1 || coefficient % (want / value) == 0))
          best = e, bestDegree = degree;
        size_t s = 0;
        while (s < e.size() && ++e[s] > exponents[s])
          e[s++] = 0;
        if (s == e.size())
          break;
      }
      if (bestDegree <= 0)
        continue; // stays constant
      int64_t value = 1;
      for (size_t s = 0; s < best.size(); ++s)
        for (int n = 0; n < best[s]; ++n)
          value *= tracedSizes[s];
      Poly share;
      share.terms[best] = want / value;
      for (size_t s = 0; s < best.size(); ++s)
        exponents[s] -= best[s];
      coefficient /= want / value;
      if (!bind(target[k], share))
        fail(node, "target element " + std::to_string(k) + " (" + std::to_string(want) +
                       ") must follow " + describe(share) + ", and it is computed, not a constant of the file");
      target[k].poly = share;
    }
    if (std::any_of(exponents.begin(), exponents.end(), [](int x) { return x != 0; }))
      fail(node, "no element of the target holds the traced " + describe(groupInput) +
                     " of the input; pipec cannot tell which one follows it");
  }
  if (inferred >= 0) {
    Poly known = constant(1);
    for (size_t k = 0; k < target.size(); ++k)
      if (static_cast<int>(k) != inferred)
        known = known * target[k].poly;
    Poly product = constant(1);
    for (const auto &d : input)
      product = product * d.poly;
    auto q = known.terms.size() == 1 ? product.dividedBy(known) : std::nullopt;
    if (!q)
      fail(node, "the inferred (-1) target element, " + describe(product) + " / (" + describe(known) +
                     "), is not a whole polynomial");
    target[inferred] = SymDim{*q, -1, 0};
  }
  return target;
}

} // namespace pipec::import::detail::respecialize
