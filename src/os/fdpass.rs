//! Sending file descriptors with a small payload over a Unix stream socket (`SCM_RIGHTS`).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::error::{Error, Result};

/// The most descriptors one message carries; more are a protocol error.
pub(crate) const MAX_FDS: usize = 16;

/// Sends `payload` (non-empty) with `fds` attached, in one `sendmsg`. The descriptors stay
/// open here; the receiver gets its own copies.
pub fn send_with_fds(sock: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    if payload.is_empty() {
        return Err(Error::invalid("an fd message needs at least one payload byte"));
    }
    if fds.len() > MAX_FDS {
        return Err(Error::invalid(format!("{} fds in one message; the limit is {MAX_FDS}", fds.len())));
    }
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; if raw.is_empty() { 0 } else { space }];
    let iov = [IoSlice::new(payload)];
    // SAFETY: msghdr is plain data; zeroed is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() as _;
        // SAFETY: the control buffer is CMSG_SPACE(fd_bytes) long, so the first header and
        // its data (CMSG_LEN(fd_bytes) <= space) fit inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(cmsg), fd_bytes);
        }
    }
    loop {
        // SAFETY: msg points to live buffers (iov, control) for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            if n as usize != payload.len() {
                return Err(Error::Io {
                    context: "sendmsg with fds".into(),
                    source: std::io::Error::new(std::io::ErrorKind::WriteZero, "short write"),
                });
            }
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::os("sendmsg with fds", err));
        }
    }
}

/// Receives one message of at most `buf.len()` bytes and the descriptors attached to it.
/// Returns the payload length (0 means the peer closed the socket) and the descriptors, each
/// owned (closed on drop) so that none leaks whatever the caller does next.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    recv_with_fds_flags(sock, buf, 0)
}

/// As [`recv_with_fds`], without waiting: `None` when nothing is pending.
pub fn try_recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedFd>)>> {
    match recv_with_fds_flags(sock, buf, libc::MSG_DONTWAIT) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        other => other.map(Some),
    }
}

fn recv_with_fds_flags(sock: &UnixStream, buf: &mut [u8], flags: libc::c_int) -> Result<(usize, Vec<OwnedFd>)> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: zeroed msghdr is valid; the pointers set below stay live during recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    let n = loop {
        // SAFETY: msg describes writable buffers that outlive the call. MSG_CMSG_CLOEXEC keeps
        // received fds from leaking into exec'd children.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
        if n >= 0 {
            break n as usize;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::os("recvmsg with fds", err));
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control with well-formed cmsg headers up to
    // msg_controllen; CMSG_FIRSTHDR/NXTHDR stay inside it.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = data_len / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    // Each received fd is new in this process and owned by no one else.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // The fds that did arrive are dropped (closed) with `fds`.
        return Err(Error::Corrupt(format!("peer sent more than {MAX_FDS} file descriptors in one message")));
    }
    Ok((n, fds))
}

/// Receives one message that must be exactly `buf.len()` bytes with exactly one descriptor
/// attached (`what` names it in errors): PeerGone when the socket closed first, Corrupt for any
/// other shape, whose descriptors are closed.
pub fn recv_exact_with_fd(sock: &UnixStream, buf: &mut [u8], what: &str) -> Result<OwnedFd> {
    let (n, mut fds) = recv_with_fds(sock, buf)?;
    if n == 0 {
        return Err(Error::PeerGone(format!("the socket closed before {what} arrived")));
    }
    if n != buf.len() || fds.len() != 1 {
        return Err(Error::Corrupt(format!(
            "expected {what} ({} bytes and 1 fd), got {n} bytes and {} fds",
            buf.len(),
            fds.len()
        )));
    }
    Ok(fds.pop().expect("one fd"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{memfd_create, Mapping, MemfdFlags};
    use std::os::fd::AsFd;

    #[test]
    fn an_fd_travels_and_maps_the_same_memory() {
        let (a, b) = UnixStream::pair().unwrap();
        let fd = memfd_create("lf-pass", 4096, MemfdFlags::default()).unwrap();
        let here = Mapping::shared(&fd, 0, 4096).unwrap();
        send_with_fds(&a, b"hi", &[fd.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"hi"[..], 1));
        let there = Mapping::shared(&fds[0], 0, 4096).unwrap();
        // SAFETY: both mappings are live, 4096 bytes each.
        unsafe {
            here.as_ptr().write(7);
            assert_eq!(there.as_ptr().read(), 7);
        }
    }

    #[test]
    fn closed_peer_reads_as_zero() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (0, 0));
    }
}
