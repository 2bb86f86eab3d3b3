# dropit::cuda: the CUDA backend (include/dropit/dropit.cuh). Header-only like the core; it adds
# CUDA C++20, the toolkit's CCCL (CUB block primitives), the CUDA runtime and cuBLAS. Building it
# needs a CUDA toolkit (nvcc), not a GPU: without a device the CUDA tests report themselves skipped.
#
# The target never sets CUDA architectures: a consumer's CMAKE_CUDA_ARCHITECTURES (or CUDAARCHS)
# decides. Only dropit's own top-level build defaults them to sm_80 and sm_90 when none are given.

include(CheckLanguage)
set(_dropit_cuda_default OFF)
if(PROJECT_IS_TOP_LEVEL)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_dropit_cuda_default ON)
  endif()
endif()
option(DROPIT_BUILD_CUDA "Build dropit::cuda and its tests (needs the CUDA toolkit, not a GPU)"
       ${_dropit_cuda_default})

if(DROPIT_BUILD_CUDA)
  if(PROJECT_IS_TOP_LEVEL AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES "80;90"
        CACHE STRING "CUDA architectures of dropit's own CUDA targets")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)

  add_library(dropit_cuda INTERFACE)
  add_library(dropit::cuda ALIAS dropit_cuda)
  set_target_properties(dropit_cuda PROPERTIES EXPORT_NAME cuda)
  # dropit::dropit brings OpenMP::OpenMP_CXX, whose -fopenmp applies to CXX sources only
  # ($<COMPILE_LANGUAGE:CXX>): CUDA translation units see the CPU backend without OpenMP, which only
  # makes it serial (its results never depend on the thread count).
  # cuBLAS computes the linear weight gradient from the densified cache.
  target_link_libraries(dropit_cuda INTERFACE dropit::dropit CUDA::cudart CUDA::cublas)
  # CUDA C++20: the compile feature where this CMake knows it for nvcc, else the flag itself
  # (CMake 3.25, Debian 12's, knows CUDA standards only up to 17).
  if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    target_compile_features(dropit_cuda INTERFACE cuda_std_20)
  else()
    target_compile_options(dropit_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()

  # dropit::cuda_instances: the operations compiled by nvcc for every storage type
  # (include/dropit/cuda_instances.cu, added to the consumer's sources), so that code compiled by
  # the host compiler calls them through dropit/cuda.hpp, and the consumer's own nvcc translation
  # units declare them extern (DROPIT_CUDA_INSTANCES) instead of compiling every kernel again.
  # Link it into one target per program.
  dropit_instances_library(cuda_instances cuda_instances.cu)
  target_compile_definitions(dropit_cuda_instances INTERFACE DROPIT_CUDA_INSTANCES)
  target_link_libraries(dropit_cuda_instances INTERFACE dropit_cuda)
  dropit_install_component(cuda TARGETS dropit_cuda dropit_cuda_instances
                           CONFIG ${CMAKE_CURRENT_LIST_DIR}/dropit-cuda.cmake.in)

  # dropit::cuda_cudnn: the CUDA backend's conv2d weight gradient through cuDNN's graph API (the
  # kernel torch's convolution backward runs) instead of its own im2col + cuBLAS, for programs
  # that link it besides dropit::cuda. Defined where cmake/dropit_find_cudnn.cmake finds cuDNN 9.
  # A program that also links LibTorch (dropit::torch_cuda) leaves it out: torch loads the cuDNN
  # it was built with, and a process holds one libcudnn.so.9.
  include(${CMAKE_CURRENT_LIST_DIR}/dropit_find_cudnn.cmake)
  set(DROPIT_CUDA_CUDNN OFF)
  if(TARGET dropit_cudnn::cudnn)
    set(DROPIT_CUDA_CUDNN ON)
    add_library(dropit_cuda_cudnn INTERFACE)
    add_library(dropit::cuda_cudnn ALIAS dropit_cuda_cudnn)
    set_target_properties(dropit_cuda_cudnn PROPERTIES EXPORT_NAME cuda_cudnn)
    target_link_libraries(dropit_cuda_cudnn INTERFACE dropit_cuda dropit_cudnn::cudnn)
    target_compile_definitions(dropit_cuda_cudnn INTERFACE DROPIT_CUDA_CUDNN=1)
    dropit_install_component(cuda_cudnn TARGETS dropit_cuda_cudnn
                             CONFIG ${CMAKE_CURRENT_LIST_DIR}/dropit-cuda_cudnn.cmake.in)
    if(DROPIT_INSTALL)
      install(FILES ${CMAKE_CURRENT_LIST_DIR}/dropit_find_cudnn.cmake
              DESTINATION ${DROPIT_INSTALL_CMAKEDIR})
    endif()
  endif()
  message(STATUS "dropit::cuda_cudnn (conv2d weight gradient through cuDNN): ${DROPIT_CUDA_CUDNN}")
endif()

# dropit::torch_cuda: the LibTorch adapters on CUDA tensors. nvcc cannot compile LibTorch's headers
# as C++20, so the adapters (compiled by the host compiler) reach the kernels through
# dropit/cuda.hpp and the instances of dropit::cuda_instances. Defined when both dropit::torch and
# dropit::cuda are built and the LibTorch found is a CUDA build (e.g. the one inside PyPI's torch).
if(DROPIT_BUILD_CUDA AND TARGET dropit_torch AND TORCH_CUDA_LIBRARIES)
  add_library(dropit_torch_cuda INTERFACE)
  add_library(dropit::torch_cuda ALIAS dropit_torch_cuda)
  set_target_properties(dropit_torch_cuda PROPERTIES EXPORT_NAME torch_cuda)
  target_link_libraries(dropit_torch_cuda INTERFACE dropit_torch dropit_cuda_instances)
  target_compile_definitions(dropit_torch_cuda INTERFACE DROPIT_TORCH_CUDA=1)
  dropit_install_component(torch_cuda TARGETS dropit_torch_cuda
                           CONFIG ${CMAKE_CURRENT_LIST_DIR}/dropit-torch_cuda.cmake.in)
endif()
