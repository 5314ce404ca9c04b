# install() rules and an exported CMake package, so that an outside project can do
#   find_package(push REQUIRED)
#   target_link_libraries(app PRIVATE push::push)
include(CMakePackageConfigHelpers)

install(TARGETS push EXPORT pushTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/push DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(PUSH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/push)
install(EXPORT pushTargets NAMESPACE push:: DESTINATION ${PUSH_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pushConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pushConfig.cmake INSTALL_DESTINATION ${PUSH_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pushConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pushConfig.cmake ${PROJECT_BINARY_DIR}/pushConfigVersion.cmake
  DESTINATION ${PUSH_CMAKE_DIR})
