// bench/gpu/cublaslt_epilogues.cpp: which cuBLASLt epilogues the card's
// cuBLASLt runs with bf16 operands and a bf16 Y, for each bias type (unset,
// that is Y's; float; bf16), as runtime/kernels/cuda/src/linalg.cu calls them
// (row-major Y[M,N] = A[M,K] B[K,N] read as column-major Y^T). Prints the
// heuristic's and cublasLtMatmul's status per case. Built by prepare.sh,
// run by on_gpu.sh; the answers are in docs/gpu-runs.md.
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

namespace {
struct Case {
  const char *name;
  cublasLtEpilogue_t epilogue;
  bool bias, aux;
};

const char *statusOf(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "ok" : cublasGetStatusString(s); }

void run(cublasLtHandle_t lt, void *ws, size_t wsBytes, const Case &c, int biasType, const char *biasName,
         const void *A, const void *B, void *Y, void *aux, const void *bias, long long M, long long N, long long K) {
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t n = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &n, sizeof n);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n);
  cublasStatus_t set = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof c.epilogue);
  if (c.bias) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (c.bias && biasType >= 0)
    set = set != CUBLAS_STATUS_SUCCESS ? set
                                       : cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                                        &biasType, sizeof biasType);
  if (c.aux) {
    const int64_t ld = N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
  }
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, K, N);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, M, N);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  uint64_t bytes = wsBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &h, &found);
  cublasStatus_t ms = CUBLAS_STATUS_NOT_INITIALIZED;
  cudaError_t sync = cudaSuccess;
  if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
    const float alpha = 1, beta = 0;
    ms = cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, Y, ld, Y, ld, &h.algo, ws, h.workspaceSize, 0);
    sync = cudaDeviceSynchronize();
  }
  std::printf("%-16s bias type %-6s | set %-10s | heuristic %-45s found %d | matmul %-45s | %s\n", c.name, biasName,
              statusOf(set), statusOf(hs), found,
              hs == CUBLAS_STATUS_SUCCESS && found > 0 ? statusOf(ms) : "-", cudaGetErrorString(sync));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}
} // namespace

int main() {
  const long long M = 4096, N = 768, K = 768;
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return std::puts("cublasLtCreate failed"), 1;
  std::printf("cuBLASLt version %zu, CUDA runtime %d\n", cublasLtGetVersion(), CUDART_VERSION);
  void *A, *B, *Y, *aux, *bias, *ws;
  const size_t wsBytes = 32u << 20;
  cudaMalloc(&A, M * K * 2);
  cudaMalloc(&B, K * N * 2);
  cudaMalloc(&Y, M * N * 2);
  cudaMalloc(&aux, M * N * 2);
  cudaMalloc(&bias, N * 4);
  cudaMalloc(&ws, wsBytes);
  cudaMemset(A, 0, M * K * 2);
  cudaMemset(B, 0, K * N * 2);
  cudaMemset(aux, 0, M * N * 2);
  cudaMemset(bias, 0, N * 4);
  const Case cases[] = {{"BIAS", CUBLASLT_EPILOGUE_BIAS, true, false},
                        {"RELU_BIAS", CUBLASLT_EPILOGUE_RELU_BIAS, true, false},
                        {"GELU_BIAS", CUBLASLT_EPILOGUE_GELU_BIAS, true, false},
                        {"GELU_AUX", CUBLASLT_EPILOGUE_GELU_AUX, false, true},
                        {"GELU_AUX_BIAS", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true, true},
                        {"DGELU", CUBLASLT_EPILOGUE_DGELU, false, true},
                        {"DGELU_BGRAD", CUBLASLT_EPILOGUE_DGELU_BGRAD, true, true},
                        {"BGRADB", CUBLASLT_EPILOGUE_BGRADB, true, false}};
  for (const Case &c : cases) {
    if (!c.bias) {
      run(lt, ws, wsBytes, c, -1, "-", A, B, Y, aux, bias, M, N, K);
      continue;
    }
    run(lt, ws, wsBytes, c, -1, "unset", A, B, Y, aux, bias, M, N, K);
    run(lt, ws, wsBytes, c, CUDA_R_32F, "float", A, B, Y, aux, bias, M, N, K);
    run(lt, ws, wsBytes, c, CUDA_R_16BF, "bf16", A, B, Y, aux, bias, M, N, K);
  }
  return 0;
}
