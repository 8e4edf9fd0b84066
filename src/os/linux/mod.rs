//! Linux's side of the platform layer: memfd and seals, futexes, eventfds, pidfds, epoll,
//! `membarrier`, `SO_PEERCRED`, and the system facts (`sysinfo`, `getcpu`, `mbind`).

pub mod event;
pub mod membarrier;
pub mod poller;
pub mod process;
pub mod shm;
pub mod system;
pub mod wait;

use std::os::fd::{AsFd, AsRawFd};

use crate::error::{Error, Result};

/// `poll`'s flag for a stream socket whose peer closed its end (`POLLRDHUP`).
pub const POLL_HANG_UP: rustix::event::PollFlags = rustix::event::PollFlags::RDHUP;

/// The pid and user id of the process on the other end of a Unix stream socket, as the kernel
/// recorded them at connect time (`SO_PEERCRED`).
pub fn peer_pid_uid(sock: &impl AsFd) -> Result<(i32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are live and sized for SO_PEERCRED's ucred.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Error::last_os("getsockopt(SO_PEERCRED)"));
    }
    Ok((cred.pid, cred.uid))
}

/// Advice that faults a range in now (Linux 5.14): for writing, or only for reading.
pub fn populate_advice(write: bool) -> Option<rustix::mm::Advice> {
    Some(if write { rustix::mm::Advice::LinuxPopulateWrite } else { rustix::mm::Advice::LinuxPopulateRead })
}

/// What every send on a socket adds so that a peer's close never raises `SIGPIPE`.
pub const SEND_NO_SIGNAL: rustix::net::SendFlags = rustix::net::SendFlags::NOSIGNAL;

/// What every receive of descriptors adds so that they arrive close-on-exec.
pub const RECV_CLOEXEC: rustix::net::RecvFlags = rustix::net::RecvFlags::CMSG_CLOEXEC;

/// Makes received descriptors close-on-exec where [`RECV_CLOEXEC`] could not: nothing to do.
#[inline(always)]
pub fn received(_fds: &[std::os::fd::OwnedFd]) {}

/// Makes a socket's sends never raise `SIGPIPE`: [`SEND_NO_SIGNAL`] does it per send here.
#[inline(always)]
pub fn quiet_socket(_sock: &impl AsFd) {}

/// A connected pair of Unix stream sockets, non-blocking and close-on-exec.
pub fn socket_pair() -> rustix::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, flags, None)
}
