//! What tools see of channels from outside (lf-info --channels, --cleanup): the channels that
//! have files in the runtime directory, whether each end is alive, and the removal of what
//! the ends that are over left.

use std::io::ErrorKind;
use std::path::PathBuf;

use super::end_lock::{end_state, lock_path, End, EndLock, EndState};
use super::runtime_dir::{runtime_dir_path, socket_path};
use crate::channels::validate_channel_name;
use crate::error::{Error, Result};

/// What the runtime directory holds of one channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelFiles {
    pub name: String,
    /// Whether `<name>.sock`, the consumer's rendezvous socket, is there.
    pub socket: bool,
    pub producer: EndState,
    pub consumer: EndState,
    /// A fan-in's producers with lock files, by slot.
    pub fan_in_producers: Vec<(u32, EndState)>,
    /// A fan-out's consumers with lock files, by slot.
    pub fan_out_consumers: Vec<(u32, EndState)>,
}

impl ChannelFiles {
    /// Whether a process holds either end.
    pub fn is_live(&self) -> bool {
        matches!(self.producer, EndState::Live { .. })
            || matches!(self.consumer, EndState::Live { .. })
            || self.slots().any(|(_, state)| matches!(state, EndState::Live { .. }))
    }

    /// Whether this is a fan-out: consumers hold slots. (A fan-out's producer also holds the
    /// socket its consumers connect to, as a pair's consumer does; a pair whose two ends live in
    /// one process looks the same, so that is no sign.)
    pub fn is_fan_out(&self) -> bool {
        !self.fan_out_consumers.is_empty()
    }

    /// The fan-in producers' and fan-out consumers' slots, with their states.
    fn slots(&self) -> impl Iterator<Item = &(u32, EndState)> {
        self.fan_in_producers.iter().chain(&self.fan_out_consumers)
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
    let mut names = std::collections::BTreeMap::<String, (bool, Vec<End>)>::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::os(format!("reading the runtime dir {}", dir.display()), e))?;
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let (name, socket, slot) = if let Some(name) = file.strip_suffix(".sock") {
            (name, true, None)
        } else if let Some(name) = file.strip_suffix(".producer.lock").or_else(|| file.strip_suffix(".consumer.lock")) {
            (name, false, None)
        } else if let Some((name, slot)) = slot_lock(file) {
            (name, false, Some(slot))
        } else {
            continue;
        };
        if validate_channel_name(name).is_ok() {
            let entry = names.entry(name.to_owned()).or_default();
            entry.0 |= socket;
            entry.1.extend(slot);
        }
    }
    names
        .into_iter()
        .map(|(name, (socket, slots))| {
            let state = |slot: u32, end: End| Ok::<_, Error>((slot, end_state(&name, end)?));
            let mut fan_in_producers = Vec::new();
            let mut fan_out_consumers = Vec::new();
            for end in slots {
                match end {
                    End::FanInProducer(slot) => fan_in_producers.push(state(slot, end)?),
                    End::FanOutConsumer(slot) => fan_out_consumers.push(state(slot, end)?),
                    _ => {}
                }
            }
            fan_in_producers.sort_unstable_by_key(|(slot, _)| *slot);
            fan_out_consumers.sort_unstable_by_key(|(slot, _)| *slot);
            Ok(ChannelFiles {
                producer: end_state(&name, End::Producer)?,
                consumer: end_state(&name, End::Consumer)?,
                fan_in_producers,
                fan_out_consumers,
                socket,
                name,
            })
        })
        .collect()
}

/// A slot's lock file's name, `<name>.producer.<slot>.lock` (a fan-in's producer) or
/// `<name>.consumer.<slot>.lock` (a fan-out's consumer): the name, and the end.
fn slot_lock(file: &str) -> Option<(&str, End)> {
    let stem = file.strip_suffix(".lock")?;
    let parse = |slot: &str| slot.parse().ok().filter(|s| *s < crate::channels::MAX_PEERS);
    if let Some((name, slot)) = stem.rsplit_once(".producer.") {
        return Some((name, End::FanInProducer(parse(slot)?)));
    }
    let (name, slot) = stem.rsplit_once(".consumer.")?;
    Some((name, End::FanOutConsumer(parse(slot)?)))
}

/// Removes what the ends of channel `name` that are over left in the runtime directory: the
/// lock file of each end nobody holds and, when nobody holds the consumer's end, its socket.
/// The files of a live end are never touched: each end's files are removed while holding its
/// lock, as a channel cleans up after a peer (`clean_after_peer`). Returns the paths removed.
pub fn remove_leftovers(name: &str) -> Result<Vec<PathBuf>> {
    validate_channel_name(name)?;
    let socket = socket_path(name)?;
    let mut removed = Vec::new();
    let slots = (0..crate::channels::MAX_PEERS).flat_map(|slot| [End::FanInProducer(slot), End::FanOutConsumer(slot)]);
    for end in [End::Producer, End::Consumer].into_iter().chain(slots) {
        let path = lock_path(name, end)?;
        let existed = std::fs::symlink_metadata(&path).is_ok();
        if !existed && matches!(end, End::FanInProducer(_) | End::FanOutConsumer(_)) {
            continue;
        }
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

// Unix sockets and descriptors throughout.
#[cfg(all(unix, test))]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

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
}
