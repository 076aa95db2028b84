# `cmake --install` + `find_package(zerodp)`: the libraries, their headers (include/zerodp,
# project-rooted as in the tree: "train/engine.h"), the zerodp binary and a package config.
include(CMakePackageConfigHelpers)
get_property(_zerodp_libs GLOBAL PROPERTY ZERODP_LIBRARIES)
install(TARGETS ${_zerodp_libs} zerodp_dnnl EXPORT zerodpTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zerodp
        FILES_MATCHING PATTERN "*.h")
install(EXPORT zerodpTargets NAMESPACE zerodp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zerodp)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zerodpConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zerodpConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zerodp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zerodpConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zerodpConfig.cmake ${PROJECT_BINARY_DIR}/zerodpConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/zerodp)
