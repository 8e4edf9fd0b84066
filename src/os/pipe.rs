//! Pipes as one-way signals between processes: one side writes a byte to make the other's
//! descriptor readable (for `poll`, `epoll`), the other reads everything waiting to reset it.
//!
//! Why a pipe and not an eventfd: every holder of an eventfd shares one open file description,
//! so a peer can clear its `O_NONBLOCK` and fill its counter, and the next signal's `write`
//! then blocks for good. A pipe's two ends are separate descriptions: the signalling side
//! keeps its write end to itself (non-blocking, whatever the peer does), and the reset reads
//! with `RWF_NOWAIT`, which never blocks whatever flags a peer that kept a copy of the read
//! end sets on it.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{FileType, OFlags};
use rustix::io::{Errno, ReadWriteFlags};
use rustix::pipe::PipeFlags;

use crate::error::{Error, Result};

/// A signal pipe: (read end, write end), both non-blocking and close-on-exec.
pub fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC).map_err(|e| Error::os("pipe2", e.into()))
}

/// Makes the read end readable. A full pipe (EAGAIN) is readable already, so errors are ignored.
pub fn pipe_signal(write_end: BorrowedFd<'_>) {
    let _ = rustix::io::write(write_end, &[1]);
}

/// Reads everything waiting in a read end, so that it is not readable any more. Never blocks,
/// whatever the description's flags, where the kernel honours `RWF_NOWAIT` on pipes (6.18
/// does); a kernel that answers `EOPNOTSUPP` leaves the `O_NONBLOCK` set by [`check_read_end`].
pub fn pipe_drain(read_end: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    loop {
        // u64::MAX: the file's own position (a pipe has none to keep).
        let read =
            match rustix::io::preadv2(read_end, &mut [IoSliceMut::new(&mut buf)], u64::MAX, ReadWriteFlags::NOWAIT) {
                Err(Errno::OPNOTSUPP) => rustix::io::read(read_end, &mut buf),
                other => other,
            };
        match read {
            Ok(n) if n == buf.len() => {}
            Err(Errno::INTR) => {}
            _ => return,
        }
    }
}

/// Checks that `fd`, received from a peer as the read end of its signal pipe, is one (a FIFO
/// opened for reading only), and makes its description non-blocking.
pub fn check_read_end(fd: &OwnedFd, whose: &str) -> Result<()> {
    let stat = rustix::fs::fstat(fd).map_err(|e| Error::os(format!("fstat of {whose}"), e.into()))?;
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| Error::os(format!("fcntl(F_GETFL) of {whose}"), e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Fifo || flags & OFlags::RWMODE != OFlags::RDONLY {
        return Err(Error::Corrupt(format!("{whose} is not the read end of a pipe")));
    }
    rustix::fs::fcntl_setfl(fd.as_fd(), flags | OFlags::NONBLOCK)
        .map_err(|e| Error::os(format!("fcntl(F_SETFL, O_NONBLOCK) of {whose}"), e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::eventfd::{poll, PollFd, PollFlags};
    use std::time::Duration;

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut p, Some(Duration::ZERO)).unwrap() == 1
    }

    #[test]
    fn a_signal_makes_the_read_end_readable_until_drained() {
        let (r, w) = pipe().unwrap();
        check_read_end(&r, "the test's pipe").unwrap();
        assert!(!readable(&r));
        for _ in 0..100 {
            pipe_signal(w.as_fd());
        }
        assert!(readable(&r));
        pipe_drain(r.as_fd());
        assert!(!readable(&r), "a drain reads more than one buffer's worth");
    }

    /// A peer that shares the read end's description can make it blocking: the drain of an
    /// empty pipe still returns.
    #[test]
    fn a_drain_does_not_block_on_a_description_made_blocking() {
        let (r, _w) = pipe().unwrap();
        rustix::fs::fcntl_setfl(&r, OFlags::empty()).unwrap();
        pipe_drain(r.as_fd());
        assert!(!readable(&r));
    }

    #[test]
    fn only_a_read_end_is_accepted() {
        let (r, w) = pipe().unwrap();
        assert!(matches!(check_read_end(&w, "a write end"), Err(Error::Corrupt(_))));
        let efd = crate::os::eventfd::eventfd().unwrap();
        assert!(matches!(check_read_end(&efd, "an eventfd"), Err(Error::Corrupt(_))));
        check_read_end(&r, "a read end").unwrap();
    }
}
