//! The C handle of a [`Channel`] and how calls on it run: under the channel's lock, blocking
//! ones in slices with the GIL released, releases from finalizers deferred to the next call,
//! and the handle freed once the channel is closed and nothing of it is left.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use super::Channel;
use crate::cuda::Event;
use crate::error::{check, error, invalid_state, make};
use crate::ffi;
use crate::native::{lib, timeout_ns, Ptr};

/// The longest a blocking call waits before checking for signals (but see `Channel::slice_ns`).
pub(super) const SLICE_NS: i64 = 100_000_000;

/// How long one slice of a blocking call waits while releases wait for the GPU (`gpu`).
pub(super) const GPU_POLL_NS: i64 = 10_000;

/// A received message, movable across threads (its pointer is into shared memory).
#[derive(Clone, Copy)]
pub(super) struct Msg(pub(super) ffi::lf_message);
// SAFETY: the message is plain data; its memory stays mapped while the channel lives.
unsafe impl Send for Msg {}
// SAFETY: as Send; it is never written through.
unsafe impl Sync for Msg {}

#[derive(Clone, Copy)]
pub(super) struct LoanRegion(pub(super) ffi::lf_loan_region);
// SAFETY: as Msg.
unsafe impl Send for LoanRegion {}
// SAFETY: as Msg.
unsafe impl Sync for LoanRegion {}

/// What a finalizer could not do because another thread held the channel: done by the next call.
pub(super) enum Deferred {
    /// A garbage-collected message, to release.
    Release(Msg),
    /// A released GPU message that the consumer's streams may still read: released once each
    /// event is done (see `gpu`).
    ReleaseAfter(Msg, Vec<Arc<Event>>),
    /// A garbage-collected GPU message of a consumer that releases on the GPU, with the
    /// streams of its views and their device (see `gpu_release`).
    ReleaseGpu(Msg, Vec<usize>, i32),
    /// A garbage-collected loan, neither published nor cancelled, to give back.
    CancelLoan(LoanRegion),
}

impl Deferred {
    /// Whether it may run now.
    fn due(&self) -> bool {
        match self {
            Deferred::ReleaseAfter(_, events) => events.iter().all(|e| e.done()),
            _ => true,
        }
    }

    /// Waits until it may run (the channel is going away).
    fn wait(&self) {
        if let Deferred::ReleaseAfter(_, events) = self {
            events.iter().for_each(|e| e.wait());
        }
    }

    /// Does it on the live channel `ch`.
    fn run(self, ch: Ptr<ffi::lf_channel>) {
        match self {
            // SAFETY: a message received on this live channel, released once.
            Deferred::Release(m) | Deferred::ReleaseAfter(m, _) | Deferred::ReleaseGpu(m, ..) => unsafe {
                lib().lf_release(ch.0, &m.0)
            },
            // SAFETY: the outstanding loan of this live channel, given back once.
            Deferred::CancelLoan(r) => unsafe { lib().lf_loan_cancel(ch.0, &r.0) },
        };
    }
}

pub(super) struct Core {
    pub(super) ptr: Ptr<ffi::lf_channel>,
    pub(super) closed: bool,
}

impl Channel {
    /// Takes the channel's call lock, waiting with the GIL released if another thread has it.
    pub(super) fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Core> {
        loop {
            match self.core.try_lock() {
                Ok(g) => return g,
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(TryLockError::WouldBlock) => py.allow_threads(|| drop(self.core.lock())),
            }
        }
    }

    /// The live handle under the lock, after releasing messages collected meanwhile.
    fn open(&self, core: &mut Core) -> PyResult<Ptr<ffi::lf_channel>> {
        if core.closed {
            return Err(invalid_state(&format!("channel {:?} is closed", self.name)));
        }
        self.drain_pending(core);
        Ok(core.ptr)
    }

    pub(super) fn drain_pending(&self, core: &mut Core) {
        if self.has_pending.swap(false, Ordering::AcqRel) {
            let deferred = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
            let mut waiting = Vec::new();
            for d in deferred {
                if !d.due() {
                    waiting.push(d);
                    continue;
                }
                if let Deferred::ReleaseGpu(m, streams, device) = &d {
                    if core.ptr.0.is_null() || self.release_on_gpu_locked(core.ptr, m, streams, *device).is_some() {
                        self.outstanding.fetch_sub(1, Ordering::AcqRel);
                        continue;
                    }
                    // The producer has no released semaphore: after its streams' events.
                    match super::gpu::record(streams, *device) {
                        Some(events) if !events.iter().all(|e| e.done()) => {
                            self.gpu_waiting.fetch_add(1, Ordering::AcqRel);
                            waiting.push(Deferred::ReleaseAfter(*m, events));
                            continue;
                        }
                        _ => {}
                    }
                }
                if matches!(d, Deferred::ReleaseAfter(..)) {
                    self.gpu_waiting.fetch_sub(1, Ordering::AcqRel);
                }
                if !core.ptr.0.is_null() {
                    d.run(core.ptr);
                }
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
            }
            if !waiting.is_empty() {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).extend(waiting);
                self.has_pending.store(true, Ordering::Release);
            }
        }
        self.free_if_done(core);
    }

    /// Frees the handle once closed and nothing of it is left.
    pub(super) fn free_if_done(&self, core: &mut Core) {
        if core.closed && !core.ptr.0.is_null() && self.outstanding.load(Ordering::Acquire) == 0 {
            // SAFETY: ours, nothing uses it any more (we hold the lock), freed once.
            unsafe { lib().lf_channel_free(core.ptr.0) };
            core.ptr = Ptr(std::ptr::null_mut());
            self.forget_gpu();
        }
    }

    /// Runs a blocking call in slices (checking signals between them), under the lock with the
    /// GIL released. `f` gets the channel and the slice's timeout in ns.
    pub(super) fn blocking<R: Send>(
        &self,
        py: Python<'_>,
        what: &str,
        timeout: Option<f64>,
        mut f: impl FnMut(Ptr<ffi::lf_channel>, i64) -> (ffi::lf_status, R) + Send,
    ) -> PyResult<R> {
        let total = timeout_ns(timeout)?;
        let deadline = (total >= 0).then(|| Instant::now() + Duration::from_nanos(total as u64));
        loop {
            // While releases wait for the GPU, short slices: the next one hands them back.
            let longest = if self.gpu_waiting.load(Ordering::Acquire) > 0 {
                self.slice_ns.min(GPU_POLL_NS)
            } else {
                self.slice_ns
            };
            let slice = match deadline {
                None => longest,
                Some(d) => (d.saturating_duration_since(Instant::now()).as_nanos() as i64).min(longest),
            };
            let mut core = self.lock(py);
            let ch = self.open(&mut core)?;
            let (status, r) = py.allow_threads(|| f(ch, slice));
            if status == ffi::LF_OK {
                return Ok(r);
            }
            if status != ffi::LF_ERR_TIMEOUT || total == 0 {
                return Err(error(status));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                if total <= longest {
                    return Err(error(status));
                }
                return Err(make(
                    status,
                    "LF_ERR_TIMEOUT",
                    &format!("{what} on channel {:?} timed out after {} s", self.name, total as f64 / 1e9),
                ));
            }
            drop(core);
            py.check_signals()?;
        }
    }

    /// Runs a quick call under the lock (the GIL kept).
    pub(super) fn quick<R>(&self, py: Python<'_>, f: impl FnOnce(Ptr<ffi::lf_channel>) -> PyResult<R>) -> PyResult<R> {
        let mut core = self.lock(py);
        let ch = self.open(&mut core)?;
        f(ch)
    }

    /// Releases a message (explicitly or at its last view): under the lock, even after close().
    pub(super) fn release_message(&self, py: Python<'_>, m: &Msg) -> PyResult<()> {
        let mut core = self.lock(py);
        self.drain_pending(&mut core);
        let status = if core.ptr.0.is_null() {
            ffi::LF_OK
        } else {
            // SAFETY: a message received on this live channel, released once.
            unsafe { lib().lf_release(core.ptr.0, &m.0) }
        };
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.free_if_done(&mut core);
        check(status)
    }

    /// Leaves `d` to the next call on the channel (another thread holds it).
    pub(super) fn defer(&self, d: Deferred) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(d);
        self.has_pending.store(true, Ordering::Release);
    }

    /// Releases a message or cancels a loan being garbage-collected: now if the channel is
    /// free, else by the next call on it (a finalizer must not wait for another thread).
    pub(super) fn run_or_defer(&self, d: Deferred) {
        match self.core.try_lock() {
            Ok(mut core) => {
                if !core.ptr.0.is_null() {
                    d.run(core.ptr);
                }
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                self.drain_pending(&mut core);
            }
            Err(_) => {
                self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(d);
                self.has_pending.store(true, Ordering::Release);
            }
        }
    }

    /// A new fd of the channel's ready semaphore (for CUDA's waits on GPU messages).
    pub fn ready_semaphore_fd(&self, py: Python<'_>) -> PyResult<c_int> {
        self.quick(py, |ch| {
            let mut fd: c_int = -1;
            // SAFETY: live channel, local out-parameter.
            check(unsafe { lib().lf_channel_ready_semaphore(ch.0, &mut fd) })?;
            Ok(fd)
        })
    }

    /// A new fd of the ready semaphore of the producer in slot `producer`, which a GPU
    /// message's ready value counts on: a fan-in's producers each have their own (on a pair
    /// channel, slot 0 is its producer's, the channel's).
    pub fn producer_ready_semaphore_fd(&self, py: Python<'_>, producer: u32) -> PyResult<c_int> {
        self.quick(py, |ch| {
            let mut fd: c_int = -1;
            // SAFETY: live channel, local out-parameter.
            check(unsafe { lib().lf_channel_producer_ready_semaphore(ch.0, producer, &mut fd) })?;
            Ok(fd)
        })
    }

    pub(super) fn finish_loan(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Ptr<ffi::lf_channel>) -> ffi::lf_status,
    ) -> PyResult<()> {
        let mut core = self.lock(py);
        let status = if core.ptr.0.is_null() { ffi::LF_OK } else { f(core.ptr) };
        self.free_if_done(&mut core);
        check(status)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let ptr = {
            let core = self.core.get_mut().unwrap_or_else(|e| e.into_inner());
            core.closed = true;
            core.ptr
        };
        if !ptr.0.is_null() {
            for d in std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner())) {
                if let Deferred::ReleaseGpu(m, streams, device) = &d {
                    if self.release_on_gpu_locked(ptr, m, streams, *device).is_some() {
                        continue;
                    }
                    crate::cuda::synchronize(*device);
                }
                // The producer may reuse the memory once released: the consumer's streams end first.
                d.wait();
                d.run(ptr);
            }
            // SAFETY: no message or loan refers to the channel any more (they hold it alive).
            unsafe { lib().lf_channel_free(ptr.0) };
            self.core.get_mut().unwrap_or_else(|e| e.into_inner()).ptr = Ptr(std::ptr::null_mut());
        }
        // The tensors still sent: the channel that could report their release is gone.
        let context = self.context.get();
        self.sent.get_mut().unwrap_or_else(|e| e.into_inner()).clear(context);
        self.forget_gpu();
    }
}
