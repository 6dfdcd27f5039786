#pragma once
#include "cuda_runtime.h"
#include "cuda_bf16.h"
typedef struct cublasContext *cublasHandle_t;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasPointerMode_t { CUBLAS_POINTER_MODE_HOST = 0 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16BF = 75, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
namespace emu {
// GEMMs whose A and B are bf16 (cuBLAS and cuBLASLt), and the types of the
// last one, for the tests that check bf16 operands reach the library as
// CUDA_R_16BF.
inline int gemmBf16Calls = 0, ltBf16Calls = 0;
struct GemmTypes {
  cudaDataType a, b, c;
  int computeType;
};
inline GemmTypes lastGemmTypes{CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 0};
// The last GEMM's leading dimensions, as cuBLAS received them (column-major A, B, C).
inline int64_t lastGemmLd[3] = {0, 0, 0};
// The last GEMM's dimensions m, n, k, as cuBLAS received them (column-major).
inline int64_t lastGemmDims[3] = {0, 0, 0};
// The combinations cuBLAS documents for cublasGemmEx that pipec uses:
// float with any of its float32 compute types; bf16 A and B into bf16 or
// float C with CUBLAS_COMPUTE_32F.
inline bool gemmTypesSupported(cudaDataType a, cudaDataType b, cudaDataType c, int computeType) {
  if (a != b) return false;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  return a == CUDA_R_16BF && computeType == 68 /* CUBLAS_COMPUTE_32F */ && (c == CUDA_R_16BF || c == CUDA_R_32F);
}
inline float load(const void *p, cudaDataType t, int64_t i) {
  return t == CUDA_R_16BF ? (float)static_cast<const __nv_bfloat16 *>(p)[i] : static_cast<const float *>(p)[i];
}
// Rounded once to the output's type, as cuBLAS rounds its float32 result.
inline void store(void *p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_16BF)
    static_cast<__nv_bfloat16 *>(p)[i] = __nv_bfloat16(v);
  else
    static_cast<float *>(p)[i] = v;
}
} // namespace emu
inline const char *cublasGetStatusString(cublasStatus_t) { return "emulated cublas error"; }
inline cublasStatus_t cublasCreate(cublasHandle_t *h) { emu::notLazily("cublasCreate"); *h = (cublasHandle_t)0x1; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t s) { emu::blasStream = s; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasGemmStridedBatchedEx_64(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void *alpha, const void *A, cudaDataType at, int64_t lda, long long sA, const void *B, cudaDataType bt, int64_t ldb, long long sB,
    const void *beta, void *C, cudaDataType ct, int64_t ldc, long long sC, int64_t batch, cublasComputeType_t cty, cublasGemmAlgo_t) {
  emu::checkStream(emu::blasStream);
  if (!emu::gemmTypesSupported(at, bt, ct, cty)) return CUBLAS_STATUS_NOT_SUPPORTED;
  {
    // Captured: alpha and beta are read now (host pointer mode), the rest when the graph runs.
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const cudaStream_t s = emu::blasStream;
    auto handle = cublasHandle_t{};
    if (emu::recorded(s, [=] {
          const cudaStream_t before = emu::blasStream;
          emu::blasStream = s;
          cublasGemmStridedBatchedEx_64(handle, ta, tb, m, n, k, &al, A, at, lda, sA, B, bt, ldb, sB, &be, C, ct, ldc, sC,
                                        batch, cty, CUBLAS_GEMM_DEFAULT);
          emu::blasStream = before;
        }))
      return CUBLAS_STATUS_SUCCESS;
  }
  ++emu::gemmCalls;
  emu::lastGemmTypes = {at, bt, ct, (int)cty};
  emu::lastGemmLd[0] = lda, emu::lastGemmLd[1] = ldb, emu::lastGemmLd[2] = ldc;
  emu::lastGemmDims[0] = m, emu::lastGemmDims[1] = n, emu::lastGemmDims[2] = k;
  if (at == CUDA_R_16BF) ++emu::gemmBf16Calls;
  if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1))) return CUBLAS_STATUS_INVALID_VALUE;
  if (ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
  if (emu::countOnly) return CUBLAS_STATUS_SUCCESS;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  // Element offsets: A, B and C of batch entry b start at b * sA, b * sB, b * sC.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l) {
          const float x = emu::load(A, at, b * sA + (ta == CUBLAS_OP_N ? i + l * lda : l + i * lda));
          const float y = emu::load(B, bt, b * sB + (tb == CUBLAS_OP_N ? l + j * ldb : j + l * ldb));
          s += (double)x * y;
        }
        const int64_t at_c = b * sC + i + j * ldc;
        const float cc = be == 0.0f ? 0.0f : emu::load(C, ct, at_c);
        emu::store(C, ct, at_c, (float)(al * s) + (be == 0.0f ? 0.0f : be * cc));
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasGemmEx_64(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
    const void *alpha, const void *A, cudaDataType at, int64_t lda, const void *B, cudaDataType bt, int64_t ldb,
    const void *beta, void *C, cudaDataType ct, int64_t ldc, cublasComputeType_t cty, cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx_64(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, cty, algo);
}
