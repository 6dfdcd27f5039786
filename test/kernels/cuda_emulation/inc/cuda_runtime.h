// Fake CUDA runtime for host emulation of pipec's CUDA kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>
struct CUstream_st;
typedef CUstream_st *cudaStream_t;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidValue = 1,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorNoDevice = 100,
  cudaErrorNotSupported = 801,
  cudaErrorNotReady = 600,
};
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1, cudaStreamCaptureStatusInvalidated = 2 };
// A CUDA graph of the emulation: the stream work captured, in order.
struct CUgraph_st { std::vector<std::function<void()>> work; };
typedef CUgraph_st *cudaGraph_t;
struct CUgraphExec_st { std::vector<std::function<void()>> work; };
typedef CUgraphExec_st *cudaGraphExec_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
#define cudaHostAllocMapped 2
#define cudaHostAllocPortable 1
#include <cstdio>
#include "emu_ipc.h"
namespace emu {
inline cudaStream_t expectedStream = nullptr;
inline cudaStream_t blasStream = nullptr;
inline cudaError_t lastError = cudaSuccess;
// What the emulated code has issued so far, for the tests that count it
// (pipec_emu_count below): kernel launches, cuBLAS GEMMs (cublas_v2.h),
// cuBLASLt matmuls (cublasLt.h), copies and memsets on a stream, and calls
// after which the host waits for the device.
inline int gemmCalls = 0, launches = 0;
inline int ltMatmulCalls = 0;
inline int ltHeuristicCalls = 0; // cublasLtMatmulAlgoGetHeuristic calls
inline long streamCopies = 0;    // cudaMemcpyAsync
inline long streamMemsets = 0;   // cudaMemsetAsync
// cudaStreamSynchronize, cudaDeviceSynchronize and the synchronous cudaMemcpy
// block until the device is done; so do cudaFree and cudaFreeHost, which
// synchronize the device implicitly.
inline long hostSyncs = 0;
inline long cudnnExecutes = 0; // cuDNN graph executions run (cudnn_frontend.h)
inline long deviceAllocations = 0; // cudaMalloc and cudaMallocAsync calls
// PIPEC_EMU_COUNT_ONLY=1: kernels and GEMMs are counted (and their launches
// checked) but not run, so that a stage at a large shape can be counted in
// seconds (test/codegen/cuda_launch_count.py); its results are garbage.
inline const bool countOnly = [] {
  const char *v = std::getenv("PIPEC_EMU_COUNT_ONLY");
  return v && *v && *v != '0';
}();
// Stream capture (cudaStreamBeginCapture ... cudaStreamEndCapture): while a
// stream captures, work issued on it is recorded, with its arguments as they
// are now (as CUDA copies kernel arguments at capture), instead of run;
// cudaGraphLaunch runs the recording. What CUDA refuses while capturing
// (host waits, allocations, frees) invalidates the capture, as on a GPU.
inline bool capturing = false, captureInvalidated = false;
inline cudaStream_t captureStream = nullptr;
inline std::vector<std::function<void()>> recording;
inline bool replaying = false;
inline long graphLaunches = 0; // cudaGraphLaunch calls
inline long graphWork = 0;     // launches, GEMMs, copies and memsets run by graph launches
// Work on stream s: true when it was recorded into the capture (the caller
// returns without running it).
inline bool recorded(cudaStream_t s, std::function<void()> work) {
  if (!capturing) {
    if (replaying) ++graphWork;
    return false;
  }
  if (s != captureStream) {
    std::fprintf(stderr, "EMU: work on stream %p while stream %p captures\n", (void *)s, (void *)captureStream);
    std::abort();
  }
  recording.push_back(std::move(work));
  return true;
}

/// The emulation's NaN fill of fresh or reused kernel scratch (context.cu),
/// stream-ordered like a memset (recorded into a capture) but not counted
/// as the stream's work: a GPU does no such fill, so the launch counts
/// (test/codegen/cuda_launch_count.py) must not see it.
inline void fillUncounted(void *p, int value, size_t n, cudaStream_t s) {
  if (!recorded(s, [=] { std::memset(p, value, n); })) std::memset(p, value, n);
}
// A call CUDA refuses during a capture: it invalidates the capture.
inline bool refusedWhileCapturing() {
  if (capturing) captureInvalidated = true;
  return capturing;
}
// CUDA's allocations start on 256-byte boundaries (pipec's layouts rely on 64).
inline void *deviceAllocate(size_t n) { return std::aligned_alloc(256, (n + 255) / 256 * 256 + 256); }
// The emulated piperun (test/runtime: piperun_emulated) works on several streams
// (compute, one per link); there every stream is accepted.
inline bool anyStream = false;
// The emulated piperun's check that a stage's lazy initialization is over
// before its rank's first transfer (docs/runtime.md, "Ranks sharing a GPU"):
// with PIPEC_EMU_LAZY_INIT_CHECK=1, a call that waits for the device or
// allocates with cudaMalloc, issued inside a kernel-library scope (a stage
// call: pk::StreamScope counts `scopes`) after work was issued on a transfer
// stream (one created non-blocking, as the links' are), aborts: on a GPU it
// could wait for a receive that waits for this rank.
inline const bool lazyInitCheck = [] {
  const char *v = std::getenv("PIPEC_EMU_LAZY_INIT_CHECK");
  return v && *v && *v != '0';
}();
inline int scopes = 0;
inline bool transferIssued = false;
inline std::vector<const void *> transferStreams;
inline void noteTransfer(cudaStream_t s) {
  for (const void *t : transferStreams)
    if (t == s) transferIssued = true;
}
// PIPEC_EMU_CORRUPT_TRANSFER=R:N: in the process of MPI rank R, the Nth copy
// (from 1) of more than 64 bytes on a transfer stream (a bundle, not a
// header's own copy) gets its 9th byte flipped: a bundle header's
// iteration, which the runtime's checks of received headers must catch.
inline void corruptTransfer(void *dst, size_t bytes, cudaStream_t s) {
  static const auto target = [] {
    const char *v = std::getenv("PIPEC_EMU_CORRUPT_TRANSFER"), *r = std::getenv("OMPI_COMM_WORLD_RANK");
    int rank = -1, nth = 0;
    if (!v || std::sscanf(v, "%d:%d", &rank, &nth) != 2 || !r || std::atoi(r) != rank) nth = 0;
    return nth;
  }();
  static long seen = 0;
  if (target <= 0 || bytes <= 64) return;
  bool transfer = false;
  for (const void *t : transferStreams) transfer |= t == s;
  if (transfer && ++seen == target) static_cast<unsigned char *>(dst)[8] ^= 1;
}
inline void notLazily(const char *call) {
  if (!lazyInitCheck || !transferIssued || scopes <= 0) return;
  std::fprintf(stderr, "EMU: %s inside a stage call after this rank's first transfer: lazy initialization that, on "
               "a GPU, can wait for a receive that waits for this rank\n", call);
  std::fflush(stderr);
  std::abort();
}
inline void checkStream(cudaStream_t s) {
  if (s != expectedStream && !anyStream) {
    std::fprintf(stderr, "EMU: work on stream %p, expected %p\n", (void *)s, (void *)expectedStream);
    std::abort();
  }
}
}
inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline cudaError_t cudaGetLastError() { cudaError_t e = emu::lastError; emu::lastError = cudaSuccess; return e; }
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; emu::checkStream(s); ++emu::deviceAllocations; *p = emu::deviceAllocate(n); std::memset(*p, 0xff, n); return cudaSuccess; }
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; emu::checkStream(s); std::free(p); return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t n) { emu::notLazily("cudaMalloc"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::deviceAllocations; *p = emu::shareable ? emu::sharedAllocate(n) : emu::deviceAllocate(n); return *p ? cudaSuccess : cudaErrorInvalidValue; }
// For tests that load an emulated stage library: its device allocations so far.
extern "C" __attribute__((weak, visibility("default"))) long pipec_emu_device_allocations() {
  return emu::deviceAllocations;
}
// For tests that load an emulated stage library: one of the counts above so
// far, by name ("kernels", "cublas_gemms", "cublaslt_matmuls", "memcpys",
// "memsets", "host_syncs", "graph_launches", "graph_work": the launches,
// GEMMs, cuDNN executions, copies and memsets that graph launches ran, which
// the others also count; "cudnn_executes"); -1 for a name it does not know.
extern "C" __attribute__((weak, visibility("default"))) long pipec_emu_count(const char *what) {
  const struct {
    const char *name;
    long value;
  } counts[] = {{"kernels", emu::launches},
                {"cublas_gemms", emu::gemmCalls},
                {"cublaslt_matmuls", emu::ltMatmulCalls},
                {"memcpys", emu::streamCopies},
                {"memsets", emu::streamMemsets},
                {"host_syncs", emu::hostSyncs},
                {"graph_launches", emu::graphLaunches},
                {"cudnn_executes", emu::cudnnExecutes},
                {"graph_work", emu::graphWork}};
  for (const auto &count : counts)
    if (std::strcmp(count.name, what) == 0) return count.value;
  return -1;
}
inline cudaError_t cudaFree(void *p) { emu::notLazily("cudaFree"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; if (!emu::sharedFree(p)) std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { emu::notLazily("cudaMemcpy"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st) { emu::checkStream(st); emu::noteTransfer(st); if (emu::recorded(st, [=] { cudaMemcpyAsync(d, s, n, k, st); })) return cudaSuccess; ++emu::streamCopies; if (d != s) std::memcpy(d, s, n); emu::corruptTransfer(d, n, st); return cudaSuccess; }
// CUDA's rules: each pitch at least the width; one stream copy.
inline cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height, cudaMemcpyKind k, cudaStream_t st) { emu::checkStream(st); if (width > dpitch || width > spitch) return cudaErrorInvalidValue; if (emu::recorded(st, [=] { cudaMemcpy2DAsync(d, dpitch, s, spitch, width, height, k, st); })) return cudaSuccess; ++emu::streamCopies; for (size_t r = 0; r < height; ++r) std::memmove(static_cast<char *>(d) + r * dpitch, static_cast<const char *>(s) + r * spitch, width); return cudaSuccess; }
// CUDA's rules: the pitch at least the width; one stream memset.
inline cudaError_t cudaMemset2DAsync(void *d, size_t pitch, int v, size_t width, size_t height, cudaStream_t st) { emu::checkStream(st); if (width > pitch) return cudaErrorInvalidValue; if (emu::recorded(st, [=] { cudaMemset2DAsync(d, pitch, v, width, height, st); })) return cudaSuccess; ++emu::streamMemsets; for (size_t r = 0; r < height; ++r) std::memset(static_cast<char *>(d) + r * pitch, v, width); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) { emu::checkStream(st); if (emu::recorded(st, [=] { cudaMemsetAsync(d, v, n, st); })) return cudaSuccess; ++emu::streamMemsets; std::memset(d, v, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { emu::notLazily("cudaStreamSynchronize"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { emu::notLazily("cudaDeviceSynchronize"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; return cudaSuccess; }
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; *p = std::calloc(1, n); return cudaSuccess; }
inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) { *d = h; return cudaSuccess; }
inline cudaError_t cudaFreeHost(void *p) { if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; std::free(p); return cudaSuccess; }
inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  if (emu::capturing) return cudaErrorStreamCaptureUnsupported;
  emu::checkStream(s);
  emu::capturing = true;
  emu::captureInvalidated = false;
  emu::captureStream = s;
  emu::recording.clear();
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  if (!emu::capturing || s != emu::captureStream) return cudaErrorInvalidValue;
  emu::capturing = false;
  *graph = nullptr;
  std::vector<std::function<void()>> work = std::move(emu::recording);
  emu::recording.clear();
  if (emu::captureInvalidated) return cudaErrorStreamCaptureInvalidated;
  *graph = new CUgraph_st{std::move(work)};
  return cudaSuccess;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long = 0) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  emu::checkStream(s);
  if (emu::capturing || emu::replaying) return cudaErrorInvalidValue;
  ++emu::graphLaunches;
  emu::replaying = true;
  for (const auto &work : exec->work) work();
  emu::replaying = false;
  return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
  *status = emu::capturing && s == emu::captureStream
                ? (emu::captureInvalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) { delete graph; return cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) { delete exec; return cudaSuccess; }

// ---------------------------------------------------------------- the
// device, streams, events and CUDA IPC, for the emulated piperun. Work runs
// when it is issued, so every event has completed when recorded and every
// stream waits for nothing. One emulated GPU unless PIPEC_EMU_GPUS says
// more, the same in every process: ranks on one node share them.
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };
struct CUmemPool_st;
typedef CUmemPool_st *cudaMemPool_t;
struct CUevent_st { int unused = 0; };
typedef CUevent_st *cudaEvent_t;
struct cudaUUID_t { char bytes[16]; };
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  cudaUUID_t uuid;
};
#define cudaStreamNonBlocking 1
#define cudaEventDisableTiming 2
#define cudaEventInterprocess 4
#define cudaIpcMemLazyEnablePeerAccess 1
struct cudaIpcMemHandle_t { char reserved[64]; };
struct cudaIpcEventHandle_t { char reserved[64]; };
inline const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
// PIPEC_EMU_GPUS=N: the node has N emulated GPUs (default 1), told apart by
// their UUIDs, so that ranks on different ones take NCCL (the fake nccl.h).
namespace emu {
inline const int gpus = [] {
  const char *v = std::getenv("PIPEC_EMU_GPUS");
  const int n = v ? std::atoi(v) : 1;
  return n >= 1 && n <= 9 ? n : 1;
}();
} // namespace emu
inline cudaError_t cudaGetDeviceCount(int *n) { *n = emu::gpus; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int d) { return d >= 0 && d < emu::gpus ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "emulated GPU");
  p->major = 9, p->minor = 0;
  char uuid[17];
  std::snprintf(uuid, sizeof uuid, "pipec-emulated-%d", d % 10);
  std::memcpy(p->uuid.bytes, uuid, 16);
  return cudaSuccess;
}
inline cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
inline cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
inline cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = reinterpret_cast<cudaStream_t>(new char); return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int) {
  cudaStreamCreate(s);
  if (flags & cudaStreamNonBlocking) emu::transferStreams.push_back(*s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) { delete reinterpret_cast<char *>(s); return cudaSuccess; }
inline cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) { *least = 0, *greatest = -5; return cudaSuccess; }
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int) { *pool = nullptr; return cudaSuccess; }
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void *) { return cudaSuccess; }
inline cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }
inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = new CUevent_st; return cudaSuccess; }
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t s) { emu::checkStream(s); return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t, unsigned) { emu::checkStream(s); emu::noteTransfer(s); return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { emu::notLazily("cudaEventSynchronize"); if (emu::refusedWhileCapturing()) return cudaErrorStreamCaptureUnsupported; ++emu::hostSyncs; return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
// CUDA IPC between processes: a cudaMalloc allocation is shareable when the
// emulation was started with PIPEC_EMU_IPC=1 (emu_ipc.h: memory-mapped
// files); otherwise, as on machines that refuse IPC, cudaIpcGetMemHandle
// fails. Events need no sharing: they have always completed.
inline cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
  return emu::sharedHandle(p, h->reserved, sizeof h->reserved) ? cudaSuccess : cudaErrorNotSupported;
}
inline cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned) {
  *p = emu::sharedOpen(h.reserved);
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaIpcCloseMemHandle(void *p) { return emu::sharedClose(p) ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t) {
  if (!emu::shareable) return cudaErrorNotSupported;
  std::memset(h, 0, sizeof *h);
  return cudaSuccess;
}
inline cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t) { return cudaEventCreate(e); }
