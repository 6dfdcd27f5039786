// pipec's CPU kernel library: the functions that generated CPU stage code
// (`--target cpu`, one call per `nn` op) runs. docs/cpu-kernels.md describes
// the conventions; each kernel names the `nn` op whose semantics it
// implements (dialects/nn/NNOps.td, NNGradOps.td).
//
// Conventions, in short:
// - Tensors are dense, row-major, and owned by the caller; a kernel writes
//   every element of its outputs (no accumulation unless it says so).
// - A tensor is a pointer plus a `Shape` (rank <= kMaxRank); attribute lists
//   (axes, strides, pads, perm, ...) are `Dims`. Both are built from brace
//   lists in generated code: `Shape{8, 64}`, `Dims{1, 1, 1, 1}`.
// - float32 data; indices and labels int64_t or int32_t; masks and Equal
//   results uint8_t (0/1). Data-movement kernels are templates instantiated
//   for float, double, int64_t, int32_t and uint8_t.
// - Attributes arrive normalized as the `nn` dialect holds them (axes
//   non-negative where the op says so, explicit pads: begin pads of every
//   axis, then end pads).
// - Errors (shapes that do not fit, an index out of range, an unknown kind)
//   throw pipec::kernels::KernelError with the op's name; shapes are static,
//   so checks cost nothing per element. Stage code catches the error and
//   returns it through pipec_stage_last_error().
// - Outputs must not alias inputs unless a kernel says it may.
// - Kernels that need scratch memory (convolutions, layer norm, pooling,
//   the loss, reductions) take a trailing Workspace: the memory
//   pipec/kernel_scratch.h's query for the call says it needs, which -O2
//   stage code places in the stage's arena. Without one they use growable
//   buffers of the calling thread (allocated once they must grow).
// - GEMMs and convolutions go through cblas_sgemm (OpenBLAS, kept on one
//   thread): a large product is split into panels fixed by its shape that
//   run on OpenMP threads, like the other hot loops when a call touches
//   >= 32768 elements. setThreads(n) sets the team; results are bitwise the
//   same for every n.
#ifndef PIPEC_CPU_KERNELS_H
#define PIPEC_CPU_KERNELS_H

#include "pipec/kernel_scratch.h"
#include "pipec/kernel_types.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace pipec::kernels {


/// Sets the threads the kernels use (values < 1 mean 1): the OpenMP team
/// size of the calling thread (omp_set_num_threads) for the GEMM panels and
/// the element-wise, normalization, softmax, reduction, im2col/col2im,
/// pooling, transpose/expand and optimizer loops; OpenBLAS stays on one
/// thread. Results do not depend on it: work is split only over independent
/// output elements, rows or GEMM panels fixed by the shape, never inside a
/// floating-point sum (docs/cpu-kernels.md, "Threads"). Without a call, the
/// team size comes from OMP_NUM_THREADS (else all cores).
void setThreads(int threads);
/// The OpenMP team size kernels called from this thread may use (1 when
/// the library was built without OpenMP).
int threads();
/// The former name of setThreads (kept for bench/kernels' `--threads N`).
void setBlasThreads(int threads);
/// nn.conv result shape for input [N, C, d...] and weight [F, C/group, k...].
Shape convOutputShape(const Shape &x, const Shape &w, const Dims &strides, const Dims &pads,
                      const Dims &dilations);
/// nn.max_pool / nn.average_pool result shape (empty dilations mean all 1).
Shape poolOutputShape(const Shape &x, const Dims &kernel, const Dims &strides, const Dims &pads,
                      const Dims &dilations, bool ceilMode);

/// A dropout stream key (pipec::kernels::dropoutStreamKey) as the kernels take it.
using DropoutKey = uint64_t;

#include "pipec/kernel_api.inc"

//===----------------------------------------------------------------------===//
// What only the CPU declares this way
//===----------------------------------------------------------------------===//

/// nn.equal.
template <class T> void equal(const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  compare(Binary::Equal, a, as, b, bs, out);
}
/// nn.max_pool: padding never wins (it is -infinity). y has poolOutputShape.
void maxPool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
             const Dims &pads, const Dims &dilations, bool ceilMode, const Workspace &scratch = {});
/// nn.average_pool: the divisor counts the window's positions inside the
/// input, or with countIncludePad inside the padded input (positions past
/// the end padding, which only ceil mode creates, never count).
void averagePool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
                 const Dims &pads, bool ceilMode, bool countIncludePad, const Workspace &scratch = {});
/// nn.average_pool_grad: dx (shape xs) from dy.
void averagePoolGrad(const float *dy, float *dx, const Shape &xs, const Dims &kernel,
                     const Dims &strides, const Dims &pads, bool ceilMode, bool countIncludePad,
                     const Workspace &scratch = {});
/// nn.reduce_sum over sorted, unique, non-negative axes (keepdims does not
/// change the data). No axes: a copy. With accumulate each sum (rounded to
/// float) is added into y (a parameter's gradient buffer).
void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y, const Workspace &scratch = {},
               bool accumulate = false);
/// nn.reduce_mean over sorted, non-negative axes; no axes: all axes.
void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y, const Workspace &scratch = {});

} // namespace pipec::kernels

#endif // PIPEC_CPU_KERNELS_H
