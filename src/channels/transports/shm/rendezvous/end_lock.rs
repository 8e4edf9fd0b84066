//! The lock file each end of a channel holds while it lives ([`EndLock`]), what the lock says
//! of an end ([`end_state`]), and the survivor's cleanup after a peer that is over
//! ([`clean_after_peer`]).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::peer_watch::PeerWatch;
use super::runtime_dir::{runtime_dir, socket_path};
use crate::error::{Error, Result};
use crate::os::lock::{self, LockFile};

/// Which end of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Producer,
    Consumer,
    /// The producer in this slot of a fan-in.
    FanInProducer(u32),
    /// The consumer in this slot of a fan-out.
    FanOutConsumer(u32),
}

impl End {
    /// The end's part of its lock file's name, and how logs name it.
    fn as_str(self) -> String {
        match self {
            End::Producer => "producer".into(),
            End::Consumer => "consumer".into(),
            End::FanInProducer(slot) => format!("producer.{slot}"),
            End::FanOutConsumer(slot) => format!("consumer.{slot}"),
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
    _file: LockFile,
    path: PathBuf,
}

impl EndLock {
    /// Takes the lock of `end` of channel `name` (already validated) if nobody holds it:
    /// `Ok(Err(pid))` says it is held, by the process whose pid the file names (0 if unknown).
    pub fn try_take(name: &str, end: End) -> Result<std::result::Result<EndLock, u32>> {
        use std::io::{Read, Seek, Write};
        let path = lock_path(name, end)?;
        let mut lock = match LockFile::try_take(&path)
            .map_err(|e| Error::os(format!("opening and locking the lock file {}", path.display()), e))?
        {
            Ok(lock) => lock,
            Err(mut held) => {
                let mut text = String::new();
                let _ = held.read_to_string(&mut text);
                return Ok(Err(text.trim().parse().unwrap_or(0)));
            }
        };
        // Who holds it, for the messages of those refused; best-effort.
        let file = lock.file();
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = write!(file, "{}", std::process::id());
        Ok(Ok(EndLock { _file: lock, path }))
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
pub(super) fn lock_path(name: &str, end: End) -> Result<PathBuf> {
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
    let path = lock_path(name, end)?;
    let mut file = match lock::open_existing(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(EndState::Absent),
        Err(e) => return Err(Error::os(format!("opening the lock file {}", path.display()), e)),
    };
    if lock::try_lock(&file).map_err(|e| Error::os(format!("locking {}", path.display()), e))? {
        // Given back when `file` closes, at the end of this function.
        return Ok(EndState::Over);
    }
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    Ok(EndState::Live { pid: text.trim().parse().unwrap_or(0) })
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

/// Identifies one socket or lock file (the platform says how).
pub type FileId = lock::FileId;

pub(super) fn file_id(path: &Path) -> Option<FileId> {
    lock::file_id(path)
}

/// " (pid N)" for a lock holder's pid, when known.
pub fn holder(pid: u32) -> String {
    if pid == 0 {
        String::new()
    } else {
        format!(" (pid {pid})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
