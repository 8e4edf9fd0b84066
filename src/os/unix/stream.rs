//! The stream: a connected Unix stream socket to one peer, carrying a small payload with file
//! descriptors attached (`SCM_RIGHTS`), and who the peer is.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

use crate::error::{Error, Result};

/// A connected byte stream to one peer; end of stream when the peer closes it or dies.
pub type Stream = std::os::unix::net::UnixStream;

/// Where peers connect to this process: a Unix stream socket bound at a path, closed to other
/// users (mode 0600), non-blocking; readable while a connection waits.
#[derive(Debug)]
pub struct Listener(std::os::unix::net::UnixListener);

impl Listener {
    /// Binds a listening socket at `path`, which must not exist.
    pub fn bind(path: &std::path::Path) -> Result<Listener> {
        use std::os::unix::fs::PermissionsExt;
        let listener = std::os::unix::net::UnixListener::bind(path)
            .map_err(|e| Error::os(format!("bind {}", path.display()), e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::os(format!("chmod 0600 {}", path.display()), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::os("making the listening socket non-blocking", e))?;
        Ok(Listener(listener))
    }

    /// Accepts one waiting connection, as a blocking stream, without waiting for one: `None`
    /// when none waits. The OS's error as it came otherwise.
    pub fn try_accept(&self) -> std::io::Result<Option<Stream>> {
        loop {
            match self.0.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false)?;
                    return Ok(Some(sock));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Accepts one connection, waiting for it at most `timeout` (`None`: no limit; zero: only
    /// one already waiting): `None` when none came in time.
    pub fn accept_within(&self, timeout: Option<std::time::Duration>) -> std::io::Result<Option<Stream>> {
        if let Some(sock) = self.try_accept()? {
            return Ok(Some(sock));
        }
        if timeout == Some(std::time::Duration::ZERO) {
            return Ok(None);
        }
        let mut fds = [super::poll::PollFd::new(&self.0, super::poll::PollFlags::IN)];
        super::poll::poll(&mut fds, timeout).map_err(|e| std::io::Error::other(e.to_string()))?;
        self.try_accept()
    }
}

impl std::os::fd::AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Connects to the listener at `path`; the OS's error as it came (`NotFound` or
/// `ConnectionRefused` while no one listens there).
pub fn connect(path: &std::path::Path) -> std::io::Result<Stream> {
    Stream::connect(path)
}

/// Sends all of `bytes` as plain data, never raising `SIGPIPE` when the peer has gone (an
/// error, `EPIPE`, instead: a C host process that keeps the default signal action would die).
pub fn send_all(sock: &Stream, bytes: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        match rustix::net::send(sock, &bytes[sent..], SEND_NO_SIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Fills `buf` from the stream (`Read::read_exact`): an error of kind `UnexpectedEof` when
/// the stream ends first, `WouldBlock` past the read timeout.
pub fn recv_exact(sock: &Stream, buf: &mut [u8]) -> std::io::Result<()> {
    std::io::Read::read_exact(&mut &*sock, buf)
}

/// Whether the peer on `sock` has gone: its process (`process`, where there is a handle of
/// it) has exited, or it closed its end. One `poll` without waiting; a read end with data
/// waiting is peeked to tell end-of-file from data.
pub fn peer_gone(sock: &Stream, process: Option<&crate::os::process::PeerProcess>) -> bool {
    use super::poll::{poll, PollFd, PollFlags, HANG_UP};
    let sock_fd = PollFd::new(sock, PollFlags::IN | HANG_UP);
    let (mut both, mut one);
    let fds: &mut [PollFd<'_>] = match process {
        Some(process) => {
            both = [sock_fd, PollFd::new(process, PollFlags::IN)];
            &mut both
        }
        None => {
            one = [sock_fd];
            &mut one
        }
    };
    let Ok(n) = poll(fds, Some(std::time::Duration::ZERO)) else {
        return true;
    };
    if n == 0 {
        return false;
    }
    let hung_up = PollFlags::HUP | HANG_UP | PollFlags::ERR | PollFlags::NVAL;
    if fds.get(1).is_some_and(|process| !process.revents().is_empty()) || fds[0].revents().intersects(hung_up) {
        true
    } else if fds[0].revents().contains(PollFlags::IN) {
        // Readable without a hang-up: control records (arena fds) may be waiting after the
        // handshake, so peek to tell end-of-file from data.
        let peeked = rustix::net::recv(sock, &mut [0u8; 1], RecvFlags::PEEK | RecvFlags::DONTWAIT);
        matches!(peeked, Ok((0, _)))
    } else {
        false
    }
}

/// What a plain send on a [`Stream`] adds so that a closed peer never raises `SIGPIPE` (Linux
/// `MSG_NOSIGNAL`; macOS sets `SO_NOSIGPIPE` on the socket instead, in [`peer`]).
pub use crate::os::platform::SEND_NO_SIGNAL;

/// Who is on the other end of a [`Stream`], as the kernel recorded it at connect time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Its process id (0 where the kernel cannot name it here, e.g. another PID namespace).
    pub pid: i32,
    /// Whether it runs as this process's user.
    pub same_user: bool,
    /// The user it runs as (its effective uid), for messages.
    pub uid: u32,
}

/// Who is on the other end of `sock` (Linux `SO_PEERCRED`; macOS `LOCAL_PEERPID` and
/// `getpeereid`).
pub fn peer(sock: &Stream) -> Result<PeerIdentity> {
    // Every stream of a rendezvous passes here, at either end: where sends cannot say for
    // themselves that they must not raise SIGPIPE, the socket is told so once, now.
    crate::os::platform::quiet_socket(sock);
    let (pid, uid) = crate::os::platform::peer_pid_uid(sock)?;
    Ok(PeerIdentity { pid, same_user: uid == super::user::id(), uid })
}

/// The most descriptors one message carries; more are a protocol error.
pub(crate) const MAX_FDS: usize = 16;

/// The control-message space of [`MAX_FDS`] descriptors.
const FD_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_FDS));

/// Sends `payload` (non-empty) with `fds` attached, in one `sendmsg`. The descriptors stay
/// open here; the receiver gets its own copies.
pub fn send_with_handles(sock: &Stream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_with_handles_flags(sock, payload, fds, crate::os::platform::SEND_NO_SIGNAL)
}

/// As [`send_with_handles`], but `WouldBlock` instead of waiting when the socket's buffer is full
/// (the peer has not read what was sent before). A payload far smaller than the socket's
/// buffer goes whole or not at all.
pub fn try_send_with_handles(sock: &Stream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_with_handles_flags(sock, payload, fds, crate::os::platform::SEND_NO_SIGNAL | SendFlags::DONTWAIT)
}

fn send_with_handles_flags(sock: &Stream, payload: &[u8], fds: &[BorrowedFd<'_>], flags: SendFlags) -> Result<()> {
    if payload.is_empty() {
        return Err(Error::invalid("an fd message needs at least one payload byte"));
    }
    if fds.len() > MAX_FDS {
        return Err(Error::invalid(format!("{} fds in one message; the limit is {MAX_FDS}", fds.len())));
    }
    let mut space = [MaybeUninit::uninit(); FD_SPACE];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        let pushed = control.push(SendAncillaryMessage::ScmRights(fds));
        debug_assert!(pushed, "the control buffer has room for MAX_FDS descriptors");
    }
    let iov = [IoSlice::new(payload)];
    loop {
        match rustix::net::sendmsg(sock, &iov, &mut control, flags) {
            Ok(n) if n == payload.len() => return Ok(()),
            Ok(_) => {
                return Err(Error::Io {
                    context: "sendmsg with fds".into(),
                    source: std::io::Error::new(std::io::ErrorKind::WriteZero, "short write"),
                })
            }
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => return Err(Error::WouldBlock("the socket's buffer is full".into())),
            Err(e) => return Err(Error::os("sendmsg with fds", e.into())),
        }
    }
}

/// Receives one message of at most `buf.len()` bytes and the descriptors attached to it.
/// Returns the payload length (0 means the peer closed the socket) and the descriptors, each
/// owned (closed on drop) so that none leaks whatever the caller does next.
pub fn recv_with_handles(sock: &Stream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    recv_with_handles_flags(sock, buf, RecvFlags::empty())
}

/// As [`recv_with_handles`], without waiting: `None` when nothing is pending.
pub fn try_recv_with_handles(sock: &Stream, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedFd>)>> {
    match recv_with_handles_flags(sock, buf, RecvFlags::DONTWAIT) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        other => other.map(Some),
    }
}

fn recv_with_handles_flags(sock: &Stream, buf: &mut [u8], flags: RecvFlags) -> Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); FD_SPACE];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        // MSG_CMSG_CLOEXEC keeps received fds from leaking into exec'd children.
        match rustix::net::recvmsg(sock, &mut iov, &mut control, crate::os::platform::RECV_CLOEXEC | flags) {
            Ok(msg) => break msg,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Error::os("recvmsg with fds", e.into())),
        }
    };
    // Each received fd is new in this process and owned by the returned value (or closed with
    // the control buffer, whatever is not taken here).
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    crate::os::platform::received(&fds);
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        // The fds that did arrive are dropped (closed) with `fds`.
        return Err(Error::Corrupt(format!("peer sent more than {MAX_FDS} file descriptors in one message")));
    }
    Ok((msg.bytes, fds))
}

/// Receives one message that must be exactly `buf.len()` bytes with exactly one descriptor
/// attached (`what` names it in errors): PeerGone when the socket closed first, Corrupt for any
/// other shape, whose descriptors are closed.
pub fn recv_exact_with_handle(sock: &Stream, buf: &mut [u8], what: &str) -> Result<OwnedFd> {
    let (n, mut fds) = recv_with_handles(sock, buf)?;
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
    use crate::os::{shm, Mapping, ShmOptions};
    use std::os::fd::AsFd;

    #[test]
    fn an_fd_travels_and_maps_the_same_memory() {
        let (a, b) = Stream::pair().unwrap();
        let fd = shm::create("lf-pass", 4096, ShmOptions::default()).unwrap();
        let here = Mapping::shared(&fd, 0, 4096).unwrap();
        send_with_handles(&a, b"hi", &[fd.as_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_handles(&b, &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"hi"[..], 1));
        let there = Mapping::shared(&fds[0], 0, 4096).unwrap();
        // SAFETY: both mappings are live, 4096 bytes each.
        unsafe {
            here.as_ptr().write(7);
            assert_eq!(there.as_ptr().read(), 7);
        }
    }

    #[test]
    fn the_peer_of_a_pair_is_this_process() {
        let (a, _b) = Stream::pair().unwrap();
        let me = peer(&a).unwrap();
        assert_eq!((me.pid, me.same_user, me.uid), (std::process::id() as i32, true, crate::os::user::id()));
    }

    /// A listener is closed to other users, accepts nothing until a peer connects, and then a
    /// blocking stream whose peer is this process.
    #[test]
    fn a_listener_accepts_a_connection_by_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sock");
        let listener = Listener::bind(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(listener.try_accept().unwrap().is_none());
        let client = connect(&path).unwrap();
        let server = listener.try_accept().unwrap().expect("a pending connection");
        send_with_handles(&client, b"x", &[]).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(recv_with_handles(&server, &mut buf).unwrap().0, 1);
        assert_eq!(peer(&server).unwrap().pid, std::process::id() as i32);
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        assert!(connect(&path).is_err());
    }

    #[test]
    fn closed_peer_reads_as_zero() {
        let (a, b) = Stream::pair().unwrap();
        drop(a);
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_handles(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (0, 0));
    }
}
