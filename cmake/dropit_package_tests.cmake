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
      -DTORCH_PREFIX=${_dropit_torch_prefix}
      -P ${PROJECT_SOURCE_DIR}/tests/package/check_consumer.cmake)
  set_tests_properties(package.${mode} PROPERTIES LABELS package TIMEOUT 600)
endforeach()
