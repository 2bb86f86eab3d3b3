# Install rules and the package config that make find_package(dropit CONFIG) work.
#
# Installed layout (everything is header-only, hence architecture independent):
#   <prefix>/include/dropit/...                                  the headers
#   <prefix>/share/cmake/dropit/dropitConfig.cmake               package config
#   <prefix>/share/cmake/dropit/dropitConfigVersion.cmake        version file (SameMinorVersion)
#   <prefix>/share/cmake/dropit/dropitTargets.cmake              dropit::dropit, dropit::cpu_instances
#   <prefix>/share/cmake/dropit/dropit-<component>.cmake         a later component (cuda, torch)
#   <prefix>/share/cmake/dropit/dropit-<component>-targets.cmake its exported targets
#
# Rules are generated only with DROPIT_INSTALL (ON when dropit is the top-level project);
# dropit_install_component() is always defined and does nothing without it.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DROPIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/dropit"
    CACHE STRING "Where dropit's package config is installed, relative to the prefix")
mark_as_advanced(DROPIT_INSTALL_CMAKEDIR)

# dropit_install_component(<name> TARGETS <target>... CONFIG <dropit-name.cmake.in>)
#
# Installs a later, optional part of dropit (cuda, torch) so that consumers ask for it with
#   find_package(dropit CONFIG REQUIRED COMPONENTS <name>)   ->  target dropit::<name>
# Give each target EXPORT_NAME <name> (set_target_properties(dropit_cuda PROPERTIES EXPORT_NAME
# cuda)). The targets go to export set dropit-<name>-targets; <dropit-name.cmake.in> is configured
# (@ONLY) into dropit-<name>.cmake, which dropitConfig.cmake includes when <name> is requested.
# That file finds the component's own dependencies and then reads its targets:
#   include(CMakeFindDependencyMacro)
#   find_dependency(CUDAToolkit)                  # returns early with dropit_FOUND FALSE if absent
#   include("${CMAKE_CURRENT_LIST_DIR}/dropit-cuda-targets.cmake")
#   set(dropit_cuda_FOUND TRUE)
function(dropit_install_component name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "CONFIG" "TARGETS")
  if(NOT arg_TARGETS OR NOT arg_CONFIG)
    message(FATAL_ERROR "dropit_install_component(${name}): TARGETS and CONFIG are required")
  endif()
  if(NOT DROPIT_INSTALL)
    return()
  endif()
  install(TARGETS ${arg_TARGETS} EXPORT dropit-${name}-targets)
  install(EXPORT dropit-${name}-targets NAMESPACE dropit::
          DESTINATION ${DROPIT_INSTALL_CMAKEDIR})
  configure_file(${arg_CONFIG} ${PROJECT_BINARY_DIR}/dropit-${name}.cmake @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/dropit-${name}.cmake DESTINATION ${DROPIT_INSTALL_CMAKEDIR})
endfunction()

if(NOT DROPIT_INSTALL)
  return()
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dropit dropit_cpu_instances EXPORT dropitTargets)
install(EXPORT dropitTargets NAMESPACE dropit:: DESTINATION ${DROPIT_INSTALL_CMAKEDIR})

# DROPIT_OPENMP_LINKED (set by the top-level CMakeLists.txt) tells the installed config whether
# dropit::dropit links OpenMP::OpenMP_CXX, hence whether it must find OpenMP.
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dropitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dropitConfig.cmake
  INSTALL_DESTINATION ${DROPIT_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dropitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/dropitConfig.cmake ${PROJECT_BINARY_DIR}/dropitConfigVersion.cmake
  DESTINATION ${DROPIT_INSTALL_CMAKEDIR})
