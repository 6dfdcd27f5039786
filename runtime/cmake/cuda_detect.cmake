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

# cuDNN and its graph API headers (cudnn_frontend, which tools/setup.sh
# unpacks into .deps/): the CUDA kernels' flash attention
# (docs/cuda-kernels.md). Without them the kernels still build and run
# attention on pipec's own kernels. The library itself is only looked for
# as a sign that cuDNN is installed: the kernels load it at run time. Sets
# PIPEC_CUDNN_FOUND, PIPEC_CUDNN_INCLUDE, PIPEC_CUDNN_FRONTEND_INCLUDE.
set(PIPEC_CUDNN_FOUND OFF)
if(PIPEC_CUDA_FOUND)
  get_filename_component(_pipec_root ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
  file(GLOB _pipec_frontend_dirs ${_pipec_root}/.deps/cudnn-frontend-*/include)
  find_path(PIPEC_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
  find_library(PIPEC_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64)
  find_path(PIPEC_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h HINTS ${_pipec_frontend_dirs})
  if(PIPEC_CUDNN_INCLUDE AND PIPEC_CUDNN_LIBRARY AND PIPEC_CUDNN_FRONTEND_INCLUDE)
    set(PIPEC_CUDNN_FOUND ON)
  endif()
endif()
