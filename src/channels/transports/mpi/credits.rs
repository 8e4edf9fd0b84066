//! What an MPI consumer's session and the messages it handed out share: the messages held
//! until released (from any thread, in any order), and the credits those releases turn into,
//! which are the producer's completion and room.

use std::any::Any;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{BufferPool, Header, Kind, FLAG_REPORT, FLAG_ZERO_COPY};
use crate::channels::transport::{RawView, Release};
use crate::error::{Error, Result};
use crate::mpi::{Duty, PrivateComm, Request};

/// A message received and not yet released: the buffer its bytes lie in.
pub(super) struct Held {
    pub(super) seq: u64,
    pub(super) buffer: Vec<u8>,
    pub(super) report: bool,
}

/// What the consumer and the messages it handed out share: releases (from any thread), and
/// the credits they turn into.
pub(super) struct Shared {
    pub(super) comm: Arc<PrivateComm>,
    pub(super) peer: u32,
    /// The session's id, which its views carry.
    pub(super) id: u64,
    pub(super) control_tag: i32,
    /// Credits go at least every this many messages.
    pub(super) batch: u64,
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    /// Messages held, in slot `seq % capacity`: a producer that keeps to its credits never
    /// has more than `capacity` messages unreleased.
    pub(super) held: Vec<Option<Held>>,
    pub(super) held_count: usize,
    /// Every message below this is released; `released` holds those released above it.
    pub(super) released_below: u64,
    pub(super) released: BTreeSet<u64>,
    pub(super) last_reported: u64,
    /// `last_reported` at the progress thread's last look, when releases were unreported then.
    pub(super) unreported_at_last_look: Option<u64>,
    /// The producer waits for a credit covering this many messages (0: it does not).
    pub(super) report_wanted: u64,
    pub(super) pool: BufferPool,
    /// Credits in flight.
    pub(super) sends: VecDeque<(Request, Box<[u8; Header::LEN]>)>,
    /// Other routes' memory kept while views are held.
    pub(super) kept: Vec<Box<dyn Any + Send + Sync>>,
    /// The channel's consumer has gone: credits are no longer sent.
    pub(super) closed: bool,
}

impl State {
    pub(super) fn slot(&self, seq: u64) -> usize {
        (seq % self.held.len() as u64) as usize
    }
}

impl Shared {
    /// Sends a credit for everything released in order, when the producer should hear of it.
    pub(super) fn report(&self, state: &mut State, now: bool) -> Result<()> {
        while let Some((request, _)) = state.sends.front_mut() {
            if !self.comm.test(request)? {
                break;
            }
            state.sends.pop_front();
        }
        let due = now
            || state.released_below >= state.last_reported + self.batch
            || (state.report_wanted != 0 && state.released_below >= state.report_wanted);
        if !due || state.closed || state.released_below == state.last_reported {
            return Ok(());
        }
        if state.report_wanted != 0 && state.released_below >= state.report_wanted {
            state.report_wanted = 0;
        }
        state.last_reported = state.released_below;
        let credit = Box::new(Header::new(Kind::Credit, state.released_below, 0).to_bytes());
        // SAFETY: the box's heap memory stays in `sends` until the send is complete (or is
        // leaked with it when the consumer closes).
        let request = unsafe { self.comm.isend(credit.as_ptr(), Header::LEN, self.peer, self.control_tag)? };
        state.sends.push_back((request, credit));
        Ok(())
    }
}

impl Duty for Shared {
    /// Sends a credit for releases that have waited unreported since the last look (a
    /// millisecond or two): the consumer's releases reach the producer even when the
    /// application then stops calling lava-flow, whether or not the producer asked for them
    /// (its report request waits unread in the consumer's stream until the next receive).
    /// Releases that keep being reported in batches cost nothing here.
    fn tick(&self) {
        let Some(mut state) = self.state.try_lock() else { return };
        if state.closed || state.released_below == state.last_reported {
            state.unreported_at_last_look = None;
            return;
        }
        if state.unreported_at_last_look == Some(state.last_reported) {
            state.unreported_at_last_look = None;
            // An MPI failure shows again at the consumer's next credit.
            let _ = self.report(&mut state, true);
        } else {
            state.unreported_at_last_look = Some(state.last_reported);
        }
    }
}

impl Release for Shared {
    fn release(&self, view: &RawView) -> Result<()> {
        let mut state = self.state.lock();
        let slot = state.slot(view.token);
        let matches = view.session == self.id
            && state.held[slot].as_ref().is_some_and(|h| {
                let start = h.buffer.as_ptr() as usize;
                h.seq == view.token
                    && view.ptr as usize >= start
                    && view.ptr as usize + view.len <= start + h.buffer.len()
            });
        if !matches {
            return Err(Error::InvalidState(format!(
                "message {} is not held by this consumer (already released, or not received from this channel)",
                view.token
            )));
        }
        let held = state.held[slot].take().expect("checked");
        state.held_count -= 1;
        state.pool.put(held.buffer);
        if view.token == state.released_below {
            state.released_below += 1;
            loop {
                let next = state.released_below;
                if !state.released.remove(&next) {
                    break;
                }
                state.released_below += 1;
            }
        } else {
            state.released.insert(view.token);
        }
        if state.held_count == 0 {
            state.kept.clear();
        }
        self.report(&mut state, held.report)
    }
}

/// Holds a received message (its payload at `start` in `buffer`) until it is released, and
/// hands out its view; what is wrong when the producer sent more than the capacity allows.
pub(super) fn hold(
    state: &mut State,
    session: u64,
    next: &mut u64,
    header: Header,
    buffer: Vec<u8>,
    start: usize,
) -> std::result::Result<RawView, String> {
    let len = header.len as usize;
    let slot = state.slot(header.seq);
    if state.held[slot].is_some() {
        state.pool.put(buffer);
        return Err(format!(
            "sent message {} while {} messages were unreleased: more than the channel's capacity",
            header.seq,
            state.held.len()
        ));
    }
    // SAFETY: start + len <= buffer.len() (checked by the callers); the buffer's heap memory
    // stays in place in `held` until the view is released.
    let ptr = unsafe { buffer.as_ptr().add(start) };
    let flags = if header.flags & FLAG_ZERO_COPY != 0 { RawView::ZERO_COPY } else { 0 };
    state.held[slot] = Some(Held { seq: header.seq, buffer, report: header.flags & FLAG_REPORT != 0 });
    state.held_count += 1;
    *next += 1;
    Ok(RawView { ptr, len, token: header.seq, session, flags })
}
