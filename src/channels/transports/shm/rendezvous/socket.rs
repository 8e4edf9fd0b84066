//! The rendezvous socket: the consumer's [`Listener`], the producer's [`connect`], and the
//! check that the peer runs as this user.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::end_lock::{file_id, holder, End, EndLock, FileId};
use super::runtime_dir::socket_path;
use crate::error::{Error, Result};
use crate::os::stream::{self, PeerIdentity, Stream};
use crate::os::user;

/// Refuses a peer running as another user.
pub fn check_same_user(peer: &PeerIdentity, channel: &str) -> Result<()> {
    if !peer.same_user {
        return Err(Error::PermissionDenied(format!(
            "channel {channel:?}: peer process {} runs as uid {}, this process as uid {}; lava-flow only connects \
             processes of the same user",
            peer.pid,
            peer.uid,
            user::id()
        )));
    }
    Ok(())
}

/// The consumer's listening socket and its claim on the consumer's end. Dropping it removes
/// the socket file (if it is still the one this listener created), then the claim.
#[derive(Debug)]
pub struct Listener {
    listener: stream::Listener,
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
        let listener = stream::Listener::bind(&path)?;
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

    /// The platform's listener, to wait on (`os::ready::wait_listener`).
    pub fn inner(&self) -> &stream::Listener {
        &self.listener
    }

    /// Accepts one connection from a process of this user, waiting until `deadline`
    /// (`None`: forever; `Some(now)`: only what is already pending). Connections from other
    /// users are closed and noted in `refused`.
    pub fn accept(
        &self,
        deadline: Option<Instant>,
        refused: &mut Vec<String>,
        channel: &str,
    ) -> Result<Option<(Stream, PeerIdentity)>> {
        loop {
            let wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match self.listener.accept_within(wait) {
                Ok(Some(sock)) => {
                    let peer = stream::peer(&sock)?;
                    match check_same_user(&peer, channel) {
                        Ok(()) => return Ok(Some((sock, peer))),
                        Err(e) => {
                            refused.push(e.to_string());
                            continue;
                        }
                    }
                }
                Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                Ok(None) => {}
                Err(e) => return Err(Error::os(format!("accept on {}", self.path.display()), e)),
            }
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
pub fn connect(name: &str, deadline: Option<Instant>) -> Result<(Stream, PeerIdentity)> {
    let path = socket_path(name)?;
    let mut pause = Duration::from_micros(200);
    loop {
        match stream::connect(&path) {
            Ok(sock) => {
                let peer = stream::peer(&sock)?;
                check_same_user(&peer, name)?;
                return Ok((sock, peer));
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

/// Remaining time to `deadline` for a socket timeout (at least 1 ms; `None` = forever).
pub fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
}

// Unix sockets and descriptors throughout.
#[cfg(all(unix, test))]
mod tests {
    use super::*;

    #[test]
    fn the_peer_of_a_socketpair_is_this_user() {
        let (a, _b) = Stream::pair().unwrap();
        let peer = stream::peer(&a).unwrap();
        check_same_user(&peer, "x").unwrap();
        let other = PeerIdentity { same_user: false, uid: peer.uid.wrapping_add(1), ..peer };
        assert!(matches!(check_same_user(&other, "x"), Err(Error::PermissionDenied(_))));
    }
}
