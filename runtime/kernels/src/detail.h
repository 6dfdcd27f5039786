// Internal helpers of the CPU kernels: shape checks, row-major strides,
// broadcast iteration, the [outer, axis, inner] view of a shape.
#ifndef PIPEC_CPU_KERNELS_DETAIL_H
#define PIPEC_CPU_KERNELS_DETAIL_H

#include "pipec/cpu_kernels.h"

#include <array>
#include <vector>

namespace pipec::kernels::detail {

[[noreturn]] inline void fail(const char *op, const std::string &message) {
  throw KernelError(std::string(op) + ": " + message);
}

/// Row-major strides.
inline std::array<int64_t, kMaxRank> stridesOf(const Shape &s) {
  std::array<int64_t, kMaxRank> st{};
  int64_t acc = 1;
  for (int i = s.size - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s.v[i];
  }
  return st;
}

inline int64_t productOf(const Shape &s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; ++i) n *= s.v[i];
  return n;
}

/// A shape seen around one axis: [outer, size, inner].
struct AxisView {
  int64_t outer, size, inner;
};
inline AxisView viewAround(const Shape &s, int axis) {
  return {productOf(s, 0, axis), s.v[axis], productOf(s, axis + 1, s.size)};
}

/// Broadcast strides of `in` (right-aligned) against the output shape `out`:
/// 0 along axes where `in` has size 1 or is missing.
inline std::array<int64_t, kMaxRank> broadcastStrides(const Shape &in, const Shape &out) {
  std::array<int64_t, kMaxRank> st{};
  auto own = stridesOf(in);
  int lead = out.size - in.size;
  for (int i = 0; i < out.size; ++i) {
    if (i < lead) continue;
    st[i] = in.v[i - lead] == 1 ? 0 : own[i - lead];
  }
  return st;
}

/// Calls f(outIndex, offsets) for every element of `out` in row-major
/// order, offsets[k] being the flat offset into operand k (broadcast).
template <size_t NOP, class F>
void broadcastLoop(const Shape &out, const std::array<const Shape *, NOP> &ins, F &&f) {
  const int64_t total = out.numel();
  if (total == 0) return;
  std::array<int64_t, NOP> off{};
  if (out.size == 0) {
    f(int64_t(0), off);
    return;
  }
  std::array<std::array<int64_t, kMaxRank>, NOP> st;
  for (size_t k = 0; k < NOP; ++k) st[k] = broadcastStrides(*ins[k], out);
  const int r = out.size;
  const int64_t inner = out.v[r - 1];
  std::array<int64_t, NOP> innerSt;
  for (size_t k = 0; k < NOP; ++k) innerSt[k] = st[k][r - 1];
  int64_t idx[kMaxRank] = {};
  for (int64_t base = 0; base < total; base += inner) {
    std::array<int64_t, NOP> o = off;
    for (int64_t j = 0; j < inner; ++j) {
      f(base + j, o);
      for (size_t k = 0; k < NOP; ++k) o[k] += innerSt[k];
    }
    for (int axis = r - 2; axis >= 0; --axis) {
      for (size_t k = 0; k < NOP; ++k) off[k] += st[k][axis];
      if (++idx[axis] < out.v[axis]) break;
      for (size_t k = 0; k < NOP; ++k) off[k] -= st[k][axis] * out.v[axis];
      idx[axis] = 0;
    }
  }
}

/// Does `in` broadcast to exactly `out`?
inline bool broadcastsTo(const Shape &in, const Shape &out) {
  if (in.size > out.size) return false;
  int lead = out.size - in.size;
  for (int i = 0; i < in.size; ++i)
    if (in.v[i] != 1 && in.v[i] != out.v[i + lead]) return false;
  return true;
}

/// A per-thread scratch buffer that grows and is reused across calls.
inline float *scratch(size_t slot, size_t count) {
  thread_local std::vector<float> buffers[4];
  std::vector<float> &b = buffers[slot];
  if (b.size() < count) b.resize(count);
  return b.data();
}

} // namespace pipec::kernels::detail

#endif // PIPEC_CPU_KERNELS_DETAIL_H
