# dropit::torch: the LibTorch adapters (include/dropit/torch.hpp). Header-only like the core; it
# adds LibTorch, found with find_package(Torch) (Debian's libtorch-dev, or a LibTorch 2.x prefix
# given through CMAKE_PREFIX_PATH, e.g. `python3 -c "import torch; print(torch.utils.cmake_prefix_path)"`).

set(_dropit_torch_default OFF)
if(PROJECT_IS_TOP_LEVEL)
  find_package(Torch QUIET)
  set(_dropit_torch_default ${Torch_FOUND})
endif()
option(DROPIT_BUILD_TORCH "Build dropit::torch and its tests and examples (needs LibTorch)"
       ${_dropit_torch_default})

if(DROPIT_BUILD_TORCH)
  if(NOT TARGET torch)
    # Imported targets are visible only in the directory that found them. A project embedding
    # dropit (add_subdirectory, FetchContent) that did not find Torch itself links dropit::torch
    # from its own directories, so the targets this finds are made global.
    get_property(_dropit_before DIRECTORY PROPERTY IMPORTED_TARGETS)
    find_package(Torch REQUIRED)
    get_property(_dropit_after DIRECTORY PROPERTY IMPORTED_TARGETS)
    list(REMOVE_ITEM _dropit_after ${_dropit_before})
    foreach(target IN LISTS _dropit_after)
      set_target_properties(${target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endforeach()
  endif()
  add_library(dropit_torch INTERFACE)
  add_library(dropit::torch ALIAS dropit_torch)
  set_target_properties(dropit_torch PROPERTIES EXPORT_NAME torch)
  target_link_libraries(dropit_torch INTERFACE dropit::dropit torch)
  # Some CPU builds of LibTorch ship CUDA headers too; only its CUDA libraries prove CUDA support.
  if(TORCH_CUDA_LIBRARIES)
    target_compile_definitions(dropit_torch INTERFACE DROPIT_TORCH_WITH_CUDA=1)
    # PyPI's torch loads the CUDA libraries of its own nvidia-* wheels (site-packages/nvidia/*/lib),
    # which may be newer than the CUDA toolkit's: the linker must resolve libtorch_cuda's
    # dependencies there, not in the toolkit directory CMake puts on the rpath (libnccl.so.2
    # differs). The installed component does the same (dropit-torch.cmake.in).
    file(GLOB _dropit_wheel_libs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
    foreach(dir IN LISTS _dropit_wheel_libs)
      target_link_options(dropit_torch INTERFACE "$<BUILD_INTERFACE:LINKER:-rpath-link,${dir}>")
    endforeach()
  endif()
  dropit_install_component(torch TARGETS dropit_torch CONFIG ${CMAKE_CURRENT_LIST_DIR}/dropit-torch.cmake.in)
endif()
