#include "CudaKernels.h"
#include "StepVerdict.h"

#include <algorithm>
#include <cstring>

namespace pipec::rt::cudakernels {
namespace {
constexpr unsigned kThreads = 256;     // a power of two (tree reductions)
constexpr unsigned kMaxBlocks = 4096;  // grid-stride loops beyond
constexpr unsigned kMaxSumBlocks = 256;

unsigned blocksFor(size_t n, unsigned cap) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)std::max<size_t>(1, std::min<size_t>(b, cap));
}

template <class T> __global__ void scaleKernel(T *x, size_t n, double factor) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = (T)(x[i] * factor);
}

template <class T> __global__ void addKernel(T *x, const T *y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] += y[i];
}

// Sums ss/sb over the block in a fixed tree; thread 0 holds the result.
__device__ void blockSum(double *ss, double *sb) {
  for (unsigned k = kThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) ss[threadIdx.x] += ss[threadIdx.x + k], sb[threadIdx.x] += sb[threadIdx.x + k];
    __syncthreads();
  }
}

template <class T> __global__ void sumSquaresKernel(const T *x, size_t n, double *partials) {
  __shared__ double ss[kThreads], sb[kThreads];
  double s = 0, bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const double v = (double)x[i];
    if (isfinite(v))
      s += v * v;
    else
      bad += 1;
  }
  ss[threadIdx.x] = s, sb[threadIdx.x] = bad;
  __syncthreads();
  blockSum(ss, sb);
  if (threadIdx.x == 0) partials[2 * blockIdx.x] = ss[0], partials[2 * blockIdx.x + 1] = sb[0];
}

__global__ void sumPartialsKernel(const double *partials, size_t count, double *out) {
  __shared__ double ss[kThreads], sb[kThreads];
  double s = 0, bad = 0;
  for (size_t i = threadIdx.x; i < count; i += kThreads) s += partials[2 * i], bad += partials[2 * i + 1];
  ss[threadIdx.x] = s, sb[threadIdx.x] = bad;
  __syncthreads();
  blockSum(ss, sb);
  if (threadIdx.x == 0) out[0] = ss[0], out[1] = sb[0];
}

__global__ void stepControlKernel(const double *stats, double maxNorm, pipec_step_control *control) {
  *control = stepVerdict(stats, maxNorm);
}

__global__ void zeroUnlessSkippedKernel(unsigned char *p, size_t bytes, const pipec_step_control *control) {
  if (control->skip != 0) return;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
    p[i] = 0;
}

struct Bytes64 {
  unsigned char b[64];
};
__global__ void writeBytesKernel(unsigned char *dst, Bytes64 v, unsigned n) {
  if (threadIdx.x < n) dst[threadIdx.x] = v.b[threadIdx.x];
}
// Every thread compares the first `compared` bytes of the bundle with the
// expectation (a few cached loads); on a difference the payload after the
// first `header` bytes becomes all one bits: NaN in f32 and bf16, -1 in the
// integer types, so no result can silently come from it.
__global__ void guardBundleKernel(unsigned char *bundle, size_t bytes, Bytes64 expected, unsigned compared,
                                  unsigned header) {
  bool same = true;
  for (unsigned k = 0; k < compared; ++k) same &= bundle[k] == expected.b[k];
  if (same) return;
  for (size_t i = header + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x)
    bundle[i] = 0xff;
}
} // namespace

cudaError_t scale(void *x, size_t n, pipec_dtype t, double factor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned b = blocksFor(n, kMaxBlocks);
  if (t == PIPEC_F32) scaleKernel<float><<<b, kThreads, 0, stream>>>((float *)x, n, factor);
  else if (t == PIPEC_F64) scaleKernel<double><<<b, kThreads, 0, stream>>>((double *)x, n, factor);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t add(void *x, const void *y, size_t n, pipec_dtype t, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned b = blocksFor(n, kMaxBlocks);
  if (t == PIPEC_F32) addKernel<float><<<b, kThreads, 0, stream>>>((float *)x, (const float *)y, n);
  else if (t == PIPEC_F64) addKernel<double><<<b, kThreads, 0, stream>>>((double *)x, (const double *)y, n);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

unsigned sumSquaresBlocks(size_t n) { return n ? blocksFor(n, kMaxSumBlocks) : 0; }

cudaError_t sumSquares(const void *x, size_t n, pipec_dtype t, double *partials, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned b = sumSquaresBlocks(n);
  if (t == PIPEC_F32) sumSquaresKernel<float><<<b, kThreads, 0, stream>>>((const float *)x, n, partials);
  else if (t == PIPEC_F64) sumSquaresKernel<double><<<b, kThreads, 0, stream>>>((const double *)x, n, partials);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t sumPartials(const double *partials, size_t count, double *out, cudaStream_t stream) {
  sumPartialsKernel<<<1, kThreads, 0, stream>>>(partials, count, out);
  return cudaGetLastError();
}

cudaError_t stepControl(const double *stats, double maxNorm, pipec_step_control *control, cudaStream_t stream) {
  stepControlKernel<<<1, 1, 0, stream>>>(stats, maxNorm, control);
  return cudaGetLastError();
}

cudaError_t zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  zeroUnlessSkippedKernel<<<blocksFor(bytes, kMaxBlocks), kThreads, 0, stream>>>((unsigned char *)p, bytes, control);
  return cudaGetLastError();
}

cudaError_t writeBytes(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (bytes > sizeof(Bytes64)) return cudaErrorInvalidValue;
  Bytes64 v{};
  std::memcpy(v.b, src, bytes);
  writeBytesKernel<<<1, 64, 0, stream>>>((unsigned char *)dst, v, (unsigned)bytes);
  return cudaGetLastError();
}

cudaError_t guardBundle(void *bundle, size_t bytes, const void *expected, unsigned compared, unsigned header,
                        cudaStream_t stream) {
  if (bytes <= header || compared > sizeof(Bytes64) || compared > header) return cudaErrorInvalidValue;
  Bytes64 v{};
  std::memcpy(v.b, expected, compared);
  guardBundleKernel<<<blocksFor(bytes - header, 64), kThreads, 0, stream>>>((unsigned char *)bundle, bytes, v, compared,
                                                                           header);
  return cudaGetLastError();
}

} // namespace pipec::rt::cudakernels
