# The Python package (python/, import name `dropit`): a torch C++ extension over dropit::torch,
# built with torch.utils.cpp_extension into <build>/python/lib and tested there by pytest
# (tests/python), so the tests always run the code of this tree. `python3 -m pip install
# --no-build-isolation ./python` installs it for users. ON when dropit is the top-level project and
# python3 imports torch; without torch the Python tests report themselves skipped.

find_program(DROPIT_PYTHON_EXECUTABLE NAMES python3 python
             DOC "Python that builds and tests dropit's Python package")
set(_dropit_python_default OFF)
set(DROPIT_PYTHON_HAS_TORCH OFF)
if(DROPIT_PYTHON_EXECUTABLE)
  execute_process(COMMAND ${DROPIT_PYTHON_EXECUTABLE} -c "import torch; print(torch.__version__)"
                  RESULT_VARIABLE _dropit_torch_status OUTPUT_VARIABLE _dropit_torch_version
                  ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_dropit_torch_status EQUAL 0)
    set(DROPIT_PYTHON_HAS_TORCH ON)
    set(_dropit_python_default ${PROJECT_IS_TOP_LEVEL})
  endif()
endif()
option(DROPIT_BUILD_PYTHON "Build and test dropit's Python package (needs python3 with torch)"
       ${_dropit_python_default})

if(DROPIT_BUILD_PYTHON)
  if(NOT DROPIT_PYTHON_HAS_TORCH)
    message(FATAL_ERROR "DROPIT_BUILD_PYTHON is ON but '${DROPIT_PYTHON_EXECUTABLE}' cannot import "
                        "torch; install it (python3 -m pip install torch) or set it OFF")
  endif()
  message(STATUS "dropit: Python package with ${DROPIT_PYTHON_EXECUTABLE}, torch ${_dropit_torch_version}")
  set(DROPIT_PYTHON_LIB ${PROJECT_BINARY_DIR}/python/lib)
  file(GLOB_RECURSE _dropit_python_inputs CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/python/dropit/*.py ${PROJECT_SOURCE_DIR}/python/src/*.cpp
       ${PROJECT_SOURCE_DIR}/include/dropit/*.hpp)
  set(_dropit_python_stamp ${PROJECT_BINARY_DIR}/python/built.stamp)
  # setup.py keeps its objects under <build>/python/build, so a rebuild recompiles only on change.
  # torch compiles with ninja, which must not see make's jobserver flags (it cannot use them).
  add_custom_command(
    OUTPUT ${_dropit_python_stamp}
    COMMAND ${CMAKE_COMMAND} -E env --unset=MAKEFLAGS --unset=MFLAGS
            ${DROPIT_PYTHON_EXECUTABLE} setup.py --quiet build
            --build-base ${PROJECT_BINARY_DIR}/python/build --build-lib ${DROPIT_PYTHON_LIB}
    COMMAND ${CMAKE_COMMAND} -E touch ${_dropit_python_stamp}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/python
    DEPENDS ${_dropit_python_inputs} ${PROJECT_SOURCE_DIR}/python/setup.py
    COMMENT "Building the Python package dropit (torch extension)"
    VERBATIM)
  add_custom_target(dropit_python ALL DEPENDS ${_dropit_python_stamp})
endif()
