//! A channel's GPU messages in CUDA: the ready semaphores imported once per producer, the
//! stream-ordered send of a GPU buffer, and the release of a GPU message after the consumer's
//! streams are done with it.
//!
//! Releasing without a device-wide synchronise. `__dlpack__(stream=S)` promises that the
//! consumer uses the tensor on S; lava-flow makes S wait for the payload (the producer's ready
//! semaphore) and notes S on the message. When the message is released (and no view of it is
//! left), each noted stream is asked whether its work is all done (`cuStreamQuery`): if so the
//! message goes back to the producer at once. Otherwise an event is recorded on each noted
//! stream; if every event is already done the message goes back at once; otherwise the
//! release is deferred, not waited for: the
//! Python thread goes on, and the message goes back once its events are done, through whichever
//! comes first:
//! - the next call on the channel (every call first releases what is due; a blocking call
//!   waits in short slices while releases are deferred, so a consumer waiting in `recv` hands
//!   them back within those slices);
//! - the release thread (one per process, started at the first deferred release), which
//!   sleeps on the events and hands the messages back when the channel is free.
//!
//! This is the path of consumers that did not ask to release on the GPU, or whose producer has
//! no released semaphore: the producer's `wait_completed` returns only once the consumer's
//! stream work queued before the release is done. A consumer made with
//! `released_semaphore=True` whose producer has one releases at once instead and signals the
//! producer's released semaphore on its stream (`gpu_release`): no event, no deferral. A DLPack request with
//! `stream=None` means the legacy default stream (which orders after every blocking stream);
//! `stream=-1` asks for no synchronisation at all: the consumer orders its work itself and
//! the release is immediate. Views on the per-thread default stream (`stream=2`) are recorded
//! on the releasing thread's.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock, TryLockError};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::gpu_release::{DEFERRED, IMMEDIATE};
use super::handle::{Deferred, Msg};
use super::Channel;
use crate::buffer::Buffer;
use crate::cuda::{self, CuStream, Event, Semaphore};
use crate::ffi;
use crate::native::{lib, Ptr};

/// A channel's CUDA state, made as GPU messages come and go.
#[derive(Default)]
pub(super) struct GpuState {
    /// A consumer's producers' ready semaphores, by producer slot.
    ready: Vec<(u32, Arc<Semaphore>)>,
    /// A producer's own ready semaphore, which its streams signal.
    own: Option<Arc<Semaphore>>,
    /// The last ready value this producer sent (values must grow).
    last_value: u64,
    /// Why this producer's CUDA tensors are synchronised on the host (the channel shares no
    /// ready semaphore that CUDA work on their GPU can signal), once found.
    tensors_on_host: Option<String>,
}

impl Channel {
    /// The channel's id in this process (unique, never reused).
    pub fn id(&self) -> u64 {
        self.id
    }

    fn gpu_state(&self) -> std::sync::MutexGuard<'_, GpuState> {
        self.gpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ready semaphore of the producer in `slot`, imported into CUDA on `device` once.
    pub fn ready_semaphore_for(&self, py: Python<'_>, slot: u32, device: i32) -> PyResult<Arc<Semaphore>> {
        if let Some((_, s)) = self.gpu_state().ready.iter().find(|(p, s)| *p == slot && s.device() == device) {
            return Ok(s.clone());
        }
        // Not under the state's lock: the fd comes under the channel's, which is taken first
        // elsewhere.
        let fd = self.producer_ready_semaphore_fd(py, slot)?;
        let sem = Arc::new(Semaphore::import(fd, device)?);
        let mut g = self.gpu_state();
        if let Some((_, s)) = g.ready.iter().find(|(p, s)| *p == slot && s.device() == device) {
            return Ok(s.clone());
        }
        g.ready.push((slot, sem.clone()));
        Ok(sem)
    }

    /// The producer in `slot` (None: every one) has gone: a new one brings a new semaphore.
    pub(super) fn forget_producer(&self, slot: Option<u32>) {
        self.forget_released();
        let gone: Vec<_> = {
            let mut g = self.gpu_state();
            let (gone, kept) =
                std::mem::take(&mut g.ready).into_iter().partition(|(p, _)| slot.map_or(true, |s| s == *p));
            g.ready = kept;
            gone
        };
        drop(gone);
    }

    /// What the channel holds in CUDA goes (the channel is freed).
    pub(super) fn forget_gpu(&self) {
        let state = std::mem::take(&mut *self.gpu_state());
        drop(state);
        cuda::forget_channel(self.id);
    }

    /// Signals this producer's ready semaphore to the next value on `stream`, under the
    /// channel's lock (so that values reach the channel in the order they grow); returns it.
    /// Sends `len` bytes at `offset` of buffer `buffer` (`what` names the call in errors):
    /// with `ready_value` where the caller's work signals it, or `ordered` on a stream, the
    /// channel's ready semaphore signalled there once, under the channel's lock, so that values
    /// reach it in order; else complete now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_ordered(
        &self,
        py: Python<'_>,
        what: &str,
        buffer: Ptr<ffi::lf_buffer>,
        offset: usize,
        len: usize,
        timeout: Option<f64>,
        ready_value: Option<u64>,
        ordered: Option<&(Arc<Semaphore>, Ptr<c_void>)>,
    ) -> PyResult<u64> {
        let mut value = ready_value;
        let mut failed = None;
        self.blocking(py, what, timeout, |ch, t| {
            if let (None, Some((sem, s))) = (value, ordered) {
                match self.signal_ready(sem, s.get()) {
                    Ok(v) => value = Some(v),
                    Err(e) => {
                        failed = Some(e);
                        return (ffi::LF_ERR_INVALID_ARGUMENT, 0);
                    }
                }
            }
            let mut seq = 0u64;
            // SAFETY: a live channel, and a buffer the caller keeps alive for the call.
            let s = unsafe {
                match value {
                    None => lib().lf_send_buffer(ch.get(), buffer.get(), offset, len, t, &mut seq),
                    Some(v) => lib().lf_send_buffer_after(ch.get(), buffer.get(), offset, len, v, t, &mut seq),
                }
            };
            (s, seq)
        })
        .map_err(|e| failed.take().unwrap_or(e))
    }

    pub(super) fn signal_ready(&self, sem: &Semaphore, stream: CuStream) -> PyResult<u64> {
        let mut g = self.gpu_state();
        let value = g.last_value + 1;
        sem.signal(value, stream)?;
        g.last_value = value;
        Ok(value)
    }

    /// Notes a ready value the caller's own GPU work signals.
    pub(super) fn note_ready_value(&self, value: u64) {
        let mut g = self.gpu_state();
        g.last_value = g.last_value.max(value);
    }

    /// This producer's ready semaphore in CUDA, on the device of GPU buffer `buffer`.
    pub(super) fn own_semaphore(&self, py: Python<'_>, buffer: &Buffer) -> PyResult<Arc<Semaphore>> {
        if let Some(s) = self.gpu_state().own.clone() {
            return Ok(s);
        }
        let device = buffer_device(buffer)?;
        let fd = self.ready_semaphore_fd(py)?;
        let sem = Arc::new(Semaphore::import(fd, device)?);
        Ok(self.gpu_state().own.get_or_insert(sem).clone())
    }

    /// This producer's ready semaphore in CUDA for a tensor on CUDA device `device`, imported
    /// once per channel, or why the tensor's send is synchronised on the host instead: the
    /// channel shares no ready semaphore with its consumer (no GPU route between them that
    /// shares one), or the semaphore is another GPU's (CUDA signals it only on its own).
    pub(super) fn tensor_semaphore(&self, py: Python<'_>, device: i32) -> Result<Arc<Semaphore>, String> {
        {
            let g = self.gpu_state();
            if let Some(why) = &g.tensors_on_host {
                return Err(why.clone());
            }
            if let Some(s) = g.own.as_ref().filter(|s| s.device() == device) {
                return Ok(s.clone());
            }
        }
        let found = self.import_tensor_semaphore(py, device);
        let mut g = self.gpu_state();
        match found {
            Ok(sem) => Ok(g.own.get_or_insert(sem).clone()),
            // Another device's tensor may go stream-ordered yet: only the channel's own lack is kept.
            Err((why, lasting)) => {
                if lasting {
                    g.tensors_on_host = Some(why.clone());
                }
                Err(why)
            }
        }
    }

    /// Imports the channel's ready semaphore on CUDA device `device`, the GPU of the channel's
    /// context; or why not, and whether that holds for every tensor.
    fn import_tensor_semaphore(&self, py: Python<'_>, device: i32) -> Result<Arc<Semaphore>, (String, bool)> {
        let mut info = crate::ffi::lf_device_info::default();
        #[cfg(lf_struct_size)]
        {
            info.struct_size = std::mem::size_of_val(&info) as u32;
        }
        // SAFETY: live context, local out-parameter.
        let status = unsafe { crate::native::lib().lf_context_device_info(self.context.get().ptr().get(), &mut info) };
        if status != crate::ffi::LF_OK {
            return Err(("the channel's context has no GPU, so the channel has no ready semaphore".into(), true));
        }
        let semaphore_device = cuda::device_of(&info.device_uuid).map_err(|e| {
            (format!("the GPU of the channel's context, which owns its ready semaphore, is no CUDA device: {e}"), true)
        })?;
        if semaphore_device != device {
            return Err((
                format!(
                    "the tensor is on CUDA device {device}, the channel's ready semaphore on CUDA device \
                     {semaphore_device} (its context's GPU)"
                ),
                false,
            ));
        }
        let fd = self.ready_semaphore_fd(py).map_err(|e| (e.to_string(), true))?;
        Semaphore::import(fd, device).map(Arc::new).map_err(|e| (e.to_string(), true))
    }

    /// Releases GPU message `m` once the work queued so far on `streams` (of `device`) is done:
    /// at once if it is, else deferred (see the module's doc).
    pub(super) fn release_after(
        channel: &Py<Channel>,
        py: Python<'_>,
        m: &Msg,
        streams: &[usize],
        device: i32,
    ) -> PyResult<()> {
        let this = channel.get();
        match busy_events(streams, device) {
            Some(events) if !events.iter().all(|e| e.done()) => {
                this.defer_after(channel.clone_ref(py), *m, events);
                Ok(())
            }
            _ => {
                IMMEDIATE.fetch_add(1, Ordering::Relaxed);
                this.release_message(py, m)
            }
        }
    }

    /// As `release_after`, for a message being garbage-collected (never waits for the lock).
    pub(super) fn release_after_in_finalizer(
        channel: &Py<Channel>,
        py: Python<'_>,
        m: Msg,
        streams: &[usize],
        device: i32,
    ) {
        let this = channel.get();
        match busy_events(streams, device) {
            Some(events) if !events.iter().all(|e| e.done()) => {
                this.defer_after(channel.clone_ref(py), m, events);
            }
            _ => {
                IMMEDIATE.fetch_add(1, Ordering::Relaxed);
                this.run_or_defer(Deferred::Release(m))
            }
        }
    }

    fn defer_after(&self, channel: Py<Channel>, m: Msg, events: Vec<Arc<Event>>) {
        DEFERRED.fetch_add(1, Ordering::Relaxed);
        self.gpu_waiting.fetch_add(1, Ordering::AcqRel);
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Deferred::ReleaseAfter(m, events.clone()));
        self.has_pending.store(true, Ordering::Release);
        reaper().push(channel, events);
    }
}

/// The CUDA device of GPU buffer `buffer`.
pub(super) fn buffer_device(buffer: &Buffer) -> PyResult<i32> {
    let e = buffer.export_record()?;
    // SAFETY: the export's fd is ours; only its device UUID is needed.
    unsafe { libc::close(e.fd) };
    cuda::device_of(&e.device_uuid)
}

/// Events after the work queued on `streams`, where any has work left (None where all are
/// idle: the message's users are done with it, as far as the GPU goes, and it is released at
/// once without recording an event).
fn busy_events(streams: &[usize], device: i32) -> Option<Vec<Arc<Event>>> {
    if cuda::streams_idle(device, streams) {
        return None;
    }
    record(streams, device)
}

/// Events after the work queued on `streams`; None where one could not be recorded (an invalid
/// stream, a broken context), after waiting for the whole device instead (the one place a
/// release synchronises, for a stream CUDA refuses).
pub(super) fn record(streams: &[usize], device: i32) -> Option<Vec<Arc<Event>>> {
    let mut events = Vec::with_capacity(streams.len());
    for &s in streams {
        match Event::record(device, s as CuStream) {
            Ok(e) => events.push(Arc::new(e)),
            Err(_) => {
                cuda::synchronize(device);
                return None;
            }
        }
    }
    Some(events)
}

/// The stream argument of a stream-ordered send: an int (`cudaStream_t`, 0 the legacy
/// default stream), or a stream object with `cuda_stream` (PyTorch) or `ptr` (CuPy).
pub(super) fn stream_handle(stream: &Bound<'_, PyAny>) -> PyResult<CuStream> {
    if let Ok(s) = stream.extract::<usize>() {
        return Ok(s as CuStream);
    }
    for attr in ["cuda_stream", "ptr"] {
        if let Ok(s) = stream.getattr(attr).and_then(|s| s.extract::<usize>()) {
            return Ok(s as CuStream);
        }
    }
    Err(PyValueError::new_err(format!(
        "stream must be a CUDA stream: an int (cudaStream_t), a torch.cuda.Stream or a cupy Stream, not {}",
        stream.get_type().name().map(|n| n.to_string()).unwrap_or_default()
    )))
}

/// A channel with a deferred release, and the events that release waits on.
type Due = (Py<Channel>, Vec<Arc<Event>>);

/// The release thread's queue.
struct Reaper {
    queue: Mutex<VecDeque<Due>>,
    wake: Condvar,
}

static REAPER: OnceLock<Arc<Reaper>> = OnceLock::new();

fn reaper() -> &'static Reaper {
    REAPER.get_or_init(|| {
        let r = Arc::new(Reaper { queue: Mutex::new(VecDeque::new()), wake: Condvar::new() });
        let mine = r.clone();
        // Without it, a consumer that releases and then stops calling lava-flow would keep the
        // producer waiting; a thread that cannot start leaves that to the channel's next call.
        let _ = std::thread::Builder::new().name("lava-flow-release".into()).spawn(move || mine.run());
        r
    })
}

impl Reaper {
    fn push(&self, channel: Py<Channel>, events: Vec<Arc<Event>>) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push_back((channel, events));
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let (channel, events) = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    match q.pop_front() {
                        Some(item) => break item,
                        None => q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner()),
                    }
                }
            };
            for e in &events {
                e.wait();
            }
            // A frozen, Sync pyclass: its fields are reachable without the GIL.
            let this = channel.get();
            loop {
                match this.core.try_lock() {
                    Ok(mut core) => {
                        this.drain_pending(&mut core);
                        break;
                    }
                    Err(TryLockError::Poisoned(p)) => {
                        this.drain_pending(&mut p.into_inner());
                        break;
                    }
                    // The holder releases what is due itself (its blocking calls wait in short
                    // slices meanwhile); try again until every deferred release went.
                    Err(TryLockError::WouldBlock) if this.gpu_waiting.load(Ordering::Acquire) > 0 => {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(TryLockError::WouldBlock) => break,
                }
            }
            // Dropped without the GIL: Python decrements the count at its next chance.
            drop(channel);
        }
    }
}
