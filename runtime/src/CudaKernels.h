// The runtime's own small CUDA kernels (CudaKernels.cu): what the executor
// does to gradients and bundle headers without a host round trip. Every
// function launches on `stream` and returns the launch status; n == 0
// launches nothing. f32/f64 only (the caller checks the dtype).
#pragma once

#include "pipec/stage_abi.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace pipec::rt::cudakernels {

// x = (T)(x * factor), the product in double (as on the host).
cudaError_t scale(void *x, size_t n, pipec_dtype t, double factor, cudaStream_t stream);
// x += y.
cudaError_t add(void *x, const void *y, size_t n, pipec_dtype t, cudaStream_t stream);
// Blocks sumSquaresBlocks(n) each write {sum of squares of the finite
// elements, number of non-finite elements} (doubles) to partials[2b], [2b+1].
unsigned sumSquaresBlocks(size_t n);
cudaError_t sumSquares(const void *x, size_t n, pipec_dtype t, double *partials, cudaStream_t stream);
// out[0..1] = the sums of count partial pairs, in a fixed order (so the norm
// is the same on every run).
cudaError_t sumPartials(const double *partials, size_t count, double *out, cudaStream_t stream);
// control = stepVerdict(stats, maxNorm) (StepVerdict.h), computed on the device.
cudaError_t stepControl(const double *stats, double maxNorm, pipec_step_control *control, cudaStream_t stream);
// p[0..bytes) = 0 unless control->skip.
cudaError_t zeroUnlessSkipped(void *p, size_t bytes, const pipec_step_control *control, cudaStream_t stream);
// dst[0..bytes) = src[0..bytes), bytes <= 64, src passed by value (host
// memory, reusable at once).
cudaError_t writeBytes(void *dst, const void *src, size_t bytes, cudaStream_t stream);

// Unless bundle[0..compared) equals expected[0..compared) (host memory,
// passed by value; compared <= 64 and <= header), bundle[header..bytes)
// becomes all one bits (0xff bytes) before anything on `stream` after it
// reads the bundle: a received bundle whose header is not the one expected
// cannot be used as data (docs/runtime.md, "The CUDA target").
cudaError_t guardBundle(void *bundle, size_t bytes, const void *expected, unsigned compared, unsigned header,
                        cudaStream_t stream);

} // namespace pipec::rt::cudakernels
