//! The readiness set: an owned epoll instance, the set of descriptors a thread sleeps on when
//! it waits for whichever of them reports first; itself readable while one of them is ready.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::epoll::{self, CreateFlags, EventData};
pub use rustix::event::epoll::{Event, EventFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// An epoll instance (close-on-exec), closed on drop.
#[derive(Debug)]
pub struct Poller(OwnedFd);

impl Poller {
    pub fn new() -> Result<Poller> {
        epoll::create(CreateFlags::CLOEXEC).map(Poller).map_err(|e| Error::os("epoll_create1", e.into()))
    }

    /// Adds `fd` for `events` (`IN`, `RDHUP`, `ONESHOT`...), reported with `token`. `what`
    /// names the descriptor in the error.
    pub fn add(&self, fd: BorrowedFd<'_>, events: EventFlags, token: u64, what: &str) -> Result<()> {
        epoll::add(&self.0, fd, EventData::new_u64(token), events)
            .map_err(|e| Error::os(format!("epoll_ctl(ADD) for {what}"), e.into()))
    }

    /// Removes `fd`. Removing one that is not in the set does nothing.
    pub fn delete(&self, fd: BorrowedFd<'_>) {
        let _ = epoll::delete(&self.0, fd);
    }

    /// A buffer of `N` events for [`wait`](Self::wait).
    pub fn events<const N: usize>() -> [Event; N] {
        [Event { flags: EventFlags::empty(), data: EventData::new_u64(0) }; N]
    }

    /// Waits up to `timeout` (`None`: forever) for events, retrying on EINTR with the same
    /// timeout; returns how many of `events` were filled.
    pub fn wait(&self, events: &mut [Event], timeout: Option<Duration>) -> Result<usize> {
        let timeout = timeout.map(crate::os::timespec);
        loop {
            match epoll::wait(&self.0, &mut *events, timeout.as_ref()) {
                Ok(n) => return Ok(n),
                Err(Errno::INTR) => {}
                Err(e) => return Err(Error::os("epoll_wait", e.into())),
            }
        }
    }
}

impl AsFd for Poller {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::event;

    #[test]
    fn reports_the_token_of_a_ready_descriptor_once_with_oneshot() {
        let epoll = Poller::new().unwrap();
        let fd = event::new().unwrap();
        epoll.add(fd.as_fd(), EventFlags::IN | EventFlags::ONESHOT, 42, "a test event").unwrap();
        let mut events = Poller::events::<4>();
        assert_eq!(epoll.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        event::signal(fd.as_fd());
        assert_eq!(epoll.wait(&mut events, Some(Duration::from_secs(5))).unwrap(), 1);
        assert_eq!(events[0].data.u64(), 42);
        // One-shot: still readable, but disabled until re-armed.
        assert_eq!(epoll.wait(&mut events, Some(Duration::ZERO)).unwrap(), 0);
        epoll.delete(fd.as_fd());
        epoll.delete(fd.as_fd());
    }
}
