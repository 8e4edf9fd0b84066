# The CMake package of the lava_flow Python wheel: the liblava_flow.so that `import lava_flow`
# loads, so that a C or C++ extension shares the library (and its handles) with Python.
#   cmake -DLavaFlow_DIR="$(python -c 'import lava_flow; print(lava_flow.get_cmake_dir())')" ...
#   find_package(LavaFlow CONFIG REQUIRED)
#   target_link_libraries(my_extension PRIVATE LavaFlow::lava_flow)
# The extension records the library's SONAME; once `import lava_flow` has loaded it, the
# loader reuses that copy (import lava_flow before loading the extension, or give the
# extension an rpath to lava_flow/lib).
get_filename_component(_lf_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
file(GLOB _lf_lib "${_lf_root}/lib/liblava_flow.so.*")
list(LENGTH _lf_lib _lf_count)
if(NOT _lf_count EQUAL 1)
  set(LavaFlow_FOUND FALSE)
  set(LavaFlow_NOT_FOUND_MESSAGE "expected one liblava_flow.so.* in ${_lf_root}/lib, found '${_lf_lib}': reinstall lava_flow")
  return()
endif()
get_filename_component(_lf_soname "${_lf_lib}" NAME)
set(LAVA_FLOW_INCLUDE_DIR "${_lf_root}/include")
set(LAVA_FLOW_LIBRARY "${_lf_lib}")
if(NOT TARGET LavaFlow::lava_flow)
  add_library(LavaFlow::lava_flow SHARED IMPORTED)
  set_target_properties(LavaFlow::lava_flow PROPERTIES
    IMPORTED_LOCATION "${_lf_lib}"
    IMPORTED_SONAME "${_lf_soname}"
    INTERFACE_INCLUDE_DIRECTORIES "${LAVA_FLOW_INCLUDE_DIR}")
endif()
set(LavaFlow_FOUND TRUE)
