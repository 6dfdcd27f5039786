// Helpers that the reference kernels' files share: multi-index iteration,
// broadcasting, operand checks. Private to the kernel files (defined in
// Kernels.cpp); Kernels.h is the evaluator's interface.
#ifndef PIPEC_COMPILER_EVALUATOR_KERNELSINTERNAL_H
#define PIPEC_COMPILER_EVALUATOR_KERNELSINTERNAL_H

#include "compiler/Evaluator/Kernels.h"

#include <cstdint>
#include <vector>

namespace pipec::eval::detail {

int64_t product(const std::vector<int64_t> &shape);

/// Row-major strides of a shape.
std::vector<int64_t> stridesOf(const std::vector<int64_t> &shape);

/// Advances a row-major multi-index; false after the last one.
bool nextIndex(std::vector<int64_t> &index, const std::vector<int64_t> &shape);

/// Calls visit(multiIndex) for every index of `shape` in row-major order.
template <typename Visit> void forEachIndex(const std::vector<int64_t> &shape, Visit visit) {
  if (product(shape) == 0)
    return;
  std::vector<int64_t> index(shape.size(), 0);
  do
    visit(index);
  while (nextIndex(index, shape));
}

/// The flat offset into a tensor of shape `from` (right-aligned against the
/// output index, numpy style) of output multi-index `index`: broadcast axes
/// of size 1 always read position 0.
int64_t broadcastOffset(const std::vector<int64_t> &index, const std::vector<int64_t> &from);

/// The importer's numpy broadcast, reporting failures as evaluator errors.
std::vector<int64_t> broadcastTwo(const std::vector<int64_t> &lhs,
                                  const std::vector<int64_t> &rhs);

/// Sums values of shape `from` down to `to`, which broadcasts to `from`
/// (numpy style, right-aligned).
std::vector<double> sumToShape(const std::vector<double> &values, const std::vector<int64_t> &from,
                               const std::vector<int64_t> &to);

/// Copies one element between tensors of the same kind (data movement ops).
using import::copyElement;

/// Rounds a kernel's result to its element type (the last step of a kernel).
Tensor finish(Tensor tensor);

void requireFloating(const Tensor &tensor, const char *what);
void requireRank(const Tensor &tensor, size_t atLeast, const char *what);
/// Same element kind and shape; `what` leads the message.
void requireSameShape(const Tensor &a, const Tensor &b, const char *what);
/// A negative axis counts from the end; throws when out of range.
int64_t normalizeAxis(int64_t axis, int64_t rank);

/// Splits a shape around one axis: [outer, axis size, inner].
struct AxisView {
  int64_t outer, size, inner;
  int64_t at(int64_t o, int64_t i, int64_t in) const { return (o * size + i) * inner + in; }
};
AxisView viewAround(const std::vector<int64_t> &shape, int64_t axis);

} // namespace pipec::eval::detail

#endif // PIPEC_COMPILER_EVALUATOR_KERNELSINTERNAL_H
