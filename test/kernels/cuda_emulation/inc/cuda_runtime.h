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
inline int gemmCalls = 0, launches = 0;
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
inline cudaError_t cudaFree(void *p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t st) { emu::checkStream(st); if (d != s) std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) { emu::checkStream(st); std::memset(d, v, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { *p = std::calloc(1, n); return cudaSuccess; }
inline cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) { *d = h; return cudaSuccess; }
inline cudaError_t cudaFreeHost(void *p) { std::free(p); return cudaSuccess; }
