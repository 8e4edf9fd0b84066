//! Events within this process: an eventfd, which a thread signals and an event loop waits on
//! (readable while signalled).

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;

use crate::error::{Error, Result};

/// A new non-blocking, close-on-exec eventfd with counter 0.
pub fn new() -> Result<OwnedFd> {
    rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
        .map_err(|e| Error::os("eventfd", e.into()))
}

/// Adds 1 to an eventfd's counter, making it readable. Errors (EAGAIN at the counter's
/// maximum) leave it readable anyway, so they are ignored.
pub fn signal(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets an eventfd's counter to 0 (not readable any more). Non-blocking.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn drain(fd: BorrowedFd<'_>) {
    // EAGAIN when already 0 is fine.
    let _ = rustix::io::read(fd, &mut [0u8; 8]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::unix::poll::{poll, PollFd, PollFlags};
    use std::os::fd::AsFd;
    use std::time::Duration;

    #[test]
    fn an_event_becomes_readable_and_drains() {
        let fd = new().unwrap();
        let readable = |fd: &OwnedFd| {
            let mut p = [PollFd::new(fd, PollFlags::IN)];
            poll(&mut p, Some(Duration::ZERO)).unwrap()
        };
        assert_eq!(readable(&fd), 0);
        signal(fd.as_fd());
        assert_eq!(readable(&fd), 1);
        drain(fd.as_fd());
        assert_eq!(readable(&fd), 0);
    }
}
