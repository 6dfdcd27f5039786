# Finds what the CUDA parts of pipec need (included by runtime/ and
# runtime/kernels/cuda/; idempotent). PIPEC_ENABLE_CUDA: AUTO builds them
# when nvcc, the CUDA runtime, cuBLAS and NCCL are found; ON requires them;
# OFF skips them. Sets PIPEC_CUDA_FOUND, PIPEC_NCCL_INCLUDE, PIPEC_NCCL_LIBRARY
# and, when found, enables the CUDA language (nvcc, architectures 80 and 90
# unless CMAKE_CUDA_ARCHITECTURES says otherwise).
if(NOT DEFINED PIPEC_ENABLE_CUDA)
  set(PIPEC_ENABLE_CUDA "AUTO" CACHE STRING "Build the CUDA parts: AUTO, ON or OFF")
endif()
set(PIPEC_CUDA_FOUND OFF)
if(NOT PIPEC_ENABLE_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_ROOT AND EXISTS ${CUDAToolkit_ROOT}/bin/nvcc)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_ROOT}/bin/nvcc)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(PIPEC_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_ROOT}/include /usr/local/cuda/include /usr/include)
  find_library(PIPEC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_ROOT}/lib64 /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cublas AND TARGET CUDA::cublasLt AND PIPEC_NCCL_INCLUDE AND PIPEC_NCCL_LIBRARY
     AND CMAKE_CUDA_COMPILER)
    set(PIPEC_CUDA_FOUND ON)
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
  elseif(PIPEC_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PIPEC_ENABLE_CUDA=ON but nvcc, the CUDA toolkit, cuBLAS or NCCL was not found")
  endif()
endif()
