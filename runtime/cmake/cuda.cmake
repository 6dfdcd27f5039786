# The CUDA target of piperun (issue 7, docs/runtime.md "The CUDA target"):
# CudaDevice (device memory, the compute stream, events, a few small kernels)
# and GpuTransport, in pipec_runtime_cuda, linked into piperun with
# PIPEC_HAVE_CUDA defined. Built only when cuda_detect.cmake (shared with the
# CUDA kernels) finds nvcc, the CUDA runtime, cuBLAS and NCCL
# (PIPEC_CUDA_FOUND); otherwise piperun refuses plans whose runtime.target is
# "cuda" at start-up. Included from runtime/CMakeLists.txt after piperun.
include(${CMAKE_CURRENT_LIST_DIR}/cuda_detect.cmake)
set(PIPEC_RUNTIME_CUDA ${PIPEC_CUDA_FOUND})
if(PIPEC_CUDA_FOUND)
  message(STATUS "pipec runtime: building the CUDA target (NCCL: ${PIPEC_NCCL_LIBRARY})")
  add_library(pipec_runtime_cuda STATIC
    ${CMAKE_CURRENT_LIST_DIR}/../src/CudaDevice.cpp
    ${CMAKE_CURRENT_LIST_DIR}/../src/CudaKernels.cu
    ${CMAKE_CURRENT_LIST_DIR}/../src/GpuTransport.cpp
    ${CMAKE_CURRENT_LIST_DIR}/../src/SameGpuLinks.cpp)
  target_include_directories(pipec_runtime_cuda PUBLIC ${PIPEC_NCCL_INCLUDE})
  # pipec's CUDA kernels: a rank generates synthetic data on the device with
  # them (syntheticData). Only the objects piperun calls into are linked.
  # Standalone, the runtime builds the kernel library itself.
  if(PIPEC_RUNTIME_STANDALONE AND NOT TARGET pipec_cuda_kernels)
    add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/../kernels/cuda ${CMAKE_BINARY_DIR}/kernels-cuda)
  endif()
  target_link_libraries(pipec_runtime_cuda PUBLIC pipec_runtime_mpi pipec_cuda_kernels CUDA::cudart
                                                  ${PIPEC_NCCL_LIBRARY})
  target_compile_options(pipec_runtime_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror=switch>)
  set_target_properties(pipec_runtime_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                      POSITION_INDEPENDENT_CODE ON)
  # One CUDA runtime in the process: the shared one the stage libraries
  # (nvcc ... -lcudart) load too, so streams, events and the current device
  # are the same objects on both sides of the stage ABI.
  set_target_properties(pipec_runtime_cuda piperun PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
  target_link_libraries(piperun PRIVATE pipec_runtime_cuda)
  target_compile_definitions(piperun PRIVATE PIPEC_HAVE_CUDA=1)
else()
  message(STATUS "pipec runtime: CUDA target not built (PIPEC_ENABLE_CUDA=${PIPEC_ENABLE_CUDA}); "
                 "piperun refuses plans for target cuda")
endif()
