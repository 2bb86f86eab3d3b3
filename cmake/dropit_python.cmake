# The Python package (python/, import name `dropit`): a torch C++ extension over dropit::torch,
# built with torch.utils.cpp_extension into <build>/python/<torch version>/lib and tested there by
# pytest (tests/python), so the tests always run the code of this tree. `python3 -m pip install
# --no-build-isolation ./python` installs it for users.
#
# It is built for python3 on PATH (PyPI's current torch) and for each of
# DROPIT_PYTHON_EXTRA_EXECUTABLES (none by default) that imports a torch of another supported
# version. The package needs torch >= 2.4 (torch.library's fake kernels and opcheck): ON when
# dropit is the top-level project and python3 imports such a torch; without torch the Python tests
# report themselves skipped.

find_program(DROPIT_PYTHON_EXECUTABLE NAMES python3 python
             DOC "Python that builds and tests dropit's Python package")
set(DROPIT_PYTHON_EXTRA_EXECUTABLES "" CACHE STRING
    "More Pythons whose torch the package is also built and tested against (when they import a torch of another version)")
set(DROPIT_PYTHON_MIN_TORCH 2.4)

# Sets <out>_VERSION to the torch version `python` imports ("" when it cannot, or when that torch
# is older than the package supports).
function(_dropit_probe_torch python out)
  execute_process(COMMAND ${python} -c "import torch; print(torch.__version__.split('+')[0])"
                  RESULT_VARIABLE status OUTPUT_VARIABLE version ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT status EQUAL 0)
    set(version "")
  elseif(version VERSION_LESS DROPIT_PYTHON_MIN_TORCH)
    message(STATUS "dropit: ${python} imports torch ${version}; the Python package needs torch >= "
                   "${DROPIT_PYTHON_MIN_TORCH}, so it is not built for it")
    set(version "")
  endif()
  set(${out}_VERSION "${version}" PARENT_SCOPE)
endfunction()

set(DROPIT_PYTHON_HAS_TORCH OFF)
if(DROPIT_PYTHON_EXECUTABLE)
  _dropit_probe_torch(${DROPIT_PYTHON_EXECUTABLE} _dropit_main)
  if(_dropit_main_VERSION)
    set(DROPIT_PYTHON_HAS_TORCH ON)
  endif()
endif()
set(_dropit_python_default OFF)
if(DROPIT_PYTHON_HAS_TORCH AND PROJECT_IS_TOP_LEVEL)
  set(_dropit_python_default ON)
endif()
option(DROPIT_BUILD_PYTHON "Build and test dropit's Python package (needs python3 with torch)"
       ${_dropit_python_default})

# One build of the package per interpreter: (python, torch version, lib directory) in
# DROPIT_PYTHON_BUILDS, three entries each, for tests/python.
set(DROPIT_PYTHON_BUILDS "")
function(_dropit_add_python_build python torch_version)
  set(tag torch-${torch_version})
  set(base ${PROJECT_BINARY_DIR}/python/${tag})
  file(GLOB_RECURSE inputs CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/python/dropit/*.py ${PROJECT_SOURCE_DIR}/python/src/*.cpp
       ${PROJECT_SOURCE_DIR}/python/src/*.cu ${PROJECT_SOURCE_DIR}/python/src/*.hpp
       ${PROJECT_SOURCE_DIR}/include/dropit/*.hpp
       ${PROJECT_SOURCE_DIR}/include/dropit/*.cuh ${PROJECT_SOURCE_DIR}/include/dropit/*.cu
       ${PROJECT_SOURCE_DIR}/include/dropit/*.cpp)
  # setup.py keeps its objects under <base>/build, so a rebuild recompiles only on change. torch
  # compiles with ninja, which must not see make's jobserver flags (it cannot use them).
  add_custom_command(
    OUTPUT ${base}/built.stamp
    COMMAND ${CMAKE_COMMAND} -E env --unset=MAKEFLAGS --unset=MFLAGS
            ${python} setup.py --quiet build --build-base ${base}/build --build-lib ${base}/lib
    COMMAND ${CMAKE_COMMAND} -E touch ${base}/built.stamp
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/python
    DEPENDS ${inputs} ${PROJECT_SOURCE_DIR}/python/setup.py
    COMMENT "Building the Python package dropit for torch ${torch_version} (${python})"
    VERBATIM)
  add_custom_target(dropit_python_${torch_version} ALL DEPENDS ${base}/built.stamp)
  message(STATUS "dropit: Python package for torch ${torch_version} with ${python}")
  set(DROPIT_PYTHON_BUILDS ${DROPIT_PYTHON_BUILDS} ${python} ${torch_version} ${base}/lib
      PARENT_SCOPE)
endfunction()

if(DROPIT_BUILD_PYTHON)
  if(NOT DROPIT_PYTHON_HAS_TORCH)
    message(FATAL_ERROR "DROPIT_BUILD_PYTHON is ON but '${DROPIT_PYTHON_EXECUTABLE}' cannot import "
                        "torch >= ${DROPIT_PYTHON_MIN_TORCH}; install it (python3 -m pip install "
                        "torch) or set it OFF")
  endif()
  _dropit_add_python_build(${DROPIT_PYTHON_EXECUTABLE} ${_dropit_main_VERSION})
  foreach(python IN LISTS DROPIT_PYTHON_EXTRA_EXECUTABLES)
    if(EXISTS ${python})
      _dropit_probe_torch(${python} _dropit_extra)
      if(_dropit_extra_VERSION AND NOT _dropit_extra_VERSION STREQUAL _dropit_main_VERSION)
        _dropit_add_python_build(${python} ${_dropit_extra_VERSION})
      endif()
    endif()
  endforeach()
endif()
