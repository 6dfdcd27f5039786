#pragma once
#include "cuda_runtime.h"
typedef struct cublasContext *cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0 };
enum cudaDataType { CUDA_R_32F = 0 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16BF = 75, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
inline const char *cublasGetStatusString(cublasStatus_t) { return "emulated cublas error"; }
inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)0x1; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t s) { emu::blasStream = s; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasGemmStridedBatchedEx_64(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void *alpha, const void *A, cudaDataType, int64_t lda, long long sA, const void *B, cudaDataType, int64_t ldb, long long sB,
    const void *beta, void *C, cudaDataType, int64_t ldc, long long sC, int64_t batch, cublasComputeType_t, cublasGemmAlgo_t) {
  emu::checkStream(emu::blasStream);
  ++emu::gemmCalls;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  for (int64_t b = 0; b < batch; ++b) {
    const float *a = (const float *)A + b * sA, *bb = (const float *)B + b * sB;
    float *c = (float *)C + b * sC;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) {
          const float x = ta == CUBLAS_OP_N ? a[i + l * lda] : a[l + i * lda];
          const float y = tb == CUBLAS_OP_N ? bb[l + j * ldb] : bb[j + l * ldb];
          s += (double)x * y;
        }
        float &cc = c[i + j * ldc];
        cc = (float)(al * s) + (be == 0.0f ? 0.0f : be * cc);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmEx_64(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void *alpha, const void *A, cudaDataType at, int64_t lda, const void *B, cudaDataType bt, int64_t ldb,
    const void *beta, void *C, cudaDataType ct, int64_t ldc, cublasComputeType_t cty, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx_64(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, cty, algo);
}
