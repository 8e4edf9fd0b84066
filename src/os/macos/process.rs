//! A peer process's handle: a kqueue watching the process for its exit (`EVFILT_PROC`,
//! `NOTE_EXIT`), readable once it has exited, like Linux's pidfd.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use super::{kev, kevent_change, kqueue};

/// A handle of another process that becomes readable when it exits, for `poll`, a readiness
/// set or the watcher.
#[derive(Debug)]
pub struct PeerProcess(OwnedFd);

impl PeerProcess {
    /// A kqueue watching `pid`'s exit. `None` for pid 0 (unknown), or where the process is
    /// already gone or may not be watched.
    pub fn open(pid: i32) -> Option<PeerProcess> {
        if pid <= 0 {
            return None;
        }
        let kq = kqueue("a peer process").ok()?;
        kevent_change(&kq, &kev(pid as usize, libc::EVFILT_PROC, libc::EV_ADD, libc::NOTE_EXIT, 0, 0)).ok()?;
        Some(PeerProcess(kq))
    }

    /// Whether the process has exited, without waiting.
    pub fn has_exited(&self) -> bool {
        self.wait_for_exit(Duration::ZERO)
    }

    /// Waits up to `timeout` for the process to exit; returns whether it has.
    pub fn wait_for_exit(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        let timeout = crate::os::timespec(timeout);
        loop {
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Err(rustix::io::Errno::INTR) => {}
                other => return matches!(other, Ok(n) if n > 0),
            }
        }
    }
}

impl AsFd for PeerProcess {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
