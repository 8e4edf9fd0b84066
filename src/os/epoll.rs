//! An owned epoll instance: the set of descriptors a thread sleeps on when it waits for
//! whichever of them reports first.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::error::{Error, Result};

/// An epoll instance (close-on-exec), closed on drop.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    pub fn new() -> Result<Epoll> {
        // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("epoll_create1"));
        }
        // SAFETY: fresh descriptor owned by no one else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds `fd` for `events` (`EPOLLIN`, `EPOLLRDHUP`, `EPOLLONESHOT`...), reported with
    /// `token`. `what` names the descriptor in the error.
    pub fn add(&self, fd: BorrowedFd<'_>, events: u32, token: u64, what: &str) -> Result<()> {
        if self.ctl(libc::EPOLL_CTL_ADD, fd, events, token) != 0 {
            return Err(Error::last_os(format!("epoll_ctl(ADD) for {what}")));
        }
        Ok(())
    }

    /// Removes `fd`. Removing one that is not in the set does nothing.
    pub fn delete(&self, fd: BorrowedFd<'_>) {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
    }

    fn ctl(&self, op: i32, fd: BorrowedFd<'_>, events: u32, token: u64) -> i32 {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: both descriptors are live; ev is a valid epoll_event the kernel only reads.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) }
    }

    /// Waits up to `timeout` (`None`: forever) for events, retrying on EINTR with the same
    /// timeout; returns how many of `events` were filled.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> Result<usize> {
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let max = events.len().min(i32::MAX as usize) as i32;
        loop {
            // SAFETY: `events` is a live, writable array of at least `max` entries.
            let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, ms) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::os("epoll_wait", err));
            }
        }
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::eventfd::{eventfd, eventfd_signal};

    #[test]
    fn reports_the_token_of_a_ready_descriptor_once_with_oneshot() {
        let epoll = Epoll::new().unwrap();
        let fd = eventfd().unwrap();
        epoll.add(fd.as_fd(), (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, 42, "a test eventfd").unwrap();
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
        assert_eq!(epoll.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        eventfd_signal(fd.as_fd());
        assert_eq!(epoll.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!({ events[0].u64 }, 42);
        // One-shot: still readable, but disabled until re-armed.
        assert_eq!(epoll.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        epoll.delete(fd.as_fd());
        epoll.delete(fd.as_fd());
    }
}
