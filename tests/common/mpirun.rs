//! Running a test's ranks under mpirun: what the MPI tests share.

use std::path::Path;
use std::process::Command;

/// Runs `cmd` (an mpirun command line, as root where the machine runs tests as root), then
/// removes the test's scratch directory `scratch`, and checks that every rank (`ranks`, for the
/// message) of test `name` succeeded. Without an mpirun that starts, the test is skipped,
/// unless `LF_REQUIRE_MPI` is set.
pub fn run_ranks(mut cmd: Command, name: &str, ranks: &str, scratch: &Path) {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            assert!(std::env::var_os("LF_REQUIRE_MPI").is_none(), "LF_REQUIRE_MPI is set but mpirun cannot start: {e}");
            eprintln!("skipped: mpirun cannot start ({e})");
            return;
        }
    };
    let _ = std::fs::remove_dir_all(scratch);
    assert!(status.success(), "the {ranks} ranks of {name} under mpirun: {status}");
}
