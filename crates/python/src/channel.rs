//! `Channel` (one end of a lava-flow channel), `Message` (a received view into shared memory)
//! and `Loan` (room in the channel to write the next message in place).
//!
//! Every C call on a channel runs under the channel's lock, so that Python threads may share a
//! channel (lava-flow takes one thread at a time per channel). Blocking calls release the GIL
//! and wait in slices of at most 100 ms, checking for signals (Ctrl-C) in between. A message
//! is released (`lf_release`) once it was released in Python (`release()`, the end of a `with`
//! block, or garbage collection) and no view of it is left; closing the channel is deferred
//! until every message and loan of it is released, so that no view outlives its memory.
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::buffer::Buffer;
use crate::context::Context;
use crate::error::{check, error, invalid_state, make};
use crate::ffi;
use crate::location::Location;
use crate::native::{cstring, lib, string, timeout_ns, Ptr};
use crate::pybuf::{self, Borrowed};

/// The longest a blocking call waits before checking for signals.
const SLICE_NS: i64 = 100_000_000;

/// A received message, movable across threads (its pointer is into shared memory).
#[derive(Clone, Copy)]
struct Msg(ffi::lf_message);
// SAFETY: the message is plain data; its memory stays mapped while the channel lives.
unsafe impl Send for Msg {}
// SAFETY: as Send; it is never written through.
unsafe impl Sync for Msg {}

#[derive(Clone, Copy)]
struct LoanRegion(ffi::lf_loan_region);
// SAFETY: as Msg.
unsafe impl Send for LoanRegion {}
// SAFETY: as Msg.
unsafe impl Sync for LoanRegion {}

/// What a finalizer could not do because another thread held the channel: done by the next call.
enum Deferred {
    /// A garbage-collected message, to release.
    Release(Msg),
    /// A garbage-collected loan, neither published nor cancelled, to give back.
    CancelLoan(LoanRegion),
}

impl Deferred {
    /// Does it on the live channel `ch`.
    fn run(self, ch: Ptr<ffi::lf_channel>) {
        match self {
            // SAFETY: a message received on this live channel, released once.
            Deferred::Release(m) => unsafe { lib().lf_release(ch.0, &m.0) },
            // SAFETY: the outstanding loan of this live channel, given back once.
            Deferred::CancelLoan(r) => unsafe { lib().lf_loan_cancel(ch.0, &r.0) },
        };
    }
}

struct Core {
    ptr: Ptr<ffi::lf_channel>,
    closed: bool,
}

/// One end of a channel: `Channel(context, name, role, ...)` creates it and waits for the peer.
///
/// `role` is "producer" or "consumer". Keywords set the channel config (`capacity`,
/// `pool_size`, `wait` (a `lava_flow.Wait`), `spin_ns`, `rendezvous_timeout` in seconds,
/// `auto_zero_copy`, `strict_gpu`, `released_semaphore`, `prefault`), the rest keeping
/// lava-flow's defaults; `my_location` and `peer_location` (Locations) choose the transport.
#[pyclass(frozen, subclass, module = "lava_flow")]
pub struct Channel {
    core: Mutex<Core>,
    /// Messages and loans not yet released: the channel is freed once this is 0 after close().
    outstanding: AtomicUsize,
    /// Messages and loans garbage-collected while another thread held the channel, released
    /// (cancelled) by the next call; each still counts in `outstanding` until then.
    pending: Mutex<Vec<Deferred>>,
    has_pending: AtomicBool,
    role: u32,
    name: String,
}

/// `lf_channel_config` with lava-flow's defaults (every config starts from the library's).
fn default_config() -> PyResult<ffi::lf_channel_config> {
    let mut c = ffi::lf_channel_config::default();
    // SAFETY: writable local (of the size given).
    #[cfg(lf_struct_size)]
    check(unsafe { lib().lf_channel_config_init(&mut c, std::mem::size_of_val(&c)) })?;
    #[cfg(not(lf_struct_size))]
    check(unsafe { lib().lf_channel_config_default(&mut c) })?;
    Ok(c)
}

impl Channel {
    /// Takes the channel's call lock, waiting with the GIL released if another thread has it.
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Core> {
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

    fn drain_pending(&self, core: &mut Core) {
        if self.has_pending.swap(false, Ordering::AcqRel) {
            let deferred = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
            for d in deferred {
                if !core.ptr.0.is_null() {
                    d.run(core.ptr);
                }
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.free_if_done(core);
    }

    /// Frees the handle once closed and nothing of it is left.
    fn free_if_done(&self, core: &mut Core) {
        if core.closed && !core.ptr.0.is_null() && self.outstanding.load(Ordering::Acquire) == 0 {
            // SAFETY: ours, nothing uses it any more (we hold the lock), freed once.
            unsafe { lib().lf_channel_free(core.ptr.0) };
            core.ptr = Ptr(std::ptr::null_mut());
        }
    }

    /// Runs a blocking call in slices (checking signals between them), under the lock with the
    /// GIL released. `f` gets the channel and the slice's timeout in ns.
    fn blocking<R: Send>(
        &self,
        py: Python<'_>,
        what: &str,
        timeout: Option<f64>,
        mut f: impl FnMut(Ptr<ffi::lf_channel>, i64) -> (ffi::lf_status, R) + Send,
    ) -> PyResult<R> {
        let total = timeout_ns(timeout)?;
        let deadline = (total >= 0).then(|| Instant::now() + Duration::from_nanos(total as u64));
        loop {
            let slice = match deadline {
                None => SLICE_NS,
                Some(d) => (d.saturating_duration_since(Instant::now()).as_nanos() as i64).min(SLICE_NS),
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
                if total <= SLICE_NS {
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
    fn quick<R>(&self, py: Python<'_>, f: impl FnOnce(Ptr<ffi::lf_channel>) -> PyResult<R>) -> PyResult<R> {
        let mut core = self.lock(py);
        let ch = self.open(&mut core)?;
        f(ch)
    }

    /// Releases a message (explicitly or at its last view): under the lock, even after close().
    fn release_message(&self, py: Python<'_>, m: &Msg) -> PyResult<()> {
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

    /// Releases a message or cancels a loan being garbage-collected: now if the channel is
    /// free, else by the next call on it (a finalizer must not wait for another thread).
    fn run_or_defer(&self, d: Deferred) {
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

    fn message(slf: &Bound<'_, Self>, m: Msg) -> PyResult<Message> {
        slf.get().outstanding.fetch_add(1, Ordering::AcqRel);
        Ok(Message {
            channel: slf.clone().unbind(),
            msg: m,
            state: Mutex::new(MsgState { released: false, exports: 0, done: false }),
        })
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

    fn finish_loan(&self, py: Python<'_>, f: impl FnOnce(Ptr<ffi::lf_channel>) -> ffi::lf_status) -> PyResult<()> {
        let mut core = self.lock(py);
        let status = if core.ptr.0.is_null() { ffi::LF_OK } else { f(core.ptr) };
        self.free_if_done(&mut core);
        check(status)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let core = self.core.get_mut().unwrap_or_else(|e| e.into_inner());
        core.closed = true;
        if !core.ptr.0.is_null() {
            for d in std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner())) {
                d.run(core.ptr);
            }
            // SAFETY: no message or loan refers to the channel any more (they hold it alive).
            unsafe { lib().lf_channel_free(core.ptr.0) };
            core.ptr = Ptr(std::ptr::null_mut());
        }
    }
}

fn role(role: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(r) = role.extract::<u32>() {
        return Ok(r);
    }
    match role.extract::<String>()?.as_str() {
        "producer" => Ok(ffi::LF_ROLE_PRODUCER),
        "consumer" => Ok(ffi::LF_ROLE_CONSUMER),
        other => Err(PyValueError::new_err(format!("role {other:?} is not \"producer\" or \"consumer\""))),
    }
}

#[pymethods]
impl Channel {
    #[new]
    #[pyo3(signature = (context, name, role, *, my_location = None, peer_location = None, capacity = None,
        pool_size = None, wait = None, spin_ns = None, rendezvous_timeout = None, auto_zero_copy = None,
        strict_gpu = None, released_semaphore = None, prefault = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        context: &Context,
        name: &str,
        role: &Bound<'_, PyAny>,
        my_location: Option<&Location>,
        peer_location: Option<&Location>,
        capacity: Option<u32>,
        pool_size: Option<u64>,
        wait: Option<u32>,
        spin_ns: Option<u64>,
        rendezvous_timeout: Option<f64>,
        auto_zero_copy: Option<bool>,
        strict_gpu: Option<bool>,
        released_semaphore: Option<bool>,
        prefault: Option<bool>,
    ) -> PyResult<Channel> {
        let role = self::role(role)?;
        let mut c = default_config()?;
        if let Some(v) = capacity {
            c.capacity = v;
        }
        if let Some(v) = pool_size {
            c.pool_size = v;
        }
        if let Some(v) = wait {
            c.wait_strategy = v;
        }
        if let Some(v) = spin_ns {
            c.spin_ns = v;
        }
        if rendezvous_timeout.is_some() {
            c.rendezvous_timeout_ns = timeout_ns(rendezvous_timeout)?;
        }
        if let Some(v) = auto_zero_copy {
            c.auto_zero_copy = v as u32;
        }
        if let Some(v) = strict_gpu {
            c.strict_gpu = v as u32;
        }
        if let Some(v) = released_semaphore {
            c.released_semaphore = v as u32;
        }
        if let Some(v) = prefault {
            c.prefault = v as u32;
        }
        let cname = cstring("channel name", name)?;
        let ctx = context.ptr();
        // Without locations: this process's, and a peer on the same host.
        let here = match my_location {
            Some(_) => None,
            None => Some(Location::detect(py)?),
        };
        let mine = my_location.or(here.as_ref()).expect("one of them").ptr();
        let peer = peer_location.map_or(mine, |l| l.ptr());
        // SAFETY: live handles (held by the caller's arguments), a valid config, local out.
        let ptr = crate::native::out_handle(py, |out| unsafe {
            lib().lf_channel_create(ctx.get(), cname.as_ptr(), role, mine.get(), peer.get(), &c, out)
        })?;
        Ok(Channel {
            core: Mutex::new(Core { ptr, closed: false }),
            outstanding: AtomicUsize::new(0),
            pending: Mutex::new(Vec::new()),
            has_pending: AtomicBool::new(false),
            role,
            name: name.to_owned(),
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// `Role.PRODUCER` or `Role.CONSUMER`.
    #[getter]
    fn role(&self) -> u32 {
        self.role
    }

    /// Sends the bytes of `data` (bytes, bytearray, memoryview, a numpy array or any
    /// C-contiguous buffer-protocol object) as the next message; returns its sequence number.
    /// Bytes inside a lava-flow Buffer go by reference (do not rewrite them until
    /// `wait_completed`). Waits for room up to `timeout` seconds (None: forever).
    #[pyo3(signature = (data, timeout = None))]
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let src = Borrowed::new(data, false)?;
        let (p, n) = (Ptr(src.ptr()), src.len());
        self.blocking(py, "send", timeout, |ch, t| {
            let mut seq = 0u64;
            // SAFETY: live channel; `src` stays borrowed for the call.
            let s = unsafe { lib().lf_send(ch.get(), p.get().cast(), n, t, &mut seq) };
            (s, seq)
        })
    }

    /// As `send`, but returns None at once when the channel is full.
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let src = Borrowed::new(data, false)?;
        self.quick(py, |ch| {
            let mut seq = 0u64;
            // SAFETY: live channel; `src` stays borrowed for the call.
            match unsafe { lib().lf_try_send(ch.0, src.ptr().cast(), src.len(), &mut seq) } {
                ffi::LF_OK => Ok(Some(seq)),
                ffi::LF_ERR_WOULD_BLOCK => Ok(None),
                s => Err(error(s)),
            }
        })
    }

    /// Sends `length` bytes (default: to the end) at `offset` of a lava-flow Buffer by
    /// reference; with `ready_value`, GPU work still writing it signals the channel's ready
    /// semaphore to that value. Returns the sequence number.
    #[pyo3(signature = (buffer, offset = 0, length = None, *, timeout = None, ready_value = None))]
    fn send_buffer(
        &self,
        py: Python<'_>,
        buffer: &Buffer,
        offset: usize,
        length: Option<usize>,
        timeout: Option<f64>,
        ready_value: Option<u64>,
    ) -> PyResult<u64> {
        let len = length.unwrap_or_else(|| buffer.len().saturating_sub(offset));
        buffer.with(|b| {
            self.blocking(py, "send_buffer", timeout, |ch, t| {
                let mut seq = 0u64;
                // SAFETY: live channel and buffer for the call.
                let s = unsafe {
                    match ready_value {
                        None => lib().lf_send_buffer(ch.get(), b.get(), offset, len, t, &mut seq),
                        Some(v) => lib().lf_send_buffer_after(ch.get(), b.get(), offset, len, v, t, &mut seq),
                    }
                };
                (s, seq)
            })
        })
    }

    /// Lends `size` bytes of the channel's shared memory for the next message: write into the
    /// Loan (a writable buffer: `memoryview(loan)`, `numpy.frombuffer(loan, ...)`), then
    /// `loan.publish(n)`; or `loan.cancel()`. A `with` block cancels a loan not published.
    #[pyo3(signature = (size, timeout = None))]
    fn loan(slf: &Bound<'_, Self>, py: Python<'_>, size: usize, timeout: Option<f64>) -> PyResult<Loan> {
        let this = slf.get();
        let region = this.blocking(py, "loan", timeout, |ch, t| {
            let mut r = ffi::lf_loan_region::default();
            // SAFETY: live channel, local out-parameter.
            let s = unsafe { lib().lf_loan(ch.get(), size, t, &mut r) };
            (s, LoanRegion(r))
        })?;
        this.outstanding.fetch_add(1, Ordering::AcqRel);
        Ok(Loan {
            channel: slf.clone().unbind(),
            region,
            state: Mutex::new(LoanState { finished: false, exports: 0, counted: true }),
        })
    }

    /// How many messages the consumer has released (all sequence numbers below are done).
    #[getter]
    fn completed(&self, py: Python<'_>) -> PyResult<u64> {
        self.quick(py, |ch| {
            let mut v = 0u64;
            // SAFETY: live channel, local out-parameter.
            check(unsafe { lib().lf_completed(ch.0, &mut v) })?;
            Ok(v)
        })
    }

    /// Waits up to `timeout` seconds until message `sequence` was released by the consumer.
    #[pyo3(signature = (sequence, timeout = None))]
    fn wait_completed(&self, py: Python<'_>, sequence: u64, timeout: Option<f64>) -> PyResult<()> {
        self.blocking(py, "wait_completed", timeout, |ch, t| {
            // SAFETY: live channel.
            (unsafe { lib().lf_wait_completed(ch.get(), sequence, t) }, ())
        })
    }

    /// Receives the next message, waiting up to `timeout` seconds (None: forever): a
    /// read-only zero-copy view into shared memory. Raises TimeoutError, or PeerGoneError once
    /// the producer has gone and its messages are read.
    #[pyo3(signature = (timeout = None))]
    fn recv(slf: &Bound<'_, Self>, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let m = slf.get().blocking(py, "recv", timeout, |ch, t| {
            let mut m = ffi::lf_message::default();
            // SAFETY: live channel, local out-parameter.
            let s = unsafe { lib().lf_recv(ch.get(), t, &mut m) };
            (s, Msg(m))
        })?;
        Channel::message(slf, m)
    }

    /// The next message if one waits, else None (PeerGoneError once the producer has gone).
    fn try_recv(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Option<Message>> {
        let m = slf.get().quick(py, |ch| {
            let mut m = ffi::lf_message::default();
            // SAFETY: live channel, local out-parameter.
            match unsafe { lib().lf_try_recv(ch.0, &mut m) } {
                ffi::LF_OK => Ok(Some(Msg(m))),
                ffi::LF_ERR_WOULD_BLOCK => Ok(None),
                s => Err(error(s)),
            }
        })?;
        m.map(|m| Channel::message(slf, m)).transpose()
    }

    /// A file descriptor readable while a message waits or the producer has gone (consumers):
    /// for `select`, `poll` and asyncio's `loop.add_reader`. Owned by the channel.
    fn fileno(&self, py: Python<'_>) -> PyResult<i32> {
        self.quick(py, |ch| {
            let mut fd: c_int = -1;
            // SAFETY: live channel, local out-parameter.
            check(unsafe { lib().lf_channel_fd(ch.0, &mut fd) })?;
            Ok(fd)
        })
    }

    /// The transports in use ("shm", "shm+vulkan_ipc", ...).
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.transport_report(py)?.0)
    }

    /// Why each route was chosen and how GPU buffers are synchronised or staged.
    #[getter]
    fn transport_reason(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.transport_report(py)?.1)
    }

    fn transport_report(&self, py: Python<'_>) -> PyResult<(String, String)> {
        self.quick(py, |ch| {
            let (mut n, mut r) = (std::ptr::null(), std::ptr::null());
            // SAFETY: live channel; strings copied at once.
            check(unsafe { lib().lf_channel_transport(ch.0, &mut n, &mut r) })?;
            Ok((string(n).unwrap_or_default(), string(r).unwrap_or_default()))
        })
    }

    /// A new fd of the channel's ready semaphore (a Vulkan timeline semaphore, for CUDA's
    /// `cudaImportExternalSemaphore`); the caller owns it.
    fn ready_semaphore(&self, py: Python<'_>) -> PyResult<i32> {
        self.ready_semaphore_fd(py)
    }

    /// A new fd of the producer's released semaphore (with `released_semaphore=True`).
    fn released_semaphore(&self, py: Python<'_>) -> PyResult<i32> {
        self.quick(py, |ch| {
            let mut fd: c_int = -1;
            // SAFETY: live channel, local out-parameter.
            check(unsafe { lib().lf_channel_released_semaphore(ch.0, &mut fd) })?;
            Ok(fd)
        })
    }

    /// Closes this end (the peer sees PeerGoneError after reading what was sent); the handle
    /// is freed once every message and loan of it is released.
    fn close(&self, py: Python<'_>) {
        let mut core = self.lock(py);
        core.closed = true;
        self.drain_pending(&mut core);
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.lock(py).closed
    }

    /// The `lf_channel *` handle as an int, for C and C++ extensions in this process (use it
    /// from one thread at a time, as the channel's own calls do).
    #[getter]
    fn handle(&self, py: Python<'_>) -> PyResult<usize> {
        self.quick(py, |ch| Ok(ch.0 as usize))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        let role = if self.role == ffi::LF_ROLE_PRODUCER { "producer" } else { "consumer" };
        format!("<lava_flow.Channel {:?} {role}>", self.name)
    }
}

struct MsgState {
    /// Released in Python: no new view may be made.
    released: bool,
    /// Views alive (buffer-protocol exports, DLPack tensors, lent GPU buffers).
    exports: usize,
    /// Handed back to lava-flow (`lf_release`).
    done: bool,
}

/// A received message: a read-only zero-copy view into the channel's shared memory.
///
/// `memoryview(msg)`, `numpy.frombuffer(msg, dtype)` and `numpy.from_dlpack(msg)` read the
/// bytes where they lie. The message is handed back to the producer once it is released
/// (`release()`, the end of a `with` block, or garbage collection) and no view of it is left;
/// new views of a released message raise InvalidStateError.
#[pyclass(frozen, module = "lava_flow")]
pub struct Message {
    channel: Py<Channel>,
    msg: Msg,
    state: Mutex<MsgState>,
}

impl Message {
    fn lock(&self) -> MutexGuard<'_, MsgState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new view; refused once the message was released.
    pub fn begin_export(&self) -> PyResult<()> {
        let mut s = self.lock();
        if s.released {
            return Err(invalid_state(&format!(
                "message {} has been released: its memory belongs to the producer again",
                self.msg.0.sequence
            )));
        }
        s.exports += 1;
        Ok(())
    }

    /// Ends a view; the last view of a released message hands it back.
    pub fn end_export(&self) {
        let release = {
            let mut s = self.lock();
            s.exports -= 1;
            let last = s.released && s.exports == 0 && !s.done;
            s.done |= last;
            last
        };
        if release {
            Python::with_gil(|py| {
                if let Err(e) = self.channel.get().release_message(py, &self.msg) {
                    e.write_unraisable_bound(py, None);
                }
            });
        }
    }

    pub fn data(&self) -> (*const u8, usize) {
        (self.msg.0.data.cast(), self.msg.0.len)
    }

    pub fn is_gpu(&self) -> bool {
        self.msg.0.flags & ffi::LF_MESSAGE_GPU != 0
    }

    pub fn ready_value(&self) -> u64 {
        self.msg.0.ready_value
    }

    pub fn channel(&self) -> &Py<Channel> {
        &self.channel
    }

    /// The GPU buffer the message carries (lent: valid while the message is held).
    pub fn gpu_buffer<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Buffer>> {
        let this = slf.get();
        if !this.is_gpu() {
            return Err(invalid_state("this message carries no GPU buffer (its flags lack LF_MESSAGE_GPU)"));
        }
        this.begin_export()?;
        let r = this.channel.get().quick(slf.py(), |ch| {
            let mut b: *const ffi::lf_buffer = std::ptr::null();
            // SAFETY: live channel, a held message, local out-parameter.
            check(unsafe { lib().lf_message_buffer(ch.0, &this.msg.0, &mut b) })?;
            Bound::new(slf.py(), Buffer::lent(b.cast_mut(), slf.clone().unbind())?)
        });
        if r.is_err() {
            this.end_export();
        }
        r
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if !s.done {
            s.done = true;
            self.channel.get().run_or_defer(Deferred::Release(self.msg));
        }
    }
}

#[pymethods]
impl Message {
    fn __len__(&self) -> usize {
        self.msg.0.len
    }

    /// The message's sequence number (0, 1, 2, ... per producer).
    #[getter]
    fn sequence(&self) -> u64 {
        self.msg.0.sequence
    }

    /// `MessageFlags` bits: ZERO_COPY (the bytes lie in the producer's buffer), GPU.
    #[getter]
    fn flags(&self) -> u32 {
        self.msg.0.flags
    }

    /// True when the message is a view of the producer's own buffer (a buffer send).
    #[getter]
    fn zero_copy(&self) -> bool {
        self.msg.0.flags & ffi::LF_MESSAGE_ZERO_COPY != 0
    }

    /// True when the message carries a GPU buffer (`buffer`, DLPack on CUDA).
    #[getter(is_gpu)]
    fn py_is_gpu(&self) -> bool {
        self.is_gpu()
    }

    /// For GPU messages: the ready semaphore value at which the payload is in place (0: now).
    #[getter(ready_value)]
    fn py_ready_value(&self) -> u64 {
        self.msg.0.ready_value
    }

    /// The address of the first byte in this process (None for a GPU message's device memory).
    #[getter]
    fn address(&self) -> Option<usize> {
        (!self.msg.0.data.is_null()).then_some(self.msg.0.data as usize)
    }

    /// The GPU buffer of a GPU message (a lava-flow Buffer lent while the message is held).
    #[getter]
    fn buffer<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Buffer>> {
        Message::gpu_buffer(slf)
    }

    /// A copy of the bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.begin_export()?;
        let (p, n) = self.data();
        let out = if p.is_null() {
            Err(PyBufferError::new_err("this GPU message has no host bytes: read its buffer"))
        } else {
            // SAFETY: the message's bytes are mapped while the export is counted.
            Ok(PyBytes::new_bound(py, unsafe { std::slice::from_raw_parts(p, n) }))
        };
        self.end_export();
        out
    }

    /// Hands the message back to the producer (at once, or when its last view is gone).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let now = {
            let mut s = self.lock();
            let now = !s.released && s.exports == 0 && !s.done;
            s.released = true;
            s.done |= now;
            now
        };
        if now {
            self.channel.get().release_message(py, &self.msg)?;
        }
        Ok(())
    }

    /// True once `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        self.lock().released
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let (p, n) = this.data();
        if p.is_null() && n > 0 {
            return Err(PyBufferError::new_err(
                "this GPU message has no host bytes: use its buffer, or DLPack on a CUDA device",
            ));
        }
        this.begin_export()?;
        // SAFETY: the bytes stay mapped and unreleased while the export is counted.
        let r = unsafe { pybuf::fill(slf.as_ptr(), view, flags, p, n, true) };
        if r.is_err() {
            this.end_export();
        }
        r
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.end_export();
    }

    /// DLPack: a read-only uint8 tensor of the bytes (CPU), or of the GPU buffer through CUDA;
    /// `stream` (CUDA) waits for the payload on that stream.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        crate::dlpack::message_capsule(slf, stream, max_version, dl_device, copy)
    }

    fn __dlpack_device__(slf: &Bound<'_, Self>) -> PyResult<(i32, i32)> {
        crate::dlpack::message_device(slf)
    }

    fn __repr__(&self) -> String {
        format!(
            "<lava_flow.Message {} bytes, sequence {}{}>",
            self.msg.0.len,
            self.msg.0.sequence,
            if self.is_gpu() { ", GPU" } else { "" }
        )
    }
}

struct LoanState {
    finished: bool,
    exports: usize,
    /// Still counted in the channel's `outstanding`.
    counted: bool,
}

/// Room lent by `Channel.loan`: a writable buffer over the channel's shared memory. Write the
/// message into it, then `publish(n)`; `cancel()` gives it back. After either, new views of it
/// raise InvalidStateError.
#[pyclass(frozen, module = "lava_flow")]
pub struct Loan {
    channel: Py<Channel>,
    region: LoanRegion,
    state: Mutex<LoanState>,
}

impl Loan {
    fn lock(&self) -> MutexGuard<'_, LoanState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the loan finished; `f` publishes or cancels it under the channel's lock.
    fn finish<R: Default>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Ptr<ffi::lf_channel>) -> (ffi::lf_status, R),
    ) -> PyResult<R> {
        {
            let mut s = self.lock();
            if s.finished {
                return Err(invalid_state("this loan was published or cancelled already"));
            }
            s.finished = true;
        }
        let mut out = R::default();
        let r = self.channel.get().finish_loan(py, |ch| {
            let (s, v) = f(ch);
            out = v;
            s
        });
        self.uncount();
        r.map(|_| out)
    }

    /// Leaves the channel's count once finished with no view left.
    fn uncount(&self) {
        let uncount = {
            let mut s = self.lock();
            let u = s.finished && s.exports == 0 && s.counted;
            s.counted &= !u;
            u
        };
        if uncount {
            let ch = self.channel.get();
            ch.outstanding.fetch_sub(1, Ordering::AcqRel);
            if let Ok(mut core) = ch.core.try_lock() {
                ch.free_if_done(&mut core);
            }
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let (finished, counted) = (s.finished, s.counted);
        s.finished = true;
        s.counted = false;
        let ch = self.channel.get();
        if !finished {
            // Counted while not finished: the count goes when the loan is given back.
            ch.run_or_defer(Deferred::CancelLoan(self.region));
        } else if counted {
            ch.outstanding.fetch_sub(1, Ordering::AcqRel);
            if let Ok(mut core) = ch.core.try_lock() {
                ch.free_if_done(&mut core);
            }
        }
    }
}

#[pymethods]
impl Loan {
    fn __len__(&self) -> usize {
        self.region.0.len
    }

    /// The address of the loaned memory.
    #[getter]
    fn address(&self) -> usize {
        self.region.0.data as usize
    }

    /// Publishes the first `size` bytes (default: all) as the next message; returns its
    /// sequence number.
    #[pyo3(signature = (size = None))]
    fn publish(&self, py: Python<'_>, size: Option<usize>) -> PyResult<u64> {
        let n = size.unwrap_or(self.region.0.len);
        let region = self.region;
        self.finish(py, |ch| {
            let mut seq = 0u64;
            // SAFETY: live channel, the loan it lent.
            let s = unsafe { lib().lf_publish(ch.0, &region.0, n, &mut seq) };
            (s, seq)
        })
    }

    /// Gives the loan back unpublished.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let region = self.region;
        // SAFETY: live channel, the loan it lent.
        self.finish(py, |ch| (unsafe { lib().lf_loan_cancel(ch.0, &region.0) }, ()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        if !self.lock().finished {
            self.cancel(py)?;
        }
        Ok(())
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        {
            let mut s = this.lock();
            if s.finished {
                return Err(invalid_state("this loan was published or cancelled: write into a new loan"));
            }
            s.exports += 1;
        }
        let r = &this.region.0;
        // SAFETY: the loaned memory stays mapped while the channel lives (the Loan holds it).
        let res = unsafe { pybuf::fill(slf.as_ptr(), view, flags, r.data.cast(), r.len, false) };
        if res.is_err() {
            this.lock().exports -= 1;
        }
        res
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.lock().exports -= 1;
        self.uncount();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Channel>()?;
    m.add_class::<Message>()?;
    m.add_class::<Loan>()?;
    Ok(())
}
