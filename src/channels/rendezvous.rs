//! Meeting by name: the consumer listens on a Unix socket `<runtime dir>/<name>.sock`, the
//! producer connects (retrying until the consumer is there, so either may start first), each
//! checks the other's uid with `SO_PEERCRED`, and the producer hands over the shared memory
//! and its eventfd with `SCM_RIGHTS`.
//!
//! The runtime dir is `$LF_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/lava-flow`, else
//! `/tmp/lava-flow-$UID`; it is created 0700 and refused unless it is a real directory owned
//! by this user and closed to others. Sockets are 0600. Nothing else is created: shared memory
//! is a memfd, so a crash leaves nothing in `/dev/shm`. The socket file is removed by the
//! consumer when it closes, or by a surviving producer when the consumer died.
//!
//! After the handshake the socket stays open: it and a pidfd of the peer are how each side
//! learns that the other has gone. The producer also sends [`ControlRecord`]s over it: the
//! fd of each arena a buffer send points into (once per arena and channel), and which
//! arenas the consumer may forget.

use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::os::eventfd::{pidfd_open, poll};

/// Overrides the runtime directory (tests, or several isolated groups of processes).
pub const RUNTIME_DIR_ENV: &str = "LF_RUNTIME_DIR";

/// The per-user directory holding rendezvous sockets, created if missing and checked.
pub fn runtime_dir() -> Result<PathBuf> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = match std::env::var_os(RUNTIME_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(x) if !x.is_empty() && Path::new(&x).is_dir() => Path::new(&x).join("lava-flow"),
            _ => PathBuf::from(format!("/tmp/lava-flow-{uid}")),
        },
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(format!("creating runtime dir {}", dir.display()), e)),
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::os(format!("checking runtime dir {}", dir.display()), e))?;
    if !meta.is_dir() {
        return Err(Error::PermissionDenied(format!(
            "runtime dir {} is not a directory (a symlink or file is in the way); remove it",
            dir.display()
        )));
    }
    if meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(Error::PermissionDenied(format!(
            "runtime dir {} belongs to uid {} with mode {:o}; lava-flow needs it owned by uid {uid} \
             and closed to others (0700): fix or remove it, or set {RUNTIME_DIR_ENV}",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(dir)
}

/// The socket path of channel `name` (already validated).
pub fn socket_path(name: &str) -> Result<PathBuf> {
    let path = runtime_dir()?.join(format!("{name}.sock"));
    if path.as_os_str().len() >= 108 {
        return Err(Error::invalid(format!(
            "socket path {} is longer than the 107 bytes a Unix socket allows; use a shorter \
             channel name or {RUNTIME_DIR_ENV}",
            path.display()
        )));
    }
    Ok(path)
}

/// The credentials of the process on the other end of `sock`, as the kernel recorded them at
/// connect time.
pub fn peer_credentials(sock: &UnixStream) -> Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are live and sized for SO_PEERCRED's ucred.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(Error::last_os("getsockopt(SO_PEERCRED)"));
    }
    Ok(cred)
}

/// Refuses a peer running as another user.
pub fn check_same_user(cred: &libc::ucred, channel: &str) -> Result<()> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if cred.uid != uid {
        return Err(Error::PermissionDenied(format!(
            "channel {channel:?}: peer process {} runs as uid {}, this process as uid {uid}; \
             lava-flow only connects processes of the same user",
            cred.pid, cred.uid
        )));
    }
    Ok(())
}

/// Identifies one socket file: inode numbers are reused at once on tmpfs, so the change time
/// (ns) is part of the identity.
pub type FileId = (u64, u64, i64, i64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// The consumer's listening socket. Dropping it removes the socket file (if it is still the
/// one this listener created).
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
    id: Option<FileId>,
}

impl Listener {
    /// Binds the socket of channel `name`. A file left by a consumer that died is replaced; a
    /// live consumer of the same name is an error.
    pub fn bind(name: &str) -> Result<Self> {
        let path = socket_path(name)?;
        let listener = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) if e.kind() == ErrorKind::AddrInUse => {
                match UnixStream::connect(&path) {
                    Ok(_probe) => {
                        return Err(Error::InvalidState(format!(
                            "channel {name:?} already has a live consumer (socket {})",
                            path.display()
                        )))
                    }
                    Err(_) => {
                        // Nobody listens: a consumer died and left its socket file.
                        let _ = std::fs::remove_file(&path);
                        UnixListener::bind(&path)
                            .map_err(|e| Error::os(format!("bind {}", path.display()), e))?
                    }
                }
            }
            Err(e) => return Err(Error::os(format!("bind {}", path.display()), e)),
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::os(format!("chmod 0600 {}", path.display()), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::os("making the listening socket non-blocking", e))?;
        let id = file_id(&path);
        Ok(Listener { listener, path, id })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Accepts one connection from a process of this user, waiting until `deadline`
    /// (`None`: forever; `Some(now)`: only what is already pending). Connections from other
    /// users are closed and noted in `refused`.
    pub fn accept(&self, deadline: Option<Instant>, refused: &mut Vec<String>, channel: &str) -> Result<Option<(UnixStream, libc::ucred)>> {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false)
                        .map_err(|e| Error::os("making the producer socket blocking", e))?;
                    let cred = peer_credentials(&sock)?;
                    match check_same_user(&cred, channel) {
                        Ok(()) => return Ok(Some((sock, cred))),
                        Err(e) => {
                            refused.push(e.to_string());
                            continue;
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::os(format!("accept on {}", self.path.display()), e)),
            }
            let wait = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    Some(d - now)
                }
            };
            let mut fds = [libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
            poll(&mut fds, wait.map(|w| w.max(Duration::from_millis(1))))?;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.id.is_some() && file_id(&self.path) == self.id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Connects to the consumer of channel `name`, retrying until it listens or `deadline`.
/// Returns the socket, the consumer's credentials and the socket file's identity (for
/// removing it if the consumer dies).
pub fn connect(name: &str, deadline: Option<Instant>) -> Result<(UnixStream, libc::ucred, PathBuf, Option<FileId>)> {
    let path = socket_path(name)?;
    let mut pause = Duration::from_micros(200);
    loop {
        match UnixStream::connect(&path) {
            Ok(sock) => {
                let id = file_id(&path);
                let cred = peer_credentials(&sock)?;
                check_same_user(&cred, name)?;
                return Ok((sock, cred, path, id));
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) => {}
            Err(e) => return Err(Error::os(format!("connect {}", path.display()), e)),
        }
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Err(Error::Timeout(format!(
                    "no consumer of channel {name:?} appeared at {} in time",
                    path.display()
                )));
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Removes a producer's view of a dead consumer's socket file: only if it is the same file
/// and nobody listens on it.
pub fn remove_stale_socket(path: &Path, id: Option<FileId>) {
    if id.is_some() && file_id(path) == id && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// Watches the peer of an established channel: its process (pidfd) and its end of the socket.
#[derive(Debug)]
pub struct PeerWatch {
    sock: UnixStream,
    pidfd: Option<OwnedFd>,
    pub pid: libc::pid_t,
    gone: bool,
}

impl PeerWatch {
    pub fn new(sock: UnixStream, pid: libc::pid_t) -> Self {
        PeerWatch { sock, pidfd: pidfd_open(pid), pid, gone: false }
    }

    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    pub fn socket_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|f| f.as_fd())
    }

    /// Whether an earlier check found the peer gone (no syscall).
    pub fn known_gone(&self) -> bool {
        self.gone
    }

    /// Whether the peer has exited or closed its end (one `poll` syscall, none once gone).
    pub fn is_gone(&mut self) -> bool {
        if self.gone {
            return true;
        }
        let mut fds = [
            libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 },
            libc::pollfd { fd: self.pidfd.as_ref().map_or(-1, |f| f.as_raw_fd()), events: libc::POLLIN, revents: 0 },
        ];
        let Ok(n) = poll(&mut fds, Some(Duration::ZERO)) else {
            self.gone = true;
            return true;
        };
        if n == 0 {
            return false;
        }
        let hung_up = libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL;
        if fds[1].revents != 0 || fds[0].revents & hung_up != 0 {
            self.gone = true;
        } else if fds[0].revents & libc::POLLIN != 0 {
            // Readable without a hang-up: control records (arena fds) may be waiting after the
            // handshake, so peek to tell end-of-file from data.
            let mut byte = 0u8;
            // SAFETY: peeks at most one byte into a live local.
            let n = unsafe {
                libc::recv(self.sock.as_raw_fd(), (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
            };
            if n == 0 {
                self.gone = true;
            }
        }
        self.gone
    }
}

/// The producer's offer: the geometry of the shared region it made. Sent with the memfd and
/// the eventfd attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub transport: u32,
    pub slot_count: u32,
    pub pool_size: u64,
    pub total_len: u64,
    pub name: String,
}

const HELLO_MAGIC: &[u8; 8] = b"LFHELLO1";
const ACK_MAGIC: &[u8; 8] = b"LFACK001";
/// Accepted; anything else is a refusal whose text follows.
pub const ACK_OK: u32 = 0;
pub const ACK_REFUSED: u32 = 1;

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + self.name.len());
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.transport.to_le_bytes());
        out.extend_from_slice(&self.slot_count.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.pool_size.to_le_bytes());
        out.extend_from_slice(&self.total_len.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Hello> {
        let bad = |what: &str| Error::Corrupt(format!("rendezvous: producer's hello {what}"));
        if bytes.len() < 48 || &bytes[..8] != HELLO_MAGIC {
            return Err(bad("is not a lava-flow hello (wrong magic or too short)"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let name_len = u32_at(44) as usize;
        if bytes.len() != 48 + name_len {
            return Err(bad("has a name length that does not match its size"));
        }
        let name = std::str::from_utf8(&bytes[48..]).map_err(|_| bad("has a name that is not UTF-8"))?;
        Ok(Hello {
            version: u32_at(8),
            transport: u32_at(12),
            slot_count: u32_at(16),
            pool_size: u64_at(24),
            total_len: u64_at(32),
            name: name.to_owned(),
        })
    }
}

/// What the producer sends over the socket after the handshake, each record in one message
/// of [`ControlRecord::LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRecord {
    /// Arena `id` of `len` bytes: its memory file is attached (one fd). Sent before the first
    /// message that points into it.
    Arena { id: u64, len: u64 },
    /// Arena `id` is gone at the producer and no message in flight points into it: unmap it.
    Forget { id: u64 },
}

const RECORD_MAGIC: &[u8; 4] = b"LFCR";
const RECORD_ARENA: u32 = 1;
const RECORD_FORGET: u32 = 2;

impl ControlRecord {
    pub const LEN: usize = 32;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let (kind, id, len) = match *self {
            ControlRecord::Arena { id, len } => (RECORD_ARENA, id, len),
            ControlRecord::Forget { id } => (RECORD_FORGET, id, 0),
        };
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(RECORD_MAGIC);
        out[4..8].copy_from_slice(&kind.to_le_bytes());
        out[8..16].copy_from_slice(&id.to_le_bytes());
        out[16..24].copy_from_slice(&len.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ControlRecord> {
        let bad = |what: String| Error::Corrupt(format!("the producer sent a control record that {what}"));
        if bytes.len() != Self::LEN || &bytes[..4] != RECORD_MAGIC {
            return Err(bad(format!("is not one (wrong magic or {} bytes, not {})", bytes.len(), Self::LEN)));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        if u64_at(24) != 0 {
            return Err(bad("has non-zero reserved bytes".into()));
        }
        match (u32_at(4), u64_at(8), u64_at(16)) {
            (RECORD_ARENA, id, len) => Ok(ControlRecord::Arena { id, len }),
            (RECORD_FORGET, id, 0) => Ok(ControlRecord::Forget { id }),
            (kind, _, _) => Err(bad(format!("has unknown kind {kind}"))),
        }
    }
}

/// Sends the consumer's answer to a hello: `ACK_OK` or a refusal with its reason.
pub fn send_ack(sock: &UnixStream, status: u32, text: &str) -> Result<()> {
    let text = &text.as_bytes()[..text.len().min(1000)];
    let mut out = Vec::with_capacity(16 + text.len());
    out.extend_from_slice(ACK_MAGIC);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text);
    let mut sent = 0;
    while sent < out.len() {
        // MSG_NOSIGNAL: a producer that has gone must give EPIPE, not a SIGPIPE that would
        // kill a C host process that keeps the default signal action.
        // SAFETY: sends from a live buffer of the given length.
        let n = unsafe {
            libc::send(sock.as_raw_fd(), out[sent..].as_ptr().cast(), out.len() - sent, libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::os("sending the rendezvous answer", err));
        }
        sent += n as usize;
    }
    Ok(())
}

/// Reads the consumer's answer: Ok on acceptance, the refusal as an error.
pub fn recv_ack(sock: &UnixStream, channel: &str) -> Result<()> {
    use std::io::Read;
    let mut head = [0u8; 16];
    (&*sock).read_exact(&mut head).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout(format!(
            "the consumer of channel {channel:?} did not answer in time (it may already have a producer)"
        )),
        ErrorKind::UnexpectedEof => Error::PeerGone(format!(
            "the consumer of channel {channel:?} closed the connection during the rendezvous"
        )),
        _ => Error::os("reading the rendezvous answer", e),
    })?;
    if &head[..8] != ACK_MAGIC {
        return Err(Error::Corrupt(format!("channel {channel:?}: the consumer's answer has the wrong magic")));
    }
    let status = u32::from_le_bytes(head[8..12].try_into().unwrap());
    let len = (u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize).min(1000);
    let mut text = vec![0u8; len];
    (&*sock).read_exact(&mut text).map_err(|e| Error::os("reading the rendezvous answer", e))?;
    if status != ACK_OK {
        return Err(Error::InvalidState(format!(
            "the consumer of channel {channel:?} refused this producer: {}",
            String::from_utf8_lossy(&text)
        )));
    }
    Ok(())
}

/// Remaining time to `deadline` for a socket timeout (at least 1 ms; `None` = forever).
pub fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
}

/// The raw fd of a borrowed descriptor, for poll sets.
pub fn raw(fd: BorrowedFd<'_>) -> i32 {
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        let h = Hello { version: 1, transport: 1, slot_count: 64, pool_size: 1 << 20, total_len: 12345, name: "ch".into() };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert!(matches!(Hello::decode(b"garbage"), Err(Error::Corrupt(_))));
        let mut bytes = h.encode();
        bytes[44] = 200;
        assert!(matches!(Hello::decode(&bytes), Err(Error::Corrupt(_))));
    }

    #[test]
    fn control_records_round_trip_and_reject_garbage() {
        for r in [ControlRecord::Arena { id: 7, len: 1 << 21 }, ControlRecord::Forget { id: 9 }] {
            assert_eq!(ControlRecord::decode(&r.encode()).unwrap(), r);
        }
        let mut bytes = ControlRecord::Forget { id: 1 }.encode();
        bytes[4] = 9;
        assert!(matches!(ControlRecord::decode(&bytes), Err(Error::Corrupt(_))));
        assert!(matches!(ControlRecord::decode(&bytes[..8]), Err(Error::Corrupt(_))));
    }

    #[test]
    fn data_on_the_socket_is_not_a_hang_up() {
        use std::io::Write;
        let (a, b) = UnixStream::pair().unwrap();
        let mut watch = PeerWatch::new(b, std::process::id() as i32);
        assert!(!watch.is_gone());
        (&a).write_all(b"record").unwrap();
        assert!(!watch.is_gone(), "pending data is not end-of-file");
        drop(a);
        assert!(watch.is_gone());
    }

    #[test]
    fn peer_credentials_of_a_socketpair_are_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_credentials(&a).unwrap();
        check_same_user(&cred, "x").unwrap();
        let other = libc::ucred { uid: cred.uid.wrapping_add(1), ..cred };
        assert!(matches!(check_same_user(&other, "x"), Err(Error::PermissionDenied(_))));
    }
}
