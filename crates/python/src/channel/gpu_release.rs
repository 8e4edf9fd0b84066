//! Releasing GPU messages on the GPU, and the producer's stream-ordered wait for it.
//!
//! A consumer made with `released_semaphore=True` releases a GPU message as soon as its work on
//! it is queued: lava-flow's `lf_release_on_gpu` gives the message back on the host at once and
//! returns the value of the producer's released semaphore that covers it, which this module
//! signals on the consumer's stream (`cuSignalExternalSemaphoresAsync`, after the work queued
//! there). No host wait, no event, no deferred release. The producer's
//! `wait_completed(seq, stream=S)` returns once the host release came and makes S wait on the
//! GPU for that value before the producer rewrites the buffer.
//!
//! Soundness: a value covers every GPU message let go of before it, and a timeline semaphore's
//! value must only grow. Every signal goes on one stream, the one the last view was used on:
//! in order, and after the work on every earlier message, as long as the consumer keeps to one
//! stream (the common case, and the fast one). When a message was used on another stream, or on
//! several, the release first waits on the host for the earlier streams' work up to now (an
//! event each) before it signals on the new one: rare, and the only host wait here. A message
//! with no stream (no CUDA view, or DLPack's `stream=-1`) is signalled on the last stream. Once
//! the consumer took over, every GPU message of the channel goes this way: lava-flow signals
//! nothing on the host any more. Where the producer has no released semaphore (it did not ask,
//! or the processes cannot share semaphores), the first release finds out and the channel keeps
//! to releases after events (see `gpu`).
//!
//! A consumer killed between its release and its signal leaves the producer's stream waiting
//! for a value nobody signals.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};

use pyo3::prelude::*;

use super::handle::{Deferred, Msg};
use super::Channel;
use crate::cuda::{self, CuStream, Event, Semaphore};
use crate::error::check;
use crate::ffi;
use crate::native::{lib, Ptr};

/// The legacy default stream (`CU_STREAM_LEGACY`): ordered after every blocking stream.
const LEGACY: usize = 1;

/// Releases of GPU messages in this process: at once (their streams were done), deferred until
/// their events were done, and released on the GPU.
pub(super) static IMMEDIATE: AtomicU64 = AtomicU64::new(0);
pub(super) static DEFERRED: AtomicU64 = AtomicU64::new(0);
static ON_GPU: AtomicU64 = AtomicU64::new(0);

/// (at once, deferred after events, on the GPU): for the benchmark's breakdown and tests.
pub fn release_counts() -> (u64, u64, u64) {
    (IMMEDIATE.load(Ordering::Relaxed), DEFERRED.load(Ordering::Relaxed), ON_GPU.load(Ordering::Relaxed))
}

/// How a consumer releases its GPU messages.
enum Mode {
    /// After the events of their streams (not opted in, or the producer has no released
    /// semaphore).
    Events,
    /// On the GPU once a message with a stream comes (opted in; nothing signalled yet).
    Opted,
    /// On the GPU: the producer's released semaphore in CUDA, and the stream of the last signal.
    On { semaphore: Arc<Semaphore>, stream: usize, device: i32 },
}

/// A channel's state for releases on the GPU: a consumer's mode, a producer's GPU sends.
pub(super) struct ReleaseState {
    mode: Mode,
    /// A consumer that asked to release on the GPU: each new producer is tried anew.
    opted_in: bool,
    /// A producer: the sequence numbers of GPU buffers it sent, and their device (for
    /// `wait_completed(stream=)`).
    gpu_sent: GpuSends,
    device: Option<i32>,
    /// A producer that asked for a released semaphore (`released_semaphore=True`).
    producer_released: bool,
    /// A producer: its released semaphore in CUDA; None until waited on, Some(None) where the
    /// channel has none (the consumer releases after its streams: the host wait suffices).
    own: Option<Option<Arc<Semaphore>>>,
}

impl ReleaseState {
    /// `released`: `released_semaphore=True`, which a consumer takes as asking to release on
    /// the GPU.
    pub(super) fn new(producer: bool, released: bool) -> ReleaseState {
        ReleaseState {
            mode: if released && !producer { Mode::Opted } else { Mode::Events },
            opted_in: released && !producer,
            gpu_sent: GpuSends::default(),
            device: None,
            producer_released: released && producer,
            own: None,
        }
    }
}

impl Channel {
    fn release_state(&self) -> MutexGuard<'_, ReleaseState> {
        self.releases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The producer has gone: a new one brings a new released semaphore (or none), looked for
    /// at its first message with a stream.
    pub(super) fn forget_released(&self) {
        let mut g = self.release_state();
        if g.opted_in {
            g.mode = Mode::Opted;
        }
    }

    /// Whether GPU messages of this consumer may be released on the GPU.
    pub(super) fn releases_on_gpu(&self) -> bool {
        !matches!(self.release_state().mode, Mode::Events)
    }

    /// Releases GPU message `m` on the live channel `ch` (under the channel's lock) with the
    /// producer's released semaphore signalled after the work queued on `streams`. None where
    /// this channel does not (the caller releases after events); else the status of the release.
    pub(super) fn release_on_gpu_locked(
        &self,
        ch: Ptr<ffi::lf_channel>,
        m: &Msg,
        streams: &[usize],
        device: i32,
    ) -> Option<ffi::lf_status> {
        let mut g = self.release_state();
        let (semaphore, stream, device) = match (&g.mode, streams.last()) {
            (Mode::Events, _) => return None,
            // Released on the host as before: lava-flow signals there until the first message
            // that has a stream.
            (Mode::Opted, None) => return None,
            (Mode::Opted, Some(&s)) => match released_semaphore(ch, device) {
                Ok(Some(sem)) => (sem, s, device),
                // No released semaphore, or no CUDA import of it: releases after events.
                Ok(None) | Err(_) => {
                    g.mode = Mode::Events;
                    return None;
                }
            },
            (Mode::On { semaphore, stream, device }, None) => (semaphore.clone(), *stream, *device),
            (Mode::On { semaphore, stream: last, device }, Some(&s)) => {
                // Another stream: the earlier signals and the earlier messages' work are on the
                // last one, and this message's other streams hold work on it too. Waited for on
                // the host (rare), so that the signal below comes after all of it.
                let earlier = streams[..streams.len() - 1].iter().chain((*last != s).then_some(last));
                for &other in earlier {
                    wait_for(*device, other);
                }
                (semaphore.clone(), s, *device)
            }
        };
        let mut value = 0u64;
        // SAFETY: live channel under its lock; a GPU message received on it and not released.
        let status = unsafe { lib().lf_release_on_gpu(ch.0, &m.0, &mut value) };
        if status != ffi::LF_OK {
            if matches!(g.mode, Mode::Opted) {
                // The producer has no released semaphore after all: the message is still held.
                g.mode = Mode::Events;
                return None;
            }
            return Some(status);
        }
        if value > 0 && semaphore.signal(value, stream as CuStream).is_err() {
            // The stream is gone (or refused): after all of the device's work, on the legacy
            // stream, so that the producer does not wait for a value never signalled.
            cuda::synchronize(device);
            let _ = semaphore.signal(value, LEGACY as CuStream);
        }
        g.mode = Mode::On { semaphore, stream, device };
        ON_GPU.fetch_add(1, Ordering::Relaxed);
        Some(ffi::LF_OK)
    }

    /// Releases GPU message `m` (Python's release or its last view): on the GPU where this
    /// consumer does, else after its streams' events. Under the channel's lock.
    pub(super) fn release_gpu(
        channel: &Py<Channel>,
        py: Python<'_>,
        m: &Msg,
        streams: &[usize],
        device: i32,
    ) -> PyResult<()> {
        let this = channel.get();
        if this.releases_on_gpu() {
            let mut core = this.lock(py);
            this.drain_pending(&mut core);
            if core.ptr.0.is_null() {
                // Closed and freed: nothing to give back.
                this.outstanding.fetch_sub(1, Ordering::AcqRel);
                return Ok(());
            }
            if let Some(status) = this.release_on_gpu_locked(core.ptr, m, streams, device) {
                this.outstanding.fetch_sub(1, Ordering::AcqRel);
                this.free_if_done(&mut core);
                return check(status);
            }
        }
        if streams.is_empty() {
            IMMEDIATE.fetch_add(1, Ordering::Relaxed);
            this.release_message(py, m)
        } else {
            Channel::release_after(channel, py, m, streams, device)
        }
    }

    /// As `release_gpu`, for a message being garbage-collected: never waits for the channel's
    /// lock (the next call on the channel releases it when another thread holds it).
    pub(super) fn release_gpu_in_finalizer(
        channel: &Py<Channel>,
        py: Python<'_>,
        m: Msg,
        streams: &[usize],
        device: i32,
    ) {
        let this = channel.get();
        if this.releases_on_gpu() {
            match this.core.try_lock() {
                Ok(mut core) => {
                    let done =
                        core.ptr.0.is_null() || this.release_on_gpu_locked(core.ptr, &m, streams, device).is_some();
                    if done {
                        this.outstanding.fetch_sub(1, Ordering::AcqRel);
                        this.drain_pending(&mut core);
                        return;
                    }
                }
                Err(_) => {
                    this.defer(Deferred::ReleaseGpu(m, streams.to_vec(), device));
                    return;
                }
            }
        }
        if streams.is_empty() {
            this.run_or_defer(Deferred::Release(m));
        } else {
            Channel::release_after_in_finalizer(channel, py, m, streams, device);
        }
    }

    /// A producer's GPU buffer went out as `seq` (for `wait_completed`); `device` finds its
    /// CUDA device the first time. Noted only where the producer asked for a released semaphore.
    pub(super) fn note_gpu_sent(&self, seq: u64, device: impl FnOnce() -> PyResult<i32>) {
        let mut g = self.release_state();
        if !g.producer_released {
            return;
        }
        if g.device.is_none() {
            // Without CUDA here there is nothing to wait for on a CUDA stream, and no consumer
            // of this producer's device releases on the GPU either (that takes CUDA as well).
            match device() {
                Ok(d) => g.device = Some(d),
                Err(_) => return,
            }
        }
        g.gpu_sent.push(seq);
    }

    /// Makes `stream` (None: this thread, on the host) wait until the consumer's GPU work on
    /// message `seq` (released on the host already) is done: the released semaphore's value
    /// that covers the last GPU buffer sent at or before `seq`. Nothing where none was sent, or
    /// where the channel has no released semaphore (the consumer then releases only after its
    /// work).
    pub(super) fn wait_released(&self, py: Python<'_>, seq: u64, stream: Option<CuStream>) -> PyResult<()> {
        let (value, device) = {
            let g = self.release_state();
            let Some(last) = g.gpu_sent.last_at_or_before(seq) else { return Ok(()) };
            (last + 1, g.device)
        };
        let Some(device) = device else { return Ok(()) };
        let own = self.release_state().own.clone();
        let semaphore = match own {
            Some(s) => s,
            None => {
                let s = self.quick(py, |ch| released_semaphore(ch, device))?;
                self.release_state().own.get_or_insert(s).clone()
            }
        };
        match (semaphore, stream) {
            (Some(s), Some(stream)) => s.wait(value, stream),
            (Some(s), None) => {
                // On the host: a stream of lava-flow's own would do as well; the legacy one
                // needs none, and this is the slow path of a producer that passed no stream.
                s.wait(value, LEGACY as CuStream)?;
                let done = Event::record(device, LEGACY as CuStream)?;
                py.allow_threads(|| done.wait());
                Ok(())
            }
            (None, _) => Ok(()),
        }
    }
}

/// Runs of GPU buffers sent (first and last sequence number), oldest first: one run while
/// every send is a GPU buffer. Beyond `MAX_RUNS` the oldest go, and a question about them is
/// answered with the last one that went: a later message, whose released value is larger, so
/// that a wait for it waits no less.
#[derive(Default)]
struct GpuSends {
    runs: VecDeque<(u64, u64)>,
    forgotten: Option<u64>,
}

const MAX_RUNS: usize = 1024;

impl GpuSends {
    fn push(&mut self, seq: u64) {
        match self.runs.back_mut() {
            Some((_, last)) if *last + 1 == seq => *last = seq,
            _ => {
                if self.runs.len() == MAX_RUNS {
                    self.forgotten = self.runs.pop_front().map(|(_, last)| last);
                }
                self.runs.push_back((seq, seq));
            }
        }
    }

    /// The last GPU buffer sent as `seq` or before it.
    fn last_at_or_before(&self, seq: u64) -> Option<u64> {
        match self.runs.iter().rev().find(|(first, _)| *first <= seq) {
            Some(&(_, last)) => Some(last.min(seq)),
            None => self.forgotten.filter(|_| self.runs.front().is_some_and(|(first, _)| *first > seq)),
        }
    }
}

/// The channel's released semaphore (a consumer's: its producer's), imported into CUDA on
/// `device`; None where the channel has none.
fn released_semaphore(ch: Ptr<ffi::lf_channel>, device: i32) -> PyResult<Option<Arc<Semaphore>>> {
    let mut fd: c_int = -1;
    // SAFETY: live channel under its lock, local out-parameter.
    match unsafe { lib().lf_channel_released_semaphore(ch.0, &mut fd) } {
        ffi::LF_ERR_UNSUPPORTED => Ok(None),
        status => {
            check(status)?;
            Ok(Some(Arc::new(Semaphore::import(fd, device)?)))
        }
    }
}

/// Waits on the host until the work queued on `stream` so far is done (the whole device where
/// no event can be recorded there).
fn wait_for(device: i32, stream: usize) {
    match Event::record(device, stream as CuStream) {
        Ok(e) => e.wait(),
        Err(_) => cuda::synchronize(device),
    }
}

#[cfg(test)]
mod tests {
    use super::{GpuSends, MAX_RUNS};

    #[test]
    fn a_wait_covers_the_last_gpu_buffer_sent_at_or_before_it() {
        let mut g = GpuSends::default();
        assert_eq!(g.last_at_or_before(5), None, "nothing sent");
        // 0..=9 GPU buffers, 10 and 11 bytes, 12 a GPU buffer.
        (0..10).chain([12]).for_each(|s| g.push(s));
        assert_eq!(g.runs.len(), 2, "consecutive sends are one run");
        assert_eq!(g.last_at_or_before(4), Some(4));
        assert_eq!(g.last_at_or_before(11), Some(9), "bytes messages have no GPU work to wait for");
        assert_eq!(g.last_at_or_before(12), Some(12));
        assert_eq!(g.last_at_or_before(100), Some(12));
    }

    #[test]
    fn forgotten_runs_are_answered_with_a_later_message() {
        let mut g = GpuSends::default();
        for i in 0..(MAX_RUNS as u64 + 2) {
            g.push(2 * i); // every other message: a run each
        }
        assert_eq!(g.runs.len(), MAX_RUNS);
        assert_eq!(g.forgotten, Some(2));
        assert_eq!(g.last_at_or_before(1), Some(2), "forgotten: the last that went, no earlier");
        assert_eq!(g.last_at_or_before(5), Some(4));
        assert_eq!(g.last_at_or_before(u64::MAX), Some(2 * (MAX_RUNS as u64 + 1)));
    }
}
