# cuDNN 9 for dropit::cuda, as imported target dropit_cudnn::cudnn (when found; nothing otherwise):
# its headers and library next to the CUDA toolkit's, or where CUDNN_ROOT or CUDNN_INCLUDE_DIR and
# CUDNN_LIBRARY point. dropit's CMake and its installed package config both include this file, so a
# consumer finds the cuDNN the package was built with the same way.
include_guard(GLOBAL)
if(TARGET dropit_cudnn::cudnn)
  return()
endif()
find_package(CUDAToolkit QUIET)
find_path(DROPIT_CUDNN_INCLUDE_DIR cudnn_graph.h
          HINTS ${CUDNN_INCLUDE_DIR} ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
find_library(DROPIT_CUDNN_LIBRARY cudnn
             HINTS ${CUDNN_LIBRARY} ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
mark_as_advanced(DROPIT_CUDNN_INCLUDE_DIR DROPIT_CUDNN_LIBRARY)
if(DROPIT_CUDNN_INCLUDE_DIR AND DROPIT_CUDNN_LIBRARY)
  file(STRINGS "${DROPIT_CUDNN_INCLUDE_DIR}/cudnn_version.h" _dropit_cudnn_major
       REGEX "^#define CUDNN_MAJOR [0-9]+")
  string(REGEX MATCH "[0-9]+$" _dropit_cudnn_major "${_dropit_cudnn_major}")
  if(_dropit_cudnn_major GREATER_EQUAL 9)
    add_library(dropit_cudnn::cudnn INTERFACE IMPORTED)
    target_include_directories(dropit_cudnn::cudnn INTERFACE ${DROPIT_CUDNN_INCLUDE_DIR})
    target_link_libraries(dropit_cudnn::cudnn INTERFACE ${DROPIT_CUDNN_LIBRARY})
  endif()
endif()
