// Fake cuBLASLt for host emulation: the matmul with the epilogues pipec's
// CUDA kernels use (none, bias, relu, gelu, each with or without the bias;
// gelu writing its input to the aux matrix, and dgelu reading it), as
// cublasLt.h documents them for column-major D = epilogue(alpha op(A)
// op(B) + beta C): the bias has one value per row of D and is added before
// the activation; its GELU is the tanh approximation; the aux matrix has
// D's type and shape, a leading dimension divisible by 8 and at least D's
// rows. The product is summed
// in double like the fake cuBLAS. Checks what the real library needs of its
// caller: the stream, leading dimensions, and that every pointer has the
// alignment the preference told the heuristic.
#pragma once
#include "cublas_v2.h"
#include <cmath>
#include <cstdint>

typedef struct EmuLtHandle *cublasLtHandle_t;
enum cublasLtEpilogue_t {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_BIAS = 36,
  CUBLASLT_EPILOGUE_GELU_AUX = 32 | 128,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
};
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};
enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};
typedef cudaDataType cudaDataType_t;

struct EmuLtDesc {
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *bias = nullptr;
  int32_t biasType = -1; // -1: D's type (cublasLt.h)
  void *aux = nullptr;    // GELU_AUX writes, DGELU reads
  int64_t auxLd = 0;
};
struct EmuLtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct EmuLtPreference {
  uint32_t alignment[4] = {256, 256, 256, 256}; // A, B, C, D: the library's default assumption
};
typedef EmuLtDesc *cublasLtMatmulDesc_t;
typedef EmuLtLayout *cublasLtMatrixLayout_t;
typedef EmuLtPreference *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

namespace emu {
// cuBLASLt 13.1's heuristic refuses a float bias with a bf16 D
// (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) with CUBLAS_STATUS_INVALID_VALUE, on
// an H200 (docs/gpu-runs.md): so does this one.
// Whether cublasLtMatmul refuses (CUBLAS_STATUS_INVALID_VALUE) what the
// heuristic offered, as a library may: the caller must fall back at the
// first call.
inline bool ltMatmulRefuses = false;
// Whether the heuristic offers the aux epilogues (GELU_AUX, DGELU); off, the
// library's refusal on a card or version without them is emulated.
inline bool ltAuxEpilogues = true;
inline bool ltTypesSupported(const EmuLtDesc *d, const EmuLtLayout *a, const EmuLtLayout *b, const EmuLtLayout *c,
                             const EmuLtLayout *dl) {
  if (a->type != b->type || c->type != dl->type) return false;
  if (!(a->type == CUDA_R_32F ? dl->type == CUDA_R_32F : dl->type == CUDA_R_32F || dl->type == CUDA_R_16BF))
    return false;
  const int32_t bias = d->biasType < 0 ? (int32_t)dl->type : d->biasType;
  if (d->epilogue & 128) { // an aux matrix: offered, with a leading dimension the library takes
    if (!ltAuxEpilogues || d->auxLd % 8 != 0 || d->auxLd < (int64_t)dl->rows) return false;
  }
  return bias == (int32_t)dl->type;
}
inline bool ltFloatBiasWithBf16D(const EmuLtDesc *d, const EmuLtLayout *dl) {
  return (d->epilogue & CUBLASLT_EPILOGUE_BIAS) && d->biasType == CUDA_R_32F && dl->type == CUDA_R_16BF;
}
inline void setAttribute(void *field, size_t fieldSize, const void *buf, size_t size) {
  if (size != fieldSize) die("cuBLASLt attribute of the wrong size");
  std::memcpy(field, buf, size);
}
inline bool aligned(const void *p, uint32_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }
} // namespace emu

// The cuBLASLt 13.1.0 the emulation stands in for.
inline size_t cublasLtGetVersion() { return 130100; }
inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { emu::notLazily("cublasLtCreate"); *h = (cublasLtHandle_t)0x2; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t, cudaDataType_t scale) {
  if (scale != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new EmuLtDesc;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t size) {
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: emu::setAttribute(&d->transa, sizeof d->transa, buf, size); break;
  case CUBLASLT_MATMUL_DESC_TRANSB: emu::setAttribute(&d->transb, sizeof d->transb, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE: emu::setAttribute(&d->epilogue, sizeof d->epilogue, buf, size); break;
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: emu::setAttribute(&d->bias, sizeof d->bias, buf, size); break;
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: emu::setAttribute(&d->biasType, sizeof d->biasType, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: emu::setAttribute(&d->aux, sizeof d->aux, buf, size); break;
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: emu::setAttribute(&d->auxLd, sizeof d->auxLd, buf, size); break;
  default: return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type, uint64_t rows,
                                                 uint64_t cols, int64_t ld) {
  if ((type != CUDA_R_32F && type != CUDA_R_16BF) || ld < (int64_t)(rows > 1 ? rows : 1))
    return CUBLAS_STATUS_INVALID_VALUE;
  *l = new EmuLtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  *p = new EmuLtPreference;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                           size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    uint64_t bytes;
    emu::setAttribute(&bytes, sizeof bytes, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr < CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES || attr > CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
    return CUBLAS_STATUS_INVALID_VALUE;
  emu::setAttribute(&p->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], sizeof(uint32_t), buf, size);
  return CUBLAS_STATUS_SUCCESS;
}
// One "algorithm", which needs no workspace; the preference rides in it so
// that the matmul can check the alignments it promised.
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                     cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t p, int requested,
                                                     cublasLtMatmulHeuristicResult_t *results, int *found) {
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  ++emu::ltHeuristicCalls;
  if (!emu::ltTypesSupported(d, a, b, c, dl)) {
    *found = 0;
    return emu::ltFloatBiasWithBf16D(d, dl) ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_SUPPORTED;
  }
  results[0] = {};
  std::memcpy(results[0].algo.data, p->alignment, sizeof p->alignment);
  results[0].state = CUBLAS_STATUS_SUCCESS;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                     cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                                     const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                                     const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceBytes,
                                     cudaStream_t stream) {
  emu::checkStream(stream);
  if (!emu::ltTypesSupported(d, a, b, c, dl)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (emu::ltMatmulRefuses) return CUBLAS_STATUS_INVALID_VALUE;
  {
    // Captured: the descriptors, the algorithm and alpha/beta as they are now.
    const EmuLtDesc desc = *d;
    const EmuLtLayout la = *a, lb = *b, lc = *c, ld = *dl;
    const cublasLtMatmulAlgo_t chosen = *algo;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (emu::recorded(stream, [=] {
          EmuLtDesc d2 = desc;
          EmuLtLayout a2 = la, b2 = lb, c2 = lc, dl2 = ld;
          cublasLtMatmul(nullptr, &d2, &al, A, &a2, B, &b2, &be, C, &c2, D, &dl2, &chosen, workspace, workspaceBytes,
                         stream);
        }))
      return CUBLAS_STATUS_SUCCESS;
  }
  ++emu::ltMatmulCalls;
  if (a->type == CUDA_R_16BF) ++emu::ltBf16Calls;
  uint32_t alignment[4];
  std::memcpy(alignment, algo->data, sizeof alignment);
  if (!emu::aligned(A, alignment[0]) || !emu::aligned(B, alignment[1]) || !emu::aligned(C, alignment[2]) ||
      !emu::aligned(D, alignment[3]))
    emu::die("cuBLASLt: a pointer lacks the alignment its preference promised");
  const int64_t m = (int64_t)dl->rows, n = (int64_t)dl->cols;
  const int64_t k = d->transa == CUBLAS_OP_N ? (int64_t)a->cols : (int64_t)a->rows;
  if ((int64_t)(d->transa == CUBLAS_OP_N ? a->rows : a->cols) != m ||
      (int64_t)(d->transb == CUBLAS_OP_N ? b->rows : b->cols) != k ||
      (int64_t)(d->transb == CUBLAS_OP_N ? b->cols : b->rows) != n || (int64_t)c->rows != m || (int64_t)c->cols != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool bias = d->epilogue & CUBLASLT_EPILOGUE_BIAS;
  if (bias && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
  const bool auxOut = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool auxIn = d->epilogue == CUBLASLT_EPILOGUE_DGELU;
  if ((auxOut || auxIn) && (!d->aux || d->auxLd % 8 != 0 || d->auxLd < m)) return CUBLAS_STATUS_INVALID_VALUE;
  if ((auxOut || auxIn) && !emu::aligned(d->aux, 16))
    emu::die("cuBLASLt: the aux matrix lacks 16-byte alignment");
  if (emu::countOnly) return CUBLAS_STATUS_SUCCESS;
  const float al = *(const float *)alpha, be = *(const float *)beta;
  const cudaDataType biasType = d->biasType < 0 ? dl->type : (cudaDataType)d->biasType;
  // Operands widened to float, the float32 epilogue, D rounded once to its type.
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l)
        s += (double)emu::load(A, a->type, d->transa == CUBLAS_OP_N ? i + l * a->ld : l + i * a->ld) *
             emu::load(B, b->type, d->transb == CUBLAS_OP_N ? l + j * b->ld : j + l * b->ld);
      float v = (float)(al * s) + (be == 0.0f ? 0.0f : be * emu::load(C, c->type, i + j * c->ld));
      if (bias) v += emu::load(d->bias, biasType, i);
      if (auxOut) { // the GELU's input, rounded to D's type as D is
        emu::store(d->aux, dl->type, i + j * d->auxLd, v);
      }
      if (auxIn) { // dgelu: the product times the derivative at the aux matrix's value
        const float x = emu::load(d->aux, dl->type, i + j * d->auxLd);
        const float t = std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x));
        v *= 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
      }
      if (d->epilogue & CUBLASLT_EPILOGUE_RELU) v = v <= 0.0f ? 0.0f : v;
      if ((d->epilogue & CUBLASLT_EPILOGUE_GELU) && !auxIn)
        v = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
      emu::store(D, dl->type, i + j * dl->ld, v);
    }
  return CUBLAS_STATUS_SUCCESS;
}
