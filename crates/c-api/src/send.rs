//! A producer's calls: `lf_send` and `lf_try_send` (copies, or references for bytes inside a
//! buffer), `lf_send_buffer` and `lf_send_buffer_after` (buffers by reference), loans
//! (`lf_loan`, `lf_publish`, `lf_loan_cancel`), completion (`lf_completed`,
//! `lf_wait_completed`), and the GPU semaphores its GPU work signals and waits on.

use std::ffi::{c_int, c_void};

use super::buffer::lf_buffer;
use super::channel::{lf_channel, lock, producer};
use super::channel_config::timeout;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure, FfiResult};
use lava_flow::channels::transport::RawLoan;
use lava_flow::channels::{raw as ends, Channel};

/// Room lent by `lf_loan`: write up to `len` bytes at `data`, then `lf_publish`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_loan_region {
    pub data: *mut c_void,
    pub len: usize,
    /// Internal: identifies the loan. Do not change.
    pub token: u64,
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

fn payload<'a>(data: *const c_void, len: usize) -> FfiResult<&'a [u8]> {
    if data.is_null() {
        return Err(Failure::null("data"));
    }
    if len == 0 {
        return Err(invalid("len is 0; a message needs at least one byte".into()));
    }
    // SAFETY: non-NULL; the C caller promises `len` readable bytes at `data` for the call.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
}

fn write_sequence(out: *mut u64, seq: u64) {
    if !out.is_null() {
        write_out(out, seq);
    }
}

/// Sends `len` bytes at `data` as the next message, waiting for room up to `timeout_ns`
/// (LF_ERR_TIMEOUT; 0: LF_ERR_WOULD_BLOCK at once when full). `*sequence` (if not NULL)
/// receives the message's number.
///
/// The bytes are copied into the channel's pool (from 512 KiB on several threads where the
/// process may run on 4 cores or more, or `LF_COPY_THREADS` is set), unless they lie inside
/// one buffer of the channel's context (CPU memory from `lf_alloc` or `lf_import`, or the host
/// mapping of a GPU buffer from `lf_alloc`, where the channel sends GPU buffers by reference)
/// and are longer than 112 bytes: then they go by reference, as `lf_send_buffer` sends them,
/// and must not be written until the message is complete (`lf_wait_completed`). The
/// receiver's `lf_message.flags` tells which (LF_MESSAGE_GPU for GPU memory).
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `data` NULL or `len` readable bytes;
/// `sequence` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_send(
    channel: *mut lf_channel,
    data: *const c_void,
    len: usize,
    timeout_ns: i64,
    sequence: *mut u64,
) -> lf_status {
    boundary("lf_send", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let bytes = payload(data, len)?;
        let mut guard = lock(ch)?;
        let seq = ends::send(producer(&mut guard)?, bytes, timeout(timeout_ns))?;
        write_sequence(sequence, seq);
        Ok(())
    })
}

/// As `lf_send`, but LF_ERR_WOULD_BLOCK at once when the channel is full.
///
/// # Safety
/// As `lf_send`.
#[no_mangle]
pub unsafe extern "C" fn lf_try_send(
    channel: *mut lf_channel,
    data: *const c_void,
    len: usize,
    sequence: *mut u64,
) -> lf_status {
    boundary("lf_try_send", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let bytes = payload(data, len)?;
        let mut guard = lock(ch)?;
        let seq = producer(&mut guard)?.try_send(bytes)?;
        write_sequence(sequence, seq);
        Ok(())
    })
}

/// Sends `len` bytes at `offset` of `buffer` by reference as the next message, waiting for
/// room up to `timeout_ns` (LF_ERR_TIMEOUT; 0: LF_ERR_WOULD_BLOCK at once when full). Do not
/// write or free the range until the message is complete (`lf_completed`,
/// `lf_wait_completed`); the channel keeps the buffer's memory alive until then. `*sequence`
/// (if not NULL) receives the message's number.
///
/// CPU buffers from `lf_alloc`, `lf_alloc_auto` or `lf_import`: the consumer maps the
/// buffer's arena once per channel and reads the bytes where they lie. GPU buffers
/// (LF_MEMORY_GPU_*): through the channel's GPU route, by reference where the consumer's
/// process shares the GPU (the arena is exported once per channel and imported once by the
/// consumer, which receives an `lf_buffer`: `lf_message_buffer`), else copied through host
/// memory; `lf_channel_transport` says which. The bytes must be in place when this is called
/// (lava-flow's own writes and copies are); for GPU work still running, see
/// `lf_send_buffer_after`. CUDA memory registered with `lf_register` (a tensor of the
/// application's): by reference to a consumer on this host that opens CUDA memory (the
/// channel's cuda_ipc route; it receives LF_MESSAGE_CUDA messages: `lf_message_cuda_ptr`):
/// cudaMalloc memory as a legacy CUDA IPC handle, VMM memory with POSIX fd handles as an fd per
/// piece, memory of a pool with POSIX fd handle types as its pool's fd (once per channel) and
/// its export data, each allocation passed once per channel; the work that writes it must have
/// finished (synchronise its stream first), or use `lf_send_buffer_after` to send it
/// stream-ordered. Do not free cudaMalloc or pool memory before `lf_wait_completed`
/// (the channel cannot keep it alive; VMM pieces it keeps). To a consumer on another host (the
/// mpi carrier), any CUDA memory is copied from the device into the message as it goes (the
/// work that writes it done first; no ready value). LF_ERR_UNSUPPORTED, naming the allocator
/// and the way out and copying nothing, for CUDA memory no other process can open (managed
/// memory, memory pools without POSIX fd handle types, VMM memory without fd handles) to a
/// consumer on this host, and where that consumer cannot open CUDA memory. LF_ERR_UNSUPPORTED for other registered user memory
/// (`lf_register`);
/// LF_ERR_INVALID_ARGUMENT for an empty range or one outside the buffer. LF_ERR_WOULD_BLOCK
/// also where the consumer has not yet read the arenas passed to it before (it reads them as
/// it receives); try again later.
///
/// A CPU range of at most 112 bytes is copied into the message instead, which costs less
/// than a reference: the message is complete at once (`lf_wait_completed` returns without
/// waiting) and the receiver's `lf_message.flags` lacks LF_MESSAGE_ZERO_COPY.
///
/// # Safety
/// `channel` and `buffer` NULL or pointers from lava-flow; `sequence` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_send_buffer(
    channel: *mut lf_channel,
    buffer: *const lf_buffer,
    offset: usize,
    len: usize,
    timeout_ns: i64,
    sequence: *mut u64,
) -> lf_status {
    boundary("lf_send_buffer", || send_buffer(channel, buffer, offset, len, 0, timeout_ns, sequence))
}

/// As `lf_send_buffer` for a GPU buffer, or CUDA memory registered with `lf_register`, whose
/// contents the producer's own GPU work is still writing: they are in place once the channel's
/// ready semaphore (`lf_channel_ready_semaphore`, imported into that work's API, e.g.
/// `cudaImportExternalSemaphore`) reaches `ready_value`, which the work signals
/// (`cudaSignalExternalSemaphoresAsync` on the stream that writes it, after the writes). The
/// consumer's GPU work waits for it on the GPU (`lf_message.ready_value`; for CUDA memory,
/// `cudaWaitExternalSemaphoresAsync` on the consumer's stream). Values must grow from message
/// to message, GPU buffers and CUDA memory alike: one semaphore (the consumer refuses one that
/// goes back, LF_ERR_CORRUPT). LF_ERR_UNSUPPORTED, naming why, where the channel synchronises
/// GPU buffers on the host or stages them. CUDA memory shares the GPU buffers' semaphore, so it
/// needs a Vulkan device in both processes' contexts on the same GPU, sharing timeline
/// semaphores (`lf_channel_transport` says whether), and memory of that GPU: elsewhere
/// LF_ERR_UNSUPPORTED names why; the way out is to synchronise the stream that writes it and
/// send it with `lf_send_buffer`. LF_ERR_INVALID_ARGUMENT for `ready_value` 0 (use
/// `lf_send_buffer`).
///
/// # Safety
/// As `lf_send_buffer`.
#[no_mangle]
pub unsafe extern "C" fn lf_send_buffer_after(
    channel: *mut lf_channel,
    buffer: *const lf_buffer,
    offset: usize,
    len: usize,
    ready_value: u64,
    timeout_ns: i64,
    sequence: *mut u64,
) -> lf_status {
    boundary("lf_send_buffer_after", || {
        if ready_value == 0 {
            return Err(invalid("ready_value is 0, which means ready now: use lf_send_buffer".into()));
        }
        send_buffer(channel, buffer, offset, len, ready_value, timeout_ns, sequence)
    })
}

#[inline(always)]
fn send_buffer(
    channel: *mut lf_channel,
    buffer: *const lf_buffer,
    offset: usize,
    len: usize,
    ready_value: u64,
    timeout_ns: i64,
    sequence: *mut u64,
) -> FfiResult {
    let ch = handle_ref(channel as *const lf_channel, "channel")?;
    let buffer = &handle_ref(buffer, "buffer")?.buffer;
    let mut guard = lock(ch)?;
    let p = producer(&mut guard)?;
    let seq = ends::send_buffer(p, buffer, offset, len, ready_value, timeout(timeout_ns))?;
    write_sequence(sequence, seq);
    Ok(())
}

/// A new file descriptor of the channel's ready semaphore: a Vulkan timeline semaphore
/// exported as an opaque fd, for `cudaImportExternalSemaphore`
/// (`cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd`, which takes the fd) or
/// `vkImportSemaphoreFdKHR`. A producer's GPU work signals it (see `lf_send_buffer_after`); a
/// consumer's GPU work waits on a message's `ready_value`. The caller owns the fd. The
/// consumer's semaphore is its current producer's (a new producer brings a new one); a
/// fan-in's consumer has one per producer: `lf_channel_producer_ready_semaphore` (this call
/// is refused there with LF_ERR_INVALID_STATE). LF_ERR_UNSUPPORTED where the channel synchronises GPU buffers on the host (the driver
/// cannot share semaphores, as with Mesa's lavapipe) or stages them, with the reason.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `fd` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_ready_semaphore(channel: *mut lf_channel, fd: *mut c_int) -> lf_status {
    boundary("lf_channel_ready_semaphore", || {
        let out = out_ptr(fd, "fd")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let owned = match &mut *guard {
            Channel::Producer(p) => p.ready_semaphore()?,
            Channel::Consumer(c) => c.ready_semaphore()?,
        };
        write_out(out, crate::descriptor_to_c(owned, "lf_channel_ready_semaphore")?);
        Ok(())
    })
}

/// A new file descriptor of the channel's released semaphore: a Vulkan timeline semaphore
/// exported as an opaque fd, which the consumer signals to `sequence + 1` once it let go of GPU
/// message `sequence` and every GPU message before it. The producer's GPU work waits for that
/// value before rewriting the buffer (`cudaWaitExternalSemaphoresAsync`), where
/// `lf_wait_completed` waits on the host. A consumer whose own GPU work reads the buffer must
/// finish it before `lf_release`, or release with `lf_release_on_gpu` and signal this
/// semaphore on its GPU after that work (a consumer asks here for the fd to import; pair
/// channels only). Needs `released_semaphore` set in the producer's channel config. The caller
/// owns the fd. LF_ERR_UNSUPPORTED, with the reason, where the channel has none.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `fd` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_released_semaphore(channel: *mut lf_channel, fd: *mut c_int) -> lf_status {
    boundary("lf_channel_released_semaphore", || {
        let out = out_ptr(fd, "fd")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let owned = match &mut *guard {
            Channel::Producer(p) => p.released_semaphore()?,
            Channel::Consumer(c) => c.released_semaphore()?,
        };
        write_out(out, crate::descriptor_to_c(owned, "lf_channel_released_semaphore")?);
        Ok(())
    })
}

/// Lends `len` bytes of shared memory to write the next message in place, waiting for room up
/// to `timeout_ns` (0: LF_ERR_WOULD_BLOCK at once when full). One loan at a time; finish it
/// with `lf_publish` or `lf_loan_cancel`.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_loan(
    channel: *mut lf_channel,
    len: usize,
    timeout_ns: i64,
    out: *mut lf_loan_region,
) -> lf_status {
    boundary("lf_loan", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        if len == 0 {
            return Err(invalid("len is 0; a message needs at least one byte".into()));
        }
        let mut guard = lock(ch)?;
        let p = producer(&mut guard)?;
        let raw = ends::loan(p, len, timeout(timeout_ns))?;
        write_out(out, lf_loan_region { data: raw.ptr.cast(), len: raw.len, token: raw.token });
        Ok(())
    })
}

fn raw_loan(loan: *const lf_loan_region) -> FfiResult<RawLoan> {
    if loan.is_null() {
        return Err(Failure::null("loan"));
    }
    // SAFETY: non-NULL; the caller promises a readable lf_loan_region.
    let l = unsafe { *loan };
    Ok(RawLoan { ptr: l.data.cast(), len: l.len, token: l.token })
}

/// Publishes the first `len` bytes (1 to the loan's length) of the outstanding loan as the
/// next message. `*sequence` (if not NULL) receives its number.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `loan` NULL or a loan from `lf_loan`;
/// `sequence` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_publish(
    channel: *mut lf_channel,
    loan: *const lf_loan_region,
    len: usize,
    sequence: *mut u64,
) -> lf_status {
    boundary("lf_publish", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let raw = raw_loan(loan)?;
        let mut guard = lock(ch)?;
        // SAFETY: lf_publish's contract: the loan is the one lf_loan lent on this channel, which
        // C no longer writes. The carrier checks its token, pointer and length against the loan
        // it has out, and refuses any other.
        let seq = unsafe { ends::publish(producer(&mut guard)?, raw, len)? };
        write_sequence(sequence, seq);
        Ok(())
    })
}

/// Gives an unpublished loan back. A loan that is not outstanding is ignored.
///
/// # Safety
/// As `lf_publish`.
#[no_mangle]
pub unsafe extern "C" fn lf_loan_cancel(channel: *mut lf_channel, loan: *const lf_loan_region) -> lf_status {
    boundary("lf_loan_cancel", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let raw = raw_loan(loan)?;
        let mut guard = lock(ch)?;
        // SAFETY: as in lf_publish; the carrier ignores a loan it does not have out.
        unsafe { ends::cancel(producer(&mut guard)?, raw) };
        Ok(())
    })
}

/// How many messages the consumer has released: all sequence numbers below `*out` are done
/// (on a fan-out, released by every consumer that got them).
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_completed(channel: *mut lf_channel, out: *mut u64) -> lf_status {
    boundary("lf_completed", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        write_out(out, producer(&mut guard)?.completed()?);
        Ok(())
    })
}

/// Waits up to `timeout_ns` until message `sequence` has been released by the consumer (on a
/// fan-out, by every consumer that got it; one that dies or is detached meanwhile no longer
/// counts).
/// That message only: a buffer send of at most 112 bytes is copied into its message and
/// complete at once, while earlier messages sent by reference may still be read. Before
/// reusing memory that several messages point into, wait for each of them, or until
/// `lf_completed` passes the last.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL.
#[no_mangle]
pub unsafe extern "C" fn lf_wait_completed(channel: *mut lf_channel, sequence: u64, timeout_ns: i64) -> lf_status {
    boundary("lf_wait_completed", || {
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        producer(&mut guard)?.wait_completed(sequence, timeout(timeout_ns))?;
        Ok(())
    })
}
