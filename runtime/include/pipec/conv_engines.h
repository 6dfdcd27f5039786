#ifndef PIPEC_CONV_ENGINES_H
#define PIPEC_CONV_ENGINES_H

// Which convolutions the CUDA kernel library gives cuDNN's graphs and which
// it keeps on pipec's kernels, as far as the shapes and the precision tell
// before a run: the one rule that the library (runtime/kernels/cuda/src/
// conv_cudnn.cu) and the compiler's plan printout share
// (docs/cuda-kernels.md, "Convolutions (cuDNN)"). cuDNN may still decline a
// shape when the run builds its plan (no deterministic engine); piperun then
// names it on stderr, and pipec's kernels run it.

#include <cstdint>

namespace pipec::conv_engines {

/// cuDNN's convolution graphs take 1 to 3 spatial axes (a 1-D convolution
/// as a 2-D one of height 1).
inline constexpr int kMaxSpatialAxes = 3;

/// Why a convolution with `spatialAxes` spatial axes runs on pipec's
/// kernels whatever the card: float32 storage in the F32 precision keeps the
/// CPU target's results; more spatial axes than cuDNN's graphs take; an
/// empty tensor. Null when cuDNN is asked.
inline const char *staticFallback(int64_t spatialAxes, bool bf16Storage, bool f32Precision, bool empty) {
  if (!bf16Storage && f32Precision)
    return "the F32 precision keeps pipec's kernels, equal to the CPU target's";
  if (spatialAxes < 1 || spatialAxes > kMaxSpatialAxes)
    return "cuDNN's graphs take 1 to 3 spatial axes";
  if (empty)
    return "an empty tensor";
  return nullptr;
}

} // namespace pipec::conv_engines

#endif // PIPEC_CONV_ENGINES_H
