# cuDNN 9.8 or later for dropit::cuda_cudnn, as imported target dropit_cudnn::cudnn (when found;
# nothing otherwise): its headers and library next to the CUDA toolkit's, under CUDNN_ROOT, or
# where CUDNN_INCLUDE_DIR (a folder) and CUDNN_LIBRARY (the library file) point. dropit's CMake and
# its installed package config both include this file, so a consumer finds cuDNN the same way.
# 9.8 is the first cuDNN whose execution plans take a device-property descriptor.
if(TARGET dropit_cudnn::cudnn)
  return()
endif()
find_package(CUDAToolkit QUIET)
find_path(DROPIT_CUDNN_INCLUDE_DIR cudnn_graph.h
          HINTS ${CUDNN_INCLUDE_DIR} ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
if(CUDNN_LIBRARY)
  set(DROPIT_CUDNN_LIBRARY "${CUDNN_LIBRARY}" CACHE FILEPATH "The cuDNN library dropit links")
else()
  # libcudnn.so.9 alone: the library as PyTorch's wheels ship it, without the development link.
  find_library(DROPIT_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
               HINTS ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
endif()
mark_as_advanced(DROPIT_CUDNN_INCLUDE_DIR DROPIT_CUDNN_LIBRARY)
if(DROPIT_CUDNN_INCLUDE_DIR AND DROPIT_CUDNN_LIBRARY
   AND EXISTS "${DROPIT_CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${DROPIT_CUDNN_INCLUDE_DIR}/cudnn_version.h" _dropit_cudnn_version
       REGEX "^#define CUDNN_(MAJOR|MINOR) [0-9]+")
  string(REGEX MATCH "CUDNN_MAJOR ([0-9]+)" _ "${_dropit_cudnn_version}")
  set(_dropit_cudnn_major "${CMAKE_MATCH_1}")
  string(REGEX MATCH "CUDNN_MINOR ([0-9]+)" _ "${_dropit_cudnn_version}")
  set(_dropit_cudnn_minor "${CMAKE_MATCH_1}")
  if(_dropit_cudnn_major GREATER 9 OR (_dropit_cudnn_major EQUAL 9 AND _dropit_cudnn_minor
                                                                      GREATER_EQUAL 8))
    add_library(dropit_cudnn::cudnn INTERFACE IMPORTED)
    target_include_directories(dropit_cudnn::cudnn INTERFACE ${DROPIT_CUDNN_INCLUDE_DIR})
    target_link_libraries(dropit_cudnn::cudnn INTERFACE ${DROPIT_CUDNN_LIBRARY})
  else()
    message(STATUS "dropit: cuDNN ${_dropit_cudnn_major}.${_dropit_cudnn_minor} found in "
                   "${DROPIT_CUDNN_INCLUDE_DIR}; dropit::cuda_cudnn needs 9.8 or later")
  endif()
endif()
