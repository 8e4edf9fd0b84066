# Whether liblava_flow is built with MPI (the cargo feature `mpi`: channels to processes on other
# hosts), from LAVA_FLOW_MPI and LAVA_FLOW_FEATURES. Included by the top-level CMakeLists.txt.
#
#   LAVA_FLOW_MPI=AUTO  (default) with MPI where find_package(MPI COMPONENTS C) finds a C MPI
#                       and libclang (which mpi-sys's build needs) is there; without, saying how
#                       to get it, where not. A cluster user who follows the README gets MPI.
#   LAVA_FLOW_MPI=ON    MPI required: configuring fails, naming what to install, without it.
#   LAVA_FLOW_MPI=OFF   never.
#   `mpi` in LAVA_FLOW_FEATURES means ON (and contradicts OFF).
#
# Sets LAVA_FLOW_WITH_MPI (ON or OFF), MPI::MPI_C when ON, and LAVA_FLOW_MPI_CHOICE: how the
# choice was made, in words, which cargo records in lf-info so that it can say why a library
# has MPI or not.

set(LAVA_FLOW_MPI AUTO CACHE STRING
    "Build with MPI, for channels between hosts: AUTO (where CMake finds a C MPI), ON (required) or OFF")
set_property(CACHE LAVA_FLOW_MPI PROPERTY STRINGS AUTO ON OFF)

string(TOUPPER "${LAVA_FLOW_MPI}" _lf_mpi_mode)
if(_lf_mpi_mode MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(_lf_mpi_mode ON)
elseif(_lf_mpi_mode MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(_lf_mpi_mode OFF)
elseif(NOT _lf_mpi_mode STREQUAL "AUTO")
  message(FATAL_ERROR "LAVA_FLOW_MPI is '${LAVA_FLOW_MPI}', which is none of its values: "
                      "pass -DLAVA_FLOW_MPI=AUTO (MPI where it is installed), ON (required) or OFF")
endif()
set(_lf_mpi_reason "LAVA_FLOW_MPI=${_lf_mpi_mode}")
if(LAVA_FLOW_FEATURES MATCHES "(^|[ ,;])mpi($|[ ,;])")
  if(_lf_mpi_mode STREQUAL "OFF")
    message(FATAL_ERROR "LAVA_FLOW_FEATURES names mpi but LAVA_FLOW_MPI is OFF: drop mpi from "
                        "LAVA_FLOW_FEATURES to build without MPI, or pass -DLAVA_FLOW_MPI=ON to build with it")
  endif()
  set(_lf_mpi_mode ON)
  set(_lf_mpi_reason "LAVA_FLOW_FEATURES names mpi")
endif()

# libclang, as clang-sys (bindgen's loader, which mpi-sys's build script runs) looks for it:
# LIBCLANG_PATH, llvm-config's library directory, then the usual system directories.
function(_lf_find_libclang out)
  set(dirs "")
  if(DEFINED ENV{LIBCLANG_PATH})
    list(APPEND dirs "$ENV{LIBCLANG_PATH}")
  endif()
  find_program(LAVA_FLOW_LLVM_CONFIG llvm-config)
  mark_as_advanced(LAVA_FLOW_LLVM_CONFIG)
  if(LAVA_FLOW_LLVM_CONFIG)
    execute_process(COMMAND "${LAVA_FLOW_LLVM_CONFIG}" --libdir OUTPUT_VARIABLE libdir
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      list(APPEND dirs "${libdir}")
    endif()
  endif()
  file(GLOB llvm_dirs /usr/lib/llvm-*/lib /usr/lib64/llvm*/lib /usr/local/llvm*/lib /usr/local/opt/llvm/lib)
  list(APPEND dirs ${llvm_dirs} /usr/lib /usr/lib64 /usr/local/lib /usr/local/lib64)
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND dirs /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  endif()
  foreach(dir IN LISTS dirs)
    file(GLOB found "${dir}/libclang.so" "${dir}/libclang.so.*" "${dir}/libclang-*.so" "${dir}/libclang-*.so.*"
                    "${dir}/libclang.dylib")
    list(FILTER found EXCLUDE REGEX "libclang-cpp")
    if(found)
      list(GET found 0 first)
      set(${out} "${first}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

set(LAVA_FLOW_WITH_MPI OFF)
if(_lf_mpi_mode STREQUAL "OFF")
  set(LAVA_FLOW_MPI_CHOICE "LAVA_FLOW_MPI=OFF, pass -DLAVA_FLOW_MPI=AUTO or ON to build it in")
  message(STATUS "lava-flow MPI: off (LAVA_FLOW_MPI=OFF)")
else()
  # The library's own version string (MPI_Get_library_version) names the implementation.
  set(MPI_DETERMINE_LIBRARY_VERSION TRUE)
  find_package(MPI QUIET COMPONENTS C)
  _lf_find_libclang(_lf_libclang)
  if(MPI_C_FOUND)
    string(REGEX REPLACE "[\n,].*" "" _lf_mpi_name "${MPI_C_LIBRARY_VERSION_STRING}")
    # No semicolons: the choice travels to cargo as one argument of a custom command.
    string(REGEX REPLACE "[ \t;]+" " " _lf_mpi_name "${_lf_mpi_name}")
    string(STRIP "${_lf_mpi_name}" _lf_mpi_name)
    if(NOT _lf_mpi_name)
      set(_lf_mpi_name "MPI ${MPI_C_VERSION}")
    endif()
    if(MPI_C_COMPILER)
      string(APPEND _lf_mpi_name ", ${MPI_C_COMPILER}")
    endif()
  endif()
  if(_lf_mpi_mode STREQUAL "ON")
    if(NOT MPI_C_FOUND)
      message(FATAL_ERROR "${_lf_mpi_reason} requires a C MPI, and CMake found none. Install an MPI's "
                          "development package (Debian/Ubuntu: libopenmpi-dev openmpi-bin; Fedora/RHEL: "
                          "openmpi-devel, then `module load mpi`), load your cluster's MPI module, or name its "
                          "compiler wrapper with -DMPI_C_COMPILER=/path/to/mpicc; or pass -DLAVA_FLOW_MPI=AUTO "
                          "to build without MPI where there is none.")
    endif()
    if(NOT _lf_libclang)
      message(WARNING "lava-flow MPI: no libclang found, which building the MPI binding (mpi-sys, through "
                      "bindgen) needs: install libclang-dev (Debian/Ubuntu) or clang-devel (Fedora/RHEL), "
                      "or set LIBCLANG_PATH to the directory holding libclang.so, if cargo fails on it.")
    endif()
    set(LAVA_FLOW_WITH_MPI ON)
    set(LAVA_FLOW_MPI_CHOICE "${_lf_mpi_reason}: ${_lf_mpi_name}")
  elseif(MPI_C_FOUND AND _lf_libclang)
    set(LAVA_FLOW_WITH_MPI ON)
    set(LAVA_FLOW_MPI_CHOICE "CMake found MPI automatically: ${_lf_mpi_name}")
  elseif(MPI_C_FOUND)
    string(CONCAT LAVA_FLOW_MPI_CHOICE
        "CMake found ${_lf_mpi_name} but no libclang, which building the MPI binding needs: install "
        "libclang-dev (Debian/Ubuntu) or clang-devel (Fedora/RHEL), or set LIBCLANG_PATH, and configure again")
  else()
    string(CONCAT LAVA_FLOW_MPI_CHOICE
        "CMake found no C MPI: install Open MPI's development package (Debian/Ubuntu: libopenmpi-dev "
        "openmpi-bin, Fedora/RHEL: openmpi-devel) or load your cluster's MPI module, and configure again")
  endif()
  if(LAVA_FLOW_WITH_MPI)
    message(STATUS "lava-flow MPI: on, channels between hosts built in (${LAVA_FLOW_MPI_CHOICE})")
  else()
    message(STATUS "lava-flow MPI: off, no channels between hosts (${LAVA_FLOW_MPI_CHOICE}). "
                   "-DLAVA_FLOW_MPI=OFF builds without it and silences this.")
  endif()
endif()
