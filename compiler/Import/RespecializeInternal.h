// The re-specializer's types, shared by its four files (docs/importer.md,
// "Another batch or sequence length"): the polynomials in the symbols
// (RespecializePoly.cpp), the symbolic walk of the graph
// (RespecializeWalk.cpp), the per-op shape rules (RespecializeRules.cpp) and
// the rewrite of the bound constants (Respecialize.cpp).
#ifndef PIPEC_COMPILER_IMPORT_RESPECIALIZEINTERNAL_H
#define PIPEC_COMPILER_IMPORT_RESPECIALIZEINTERNAL_H

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

namespace pipec::import::detail::respecialize {


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

/// a * b; an overflow (a hostile file) throws.
int64_t checkedProduct(int64_t a, int64_t b);

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
inline std::optional<int64_t> wholeNumber(double x) {
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
  // The node being followed, by its operator's shape rule (OnnxOps.h).
  void convert(int nodeIndex);
  /// Its operand `k`; an unknown tensor past the last.
  const SymTensor &in(int k) const;
  int64_t rankOf(int k) const { return static_cast<int64_t>(in(k).dims.size()); }
  /// `axis` in [0, rank); refuses the node otherwise.
  int64_t normalize(int64_t axis, int64_t rank) const;
  static SymTensor known(std::vector<SymDim> dims);
  // The shape rules (RespecializeRules.cpp), one per ShapeRule.
  void unfollowedRule(const onnx::NodeProto &node);
  void sameShapeRule(const onnx::NodeProto &node, bool values, int outputs);
  void reshapeRule(int nodeIndex);
  void sliceRule(int nodeIndex);
  void broadcastRule(const onnx::NodeProto &node);
  void flattenRule(const onnx::NodeProto &node);
  void transposeRule(const onnx::NodeProto &node);
  void concatRule(const onnx::NodeProto &node);
  void splitRule(const onnx::NodeProto &node, int nodeIndex);
  void splitToSequenceRule(const onnx::NodeProto &node);
  void gatherRule(const onnx::NodeProto &node);
  void gatherElementsRule(const onnx::NodeProto &node);
  void gatherNDRule(const onnx::NodeProto &node);
  void expandRule(const onnx::NodeProto &node, int nodeIndex);
  void tileRule(const onnx::NodeProto &node, int nodeIndex);
  void constantOfShapeRule(const onnx::NodeProto &node, int nodeIndex);
  void rangeRule(const onnx::NodeProto &node, int nodeIndex);
  void matMulRule(const onnx::NodeProto &node);
  void gemmRule(const onnx::NodeProto &node);
  void padRule(const onnx::NodeProto &node, int nodeIndex);
  void einsumRule(const onnx::NodeProto &node);
  void attentionRule(const onnx::NodeProto &node);
  void sequenceAtRule(const onnx::NodeProto &node);
  void squeezeOrUnsqueezeRule(const onnx::NodeProto &node, int nodeIndex, bool unsqueeze);
  void shapeOrSizeRule(const onnx::NodeProto &node, bool size);
  void spatialRule(const onnx::NodeProto &node, bool windowed);
  void reductionRule(const onnx::NodeProto &node, int nodeIndex, bool argReduce);
  void recurrentRule(const onnx::NodeProto &node);
  void lossRule(const onnx::NodeProto &node);
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
  /// The operands of the node being followed, and whether one is a value
  /// that changes or may.
  std::vector<SymTensor> inputs;
  bool currentNodeSymbolic = false;
};

} // namespace pipec::import::detail::respecialize

#endif // PIPEC_COMPILER_IMPORT_RESPECIALIZEINTERNAL_H
