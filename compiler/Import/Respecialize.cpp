// Re-specializing a static export (docs/importer.md, "Another batch or
// sequence length").
//
// Every dimension a graph input changes is a symbol. Dimensions and small
// integer values (shape vectors) are followed through the graph as
// polynomials in the symbols, and every rule's result is checked against the
// shapes an import at the traced sizes found, so that a rule that does not
// apply is an error rather than a wrong rewrite. A dimension or element that
// comes from a constant carries a slot: the constant, the node that reads it
// and the position. Where a constant dimension must equal a symbolic one
// (broadcasting, a matrix product, a reshape's element count), its slot is
// bound to the symbol's polynomial, and the walk starts again until no slot
// is bound anew. Then each bound constant is rewritten for the nodes that
// bound it: values evaluated at the new sizes, tensors extended by their
// pattern.
#include "compiler/Import/Respecialize.h"

#include "compiler/Import/ImporterImpl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <set>

namespace pipec::import::detail {
namespace {

/// A re-specialization that cannot be done: the reason, naming the node or constant.
struct Failure {
  std::string message;
};

/// A polynomial with integer coefficients in the symbols (exponent vectors).
struct Poly {
  std::map<std::vector<int>, int64_t> terms;

  static Poly constant(int64_t value, size_t symbols) {
    Poly p;
    if (value != 0)
      p.terms[std::vector<int>(symbols, 0)] = value;
    return p;
  }
  static Poly symbol(size_t index, size_t symbols) {
    Poly p;
    std::vector<int> exponents(symbols, 0);
    exponents[index] = 1;
    p.terms[exponents] = 1;
    return p;
  }
  bool isConstant() const {
    return terms.empty() || (terms.size() == 1 && std::all_of(terms.begin()->first.begin(),
                                                              terms.begin()->first.end(),
                                                              [](int e) { return e == 0; }));
  }
  /// The value at `sizes`; an overflow (a hostile file) throws.
  int64_t at(const std::vector<int64_t> &sizes) const;
  friend bool operator==(const Poly &a, const Poly &b) { return a.terms == b.terms; }
  friend Poly operator+(const Poly &a, const Poly &b);
  friend Poly operator-(const Poly &a, const Poly &b) {
    Poly negated = b;
    for (auto &[e, c] : negated.terms) {
      if (c == INT64_MIN)
        throw Failure{"a size overflows 64 bits"};
      c = -c;
    }
    return a + negated;
  }
  friend Poly operator*(const Poly &a, const Poly &b);
  /// Exact division by a one-term divisor; nullopt otherwise.
  std::optional<Poly> dividedBy(const Poly &divisor) const {
    if (*this == divisor && !terms.empty())
      return constant(1, terms.begin()->first.size());
    if (divisor.terms.size() != 1)
      return std::nullopt;
    const auto &[de, dc] = *divisor.terms.begin();
    Poly r;
    for (const auto &[e, c] : terms) {
      std::vector<int> q = e;
      for (size_t s = 0; s < q.size(); ++s)
        if ((q[s] -= de[s]) < 0)
          return std::nullopt;
      if (c % dc != 0)
        return std::nullopt;
      r.terms[q] = c / dc;
    }
    return r;
  }
};

int64_t checkedProduct(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Failure{"a size overflows 64 bits"};
  return r;
}

int64_t Poly::at(const std::vector<int64_t> &sizes) const {
  int64_t sum = 0;
  for (const auto &[exponents, coefficient] : terms) {
    int64_t term = coefficient;
    for (size_t s = 0; s < exponents.size(); ++s)
      for (int e = 0; e < exponents[s]; ++e)
        term = checkedProduct(term, sizes[s]);
    if (__builtin_add_overflow(sum, term, &sum))
      throw Failure{"a size overflows 64 bits"};
  }
  return sum;
}

Poly operator+(const Poly &a, const Poly &b) {
  Poly r = a;
  for (const auto &[e, c] : b.terms) {
    int64_t &sum = r.terms[e];
    if (__builtin_add_overflow(sum, c, &sum))
      throw Failure{"a size overflows 64 bits"};
    if (sum == 0)
      r.terms.erase(e);
  }
  return r;
}

Poly operator*(const Poly &a, const Poly &b) {
  Poly r;
  for (const auto &[ea, ca] : a.terms)
    for (const auto &[eb, cb] : b.terms) {
      std::vector<int> e = ea;
      for (size_t s = 0; s < e.size(); ++s)
        if ((e[s] += eb[s]) > 64)
          throw Failure{"a size grows beyond the 64th power of a changing dimension"};
      if ((r.terms[e] += checkedProduct(ca, cb)) == 0)
        r.terms.erase(e);
    }
  return r;
}

/// Where a constant dimension or element came from: `constant`, read by node
/// `node` as input `operand`, at dimension or element `index`.
struct SlotKey {
  std::string constant;
  int node = 0, operand = 0;
  bool isValue = false;
  int64_t index = 0;
  auto tie() const { return std::tie(constant, node, operand, isValue, index); }
  bool operator<(const SlotKey &o) const { return tie() < o.tie(); }
};

/// A dimension or an integer element: its polynomial, and for one taken from
/// a constant, the slot it equals plus `offset`.
struct SymDim {
  Poly poly;
  int slot = -1;
  int64_t offset = 0;
};

struct SymTensor {
  bool known = false; // false: not followed (a rule could not say)
  std::vector<SymDim> dims;
  /// The elements of a small integer tensor, row-major, when followed.
  std::optional<std::vector<SymDim>> values;
};

/// `x` as an integer when it is one that a double holds exactly (|x| <= 2^53):
/// sizes written as floats; nullopt for a fraction, an infinity, a NaN.
std::optional<int64_t> wholeNumber(double x) {
  constexpr double kExact = 9007199254740992.0; // 2^53
  if (!(std::fabs(x) <= kExact) || x != std::trunc(x))
    return std::nullopt;
  return static_cast<int64_t>(x);
}

/// Values with at most this many elements are followed element by element.
constexpr int64_t kFollowedElements = 64;
/// Walks of the graph before the search for bound constants gives up: each
/// walk binds what the previous one found (exports need a handful).
constexpr size_t kMaxWalks = 64;

class Respecializer {
public:
  Respecializer(onnx::ModelProto &model, const std::map<std::string, std::vector<int64_t>> &newShapes,
                const TracedGraph &traced)
      : model(model), newShapes(newShapes), traced(traced) {}

  bool run(std::vector<std::string> &problems, std::vector<std::string> &notes);

private:
  // Symbols.
  size_t symbolCount() const { return tracedSizes.size(); }
  Poly constant(int64_t v) const { return Poly::constant(v, symbolCount()); }
  int64_t tracedValue(const Poly &p) const { return p.at(tracedSizes); }
  int64_t newValue(const Poly &p) const { return p.at(newSizes); }
  std::string describe(const Poly &p) const;

  // The walk.
  void walk();
  SymTensor operand(int nodeIndex, int index);
  bool isConstantSource(const std::string &name) const {
    return initializerIndex.count(name) || constantNodeOf.count(name);
  }
  const HostTensor &constantValue(const std::string &name);
  const std::vector<int64_t> *tracedShape(const std::string &name) const {
    auto it = traced.shapes.find(name);
    return it == traced.shapes.end() ? nullptr : &it->second;
  }
  SymDim fixed(int64_t v) const { return SymDim{constant(v), -1, 0}; }
  SymTensor fromTraced(const std::string &name) const;
  void define(const onnx::NodeProto &node, int output, SymTensor value);
  [[noreturn]] void fail(const onnx::NodeProto &node, const std::string &reason) const;
  std::string nodeLabel(const onnx::NodeProto &node) const;
  /// Binds `dim`'s slot so that it equals `to`; false when it has none.
  bool bind(const SymDim &dim, const Poly &to);
  /// Records that two constant dimensions must stay equal: binding one binds the other.
  void noteEqual(const SymDim &a, const SymDim &b);
  /// The dimension both sides must share; binds a constant side.
  SymDim unify(const onnx::NodeProto &node, const SymDim &a, const SymDim &b, const char *what);
  std::vector<SymDim> broadcast(const onnx::NodeProto &node, const std::vector<std::vector<SymDim>> &shapes);
  bool anySymbolic(const SymTensor &t) const;
  /// The graph input that changes and has `shape` at its traced sizes.
  const SymTensor *changedInputShaped(const std::vector<int64_t> &shape) const;
  static bool allEqual(const HostTensor &value);
  std::vector<int64_t> constantInts(int nodeIndex, int index, const char *role);
  std::vector<SymDim> valuesOf(int nodeIndex, int index, const char *role);
  void convert(int nodeIndex);
  void reshapeRule(int nodeIndex);
  void sliceRule(int nodeIndex);
  std::vector<SymDim> reshapeTargets(const onnx::NodeProto &node, const std::vector<SymDim> &input,
                                     std::vector<SymDim> target, bool allowZero);

  // The rewrite.
  void rewrite(std::vector<std::string> &notes);
  std::optional<HostTensor> extend(const HostTensor &tensor, const std::map<int64_t, int64_t> &newDims,
                                   std::string &why) const;

  onnx::ModelProto &model;
  const std::map<std::string, std::vector<int64_t>> &newShapes;
  const TracedGraph &traced;

  std::vector<int64_t> tracedSizes, newSizes;
  std::vector<std::string> symbolNames;
  std::map<std::string, int> initializerIndex;
  std::map<std::string, int> constantNodeOf;
  std::map<std::string, HostTensor> readConstants;

  std::map<SlotKey, int> slotIndex;
  std::vector<SlotKey> slots;
  std::map<int, Poly> bindings;
  /// Slots found equal (slot -> {other slot, offset}: value(other) = value(slot) + offset).
  std::map<int, std::set<std::pair<int, int64_t>>> equalSlots;
  bool boundAnew = false;
  std::optional<Failure> firstFailure;
  std::map<std::string, SymTensor> symbolic;
  /// The split axis of each SplitToSequence result.
  std::map<std::string, int64_t> sequenceAxis;
  int currentNode = -1;
  /// Whether the node being followed reads a value that changes or may.
  bool currentNodeSymbolic = false;
};

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

namespace {
const std::set<std::string> &sameShapeOps() {
  static const std::set<std::string> ops = {
      "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Neg", "Sqrt", "Reciprocal", "Exp", "Log", "Abs",
      "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Not", "IsNaN", "IsInf",
      "Cast", "CastLike", "Softmax", "LogSoftmax", "Hardmax", "Identity", "Dropout",
      "LayerNormalization", "RMSNormalization", "BatchNormalization", "InstanceNormalization",
      "GroupNormalization", "LpNormalization", "MeanVarianceNormalization", "Clip", "HardSigmoid",
      "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish",
      "ThresholdedRelu", "Shrink", "CumSum", "Trilu", "ScatterElements", "ScatterND", "Floor",
      "Ceil", "Round", "Sign", "LRN", "RotaryEmbedding", "BitwiseNot"};
  return ops;
}
const std::set<std::string> &broadcastOps() {
  static const std::set<std::string> ops = {
      "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less",
      "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Mod", "PRelu",
      "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"};
  return ops;
}
} // namespace

void Respecializer::convert(int nodeIndex) {
  const auto &node = model.graph().node(nodeIndex);
  const std::string &op = node.op_type();
  std::vector<SymTensor> inputs;
  bool symbolicIn = false;
  for (int k = 0; k < node.input_size(); ++k) {
    inputs.push_back(operand(nodeIndex, k));
    symbolicIn = symbolicIn || anySymbolic(inputs.back());
  }
  currentNodeSymbolic = symbolicIn;
  auto in = [&](int k) -> const SymTensor & {
    static const SymTensor absent;
    return k < static_cast<int>(inputs.size()) ? inputs[k] : absent;
  };
  auto rankOf = [&](int k) { return static_cast<int64_t>(in(k).dims.size()); };
  auto normalize = [&](int64_t axis, int64_t rank) {
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
      fail(node, "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
    return a;
  };
  auto known = [&](std::vector<SymDim> dims) {
    SymTensor t;
    t.known = true;
    t.dims = std::move(dims);
    return t;
  };
  if (!isDefaultDomain(node.domain()) || !in(0).known) {
    if (symbolicIn)
      fail(node, "pipec does not know how this operator carries a dimension that changes");
    for (int k = 0; k < node.output_size(); ++k)
      define(node, k, fromTraced(node.output(k)));
    return;
  }

  if (op == "Reshape")
    return reshapeRule(nodeIndex);
  if (op == "Slice")
    return sliceRule(nodeIndex);

  if (sameShapeOps().count(op)) {
    SymTensor out = known(in(0).dims);
    if (op == "Identity" || op == "Cast" || op == "CastLike")
      out.values = in(0).values;
    define(node, 0, out);
    if (op == "Dropout")
      define(node, 1, known(in(0).dims));
    for (int k = op == "Dropout" ? 2 : 1; k < node.output_size(); ++k)
      define(node, k, fromTraced(node.output(k)));
    return;
  }
  if (broadcastOps().count(op)) {
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
  if (op == "Flatten") {
    int64_t axis = intAttr(node, "axis", 1);
    axis = axis < 0 ? axis + rankOf(0) : axis;
    Poly a = constant(1), b = constant(1);
    for (int64_t k = 0; k < rankOf(0); ++k)
      (k < axis ? a : b) = (k < axis ? a : b) * in(0).dims[k].poly;
    return define(node, 0, known({SymDim{a, -1, 0}, SymDim{b, -1, 0}}));
  }
  if (op == "Transpose") {
    std::vector<int64_t> perm = intsAttr(node, "perm").value_or(std::vector<int64_t>{});
    if (perm.empty())
      for (int64_t k = rankOf(0); k-- > 0;)
        perm.push_back(k);
    std::vector<SymDim> dims;
    for (int64_t p : perm)
      dims.push_back(in(0).dims.at(normalize(p, rankOf(0))));
    return define(node, 0, known(dims));
  }
  if (op == "Concat") {
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
  if (op == "Split") {
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
  if (op == "SplitToSequence") {
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
  if (op == "SequenceAt" && sequenceAxis.count(node.input(0))) {
    SymTensor out = known(in(0).dims);
    int64_t axis = sequenceAxis.at(node.input(0));
    const auto *shape = tracedShape(node.output(0));
    if (!shape || static_cast<int64_t>(shape->size()) <= axis)
      fail(node, "the traced import did not record its output");
    out.dims[axis] = fixed((*shape)[axis]);
    return define(node, 0, out);
  }
  if (op == "Gather") {
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
  if (op == "GatherElements") {
    // Outside the axis, the indices cover the data (as exporters write it: equal).
    int64_t axis = normalize(intAttr(node, "axis", 0), rankOf(0));
    std::vector<SymDim> dims = in(1).dims;
    for (int64_t k = 0; k < rankOf(0) && k < static_cast<int64_t>(dims.size()); ++k)
      if (k != axis && tracedValue(dims[k].poly) == tracedValue(in(0).dims[k].poly))
        dims[k] = unify(node, in(0).dims[k], dims[k], "GatherElements' data and indices");
    return define(node, 0, known(dims));
  }
  if (op == "GatherND") {
    int64_t batchDims = intAttr(node, "batch_dims", 0);
    int64_t r = tracedValue(in(1).dims.back().poly);
    std::vector<SymDim> dims(in(1).dims.begin(), in(1).dims.end() - 1);
    dims.insert(dims.end(), in(0).dims.begin() + batchDims + r, in(0).dims.end());
    return define(node, 0, known(dims));
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<int64_t> axes;
    if (node.input_size() > 1 && !node.input(1).empty())
      axes = constantInts(nodeIndex, 1, "the axes");
    else if (auto a = intsAttr(node, "axes"))
      axes = *a;
    std::vector<SymDim> dims = in(0).dims;
    if (op == "Unsqueeze") {
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
  if (op == "Expand") {
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
  if (op == "Tile") {
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
  if (op == "Shape" || op == "Size") {
    int64_t rank = rankOf(0);
    int64_t start = intAttr(node, "start", 0), end = intAttr(node, "end", rank);
    start = std::clamp(start < 0 ? start + rank : start, int64_t(0), rank);
    end = std::clamp(end < 0 ? end + rank : end, int64_t(0), rank);
    std::vector<SymDim> values;
    if (op == "Size") {
      Poly product = constant(1);
      for (const auto &d : in(0).dims)
        product = product * d.poly;
      values.push_back(SymDim{product, -1, 0});
    } else {
      for (int64_t k = start; k < end; ++k)
        values.push_back(in(0).dims[k]); // a constant's dimension keeps its slot
    }
    SymTensor out = known(op == "Size" ? std::vector<SymDim>{} : std::vector<SymDim>{fixed(static_cast<int64_t>(values.size()))});
    out.values = values;
    return define(node, 0, out);
  }
  if (op == "ConstantOfShape") {
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
  if (op == "Range") {
    std::vector<SymDim> start = valuesOf(nodeIndex, 0, "Range's start"),
                        limit = valuesOf(nodeIndex, 1, "Range's limit"),
                        delta = valuesOf(nodeIndex, 2, "Range's delta");
    if (start.size() != 1 || limit.size() != 1 || delta.size() != 1)
      fail(node, "Range's operands are not scalars");
    if (!start[0].poly.isConstant() || !delta[0].poly.isConstant() || tracedValue(delta[0].poly) != 1) {
      if (symbolicIn)
        fail(node, "a range whose start or step changes size, or whose step is not 1");
      return define(node, 0, fromTraced(node.output(0)));
    }
    SymDim length{limit[0].poly - start[0].poly, limit[0].slot, -tracedValue(start[0].poly)};
    if (!limit[0].poly.isConstant())
      length.slot = -1;
    return define(node, 0, known({length}));
  }
  if (op == "MatMul") {
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
  if (op == "Gemm") {
    bool ta = intAttr(node, "transA", 0), tb = intAttr(node, "transB", 0);
    const auto &a = in(0).dims, &b = in(1).dims;
    unify(node, a[ta ? 0 : 1], b[tb ? 1 : 0], "the contracted dimension");
    std::vector<SymDim> dims = {a[ta ? 1 : 0], b[tb ? 0 : 1]};
    if (hasInput(node, 2))
      dims = broadcast(node, {dims, in(2).dims});
    return define(node, 0, known(dims));
  }
  if (op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool" || op == "LpPool" ||
      op == "GlobalAveragePool" || op == "GlobalMaxPool" || op == "DepthToSpace" || op == "SpaceToDepth" ||
      op == "Resize" || op == "Upsample") {
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
      bool windowed = op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool" || op == "LpPool";
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
  if (op.rfind("Reduce", 0) == 0 || op == "ArgMax" || op == "ArgMin") {
    std::vector<int64_t> axes;
    bool keep = intAttr(node, "keepdims", 1) != 0;
    if (op == "ArgMax" || op == "ArgMin")
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
  if (op == "Pad") {
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
  if (op == "Einsum") {
    std::string equation;
    if (const auto *a = attribute(node, "equation"))
      equation = a->s();
    equation.erase(std::remove(equation.begin(), equation.end(), ' '), equation.end());
    if (equation.find("...") != std::string::npos || equation.find("->") == std::string::npos) {
      if (symbolicIn)
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
  if (op == "LSTM" || op == "GRU" || op == "RNN") {
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
  if (op == "Attention") {
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
  if (op == "OneHot") {
    std::vector<SymDim> dims = in(0).dims;
    int64_t axis = intAttr(node, "axis", -1);
    axis = axis < 0 ? axis + rankOf(0) + 1 : axis;
    dims.insert(dims.begin() + axis, fixed(constantInts(nodeIndex, 1, "OneHot's depth").at(0)));
    return define(node, 0, known(dims));
  }
  if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") {
    if (stringAttr(node, "reduction", "mean") == "none")
      return define(node, 0, known(in(1).dims));
    define(node, 0, known({}));
    for (int k = 1; k < node.output_size(); ++k)
      define(node, k, known(in(0).dims));
    return;
  }
  if (symbolicIn)
    fail(node, "pipec does not know how " + op + " carries a dimension that changes");
  for (int k = 0; k < node.output_size(); ++k)
    define(node, k, fromTraced(node.output(k)));
}

namespace {
/// The index of each element of `shape`, row-major (a small odometer).
bool nextIndex(std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++index[d] < shape[d])
      return true;
    index[d] = 0;
  }
  return false;
}
int64_t offsetOf(const std::vector<int64_t> &index, const std::vector<int64_t> &shape) {
  int64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    offset = offset * shape[d] + index[d];
  return offset;
}
/// `v` rounded to what an element of `kind` holds.
double roundTo(ElementKind kind, double v) {
  switch (kind) {
  case ElementKind::Float32:
    return static_cast<double>(static_cast<float>(v));
  case ElementKind::Float64:
    return v;
  case ElementKind::Float16:
  case ElementKind::BFloat16:
    return v; // compared exactly: a progression of half values is rare
  default:
    return std::nearbyint(v);
  }
}
double valueAt(const HostTensor &t, int64_t offset) {
  return isFloating(t.kind) ? t.floats[offset] : static_cast<double>(t.ints[offset]);
}
} // namespace

std::optional<HostTensor> Respecializer::extend(const HostTensor &tensor,
                                                const std::map<int64_t, int64_t> &newDims,
                                                std::string &why) const {
  const std::vector<int64_t> &shape = tensor.shape;
  if (tensor.numElements() == 0) {
    why = "it is empty";
    return std::nullopt;
  }
  enum class Pattern { Equal, Progression, Band };
  std::map<int64_t, Pattern> patterns;
  std::pair<int64_t, int64_t> band{-1, -1};
  auto holds = [&](auto &&expected) {
    std::vector<int64_t> index(shape.size(), 0);
    do {
      if (valueAt(tensor, offsetOf(index, shape)) != expected(index))
        return false;
    } while (nextIndex(index, shape));
    return true;
  };
  std::vector<int64_t> open;
  for (const auto &entry : newDims) {
    const int64_t axis = entry.first;
    auto at0 = [&](std::vector<int64_t> index) {
      index[axis] = 0;
      return valueAt(tensor, offsetOf(index, shape));
    };
    if (holds([&](const std::vector<int64_t> &index) { return at0(index); })) {
      patterns[axis] = Pattern::Equal;
      continue;
    }
    if (shape[axis] >= 2) {
      // An arithmetic progression along the axis whose step may depend on the
      // other indices (positions times frequencies: rotary angles), equal
      // once rounded to the tensor's element type.
      auto at1 = [&](std::vector<int64_t> index) {
        index[axis] = 1;
        return valueAt(tensor, offsetOf(index, shape));
      };
      auto progression = [&](const std::vector<int64_t> &index) {
        return roundTo(tensor.kind, at0(index) + static_cast<double>(index[axis]) * (at1(index) - at0(index)));
      };
      if (holds(progression)) {
        patterns[axis] = Pattern::Progression;
        continue;
      }
    }
    open.push_back(axis);
  }
  // Two axes left: a band, values depending on (column - row) alone, such as
  // a causal mask; it extends when constant at both ends of the diagonals.
  if (open.size() == 2) {
    int64_t a = open[0], b = open[1];
    auto canonical = [&](std::vector<int64_t> index) {
      int64_t d = index[b] - index[a];
      index[a] = d >= 0 ? 0 : -d;
      index[b] = d >= 0 ? d : 0;
      return index;
    };
    if (holds([&](const std::vector<int64_t> &index) { return valueAt(tensor, offsetOf(canonical(index), shape)); })) {
      auto diagonal = [&](int64_t d) {
        std::vector<int64_t> index(shape.size(), 0);
        index[a] = d >= 0 ? 0 : -d;
        index[b] = d >= 0 ? d : 0;
        return valueAt(tensor, offsetOf(index, shape));
      };
      bool ok = true;
      if (newDims.at(b) > shape[b])
        ok = ok && shape[b] >= 2 && diagonal(shape[b] - 1) == diagonal(shape[b] - 2);
      if (newDims.at(a) > shape[a])
        ok = ok && shape[a] >= 2 && diagonal(-(shape[a] - 1)) == diagonal(-(shape[a] - 2));
      if (ok) {
        patterns[a] = patterns[b] = Pattern::Band;
        band = {a, b};
        open.clear();
      } else {
        why = "its values form a band along dimensions " + std::to_string(a) + " and " + std::to_string(b) +
              " that changes within the traced size, so its continuation is unknown";
        return std::nullopt;
      }
    }
  }
  if (!open.empty()) {
    why = "its values along dimension " + std::to_string(open[0]) +
          " follow no pattern pipec can extend (equal along it, an arithmetic progression, or a band "
          "such as a causal mask)";
    return std::nullopt;
  }
  HostTensor out;
  out.kind = tensor.kind;
  out.shape = shape;
  for (const auto &[axis, size] : newDims)
    out.shape[axis] = size;
  int64_t count = 1;
  for (int64_t d : out.shape)
    count = checkedProduct(count, d);
  if (count > kMaxFoldedElements) {
    why = "it would have " + std::to_string(count) + " elements";
    return std::nullopt;
  }
  std::vector<int64_t> index(out.shape.size(), 0);
  do {
    std::vector<int64_t> source = index;
    std::vector<std::pair<int64_t, int64_t>> progressions; // (axis, new index)
    for (const auto &[axis, pattern] : patterns) {
      if (pattern == Pattern::Equal)
        source[axis] = 0;
      else if (pattern == Pattern::Progression) {
        source[axis] = 0;
        progressions.push_back({axis, index[axis]});
      }
    }
    if (band.first >= 0) {
      auto [a, b] = band;
      int64_t d = std::clamp(index[b] - index[a], -(shape[a] - 1), shape[b] - 1);
      source[a] = d >= 0 ? 0 : -d;
      source[b] = d >= 0 ? d : 0;
    }
    double v = valueAt(tensor, offsetOf(source, shape));
    for (auto [axis, at] : progressions) {
      std::vector<int64_t> next = source;
      next[axis] = 1;
      v += static_cast<double>(at) * (valueAt(tensor, offsetOf(next, shape)) - valueAt(tensor, offsetOf(source, shape)));
    }
    v = roundTo(out.kind, v);
    if (isFloating(out.kind)) {
      out.floats.push_back(v);
    } else if (auto whole = wholeNumber(v)) {
      out.ints.push_back(*whole);
    } else {
      why = "its extended values leave the integers a double holds exactly";
      return std::nullopt;
    }
  } while (count > 0 && nextIndex(index, out.shape));
  return out;
}

namespace {
uint16_t floatToHalfBits(float value, bool bfloat) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (bfloat)
    return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  int32_t exponent = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = bits & 0x7FFFFF;
  if (((bits >> 23) & 0xFF) == 0xFF)
    return sign | 0x7C00 | (mantissa ? 0x200 : 0); // inf, NaN
  if (exponent >= 31)
    return sign | 0x7C00;
  if (exponent <= 0) { // subnormal or zero
    if (exponent < -10)
      return sign;
    mantissa |= 0x800000;
    return sign | static_cast<uint16_t>(mantissa >> (14 - exponent));
  }
  return sign | static_cast<uint16_t>(exponent << 10) | static_cast<uint16_t>(mantissa >> 13);
}

/// `value` as the data of `tensor` (its name and element type kept).
void storeTensor(const HostTensor &value, onnx::TensorProto &tensor) {
  std::string name = tensor.name();
  int32_t type = tensor.data_type();
  tensor.Clear();
  tensor.set_name(name);
  tensor.set_data_type(type);
  for (int64_t d : value.shape)
    tensor.add_dims(d);
  std::string raw;
  auto append = [&raw](auto sample) { raw.append(reinterpret_cast<const char *>(&sample), sizeof(sample)); };
  for (int64_t i = 0; i < value.numElements(); ++i) {
    switch (value.kind) {
    case ElementKind::Float32: append(static_cast<float>(value.floats[i])); break;
    case ElementKind::Float64: append(value.floats[i]); break;
    case ElementKind::Float16: append(floatToHalfBits(static_cast<float>(value.floats[i]), false)); break;
    case ElementKind::BFloat16: append(floatToHalfBits(static_cast<float>(value.floats[i]), true)); break;
    case ElementKind::Int64: append(value.ints[i]); break;
    case ElementKind::Int32: append(static_cast<int32_t>(value.ints[i])); break;
    case ElementKind::Int8: append(static_cast<int8_t>(value.ints[i])); break;
    case ElementKind::UInt8:
    case ElementKind::Bool: append(static_cast<uint8_t>(value.ints[i])); break;
    }
  }
  tensor.set_raw_data(raw);
}
} // namespace

void Respecializer::rewrite(std::vector<std::string> &notes) {
  auto &graph = *model.mutable_graph();
  // Bindings by constant, then by the edge (node, operand) that reads it.
  std::map<std::string, std::map<std::pair<int, int>, std::vector<int>>> bound;
  for (const auto &[slot, poly] : bindings)
    bound[slots[slot].constant][{slots[slot].node, slots[slot].operand}].push_back(slot);
  int copies = 0;
  for (const auto &[name, edges] : bound) {
    HostTensor original = constantValue(name);
    // Each edge's rewritten tensor; edges with the same result share it.
    std::vector<std::pair<std::pair<int, int>, HostTensor>> rewritten;
    for (const auto &[edge, edgeSlots] : edges) {
      std::map<int64_t, int64_t> newDims;
      std::vector<std::pair<int64_t, int64_t>> newValues;
      for (int slot : edgeSlots) {
        int64_t v = newValue(bindings.at(slot));
        if (v < 0)
          throw Failure{"constant '" + name + "' would hold " + std::to_string(v) + " (" +
                        describe(bindings.at(slot)) + ") at the new sizes"};
        if (slots[slot].isValue)
          newValues.push_back({slots[slot].index, v});
        else if (v != original.shape[slots[slot].index])
          newDims[slots[slot].index] = v;
      }
      HostTensor value = original;
      if (!newDims.empty()) {
        std::string why;
        auto extended = extend(original, newDims, why);
        if (!extended) {
          const auto &reader = graph.node(edge.first);
          std::vector<int64_t> wantedShape = original.shape;
          for (const auto &[axis, size] : newDims)
            wantedShape[axis] = size;
          throw Failure{"constant '" + name + "' " + shapeText(original.shape) + ", read by node '" +
                        (reader.name().empty() ? "#" + std::to_string(edge.first) : reader.name()) + "' (" +
                        reader.op_type() + "), must become " + shapeText(wantedShape) +
                        " (it holds the traced sizes), but " + why};
        }
        value = *extended;
        if (!newValues.empty())
          throw Failure{"constant '" + name + "' changes both its shape and its values"};
      }
      for (auto [index, v] : newValues) {
        if (isFloating(value.kind))
          value.floats[index] = static_cast<double>(v);
        else
          value.ints[index] = v;
      }
      rewritten.push_back({edge, value});
    }
    // Every node reading the constant: rewritten in place when all of them
    // read the same new tensor, otherwise each group gets its own copy.
    std::vector<std::pair<int, int>> readers;
    for (int n = 0; n < graph.node_size(); ++n)
      for (int k = 0; k < graph.node(n).input_size(); ++k)
        if (graph.node(n).input(k) == name)
          readers.push_back({n, k});
    auto same = [](const HostTensor &a, const HostTensor &b) {
      return a.shape == b.shape && a.ints == b.ints && a.floats == b.floats;
    };
    bool allSame = readers.size() == rewritten.size() &&
                   std::all_of(rewritten.begin(), rewritten.end(),
                               [&](const auto &r) { return same(r.second, rewritten[0].second); });
    bool isOutput = std::any_of(graph.output().begin(), graph.output().end(),
                                [&](const auto &o) { return o.name() == name; });
    auto describeChange = [&](const HostTensor &value) {
      return shapeText(original.shape) + (value.shape == original.shape ? " (values)" : " -> " + shapeText(value.shape));
    };
    if (allSame && !isOutput) {
      if (auto it = initializerIndex.find(name); it != initializerIndex.end()) {
        storeTensor(rewritten[0].second, *graph.mutable_initializer(it->second));
      } else {
        auto &node = *graph.mutable_node(constantNodeOf.at(name));
        int32_t type = 0;
        for (const auto &a : node.attribute())
          if (a.name() == "value")
            type = a.t().data_type();
        if (type == 0)
          type = isFloating(original.kind) ? onnx::TensorProto_DataType_FLOAT : onnx::TensorProto_DataType_INT64;
        node.clear_attribute();
        auto *attribute = node.add_attribute();
        attribute->set_name("value");
        attribute->set_type(onnx::AttributeProto_AttributeType_TENSOR);
        attribute->mutable_t()->set_data_type(type);
        storeTensor(rewritten[0].second, *attribute->mutable_t());
      }
      notes.push_back("'" + name + "' " + describeChange(rewritten[0].second));
      continue;
    }
    int32_t type = initializerIndex.count(name) ? graph.initializer(initializerIndex.at(name)).data_type() : 0;
    if (!type)
      for (const auto &a : graph.node(constantNodeOf.at(name)).attribute())
        if (a.name() == "value")
          type = a.t().data_type();
    if (!type)
      type = isFloating(original.kind) ? onnx::TensorProto_DataType_FLOAT : onnx::TensorProto_DataType_INT64;
    for (auto &[edge, value] : rewritten) {
      std::string copy = name + ".respecialized" + std::to_string(++copies);
      auto *tensor = graph.add_initializer();
      tensor->set_name(copy);
      tensor->set_data_type(type);
      storeTensor(value, *tensor);
      graph.mutable_node(edge.first)->set_input(edge.second, copy);
      const auto &reader = graph.node(edge.first);
      notes.push_back("'" + name + "' for node '" + (reader.name().empty() ? "#" + std::to_string(edge.first) : reader.name()) +
                      "' " + describeChange(value) +
                      " (as '" + copy + "')");
    }
  }
}

bool Respecializer::run(std::vector<std::string> &problems, std::vector<std::string> &notes) {
  auto &graph = *model.mutable_graph();
  for (int i = 0; i < graph.initializer_size(); ++i)
    initializerIndex[graph.initializer(i).name()] = i;
  for (int i = 0; i < graph.node_size(); ++i)
    if (graph.node(i).op_type() == "Constant" && isDefaultDomain(graph.node(i).domain()) && graph.node(i).output_size() == 1)
      constantNodeOf[graph.node(i).output(0)] = i;
  // The symbols: each (traced, new) pair of sizes a graph input changes.
  std::string change;
  for (const auto &input : graph.input()) {
    if (initializerIndex.count(input.name()))
      continue;
    auto wanted = newShapes.find(input.name());
    if (wanted == newShapes.end()) {
      problems.push_back("no new shape for input '" + input.name() + "'");
      return false;
    }
    const auto &dims = input.type().tensor_type().shape().dim();
    if (dims.size() != static_cast<int>(wanted->second.size())) {
      problems.push_back("input '" + input.name() + "' has rank " + std::to_string(dims.size()));
      return false;
    }
    std::vector<int64_t> before;
    for (int d = 0; d < dims.size(); ++d) {
      before.push_back(dims[d].has_dim_value() ? dims[d].dim_value() : wanted->second[d]);
      if (before[d] == wanted->second[d])
        continue;
      bool exists = false;
      for (size_t s = 0; s < tracedSizes.size(); ++s)
        exists = exists || (tracedSizes[s] == before[d] && newSizes[s] == wanted->second[d]);
      if (exists)
        continue;
      tracedSizes.push_back(before[d]);
      newSizes.push_back(wanted->second[d]);
      symbolNames.push_back(d == 0 ? "batch" : "'" + input.name() + "' dim " + std::to_string(d));
    }
    if (before != wanted->second)
      change += std::string(change.empty() ? "" : ", ") + "'" + input.name() + "' " + shapeText(before) + " -> " +
                shapeText(wanted->second);
  }
  try {
    // Each walk binds at least one more slot or ends the search; a slot is
    // bound once, so the walks are at most the slots' count.
    for (size_t walks = 0;; ++walks) {
      walk();
      if (!boundAnew) {
        if (firstFailure)
          throw *firstFailure;
        break;
      }
      if (walks + 1 >= kMaxWalks)
        throw Failure{"the search for the constants that hold the traced sizes does not settle in " +
                      std::to_string(kMaxWalks) + " walks of the graph"};
    }
    // The batch reaches the outputs: an output whose batch dimension stays
    // at the traced size computes on part of the new batch.
    for (size_t sym = 0; sym < symbolCount(); ++sym) {
      if (symbolNames[sym] != "batch")
        continue;
      for (const auto &output : graph.output()) {
        auto it = symbolic.find(output.name());
        if (it == symbolic.end() || it->second.dims.empty() || !tracedShape(output.name()))
          continue;
        bool follows = false;
        for (const auto &dim : it->second.dims)
          for (const auto &[exponents, coefficient] : dim.poly.terms)
            follows = follows || exponents[sym] > 0;
        if (!follows)
          throw Failure{"output '" + output.name() + "' " + shapeText(*tracedShape(output.name())) +
                        " does not follow the batch: some node computes it from the traced batch in a way "
                        "pipec does not follow"};
      }
    }
    std::vector<std::string> rewritten;
    rewrite(rewritten);
    for (auto &input : *graph.mutable_input()) {
      auto wanted = newShapes.find(input.name());
      if (wanted == newShapes.end())
        continue;
      auto *shape = input.mutable_type()->mutable_tensor_type()->mutable_shape();
      for (int d = 0; d < shape->dim_size(); ++d)
        shape->mutable_dim(d)->set_dim_value(wanted->second[d]);
    }
    // Recorded intermediate and output shapes are the traced ones.
    graph.clear_value_info();
    for (auto &output : *graph.mutable_output())
      if (output.type().has_tensor_type())
        output.mutable_type()->mutable_tensor_type()->clear_shape();
    std::string list;
    for (size_t i = 0; i < rewritten.size() && i < 8; ++i)
      list += (i ? ", " : "") + rewritten[i];
    if (rewritten.size() > 8)
      list += " and " + std::to_string(rewritten.size() - 8) + " more";
    notes.push_back("re-specialized from the traced sizes (" + change + "): " +
                    (rewritten.empty() ? std::string("no constant held them") : "rewrote " + list));
    return true;
  } catch (const Failure &failure) {
    problems.push_back("cannot re-specialize the export (" + change + "): " + failure.message);
    return false;
  }
}

} // namespace

bool respecializeModel(onnx::ModelProto &model, const std::map<std::string, std::vector<int64_t>> &newShapes,
                       const TracedGraph &traced, std::vector<std::string> &problems,
                       std::vector<std::string> &notes) {
  return Respecializer(model, newShapes, traced).run(problems, notes);
}

} // namespace pipec::import::detail

namespace pipec::import::detail {

void OnnxImporter::respecializeIfAsked() {
  const auto &graph = model.graph();
  std::set<std::string> initializerNames;
  for (const auto &tensor : graph.initializer())
    initializerNames.insert(tensor.name());
  // The shapes asked for, and the traced ones: the file's sizes where it
  // fixes them, the asked ones where it leaves them free.
  std::map<std::string, std::vector<int64_t>> wanted, tracedShapes;
  bool changes = false;
  for (const auto &input : graph.input()) {
    if (initializerNames.count(input.name()))
      continue;
    if (!input.type().has_tensor_type() || !input.type().tensor_type().has_shape())
      return; // resolveInputTypes reports what is missing
    const auto &dims = input.type().tensor_type().shape().dim();
    std::vector<int64_t> asked, before;
    auto given = options.inputShapes.find(input.name());
    if (given != options.inputShapes.end() && given->second.size() != static_cast<size_t>(dims.size()))
      return;
    for (int d = 0; d < dims.size(); ++d) {
      bool fixedInFile = dims[d].has_dim_value() && dims[d].dim_value() >= 0;
      int64_t value = fixedInFile ? dims[d].dim_value() : -1;
      if (given != options.inputShapes.end())
        value = given->second[d] == kMicrobatchDimension && d == 0 ? options.microbatchSize.value_or(-1) : given->second[d];
      else if (d == 0 && options.microbatchSize)
        value = *options.microbatchSize;
      if (value < 0)
        return; // a free dimension nobody sized: resolveInputTypes reports it
      asked.push_back(value);
      before.push_back(fixedInFile ? dims[d].dim_value() : value);
      changes = changes || before.back() != value;
    }
    wanted[input.name()] = asked;
    tracedShapes[input.name()] = before;
  }
  if (!changes)
    return;

  // The model at its traced sizes: what every value's shape was, and which
  // values were known at import.
  ImportOptions tracedOptions = options;
  tracedOptions.inputShapes = tracedShapes;
  tracedOptions.microbatchSize.reset();
  std::vector<std::string> tracedErrors;
  OnnxImporter tracedImport(context, path, tracedOptions, tracedErrors);
  mlir::OwningOpRef<mlir::ModuleOp> tracedModule = tracedImport.run(); // keeps `values` alive
  if (!tracedModule)
    return; // the sizes asked for are refused as the file's (resolveInputTypes), or the file's errors are reported
  TracedGraph traced;
  for (const auto &[name, value] : tracedImport.values)
    traced.shapes[name] = std::vector<int64_t>(typeOf(value).getShape().begin(), typeOf(value).getShape().end());
  for (const auto &[name, value] : tracedImport.constants)
    traced.shapes[name] = value.shape;
  traced.constants = std::move(tracedImport.constants);
  traced.read = [this](const onnx::TensorProto &tensor) {
    return readTensor(tensor, "initializer '" + tensor.name() + "'");
  };
  std::vector<std::string> problems, notes;
  if (!respecializeModel(model, wanted, traced, problems, notes)) {
    for (const auto &problem : problems)
      report(problem);
    abandon();
  }
  importNotes.insert(importNotes.end(), notes.begin(), notes.end());
  for (const auto &[name, shape] : wanted)
    if (shape != tracedShapes[name])
      respecializedTo += (respecializedTo.empty() ? "'" : ", '") + name + "' " + shapeText(tracedShapes[name]) +
                         " -> " + shapeText(shape);
}

} // namespace pipec::import::detail
