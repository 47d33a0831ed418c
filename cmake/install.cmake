# `cmake --install build --prefix P`: the trident CLI (bin/), the public API headers (include/trident/...), one
# shared library libtrident.so holding every layer (lib/), a CMake package (find_package(trident CONFIG) ->
# imported target trident::trident) and trident.pc for pkg-config. Included from the top-level CMakeLists.txt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public API: process groups, stores, the launcher's environment, the training entry points, and every
# header they include (followed here, so the installed tree is closed; tests/install checks each header
# compiles on its own).
set(trident_public_roots
    comm/process_group.h comm/work.h comm/types.h comm/store/store.h comm/store/tcp_store.h
    comm/store/file_store.h comm/store/hash_store.h comm/store/rendezvous.h launch/launcher.h core/error.h
    core/dtype.h core/env.h core/tensor.h parallel/data_parallel.h train/trainer.h train/config.h
    train/distributed.h)
set(trident_public_headers)
set(pending ${trident_public_roots})
while(pending)
  list(POP_FRONT pending h)
  if(h IN_LIST trident_public_headers)
    continue()
  endif()
  list(APPEND trident_public_headers ${h})
  file(STRINGS ${PROJECT_SOURCE_DIR}/src/trident/${h} incs REGEX "^#include \"trident/")
  foreach(line ${incs})
    string(REGEX REPLACE "^#include \"trident/([^\"]+)\".*" "\\1" dep "${line}")
    list(APPEND pending ${dep})
  endforeach()
endwhile()
list(SORT trident_public_headers)
foreach(h ${trident_public_headers})
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/src/trident/${h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trident/${dir})
endforeach()
# For the header test: one header per line.
string(REPLACE ";" "\n" lines "${trident_public_headers}")
file(WRITE ${PROJECT_BINARY_DIR}/trident_public_headers.txt "${lines}\n")

# One shared library from the layers' (position-independent) static archives: users link one thing.
add_library(trident_shared SHARED ${PROJECT_SOURCE_DIR}/cmake/trident_version.cc)
set(layers trident_train trident_parallel trident_nn trident_kernels trident_plan trident_schedule trident_launch
           trident_comm trident_algorithms trident_transport trident_backends trident_cost trident_comm_api
           trident_comm_types trident_store trident_core)
set(whole)
foreach(l ${layers})
  list(APPEND whole $<TARGET_FILE:${l}>)
endforeach()
# Every object of every layer (--whole-archive), then the layers again as ordinary libraries for their own
# dependencies (fmt, OpenBLAS, rt, MPI/CUDA where built). CMake's WHOLE_ARCHIVE feature cannot be used: the
# layers also reach the link transitively through each other.
target_link_options(trident_shared PRIVATE LINKER:--whole-archive ${whole} LINKER:--no-whole-archive)
target_link_libraries(trident_shared PRIVATE ${layers})
target_link_libraries(trident_shared PUBLIC fmt::fmt nlohmann_json::nlohmann_json Threads::Threads)
target_include_directories(trident_shared PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(trident_shared PUBLIC cxx_std_20)
set_target_properties(trident_shared PROPERTIES OUTPUT_NAME trident EXPORT_NAME trident
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
                      INSTALL_RPATH "$ORIGIN")
target_compile_definitions(trident_shared PRIVATE TRIDENT_VERSION="${PROJECT_VERSION}")

install(TARGETS trident RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS trident_shared EXPORT tridentTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
set(cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/trident)
install(EXPORT tridentTargets NAMESPACE trident:: DESTINATION ${cmakedir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tridentConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/tridentConfig.cmake INSTALL_DESTINATION ${cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tridentConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tridentConfig.cmake ${PROJECT_BINARY_DIR}/tridentConfigVersion.cmake
        DESTINATION ${cmakedir})
# pkg-config: relocatable (paths relative to the .pc file), so any --prefix works.
file(RELATIVE_PATH pc_to_prefix /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${PROJECT_SOURCE_DIR}/cmake/trident.pc.in ${PROJECT_BINARY_DIR}/trident.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/trident.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

if(TRIDENT_BUILD_TESTS)
  # Install to a temporary prefix, build examples/ against it (find_package and pkg-config), run them at 2
  # ranks with the installed `trident launch`, and compile every installed header on its own.
  add_test(NAME install_examples
           COMMAND ${PROJECT_SOURCE_DIR}/tests/install/test_install.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
  # COST: its seconds, so a fresh build directory (no timings of its own yet) starts the longest tests first.
  set_tests_properties(install_examples PROPERTIES TIMEOUT 900 LABELS install COST 70)
endif()
