// bench/gpu/gemm_shapes.cu: what cuBLAS makes of the GEMM shapes of a
// transformer's training step on the card, bf16 operands, fp32
// accumulation, cublasGemmEx as runtime/kernels/cuda/src/linalg.cu calls it
// (row-major Y = A B read as column-major Y^T = B^T A^T). Median of 20 runs
// after 3 warm-ups.
// 1. A vocabulary whose size is not a multiple of 8 (GPT-2's 50,257): the
//    three GEMMs of a tied head as they are, with the rows padded (leading
//    dimension rounded up to 8), and with the vocabulary rounded up to a
//    multiple of 64 (docs/cuda-kernels.md, "Odd dimensions"); the copies
//    between V and padded rows, by cudaMemcpy2DAsync and by a kernel.
// 2. A block's four weight shapes (width C, the MLP 4C): forward into bf16,
//    input gradient into bf16, and the weight gradient as pipec's stages
//    run it (accumulated into the float gradient, beta 1) and into bf16.
// Usage: gemm_shapes [tokens=4096] [width=768] [vocabulary=50257]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace {
#define CHECK(x)                                                                                                       \
  do {                                                                                                                 \
    auto status_ = (x);                                                                                                \
    if (status_ != 0) {                                                                                                \
      std::fprintf(stderr, "%s failed: %d\n", #x, (int)status_);                                                       \
      std::exit(1);                                                                                                    \
    }                                                                                                                  \
  } while (0)

template <class F> float medianMs(F &&f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Row-major Y[M,N] = op(A) op(B) with leading dimensions lda, ldb, ldy.
void gemm(cublasHandle_t h, bool transA, bool transB, long long M, long long N, long long K, const __nv_bfloat16 *A,
          long long lda, const __nv_bfloat16 *B, long long ldb, __nv_bfloat16 *Y, long long ldy) {
  const float one = 1.0f, zero = 0.0f;
  CHECK(cublasGemmEx_64(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &one, B,
                        CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &zero, Y, CUDA_R_16BF, ldy, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT));
}

// rows x width elements from rows fromLd apart to rows toLd apart, one thread per element of the destination.
__global__ void copyRowsKernel(__nv_bfloat16 *to, long long toLd, const __nv_bfloat16 *from, long long fromLd,
                               long long rows, long long width) {
  const long long n = rows * width;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / width, c = i - r * width;
    to[r * toLd + c] = from[r * fromLd + c];
  }
}
} // namespace

int main(int argc, char **argv) {
  const long long T = argc > 1 ? atoll(argv[1]) : 4096, C = argc > 2 ? atoll(argv[2]) : 768,
                  V = argc > 3 ? atoll(argv[3]) : 50257;
  const long long Vld = (V + 7) / 8 * 8, V64 = (V + 63) / 64 * 64;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int cublasVersion = 0;
  cublasHandle_t h;
  CHECK(cublasCreate(&h));
  cublasGetVersion(h, &cublasVersion);
  CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  void *ws;
  CHECK(cudaMalloc(&ws, 32 << 20));
  CHECK(cublasSetWorkspace(h, ws, 32 << 20));
  std::printf("gemm_shapes on %s, cuBLAS %d: tokens %lld, width %lld, vocabulary %lld (rows padded to %lld, "
              "vocabulary rounded to %lld)\n",
              prop.name, cublasVersion, T, C, V, Vld, V64);
  __nv_bfloat16 *x, *w, *logits, *logitsPadded, *dx, *dw;
  CHECK(cudaMalloc(&x, T * C * 2));
  CHECK(cudaMalloc(&w, V64 * C * 2));
  CHECK(cudaMalloc(&logits, T * V64 * 2));
  CHECK(cudaMalloc(&logitsPadded, T * V64 * 2));
  CHECK(cudaMalloc(&dx, T * C * 2));
  CHECK(cudaMalloc(&dw, V64 * C * 2));
  CHECK(cudaMemset(x, 0x3c, T * C * 2));
  CHECK(cudaMemset(w, 0x3c, V64 * C * 2));
  CHECK(cudaMemset(logits, 0x3c, T * V64 * 2));
  CHECK(cudaMemset(logitsPadded, 0x3c, T * V64 * 2));
  const double flop = 2.0 * T * C * V;
  auto row = [&](const char *what, float ms) {
    std::printf("  %-58s %8.3f ms  %6.1f TFLOP/s\n", what, ms, flop / ms / 1e9);
  };
  std::printf("forward, logits[T,V] = x[T,C] w[V,C]^T\n");
  row("rows of V", medianMs([&] { gemm(h, false, true, T, V, C, x, C, w, C, logits, V); }));
  row("rows padded", medianMs([&] { gemm(h, false, true, T, V, C, x, C, w, C, logitsPadded, Vld); }));
  row("vocabulary rounded", medianMs([&] { gemm(h, false, true, T, V64, C, x, C, w, C, logitsPadded, V64); }));
  std::printf("input gradient, dx[T,C] = dlogits[T,V] w[V,C]\n");
  row("rows of V", medianMs([&] { gemm(h, false, false, T, C, V, logits, V, w, C, dx, C); }));
  row("rows padded", medianMs([&] { gemm(h, false, false, T, C, V, logitsPadded, Vld, w, C, dx, C); }));
  row("vocabulary rounded", medianMs([&] { gemm(h, false, false, T, C, V64, logitsPadded, V64, w, C, dx, C); }));
  std::printf("weight gradient, dw[V,C] = dlogits[T,V]^T x[T,C]\n");
  row("rows of V", medianMs([&] { gemm(h, true, false, V, C, T, logits, V, x, C, dw, C); }));
  row("rows padded", medianMs([&] { gemm(h, true, false, V, C, T, logitsPadded, Vld, x, C, dw, C); }));
  row("vocabulary rounded", medianMs([&] { gemm(h, true, false, V64, C, T, logitsPadded, V64, x, C, dw, C); }));
  const double bytes = 2.0 * 2.0 * T * V;
  auto copyRow = [&](const char *what, float ms) {
    std::printf("  %-58s %8.3f ms  %6.0f GB/s\n", what, ms, bytes / ms / 1e6);
  };
  std::printf("copies of [T,V] between rows of V and padded rows\n");
  copyRow("cudaMemcpy2DAsync, padded to V", medianMs([&] {
            CHECK(cudaMemcpy2DAsync(logits, V * 2, logitsPadded, Vld * 2, V * 2, T, cudaMemcpyDeviceToDevice));
          }));
  copyRow("cudaMemcpy2DAsync, V to padded", medianMs([&] {
            CHECK(cudaMemcpy2DAsync(logitsPadded, Vld * 2, logits, V * 2, V * 2, T, cudaMemcpyDeviceToDevice));
          }));
  const int blocks = prop.multiProcessorCount * 8;
  copyRow("kernel, padded to V", medianMs([&] {
            copyRowsKernel<<<blocks, 256>>>(logits, V, logitsPadded, Vld, T, V);
          }));
  copyRow("kernel, V to padded", medianMs([&] {
            copyRowsKernel<<<blocks, 256>>>(logitsPadded, Vld, logits, V, T, V);
          }));
  copyRow("cudaMemcpyAsync of the same bytes, contiguous", medianMs([&] {
            CHECK(cudaMemcpyAsync(logits, logitsPadded, T * V * 2, cudaMemcpyDeviceToDevice));
          }));
  std::printf("a block's GEMMs at %lld tokens (Y[T,N] = X[T,K] W[N,K]^T)\n", T);
  const long long shapes[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}}; // N, K: qkv, projection, MLP in, out
  const char *names[4] = {"q/k/v", "projection", "MLP in", "MLP out"};
  float *dwFloat;
  CHECK(cudaMalloc(&dwFloat, 16 * C * C * 4));
  CHECK(cudaMemset(dwFloat, 0, 16 * C * C * 4));
  for (int i = 0; i < 4; ++i) {
    const long long N = shapes[i][0], K = shapes[i][1];
    const double f = 2.0 * T * N * K;
    auto shapeRow = [&](const char *what, float ms) {
      std::printf("  %-10s N %5lld K %5lld  %-36s %8.3f ms  %6.1f TFLOP/s\n", names[i], N, K, what, ms, f / ms / 1e9);
    };
    // x, w, logits and logitsPadded are large enough for every operand here.
    shapeRow("forward, bf16 Y", medianMs([&] { gemm(h, false, true, T, N, K, logits, K, w, K, logitsPadded, N); }));
    shapeRow("input gradient, bf16 dX",
             medianMs([&] { gemm(h, false, false, T, K, N, logits, N, w, K, logitsPadded, K); }));
    const float one = 1.0f, zero = 0.0f;
    // dW[N,K] += dY^T[N,T] X[T,K]: column-major dW^T[K,N] = X^T dY.
    shapeRow("weight gradient, float dW, beta 1", medianMs([&] {
               CHECK(cublasGemmEx_64(h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, &one, logitsPadded, CUDA_R_16BF, K, logits,
                                     CUDA_R_16BF, N, &one, dwFloat, CUDA_R_32F, K, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
             }));
    shapeRow("weight gradient, bf16 dW, beta 0", medianMs([&] {
               CHECK(cublasGemmEx_64(h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, &one, logitsPadded, CUDA_R_16BF, K, logits,
                                     CUDA_R_16BF, N, &zero, dw, CUDA_R_16BF, K, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
             }));
  }
  return 0;
}
