// Row-major GEMM wrappers over cuBLAS for the linear-algebra and convolution
// kernels (linalg.cu, conv.cu); defined in linalg.cu. The precision is the
// innermost StreamScope's: BF16 runs CUBLAS_COMPUTE_32F_FAST_16BF (float32
// storage, bfloat16 tensor-core inputs, float32 accumulation), F32 plain
// CUBLAS_COMPUTE_32F (no TF32). bf16 operands (bf16 storage) always run
// CUBLAS_COMPUTE_32F, into a bf16 or float C.
#ifndef PIPEC_CUDA_KERNELS_GEMM_CUH
#define PIPEC_CUDA_KERNELS_GEMM_CUH

#include "detail.cuh"

#include <cstdint>

namespace pipec::kernels::cuda::nn {

/// Row-major C[M,N] = alpha * op(A) op(B) + beta * C with leading dimensions
/// (op(A) is [M,K]: A stored [K,M] when transA; op(B) is [K,N]: B stored
/// [N,K] when transB). With beta == 0, C is not read. K == 0 gives beta * C.
void sgemm(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
           const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
           int64_t ldc);

/// `batch` independent GEMMs as sgemm, matrix i at A + i * strideA, B + i *
/// strideB, C + i * strideC (a stride of 0 shares one A or B; C's batch
/// entries must not overlap).
void sgemmStridedBatched(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t lda, int64_t strideA, const float *B,
                         int64_t ldb, int64_t strideB, float beta, float *C, int64_t ldc,
                         int64_t strideC, int64_t batch);

/// sgemmStridedBatched on float or bf16 A and B into a C of type TC
/// (instantiated for <float, float>, <bf16, bf16> and <bf16, float>).
template <class T, class TC>
void gemmStridedBatched(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const T *A, int64_t lda, int64_t strideA, const T *B, int64_t ldb, int64_t strideB,
                        float beta, TC *C, int64_t ldc, int64_t strideC, int64_t batch);

/// y (shape ys) = numpy broadcast of x (shape xs, which must broadcast to
/// ys; float, or bf16 into bf16), rounded to TY (float or bf16); one launch
/// on the current stream, nothing for an empty ys.
template <class TX, class TY> void expandTo(const char *op, const TX *x, const Shape &xs, TY *y, const Shape &ys);

} // namespace pipec::kernels::cuda::nn

#endif // PIPEC_CUDA_KERNELS_GEMM_CUH
