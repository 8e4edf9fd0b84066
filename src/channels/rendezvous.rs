//! Meeting by name on one host: the consumer listens on a Unix socket
//! `<runtime dir>/<name>.sock`, the producer connects (retrying until the consumer is there, so
//! either may start first), each checks the other's uid with `SO_PEERCRED`, and the producer
//! sends a hello: the channel's name and one [`Section`] per route it offers (the carrier's:
//! shared memory and its notification socket; a GPU route's: device identity and semaphore), descriptors
//! attached with `SCM_RIGHTS`. The consumer answers with its own sections or a refusal.
//!
//! The runtime dir is `$LF_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/lava-flow`, else
//! `/tmp/lava-flow-$UID`; it is created 0700 and refused unless it is a real directory owned
//! by this user and closed to others. Sockets are 0600. Shared memory is a memfd, so a crash
//! leaves nothing in `/dev/shm`.
//!
//! Each end of a channel holds a lock file, `<name>.producer.lock` or `<name>.consumer.lock`
//! ([`EndLock`], `flock`), for as long as it lives: a second producer or consumer of a live
//! channel finds it held and is refused at once. The kernel releases a lock when its holder
//! dies, so whether an end is over never depends on timing or on anything a peer wrote: a
//! lock that can be taken belongs to nobody. The consumer's socket and its lock file are
//! removed by the consumer when it closes, else by whoever next takes its lock (a surviving
//! producer at its close, a new consumer); likewise a dead producer's lock file.
//!
//! After the handshake the socket stays open: it and a pidfd of the peer are how each side
//! learns that the other has gone (the process's watcher reports either the moment it comes,
//! see [`PeerWatch::arm`]), and the carrier may send records of its own over it (the
//! shared-memory transport passes arena descriptors this way).

use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wait::{LIVENESS_PERIOD, SLEEP_SLICE};
use crate::error::{Error, Result};
use crate::os::eventfd::{pidfd_open, poll, PollFd, PollFlags};
use crate::os::watcher::{Interest, SharedFd, Watch};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Overrides the runtime directory (tests, or several isolated groups of processes).
pub const RUNTIME_DIR_ENV: &str = crate::env::RUNTIME_DIR.name;

/// Where the runtime directory is (see [`runtime_dir`]), without creating or checking it.
pub fn runtime_dir_path() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    match std::env::var_os(RUNTIME_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(x) if !x.is_empty() && Path::new(&x).is_dir() => Path::new(&x).join("lava-flow"),
            xdg => {
                let dir = PathBuf::from(format!("/tmp/lava-flow-{uid}"));
                if let Some(x) = xdg.filter(|x| !x.is_empty()) {
                    crate::logging::log_first!(
                        log::Level::Info,
                        "XDG_RUNTIME_DIR={} is not a directory: channel sockets go to {}; set {RUNTIME_DIR_ENV} to \
                         choose the directory",
                        Path::new(&x).display(),
                        dir.display()
                    );
                }
                dir
            }
        },
    }
}

/// The per-user directory holding rendezvous sockets, created if missing and checked.
pub fn runtime_dir() -> Result<PathBuf> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = runtime_dir_path();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(format!("creating runtime dir {}", dir.display()), e)),
    }
    let meta =
        std::fs::symlink_metadata(&dir).map_err(|e| Error::os(format!("checking runtime dir {}", dir.display()), e))?;
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

/// Which end of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Producer,
    Consumer,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Producer => "producer",
            End::Consumer => "consumer",
        }
    }
}

/// The claim of one process on one end of a channel: an exclusive `flock` on
/// `<runtime dir>/<name>.<end>.lock`, held while the end lives. The kernel drops the lock when
/// the holder's last descriptor of it closes (at the latest when the holder dies, before its
/// pidfd reports the exit). Dropping the claim removes the file (while still holding it).
///
/// A lock file can be removed by its holder while another process has it open and waits to
/// lock it; that process then holds a lock on a file no longer in the directory. Every taker
/// therefore checks, once it holds the lock, that the path still names the file it locked,
/// and starts again if not: only one process at a time can hold the lock of the file in place.
#[derive(Debug)]
pub struct EndLock {
    /// Held for its lock, which goes when it closes.
    _file: std::fs::File,
    path: PathBuf,
}

impl EndLock {
    /// Takes the lock of `end` of channel `name` (already validated) if nobody holds it:
    /// `Ok(Err(pid))` says it is held, by the process whose pid the file names (0 if unknown).
    pub fn try_take(name: &str, end: End) -> Result<std::result::Result<EndLock, u32>> {
        use std::io::{Read, Seek, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let path = lock_path(name, end)?;
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| Error::os(format!("opening the lock file {}", path.display()), e))?;
            // SAFETY: flock on a descriptor this function owns, with integer flags.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(Error::os(format!("locking {}", path.display()), err));
                }
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Ok(Err(text.trim().parse().unwrap_or(0)));
            }
            let locked = file.metadata().map(|m| (m.dev(), m.ino())).ok();
            let in_place = std::fs::symlink_metadata(&path).map(|m| (m.dev(), m.ino())).ok();
            if locked.is_none() || locked != in_place {
                // Removed (or replaced) by its previous holder after we opened it: try again.
                continue;
            }
            // Who holds it, for the messages of those refused; best-effort.
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = write!(file, "{}", std::process::id());
            return Ok(Ok(EndLock { _file: file, path }));
        }
    }

    /// [`try_take`](Self::try_take), retried for a short while: another process may hold the
    /// lock for a moment to clean up after an end that is over.
    pub fn take(name: &str, end: End) -> Result<std::result::Result<EndLock, u32>> {
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            match Self::try_take(name, end)? {
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                result => return Ok(result),
            }
        }
    }
}

impl Drop for EndLock {
    fn drop(&mut self) {
        // Still held here, so no other process can have put a file of its own in its place.
        let _ = std::fs::remove_file(&self.path);
        // The lock goes with the descriptor, when `_file` drops.
    }
}

/// Where the lock file of `end` of channel `name` lives.
fn lock_path(name: &str, end: End) -> Result<PathBuf> {
    Ok(runtime_dir()?.join(format!("{name}.{}.lock", end.as_str())))
}

/// Whether an end of a channel is held by a process now, as its lock says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndState {
    /// No lock file: the end was never made, or closed and cleaned up.
    Absent,
    /// The lock is held: the end lives, in the process whose pid the file names (0 if unknown).
    Live { pid: u32 },
    /// A lock file nobody holds: the end's process died (or is dying) and left it.
    Over,
}

impl EndState {
    /// `live (pid N)`, `over`, `absent`.
    pub fn describe(self) -> String {
        match self {
            EndState::Absent => "absent".into(),
            EndState::Live { pid } => format!("live{}", holder(pid)),
            EndState::Over => "over".into(),
        }
    }
}

/// Whether `end` of channel `name` is held, asked of its lock without taking it for good: the
/// lock is taken for a moment and given back, and nothing is created or removed. A channel end
/// that comes meanwhile retries (`EndLock::take`); a survivor cleaning up after its peer
/// (`clean_after_peer`) that finds the lock held then leaves the files to whoever next takes
/// that end.
pub fn end_state(name: &str, end: End) -> Result<EndState> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = lock_path(name, end)?;
    let mut file =
        match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(EndState::Absent),
            Err(e) => return Err(Error::os(format!("opening the lock file {}", path.display()), e)),
        };
    // SAFETY: flock on a descriptor this function owns, with integer flags.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        // Given back when `file` closes, at the end of this function.
        return Ok(EndState::Over);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(Error::os(format!("locking {}", path.display()), err));
    }
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    Ok(EndState::Live { pid: text.trim().parse().unwrap_or(0) })
}

/// What the runtime directory holds of one channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelFiles {
    pub name: String,
    /// Whether `<name>.sock`, the consumer's rendezvous socket, is there.
    pub socket: bool,
    pub producer: EndState,
    pub consumer: EndState,
}

impl ChannelFiles {
    /// Whether a process holds either end.
    pub fn is_live(&self) -> bool {
        matches!(self.producer, EndState::Live { .. }) || matches!(self.consumer, EndState::Live { .. })
    }
}

/// The channels that have files in the runtime directory (sockets, lock files), by name,
/// each with the state of its ends ([`end_state`]). Looks only: nothing is created or
/// removed, the directory included (no directory: no channels).
pub fn channels_in_runtime_dir() -> Result<Vec<ChannelFiles>> {
    let dir = runtime_dir_path();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::os(format!("reading the runtime dir {}", dir.display()), e)),
    };
    let mut names = std::collections::BTreeMap::<String, bool>::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::os(format!("reading the runtime dir {}", dir.display()), e))?;
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let (name, socket) = if let Some(name) = file.strip_suffix(".sock") {
            (name, true)
        } else if let Some(name) = file.strip_suffix(".producer.lock").or_else(|| file.strip_suffix(".consumer.lock")) {
            (name, false)
        } else {
            continue;
        };
        if super::validate_channel_name(name).is_ok() {
            *names.entry(name.to_owned()).or_default() |= socket;
        }
    }
    names
        .into_iter()
        .map(|(name, socket)| {
            Ok(ChannelFiles {
                producer: end_state(&name, End::Producer)?,
                consumer: end_state(&name, End::Consumer)?,
                socket,
                name,
            })
        })
        .collect()
}

/// Removes what the ends of channel `name` that are over left in the runtime directory: the
/// lock file of each end nobody holds and, when nobody holds the consumer's end, its socket.
/// The files of a live end are never touched: each end's files are removed while holding its
/// lock, as a channel cleans up after a peer (`clean_after_peer`). Returns the paths removed.
pub fn remove_leftovers(name: &str) -> Result<Vec<PathBuf>> {
    super::validate_channel_name(name)?;
    let socket = socket_path(name)?;
    let mut removed = Vec::new();
    for end in [End::Producer, End::Consumer] {
        let path = lock_path(name, end)?;
        let existed = std::fs::symlink_metadata(&path).is_ok();
        let Ok(lock) = EndLock::try_take(name, end)? else { continue };
        if end == End::Consumer {
            match std::fs::remove_file(&socket) {
                Ok(()) => removed.push(socket.clone()),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::os(format!("removing the socket {}", socket.display()), e)),
            }
        }
        // Dropping the lock removes its file.
        drop(lock);
        if existed {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// The identity of the lock file of `end` of channel `name` as it is now: taken by each side
/// of a channel when it meets its peer, whose lock file it is then. A later end's lock file is
/// another file, or the same one rewritten with another pid (a new change time).
pub fn lock_file_id(name: &str, end: End) -> Option<FileId> {
    file_id(&lock_path(name, end).ok()?)
}

/// How long the survivor of a channel waits for its peer's end to be over (its lock free)
/// before leaving the cleanup to whoever next takes that end. A killed process lets go of its
/// locks only after its memory is unmapped, which takes a while for a large one.
const CLEANUP_WAIT: Duration = Duration::from_secs(2);

/// Removes what the peer's `end` of channel `name` left once it is over (closed, or its
/// process dead): its lock file and, for a consumer, its socket file. Only what the survivor
/// learned itself counts: the peer's process (`SO_PEERCRED`, a pidfd), the identity of its
/// lock file when the two met (`peer_lock`, from [`lock_file_id`]), and whether that lock can
/// be taken; nothing the peer wrote in shared memory does. A socket file is removed only by a
/// holder of the consumer's lock, so a live consumer's never is.
///
/// - The peer's lock file is gone: it closed and cleaned up (a consumer's socket left without
///   its lock file is removed all the same).
/// - Another lock file is in its place: a new end's, left alone.
/// - The peer's lock file is held: the peer is still dying (a killed process lets go of its
///   locks only after its memory is unmapped), so this waits up to `CLEANUP_WAIT` for its
///   pidfd; held after the exit, it is a child's the peer forked, left alone.
pub fn clean_after_peer(name: &str, end: End, peer: &PeerWatch, peer_lock: Option<FileId>) {
    let (Ok(path), Ok(socket)) = (lock_path(name, end), socket_path(name)) else { return };
    let deadline = Instant::now() + CLEANUP_WAIT;
    loop {
        // Looked at before the lock: once the process has exited, its locks are gone.
        let exited = peer.has_exited();
        let current = file_id(&path);
        let ours = peer_lock.is_some() && current == peer_lock;
        if current.is_none() && !(end == End::Consumer && socket.exists()) {
            return;
        }
        if current.is_some() && !ours && peer_lock.is_some() {
            return;
        }
        match EndLock::try_take(name, end) {
            Ok(Ok(lock)) => {
                if end == End::Consumer {
                    // Holding the consumer's lock: no live consumer listens on this socket.
                    let _ = std::fs::remove_file(&socket);
                }
                drop(lock);
                log::info!(
                    "channel {name:?}: removed what its {} (pid {}) left in the runtime dir ({}{})",
                    end.as_str(),
                    peer.pid,
                    path.display(),
                    if end == End::Consumer { format!(", {}", socket.display()) } else { String::new() }
                );
                return;
            }
            Ok(Err(_)) if ours && !exited && Instant::now() < deadline => peer.wait_for_exit(Duration::from_millis(2)),
            _ => return,
        }
    }
}

/// Identifies one socket file: inode numbers are reused at once on tmpfs, so the change time
/// (ns) is part of the identity.
pub type FileId = (u64, u64, i64, i64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// The consumer's listening socket and its claim on the consumer's end. Dropping it removes
/// the socket file (if it is still the one this listener created), then the claim.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
    id: Option<FileId>,
    /// The claim on the consumer's end, until [`close`](Self::close).
    lock: Option<EndLock>,
}

impl Listener {
    /// Binds the socket of channel `name`. A file left by a consumer that died is replaced; a
    /// live consumer of the same name is an error.
    pub fn bind(name: &str) -> Result<Self> {
        let path = socket_path(name)?;
        let lock = match EndLock::take(name, End::Consumer)? {
            Ok(lock) => lock,
            Err(pid) => {
                return Err(Error::InvalidState(format!(
                    "channel {name:?} already has a live consumer{} (socket {}); a channel has one consumer \
                     at a time: close that one first, or use another channel name",
                    holder(pid),
                    path.display()
                )))
            }
        };
        // Holding the consumer's lock: a socket file in the way was left by one that died.
        match std::fs::remove_file(&path) {
            Ok(()) => log::info!(
                "channel {name:?}: removed the socket {} that a consumer which had died left behind",
                path.display()
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(Error::os(format!("removing the stale socket {}", path.display()), e)),
        }
        let listener = UnixListener::bind(&path).map_err(|e| Error::os(format!("bind {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::os(format!("chmod 0600 {}", path.display()), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::os("making the listening socket non-blocking", e))?;
        let id = file_id(&path);
        Ok(Listener { listener, path, id, lock: Some(lock) })
    }

    /// Removes the socket file (if it is still the one this listener created), then gives up
    /// the claim on the consumer's end, so that another consumer may bind. The listening
    /// socket itself stays open until the drop; connections to it fail once the file is gone.
    pub fn close(&mut self) {
        if let Some(lock) = self.lock.take() {
            if self.id.is_some() && file_id(&self.path) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
            drop(lock);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one connection from a process of this user, waiting until `deadline`
    /// (`None`: forever; `Some(now)`: only what is already pending). Connections from other
    /// users are closed and noted in `refused`.
    pub fn accept(
        &self,
        deadline: Option<Instant>,
        refused: &mut Vec<String>,
        channel: &str,
    ) -> Result<Option<(UnixStream, libc::ucred)>> {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    sock.set_nonblocking(false).map_err(|e| Error::os("making the producer socket blocking", e))?;
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
            let mut fds = [PollFd::new(&self.listener, PollFlags::IN)];
            poll(&mut fds, wait.map(|w| w.max(Duration::from_millis(1))))?;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

/// Connects to the consumer of channel `name`, retrying until it listens or `deadline`.
/// Returns the socket and the consumer's credentials.
pub fn connect(name: &str, deadline: Option<Instant>) -> Result<(UnixStream, libc::ucred)> {
    let path = socket_path(name)?;
    let mut pause = Duration::from_micros(200);
    loop {
        match UnixStream::connect(&path) {
            Ok(sock) => {
                let cred = peer_credentials(&sock)?;
                check_same_user(&cred, name)?;
                return Ok((sock, cred));
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

/// " (pid N)" for a lock holder's pid, when known.
pub fn holder(pid: u32) -> String {
    if pid == 0 {
        String::new()
    } else {
        format!(" (pid {pid})")
    }
}

/// Watches the peer of an established channel: its process (pidfd) and its end of the socket.
/// Polled by [`is_gone`](Self::is_gone); once [`arm`](Self::arm)ed, also reported by the
/// process's watcher (`os::watcher`) the moment the peer's end comes, without polling.
#[derive(Debug)]
pub struct PeerWatch {
    /// Shared with the watcher while it watches them, so that they stay open under it.
    sock: Arc<UnixStream>,
    pidfd: Option<Arc<OwnedFd>>,
    pub pid: libc::pid_t,
    gone: bool,
    alarm: Result<Alarm, String>,
    /// When [`check`](Self::check) last polled.
    last_poll: Instant,
}

/// The watcher's registration for one peer, and the flag it sets when the peer's end comes.
#[derive(Debug)]
struct Alarm {
    _watch: Watch,
    rang: Arc<AtomicBool>,
}

impl PeerWatch {
    pub fn new(sock: UnixStream, pid: libc::pid_t) -> Self {
        let alarm = Err("not armed".to_owned());
        let last_poll = Instant::now();
        PeerWatch { sock: Arc::new(sock), pidfd: pidfd_open(pid).map(Arc::new), pid, gone: false, alarm, last_poll }
    }

    /// Asks the process's watcher to report the peer's end as it happens: when the peer's
    /// process exits or its socket hangs up, the watcher marks this watch
    /// [`alarmed`](Self::alarmed), then calls `wake`, which must wake whatever this side may be
    /// sleeping on (it runs on the watcher's thread: short, and owning what it touches).
    /// Returns [`prompt`](Self::prompt).
    pub fn arm(&mut self, wake: impl FnOnce() + Send + 'static) -> bool {
        let mut fds: Vec<(SharedFd, Interest)> = vec![(Arc::clone(&self.sock) as SharedFd, Interest::HangUp)];
        if let Some(pidfd) = &self.pidfd {
            fds.push((Arc::clone(pidfd) as SharedFd, Interest::Readable));
        }
        let rang = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&rang);
        self.alarm = Watch::new(fds, move || {
            // Before the wake-up: a side woken by it must find the flag set.
            flag.store(true, Ordering::SeqCst);
            wake();
        })
        .map(|watch| Alarm { _watch: watch, rang })
        .map_err(|e| format!("the process's watcher could not start ({e})"));
        if let Err(why) = &self.alarm {
            log::warn!(
                "{why}: the end of the peer process {} is noticed by polling instead of at once (blocked waits \
                 wake every {} ms to check it); check the limits on open files and threads",
                self.pid,
                SLEEP_SLICE.as_millis()
            );
        }
        self.prompt()
    }

    /// Whether the peer's end is reported without polling: armed, with a pidfd of the peer.
    /// Where it is not, a waiting side must poll [`is_gone`](Self::is_gone) periodically;
    /// [`polled_because`](Self::polled_because) says why.
    pub fn prompt(&self) -> bool {
        self.alarm.is_ok() && self.pidfd.is_some()
    }

    /// Why the peer's end is not [`prompt`](Self::prompt)ly reported, if it is not.
    pub fn polled_because(&self) -> Option<String> {
        match &self.alarm {
            Err(why) => Some(why.clone()),
            Ok(_) if self.pidfd.is_none() => Some(format!(
                "no pidfd of the peer (pid {}) could be opened: it runs in another PID namespace, or the kernel is older than 5.3",
                self.pid
            )),
            Ok(_) => None,
        }
    }

    /// Whether the watcher has reported the peer's end (no syscall).
    #[inline]
    pub fn alarmed(&self) -> bool {
        self.alarm.as_ref().is_ok_and(|a| a.rang.load(Ordering::Acquire))
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

    /// Whether the peer's process has exited (its pidfd is readable); `false` where there is
    /// no pidfd, or while the process lives.
    pub fn has_exited(&self) -> bool {
        let Some(pidfd) = &self.pidfd else { return false };
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        matches!(poll(&mut fds, Some(Duration::ZERO)), Ok(n) if n > 0)
    }

    /// Waits up to `timeout` for the peer's process to exit (sleeps that long without a pidfd).
    pub fn wait_for_exit(&self, timeout: Duration) {
        match &self.pidfd {
            Some(pidfd) => {
                let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
                let _ = poll(&mut fds, Some(timeout));
            }
            None => std::thread::sleep(timeout),
        }
    }

    /// Whether the peer has gone, as cheaply as this watch allows: where its end is
    /// [`prompt`](Self::prompt)ly reported, the watcher's report alone (no syscall); elsewhere
    /// [`is_gone`](Self::is_gone) at most every `LIVENESS_PERIOD`. `force`: poll now.
    pub fn check(&mut self, force: bool) -> bool {
        if !(force || self.gone || self.alarmed()) {
            if self.prompt() {
                return false;
            }
            let now = Instant::now();
            if now.duration_since(self.last_poll) < LIVENESS_PERIOD {
                return false;
            }
            self.last_poll = now;
        }
        self.is_gone()
    }

    /// Whether an earlier check found the peer gone (no syscall).
    pub fn known_gone(&self) -> bool {
        self.gone
    }

    /// Whether the peer has exited or closed its end (one `poll` syscall; none once gone or
    /// [`alarmed`](Self::alarmed)).
    pub fn is_gone(&mut self) -> bool {
        if self.gone {
            return true;
        }
        if self.alarmed() {
            self.gone = true;
            return true;
        }
        let sock = PollFd::new(&self.sock, PollFlags::IN | PollFlags::RDHUP);
        let (mut both, mut one);
        let fds: &mut [PollFd<'_>] = match &self.pidfd {
            Some(pidfd) => {
                both = [sock, PollFd::new(pidfd, PollFlags::IN)];
                &mut both
            }
            None => {
                one = [sock];
                &mut one
            }
        };
        let Ok(n) = poll(fds, Some(Duration::ZERO)) else {
            self.gone = true;
            return true;
        };
        if n == 0 {
            return false;
        }
        let hung_up = PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR | PollFlags::NVAL;
        if fds.get(1).is_some_and(|pidfd| !pidfd.revents().is_empty()) || fds[0].revents().intersects(hung_up) {
            self.gone = true;
        } else if fds[0].revents().contains(PollFlags::IN) {
            // Readable without a hang-up: control records (arena fds) may be waiting after the
            // handshake, so peek to tell end-of-file from data.
            let peeked = rustix::net::recv(&self.sock, &mut [0u8; 1], RecvFlags::PEEK | RecvFlags::DONTWAIT);
            if matches!(peeked, Ok((0, _))) {
                self.gone = true;
            }
        }
        self.gone
    }
}

/// One route's part of the rendezvous: opaque bytes and the descriptors that go with them.
/// The carrier of a channel (the transport that owns the socket) offers its own section and
/// carries the others' without reading them; each route reads only sections with its own id.
#[derive(Debug)]
pub struct Section {
    pub route: u32,
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Section {
    pub fn new(route: u32, bytes: Vec<u8>) -> Self {
        Section { route, bytes, fds: Vec::new() }
    }
}

/// The most bytes one section may hold, and the most sections a hello or answer carries.
pub const MAX_SECTION_LEN: usize = 1024;
pub const MAX_SECTIONS: usize = 8;
/// The most descriptors a hello carries (a bound on what a peer can make us hold).
pub const MAX_HELLO_FDS: usize = 8;

const HELLO_MAGIC: &[u8; 8] = b"LFHELLO2";
const ACK_MAGIC: &[u8; 8] = b"LFACK002";
/// Accepted; anything else is a refusal whose text follows.
pub const ACK_OK: u32 = 0;
pub const ACK_REFUSED: u32 = 1;

/// The start of a hello: the magic, then the channel name's length (the name follows, then
/// the section count and the sections).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HelloHead {
    magic: [u8; 8],
    name_len: U32,
}

/// The start of an answer's body: the magic, the status and the text's length (the text
/// follows, then the section count and the sections).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AckHead {
    magic: [u8; 8],
    status: U32,
    text_len: U32,
}

/// The start of a section, followed by its bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SectionHead {
    route: U32,
    fds: U32,
    len: U32,
}

fn put_sections(out: &mut Vec<u8>, sections: &[Section]) {
    out.extend_from_slice(U32::new(sections.len() as u32).as_bytes());
    for s in sections {
        let head =
            SectionHead { route: s.route.into(), fds: (s.fds.len() as u32).into(), len: (s.bytes.len() as u32).into() };
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&s.bytes);
    }
}

/// Reads the sections at `bytes[at..]`, handing out `fds` in order; everything is checked.
fn take_sections(bytes: &[u8], mut at: usize, fds: Vec<OwnedFd>, what: &str) -> Result<Vec<Section>> {
    let bad = |why: &str| Error::Corrupt(format!("rendezvous: the peer's {what} {why}"));
    let rest = |at: usize| bytes.get(at..).unwrap_or_default();
    let (count, _) = U32::read_from_prefix(rest(at)).map_err(|_| bad("is cut short"))?;
    let count = count.get() as usize;
    at += 4;
    if count > MAX_SECTIONS {
        return Err(bad(&format!("has {count} sections, more than {MAX_SECTIONS}")));
    }
    let mut fds = fds.into_iter();
    let mut sections = Vec::with_capacity(count);
    let mut fds_claimed = 0usize;
    for _ in 0..count {
        let (head, _) = SectionHead::read_from_prefix(rest(at)).map_err(|_| bad("is cut short"))?;
        let (route, fd_count, len) = (head.route.get(), head.fds.get() as usize, head.len.get() as usize);
        at += std::mem::size_of::<SectionHead>();
        if len > MAX_SECTION_LEN || fd_count > MAX_HELLO_FDS {
            return Err(bad(&format!("has a section of {len} bytes and {fd_count} descriptors")));
        }
        let body = bytes.get(at..at + len).ok_or_else(|| bad("is cut short"))?;
        at += len;
        fds_claimed += fd_count;
        let mine: Vec<OwnedFd> = fds.by_ref().take(fd_count).collect();
        if mine.len() != fd_count {
            return Err(bad(&format!("claims {fds_claimed} descriptors but carries fewer")));
        }
        sections.push(Section { route, bytes: body.to_vec(), fds: mine });
    }
    if at != bytes.len() || fds.next().is_some() {
        return Err(bad("has trailing bytes or descriptors"));
    }
    Ok(sections)
}

/// Sends the producer's hello: the channel's name and every route's section, descriptors
/// attached in section order.
pub fn send_hello(sock: &UnixStream, name: &str, sections: &[Section]) -> Result<()> {
    let mut out = Vec::with_capacity(64 + name.len());
    out.extend_from_slice(HelloHead { magic: *HELLO_MAGIC, name_len: (name.len() as u32).into() }.as_bytes());
    out.extend_from_slice(name.as_bytes());
    put_sections(&mut out, sections);
    let fds: Vec<BorrowedFd<'_>> = sections.iter().flat_map(|s| s.fds.iter().map(|f| f.as_fd())).collect();
    crate::os::send_with_fds(sock, &out, &fds)
}

/// The largest hello, in bytes.
pub const MAX_HELLO_LEN: usize = 16 + 64 + 4 + MAX_SECTIONS * (12 + MAX_SECTION_LEN);

/// Parses a hello received with its descriptors: (channel name, sections).
pub fn decode_hello(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<(String, Vec<Section>)> {
    let bad = |what: &str| Error::Corrupt(format!("rendezvous: producer's hello {what}"));
    let head = match HelloHead::ref_from_prefix(bytes) {
        Ok((head, _)) if &head.magic == HELLO_MAGIC => head,
        _ => return Err(bad(
            "is not a lava-flow hello of this version (wrong magic or too short); use the same lava-flow on both sides",
        )),
    };
    let start = std::mem::size_of::<HelloHead>();
    let name_len = head.name_len.get() as usize;
    let name = bytes.get(start..start + name_len).ok_or_else(|| bad("has a name longer than itself"))?;
    let name = std::str::from_utf8(name).map_err(|_| bad("has a name that is not UTF-8"))?.to_owned();
    Ok((name, take_sections(bytes, start + name_len, fds, "hello")?))
}

/// Sends the consumer's answer to a hello: `ACK_OK` with its routes' sections (no
/// descriptors), or a refusal with its reason.
pub fn send_ack(sock: &UnixStream, status: u32, text: &str, sections: &[Section]) -> Result<()> {
    let text = &text.as_bytes()[..text.len().min(1000)];
    let mut out = Vec::with_capacity(16 + text.len());
    let head = AckHead { magic: *ACK_MAGIC, status: status.into(), text_len: (text.len() as u32).into() };
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(text);
    put_sections(&mut out, sections);
    let mut body = Vec::with_capacity(4 + out.len());
    body.extend_from_slice(U32::new(out.len() as u32).as_bytes());
    body.extend_from_slice(&out);
    let mut sent = 0;
    while sent < body.len() {
        // MSG_NOSIGNAL: a producer that has gone must give EPIPE, not a SIGPIPE that would
        // kill a C host process that keeps the default signal action.
        match rustix::net::send(sock, &body[sent..], SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(Error::os("sending the rendezvous answer", e.into())),
        }
    }
    Ok(())
}

/// Reads the consumer's answer: its sections on acceptance, the refusal as an error.
pub fn recv_ack(sock: &UnixStream, channel: &str) -> Result<Vec<Section>> {
    use std::io::Read;
    let read = |buf: &mut [u8]| {
        (&*sock).read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::Timeout(format!(
                "the consumer of channel {channel:?} did not answer in time (it may already have a producer)"
            )),
            ErrorKind::UnexpectedEof => Error::PeerGone(format!(
                "the consumer of channel {channel:?} closed the connection during the rendezvous"
            )),
            _ => Error::os("reading the rendezvous answer", e),
        })
    };
    let mut len = U32::ZERO;
    read(len.as_mut_bytes())?;
    let len = len.get() as usize;
    if !(16..=MAX_ACK_LEN).contains(&len) {
        return Err(Error::Corrupt(format!("channel {channel:?}: the consumer's answer claims {len} bytes")));
    }
    let mut body = vec![0u8; len];
    read(&mut body)?;
    decode_ack(&body, channel)
}

/// The largest answer body, in bytes.
pub const MAX_ACK_LEN: usize = MAX_HELLO_LEN + 1000;

/// Parses the body of the consumer's answer (after its length word): its sections on
/// acceptance, the refusal as an error, anything malformed as `Corrupt`. Pure, so that it can
/// be fuzzed.
pub fn decode_ack(body: &[u8], channel: &str) -> Result<Vec<Section>> {
    let head = match AckHead::ref_from_prefix(body) {
        Ok((head, _)) if &head.magic == ACK_MAGIC => head,
        _ => {
            return Err(Error::Corrupt(format!(
                "channel {channel:?}: the consumer's answer has the wrong magic (another lava-flow version?)"
            )))
        }
    };
    let start = std::mem::size_of::<AckHead>();
    let (status, text_len) = (head.status.get(), head.text_len.get() as usize);
    let text = body
        .get(start..start + text_len)
        .ok_or_else(|| Error::Corrupt(format!("channel {channel:?}: the consumer's answer is cut short")))?;
    if status != ACK_OK {
        return Err(Error::InvalidState(format!(
            "the consumer of channel {channel:?} refused this producer: {}",
            String::from_utf8_lossy(text)
        )));
    }
    take_sections(body, start + text_len, Vec::new(), "answer")
}

/// Remaining time to `deadline` for a socket timeout (at least 1 ms; `None` = forever).
pub fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_and_answer_round_trip_and_reject_garbage() {
        let (a, b) = UnixStream::pair().unwrap();
        let fd = crate::os::eventfd::eventfd().unwrap();
        let sections = vec![Section { route: 1, bytes: vec![1, 2, 3], fds: vec![fd] }, Section::new(2, vec![9])];
        send_hello(&a, "ch", &sections).unwrap();
        let mut buf = vec![0u8; MAX_HELLO_LEN];
        let (n, fds) = crate::os::recv_with_fds(&b, &mut buf).unwrap();
        let (name, got) = decode_hello(&buf[..n], fds).unwrap();
        assert_eq!(name, "ch");
        assert_eq!((got[0].route, got[0].bytes.as_slice(), got[0].fds.len()), (1, &[1u8, 2, 3][..], 1));
        assert_eq!((got[1].route, got[1].bytes.as_slice(), got[1].fds.len()), (2, &[9u8][..], 0));
        assert!(matches!(decode_hello(b"garbage", Vec::new()), Err(Error::Corrupt(_))));
        // A section that claims a descriptor the message does not carry.
        let mut bytes = buf[..n].to_vec();
        assert!(matches!(decode_hello(&bytes, Vec::new()), Err(Error::Corrupt(_))));
        bytes.push(0);
        assert!(matches!(decode_hello(&bytes, Vec::new()), Err(Error::Corrupt(_))));
        send_ack(&b, ACK_OK, "", &[Section::new(7, vec![5; 40])]).unwrap();
        let answer = recv_ack(&a, "ch").unwrap();
        assert_eq!((answer[0].route, answer[0].bytes.len()), (7, 40));
        send_ack(&b, ACK_REFUSED, "no thanks", &[]).unwrap();
        assert!(matches!(recv_ack(&a, "ch"), Err(Error::InvalidState(ref m)) if m.contains("no thanks")));
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

    /// Armed with a pidfd, the peer's end is reported promptly; without one (pid 0 stands for
    /// a peer in another PID namespace) it is polled, says why, and a hang-up of its socket is
    /// still reported.
    #[test]
    fn the_watcher_reports_a_hang_up_and_says_when_it_cannot_see_the_process() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut watch = PeerWatch::new(b, std::process::id() as i32);
        assert!(watch.arm(|| {}), "a pidfd of this process");
        assert_eq!(watch.polled_because(), None);
        let (a2, b2) = UnixStream::pair().unwrap();
        let mut blind = PeerWatch::new(b2, 0);
        let woken = Arc::new(AtomicBool::new(false));
        let w = Arc::clone(&woken);
        assert!(!blind.arm(move || w.store(true, Ordering::SeqCst)));
        assert!(
            blind.polled_because().is_some_and(|why| why.contains("PID namespace")),
            "{:?}",
            blind.polled_because()
        );
        assert!(!blind.alarmed() && !blind.is_gone());
        drop(a2);
        let start = Instant::now();
        while !woken.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(10), "the hang-up was not reported");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(blind.alarmed() && blind.is_gone() && blind.known_gone());
        assert!(!watch.alarmed());
        drop((a, watch));
    }

    #[test]
    fn an_end_lock_is_exclusive_and_its_file_goes_with_it() {
        let name = format!("lock-test-{}", std::process::id());
        let path = lock_path(&name, End::Producer).unwrap();
        let first = EndLock::try_take(&name, End::Producer).unwrap().expect("free");
        // Held (even within one process: flock is per open file): refused, naming the holder.
        assert_eq!(EndLock::try_take(&name, End::Producer).unwrap().unwrap_err(), std::process::id());
        let other_end = EndLock::try_take(&name, End::Consumer).unwrap().expect("the other end is free");
        let id = lock_file_id(&name, End::Producer);
        assert!(id.is_some() && path.exists());
        drop(first);
        assert!(!path.exists(), "the holder removes its lock file");
        let again = EndLock::try_take(&name, End::Producer).unwrap().expect("free again");
        assert_ne!(lock_file_id(&name, End::Producer), id, "a new end's lock file is another file");
        drop((again, other_end));
    }

    /// A held end is live and left alone; an end whose lock nobody holds is over, and its
    /// files (the consumer's socket with its lock) are what `remove_leftovers` removes.
    #[test]
    fn leftovers_are_told_from_live_ends_and_removed() {
        let name = format!("leftover-test-{}", std::process::id());
        let find = |name: &str| channels_in_runtime_dir().unwrap().into_iter().find(|c| c.name == name);
        assert_eq!(find(&name), None);
        assert_eq!(end_state(&name, End::Consumer).unwrap(), EndState::Absent);
        let producer = EndLock::try_take(&name, End::Producer).unwrap().expect("free");
        // A consumer that died: its lock file and socket, held by nobody.
        let consumer_lock = lock_path(&name, End::Consumer).unwrap();
        std::fs::write(&consumer_lock, "1").unwrap();
        let socket = socket_path(&name).unwrap();
        drop(UnixListener::bind(&socket).unwrap());
        let found = find(&name).expect("listed");
        assert_eq!(found.producer, EndState::Live { pid: std::process::id() });
        assert_eq!((found.consumer, found.socket, found.is_live()), (EndState::Over, true, true));
        assert_eq!(found.producer.describe(), format!("live (pid {})", std::process::id()));
        // Looking changed nothing.
        assert!(consumer_lock.exists() && socket.exists());
        let removed = remove_leftovers(&name).unwrap();
        assert_eq!(removed, vec![socket.clone(), consumer_lock.clone()]);
        assert!(!consumer_lock.exists() && !socket.exists());
        let found = find(&name).expect("the live producer's lock is still there");
        assert_eq!((found.consumer, found.socket), (EndState::Absent, false));
        drop(producer);
        assert_eq!(find(&name), None);
        assert!(remove_leftovers("../escape").is_err());
    }

    #[test]
    fn peer_credentials_of_a_socketpair_are_ours() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_credentials(&a).unwrap();
        check_same_user(&cred, "x").unwrap();
        let other = libc::ucred { uid: cred.uid.wrapping_add(1), ..cred };
        assert!(matches!(check_same_user(&other, "x"), Err(Error::PermissionDenied(_))));
    }

    fn valid_hello() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(HELLO_MAGIC);
        out.extend_from_slice(&5u32.to_le_bytes());
        out.extend_from_slice(b"frame");
        put_sections(&mut out, &[Section::new(1, vec![3; 24]), Section::new(2, vec![9; 40])]);
        out
    }

    fn valid_ack() -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(ACK_MAGIC);
        out.extend_from_slice(&ACK_OK.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        put_sections(&mut out, &[Section::new(2, vec![1; 40])]);
        out
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(3000))]

        /// A producer's hello, with up to three descriptors attached: accepted only when every
        /// section is within bounds and every descriptor claimed is there, and then exactly
        /// what its bytes encode.
        #[test]
        fn fuzz_hello(bytes in crate::fuzz::bytes_near(valid_hello(), 200), fd_count in 0usize..3) {
            let fds: Vec<OwnedFd> = (0..fd_count).map(|_| crate::os::eventfd::eventfd().unwrap()).collect();
            if let Ok((name, sections)) = decode_hello(&bytes, fds) {
                prop_assert!(sections.len() <= MAX_SECTIONS);
                prop_assert_eq!(sections.iter().map(|s| s.fds.len()).sum::<usize>(), fd_count);
                let mut again = Vec::new();
                again.extend_from_slice(HELLO_MAGIC);
                again.extend_from_slice(&(name.len() as u32).to_le_bytes());
                again.extend_from_slice(name.as_bytes());
                for s in &sections {
                    prop_assert!(s.bytes.len() <= MAX_SECTION_LEN);
                }
                let counts: Vec<u32> = sections.iter().map(|s| s.fds.len() as u32).collect();
                again.extend_from_slice(&(sections.len() as u32).to_le_bytes());
                for (s, fds) in sections.iter().zip(counts) {
                    again.extend_from_slice(&s.route.to_le_bytes());
                    again.extend_from_slice(&fds.to_le_bytes());
                    again.extend_from_slice(&(s.bytes.len() as u32).to_le_bytes());
                    again.extend_from_slice(&s.bytes);
                }
                prop_assert_eq!(again, bytes);
            }
        }

        /// The consumer's answer: accepted, refused (InvalidState, carrying its text) or
        /// Corrupt; never a panic, never a descriptor.
        #[test]
        fn fuzz_ack(bytes in crate::fuzz::bytes_near(valid_ack(), 200)) {
            match decode_ack(&bytes, "ch") {
                Ok(sections) => {
                    prop_assert!(sections.len() <= MAX_SECTIONS && sections.iter().all(|s| s.fds.is_empty()));
                    prop_assert!(sections.iter().all(|s| s.bytes.len() <= MAX_SECTION_LEN));
                }
                Err(Error::InvalidState(m)) => prop_assert!(m.contains("refused")),
                Err(Error::Corrupt(_)) => {}
                Err(other) => prop_assert!(false, "unexpected error class: {}", other),
            }
        }
    }
}
