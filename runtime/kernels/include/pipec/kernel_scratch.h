// The scratch memory of kernel calls, planned at compile time
// (docs/optimization.md, "Kernel scratch"). pipec-plan-memory asks these
// functions how much scratch each kernel call of a stage needs and places
// it in the stage's arena, live only during the call; generated code passes
// that memory to the kernel as a Workspace. The same functions size the
// kernels' own growable buffers when a caller (a test, a benchmark, -O0
// code) passes none, so that the plan and the kernels cannot disagree.
//
// Plain C++17 with no dependency beyond pipec/kernel_types.h: the compiler,
// the CPU kernels and the CUDA kernels all link it.
#ifndef PIPEC_KERNEL_SCRATCH_H
#define PIPEC_KERNEL_SCRATCH_H

#include "pipec/kernel_types.h"
#include "pipec/vocabulary.h"

#include <cstdint>

namespace pipec::kernels {

/// Every scratch buffer starts on a 64-byte boundary (a cache line; the
/// arena's own alignment).
constexpr int64_t kScratchAlignment = 64;

/// The scratch one kernel call needs: `shared` bytes the call lays out
/// once, and `perThread` bytes for each thread of its parallel loops (CPU
/// only: a CUDA call needs no per-thread part).
struct ScratchNeed {
  int64_t shared = 0;
  int64_t perThread = 0;
  /// One buffer of `count` T's in the shared / per-thread part.
  template <class T> void addShared(int64_t count) { shared += alignedScratchBytes(count * sizeof(T)); }
  template <class T> void addPerThread(int64_t count) { perThread += alignedScratchBytes(count * sizeof(T)); }
  bool empty() const { return shared == 0 && perThread == 0; }
  static int64_t alignedScratchBytes(int64_t bytes) {
    return bytes <= 0 ? 0 : (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
  }
};

/// Memory a caller provides for one kernel call's scratch: `sharedBytes`
/// at `shared`, and `threads` parts of `perThreadBytes` each from
/// `perThread` on (the part of OpenMP thread t at perThread + t *
/// perThreadBytes). Generated -O2 code passes the places pipec-plan-memory
/// chose; a default Workspace (nothing bound) makes the kernel use growable
/// buffers of its calling thread instead. A kernel checks that a bound
/// Workspace holds what its ScratchNeed says, for every thread it may use,
/// and throws KernelError otherwise.
struct Workspace {
  void *shared = nullptr;
  int64_t sharedBytes = 0;
  void *perThread = nullptr;
  int64_t perThreadBytes = 0;
  int threads = 0;
  bool bound() const { return shared != nullptr || perThread != nullptr; }
};

/// The kernel library whose scratch is asked for: their algorithms differ
/// (the CPU runs Winograd and per-thread columns, CUDA im2col in chunks of
/// samples).
using ScratchTarget = ::pipec::Target; // pipec/vocabulary.h

/// nn.conv, nn.conv_input_grad and nn.conv_weight_grad with the operands of
/// the kernels' signatures (x's shape, w's shape and the attributes).
/// channelsLast (CUDA only; KernelError for the CPU): xs and ws are the
/// channels-last shapes [N, d..., C] and [F, k..., C/group] the CUDA
/// kernels take with channelsLast.
ScratchNeed convScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                        const Dims &pads, const Dims &dilations, int64_t group, bool channelsLast = false);
ScratchNeed convInputGradScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                                 const Dims &pads, const Dims &dilations, int64_t group, bool channelsLast = false);
ScratchNeed convWeightGradScratch(ScratchTarget target, const Shape &xs, const Shape &ws, const Dims &strides,
                                  const Dims &pads, const Dims &dilations, int64_t group, bool accumulate = false,
                                  bool channelsLast = false);
/// nn.attention and nn.attention_grad (query, key and value shapes): a
/// block of score rows (two for the gradient: P and dz), per thread on the
/// CPU, for every slice at once on CUDA (plus the rows' dot products of the
/// gradient).
ScratchNeed attentionScratch(ScratchTarget target, const Shape &qs, const Shape &ks, const Shape &vs,
                             AttentionLayout layout = AttentionLayout::HeadMajor);
ScratchNeed attentionGradScratch(ScratchTarget target, const Shape &qs, const Shape &ks, const Shape &vs,
                                 AttentionLayout layout = AttentionLayout::HeadMajor);

/// nn.layer_norm (bs null without a bias), nn.layer_norm_grad (the scale's
/// shape) and nn.layer_norm_param_grad (the parameters' shape; withBias
/// when the call computes dbias).
ScratchNeed layerNormScratch(ScratchTarget target, const Shape &xs, const Shape &ss, const Shape *bs, int64_t axis);
ScratchNeed layerNormGradScratch(ScratchTarget target, const Shape &xs, const Shape &ss, int64_t axis);
ScratchNeed layerNormParamGradScratch(ScratchTarget target, const Shape &xs, const Shape &ps, int64_t axis,
                                      bool withBias, bool accumulate = false);
/// nn.softmax_cross_entropy_loss (gradient false) and its gradient on
/// scores [N, C, d...].
ScratchNeed softmaxCrossEntropyScratch(ScratchTarget target, const Shape &ss, Reduction reduction, bool gradient);
/// nn.reduce_sum and nn.reduce_mean over `axes` (none: nn.reduce_mean
/// reduces every axis, nn.reduce_sum none).
ScratchNeed reduceScratch(ScratchTarget target, const Shape &xs, const Dims &axes, bool emptyMeansAll);
/// nn.max_pool, nn.average_pool and their gradients (`maxPoolGrad` for
/// nn.max_pool_grad); channelsLast (CUDA only): xs is [N, d..., C].
ScratchNeed poolScratch(ScratchTarget target, const Shape &xs, const Dims &kernel, const Dims &strides,
                        const Dims &pads, const Dims &dilations, bool ceilMode, bool maxPoolGrad,
                        bool channelsLast = false);

} // namespace pipec::kernels

#endif // PIPEC_KERNEL_SCRATCH_H
