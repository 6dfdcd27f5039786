// PIPEC_HOST_DEVICE: a function both the host and CUDA device code call (one
// definition for the CPU and CUDA kernels, or piperun and a kernel).
#pragma once

#ifdef __CUDACC__
#define PIPEC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PIPEC_HOST_DEVICE inline
#endif
