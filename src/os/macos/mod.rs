//! macOS's side of the platform layer: `shm_open` objects, `os_sync_wait_on_address` (or a
//! bounded sleep), kqueue (events, readiness sets, process exits), `LOCAL_PEERPID` and
//! `getpeereid`, and the system facts from `sysctl` and `getentropy`.

pub mod event;
pub mod membarrier;
pub mod poller;
pub mod process;
pub mod shm;
pub mod system;
pub mod wait;

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// `poll`'s flag for a stream socket whose peer closed its end: macOS has no `POLLRDHUP`; the
/// end of stream shows as readable (and `POLLHUP`), which the callers already look at.
pub const POLL_HANG_UP: rustix::event::PollFlags = rustix::event::PollFlags::empty();

/// macOS has no `MSG_NOSIGNAL` in rustix's flags: [`quiet_socket`] sets `SO_NOSIGPIPE` on each
/// socket instead.
pub const SEND_NO_SIGNAL: rustix::net::SendFlags = rustix::net::SendFlags::empty();

/// macOS has no `MSG_CMSG_CLOEXEC`: [`received`] sets close-on-exec on each descriptor.
pub const RECV_CLOEXEC: rustix::net::RecvFlags = rustix::net::RecvFlags::empty();

/// Makes received descriptors close-on-exec (a fork+exec in another thread between the receive
/// and this may still inherit them: macOS offers no atomic way).
pub fn received(fds: &[OwnedFd]) {
    for fd in fds {
        let _ = set_cloexec(fd);
    }
}

/// Makes a socket's sends never raise `SIGPIPE` (`SO_NOSIGPIPE`).
pub fn quiet_socket(sock: &impl AsFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from a live local; the descriptor is the caller's.
    unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NOSIGPIPE,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// A connected pair of Unix stream sockets, non-blocking, close-on-exec and quiet.
pub fn socket_pair() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::empty(), None)?;
    for end in [&a, &b] {
        set_cloexec(end)?;
        let flags = rustix::fs::fcntl_getfl(end)?;
        rustix::fs::fcntl_setfl(end, flags | rustix::fs::OFlags::NONBLOCK)?;
        quiet_socket(end);
    }
    Ok((a, b))
}

fn set_cloexec(fd: &impl AsFd) -> rustix::io::Result<()> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)
}

/// The pid (`LOCAL_PEERPID`) and effective user id (`getpeereid`) of the process on the other
/// end of a Unix stream socket, as recorded at connect time.
pub fn peer_pid_uid(sock: &impl AsFd) -> Result<(i32, u32)> {
    let raw = sock.as_fd().as_raw_fd();
    let mut pid: libc::pid_t = 0;
    let mut len = std::mem::size_of::<libc::pid_t>() as libc::socklen_t;
    // SAFETY: pid and len are live and sized for LOCAL_PEERPID's pid_t.
    let rc = unsafe {
        libc::getsockopt(raw, libc::SOL_LOCAL, libc::LOCAL_PEERPID, (&mut pid as *mut libc::pid_t).cast(), &mut len)
    };
    if rc != 0 {
        return Err(Error::last_os("getsockopt(LOCAL_PEERPID)"));
    }
    let (mut uid, mut gid): (libc::uid_t, libc::gid_t) = (0, 0);
    // SAFETY: two live out-locals.
    if unsafe { libc::getpeereid(raw, &mut uid, &mut gid) } != 0 {
        return Err(Error::last_os("getpeereid"));
    }
    Ok((pid, uid))
}

/// macOS has no advice that faults a range in.
pub fn populate_advice(_write: bool) -> Option<rustix::mm::Advice> {
    None
}

/// A new kqueue, close-on-exec (kqueues are not inherited by a child of fork anyway).
fn kqueue(what: &str) -> Result<OwnedFd> {
    // SAFETY: kqueue has no preconditions.
    let raw = unsafe { libc::kqueue() };
    if raw < 0 {
        return Err(Error::last_os(format!("kqueue for {what}")));
    }
    // SAFETY: a descriptor kqueue just returned, owned by nothing else.
    let kq = unsafe { OwnedFd::from_raw_fd(raw) };
    set_cloexec(&kq).map_err(|e| Error::os(format!("FD_CLOEXEC on the kqueue for {what}"), e.into()))?;
    Ok(kq)
}

/// Applies one change to a kqueue, receiving no events.
fn kevent_change(kq: &impl AsFd, change: &libc::kevent) -> std::io::Result<()> {
    loop {
        // SAFETY: one change from a live reference, no event list.
        let rc = unsafe { libc::kevent(kq.as_fd().as_raw_fd(), change, 1, std::ptr::null_mut(), 0, std::ptr::null()) };
        if rc >= 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// A `kevent` record: `ident` under `filter`, with `flags`, `fflags`, `data` and `udata`.
fn kev(ident: usize, filter: i16, flags: u16, fflags: u32, data: isize, udata: u64) -> libc::kevent {
    libc::kevent { ident, filter, flags, fflags, data, udata: udata as usize as *mut libc::c_void }
}
