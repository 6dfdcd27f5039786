// What pipec's calls into cuDNN's graph API (cudnn_frontend, header-only)
// share: attention_cudnn.cu (flash attention) and conv_cudnn.cu
// (convolutions); docs/cuda-kernels.md. One cuDNN handle per thread and
// device, graphs built once per shape and kept by their callers, and the
// memory a call's graph works in. Host code only: nvcc's device passes skip
// it and the frontend's headers.
#ifndef PIPEC_CUDA_KERNELS_CUDNN_GRAPHS_CUH
#define PIPEC_CUDA_KERNELS_CUDNN_GRAPHS_CUH

#include "detail.cuh"

#if defined(PIPEC_HAVE_CUDNN) || defined(PIPEC_CUDA_EMULATION)
#define PIPEC_CUDNN_GRAPHS 1
#endif

#if !defined(__CUDA_ARCH__) && defined(PIPEC_CUDNN_GRAPHS)
#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace pipec::kernels::cuda::dnn {

namespace fe = cudnn_frontend;

/// A built graph and its workspace, or (graph null) cuDNN's refusal.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspaceBytes = 0;
};

/// This thread's cuDNN handle on the current device, bound to the stream;
/// null when cuDNN cannot be used (not loadable, older than pipec needs, no
/// handle on this device), said once on stderr with `fallback` (what runs
/// instead).
cudnnHandle_t handle(const char *op, const char *fallback);

/// Builds `graph` into `plan` (validate, the operation graph, the engines
/// of heuristics `modes`, cuDNN's support check, the plans); with
/// `deterministic`, only engines whose results do not depend on the run.
/// False, with cuDNN's reason in `why`, where cuDNN refuses; the frontend's
/// exceptions (a part of cuDNN it cannot load) are refusals too.
bool build(std::shared_ptr<fe::graph::Graph> graph, cudnnHandle_t handle, const std::vector<fe::HeurMode_t> &modes,
           bool deterministic, Plan &plan, std::string &why);

/// The device memory of a call's graph (`bytes`): the call's planned
/// workspace when it is bound and large enough, else the library's scratch
/// (allocated outside any CUDA graph capture, on a stage's first call).
char *callMemory(const Workspace &workspace, int64_t bytes);

/// Runs `plan` with `pack` (tensor uid -> device pointer) and its workspace
/// at `workspace`; a failure is a KernelError naming `op`.
void execute(const char *op, cudnnHandle_t handle, const Plan &plan, std::unordered_map<int64_t, void *> &pack,
             void *workspace);

/// Row-major strides of `dims`.
std::vector<int64_t> rowMajorStrides(const std::vector<int64_t> &dims);
/// The strides of logical dims [N, C, d...] stored channels-last [N, d..., C]
/// (cuDNN's NHWC: dims stay in N, C, spatial order, the strides say where
/// each axis lies).
std::vector<int64_t> channelsLastStrides(const std::vector<int64_t> &dims);

/// Whether every pointer is 16-byte aligned, as cuDNN reads and writes its
/// tensors (generated code's tensors are 64-byte aligned).
bool aligned16(std::initializer_list<const void *> pointers);

} // namespace pipec::kernels::cuda::dnn

#endif
#endif // PIPEC_CUDA_KERNELS_CUDNN_GRAPHS_CUH
