//! A peer process's handle: a pidfd, readable once the process has exited.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

/// A handle of another process that becomes readable when it exits, for `poll`, a readiness
/// set or the watcher.
#[derive(Debug)]
pub struct PeerProcess(OwnedFd);

impl PeerProcess {
    /// A pidfd for `pid`. `None` where the kernel lacks pidfd_open (before 5.3) or the
    /// process is already gone. pidfds are close-on-exec.
    pub fn open(pid: i32) -> Option<PeerProcess> {
        let pid = rustix::process::Pid::from_raw(pid)?;
        rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok().map(PeerProcess)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_has_not_exited() {
        let me = PeerProcess::open(std::process::id() as i32).expect("pidfd_open on this kernel");
        assert!(!me.has_exited());
        assert!(PeerProcess::open(0).is_none());
    }
}
