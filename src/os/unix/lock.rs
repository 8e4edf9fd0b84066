//! Lock files: an exclusive lock on an open file (`flock`), released by the OS when its holder
//! closes the file or dies.

use std::os::fd::{AsFd, AsRawFd};

/// Takes the exclusive lock of the open file `file` without waiting: `Ok(false)` when another
/// open file description holds it.
pub fn try_lock(file: &impl AsFd) -> std::io::Result<bool> {
    // SAFETY: flock on a live descriptor the caller holds, with integer flags.
    if unsafe { libc::flock(file.as_fd().as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_description_is_refused_until_the_first_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = std::fs::File::create(&path).unwrap();
        let second = std::fs::File::open(&path).unwrap();
        assert!(try_lock(&first).unwrap());
        assert!(!try_lock(&second).unwrap());
        drop(first);
        assert!(try_lock(&second).unwrap());
    }
}
