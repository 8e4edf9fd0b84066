//! What the routes of a producer keep alive for its consumer, and what they owe it, until it
//! releases or dies: shared by a carrier (which learns of the consumer's death) and the routes
//! beside it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

/// What the routes of a producer keep alive for its consumer (the memory of messages it may
/// still read, by key), until they let go of it or the consumer dies. A dead consumer reads
/// nothing any more, and its messages are never released, so the carrier, which learns of the
/// death (as it happens, from the process's watcher, or at its next look at the peer), lets go
/// of everything here then ([`consumer_died`](Self::consumer_died)): the memory goes back at
/// once instead of with the channel. Taken only when a route starts or stops holding
/// something, never per message.
pub struct PeerHolds {
    /// `None` once the consumer died: nothing is held for it any more.
    held: Mutex<Option<HashMap<u64, Arc<dyn Any + Send + Sync>>>>,
    /// What the routes do for the consumer when it dies (`None` once it did).
    at_death: Mutex<Option<Vec<AtDeath>>>,
}

/// What a route does for its consumer when the consumer dies.
pub type AtDeath = Box<dyn FnOnce() + Send>;

impl Default for PeerHolds {
    fn default() -> PeerHolds {
        PeerHolds { held: Mutex::new(Some(HashMap::new())), at_death: Mutex::new(Some(Vec::new())) }
    }
}

impl fmt::Debug for PeerHolds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.held.lock() {
            Some(held) => write!(f, "PeerHolds({} held)", held.len()),
            None => f.write_str("PeerHolds(consumer died)"),
        }
    }
}

impl PeerHolds {
    /// Keeps `keep` alive under `key` (replacing what the key held) until [`release`](Self::release)
    /// or the consumer's death; after the death, keeps nothing.
    pub fn hold(&self, key: u64, keep: Arc<dyn Any + Send + Sync>) {
        let replaced = match &mut *self.held.lock() {
            Some(held) => held.insert(key, keep),
            None => Some(keep),
        };
        // Outside the lock: the last reference may free memory.
        drop(replaced);
    }

    /// Lets go of what `key` holds, if anything.
    pub fn release(&self, key: u64) {
        let released = self.held.lock().as_mut().and_then(|held| held.remove(&key));
        drop(released);
    }

    /// Runs `f` when the consumer dies (at once if it has): what a route owes the producer's
    /// other work in the consumer's stead.
    pub fn on_death(&self, f: AtDeath) {
        let mut at_death = self.at_death.lock();
        match at_death.as_mut() {
            Some(pending) => pending.push(f),
            None => {
                drop(at_death);
                f();
            }
        }
    }

    /// The consumer died: lets go of everything held for it, now and from now on, and runs
    /// what the routes do then.
    pub fn consumer_died(&self) {
        let mut held = self.held.lock();
        // Under the lock, so that a second caller (the carrier's own look, racing the
        // watcher's report) returns only once everything is let go of.
        drop(held.take());
        let mut at_death = self.at_death.lock();
        for f in at_death.take().into_iter().flatten() {
            f();
        }
    }
}
