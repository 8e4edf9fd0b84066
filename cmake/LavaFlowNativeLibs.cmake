# System libraries that liblava_flow.a needs, as `rustc --print native-static-libs` reports
# them (cmake/CargoBuild.cmake fails the build when Rust needs one that is not listed).
# LavaFlow::lava_flow_static puts these in its link interface; lava_flow.pc lists them in
# Libs.private.
set(LAVA_FLOW_NATIVE_STATIC_LIBS util rt pthread m dl)
# Linked by every C compiler driver anyway; accepted but not listed.
set(LAVA_FLOW_NATIVE_STATIC_LIBS_OPTIONAL c gcc_s)
# Needed with the mpi feature only; linked through MPI::MPI_C (find_package(MPI)), which also
# knows where the MPI library is.
set(LAVA_FLOW_NATIVE_STATIC_LIBS_MPI mpi)
