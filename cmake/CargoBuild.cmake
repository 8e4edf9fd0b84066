# Runs cargo for the lava_flow library, the package lava-flow-c in crates/c-api/artifact (invoked by the top-level CMakeLists.txt at build time
# with -DCARGO=... -DSOURCE_DIR=... -DTARGET_DIR=... -DPROFILE=... -DFEATURES=...
# -DNATIVE_LIBS_FILE=... -DSONAME=... -DMPI_CHOICE=... and, to build the lf-info tool too,
# -DTOOLS=ON).
#
# Next to the shared library it links SONAME (the name programs linked against it look for)
# to it, so that in-tree programs find it at run time.
#
# With TOOLS, lf-info (crates/tools) is built with the same features, so that it reuses the
# core cargo just built.
#
# It also checks that the system libraries Rust says the static library needs
# (`--print native-static-libs`) are all listed in cmake/LavaFlowNativeLibs.cmake, which
# is what LavaFlow::lava_flow_static puts in its link interface. rustc prints the list only
# when it links, so the last list seen is kept in TARGET_DIR/native-static-libs.txt.
cmake_minimum_required(VERSION 3.22)
# How LAVA_FLOW_MPI decided (cmake/LavaFlowMpi.cmake), for lf-info to report: it reads it at
# compile time (option_env!), and cargo rebuilds it when it changes.
set(ENV{LAVA_FLOW_MPI_CHOICE} "${MPI_CHOICE}")
set(features_arg "")
if(FEATURES)
  set(features_arg --features "${FEATURES}")
endif()
execute_process(
  COMMAND "${CARGO}" rustc -p lava-flow-c --lib --profile "${PROFILE}" ${features_arg}
          --manifest-path "${SOURCE_DIR}/Cargo.toml" --target-dir "${TARGET_DIR}"
          -- --print=native-static-libs
  RESULT_VARIABLE rc
  ERROR_VARIABLE log
  OUTPUT_VARIABLE out)
message("${out}${log}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cargo failed to build lava_flow (exit ${rc}); the errors are above")
endif()
if(TOOLS)
  execute_process(
    COMMAND "${CARGO}" build -p lava-flow-tools --bin lf-info --profile "${PROFILE}" ${features_arg}
            --manifest-path "${SOURCE_DIR}/Cargo.toml" --target-dir "${TARGET_DIR}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cargo failed to build lf-info (exit ${rc}); the errors are above")
  endif()
endif()

if(SONAME)
  string(TOLOWER "${PROFILE}" profile_dir)
  if(profile_dir STREQUAL "dev")
    set(profile_dir debug)
  endif()
  file(CREATE_LINK liblava_flow.so "${TARGET_DIR}/${profile_dir}/${SONAME}" SYMBOLIC)
endif()

set(stamp "${TARGET_DIR}/native-static-libs.txt")
string(REGEX MATCH "native-static-libs: ([^\n]*)" found "${log}")
if(found)
  file(WRITE "${stamp}" "${CMAKE_MATCH_1}")
endif()
if(EXISTS "${stamp}")
  file(READ "${stamp}" printed)
  include("${NATIVE_LIBS_FILE}")
  string(REGEX REPLACE "-l([^ ]+)" "\\1" needed "${printed}")
  separate_arguments(needed)
  set(missing "")
  foreach(lib IN LISTS needed)
    if(NOT lib IN_LIST LAVA_FLOW_NATIVE_STATIC_LIBS AND NOT lib IN_LIST LAVA_FLOW_NATIVE_STATIC_LIBS_OPTIONAL
       AND NOT (FEATURES MATCHES "(^|[ ,;])mpi($|[ ,;])" AND lib IN_LIST LAVA_FLOW_NATIVE_STATIC_LIBS_MPI))
      list(APPEND missing ${lib})
    endif()
  endforeach()
  if(missing)
    message(FATAL_ERROR "liblava_flow.a needs system libraries that cmake/LavaFlowNativeLibs.cmake "
                        "does not list: ${missing}. Add them there.")
  endif()
endif()
