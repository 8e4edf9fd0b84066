//! What a loopback producer and its consumer share: the messages between them, in a ring of
//! `capacity` entries, and the ends' state, under one lock.

use crate::os::OwnedHandle;
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::channels::transport::{Attachment, RawView, Release};
use crate::error::{Error, Result};
use crate::os::event;

/// Where a message's bytes lie.
pub(super) enum Bytes {
    /// A heap allocation of the message's own (a copy, a loan's room, a route's descriptor).
    Owned(Box<[u8]>),
    /// The sender's region (a buffer send), kept alive until the release.
    Region { ptr: *const u8, _keep: Arc<dyn Any + Send + Sync> },
}

impl Bytes {
    fn ptr(&self) -> *const u8 {
        match self {
            Bytes::Owned(bytes) => bytes.as_ptr(),
            Bytes::Region { ptr, .. } => *ptr,
        }
    }
}

/// A published message until its release.
pub(super) struct Entry {
    pub(super) bytes: Bytes,
    pub(super) len: usize,
    pub(super) flags: u64,
    /// Handed out to the consumer and not released yet.
    held: bool,
    released: bool,
}

impl Entry {
    pub(super) fn new(bytes: Bytes, len: usize, flags: u64) -> Entry {
        Entry { bytes, len, flags, held: false, released: false }
    }
}

pub(super) struct State {
    /// Messages by sequence number modulo the capacity, from `reclaimed` to `head`.
    slots: Vec<Option<Entry>>,
    /// The next message the producer publishes.
    pub(super) head: u64,
    /// The next message the consumer reads.
    pub(super) received: u64,
    /// Every message below it is released (the producer's completion).
    pub(super) reclaimed: u64,
    held: u64,
    pub(super) producer_closed: bool,
    pub(super) consumer_closed: bool,
    /// Routed messages' attachments, in the order they were sent, until the consumer takes them.
    pub(super) attachments: Vec<Attachment>,
    /// Other routes' memory that views of this session may point into, until none is held.
    kept: Vec<Box<dyn Any + Send + Sync>>,
    /// The consumer's notification fd once it asked for one: readable while a message waits.
    pub(super) notify: Option<Arc<OwnedHandle>>,
}

/// The state a loopback producer and consumer share.
pub(crate) struct Session {
    pub(super) id: u64,
    pub(super) name: String,
    /// The producer's slot: 0 for a pair, its fan-in slot otherwise.
    pub(super) slot: u32,
    pub(super) capacity: u64,
    pub(super) max_len: usize,
    state: Mutex<State>,
    /// Woken when a message arrives or the producer closes.
    data: Condvar,
    /// Woken when a message is released or the consumer closes.
    room: Condvar,
    /// The producer's rendezvous sections for the routes, and the consumer's answers.
    pub(super) offers: Mutex<Option<Vec<Attachment>>>,
    pub(super) answers: Mutex<Option<Vec<Attachment>>>,
}

// SAFETY: the raw pointers in `Bytes::Region` point into memory that the entry's `_keep`
// holds alive and that is only read; everything else is Send + Sync, behind the mutex.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl Session {
    pub(super) fn new(
        id: u64,
        name: &str,
        slot: u32,
        capacity: u64,
        max_len: usize,
        offers: Vec<Attachment>,
    ) -> Session {
        Session {
            id,
            name: name.to_owned(),
            slot,
            capacity,
            max_len,
            state: Mutex::new(State {
                slots: (0..capacity).map(|_| None).collect(),
                head: 0,
                received: 0,
                reclaimed: 0,
                held: 0,
                producer_closed: false,
                consumer_closed: false,
                attachments: Vec::new(),
                kept: Vec::new(),
                notify: None,
            }),
            data: Condvar::new(),
            room: Condvar::new(),
            offers: Mutex::new(Some(offers)),
            answers: Mutex::new(None),
        }
    }

    /// The other end of this session as a peer (this process, this session's slot), `gone` or
    /// alive.
    pub(super) fn peer(&self, gone: bool) -> crate::channels::Peer {
        use crate::channels::{Peer, PeerState};
        Peer {
            slot: self.slot,
            state: if gone { PeerState::Gone } else { PeerState::Alive },
            pid: std::process::id(),
            rank: None,
            host: String::new(),
            route: Some(super::ID.name()),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Whether the producer may publish one more message now.
    pub(super) fn has_room(&self, state: &State) -> bool {
        state.head - state.reclaimed < self.capacity
    }

    /// Publishes `entry` as message `head` (the caller checked the room) and wakes the consumer.
    pub(super) fn publish(&self, mut state: MutexGuard<'_, State>, entry: Entry) -> u64 {
        let seq = state.head;
        let index = (seq % self.capacity) as usize;
        debug_assert!(state.slots[index].is_none(), "a slot is published while its last message is unreleased");
        state.slots[index] = Some(entry);
        state.head = seq + 1;
        let notify = state.notify.clone();
        drop(state);
        self.data.notify_all();
        if let Some(fd) = notify {
            event::signal(crate::os::borrow(&fd));
        }
        seq
    }

    /// The next message, handed out as a view, if one waits.
    pub(super) fn take_next(&self, state: &mut State) -> Option<RawView> {
        if state.received == state.head {
            return None;
        }
        let seq = state.received;
        let entry = state.slots[(seq % self.capacity) as usize].as_mut().expect("published messages are in their slot");
        entry.held = true;
        let view = RawView { ptr: entry.bytes.ptr(), len: entry.len, token: seq, session: self.id, flags: entry.flags };
        state.received = seq + 1;
        state.held += 1;
        Some(view)
    }

    /// Waits on `data` (consumer) or `room` (producer) until woken or the deadline; `false`
    /// when the deadline passed.
    pub(super) fn wait(&self, state: &mut MutexGuard<'_, State>, for_data: bool, deadline: Option<Instant>) -> bool {
        let condvar = if for_data { &self.data } else { &self.room };
        match deadline {
            None => {
                condvar.wait(state);
                true
            }
            Some(deadline) => Instant::now() < deadline && !condvar.wait_until(state, deadline).timed_out(),
        }
    }

    /// Marks the producer's end (it closed) and wakes the consumer.
    pub(super) fn close_producer(&self) {
        let mut state = self.state.lock();
        state.producer_closed = true;
        let notify = state.notify.clone();
        drop(state);
        self.data.notify_all();
        if let Some(fd) = notify {
            event::signal(crate::os::borrow(&fd));
        }
    }

    /// Marks the consumer's end (it closed) and wakes the producer.
    pub(super) fn close_consumer(&self) {
        self.state.lock().consumer_closed = true;
        self.room.notify_all();
    }

    /// Keeps `keep` while any view of the session is held; drops it at once when none is.
    pub(super) fn keep_while_held(&self, keep: Box<dyn Any + Send + Sync>) {
        let mut state = self.state.lock();
        if state.held > 0 {
            state.kept.push(keep);
        }
    }

    pub(super) fn released_below(&self) -> u64 {
        self.state.lock().reclaimed
    }

    pub(super) fn holds_views(&self) -> bool {
        self.state.lock().held > 0
    }

    fn not_held(&self, view: &RawView) -> Error {
        Error::InvalidState(format!(
            "message {} of channel {:?} is not held by this consumer (already released, or from another channel)",
            view.token, self.name
        ))
    }
}

impl Release for Session {
    fn release(&self, view: &RawView) -> Result<()> {
        let mut state = self.state.lock();
        if view.session != self.id || view.token < state.reclaimed || view.token >= state.received {
            return Err(self.not_held(view));
        }
        let index = (view.token % self.capacity) as usize;
        match state.slots[index].as_mut() {
            Some(entry) if entry.held && entry.bytes.ptr() == view.ptr && entry.len == view.len => {
                entry.held = false;
                entry.released = true;
            }
            _ => return Err(self.not_held(view)),
        }
        state.held -= 1;
        // Space is reclaimed in order: the completion the producer sees.
        let mut reclaimed = false;
        while state.reclaimed < state.received {
            let index = (state.reclaimed % self.capacity) as usize;
            if !state.slots[index].as_ref().is_some_and(|e| e.released) {
                break;
            }
            state.slots[index] = None;
            state.reclaimed += 1;
            reclaimed = true;
        }
        let kept = if state.held == 0 { std::mem::take(&mut state.kept) } else { Vec::new() };
        drop(state);
        drop(kept);
        if reclaimed {
            self.room.notify_all();
        }
        Ok(())
    }
}
