#ifndef PIPEC_GEMM_ROUNDING_H
#define PIPEC_GEMM_ROUNDING_H

// When a bf16 GEMM on the CUDA target runs with a dimension rounded up: the
// one rule that the kernel library (runtime/kernels/cuda/src/linalg.cu,
// rounded copies of its operands) and the compiler (pipec-pad-classes, a
// classifier's class dimension padded in the IR) share. On an H200 the three
// GEMMs of a tied 50,257-word vocabulary at 4,096 x 768 took 3.37 / 2.42 /
// 2.19 ms as they are and 0.42 / 0.37 / 0.36 ms with the vocabulary rounded
// up to 50,304; a copy of the [4,096, 50,257] bf16 logits took 0.35 ms
// (docs/gpu-runs.md, docs/cuda-kernels.md "Odd dimensions").

#include <cstdint>

namespace pipec::gemm_rounding {

/// cuBLAS's fast bf16 kernels want every dimension a multiple of 8 (16 bytes).
inline constexpr bool isOdd(int64_t dim) { return dim % 8 != 0; }
/// An odd dimension is rounded up to a multiple of this.
inline constexpr int64_t kRounding = 64;
inline constexpr int64_t rounded(int64_t dim) { return (dim + kRounding - 1) / kRounding * kRounding; }
/// Rounding pays when the product does at least this many FLOPs per byte the
/// rounding copies: the copies ran at ~2.3 TB/s and the rounding saved 6-9 ps
/// per multiply-add pair, a break-even of 46-74 FLOPs per byte.
inline constexpr double kMinFlopsPerByte = 64.0;
/// Rounding may add at most 1/8 of the product's work.
inline constexpr double kMaxGrowth = 1.125;

} // namespace pipec::gemm_rounding

#endif
