//! The user this process runs as, for the same-user checks of peers and runtime dirs.

/// This process's real user id.
pub fn id() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}
