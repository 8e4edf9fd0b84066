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

/// The mark, in a registration's user data, of one that reports only a hang-up.
const HANG_UP_ONLY: u64 = 1 << 63;

/// A kqueue (close-on-exec), closed on drop.
#[derive(Debug)]
pub struct Poller(OwnedFd);

impl Poller {
    pub fn new() -> Result<Poller> {
        kqueue("a readiness set").map(Poller)
    }

    /// Adds `fd` for `events`, reported with `token` (below 2^63). `what` names the descriptor
    /// in the error.
    pub fn add(&self, fd: BorrowedFd<'_>, events: EventFlags, token: u64, what: &str) -> Result<()> {
        // A hang-up alone: kqueue reports a socket readable for data and for its end alike, so
        // the registration is edge-triggered (a burst of data wakes a waiter once, and drops
        // out in `wait`) and marked, and only the end of stream (EV_EOF) is reported. A
        // one-shot registration is deleted by its owner once reported.
        let hang_up_only = events.contains(EventFlags::RDHUP) && !events.contains(EventFlags::IN);
        let mut flags = libc::EV_ADD;
        if hang_up_only {
            flags |= libc::EV_CLEAR;
        } else if events.contains(EventFlags::ONESHOT) {
            flags |= libc::EV_ONESHOT;
        }
        let udata = if hang_up_only { token | HANG_UP_ONLY } else { token };
        let change = kev(fd.as_raw_fd() as usize, libc::EVFILT_READ, flags, 0, 0, udata);
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
    /// timeout; returns how many of `events` were filled (0 also when only data came on
    /// sockets watched for their end: callers wait again).
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
        let mut filled = 0;
        for got in &raw[..n] {
            let udata = got.udata as usize as u64;
            if udata & HANG_UP_ONLY != 0 && got.flags & libc::EV_EOF == 0 {
                // Data on a socket watched for its end only: no event.
                continue;
            }
            events[filled] = Event { data: EventData(udata & !HANG_UP_ONLY) };
            filled += 1;
        }
        Ok(filled)
    }
}

impl AsFd for Poller {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
