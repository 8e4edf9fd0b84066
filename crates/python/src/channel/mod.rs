//! `Channel` (one end of a lava-flow channel), `Message` (a received view into shared memory)
//! and `Loan` (room in the channel to write the next message in place).
//!
//! Every C call on a channel runs under the channel's lock, so that Python threads may share a
//! channel (lava-flow takes one thread at a time per channel). Blocking calls release the GIL
//! and wait in slices of at most 100 ms (a fan-out producer with a slow-consumer bound: the
//! bound and 100 ms), checking for signals (Ctrl-C) in between. A message
//! is released (`lf_release`) once it was released in Python (`release()`, the end of a `with`
//! block, or garbage collection) and no view of it is left; closing the channel is deferred
//! until every message and loan of it is released, so that no view outlives its memory.
//!
//! Its parts: `handle` (the C handle under the channel's lock: blocking calls, deferred
//! releases, freeing), `config` (the channel config from `Channel`'s keywords), `message`
//! (`Message`), `loan` (`Loan`), `peers` (a consumer's producers, `Peer`), `gpu` (GPU
//! messages in CUDA: semaphores, stream-ordered sends, releases after the consumer's streams)
//! and `gpu_release` (releases on the GPU: the producer's released semaphore signalled on the
//! consumer's stream, and the producer's stream-ordered wait for it), each on `handle`.
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]

mod config;
mod gpu;
mod gpu_release;
mod handle;
mod loan;
mod message;
mod peers;
mod tensor;

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use self::config::ConfigKeywords;
pub use self::gpu_release::release_counts;
use self::handle::{Core, Deferred, LoanRegion, Msg};
pub use self::loan::Loan;
use self::loan::LoanState;
pub use self::message::{GpuPlace, Message};
pub use self::peers::Peer;
use crate::buffer::Buffer;
use crate::context::Context;
use crate::error::{check, error};
use crate::ffi;
use crate::location::Location;
use crate::native::{cstring, lib, string, Ptr};
use crate::pybuf::Borrowed;

/// One end of a channel: `Channel(context, name, role, ...)` creates it and waits for the peer.
///
/// `role` is "producer" or "consumer". Keywords set the channel config (`capacity`,
/// `pool_size`, `wait` (a `lava_flow.Wait`), `spin_ns`, `rendezvous_timeout` in seconds,
/// `auto_zero_copy`, `strict_gpu`, `released_semaphore` (a producer: the consumer signals a
/// released semaphore as it lets go of GPU messages, see `wait_completed`; a consumer: it
/// releases GPU messages as soon as its CUDA work on them is queued, signalling that semaphore
/// on its stream, where the producer has one), `prefault`, `kind` (a
/// `lava_flow.ChannelKind`, or "pair", "fan_in", "fan_out"), `max_peers` (a fan-in's most
/// producers, or a fan-out's most consumers, 1 to 64) and `slow_consumer_timeout` in seconds (fan-out only)), the rest keeping
/// lava-flow's defaults; `my_location` and `peer_location` (Locations) choose the transport.
///
/// A fan-in takes up to `max_peers` producers (each one `Channel(..., "producer",
/// kind="fan_in")`) and one consumer, which receives each producer's messages in order
/// (`Message.producer` names the sender's slot) and gets one PeerGoneError per producer that
/// ended, its `producer` the slot; the other producers go on.
///
/// A fan-out (`kind="fan_out"`) takes one producer and up to `max_peers` consumers: each
/// message goes to every consumer attached when it was sent (a late one starts with the next,
/// its sequence numbers from 0), a buffer by reference is one memory for all of them and
/// complete (`wait_completed`) once every one released it, and `peers()` on the producer lists
/// the consumer slots. A consumer that dies or closes is dropped; one that keeps the producer
/// waiting for room longer than `slow_consumer_timeout` is detached, and its `recv` raises
/// PeerGoneError saying so after what it had.
#[pyclass(frozen, subclass, module = "lava_flow")]
pub struct Channel {
    core: Mutex<Core>,
    /// Messages and loans not yet released: the channel is freed once this is 0 after close().
    outstanding: AtomicUsize,
    /// Messages and loans garbage-collected while another thread held the channel, released
    /// (cancelled) by the next call; each still counts in `outstanding` until then.
    pending: Mutex<Vec<Deferred>>,
    has_pending: AtomicBool,
    /// Deferred releases waiting for the consumer's GPU streams (among `pending`).
    gpu_waiting: AtomicUsize,
    /// Its semaphores in CUDA and its ready values (`gpu`).
    gpu: Mutex<gpu::GpuState>,
    /// Releases on the GPU (`gpu_release`).
    releases: Mutex<gpu_release::ReleaseState>,
    /// Unique in the process: names the channel to the CUDA import cache.
    id: u64,
    role: u32,
    kind: u32,
    name: String,
    /// The context the channel was made in: CUDA tensors sent are registered there.
    context: Py<Context>,
    /// A producer's CUDA tensors not yet released by the consumer (`send_tensor`).
    sent: Mutex<tensor::Sent>,
    /// The longest one C call of a blocking method waits (`handle::SLICE_NS`, or longer: see
    /// `slice_for`).
    slice_ns: i64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How long one C call of a blocking method of this end may wait. lava-flow measures a
/// fan-out's slow-consumer bound within one wait for room: a producer whose waits were cut into
/// 100 ms slices would never detach a slow consumer, so its slices outlast the bound (and
/// Ctrl-C is seen within the bound and a slice).
fn slice_for(role: u32, c: &ffi::lf_channel_config) -> i64 {
    if role == ffi::LF_ROLE_PRODUCER && c.kind == ffi::LF_CHANNEL_FAN_OUT && c.slow_consumer_timeout_ns >= 0 {
        c.slow_consumer_timeout_ns.saturating_add(handle::SLICE_NS)
    } else {
        handle::SLICE_NS
    }
}

#[pymethods]
impl Channel {
    #[new]
    #[pyo3(signature = (context, name, role, *, my_location = None, peer_location = None, capacity = None,
        pool_size = None, wait = None, spin_ns = None, rendezvous_timeout = None, auto_zero_copy = None,
        strict_gpu = None, released_semaphore = None, prefault = None, kind = None, max_peers = None,
        slow_consumer_timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        context: &Bound<'_, Context>,
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
        kind: Option<&Bound<'_, PyAny>>,
        max_peers: Option<u32>,
        slow_consumer_timeout: Option<f64>,
    ) -> PyResult<Channel> {
        let role = config::role(role)?;
        let kind = kind.map(config::kind).transpose()?;
        let c = ConfigKeywords {
            capacity,
            pool_size,
            wait,
            spin_ns,
            rendezvous_timeout,
            auto_zero_copy,
            strict_gpu,
            released_semaphore,
            prefault,
            kind,
            max_peers,
            slow_consumer_timeout,
        }
        .config()?;
        let cname = cstring("channel name", name)?;
        let ctx = context.get().ptr();
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
            gpu_waiting: AtomicUsize::new(0),
            gpu: Mutex::new(gpu::GpuState::default()),
            releases: Mutex::new(gpu_release::ReleaseState::new(
                role == ffi::LF_ROLE_PRODUCER,
                c.released_semaphore != 0,
            )),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            role,
            kind: c.kind,
            name: name.to_owned(),
            slice_ns: slice_for(role, &c),
            context: context.clone().unbind(),
            sent: Mutex::new(tensor::Sent::default()),
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

    /// `ChannelKind.PAIR`, `FAN_IN` or `FAN_OUT`.
    #[getter]
    fn kind(&self) -> u32 {
        self.kind
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
    /// reference. A GPU buffer that work still writes: with `stream` (a CUDA stream: an int, a
    /// torch.cuda.Stream or a cupy Stream), lava-flow signals the channel's ready semaphore on
    /// that stream after the work queued there, and the consumer's stream waits for it; with
    /// `ready_value`, the caller's own GPU work signals the semaphore to that value. Returns
    /// the sequence number.
    #[pyo3(signature = (buffer, offset = 0, length = None, *, timeout = None, ready_value = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn send_buffer(
        &self,
        py: Python<'_>,
        buffer: &Buffer,
        offset: usize,
        length: Option<usize>,
        timeout: Option<f64>,
        ready_value: Option<u64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let len = length.unwrap_or_else(|| buffer.len().saturating_sub(offset));
        let stream = stream.filter(|s| !s.is_none());
        let ordered = match stream {
            None => None,
            Some(_) if ready_value.is_some() => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "pass either stream (lava-flow signals the ready semaphore on it) or ready_value \
                     (your GPU work signals it), not both",
                ))
            }
            Some(_) if !buffer.is_gpu() => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "stream orders GPU buffers only: a CPU buffer's bytes must be in place when sent",
                ))
            }
            Some(s) => Some((self.own_semaphore(py, buffer)?, Ptr(gpu::stream_handle(s)?))),
        };
        if let Some(v) = ready_value {
            self.note_ready_value(v);
        }
        let seq = buffer
            .with(|b| self.send_ordered(py, "send_buffer", b, offset, len, timeout, ready_value, ordered.as_ref()))?;
        if buffer.is_gpu() {
            self.note_gpu_sent(seq, || gpu::buffer_device(buffer));
        }
        Ok(seq)
    }

    /// Sends a CUDA tensor by reference: a torch CUDA tensor, a CuPy array, anything with
    /// `__cuda_array_interface__`, C-contiguous, allocated by the framework (PyTorch's default
    /// caching allocator or its expandable segments, CuPy, cudaMalloc). The consumer, on this
    /// host, gets a message over the very bytes (`torch.from_dlpack(msg)`, `cupy.from_dlpack`).
    /// The work that writes the tensor goes first: on `stream` (a CUDA stream: an int, a
    /// torch.cuda.Stream or a cupy Stream), or else the stream the array names. Where the
    /// channel shares a ready semaphore with its consumer on the tensor's GPU (both contexts
    /// open that GPU with Vulkan, and its driver shares timeline semaphores:
    /// `transport_reason` says "stream-ordered"), the send is stream-ordered: lava-flow signals
    /// the semaphore on that stream after the work queued there (imported into CUDA once per
    /// channel) and returns without waiting; the consumer's stream waits for it on the GPU
    /// (`__dlpack__(stream=)`, which torch.from_dlpack passes). Elsewhere lava-flow
    /// synchronises the stream on the host before sending. The channel keeps the tensor (and
    /// so its memory) until the consumer released the message (`wait_completed`); write it
    /// again only after that. Memory no other process can open (a memory pool without POSIX fd
    /// handle types, managed memory) is refused, naming the way out.
    /// A tensor made under a `lava_flow.torch.mem_pool` is lava-flow memory: it goes as its
    /// lava-flow buffer's region, as `send_buffer` sends GPU buffers, so that the consumer (in
    /// Python, C, Vulkan) gets an ordinary GPU message (`msg.buffer`); the pool must be over
    /// the channel's Context.
    #[pyo3(signature = (tensor, *, timeout = None, stream = None))]
    fn send_tensor(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let stream = match stream.filter(|s| !s.is_none()) {
            Some(s) => Some(gpu::stream_handle(s)? as isize),
            None => None,
        };
        // Lets go of the tensors the consumer released since the last call.
        self.completed(py)?;
        self.send_cuda_array(py, tensor, timeout, stream)
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
        .inspect(|&v| self.retire_tensors(v))
    }

    /// Waits up to `timeout` seconds until message `sequence` was released by the consumer.
    ///
    /// A producer made with `released_semaphore=True` whose consumer releases GPU messages on
    /// its GPU (a consumer made with `released_semaphore=True` too) learns of the release on the
    /// host before the consumer's GPU work is done: with `stream` (a CUDA stream, as
    /// `send_buffer`'s), that stream waits on the GPU for the consumer's work before the
    /// producer's later work there (rewrite the buffer on it); without, this call waits on the
    /// host for it as well.
    #[pyo3(signature = (sequence, timeout = None, *, stream = None))]
    fn wait_completed(
        &self,
        py: Python<'_>,
        sequence: u64,
        timeout: Option<f64>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = stream.filter(|s| !s.is_none()).map(gpu::stream_handle).transpose()?;
        self.blocking(py, "wait_completed", timeout, |ch, t| {
            // SAFETY: live channel.
            (unsafe { lib().lf_wait_completed(ch.get(), sequence, t) }, ())
        })?;
        self.retire_tensors(sequence + 1);
        self.wait_released(py, sequence, stream)
    }

    /// Receives the next message, waiting up to `timeout` seconds (None: forever): a
    /// read-only zero-copy view into shared memory. Raises TimeoutError, or PeerGoneError once
    /// the producer has gone and its messages are read. On a fan-in, PeerGoneError reports one
    /// producer's end (its `producer` is the slot), after that producer's last message; the
    /// channel goes on with the others, and with none attached waits for a new one.
    #[pyo3(signature = (timeout = None))]
    fn recv(slf: &Bound<'_, Self>, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let this = slf.get();
        let mut gone = None;
        let m = this
            .blocking(py, "recv", timeout, |ch, t| {
                let mut m = ffi::lf_message::default();
                // SAFETY: live channel, local out-parameter.
                let s = unsafe { lib().lf_recv(ch.get(), t, &mut m) };
                if s == ffi::LF_ERR_PEER_GONE {
                    gone = Some(m.producer);
                }
                (s, Msg(m))
            })
            .map_err(|e| this.name_gone(py, e, gone))?;
        Channel::message(slf, m)
    }

    /// The next message if one waits, else None (PeerGoneError once the producer has gone; on
    /// a fan-in, once per producer, as `recv`).
    fn try_recv(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Option<Message>> {
        let this = slf.get();
        let m = this.quick(py, |ch| {
            let mut m = ffi::lf_message::default();
            // SAFETY: live channel, local out-parameter.
            match unsafe { lib().lf_try_recv(ch.0, &mut m) } {
                ffi::LF_OK => Ok(Some(Msg(m))),
                ffi::LF_ERR_WOULD_BLOCK => Ok(None),
                s @ ffi::LF_ERR_PEER_GONE => Err(this.name_gone(py, error(s), Some(m.producer))),
                s => Err(error(s)),
            }
        })?;
        m.map(|m| Channel::message(slf, m)).transpose()
    }

    /// The processes at the other end, slot by slot (a list of `Peer`): a consumer's producers
    /// (a pair channel's one, or each of a fan-in's `max_peers` slots, "free", "alive" or
    /// "gone": ended, with messages still to read), or a producer's consumers (each of a
    /// fan-out's `max_peers` slots, or a pair channel's one, whose pid is 0).
    fn peers(&self, py: Python<'_>) -> PyResult<Vec<Peer>> {
        self.peer_list(py)
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

    /// A new fd of the ready semaphore of the producer in slot `producer` (a message's
    /// `producer`), consumers only: on a fan-in each producer has its own, which its GPU
    /// messages' `ready_value` counts on; the caller owns it.
    fn producer_ready_semaphore(&self, py: Python<'_>, producer: u32) -> PyResult<i32> {
        self.producer_ready_semaphore_fd(py, producer)
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Channel>()?;
    m.add_class::<Message>()?;
    m.add_class::<Loan>()?;
    m.add_class::<Peer>()?;
    Ok(())
}
