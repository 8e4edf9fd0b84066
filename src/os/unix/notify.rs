//! Notifications between processes over a Unix socket pair: one side writes a byte to make
//! the other's end readable (for `poll`, `epoll`), the other reads everything waiting to reset
//! it.
//!
//! Why a socket pair and not an eventfd or a pipe: every holder of an eventfd shares one open
//! file description, so a peer can clear its `O_NONBLOCK` and fill its counter, and the next
//! `write` then blocks for good; a pipe's write raises `SIGPIPE` (which kills a C program) once
//! the reader has gone. A socket pair's ends are separate descriptions, each call says for
//! itself that it must not wait (`MSG_DONTWAIT`) whatever flags a peer sets, and a send to a
//! closed end returns `EPIPE` without a signal (`MSG_NOSIGNAL`).

use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::FileType;
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};

use crate::error::{Error, Result};

/// A notification pair: (the end that is waited on, the end that notifies), both close-on-exec.
pub fn notify_pair() -> Result<(OwnedFd, OwnedFd)> {
    crate::os::platform::socket_pair().map_err(|e| Error::os("socketpair for a notification", e.into()))
}

/// Makes the other end readable. Never waits, never raises `SIGPIPE`; a full socket is
/// readable already and a closed one has nobody to tell, so errors are ignored.
pub fn notify(end: BorrowedFd<'_>) {
    let _ = rustix::net::send(end, &[1], SendFlags::DONTWAIT | crate::os::platform::SEND_NO_SIGNAL);
}

/// Reads everything waiting at `end`, so that it is not readable any more (unless the other
/// end has closed: then it stays readable, which tells an event loop to look). Never waits,
/// whatever flags a peer sets on the end's description.
pub fn drain(end: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    loop {
        match rustix::net::recv(end, &mut buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) if n == buf.len() => {}
            Err(Errno::INTR) => {}
            _ => return,
        }
    }
}

/// [`drain`]s the end of a pair whose other end a peer holds, and returns whether the peer
/// has closed it: its process may have died (then the end stays readable for good). Reads
/// until nothing is left, so that a close right behind the last byte is seen too: one call
/// more than `drain` when a byte waited.
pub fn drain_peer(end: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match rustix::net::recv(end, &mut buf, RecvFlags::DONTWAIT) {
            Ok((0, _)) => return true,
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return false,
        }
    }
}

/// Checks that `fd`, received from a peer as its notification end, is a socket (what else a
/// peer could pass might block a read).
pub fn check_end(fd: &OwnedFd, whose: &str) -> Result<()> {
    let stat = rustix::fs::fstat(fd).map_err(|e| Error::os(format!("fstat of {whose}"), e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err(Error::Corrupt(format!("{whose} is not a socket")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::unix::poll::{poll, PollFd, PollFlags};
    use std::os::fd::AsFd;
    use std::time::Duration;

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut p, Some(Duration::ZERO)).unwrap() == 1
    }

    #[test]
    fn a_notification_makes_the_end_readable_until_drained() {
        let (waited, notifier) = notify_pair().unwrap();
        check_end(&waited, "the test's end").unwrap();
        assert!(!readable(&waited));
        for _ in 0..100 {
            notify(notifier.as_fd());
        }
        assert!(readable(&waited));
        drain(waited.as_fd());
        assert!(!readable(&waited), "a drain reads more than one buffer's worth");
    }

    /// A peer that shares the end's description can make it blocking: the drain of an empty
    /// end still returns, and so does a notification to an end that is full.
    #[test]
    fn nothing_waits_on_a_description_made_blocking() {
        let (waited, notifier) = notify_pair().unwrap();
        rustix::fs::fcntl_setfl(&waited, rustix::fs::OFlags::empty()).unwrap();
        rustix::fs::fcntl_setfl(&notifier, rustix::fs::OFlags::empty()).unwrap();
        drain(waited.as_fd());
        for _ in 0..1_000_000 {
            notify(notifier.as_fd());
        }
        assert!(readable(&waited));
    }

    /// The end of a pair whose other end closed stays readable: `drain_peer` says so, also
    /// when the close came right behind a notification, and `drain_peer` of a live pair does
    /// not.
    #[test]
    fn drain_peer_tells_a_closed_other_end() {
        let (waited, notifier) = notify_pair().unwrap();
        notify(notifier.as_fd());
        assert!(!drain_peer(waited.as_fd()));
        assert!(!readable(&waited));
        notify(notifier.as_fd());
        drop(notifier);
        assert!(drain_peer(waited.as_fd()), "a close behind a notification went unseen");
        assert!(readable(&waited));
        assert!(drain_peer(waited.as_fd()));
    }

    #[test]
    fn only_a_socket_is_accepted() {
        let efd = crate::os::event::new().unwrap();
        assert!(matches!(check_end(&efd, "an event"), Err(Error::Corrupt(_))));
    }
}
