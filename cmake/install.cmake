# What `cmake --install` puts under the prefix (included by the top-level CMakeLists.txt when
# FERRY_INSTALL is on):
#   lib/libferry.so.X.Y.Z + libferry.so.X + libferry.so, lib/libferry.a
#   include/ferry.h
#   bin/ferry (the CLI, linked statically with libferry)
#   lib/cmake/ferry/: find_package(ferry) with the imported targets ferry::ferry (shared)
#                     and ferry::ferry_static
#   lib/pkgconfig/ferry.pc
# (lib is CMAKE_INSTALL_LIBDIR: lib64 or lib/<multiarch> on some systems.)
include(CMakePackageConfigHelpers)

set(FERRY_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/ferry")

install(TARGETS ferry ferry_static EXPORT ferryTargets
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(FILES "${PROJECT_SOURCE_DIR}/include/ferry.h" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
if(TARGET ferry_cli)
  install(TARGETS ferry_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()

# The CMake package: ferryConfig.cmake (finds Threads, then includes the targets),
# ferryConfigVersion.cmake and ferryTargets*.cmake.
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION "${FERRY_CMAKE_DIR}")
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/ferryConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/ferryConfig.cmake" INSTALL_DESTINATION "${FERRY_CMAKE_DIR}")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/ferryConfig.cmake"
  "${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake" DESTINATION "${FERRY_CMAKE_DIR}")

# pkg-config. With relative install dirs the file finds the prefix from its own place
# (${pcfiledir}), so that `cmake --install --prefix DIR` gives a correct file in DIR.
set(FERRY_PC_DIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FERRY_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(FERRY_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(FERRY_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH FERRY_PC_UP "/prefix/${FERRY_PC_DIR}" "/prefix")
  string(REGEX REPLACE "/$" "" FERRY_PC_UP "${FERRY_PC_UP}")
  set(FERRY_PC_PREFIX "\${pcfiledir}/${FERRY_PC_UP}")
  set(FERRY_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(FERRY_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${CMAKE_CURRENT_LIST_DIR}/ferry.pc.in" "${PROJECT_BINARY_DIR}/ferry.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/ferry.pc" DESTINATION "${FERRY_PC_DIR}")
