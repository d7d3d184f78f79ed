# `cmake --install`: the public headers under include/shardwise/, libshardwise.so, and a CMake
# package under share/cmake/shardwise (the layout torch's wheel uses, so one prefix serves both).
include(CMakePackageConfigHelpers)
set(SHARDWISE_CMAKE_DIR share/cmake/shardwise)

install(TARGETS shardwise EXPORT shardwiseTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT shardwiseTargets NAMESPACE shardwise:: DESTINATION ${SHARDWISE_CMAKE_DIR})
# Headers keep their folders (include/shardwise/fsdp/fsdp_engine.h, ...); the pybind11 glue stays
# out. The umbrella header sits on top: #include <shardwise/shardwise.h>.
install(DIRECTORY csrc/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/shardwise
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp"
        PATTERN "*_python.h" EXCLUDE PATTERN "shardwise" EXCLUDE)
install(FILES csrc/shardwise/shardwise.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/shardwise)

set(SHARDWISE_TORCH_VERSION ${Torch_VERSION})
configure_package_config_file(cmake/shardwiseConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/shardwiseConfig.cmake
                              INSTALL_DESTINATION ${SHARDWISE_CMAKE_DIR})
# LibTorch's ABI changes between minor releases, and so may ours: 0.1.x only.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/shardwiseConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shardwiseConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/shardwiseConfigVersion.cmake
        DESTINATION ${SHARDWISE_CMAKE_DIR})
