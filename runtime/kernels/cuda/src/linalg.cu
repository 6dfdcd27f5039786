// GEMM and batched matmul on cuBLAS (row-major through the column-major
// transpose identity: Y^T = op(B)^T op(A)^T), and the GEMM wrappers of
// gemm.cuh that the convolutions share. Templated on the operands' storage:
// float, or bf16 operands (--precision bf16 stages, docs/cuda-kernels.md)
// into a bf16 or float result, accumulated in float32 (CUBLAS_COMPUTE_32F).
#include "gemm.cuh"
#include "pipec/gemm_rounding.h"
#include "nn_common.cuh"

#include <cstdio>
#include <map>
#include <set>
#include <memory>
#include <tuple>
#include <type_traits>


namespace pipec::kernels::cuda {

namespace nn {
namespace {

/// C = beta * C (0 when beta == 0, whatever C held) for `batch` row-major
/// [M,N] matrices: the GEMM with K == 0, which cuBLAS may not handle.
template <class TC>
__global__ void scaleMatricesKernel(TC *C, int64_t M, int64_t N, int64_t ldc, int64_t strideC, int64_t batch,
                                    float beta) {
  const int64_t per = M * N, total = batch * per;
  for (int64_t i = firstIndex(); i < total; i += gridStride()) {
    const int64_t b = i / per, r = i - b * per, m = r / N, n = r - m * N;
    TC &c = C[b * strideC + m * ldc + n];
    c = fromF<TC>(beta == 0.0f ? 0.0f : beta * toF(c));
  }
}

/// Broadcast gather: y[i] = x[offset of i], the offset walking `st` (0 on
/// broadcast axes) over the output dims.
struct ExpandMap {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t st[kMaxRank] = {};
};

template <class TX, class TY> __global__ void expandKernel(const TX *x, TY *y, int64_t n, ExpandMap m) {
  for (int64_t i = firstIndex(); i < n; i += gridStride()) {
    int64_t rest = i, off = 0;
    for (int a = m.rank - 1; a >= 0; --a) {
      const int64_t q = rest / m.dims[a];
      off += (rest - q * m.dims[a]) * m.st[a];
      rest = q;
    }
    y[i] = fromF<TY>(toF(x[off]));
  }
}

/// cuBLAS's name for a storage type.
template <class T> constexpr cudaDataType dataType() {
  return std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_32F;
}

cublasComputeType_t computeType() {
  switch (detail::precision()) {
  case Precision::BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
  case Precision::TF32: return CUBLAS_COMPUTE_32F_FAST_TF32;
  case Precision::F32: break;
  }
  return CUBLAS_COMPUTE_32F;
}
/// Float operands follow the scope's precision; bf16 operands already are
/// what FAST_16BF would round them to, so plain float32 accumulation.
template <class T> cublasComputeType_t computeTypeFor() {
  return std::is_same_v<T, bf16> ? CUBLAS_COMPUTE_32F : computeType();
}

/// Largest power of two, at most 256, that divides the address: what
/// cuBLASLt's heuristic may assume of a pointer (it assumes 256 unless told).
uint32_t alignmentOf(const void *pointer) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

/// Whether cuBLASLt may keep a GELU's input in an aux matrix of Y's shape
/// [M, N] at `aux`: its leading dimension N divisible by 8, the matrix
/// 16-byte aligned (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
bool auxMatrixFits(int64_t N, const void *aux) { return N % 8 == 0 && alignmentOf(aux) >= 16; }

/// The cuBLASLt descriptors of one epilogue GEMM, destroyed with it.
struct LtDescriptors {
  cublasLtMatmulDesc_t matmul = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors &) = delete;
  LtDescriptors &operator=(const LtDescriptors &) = delete;
  ~LtDescriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (matmul) cublasLtMatmulDescDestroy(matmul);
  }
};

/// What an epilogue GEMM's descriptors and algorithm depend on: the same
/// key reuses them (the bias and aux pointers, the per-call attributes, are
/// set on each call; the aux matrix's alignment, which the heuristic reads
/// from its pointer, is part of the key).
struct LtKey {
  cublasLtHandle_t handle; // per thread and device
  int computeType;
  int abType, yType; // cudaDataType of A and B, and of Y
  bool transA, transB, bias;
  int64_t M, N, K;
  int epilogue;
  uint32_t alignA, alignB, alignY, alignAux; // alignAux: 0 without an aux matrix
  bool operator<(const LtKey &o) const {
    return std::tie(handle, computeType, abType, yType, transA, transB, bias, M, N, K, epilogue, alignA, alignB,
                    alignY, alignAux) < std::tie(o.handle, o.computeType, o.abType, o.yType, o.transA, o.transB,
                                                 o.bias, o.M, o.N, o.K, o.epilogue, o.alignA, o.alignB, o.alignY,
                                                 o.alignAux);
  }
};

/// One shape's descriptors and the heuristic's algorithm (none found:
/// `found` false, and the GEMM takes the cuBLAS path).
struct LtPlan {
  LtDescriptors desc;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool found = false;
  bool ran = false; // cublasLtMatmul accepted it once
};

/// The workspace cuBLASLt is offered: the rest holds a bias copy.
constexpr size_t kLtWorkspaceBytes = detail::kBlasLtWorkspaceBytes - detail::kBlasLtBiasCopyBytes;

/// cuBLASLt's answers to a combination of types and epilogue that it does
/// not run (a float bias with a bf16 Y, an aux matrix it cannot address):
/// the GEMM then takes the cuBLAS path and our kernels, and says so once.
bool ltRefused(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}
void sayLtRefused(const char *op, const LtKey &key, const char *why) {
  static std::set<std::tuple<int, int, int, bool>> said; // epilogue, types, bias: once each per process
  if (!said.insert({key.epilogue, key.abType, key.yType, key.bias}).second) return;
  std::fprintf(stderr,
               "pipec: %s: cuBLASLt refused epilogue %d (A/B type %d, Y type %d%s; first shape M=%lld N=%lld K=%lld): "
               "%s; these GEMMs run on cuBLAS and pipec's kernels\n",
               op, key.epilogue, key.abType, key.yType, key.bias ? ", a bias" : "", (long long)key.M,
               (long long)key.N, (long long)key.K, why);
}

/// Builds the descriptors of `key` and asks the heuristic once (`aux`: the
/// first call's aux matrix, whose address the heuristic reads).
std::unique_ptr<LtPlan> planEpilogueGemm(const char *op, const LtKey &key, const void *aux) {
  auto plan = std::make_unique<LtPlan>();
  LtDescriptors &desc = plan->desc;
  const bool transA = key.transA, transB = key.transB;
  const int64_t M = key.M, N = key.N, K = key.K;
  const cublasLtEpilogue_t epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
  detail::checkBlas(cublasLtMatmulDescCreate(&desc.matmul, static_cast<cublasComputeType_t>(key.computeType),
                                             CUDA_R_32F),
                    op);
  const int32_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N, opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  detail::checkBlas(cublasLtMatmulDescSetAttribute(desc.matmul, CUBLASLT_MATMUL_DESC_TRANSA, &opB, sizeof opB), op);
  detail::checkBlas(cublasLtMatmulDescSetAttribute(desc.matmul, CUBLASLT_MATMUL_DESC_TRANSB, &opA, sizeof opA), op);
  detail::checkBlas(
      cublasLtMatmulDescSetAttribute(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), op);
  // The bias is read as Y's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE left
  // unset): cuBLASLt 13.1 refuses a float bias with a bf16 Y
  // (docs/gpu-runs.md), so epilogueGemm passes a bf16 copy of it then.
  if (aux) {
    // The aux matrix (the GELU's input) is Y's shape and type: Y^T's leading
    // dimension, which cuBLASLt wants divisible by 8 (the caller checks).
    const int64_t auxLd = N;
    detail::checkBlas(cublasLtMatmulDescSetAttribute(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                     sizeof aux),
                      op);
    detail::checkBlas(
        cublasLtMatmulDescSetAttribute(desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof auxLd), op);
  }
  const cudaDataType abType = static_cast<cudaDataType>(key.abType), yType = static_cast<cudaDataType>(key.yType);
  // Stored row-major matrices read as column-major: B is [N,K] (or [K,N]
  // when transposed), A is [K,M] (or [M,K]), Y^T is [N,M].
  detail::checkBlas(cublasLtMatrixLayoutCreate(&desc.a, abType, transB ? K : N, transB ? N : K, transB ? K : N), op);
  detail::checkBlas(cublasLtMatrixLayoutCreate(&desc.b, abType, transA ? M : K, transA ? K : M, transA ? M : K), op);
  detail::checkBlas(cublasLtMatrixLayoutCreate(&desc.d, yType, N, M, N), op);
  detail::checkBlas(cublasLtMatmulPreferenceCreate(&desc.preference), op);
  const uint64_t workspaceBytes = kLtWorkspaceBytes;
  detail::checkBlas(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspaceBytes, sizeof workspaceBytes),
                    op);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.alignB},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.alignA},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.alignY},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.alignY}};
  for (const auto &[attribute, alignment] : alignments)
    detail::checkBlas(cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &alignment, sizeof alignment),
                      op);
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(key.handle, desc.matmul, desc.a, desc.b, desc.d,
                                                               desc.d, desc.preference, 1, &plan->heuristic, &found);
  if (!ltRefused(status)) detail::checkBlas(status, op);
  plan->found = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (!plan->found) sayLtRefused(op, key, status == CUBLAS_STATUS_SUCCESS ? "no algorithm" : cublasGetStatusString(status));
  return plan;
}

/// Y[M,N] = epilogue(alpha op(A) op(B) (+ bias[N])) in one cuBLASLt call,
/// through the same column-major identity as sgemm (bias: one value per
/// row of the column-major Y^T, that is per column of Y; `aux`, for the
/// epilogues with one, an [M,N] matrix of Y's type: GELU_AUX writes the
/// GELU's input there, DGELU reads it). False when cuBLASLt's heuristic
/// offers no algorithm; Y is then untouched. The descriptors and the
/// heuristic's answer are kept per shape, epilogue, precision and pointer
/// alignment (this thread's, per device), so a stage's calls after its
/// first build nothing.
template <class T, class TY, class TB = float>
bool epilogueGemm(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                  const T *A, const T *B, const TB *bias, cublasLtEpilogue_t epilogue, TY *Y,
                  const TY *aux = nullptr) {
  constexpr bool copiesBias = !std::is_same_v<TY, TB>; // cuBLASLt takes a bias of Y's type
  if (copiesBias && bias && N * sizeof(TY) > detail::kBlasLtBiasCopyBytes) return false;
  const detail::BlasLt lt = detail::blasLt();
  const LtKey key{lt.handle,
                  static_cast<int>(computeTypeFor<T>()),
                  static_cast<int>(dataType<T>()),
                  static_cast<int>(dataType<TY>()),
                  transA,
                  transB,
                  bias != nullptr,
                  M,
                  N,
                  K,
                  static_cast<int>(epilogue),
                  alignmentOf(A),
                  alignmentOf(B),
                  alignmentOf(Y),
                  aux ? alignmentOf(aux) : 0u};
  thread_local std::map<LtKey, std::unique_ptr<LtPlan>> plans;
  std::unique_ptr<LtPlan> &plan = plans[key];
  if (!plan) plan = planEpilogueGemm(op, key, aux);
  if (!plan->found) return false;
  const void *ltBias = bias;
  if constexpr (copiesBias) {
    if (bias) { // Y's type: a copy of the float parameter, rounded, in the workspace's tail
      TY *copy = reinterpret_cast<TY *>(static_cast<char *>(lt.workspace) + kLtWorkspaceBytes);
      cast(bias, N, copy);
      ltBias = copy;
    }
  }
  if (bias)
    detail::checkBlas(
        cublasLtMatmulDescSetAttribute(plan->desc.matmul, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ltBias, sizeof ltBias),
        op);
  if (aux)
    detail::checkBlas(
        cublasLtMatmulDescSetAttribute(plan->desc.matmul, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
        op);
  const float beta = 0.0f;
  const LtDescriptors &desc = plan->desc;
  const cublasStatus_t status =
      cublasLtMatmul(lt.handle, desc.matmul, &alpha, B, desc.a, A, desc.b, &beta, Y, desc.d, Y, desc.d,
                     &plan->heuristic.algo, lt.workspace, plan->heuristic.workspaceSize, detail::stream());
  // A refusal at the first call launched nothing: this shape takes the
  // cuBLAS path from now on. Later, the same plan has run, so it is an error.
  if (ltRefused(status) && !plan->ran) {
    plan->found = false;
    sayLtRefused(op, key, cublasGetStatusString(status));
    return false;
  }
  detail::checkBlas(status, op);
  plan->ran = true;
  return true;
}

/// How cuBLASLt computes f(product + bias): its epilogue, and whether that
/// epilogue applies f itself (relu, and its GELU, which is the tanh
/// approximation) or f must follow in place.
struct EpiloguePlan {
  cublasLtEpilogue_t epilogue;
  bool appliesActivation;
};
std::optional<EpiloguePlan> epiloguePlan(std::optional<Unary> activation, bool bias) {
  static_assert(cudaGemmEpilogueApplies(Unary::Relu) && cudaGemmEpilogueApplies(Unary::GeluTanh),
                "the activations cuBLASLt applies are the ones the compiler leaves as epilogues");
  if (activation == Unary::Relu) return EpiloguePlan{bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU, true};
  if (activation == Unary::GeluTanh)
    return EpiloguePlan{bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU, true};
  if (bias) return EpiloguePlan{CUBLASLT_EPILOGUE_BIAS, false};
  return std::nullopt;
}

} // namespace

template <class T, class TC>
void gemmStridedBatched(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const T *A, int64_t lda, int64_t strideA, const T *B, int64_t ldb, int64_t strideB,
                        float beta, TC *C, int64_t ldc, int64_t strideC, int64_t batch) {
  if (M < 0 || N < 0 || K < 0 || batch < 0) fail(op, "negative GEMM dimension");
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) { // what the maths says: C = beta * C
    scaleMatricesKernel<TC><<<detail::blocksFor(batch * M * N), detail::kThreads, 0, detail::stream()>>>(
        C, M, N, ldc, strideC, batch, beta);
    detail::checkLaunch(op);
    return;
  }
  cublasHandle_t handle = detail::blas();
  detail::checkBlas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), op);
  // Row-major X is column-major X^T: compute C^T[N,M] = op(B)^T[N,K] op(A)^T[K,M].
  const cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    detail::checkBlas(cublasGemmEx_64(handle, opB, opA, N, M, K, &alpha, B, dataType<T>(), ldb, A, dataType<T>(), lda,
                                      &beta, C, dataType<TC>(), ldc, computeTypeFor<T>(), CUBLAS_GEMM_DEFAULT),
                      op);
    return;
  }
  detail::checkBlas(cublasGemmStridedBatchedEx_64(handle, opB, opA, N, M, K, &alpha, B, dataType<T>(), ldb,
                                                  (long long)strideB, A, dataType<T>(), lda, (long long)strideA,
                                                  &beta, C, dataType<TC>(), ldc, (long long)strideC, batch,
                                                  computeTypeFor<T>(), CUBLAS_GEMM_DEFAULT),
                    op);
}

template void gemmStridedBatched<float, float>(const char *, bool, bool, int64_t, int64_t, int64_t, float,
                                               const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                                               float, float *, int64_t, int64_t, int64_t);
template void gemmStridedBatched<bf16, bf16>(const char *, bool, bool, int64_t, int64_t, int64_t, float, const bf16 *,
                                             int64_t, int64_t, const bf16 *, int64_t, int64_t, float, bf16 *, int64_t,
                                             int64_t, int64_t);
template void gemmStridedBatched<bf16, float>(const char *, bool, bool, int64_t, int64_t, int64_t, float,
                                              const bf16 *, int64_t, int64_t, const bf16 *, int64_t, int64_t, float,
                                              float *, int64_t, int64_t, int64_t);

void sgemmStridedBatched(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t lda, int64_t strideA, const float *B,
                         int64_t ldb, int64_t strideB, float beta, float *C, int64_t ldc,
                         int64_t strideC, int64_t batch) {
  gemmStridedBatched(op, transA, transB, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC,
                     batch);
}

void sgemm(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
           const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
           int64_t ldc) {
  sgemmStridedBatched(op, transA, transB, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

template <class TX, class TY> void expandTo(const char *op, const TX *x, const Shape &xs, TY *y, const Shape &ys) {
  if (!broadcastsTo(xs, ys)) fail(op, "shape " + xs.str() + " does not broadcast to " + ys.str());
  if (ys.size > kMaxRank) fail(op, "rank above " + std::to_string(kMaxRank));
  const int64_t n = ys.numel();
  if (n <= 0) return;
  ExpandMap m;
  m.rank = ys.size;
  const int lead = ys.size - xs.size;
  int64_t acc = 1;
  for (int a = ys.size - 1; a >= 0; --a) {
    m.dims[a] = ys.v[a];
    if (a >= lead) {
      const int64_t d = xs.v[a - lead];
      m.st[a] = d == 1 ? 0 : acc;
      acc *= d;
    }
  }
  expandKernel<TX, TY><<<detail::blocksFor(n), detail::kThreads, 0, detail::stream()>>>(x, y, n, m);
  detail::checkLaunch(op);
}
template void expandTo<float, float>(const char *, const float *, const Shape &, float *, const Shape &);
template void expandTo<float, bf16>(const char *, const float *, const Shape &, bf16 *, const Shape &);
template void expandTo<bf16, bf16>(const char *, const bf16 *, const Shape &, bf16 *, const Shape &);

} // namespace nn

//===----------------------------------------------------------------------===//
// nn.gemm, nn.matmul
//===----------------------------------------------------------------------===//

namespace {
/// A bf16 GEMM with a dimension that is not a multiple of 8 (GPT-2's
/// 50,257-word vocabulary) runs on cuBLAS's slow kernels, and padding only
/// the rows does not fix it (pipec/gemm_rounding.h). So a large such GEMM
/// runs on copies with its odd dimensions rounded up, the added rows and
/// columns zero, its result computed into a rounded copy and copied back,
/// when pipec/gemm_rounding.h's rule says it pays; below 2^30 FLOPs the
/// saving is under the copies' launches. A classifier's vocabulary is padded
/// in the IR instead (pipec-pad-classes), so its logits are never copied.
constexpr double kGemmRoundingMinFlops = double(int64_t(1) << 30);

/// rows x width elements from rows `fromLd` apart to rows `toLd` apart.
template <class E> void copyRows(const char *op, E *to, int64_t toLd, const E *from, int64_t fromLd, int64_t rows,
                                 int64_t width) {
  if (toLd == width && fromLd == width)
    detail::check(cudaMemcpyAsync(to, from, rows * width * sizeof(E), cudaMemcpyDeviceToDevice, detail::stream()), op);
  else
    detail::check(cudaMemcpy2DAsync(to, toLd * sizeof(E), from, fromLd * sizeof(E), width * sizeof(E), rows,
                                    cudaMemcpyDeviceToDevice, detail::stream()),
                  op);
}

/// A row-major [rows, cols] matrix copied into a zeroed [toRows, toCols] one
/// (rows toCols apart): memsets of the added columns and rows, one copy.
template <class E>
void copyPadded(const char *op, E *to, int64_t toRows, int64_t toCols, const E *from, int64_t rows, int64_t cols) {
  const size_t e = sizeof(E);
  if (toCols > cols)
    detail::check(cudaMemset2DAsync(to + cols, toCols * e, 0, (toCols - cols) * e, rows, detail::stream()), op);
  if (toRows > rows)
    detail::check(cudaMemsetAsync(to + rows * toCols, 0, (toRows - rows) * toCols * e, detail::stream()), op);
  copyRows(op, to, toCols, from, cols, rows, cols);
}

/// Y[M,N] = alpha op(A) op(B) + beta Y on cuBLAS, row-major and contiguous;
/// a large bf16 product with a dimension that is not a multiple of 8 on
/// rounded copies (above).
template <class T, class TY>
void cublasGemm(const char *op, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha, const T *A,
                const T *B, float beta, TY *Y) {
  if constexpr (std::is_same_v<T, bf16>) {
    using namespace pipec::gemm_rounding;
    if (M > 0 && N > 0 && K > 0 && (isOdd(M) || isOdd(N) || isOdd(K))) {
      const int64_t M2 = isOdd(M) ? rounded(M) : M, N2 = isOdd(N) ? rounded(N) : N, K2 = isOdd(K) ? rounded(K) : K;
      const bool copyA = M2 != M || K2 != K, copyB = K2 != K || N2 != N, copyY = M2 != M || N2 != N;
      // Bytes read and written by the copies (and the memsets, counted as writes).
      const double bytesA = copyA ? double(M * K + M2 * K2) * sizeof(T) : 0,
                   bytesB = copyB ? double(K * N + K2 * N2) * sizeof(T) : 0,
                   bytesY = copyY ? double(M * N + M2 * N2) * sizeof(TY) * (beta != 0.0f ? 2 : 1) : 0;
      const double flops = 2.0 * double(M) * double(N) * double(K);
      const double growth = double(M2) * double(N2) * double(K2) / (double(M) * double(N) * double(K));
      if (flops >= kGemmRoundingMinFlops && growth <= kMaxGrowth && flops >= kMinFlopsPerByte * (bytesA + bytesB + bytesY)) {
        const int64_t scratchA = copyA ? ScratchNeed::alignedScratchBytes(M2 * K2 * (int64_t)sizeof(T)) : 0,
                      scratchB = copyB ? ScratchNeed::alignedScratchBytes(K2 * N2 * (int64_t)sizeof(T)) : 0,
                      scratchY = copyY ? ScratchNeed::alignedScratchBytes(M2 * N2 * (int64_t)sizeof(TY)) : 0;
        char *scratch = static_cast<char *>(detail::scratch(0, (size_t)(scratchA + scratchB + scratchY)));
        const T *a = A, *b = B;
        TY *y = Y;
        if (copyA) { // stored [K, M] when transposed, else [M, K]
          T *copy = reinterpret_cast<T *>(scratch);
          if (transA) copyPadded(op, copy, K2, M2, A, K, M);
          else copyPadded(op, copy, M2, K2, A, M, K);
          a = copy;
        }
        if (copyB) { // stored [N, K] when transposed, else [K, N]
          T *copy = reinterpret_cast<T *>(scratch + scratchA);
          if (transB) copyPadded(op, copy, N2, K2, B, N, K);
          else copyPadded(op, copy, K2, N2, B, K, N);
          b = copy;
        }
        if (copyY) {
          y = reinterpret_cast<TY *>(scratch + scratchA + scratchB);
          if (beta != 0.0f) copyPadded(op, y, M2, N2, static_cast<const TY *>(Y), M, N);
        }
        nn::gemmStridedBatched(op, transA, transB, M2, N2, K2, alpha, a, transA ? M2 : K2, 0, b, transB ? K2 : N2, 0,
                               beta, y, N2, 0, 1);
        if (copyY) copyRows(op, Y, N, static_cast<const TY *>(y), N2, M, N);
        return;
      }
    }
  }
  nn::gemmStridedBatched(op, transA, transB, M, N, K, alpha, A, transA ? M : K, 0, B, transB ? K : N, 0, beta, Y, N, 0,
                         1);
}

template <class T, class TY, class TC>
void gemmT(const T *A, const T *B, const TC *C, const Shape &cs, TY *Y, int64_t M, int64_t N, int64_t K,
           bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation,
           TY *preActivation = nullptr) {
  const char *op = "nn.gemm";
  if (M < 0 || N < 0 || K < 0) nn::fail(op, "negative dimension");
  if (preActivation && !activation) nn::fail(op, "a pre-activation output without an activation");
  const Shape ys{M, N};
  if (C && !nn::broadcastsTo(cs, ys))
    nn::fail(op, "C of shape " + cs.str() + " does not broadcast to " + ys.str());
  // A bias (C of one value per column, beta 1) and relu / gelu_tanh are
  // cuBLASLt epilogues: no broadcast of C into Y, no pass over Y after.
  // Any other C (a matrix, a scalar, beta other than 0 or 1, in place)
  // takes the cuBLAS path below.
  const bool rowBias = C && (const void *)C != (const void *)Y && beta == 1.0f && cs.numel() == N && cs.size >= 1 && cs.v[cs.size - 1] == N;
  const bool withoutC = !C || ((const void *)C != (const void *)Y && beta == 0.0f);
  if (preActivation) {
    // GELU_AUX(_BIAS): Y and the GELU's input in one call; otherwise the
    // product into preActivation, then f into Y.
    if (M > 0 && N > 0 && K > 0 && (withoutC || rowBias) && activation == Unary::GeluTanh &&
        nn::auxMatrixFits(N, preActivation) &&
        nn::epilogueGemm(op, transA, transB, M, N, K, alpha, A, B, rowBias ? C : nullptr,
                         rowBias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, Y,
                         (const TY *)preActivation))
      return;
    gemmT(A, B, C, cs, preActivation, M, N, K, transA, transB, alpha, beta, std::nullopt);
    unary(*activation, preActivation, M * N, Y);
    return;
  }
  if (M > 0 && N > 0 && K > 0 && (withoutC || rowBias))
    if (std::optional<nn::EpiloguePlan> plan = nn::epiloguePlan(activation, rowBias))
      if (nn::epilogueGemm(op, transA, transB, M, N, K, alpha, A, B, rowBias ? C : nullptr, plan->epilogue, Y)) {
        if (activation && !plan->appliesActivation) unary(*activation, Y, M * N, Y);
        return;
      }
  float b = 0.0f;
  if ((const void *)C == (const void *)Y) {
    b = beta; // in place: Y = alpha op(A) op(B) + beta Y (a gradient accumulating)
  } else if (C && beta != 0.0f) {
    nn::expandTo(op, C, cs, Y, ys); // a bf16 Y rounds C to bf16 here (docs/cuda-kernels.md)
    b = beta;
  }
  cublasGemm(op, transA, transB, M, N, K, alpha, A, B, b, Y);
  if (activation) unary(*activation, Y, M * N, Y);
}

template <class T>
void gemmActivationGradT(const T *A, const T *B, const T *x, T *Y, int64_t M, int64_t N, int64_t K, bool transA,
                         bool transB, float alpha, Unary function) {
  const char *op = "nn.gemm_activation_grad";
  if (M < 0 || N < 0 || K < 0) nn::fail(op, "negative dimension");
  if (!derivativeReadsInput(function))
    nn::fail(op, std::string("the derivative of '") + unaryName(function) + "' reads its result, not x");
  // DGELU: the product times gelu'(x) in one call; otherwise the product,
  // then the derivative in place.
  if (M > 0 && N > 0 && K > 0 && function == Unary::GeluTanh && nn::auxMatrixFits(N, x) &&
      nn::epilogueGemm(op, transA, transB, M, N, K, alpha, A, B, (const float *)nullptr, CUBLASLT_EPILOGUE_DGELU, Y, x))
    return;
  gemmT(A, B, (const float *)nullptr, Shape{}, Y, M, N, K, transA, transB, alpha, 0.0f, std::nullopt);
  unaryGrad(function, Y, x, nullptr, M * N, Y);
}

template <class T, class TY>
void matmulT(const T *A, const Shape &as, const T *B, const Shape &bs, TY *Y, bool transA, bool transB) {
  const char *op = transA || transB ? "nn.batched_gemm" : "nn.matmul";
  // op(A) and op(B): cuBLAS reads the stored matrices with the trans flags.
  const Shape al = gemmOperandShape(as, transA), bl = gemmOperandShape(bs, transB);
  (void)matmulShape(al, bl); // checks
  const Shape ap = al.size == 1 ? Shape{1, al.v[0]} : al;
  const Shape bp = bl.size == 1 ? Shape{bl.v[0], 1} : bl;
  const int64_t M = ap.v[ap.size - 2], K = ap.v[ap.size - 1], N = bp.v[bp.size - 1];
  const int64_t lda = transA ? M : K, ldb = transB ? K : N;
  const Shape aBatch(ap.v, ap.size - 2), bBatch(bp.v, bp.size - 2);
  const Shape batch = broadcastShape(aBatch, bBatch);
  const int64_t count = batch.numel();
  if (count == 0 || M == 0 || N == 0) return;
  const int64_t aCount = aBatch.numel(), bCount = bBatch.numel();
  if (bCount == 1 && aBatch == batch && !transA) {
    // One weight matrix for every batch entry (Linear on 3-D input): one GEMM.
    nn::gemmStridedBatched(op, false, transB, count * M, N, K, 1.0f, A, lda, 0, B, ldb, 0, 0.0f, Y, N, 0, 1);
    return;
  }
  // A batch that has every entry (its count is the broadcast batch's, so no
  // axis is broadcast and its flat layout is the output's) or a single matrix
  // (stride 0): one strided-batched GEMM.
  if ((aCount == count || aCount == 1) && (bCount == count || bCount == 1)) {
    nn::gemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A, lda, aCount == count ? M * K : 0, B, ldb,
                            bCount == count ? K * N : 0, 0.0f, Y, N, M * N, count);
    return;
  }
  // General broadcast: one GEMM per output batch entry, offsets on the host.
  int64_t aSt[kMaxRank] = {}, bSt[kMaxRank] = {};
  auto strides = [&](const Shape &in, int64_t *st) {
    const int lead = batch.size - in.size;
    int64_t acc = 1;
    for (int a = in.size - 1; a >= 0; --a) {
      st[a + lead] = in.v[a] == 1 ? 0 : acc;
      acc *= in.v[a];
    }
  };
  strides(aBatch, aSt);
  strides(bBatch, bSt);
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, aOff = 0, bOff = 0;
    for (int a = batch.size - 1; a >= 0; --a) {
      const int64_t q = rest / batch.v[a], r = rest - q * batch.v[a];
      aOff += r * aSt[a];
      bOff += r * bSt[a];
      rest = q;
    }
    nn::gemmStridedBatched(op, transA, transB, M, N, K, 1.0f, A + aOff * M * K, lda, 0, B + bOff * K * N, ldb, 0,
                           0.0f, Y + i * M * N, N, 0, 1);
  }
}
} // namespace

void gemm(const float *A, const float *B, const float *C, const Shape &cs, float *Y, int64_t M, int64_t N, int64_t K,
          bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation, float *preActivation) {
  gemmT(A, B, C, cs, Y, M, N, K, transA, transB, alpha, beta, activation, preActivation);
}
void gemm(const bf16 *A, const bf16 *B, const float *C, const Shape &cs, bf16 *Y, int64_t M, int64_t N, int64_t K,
          bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation, bf16 *preActivation) {
  gemmT(A, B, C, cs, Y, M, N, K, transA, transB, alpha, beta, activation, preActivation);
}
void gemm(const bf16 *A, const bf16 *B, const float *C, const Shape &cs, float *Y, int64_t M, int64_t N, int64_t K,
          bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation) {
  gemmT(A, B, C, cs, Y, M, N, K, transA, transB, alpha, beta, activation);
}
void gemm(const bf16 *A, const bf16 *B, const bf16 *C, const Shape &cs, bf16 *Y, int64_t M, int64_t N, int64_t K,
          bool transA, bool transB, float alpha, float beta, std::optional<Unary> activation, bf16 *preActivation) {
  gemmT(A, B, C, cs, Y, M, N, K, transA, transB, alpha, beta, activation, preActivation);
}
void gemmActivationGrad(const float *A, const float *B, const float *x, float *Y, int64_t M, int64_t N, int64_t K,
                        bool transA, bool transB, float alpha, Unary function) {
  gemmActivationGradT(A, B, x, Y, M, N, K, transA, transB, alpha, function);
}
void gemmActivationGrad(const bf16 *A, const bf16 *B, const bf16 *x, bf16 *Y, int64_t M, int64_t N, int64_t K,
                        bool transA, bool transB, float alpha, Unary function) {
  gemmActivationGradT(A, B, x, Y, M, N, K, transA, transB, alpha, function);
}
void matmul(const float *A, const Shape &as, const float *B, const Shape &bs, float *Y, bool transA, bool transB) {
  matmulT(A, as, B, bs, Y, transA, transB);
}
void matmul(const bf16 *A, const Shape &as, const bf16 *B, const Shape &bs, bf16 *Y, bool transA, bool transB) {
  matmulT(A, as, B, bs, Y, transA, transB);
}
void matmul(const bf16 *A, const Shape &as, const bf16 *B, const Shape &bs, float *Y, bool transA, bool transB) {
  matmulT(A, as, B, bs, Y, transA, transB);
}

} // namespace pipec::kernels::cuda
