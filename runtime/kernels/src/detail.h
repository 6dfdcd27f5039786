// Internal helpers of the CPU kernels: shape checks, row-major strides,
// broadcast iteration, the [outer, axis, inner] view of a shape.
#ifndef PIPEC_CPU_KERNELS_DETAIL_H
#define PIPEC_CPU_KERNELS_DETAIL_H

#include "pipec/cpu_kernels.h"
#include "pipec/kernel_scratch.h"

#include <algorithm>
#include <cmath>
#include <array>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

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

/// broadcastLoop over the output rows (units of the innermost axis)
/// [rowBegin, rowEnd): the same calls, in the same order, as the part of the
/// full loop that writes those rows.
template <size_t NOP, class F>
void broadcastRows(const Shape &out, const std::array<std::array<int64_t, kMaxRank>, NOP> &st, int64_t rowBegin,
                   int64_t rowEnd, F &f) {
  const int r = out.size;
  const int64_t inner = out.v[r - 1];
  int64_t idx[kMaxRank] = {};
  std::array<int64_t, NOP> off{};
  for (int64_t rest = rowBegin, axis = r - 2; axis >= 0; --axis) { // the row's multi-index
    idx[axis] = rest % out.v[axis];
    rest /= out.v[axis];
    for (size_t k = 0; k < NOP; ++k) off[k] += idx[axis] * st[k][axis];
  }
  std::array<int64_t, NOP> innerSt;
  for (size_t k = 0; k < NOP; ++k) innerSt[k] = st[k][r - 1];
  for (int64_t row = rowBegin; row < rowEnd; ++row) {
    std::array<int64_t, NOP> o = off;
    const int64_t base = row * inner;
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
  broadcastRows<NOP>(out, st, 0, total / out.v[out.size - 1], f);
}

//===----------------------------------------------------------------------===//
// Threads (docs/cpu-kernels.md, "Threads")
//===----------------------------------------------------------------------===//
// Kernels split work over OpenMP threads only where the pieces are
// independent: each output element is computed by one thread with the same
// operations in the same order as with one thread, so results are bitwise
// the same for every thread count. No floating-point sum is ever split
// across threads. Bodies run inside a parallel region and must not throw:
// kernels check their inputs before.

/// Work (elements touched) below which a kernel stays on the calling thread:
/// starting the team costs a few microseconds.
constexpr int64_t kParallelMin = 32768;

/// Threads worth using for `work` elements split into `pieces` independent
/// pieces: 1 below kParallelMin, else at most one per kParallelMin / 2
/// elements, the pieces, and the thread count in force (setThreads).
inline int threadsFor(int64_t work, int64_t pieces) {
#ifdef _OPENMP
  if (work < kParallelMin || pieces < 2 || omp_in_parallel()) return 1;
  const int64_t t = std::min<int64_t>({(int64_t)omp_get_max_threads(), pieces, work / (kParallelMin / 2)});
  return t < 1 ? 1 : (int)t;
#else
  (void)work, (void)pieces;
  return 1;
#endif
}

/// Calls f(begin, end) on contiguous, disjoint ranges that cover [0, n),
/// one per thread (one call [0, n) when work < kParallelMin). `work` is the
/// elements the whole loop touches (n itself for an element-wise loop).
template <class F> void parallelRanges(int64_t n, int64_t work, F &&f) {
  const int t = threadsFor(work, n);
  if (t <= 1) {
    if (n > 0) f(int64_t(0), n);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(t)
  {
    const int64_t id = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b = n * id / nt, e = n * (id + 1) / nt;
    if (b < e) f(b, e);
  }
#endif
}

/// Element-wise: f(begin, end) over [0, n) in parallel ranges.
template <class F> void parallelElements(int64_t n, F &&f) { parallelRanges(n, n, std::forward<F>(f)); }

#if defined(__x86_64__) && defined(__GNUC__)
/// f(lo, hi) with f and everything it calls inlined here and compiled for
/// AVX2; only called on a CPU that has it.
template <class F> __attribute__((target("avx2"), flatten)) void callWithAvx2(const F &f, int64_t lo, int64_t hi) {
  f(lo, hi);
}
#endif

/// f(lo, hi) on the widest vectors this CPU has: the library is built for
/// the baseline x86-64 (SSE2), and a loop f runs twice as many lanes under
/// AVX2. The results are the same bits either way: lanes are independent
/// IEEE operations, a sum keeps its lane order, and no build fuses a
/// multiply-add (-ffp-contract=off, runtime/kernels/CMakeLists.txt).
template <class F> void withWidestVectors(const F &f, int64_t lo, int64_t hi) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool hasAvx2 = __builtin_cpu_supports("avx2");
  if (hasAvx2) return callWithAvx2(f, lo, hi);
#endif
  f(lo, hi);
}

/// Σ f(i) over [0, n): eight lanes of Acc (independent chains the compiler
/// vectorizes, where one running sum would wait on each add) combined in
/// double in a fixed order, so the result does not depend on threads or on
/// the vector width.
template <class Acc = float, class F> double laneSum(int64_t n, F f) {
  Acc acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += (Acc)f(i + l);
  double s = 0;
  for (; i < n; ++i) s += f(i);
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

/// parallelRanges and parallelElements whose ranges run on the widest
/// vectors (withWidestVectors).
template <class F> void parallelVectorRanges(int64_t n, int64_t work, const F &f) {
  parallelRanges(n, work, [&](int64_t lo, int64_t hi) { withWidestVectors(f, lo, hi); });
}
template <class F> void parallelVectorElements(int64_t n, const F &f) { parallelVectorRanges(n, n, f); }

/// broadcastLoop for loops whose calls are independent (each writes only
/// output element i and throws nothing): split over rows across threads.
template <size_t NOP, class F>
void parallelBroadcastLoop(const Shape &out, const std::array<const Shape *, NOP> &ins, F &&f) {
  const int64_t total = out.numel();
  if (total == 0) return;
  if (out.size == 0) {
    std::array<int64_t, NOP> off{};
    f(int64_t(0), off);
    return;
  }
  std::array<std::array<int64_t, kMaxRank>, NOP> st;
  for (size_t k = 0; k < NOP; ++k) st[k] = broadcastStrides(*ins[k], out);
  const int64_t rows = total / out.v[out.size - 1];
  parallelRanges(rows, total, [&](int64_t b, int64_t e) { broadcastRows<NOP>(out, st, b, e, f); });
}

using kernels::broadcastsTo; // pipec/kernel_types.h, shared with the CUDA library

/// One kernel call's scratch (pipec/kernel_scratch.h): the caller's
/// Workspace when it bound one, else growable buffers of the calling thread
/// that keep their size (no allocation once they fit). Buffers are taken in
/// the order the call's ScratchNeed lists them: shared ones on the calling
/// thread, per-thread ones inside a parallel body from thread().
class Scratch {
public:
  /// Checks a bound workspace against `need` for every thread the call may
  /// use (throws KernelError naming `op`), or sizes the growable buffers.
  Scratch(const char *op, const Workspace &ws, const ScratchNeed &need);
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  ~Scratch();

  /// The next shared buffer of `count` T's.
  template <class T> T *shared(int64_t count) { return reinterpret_cast<T *>(take(next_, count * sizeof(T))); }

  /// A thread's part, taken buffer by buffer.
  class Thread {
  public:
    explicit Thread(char *next) : next_(next) {}
    template <class T> T *take(int64_t count) { return reinterpret_cast<T *>(Scratch::take(next_, count * sizeof(T))); }

  private:
    char *next_;
  };
  /// The part of the calling OpenMP thread (0 outside a parallel region).
  Thread thread() const {
#ifdef _OPENMP
    const int t = omp_get_thread_num();
#else
    const int t = 0;
#endif
    return Thread(perThread_ + t * perThreadBytes_);
  }

private:
  static char *take(char *&next, int64_t bytes) {
    char *p = next;
    next += ScratchNeed::alignedScratchBytes(bytes);
    return p;
  }
  char *next_ = nullptr, *perThread_ = nullptr;
  int64_t perThreadBytes_ = 0;
  bool growable_ = false;
};

//===----------------------------------------------------------------------===//
// GEMM and convolution internals (linalg.cpp, conv_winograd.cpp)
//===----------------------------------------------------------------------===//

/// What a GEMM does to each panel of C right after computing it, on the
/// thread that computed it, while it is still in cache: nothing; C = f(C)
/// (`activation`; with `preActivation`, C's values before f are first
/// copied there); or C = f'(x) · C (`activation` and `derivativeAt` x).
/// preActivation and derivativeAt are [M, N] with C's leading dimension.
struct GemmEpilogue {
  std::optional<Unary> activation;
  float *preActivation = nullptr;
  const float *derivativeAt = nullptr;
  GemmEpilogue(std::optional<Unary> activation = std::nullopt, float *preActivation = nullptr,
               const float *derivativeAt = nullptr)
      : activation(activation), preActivation(preActivation), derivativeAt(derivativeAt) {}
};

/// Row-major C[M,N] = alpha * op(A) op(B) + beta * C with leading
/// dimensions, then the epilogue; the same bits for every thread count.
void sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, const GemmEpilogue &epilogue = {});

/// The work of an M x N x K product in the units parallelRanges weighs
/// (elements touched): its multiply-adds, of which a core runs dozens in the
/// time it touches one element.
inline int64_t gemmWork(int64_t M, int64_t N, int64_t K) { return M * N * K / 64; }

/// first[i] += rest[0][i] + ... + rest[slices - 2][i], added in slice order
/// (rest holds slices - 1 arrays of `size`), so the sum of a weight
/// gradient's slices does not depend on the thread count.
void addSlicesInOrder(float *first, const float *rest, int64_t slices, int64_t size);

/// y = conv(x, w) + bias (if any) by Winograd F(2x2, 3x3), where
/// plan::winogradApplies (scratch: plan::addCpuConvForwardScratch).
void winogradConv(const ConvGeom &g, const float *x, const float *w, const float *bias, float *y, Scratch &scratch);
/// dw = the weight gradient of conv(x, w) for dy, by Winograd F(2x2, 3x3)
/// (scratch: plan::addCpuConvWeightGradScratch).
void winogradWeightGrad(const ConvGeom &g, const float *dy, const float *x, float *dw, Scratch &scratch);

} // namespace pipec::kernels::detail

#endif // PIPEC_CPU_KERNELS_DETAIL_H
