// The optimizer step's verdict on its gradients (Device::stepControl,
// docs/runtime.md "The optimizer step"): one definition for the host device
// and the CUDA kernel that computes it where the statistics are.
#pragma once

#include "pipec/stage_abi.h"

#include <math.h>

namespace pipec::rt {

// stats: {sum of squares of the finite gradient elements, number of
// non-finite ones}, summed over every rank the check covers.
#ifdef __CUDACC__
__host__ __device__
#endif
inline pipec_step_control
stepVerdict(const double *stats, double maxNorm) {
  pipec_step_control c{1.0, 0.0};
  if (stats[1] > 0) {
    c.skip = 1.0;
    return c;
  }
  const double norm = sqrt(stats[0]);
  if (maxNorm > 0 && norm > maxNorm) c.grad_scale = maxNorm / norm;
  return c;
}

} // namespace pipec::rt
