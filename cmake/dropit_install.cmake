# Installs the headers and exports dropit::dropit so that find_package(dropit CONFIG) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dropit EXPORT dropitTargets)
install(EXPORT dropitTargets NAMESPACE dropit:: DESTINATION ${CMAKE_INSTALL_DATADIR}/dropit/cmake)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/dropitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dropitConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_DATADIR}/dropit/cmake)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dropitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/dropitConfig.cmake ${PROJECT_BINARY_DIR}/dropitConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_DATADIR}/dropit/cmake)
