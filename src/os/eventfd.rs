//! Event file descriptors, pidfds and `poll`: the kernel objects lava-flow waits on when it
//! must not spin.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::EventfdFlags;
pub use rustix::event::{PollFd, PollFlags};

use crate::error::{Error, Result};

/// A new non-blocking, close-on-exec eventfd with counter 0.
pub fn eventfd() -> Result<OwnedFd> {
    rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
        .map_err(|e| Error::os("eventfd", e.into()))
}

/// Adds 1 to an eventfd's counter, making it readable. Errors (EAGAIN at the counter's
/// maximum) leave it readable anyway, so they are ignored.
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets an eventfd's counter to 0 (not readable any more). Non-blocking.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn eventfd_drain(fd: BorrowedFd<'_>) {
    // EAGAIN when already 0 is fine.
    let _ = rustix::io::read(fd, &mut [0u8; 8]);
}

/// A pidfd for `pid`: readable once that process has exited. `None` where the kernel lacks
/// pidfd_open (before 5.3) or the process is already gone. pidfds are close-on-exec.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// `poll(2)` over `fds`, retried on EINTR with the same timeout (`None` waits forever).
/// Returns how many entries have events.
pub fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> Result<usize> {
    let timeout = timeout.map(super::timespec);
    loop {
        match rustix::event::poll(fds, timeout.as_ref()) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::os("poll", e.into())),
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
        let readable = |fd: &OwnedFd| {
            let mut p = [PollFd::new(fd, PollFlags::IN)];
            poll(&mut p, Some(Duration::ZERO)).unwrap()
        };
        assert_eq!(readable(&fd), 0);
        eventfd_signal(fd.as_fd());
        assert_eq!(readable(&fd), 1);
        eventfd_drain(fd.as_fd());
        assert_eq!(readable(&fd), 0);
    }

    #[test]
    fn pidfd_of_self_is_not_readable() {
        let fd = pidfd_open(std::process::id() as i32).expect("pidfd_open on this kernel");
        let mut p = [PollFd::new(&fd, PollFlags::IN)];
        assert_eq!(poll(&mut p, Some(Duration::ZERO)).unwrap(), 0);
    }
}
