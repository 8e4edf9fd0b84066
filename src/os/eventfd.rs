//! Event file descriptors, pidfds and `poll`: the kernel objects lava-flow waits on when it
//! must not spin.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::error::{Error, Result};

/// A new non-blocking, close-on-exec eventfd with counter 0.
pub fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd takes plain integers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("eventfd"));
    }
    // SAFETY: fresh descriptor owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd's counter, making it readable. Errors (EAGAIN at the counter's
/// maximum) leave it readable anyway, so they are ignored.
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter to 0 (not readable any more). Non-blocking.
pub fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut value: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64; EAGAIN when already 0 is fine.
    unsafe { libc::read(fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
}

/// A pidfd for `pid`: readable once that process has exited. `None` where the kernel lacks
/// pidfd_open (before 5.3) or the process is already gone.
pub fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes plain integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fresh descriptor owned by no one else. pidfds are close-on-exec by default.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `poll(2)` over `fds`, retried on EINTR with the same timeout (`None` waits forever).
/// Returns how many entries have events.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(t) => t.as_millis().min(i32::MAX as u128) as i32,
    };
    loop {
        // SAFETY: fds is a live, writable slice of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::os("poll", err));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn eventfd_becomes_readable_and_drains() {
        let fd = eventfd().unwrap();
        let mut p = [libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        assert_eq!(poll(&mut p, Some(Duration::ZERO)).unwrap(), 0);
        eventfd_signal(fd.as_fd());
        assert_eq!(poll(&mut p, Some(Duration::ZERO)).unwrap(), 1);
        eventfd_drain(fd.as_fd());
        assert_eq!(poll(&mut p, Some(Duration::ZERO)).unwrap(), 0);
    }

    #[test]
    fn pidfd_of_self_is_not_readable() {
        // SAFETY: getpid has no preconditions.
        let fd = pidfd_open(unsafe { libc::getpid() }).expect("pidfd_open on this kernel");
        let mut p = [libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        assert_eq!(poll(&mut p, Some(Duration::ZERO)).unwrap(), 0);
    }
}
