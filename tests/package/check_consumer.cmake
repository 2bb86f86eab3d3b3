# cmake -P driver for one package test (registered by cmake/dropit_package_tests.cmake):
# builds and runs tests/package/consumer against the dropit source tree in one of these modes:
#   find_package             install dropit (DROPIT_USE_OPENMP=ON) into a prefix, find_package it
#   find_package_no_openmp   the same with DROPIT_USE_OPENMP=OFF: the installed config must not
#                            need OpenMP and the consumer must not get it
#   add_subdirectory         add_subdirectory(<source tree>)
#   add_subdirectory_torch   the same with DROPIT_BUILD_TORCH ON, the consumer not finding Torch
#                            itself, and a second program using dropit::torch
#   add_subdirectory_torch_cuda  the same against a CUDA build of LibTorch (TORCH_PREFIX: PyPI
#                            torch's), with DROPIT_BUILD_CUDA ON and a third program using
#                            dropit::torch_cuda; CUDA_COMPILER and CUDA_ARCHITECTURES required
#   fetchcontent             FetchContent with FETCHCONTENT_SOURCE_DIR_DROPIT=<source tree>
#
# Inputs (-D): MODE SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER CTEST_COMMAND VERSION EXPECT_OPENMP,
# optional MAKE_PROGRAM, TORCH_PREFIX (the add_subdirectory_torch modes), CUDA_COMPILER and
# CUDA_ARCHITECTURES (comma-separated, e.g. 80,90). WORK_DIR is wiped first.
cmake_minimum_required(VERSION 3.21)

foreach(var MODE SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER CTEST_COMMAND VERSION)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(build_type Debug)  # quickest to compile; the consumer checks results, not speed
set(common_args -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
                "-DCMAKE_BUILD_TYPE=${build_type}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(MAKE_PROGRAM)
  list(APPEND common_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

# Runs a command, echoing it; stops the test with its output when it fails.
function(step)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "package test ${MODE}: ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${shown}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

function(expect_file path)
  if(NOT EXISTS "${path}")
    message(FATAL_ERROR "expected ${path} to exist")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer_args "-DDROPIT_EXPECT_OPENMP=${EXPECT_OPENMP}")

if(MODE MATCHES "^find_package")
  set(use_openmp ON)
  if(MODE STREQUAL "find_package_no_openmp")
    set(use_openmp OFF)
    set(consumer_args "-DDROPIT_EXPECT_OPENMP=OFF")
  endif()
  # Configured for one prefix and installed into another: the package must be relocatable.
  set(prefix "${WORK_DIR}/prefix")
  step("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/dropit-build" ${common_args}
       "-DCMAKE_INSTALL_PREFIX=${WORK_DIR}/configured-prefix-never-used"
       -DDROPIT_BUILD_TESTS=OFF -DDROPIT_BUILD_BENCHMARKS=OFF -DDROPIT_BUILD_EXAMPLES=OFF
       -DDROPIT_INSTALL=ON "-DDROPIT_USE_OPENMP=${use_openmp}")
  step("${CMAKE_COMMAND}" --install "${WORK_DIR}/dropit-build" --prefix "${prefix}")

  file(GLOB_RECURSE config_files "${prefix}/*/dropitConfig.cmake")
  list(LENGTH config_files count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "expected one installed dropitConfig.cmake, found: ${config_files}")
  endif()
  get_filename_component(config_dir "${config_files}" DIRECTORY)
  expect_file("${config_dir}/dropitConfigVersion.cmake")
  expect_file("${config_dir}/dropitTargets.cmake")
  expect_file("${prefix}/include/dropit/dropit.hpp")
  file(GLOB_RECURSE installed_detail RELATIVE "${prefix}" "${prefix}/include/dropit/detail/*")
  if(NOT installed_detail)
    message(FATAL_ERROR "include/dropit/detail/ was not installed")
  endif()
  file(READ "${config_dir}/dropitTargets.cmake" targets)
  file(GLOB_RECURSE all_installed LIST_DIRECTORIES false "${config_dir}/*.cmake")
  foreach(file IN LISTS all_installed)
    file(READ "${file}" text)
    foreach(build_path "${WORK_DIR}/configured-prefix-never-used" "${SOURCE_DIR}/"
                       "${WORK_DIR}/dropit-build")
      string(FIND "${text}" "${build_path}" at)
      if(at GREATER_EQUAL 0)
        message(FATAL_ERROR "${file} names ${build_path}: the package is not relocatable")
      endif()
    endforeach()
  endforeach()
  if(NOT use_openmp AND targets MATCHES "OpenMP")
    message(FATAL_ERROR "installed with DROPIT_USE_OPENMP=OFF but dropitTargets.cmake names OpenMP")
  endif()

  list(APPEND consumer_args -DDROPIT_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=${prefix}"
       "-DDROPIT_EXPECT_VERSION=${VERSION}" "-DDROPIT_EXPECT_DIR=${config_dir}")
elseif(MODE MATCHES "^add_subdirectory")
  list(APPEND consumer_args -DDROPIT_CONSUMER_MODE=${MODE} "-DDROPIT_SOURCE_DIR=${SOURCE_DIR}")
  if(MODE MATCHES "^add_subdirectory_torch")
    # Where LibTorch is; the consumer passes it on without find_package.
    list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${TORCH_PREFIX}")
  endif()
  if(MODE STREQUAL "add_subdirectory_torch_cuda")
    list(APPEND consumer_args "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}"
         "-DDROPIT_CONSUMER_CUDA_ARCHS=${CUDA_ARCHITECTURES}")
  endif()
elseif(MODE STREQUAL "fetchcontent")
  list(APPEND consumer_args -DDROPIT_CONSUMER_MODE=fetchcontent
       "-DFETCHCONTENT_SOURCE_DIR_DROPIT=${SOURCE_DIR}" -DFETCHCONTENT_QUIET=OFF)
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

set(consumer_build "${WORK_DIR}/consumer-build")
step("${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${consumer_build}"
     ${common_args} ${consumer_args})
step("${CMAKE_COMMAND}" --build "${consumer_build}" --config ${build_type})
step("${CTEST_COMMAND}" --test-dir "${consumer_build}" -C ${build_type} --output-on-failure
     --verbose)
string(REGEX MATCH "dropit [^\n]* consumer: [^\n]*" summary "${step_output}")

if(MODE MATCHES "^add_subdirectory" OR MODE STREQUAL "fetchcontent")
  # An embedded dropit installs nothing unless asked (DROPIT_INSTALL).
  step("${CMAKE_COMMAND}" --install "${consumer_build}" --prefix "${WORK_DIR}/consumer-prefix"
       --config ${build_type})
  if(EXISTS "${WORK_DIR}/consumer-prefix/include/dropit")
    message(FATAL_ERROR "an embedded dropit installed its headers without DROPIT_INSTALL")
  endif()
endif()

message(STATUS "package test ${MODE}: passed (${summary})")
