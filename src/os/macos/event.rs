//! Events within this process: a kqueue holding one `EVFILT_USER` event, which a thread
//! triggers and an event loop waits on (a kqueue is readable while an event is pending). One
//! descriptor, as Linux's eventfd, so the callers keep one handle.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{kev, kevent_change, kqueue};
use crate::error::{Error, Result};

/// The identifier of the one user event of each such kqueue.
const IDENT: usize = 1;

/// A new event, not signalled, close-on-exec.
pub fn new() -> Result<OwnedFd> {
    let kq = kqueue("an event")?;
    kevent_change(&kq, &kev(IDENT, libc::EVFILT_USER, libc::EV_ADD | libc::EV_CLEAR, 0, 0, 0))
        .map_err(|e| Error::os("kevent(EVFILT_USER, EV_ADD)", e))?;
    Ok(kq)
}

/// Signals the event, making it readable; signalling a signalled event changes nothing.
pub fn signal(fd: BorrowedFd<'_>) {
    let _ = kevent_change(&fd, &kev(IDENT, libc::EVFILT_USER, 0, libc::NOTE_TRIGGER, 0, 0));
}

/// Resets the event (not readable any more). Never waits.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn drain(fd: BorrowedFd<'_>) {
    let mut out = kev(0, 0, 0, 0, 0, 0);
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: no changes, room for one event in a live local, a zero timeout. Receiving the
    // EV_CLEAR event resets it.
    unsafe { libc::kevent(fd.as_raw_fd(), std::ptr::null(), 0, &mut out, 1, &zero) };
}
