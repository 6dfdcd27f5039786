// Tensors known at import time (initializers, Constant nodes and the results
// of shape computations) and the ONNX ops the importer folds on them.
// Plain C++: no MLIR, no ONNX headers, so it is cheap to include and test.
#ifndef PIPEC_COMPILER_IMPORT_HOSTTENSOR_H
#define PIPEC_COMPILER_IMPORT_HOSTTENSOR_H

#include <cstdint>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipec::import {

/// Element kinds the importer keeps; ONNX's element types map onto them
/// (see docs/importer.md). Integers are kept exactly in int64, floating
/// point in double (exact for float32, float16 and bfloat16 values).
enum class ElementKind { Float32, Float64, Float16, BFloat16, Int64, Int32, Int8, UInt8, Bool };

bool isFloating(ElementKind kind);
/// The kind pipec computes and trains a value of `kind` in: float32 for every
/// floating kind (float32 master weights for float16, bfloat16 and float64
/// files; docs/importer.md), the kind itself otherwise. Values computed at
/// import keep their own kind until they become IR.
ElementKind trainingKind(ElementKind kind);
const char *elementKindName(ElementKind kind);

/// Raised by the fold kernels on operands they cannot handle; the importer
/// turns it into an error naming the node.
struct FoldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The most elements a tensor computed at import time may have: the results
/// of folded shape computations (ConstantOfShape, Expand, Range, Concat,
/// Gather, broadcasting arithmetic, ...). The host keeps 8 bytes per element,
/// so this bounds one folded value to 512 MiB; a model asking for more (e.g.
/// `Range(0, 2^40)`) is refused with an error naming the node instead of
/// being materialised (docs/security.md). Integer folding is checked too: an
/// overflow, a division by zero or `INT64_MIN / -1` is a FoldError.
inline constexpr int64_t kMaxFoldedElements = int64_t(1) << 26;

/// The element count of `shape` for a value computed at import time by `op`:
/// throws FoldError on a negative dimension or beyond kMaxFoldedElements.
int64_t foldedElementCount(const std::vector<int64_t> &shape, const std::string &op);

struct HostTensor {
  ElementKind kind = ElementKind::Float32;
  std::vector<int64_t> shape;
  std::vector<double> floats; // when isFloating(kind)
  std::vector<int64_t> ints;  // otherwise (Bool as 0/1)

  int64_t numElements() const;
  double asDouble(int64_t index) const;
  int64_t asInt(int64_t index) const;
  /// The values as integers; for shape-like operands (Reshape, Slice, ...).
  std::vector<int64_t> toInts() const;

  static HostTensor ofInts(ElementKind kind, std::vector<int64_t> shape,
                           std::vector<int64_t> values);
  static HostTensor ofFloats(ElementKind kind, std::vector<int64_t> shape,
                             std::vector<double> values);
};

/// The fold kernels, one per ONNX operator that shape sub-graphs use. Each
/// takes the node's inputs (absent optional inputs as nullptr) and its
/// attributes already decoded, and follows the ONNX specification.
namespace fold {
HostTensor cast(const HostTensor &input, ElementKind to);
HostTensor binary(const std::string &op, const HostTensor &lhs, const HostTensor &rhs);
HostTensor unary(const std::string &op, const HostTensor &input);
HostTensor where(const HostTensor &condition, const HostTensor &x, const HostTensor &y);
HostTensor gather(const HostTensor &data, const HostTensor &indices, int64_t axis);
HostTensor concat(const std::vector<const HostTensor *> &inputs, int64_t axis);
HostTensor reshape(const HostTensor &input, std::vector<int64_t> shape);
HostTensor transpose(const HostTensor &input, const std::vector<int64_t> &perm);
HostTensor slice(const HostTensor &input, const std::vector<int64_t> &starts,
                 const std::vector<int64_t> &ends, const std::vector<int64_t> &steps);
HostTensor expand(const HostTensor &input, const std::vector<int64_t> &shape);
HostTensor range(const HostTensor &start, const HostTensor &limit, const HostTensor &delta);
/// The ONNX Reduce* operator `op` over normalized `axes` (none: each element
/// alone); integers (Sum, Prod, Max, Min, SumSquare, L1) checked for overflow.
HostTensor reduce(const std::string &op, const HostTensor &input, const std::vector<int64_t> &axes,
                  bool keepdims);
// Indexing (HostTensorIndexing.cpp).
HostTensor trilu(const HostTensor &input, int64_t k, bool upper);
HostTensor cumSum(const HostTensor &input, int64_t axis, bool exclusive, bool reverse);
HostTensor tile(const HostTensor &input, const std::vector<int64_t> &repeats);
/// GatherElements and ScatterElements (one index per element along `axis`).
HostTensor gatherAlongAxis(const HostTensor &data, const HostTensor &indices, int64_t axis);
HostTensor scatterAlongAxis(const HostTensor &data, const HostTensor &indices,
                            const HostTensor &updates, int64_t axis, const std::string &reduction);
HostTensor gatherND(const HostTensor &data, const HostTensor &indices, int64_t batchDims);
HostTensor scatterND(const HostTensor &data, const HostTensor &indices, const HostTensor &updates,
                     const std::string &reduction);
} // namespace fold

/// A shape for messages, "[2,3,4]". A hostile file can give a tensor millions
/// of dimensions, so at most the first 16 are written ("[1,1,...] (2000000
/// dimensions)"): a message must stay short and cheap to build.
template <typename Dims> std::string shapeText(const Dims &dims) {
  constexpr size_t kShown = 16;
  std::string text = "[";
  size_t count = 0;
  for (auto d : dims) {
    if (count == kShown) {
      text += ",...";
      break;
    }
    text += (count++ ? "," : "") + std::to_string(static_cast<int64_t>(d));
  }
  text += "]";
  const size_t rank = static_cast<size_t>(std::distance(std::begin(dims), std::end(dims)));
  if (rank > kShown)
    text += " (" + std::to_string(rank) + " dimensions)";
  return text;
}

/// `value` wrapped to the width of integer kind `kind` (two's complement, as
/// C++ and numpy do); Bool becomes 0/1, Int64 stays as it is.
int64_t wrapInteger(ElementKind kind, int64_t value);

/// `tensor` in its trainingKind: floating values rounded to float32 (exact
/// from float16 and bfloat16).
HostTensor inTrainingKind(const HostTensor &tensor);

/// Copies one element between tensors of the same kind.
void copyElement(HostTensor &to, int64_t toIndex, const HostTensor &from, int64_t fromIndex);

/// Row-major strides of `shape`, in elements.
std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape);

/// Numpy broadcast of two shapes; throws FoldError when incompatible.
std::vector<int64_t> broadcastShape(const std::vector<int64_t> &lhs,
                                    const std::vector<int64_t> &rhs);

/// ONNX Reshape's target resolution: 0 copies the input dimension (unless
/// allowZero), one -1 is inferred. Throws FoldError with the reason.
std::vector<int64_t> resolveReshape(const std::vector<int64_t> &input,
                                    const std::vector<int64_t> &target, bool allowZero);

/// ONNX Slice's clamping of one axis: returns normalized {start, end} for
/// the given step (end -1 means "past the first element" for negative steps).
std::pair<int64_t, int64_t> normalizeSliceBounds(int64_t start, int64_t end,
                                                 int64_t step, int64_t dim);

} // namespace pipec::import

#endif // PIPEC_COMPILER_IMPORT_HOSTTENSOR_H
