//! Layer 2 integration tests: channels between real processes.
//!
//! Every test is an orchestrator: it re-executes this test binary (`current_exe()`) as child
//! processes, with `LF_TEST_CHILD=<role>` and `--exact <test>`, so that the same test function
//! runs the child's part. Each test gets its own runtime dir (`LF_RUNTIME_DIR`), which it
//! checks is empty at the end.

mod common;

mod backpressure;
mod blocked;
mod buffers;
mod delivery;
mod gpu;
mod hostile;
mod leaks;
mod peer_death;
mod rendezvous;
