# Package tests: a separate project (tests/package/consumer) uses dropit through find_package on an
# installed prefix (with and without OpenMP), add_subdirectory and FetchContent, each configured,
# built and run by tests/package/check_consumer.cmake. Included from the top-level CMakeLists.txt
# when DROPIT_BUILD_TESTS is ON. Everything they write stays under <build>/package-tests/.
option(DROPIT_TEST_PACKAGE "Test consuming dropit by find_package, add_subdirectory, FetchContent" ON)
if(NOT DROPIT_TEST_PACKAGE)
  return()
endif()

set(_dropit_package_modes find_package find_package_no_openmp add_subdirectory fetchcontent)
if(TARGET dropit::torch)
  list(APPEND _dropit_package_modes add_subdirectory_torch)
  # The prefix LibTorch was found in, for a consumer that does not look for it itself.
  get_filename_component(_dropit_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
endif()
# dropit::torch_cuda against the CUDA LibTorch inside the torch that python3 imports (PyPI's current
# torch is a CUDA build, installable without a GPU), when its CUDA major version is nvcc's: the
# adapters' CUDA side is compiled and linked here, and run where a GPU is.
if(DROPIT_BUILD_CUDA AND DROPIT_PYTHON_EXECUTABLE)
  execute_process(
    COMMAND ${DROPIT_PYTHON_EXECUTABLE} -c
            "import os, torch; print(torch.version.cuda or ''); print(os.path.dirname(torch.__file__))"
    RESULT_VARIABLE _dropit_status OUTPUT_VARIABLE _dropit_probe ERROR_QUIET
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REPLACE "\n" ";" _dropit_probe "${_dropit_probe}")
  list(LENGTH _dropit_probe _dropit_probe_length)
  if(_dropit_status EQUAL 0 AND _dropit_probe_length EQUAL 2)
    list(GET _dropit_probe 0 _dropit_torch_cuda_version)
    list(GET _dropit_probe 1 _dropit_torch_cuda_prefix)
    string(REGEX MATCH "^[0-9]+" _dropit_torch_cuda_major "${_dropit_torch_cuda_version}")
    string(REGEX MATCH "^[0-9]+" _dropit_nvcc_major "${CMAKE_CUDA_COMPILER_VERSION}")
    if(_dropit_torch_cuda_major AND _dropit_torch_cuda_major STREQUAL _dropit_nvcc_major)
      list(APPEND _dropit_package_modes add_subdirectory_torch_cuda)
    else()
      message(STATUS "dropit: no dropit::torch_cuda package test: ${DROPIT_PYTHON_EXECUTABLE}'s "
                     "torch has CUDA '${_dropit_torch_cuda_version}', nvcc ${CMAKE_CUDA_COMPILER_VERSION}")
    endif()
  endif()
endif()
# The consumer checks the package's wiring, not the kernels (the build compiles those for every
# architecture): it compiles for one, the first.
set(_dropit_cuda_archs "")
if(CMAKE_CUDA_ARCHITECTURES)
  list(GET CMAKE_CUDA_ARCHITECTURES 0 _dropit_cuda_archs)
endif()

foreach(mode IN LISTS _dropit_package_modes)
  add_test(NAME package.${mode}
    COMMAND ${CMAKE_COMMAND}
      -DMODE=${mode}
      -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
      -DWORK_DIR=${PROJECT_BINARY_DIR}/package-tests/${mode}
      -DGENERATOR=${CMAKE_GENERATOR}
      -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DCTEST_COMMAND=${CMAKE_CTEST_COMMAND}
      -DVERSION=${PROJECT_VERSION}
      -DEXPECT_OPENMP=${DROPIT_OPENMP_LINKED}
      -DTORCH_PREFIX=$<IF:$<STREQUAL:${mode},add_subdirectory_torch_cuda>,${_dropit_torch_cuda_prefix},${_dropit_torch_prefix}>
      -DCUDA_COMPILER=${CMAKE_CUDA_COMPILER}
      -DCUDA_ARCHITECTURES=${_dropit_cuda_archs}
      -P ${PROJECT_SOURCE_DIR}/tests/package/check_consumer.cmake)
  set_tests_properties(package.${mode} PROPERTIES LABELS package TIMEOUT 900)
endforeach()

if(add_subdirectory_torch_cuda IN_LIST _dropit_package_modes)
  # The program built by package.add_subdirectory_torch_cuda, run as a test of its own so that
  # without a GPU it shows as skipped rather than hidden inside a passed package test.
  set_tests_properties(package.add_subdirectory_torch_cuda PROPERTIES
                       FIXTURES_SETUP dropit_torch_cuda_consumer)
  add_test(NAME torch_cuda
           COMMAND ${PROJECT_BINARY_DIR}/package-tests/add_subdirectory_torch_cuda/consumer-build/consumer_torch_cuda)
  set_tests_properties(torch_cuda PROPERTIES FIXTURES_REQUIRED dropit_torch_cuda_consumer
                       SKIP_RETURN_CODE 77 LABELS "cuda;torch")
endif()
