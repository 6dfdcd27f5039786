// Fake CUDA runtime for host emulation of pipec's CUDA kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
struct CUstream_st;
typedef CUstream_st *cudaStream_t;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidConfiguration = 9, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
#define cudaHostAllocMapped 2
#define cudaHostAllocPortable 1
#include <cstdio>
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
inline long deviceAllocations = 0; // cudaMalloc and cudaMallocAsync calls
inline void checkStream(cudaStream_t s) {
  if (s != expectedStream) {
    std::fprintf(stderr, "EMU: work on stream %p, expected %p\n", (void *)s, (void *)expectedStream);
    std::abort();
  }
}
}
inline const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
inline cudaError_t cudaGetLastError() { cudaError_t e = emu::lastError; emu::lastError = cudaSuccess; return e; }
inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { emu::checkStream(s); ++emu::deviceAllocations; *p = std::malloc(n); std::memset(*p, 0xff, n); return cudaSuccess; }
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { emu::checkStream(s); std::free(p); return cudaSuccess; }
inline cudaError_t cudaMalloc(void **p, size_t n) { ++emu::deviceAllocations; *p = std::malloc(n); return cudaSuccess; }
// For tests that load an emulated stage library: its device allocations so far.
extern "C" __attribute__((weak, visibility("default"))) long pipec_emu_device_allocations() {
  return emu::deviceAllocations;
}
// For tests that load an emulated stage library: one of the counts above so
// far, by name ("kernels", "cublas_gemms", "cublaslt_matmuls", "memcpys",
// "memsets", "host_syncs"); -1 for a name it does not know.
extern "C" __attribute__((weak, visibility("default"))) long pipec_emu_count(const char *what) {
  const struct {
    const char *name;
    long value;
  } counts[] = {{"kernels", emu::launches},
                {"cublas_gemms", emu::gemmCalls},
                {"cublaslt_matmuls", emu::ltMatmulCalls},
                {"memcpys", emu::streamCopies},
                {"memsets", emu::streamMemsets},
                {"host_syncs", emu::hostSyncs}};
  for (const auto &count : counts)
    if (std::strcmp(count.name, what) == 0) return count.value;
  return -1;
}
inline cudaError_t cudaFree(void *p) { ++emu::hostSyncs; std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { ++emu::hostSyncs; std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t st) { emu::checkStream(st); ++emu::streamCopies; if (d != s) std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) { emu::checkStream(st); ++emu::streamMemsets; std::memset(d, v, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { ++emu::hostSyncs; return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { ++emu::hostSyncs; return cudaSuccess; }
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { *p = std::calloc(1, n); return cudaSuccess; }
inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) { *d = h; return cudaSuccess; }
inline cudaError_t cudaFreeHost(void *p) { ++emu::hostSyncs; std::free(p); return cudaSuccess; }
