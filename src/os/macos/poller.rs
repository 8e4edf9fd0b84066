//! The readiness set: a kqueue over descriptors, which a thread sleeps on when it waits for
//! whichever of them reports first; itself readable while one of them is ready. The names
//! match Linux's epoll side (`IN`, `RDHUP`, `ONESHOT`, a token per descriptor).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use super::{kev, kevent_change, kqueue};
use crate::error::{Error, Result};

/// What a descriptor is watched for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventFlags(u8);

impl EventFlags {
    /// Readable (data, or the end of stream).
    pub const IN: EventFlags = EventFlags(1);
    /// A stream socket's peer closed its end. Alone, data waiting is no event.
    pub const RDHUP: EventFlags = EventFlags(2);
    /// Report once, then forget the descriptor.
    pub const ONESHOT: EventFlags = EventFlags(4);

    pub const fn contains(self, other: EventFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for EventFlags {
    type Output = EventFlags;
    fn bitor(self, other: EventFlags) -> EventFlags {
        EventFlags(self.0 | other.0)
    }
}

/// The token a descriptor was added with.
#[derive(Clone, Copy, Debug)]
pub struct EventData(u64);

impl EventData {
    pub fn u64(&self) -> u64 {
        self.0
    }
}

/// One report of [`Poller::wait`]: which descriptor is ready (readable, or at its end).
#[derive(Clone, Copy, Debug)]
pub struct Event {
    pub data: EventData,
}

/// A kqueue (close-on-exec), closed on drop.
#[derive(Debug)]
pub struct Poller(OwnedFd);

impl Poller {
    pub fn new() -> Result<Poller> {
        kqueue("a readiness set").map(Poller)
    }

    /// Adds `fd` for `events`, reported with `token`. `what` names the descriptor in the error.
    pub fn add(&self, fd: BorrowedFd<'_>, events: EventFlags, token: u64, what: &str) -> Result<()> {
        let mut flags = libc::EV_ADD;
        if events.contains(EventFlags::ONESHOT) {
            flags |= libc::EV_ONESHOT;
        }
        // A hang-up alone: a low-water mark no socket buffer reaches, so that only the end of
        // stream (which a socket reports whatever the mark) fires.
        let (fflags, data) = if events.contains(EventFlags::RDHUP) && !events.contains(EventFlags::IN) {
            (libc::NOTE_LOWAT, isize::MAX)
        } else {
            (0, 0)
        };
        let change = kev(fd.as_raw_fd() as usize, libc::EVFILT_READ, flags, fflags, data, token);
        kevent_change(&self.0, &change).map_err(|e| Error::os(format!("kevent(EV_ADD) for {what}"), e))
    }

    /// Removes `fd`. Removing one that is not in the set does nothing.
    pub fn delete(&self, fd: BorrowedFd<'_>) {
        let _ = kevent_change(&self.0, &kev(fd.as_raw_fd() as usize, libc::EVFILT_READ, libc::EV_DELETE, 0, 0, 0));
    }

    /// A buffer of `N` events for [`wait`](Self::wait).
    pub fn events<const N: usize>() -> [Event; N] {
        [Event { data: EventData(0) }; N]
    }

    /// Waits up to `timeout` (`None`: forever) for events, retrying on EINTR with the same
    /// timeout; returns how many of `events` were filled.
    pub fn wait(&self, events: &mut [Event], timeout: Option<Duration>) -> Result<usize> {
        const MAX: usize = 64;
        let mut raw = [kev(0, 0, 0, 0, 0, 0); MAX];
        let room = events.len().min(MAX);
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        let n = loop {
            // SAFETY: no changes; `raw` has room for `room` events; the timeout is a live
            // local or NULL.
            let rc = unsafe {
                libc::kevent(self.0.as_raw_fd(), std::ptr::null(), 0, raw.as_mut_ptr(), room as libc::c_int, ts_ptr)
            };
            if rc >= 0 {
                break rc as usize;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::os("kevent (waiting)", err));
            }
        };
        for (out, got) in events.iter_mut().zip(&raw[..n]) {
            *out = Event { data: EventData(got.udata as usize as u64) };
        }
        Ok(n)
    }
}

impl AsFd for Poller {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
