// Internal helpers of the CUDA kernels (runtime/kernels/cuda/src): error
// reporting, the execution context a StreamScope binds, launch geometry.
// Implemented in context.cu.
#ifndef PIPEC_CUDA_KERNELS_DETAIL_CUH
#define PIPEC_CUDA_KERNELS_DETAIL_CUH

#include "pipec/cuda_kernels.h"
#include "pipec/cuda_row_norm.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace pipec::kernels::cuda::detail {

[[noreturn]] void fail(const char *op, const std::string &message);
/// Throws KernelError "op: <CUDA error string>" unless status is cudaSuccess.
void check(cudaError_t status, const char *op);
void checkBlas(cublasStatus_t status, const char *op);
/// After a launch: reports a launch failure (cudaGetLastError) for `op`.
void checkLaunch(const char *op);

/// The current CUDA device, checked to be one the library keeps state for.
int deviceIndex(const char *op);

/// The innermost StreamScope's stream and precision (default stream, F32
/// outside any scope).
cudaStream_t stream();
Precision precision();
/// This thread's cuBLAS handle for the current device, bound to stream().
cublasHandle_t blas();

/// This thread's cuBLASLt handle for the current device and its matmul
/// workspace (kBlasLtWorkspaceBytes, allocated on first use and kept).
struct BlasLt {
  cublasLtHandle_t handle;
  void *workspace;
};
constexpr size_t kBlasLtWorkspaceBytes = size_t(32) << 20; // what cuBLASLt's guide suggests for Hopper
/// The workspace's last bytes: the copy of a GEMM's float bias in a bf16 Y's
/// type (linalg.cu); cuBLASLt is offered the rest.
constexpr size_t kBlasLtBiasCopyBytes = size_t(64) << 10;
BlasLt blasLt();

/// Errors only device code can see. A kernel writes the first one it meets
/// with raiseDevice(flag, code); raiseDeviceErrors() turns it into a
/// KernelError naming the op. The flag lives in mapped pinned host memory,
/// so reading it never synchronizes.
enum DeviceError : int {
  kNoError = 0,
  kGatherIndexOutOfRange = 1,     // nn.gather
  kGatherGradIndexOutOfRange = 2, // nn.gather_grad
  kLossLabelOutOfRange = 3,       // nn.softmax_cross_entropy_loss(_grad)
  kIntegerDivisionByZero = 4,     // nn.div, nn.mod, nn.fmod on integers
  kIntegerNegativeExponent = 5,   // nn.pow on integers
};
/// Device pointer of the error flag of the current device.
int *errorFlag();
__device__ inline void raiseDevice(int *flag, int code) { atomicCAS(flag, 0, code); }

using cuda::kPackOf; // pipec/cuda_row_norm.cuh

/// 1-D launch geometry: `threads` per block, enough blocks for n elements
/// (grid-stride loops cover the rest; at least one block).
constexpr int kThreads = 256;
unsigned blocksFor(int64_t n);

/// Kernel scratch when the caller passes no Workspace (nn::Scratch): this
/// thread's buffer `slot` on the current device, at least `bytes` long. It
/// grows (stream-ordered) when a call needs more and is kept, so only the
/// first calls of a stage allocate. A kernel call takes all its scratch
/// from slot 0, and no kernel holds a slot while it calls another kernel
/// that uses scratch; slot 1 holds what a convolution's weight gradient
/// or bf16 call keeps while the call it makes uses slot 0 (conv.cu: the
/// sum to add, the bf16 dW, float32 copies).
constexpr int kScratchSlots = 2;
void *scratch(int slot, size_t bytes);

/// This thread's arrival counters on the current device, at least `count`
/// of them: zero before every kernel that uses them, which must leave them
/// zero (the "last block finishes" reductions of batch_norm_nhwc.cu: the
/// last block to arrive resets its counter). Zeroed once when allocated, so
/// that no call spends a memset on them; grown as scratch is, never inside
/// a graph capture, and kept. Kernels on one stream take turns on them.
unsigned *zeroedCounters(size_t count);

/// Throws KernelError "op: `what` inside a CUDA graph capture" when the
/// scope's stream is capturing: library memory allocated there would be a
/// graph memory node, whose address means nothing outside the graph. Called
/// before any state changes, so that CallGraphs runs the call launch by
/// launch instead.
void failIfCapturing(const char *op, const char *what);

} // namespace pipec::kernels::cuda::detail

#endif // PIPEC_CUDA_KERNELS_DETAIL_CUH
