//! A consumer's calls: `lf_recv` and `lf_try_recv` (views into shared memory, or GPU
//! messages, which the channel holds), `lf_release`, and `lf_message_buffer` (a GPU message's
//! buffer); the received message as C sees it (`lf_message`).

use std::ffi::{c_int, c_void};

use super::buffer::lf_buffer;
use super::channel::{consumer, lf_channel, lock};
use super::channel_config::timeout;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure, FfiResult};
use lava_flow::channels::transport::RawView;
use lava_flow::channels::{raw as ends, Consumer};

/// `lf_message.flags`: the bytes lie in the sender's own lava-flow buffer (`lf_send_buffer`,
/// or `lf_send` of bytes inside a buffer): nothing was copied.
pub const LF_MESSAGE_ZERO_COPY: u32 = 1;
/// `lf_message.flags`: the payload is GPU memory of the sender's, shared with this process's
/// GPU: `lf_message_buffer` gives it as an `lf_buffer`; `data` is its host address where the
/// host can map it, else NULL.
pub const LF_MESSAGE_GPU: u32 = 2;
/// `lf_message.flags` (with LF_MESSAGE_GPU): the payload is CUDA device memory of the
/// producer's (a tensor it registered, or a lava-flow GPU buffer sent to this process on
/// another GPU than the producer's), opened in this process: `lf_message_cuda_ptr` gives its
/// CUDA address; `data` is NULL (the host cannot read device memory). `lf_message_buffer`
/// lends it as an `lf_buffer` where it is VMM memory of the GPU this process's Vulkan device
/// is (imported into Vulkan when first asked for), and is refused otherwise.
pub const LF_MESSAGE_CUDA: u32 = 4;

/// A received message: `len` bytes at `data`, readable until `lf_release`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_message {
    pub data: *const c_void,
    pub len: usize,
    /// The message's sequence number (0, 1, 2, ... per producer).
    pub sequence: u64,
    /// Internal: which producer session the message came from. Do not change.
    pub session: u64,
    /// LF_MESSAGE_ZERO_COPY, LF_MESSAGE_GPU (with LF_MESSAGE_CUDA for CUDA memory), or 0.
    pub flags: u32,
    /// The slot of the fan-in producer that sent the message (0 for a pair channel and a
    /// fan-out); see
    /// `lf_channel_peers`. After a fan-in's LF_ERR_PEER_GONE, the slot whose producer ended
    /// (the message's other fields are 0 then).
    pub producer: u32,
    /// For LF_MESSAGE_GPU: the value of the channel's ready semaphore
    /// (`lf_channel_ready_semaphore`; on a fan-in, the producer's own:
    /// `lf_channel_producer_ready_semaphore` with `producer`) at which the payload is in place;
    /// 0: in place now. lava-flow's own GPU work on the message's buffer (`lf_buffer_copy`)
    /// waits for it; for LF_MESSAGE_CUDA, the consumer's CUDA work waits for it on its stream
    /// (the semaphore imported with `cudaImportExternalSemaphore`, then
    /// `cudaWaitExternalSemaphoresAsync`).
    pub ready_value: u64,
}

/// Hands a received view to C: CPU bytes as they are; a routed view resolved into its GPU
/// payload, which the channel holds until `lf_release`.
#[inline]
fn deliver(ch: &lf_channel, consumer: &mut Consumer, view: RawView, out: *mut lf_message) -> FfiResult {
    if view.route().is_none() {
        let flags = if view.is_zero_copy() { LF_MESSAGE_ZERO_COPY } else { 0 };
        let m = lf_message {
            data: view.ptr.cast(),
            len: view.len,
            sequence: view.token,
            session: view.session,
            flags,
            producer: view.producer(),
            ready_value: 0,
        };
        write_out(out, m);
        return Ok(());
    }
    deliver_gpu(ch, consumer, view, out)
}

/// [`deliver`] of a routed view: its GPU payload, held by the channel until `lf_release`.
#[inline(never)]
fn deliver_gpu(ch: &lf_channel, consumer: &mut Consumer, view: RawView, out: *mut lf_message) -> FfiResult {
    // SAFETY: the view was just received; the channel's table holds the payload until
    // lf_release, which drops it before it releases the view.
    let payload = unsafe { ends::resolve(consumer, &view)? };
    // NULL where the host cannot map the memory (CUDA memory among it).
    let data = payload.as_ptr().cast();
    let cuda = if payload.cuda_ptr().is_some() { LF_MESSAGE_CUDA } else { 0 };
    let m = lf_message {
        data,
        len: payload.len,
        sequence: view.token,
        session: view.session,
        flags: LF_MESSAGE_ZERO_COPY | LF_MESSAGE_GPU | cuda,
        producer: view.producer(),
        ready_value: payload.ready_value,
    };
    ch.gpu_messages.hold(view, payload);
    write_out(out, m);
    Ok(())
}

/// A receive's error; for a fan-in's producer that has gone, `out` names its slot.
#[cold]
fn note_gone(c: &Consumer, e: lava_flow::Error, out: *mut lf_message) -> lava_flow::Error {
    if let (lava_flow::Error::PeerGone(_), Some(slot)) = (&e, c.last_gone()) {
        let m = lf_message {
            data: std::ptr::null(),
            len: 0,
            sequence: 0,
            session: 0,
            flags: 0,
            producer: slot,
            ready_value: 0,
        };
        write_out(out, m);
    }
    e
}

/// Receives the next message as a view into shared memory, waiting up to `timeout_ns`
/// (LF_ERR_TIMEOUT). LF_ERR_PEER_GONE once the producer has gone and its messages are read.
/// A new producer of the channel is attached by a later call, only after its predecessor's
/// LF_ERR_PEER_GONE was returned: its messages start again at sequence number 0.
/// Release the view with `lf_release`.
///
/// A fan-in serves its producers in turn, each in its order; `message->producer` names the
/// slot. Its LF_ERR_PEER_GONE reports one producer's end, after that producer's last
/// message, with `message->producer` set to its slot; the others go on, and a new producer
/// may take the slot. With no producer attached, a fan-in's receive waits for one.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_recv(channel: *mut lf_channel, timeout_ns: i64, out: *mut lf_message) -> lf_status {
    boundary("lf_recv", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let c = consumer(&mut guard)?;
        let view = ends::recv(c, timeout(timeout_ns)).map_err(|e| note_gone(c, e, out))?;
        deliver(ch, c, view, out)
    })
}

/// As `lf_recv`, but LF_ERR_WOULD_BLOCK at once when no message waits.
///
/// # Safety
/// As `lf_recv`.
#[no_mangle]
pub unsafe extern "C" fn lf_try_recv(channel: *mut lf_channel, out: *mut lf_message) -> lf_status {
    boundary("lf_try_recv", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let c = consumer(&mut guard)?;
        let view = ends::try_recv(c).map_err(|e| note_gone(c, e, out))?;
        deliver(ch, c, view, out)
    })
}

/// Releases a view: its memory goes back to the producer, which sees the completion. A view
/// already released, or not received from this channel, is refused (LF_ERR_INVALID_STATE).
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `message` NULL or a readable lf_message.
#[no_mangle]
pub unsafe extern "C" fn lf_release(channel: *mut lf_channel, message: *const lf_message) -> lf_status {
    boundary("lf_release", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        if message.is_null() {
            return Err(Failure::null("message"));
        }
        // SAFETY: non-NULL; the caller promises a readable lf_message.
        let m = unsafe { *message };
        let mut guard = lock(ch)?;
        let c = consumer(&mut guard)?;
        if m.flags & LF_MESSAGE_GPU != 0 {
            return release_gpu(ch, c, &m);
        }
        let mut view = RawView { ptr: m.data.cast(), len: m.len, token: m.sequence, session: m.session, flags: 0 };
        // Where a fan-in looks first; the session is checked all the same.
        view.set_producer(m.producer);
        // SAFETY: lf_release's contract: the message is one this channel handed C and that C no
        // longer reads. The carrier refuses views it did not hand out, released ones, and ones
        // whose pointer or length differ (a GPU message's, with its flag cleared, among them).
        unsafe { ends::release(c, &view)? };
        Ok(())
    })
}

/// [`lf_release`] of a GPU message, out of line as [`deliver_gpu`] is: its buffer and payload
/// go first (the producer may reuse the memory once the view is released), then its view.
#[inline(never)]
fn release_gpu(ch: &lf_channel, consumer: &mut Consumer, m: &lf_message) -> FfiResult {
    let Some((view, buffer_freed)) = ch.gpu_messages.release(m.session, m.sequence) else {
        return Err(Failure {
            status: lf_status::LF_ERR_INVALID_STATE,
            message: format!(
                "GPU message {} is not held by this consumer (already released, or not received from this channel)",
                m.sequence
            ),
        });
    };
    // SAFETY: the table held this view for C and gave it up here, once, after letting go of
    // the message's buffer and payload.
    unsafe { ends::release(consumer, &view)? };
    // Checked last, so that a buffer that could not be freed still lets the view go.
    buffer_freed
}

/// Releases GPU message `message` as `lf_release` does, except that lava-flow does not signal
/// the producer's released semaphore for it: the caller does, on its GPU once its own work on
/// the message is done, so that it releases as soon as that work is queued (no host wait).
/// `*signal_value` receives the value to signal (`cudaSignalExternalSemaphoresAsync` on the
/// semaphore from `lf_channel_released_semaphore`, imported once), or 0 where none is due yet
/// (a GPU message received before it is still held).
///
/// A value covers every message let go of before it, so the caller must:
/// - signal it after its work on each of those messages too (one stream for all of it, or a
///   stream made to wait for the others' events first);
/// - signal the values in the order they are returned, never reordered across streams (a
///   timeline semaphore's value must only grow);
/// - use this call for every GPU message of the channel from the first one on: from then on
///   lava-flow signals nothing on the host, and a GPU message released with `lf_release` has
///   its value signalled by the next call of this one.
///
/// Pair channels whose producer set `released_semaphore` and shares semaphores with this
/// process only: elsewhere LF_ERR_UNSUPPORTED, saying why, and the message stays held
/// (`lf_release` it). LF_ERR_INVALID_STATE for a message that is not a held GPU message.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `message` NULL or a readable lf_message;
/// `signal_value` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_release_on_gpu(
    channel: *mut lf_channel,
    message: *const lf_message,
    signal_value: *mut u64,
) -> lf_status {
    boundary("lf_release_on_gpu", || {
        let out = out_ptr(signal_value, "signal_value")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        if message.is_null() {
            return Err(Failure::null("message"));
        }
        // SAFETY: non-NULL; the caller promises a readable lf_message.
        let m = unsafe { *message };
        let mut guard = lock(ch)?;
        let c = consumer(&mut guard)?;
        if c.is_fan_in() {
            // Its producers' released semaphores are not handed to the consumer to signal.
            return Err(Failure {
                status: lf_status::LF_ERR_UNSUPPORTED,
                message: format!(
                    "channel {:?} is a fan-in: releases with a signal on the GPU are for pair channels only; release \
                     message {} with lf_release",
                    c.name(),
                    m.sequence
                ),
            });
        }
        let held = (m.flags & LF_MESSAGE_GPU != 0).then(|| ch.gpu_messages.release_by_caller(m.session, m.sequence));
        let (view, buffer_freed, value) = match held.flatten() {
            Some(Ok(released)) => released,
            Some(Err(why)) => {
                return Err(Failure {
                    status: lf_status::LF_ERR_UNSUPPORTED,
                    message: format!(
                        "GPU message {} cannot be released with a signal on the GPU: {why}; release it with lf_release",
                        m.sequence
                    ),
                })
            }
            None => {
                return Err(Failure {
                    status: lf_status::LF_ERR_INVALID_STATE,
                    message: format!(
                        "message {} is not a GPU message held by this consumer (flags {:#x}; already released, or not \
                         received from this channel)",
                        m.sequence, m.flags
                    ),
                })
            }
        };
        // SAFETY: the table held this view for C and gave it up here, once, after letting go of
        // the message's buffer and payload.
        unsafe { ends::release(c, &view)? };
        write_out(out, value);
        buffer_freed
    })
}

/// The GPU buffer a received LF_MESSAGE_GPU message carries, as an `lf_buffer` lent until
/// `lf_release` of the message (do not `lf_free` it): usable with `lf_buffer_copy` (the copy
/// waits on the GPU for the message's `ready_value`), `lf_buffer_read`, and `lf_buffer_export`
/// to hand the memory to CUDA or OpenCL (`cudaImportExternalMemory`; the export names the
/// producer's arena, so an importer can cache by `exporter_pid`, `exporter_token` and
/// `arena_id`). The same handle is lent each time it is asked for. LF_ERR_INVALID_STATE for a
/// message that carries no GPU buffer or is not held.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `message` NULL or a readable lf_message; `out`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_message_buffer(
    channel: *mut lf_channel,
    message: *const lf_message,
    out: *mut *const lf_buffer,
) -> lf_status {
    boundary("lf_message_buffer", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        if message.is_null() {
            return Err(Failure::null("message"));
        }
        // SAFETY: non-NULL; the caller promises a readable lf_message.
        let m = unsafe { *message };
        let _guard = lock(ch)?;
        let lent = (m.flags & LF_MESSAGE_GPU != 0).then(|| ch.gpu_messages.buffer(m.session, m.sequence)).flatten();
        let Some(handle) = lent else {
            return Err(Failure {
                status: lf_status::LF_ERR_INVALID_STATE,
                message: format!(
                    "message {} carries no GPU buffer held by this channel (flags {:#x}; already released?)",
                    m.sequence, m.flags
                ),
            });
        };
        write_out(out, handle?.cast_const());
        Ok(())
    })
}

/// The CUDA device address of a received LF_MESSAGE_CUDA message's first byte in this process
/// (`*ptr`, a `CUdeviceptr`), and this process's ordinal of the CUDA device that holds it
/// (`*device`: the producer's GPU; make that device's primary context current, as the CUDA
/// runtime does, to use the address). Where this process uses another GPU with a peer path to
/// it, lava-flow has enabled peer access from that GPU's primary context: kernels there read
/// the address in place, and `cuMemcpyDtoDAsync` into that GPU's memory goes GPU to GPU (a
/// lava-flow GPU buffer sent to a consumer on another GPU arrives so). Valid until `lf_release` of the message: read it with `cuMemcpyDtoH` or
/// kernels, and finish that work before the release. The producer's memory itself: what is
/// written through it is what the producer sees once the message completes.
/// LF_ERR_INVALID_STATE, saying what the message is, for a message that is not CUDA memory
/// (host bytes: `data`; a lava-flow GPU buffer: `lf_message_buffer`) or is not held.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `message` NULL or a readable lf_message; `ptr`
/// and `device` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_message_cuda_ptr(
    channel: *mut lf_channel,
    message: *const lf_message,
    ptr: *mut u64,
    device: *mut c_int,
) -> lf_status {
    boundary("lf_message_cuda_ptr", || {
        let ptr = out_ptr(ptr, "ptr")?;
        let device = out_ptr(device, "device")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        if message.is_null() {
            return Err(Failure::null("message"));
        }
        // SAFETY: non-NULL; the caller promises a readable lf_message.
        let m = unsafe { *message };
        let _guard = lock(ch)?;
        let found = (m.flags & LF_MESSAGE_GPU != 0).then(|| ch.gpu_messages.cuda_ptr(m.session, m.sequence));
        let (address, ordinal) = match found {
            Some(Some(Some(found))) => found,
            Some(Some(None)) => {
                return Err(Failure {
                    status: lf_status::LF_ERR_INVALID_STATE,
                    message: format!(
                        "message {} is a lava-flow GPU buffer, not CUDA memory: lf_message_buffer lends it (and \
                         lf_buffer_export hands it to CUDA)",
                        m.sequence
                    ),
                })
            }
            Some(None) => {
                return Err(Failure {
                    status: lf_status::LF_ERR_INVALID_STATE,
                    message: format!(
                        "GPU message {} is not held by this consumer (already released, or not received from this \
                         channel)",
                        m.sequence
                    ),
                })
            }
            None => {
                return Err(Failure {
                    status: lf_status::LF_ERR_INVALID_STATE,
                    message: format!(
                        "message {} is {} bytes in host memory at its data pointer, not CUDA memory",
                        m.sequence, m.len
                    ),
                })
            }
        };
        write_out(ptr, address);
        write_out(device, ordinal);
        Ok(())
    })
}

/// A new file descriptor of the ready semaphore of the producer in slot `producer` (an
/// `lf_message`'s `producer`), consumers only: on a fan-in each producer has its own, which
/// its GPU messages' `ready_value` counts on (`lf_channel_ready_semaphore` is refused there
/// with LF_ERR_INVALID_STATE); on a pair channel, slot 0 is its producer. The caller owns the
/// fd. LF_ERR_UNSUPPORTED where that producer's GPU buffers are synchronised on the host (as
/// with Mesa's lavapipe) or staged, with the reason; LF_ERR_INVALID_STATE for a slot with no
/// producer.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `fd` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_producer_ready_semaphore(
    channel: *mut lf_channel,
    producer: u32,
    fd: *mut c_int,
) -> lf_status {
    boundary("lf_channel_producer_ready_semaphore", || {
        let out = out_ptr(fd, "fd")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let owned = consumer(&mut guard)?.producer_ready_semaphore(producer)?;
        write_out(out, crate::descriptor_to_c(owned, "lf_channel_producer_ready_semaphore")?);
        Ok(())
    })
}
