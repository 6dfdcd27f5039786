// pipec's CUDA kernel library: the functions that generated CUDA stage code
// (`--target cuda`, one call per `nn` op) runs. The API mirrors the CPU
// kernel library (pipec/cpu_kernels.h) function for function, with the same
// names, signatures and semantics, so that one code generator serves both
// targets; docs/cuda-kernels.md describes what differs.
//
// Conventions, beyond those of cpu_kernels.h:
// - Every tensor pointer is device memory; shapes and attributes are host
//   values (they are static: checks run on the host before any launch and
//   throw pipec::kernels::KernelError naming the op).
// - Kernels run asynchronously on the stream bound by the innermost
//   StreamScope of the calling thread (the stage ABI's `stream`); nothing
//   synchronizes except copyToHost and profileClock.
// - Errors only the data can reveal (an index or a label out of range, an
//   integer division by zero) are recorded by the kernel in a flag and
//   thrown by raiseDeviceErrors(), which generated code calls at the end of
//   every entry point; the bad element is skipped (written as 0).
// - Math: float32 storage everywhere. With Precision::BF16, GEMMs and
//   convolutions run on tensor cores with bfloat16 inputs and float32
//   accumulation (CUBLAS_COMPUTE_32F_FAST_16BF), with Precision::TF32 with
//   TF32 inputs (CUBLAS_COMPUTE_32F_FAST_TF32); element-wise, reduction,
//   normalization, softmax, loss and optimizer kernels stay float32, so the
//   master weights and optimizer state are float32. With Precision::F32 the
//   GEMMs are plain float32 (no TF32).
// - Data-movement templates are instantiated for float, double, int64_t,
//   int32_t and uint8_t, like the CPU library's.
#ifndef PIPEC_CUDA_KERNELS_H
#define PIPEC_CUDA_KERNELS_H

#include "pipec/kernel_scratch.h" // Workspace: a call's scratch in the stage's arena
#include "pipec/kernel_types.h" // Dims, Shape, KernelError, kinds, shape rules, dropout keys

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace pipec::kernels::cuda {

// The host-side vocabulary is the CPU library's.
using kernels::Binary;
using kernels::BinaryGrad;
using kernels::binaryGradKind;
using kernels::broadcastShape;
using kernels::Dims;
using kernels::dropoutOpId;
using kernels::dropoutStreamKey;
using kernels::dropoutUniform;
using kernels::gemmOperandShape;
using kernels::KernelError;
using kernels::kMaxDims;
using kernels::kMaxRank;
using kernels::matmulShape;
using kernels::OptimizerTensor;
using kernels::Reduction;
using kernels::reductionKind;
using kernels::Shape;
using kernels::sliceShape;
using kernels::Unary;
using kernels::unaryKind;
using kernels::windowOutputSize;
using kernels::Workspace;

//===----------------------------------------------------------------------===//
// Execution context
//===----------------------------------------------------------------------===//

using Precision = ::pipec::Precision; // pipec/vocabulary.h: fp32, tf32, bf16

/// Binds `stream` (a cudaStream_t; nullptr is the legacy default stream) and
/// the GEMM precision for the kernels this thread launches until the scope
/// ends; scopes nest. Generated entry points open one per call. A thread's
/// kernel scratch and cuBLASLt workspace are shared by its streams: when a
/// thread moves to another stream, the kernels first wait for the previous
/// stream (synchronizing it), so a stream a thread used must not be
/// destroyed while the thread may still launch kernels.
class StreamScope {
public:
  StreamScope(void *stream, Precision precision);
  ~StreamScope();
  StreamScope(const StreamScope &) = delete;
  StreamScope &operator=(const StreamScope &) = delete;

private:
  void *previousStream_;
  Precision previousPrecision_;
};

/// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the
/// scope's stream): a value's storage inside one generated function.
void *deviceAllocate(size_t bytes);
void deviceFree(void *pointer);
template <class T> class DeviceBuffer {
public:
  explicit DeviceBuffer(int64_t count)
      : data_(static_cast<T *>(deviceAllocate(static_cast<size_t>(count > 0 ? count : 1) * sizeof(T)))) {}
  ~DeviceBuffer() { deviceFree(data_); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  T *data() { return data_; }

private:
  T *data_;
};

/// A constant table of generated code, uploaded to the current device on
/// first use and kept for the life of the process.
class DeviceConstant {
public:
  DeviceConstant(const void *host, size_t bytes);
  ~DeviceConstant();
  DeviceConstant(const DeviceConstant &) = delete;
  DeviceConstant &operator=(const DeviceConstant &) = delete;
  void *get() const { return device_; }

private:
  void *device_ = nullptr;
};

/// Copies device memory to the host on the scope's stream and waits for the
/// copy (and everything before it on the stream).
void copyToHost(void *host, const void *device, size_t bytes);
/// device[0] = value on the scope's stream, the value carried by the
/// kernel's argument: no host memory is read later, nothing waits, and a
/// CUDA graph can capture it (a copy from pageable memory can do neither).
void storeScalar(float *device, float value);
/// to[i] += from[i] (weight-gradient accumulation of the stage ABI).
void accumulate(float *to, const float *from, int64_t n);
/// Seconds on a steady clock after the scope's stream has drained, so that
/// differences time the kernels between two calls (piperun --profile only).
double profileClock();
/// Throws KernelError (naming the op) if a kernel recorded an error since
/// the last call; also reports failed launches (cudaGetLastError).
void raiseDeviceErrors();

#include "pipec/kernel_api.inc"

//===----------------------------------------------------------------------===//
// What only CUDA declares this way
//===----------------------------------------------------------------------===//

/// nn.equal.
template <class T> void equal(const T *a, const Shape &as, const T *b, const Shape &bs, uint8_t *out) {
  cuda::compare<T>(Binary::Equal, a, as, b, bs, out); // not kernels::compare, which ADL also finds
}
/// nn.max_pool: padding never wins (it is -infinity). y has pipec::kernels::poolOutputShape (cpu_kernels.h).
void maxPool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
             const Dims &pads, const Dims &dilations, bool ceilMode);
/// nn.average_pool: the divisor counts the window's positions inside the
/// input, or with countIncludePad inside the padded input (positions past
/// the end padding, which only ceil mode creates, never count).
void averagePool(const float *x, const Shape &xs, float *y, const Dims &kernel, const Dims &strides,
                 const Dims &pads, bool ceilMode, bool countIncludePad);
/// nn.average_pool_grad: dx (shape xs) from dy.
void averagePoolGrad(const float *dy, float *dx, const Shape &xs, const Dims &kernel,
                     const Dims &strides, const Dims &pads, bool ceilMode, bool countIncludePad);
/// nn.reduce_sum over sorted, unique, non-negative axes (keepdims does not
/// change the data). No axes: a copy. With accumulate each sum (rounded to
/// float) is added into y (a parameter's gradient buffer).
void reduceSum(const float *x, const Shape &xs, const Dims &axes, float *y, bool accumulate = false);
/// nn.reduce_mean over sorted, non-negative axes; no axes: all axes.
void reduceMean(const float *x, const Shape &xs, const Dims &axes, float *y);

} // namespace pipec::kernels::cuda

#endif // PIPEC_CUDA_KERNELS_H
