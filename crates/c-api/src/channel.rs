//! `lf_channel`: one end of a Layer 2 channel, with copy sends, loans, buffer sends (by
//! reference), zero-copy receive views and a pollable fd.
//!
//! Ownership: an `lf_channel` is exclusively owned by its creator and released with
//! `lf_channel_free`. A channel may be used from any thread but by one thread at a time; a
//! call that finds it busy in another thread fails with LF_ERR_INVALID_STATE instead of
//! racing. Views (`lf_message`) and loans (`lf_loan_region`) are plain structs the caller keeps; they
//! are checked when handed back, so a released, foreign or forged one is refused with
//! LF_ERR_INVALID_STATE. Release every view before freeing its channel: freeing unmaps the
//! memory the views point into.
//!
//! Timeouts are in nanoseconds; a negative value waits forever.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::time::Duration;

use parking_lot::Mutex;

use super::abi::{c_enum, read_struct, write_struct, CEnum, GrowableStruct};
use super::buffer::lf_buffer;
use super::context::lf_context;
use super::exclusive::{Exclusive, ExclusiveGuard};
use super::location::lf_location;
use super::raw;
use super::status::lf_status;
use super::{
    boundary, boundary_void, c_str, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult,
};
use lava_flow::channels::transport::{RawLoan, RawView, RoutedPayload};
use lava_flow::channels::{raw as ends, Channel, ChannelConfig, Consumer, Producer, Role, WaitStrategy};

/// Which end of a channel a process creates (`lf_channel_create`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_role {
    /// The producing end.
    LF_ROLE_PRODUCER = 1,
    /// The consuming end.
    LF_ROLE_CONSUMER = 2,
}
c_enum!(lf_role: LF_ROLE_PRODUCER, LF_ROLE_CONSUMER);

/// How a channel end waits for its peer (`lf_channel_config.wait_strategy`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_wait_strategy {
    /// Spin on shared memory while waiting (lowest latency, a busy core).
    LF_WAIT_BUSY_POLL = 1,
    /// Spin for `spin_ns`, then sleep. The default.
    LF_WAIT_SPIN_THEN_BLOCK = 2,
    /// Sleep at once (no CPU while waiting).
    LF_WAIT_BLOCK = 3,
}
c_enum!(lf_wait_strategy: LF_WAIT_BUSY_POLL, LF_WAIT_SPIN_THEN_BLOCK, LF_WAIT_BLOCK);

/// Channel options. Fill with `lf_channel_config_init` and change what you need.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_channel_config {
    /// `sizeof(lf_channel_config)`, set by `lf_channel_config_init`. See "Growable structs" at
    /// the top of this header.
    pub struct_size: u32,
    pub wait_strategy: raw::lf_wait_strategy,
    /// Spin time before sleeping, for LF_WAIT_SPIN_THEN_BLOCK.
    pub spin_ns: u64,
    /// Messages in flight at most: a power of two from 2 to 2^20. Producer's value rules.
    pub capacity: u32,
    /// 1 (the default): `lf_send` of bytes inside a lava-flow buffer sends them by reference,
    /// and they must not be rewritten until the message completes (`lf_wait_completed`).
    /// 0: `lf_send` always copies, and the bytes may be reused as soon as it returns.
    pub auto_zero_copy: u32,
    /// Shared payload pool in bytes, also the largest message: 1 to 2^40 (1 TiB), checked on
    /// both ends at `lf_channel_create`. Producer's value rules.
    pub pool_size: u64,
    /// How long lf_channel_create waits for the peer; negative: forever.
    pub rendezvous_timeout_ns: i64,
    /// 1: GPU buffers must go by reference with GPU-side synchronisation; where they would be
    /// staged through host memory (the consumer on another GPU, or without one) or
    /// synchronised on the host (the driver cannot share semaphores), `lf_channel_create`
    /// fails instead, saying why. 0 (the default): those fallbacks are taken and reported by
    /// `lf_channel_transport`.
    pub strict_gpu: u32,
    /// 1: the consumer signals the producer's released semaphore
    /// (`lf_channel_released_semaphore`) as it lets go of GPU messages, so that the
    /// producer's GPU work can wait for a buffer's release on the GPU. 0 (the default): no
    /// semaphore signal per GPU message; `lf_wait_completed` waits on the host. Producer's
    /// value rules.
    pub released_semaphore: u32,
    /// 1 (the default): the producer faults the shared pool in when the channel is made (and
    /// the consumer maps it in whole), where it is at most a quarter of the available memory,
    /// so that first touches do not fault in the message path. 0: pages fault in as used.
    /// Producer's value rules.
    pub prefault: u32,
    /// Must be 0 (it keeps the struct free of padding).
    pub reserved: u32,
}

/// The defaults, with `struct_size` set (what `lf_channel_config_init` gives).
impl Default for lf_channel_config {
    fn default() -> Self {
        ChannelConfig::default().into()
    }
}

// SAFETY: repr(C), starts with the u32 size, integers only.
unsafe impl GrowableStruct for lf_channel_config {
    const NAME: &'static str = "lf_channel_config";
    const SIZES: &'static [usize] = &[56];
}

/// `lf_message.flags`: the bytes lie in the sender's own lava-flow buffer (`lf_send_buffer`,
/// or `lf_send` of bytes inside a buffer): nothing was copied.
pub const LF_MESSAGE_ZERO_COPY: u32 = 1;
/// `lf_message.flags`: the payload is GPU memory of the sender's, shared with this process's
/// GPU: `lf_message_buffer` gives it as an `lf_buffer`; `data` is its host address where the
/// host can map it, else NULL.
pub const LF_MESSAGE_GPU: u32 = 2;

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
    /// LF_MESSAGE_ZERO_COPY, LF_MESSAGE_GPU, or 0.
    pub flags: u32,
    pub reserved: u32,
    /// For LF_MESSAGE_GPU: the value of the channel's ready semaphore
    /// (`lf_channel_ready_semaphore`) at which the payload is in place; 0: in place now.
    /// lava-flow's own GPU work on the message's buffer (`lf_buffer_copy`) waits for it.
    pub ready_value: u64,
}

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

/// Opaque handle on one end of a channel.
#[allow(non_camel_case_types)]
pub struct lf_channel {
    channel: Exclusive<Channel>,
    /// GPU messages received and not yet released, by (session, sequence); only touched with
    /// `channel` locked.
    gpu_held: Mutex<HashMap<(u64, u64), HeldGpu>>,
    /// The report as last handed out, (name, reason): C holds pointers into these. Reports
    /// that change (a new producer brings another GPU route) are kept, never freed before the
    /// channel, so that no pointer handed out dangles.
    reports: Mutex<Vec<(CString, CString)>>,
}

/// A received GPU message: the carrier's view (released by `lf_release`) and its payload,
/// lent to C as an `lf_buffer` handle once asked for.
struct HeldGpu {
    view: RawView,
    payload: Option<RoutedPayload>,
    handle: Option<*mut lf_buffer>,
}

impl Drop for lf_channel {
    fn drop(&mut self) {
        // GPU messages never released go with the channel: their buffers, then their views,
        // so that the consumer's imports of the producer's memory are let go too.
        let channel = self.channel.get_mut();
        for (_, held) in self.gpu_held.get_mut().drain() {
            if let Some(handle) = held.handle {
                let _ = super::buffer::release_borrowed(handle);
            }
            drop(held.payload);
            if let Channel::Consumer(c) = channel {
                // SAFETY: the table held the view for C, which handed it back (or the channel closes); nothing of it is used after.
                let _ = unsafe { ends::release(c, &held.view) };
            }
        }
    }
}

// SAFETY: the handle is a token into the handle table (see ffi::handle), not a pointer that
// is dereferenced; it may be freed from any thread.
unsafe impl Send for HeldGpu {}

impl From<ChannelConfig> for lf_channel_config {
    fn from(c: ChannelConfig) -> Self {
        let (wait_strategy, spin_ns) = match c.wait {
            WaitStrategy::BusyPoll => (lf_wait_strategy::LF_WAIT_BUSY_POLL, 0),
            WaitStrategy::SpinThenBlock { spin } => (lf_wait_strategy::LF_WAIT_SPIN_THEN_BLOCK, spin.as_nanos() as u64),
            WaitStrategy::Block => (lf_wait_strategy::LF_WAIT_BLOCK, 0),
        };
        lf_channel_config {
            struct_size: std::mem::size_of::<lf_channel_config>() as u32,
            wait_strategy: wait_strategy.to_c(),
            capacity: c.capacity,
            spin_ns,
            pool_size: c.pool_size as u64,
            rendezvous_timeout_ns: c.rendezvous_timeout.map_or(-1, |t| t.as_nanos().min(i64::MAX as u128) as i64),
            auto_zero_copy: u32::from(c.auto_zero_copy),
            strict_gpu: u32::from(c.strict_gpu),
            released_semaphore: u32::from(c.released_semaphore),
            prefault: u32::from(c.prefault),
            reserved: 0,
        }
    }
}

fn report_strings(info: &lava_flow::channels::TransportInfo) -> (CString, CString) {
    let name = CString::new(info.names()).expect("no NUL in transport names");
    let reason = CString::new(info.reason.replace('\0', "")).expect("NULs removed");
    (name, reason)
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

fn to_config(c: &lf_channel_config) -> FfiResult<ChannelConfig> {
    let wait = match lf_wait_strategy::from_c(c.wait_strategy, "wait_strategy")? {
        lf_wait_strategy::LF_WAIT_BUSY_POLL => WaitStrategy::BusyPoll,
        lf_wait_strategy::LF_WAIT_SPIN_THEN_BLOCK => {
            WaitStrategy::SpinThenBlock { spin: Duration::from_nanos(c.spin_ns) }
        }
        lf_wait_strategy::LF_WAIT_BLOCK => WaitStrategy::Block,
    };
    if c.reserved != 0 {
        return Err(invalid(format!("lf_channel_config.reserved is {}; it must be 0", c.reserved)));
    }
    let pool_size =
        usize::try_from(c.pool_size).map_err(|_| invalid(format!("pool_size {} is too large", c.pool_size)))?;
    if pool_size == 0 {
        return Err(invalid("pool_size is 0".into()));
    }
    for (name, value) in [
        ("auto_zero_copy", c.auto_zero_copy),
        ("strict_gpu", c.strict_gpu),
        ("released_semaphore", c.released_semaphore),
        ("prefault", c.prefault),
    ] {
        if value > 1 {
            return Err(invalid(format!("{name} is {value} (use 0 or 1); start from lf_channel_config_init")));
        }
    }
    Ok(ChannelConfig {
        wait,
        capacity: c.capacity,
        pool_size,
        rendezvous_timeout: timeout(c.rendezvous_timeout_ns),
        transports: None,
        auto_zero_copy: c.auto_zero_copy == 1,
        strict_gpu: c.strict_gpu == 1,
        released_semaphore: c.released_semaphore == 1,
        prefault: c.prefault == 1,
    })
}

fn timeout(ns: i64) -> Option<Duration> {
    u64::try_from(ns).ok().map(Duration::from_nanos)
}

/// Locks the channel for this call; another thread in the middle of a call is an error, not
/// a wait.
fn lock(ch: &lf_channel) -> FfiResult<ExclusiveGuard<'_, Channel>> {
    ch.channel.try_lock().ok_or_else(|| Failure {
        status: lf_status::LF_ERR_INVALID_STATE,
        message: "the channel is in use by another thread; use a channel from one thread at a time".into(),
    })
}

fn producer(guard: &mut Channel) -> FfiResult<&mut Producer> {
    match guard {
        Channel::Producer(p) => Ok(p),
        Channel::Consumer(_) => Err(Failure {
            status: lf_status::LF_ERR_INVALID_STATE,
            message: "this channel end is a consumer; only a producer sends".into(),
        }),
    }
}

fn consumer(guard: &mut Channel) -> FfiResult<&mut Consumer> {
    match guard {
        Channel::Consumer(c) => Ok(c),
        Channel::Producer(_) => Err(Failure {
            status: lf_status::LF_ERR_INVALID_STATE,
            message: "this channel end is a producer; only a consumer receives".into(),
        }),
    }
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

/// Fills `*config` with the defaults (spin-then-block for 50 us, 256 messages, a 16 MiB pool,
/// a 10 s rendezvous timeout, `auto_zero_copy` and `prefault` on) and sets its `struct_size`
/// to `struct_size`, which is `sizeof(lf_channel_config)` as the caller's header has it:
/// `lf_channel_config_init(&config, sizeof config)`. Fields this library does not know (a
/// newer header's) are set to 0. LF_ERR_INVALID_ARGUMENT for a size that is not one of the
/// struct's.
///
/// # Safety
/// `config` must be NULL (rejected) or writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_config_init(config: *mut lf_channel_config, struct_size: usize) -> lf_status {
    boundary("lf_channel_config_init", || {
        let config = out_ptr(config, "config")?;
        // SAFETY: the caller promises `struct_size` writable bytes.
        unsafe { write_struct(config, struct_size, lf_channel_config::default()) }
    })
}

/// Creates this process's end of channel `name` (1-64 bytes of letters, digits, `-_.`) and
/// waits for the other end; either may start first. `context` is this process's memory
/// context: `lf_send` of bytes inside one of its buffers goes by reference. The channel
/// keeps what it needs of the context, which may be freed before the channel. `role` says
/// which end this is. The transport follows the scope between
/// `my_location` and `peer_location` (and `LF_TRANSPORTS`); `lf_channel_transport` tells
/// which and why. `config` may be NULL for the defaults.
///
/// A channel has one producer and one consumer at a time: a second one of a live channel is
/// refused at once with LF_ERR_INVALID_STATE ("already has a live producer (pid N)"). A new
/// producer may attach once the previous one has closed or died.
///
/// # Safety
/// `context` NULL or a live lf_context; `name` NULL or a NUL-terminated string; the
/// locations NULL or live lf_location handles; `config` NULL or readable for its `struct_size`
/// bytes; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_create(
    context: *const lf_context,
    name: *const c_char,
    role: raw::lf_role,
    my_location: *const lf_location,
    peer_location: *const lf_location,
    config: *const lf_channel_config,
    out: *mut *mut lf_channel,
) -> lf_status {
    boundary("lf_channel_create", || {
        let out = out_ptr(out, "out")?;
        let context = handle_ref(context, "context")?.context.clone();
        let name = c_str(name, "name")?;
        let role = match lf_role::from_c(role, "role")? {
            lf_role::LF_ROLE_PRODUCER => Role::Producer,
            lf_role::LF_ROLE_CONSUMER => Role::Consumer,
        };
        let mine = handle_ref(my_location, "my_location")?.location().clone();
        let peer = handle_ref(peer_location, "peer_location")?.location().clone();
        let config = if config.is_null() {
            ChannelConfig::default()
        } else {
            // SAFETY: non-NULL; the caller promises a config readable for its struct_size bytes.
            to_config(&unsafe { read_struct(config, false) }?)?
        };
        let channel = Channel::create(&context, name, role, &mine, &peer, &config)?;
        let info = channel.transport().clone();
        let reports = Mutex::new(vec![report_strings(&info)]);
        let gpu_held = Mutex::new(HashMap::new());
        write_out(out, new_handle(lf_channel { channel: Exclusive::new(channel), gpu_held, reports })?);
        Ok(())
    })
}

/// Lends the name of the transports the channel uses (`"shm"`, or `"shm+vulkan_ipc"` when GPU
/// buffers take the Vulkan IPC route) and, if `reason` is not NULL, sentences on each route:
/// why it was chosen, and how GPU buffers are synchronised or why they are staged. Both
/// strings are owned by the channel and valid until it is freed. A consumer's report follows
/// its current producer: a new one may bring another GPU route.
///
/// # Safety
/// `channel` must be NULL or a pointer from lava-flow; `name` NULL or writable; `reason` NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_transport(
    channel: *const lf_channel,
    name: *mut *const c_char,
    reason: *mut *const c_char,
) -> lf_status {
    boundary("lf_channel_transport", || {
        let name = out_ptr(name, "name")?;
        let ch = handle_ref(channel, "channel")?;
        let mut reports = ch.reports.lock();
        // A channel in use by another thread answers with the report it gave last.
        if let Some(guard) = ch.channel.try_lock() {
            let info = guard.transport();
            let unchanged = reports.last().is_some_and(|(_, reason)| reason.as_bytes() == info.reason.as_bytes());
            if !unchanged {
                reports.push(report_strings(info));
            }
        }
        let (now_name, now_reason) = reports.last().expect("one report from the start");
        write_out(name, now_name.as_ptr());
        if !reason.is_null() {
            write_out(reason, now_reason.as_ptr());
        }
        Ok(())
    })
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
/// `lf_send_buffer_after`. LF_ERR_UNSUPPORTED for registered user memory (`lf_register`);
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

/// As `lf_send_buffer` for a GPU buffer whose contents the producer's own GPU work is still
/// writing: they are in place once the channel's ready semaphore (`lf_channel_ready_semaphore`,
/// imported into that work's API, e.g. `cudaImportExternalSemaphore`) reaches `ready_value`,
/// which the work signals (`cudaSignalExternalSemaphoresAsync`). The consumer's GPU work waits
/// for it on the GPU. Values must grow from message to message (the consumer refuses one that
/// goes back, LF_ERR_CORRUPT). LF_ERR_UNSUPPORTED where the channel synchronises GPU buffers on
/// the host or stages them; LF_ERR_INVALID_ARGUMENT for `ready_value` 0 (use `lf_send_buffer`).
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
/// consumer's semaphore is its current producer's (a new producer brings a new one).
/// LF_ERR_UNSUPPORTED where the channel synchronises GPU buffers on the host (the driver
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
        write_out(out, owned.into_raw_fd());
        Ok(())
    })
}

/// A new file descriptor of the channel's released semaphore (producers only): a Vulkan
/// timeline semaphore exported as an opaque fd, which the consumer signals to `sequence + 1`
/// once it let go of GPU message `sequence` and every GPU message before it. The producer's
/// GPU work waits for that value before rewriting the buffer
/// (`cudaWaitExternalSemaphoresAsync`), where `lf_wait_completed` waits on the host. A
/// consumer whose own GPU work reads the buffer must finish it before `lf_release`. Needs
/// `released_semaphore` set in the channel's config. The caller owns the fd.
/// LF_ERR_UNSUPPORTED, with the reason, where the channel has none.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `fd` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_released_semaphore(channel: *mut lf_channel, fd: *mut c_int) -> lf_status {
    boundary("lf_channel_released_semaphore", || {
        let out = out_ptr(fd, "fd")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let owned = producer(&mut guard)?.released_semaphore()?;
        write_out(out, owned.into_raw_fd());
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
        unsafe { ends::cancel(producer(&mut guard)?, raw) };
        Ok(())
    })
}

/// How many messages the consumer has released: all sequence numbers below `*out` are done.
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

/// Waits up to `timeout_ns` until message `sequence` has been released by the consumer.
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
            reserved: 0,
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
    let payload = unsafe { ends::resolve(consumer, &view)? };
    // NULL where the host cannot map the memory.
    let data = payload.as_ptr().cast();
    let m = lf_message {
        data,
        len: payload.len,
        sequence: view.token,
        session: view.session,
        flags: LF_MESSAGE_ZERO_COPY | LF_MESSAGE_GPU,
        reserved: 0,
        ready_value: payload.ready_value,
    };
    ch.gpu_held.lock().insert((view.session, view.token), HeldGpu { view, payload: Some(payload), handle: None });
    write_out(out, m);
    Ok(())
}

/// Receives the next message as a view into shared memory, waiting up to `timeout_ns`
/// (LF_ERR_TIMEOUT). LF_ERR_PEER_GONE once the producer has gone and its messages are read.
/// A new producer of the channel is attached by a later call, only after its predecessor's
/// LF_ERR_PEER_GONE was returned: its messages start again at sequence number 0.
/// Release the view with `lf_release`.
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
        let view = ends::recv(c, timeout(timeout_ns))?;
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
        let view = ends::try_recv(c)?;
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
            let Some(held) = ch.gpu_held.lock().remove(&(m.session, m.sequence)) else {
                return Err(Failure {
                    status: lf_status::LF_ERR_INVALID_STATE,
                    message: format!("GPU message {} is not held by this consumer (already released, or not received from this channel)", m.sequence),
                });
            };
            // The payload's buffer goes first: the producer may reuse the memory once released.
            if let Some(handle) = held.handle {
                super::buffer::release_borrowed(handle)?;
            }
            drop(held.payload);
            unsafe { ends::release(c, &held.view)? };
            return Ok(());
        }
        let view = RawView { ptr: m.data.cast(), len: m.len, token: m.sequence, session: m.session, flags: 0 };
        unsafe { ends::release(c, &view)? };
        Ok(())
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
        let mut held = ch.gpu_held.lock();
        let Some(entry) = held.get_mut(&(m.session, m.sequence)).filter(|_| m.flags & LF_MESSAGE_GPU != 0) else {
            return Err(Failure {
                status: lf_status::LF_ERR_INVALID_STATE,
                message: format!(
                    "message {} carries no GPU buffer held by this channel (flags {:#x}; already released?)",
                    m.sequence, m.flags
                ),
            });
        };
        let handle = match entry.handle {
            Some(handle) => handle,
            None => {
                let payload = entry.payload.take().expect("a payload until its handle is made");
                let buffer = payload.to_buffer().ok_or_else(|| Failure {
                    status: lf_status::LF_ERR_UNSUPPORTED,
                    message: format!(
                        "message {} carries GPU memory that a lava-flow buffer cannot wrap; read it through its data pointer",
                        m.sequence
                    ),
                })?;
                let handle = lf_buffer::into_borrowed_handle(buffer)?;
                entry.handle = Some(handle);
                handle
            }
        };
        write_out(out, handle.cast_const());
        Ok(())
    })
}

/// A file descriptor for poll/epoll: readable while a message waits or after the producer
/// has gone. Owned by the channel (do not close it). After each wake-up, call `lf_try_recv`
/// until LF_ERR_WOULD_BLOCK. Consumers only.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_fd(channel: *mut lf_channel, out: *mut c_int) -> lf_status {
    boundary("lf_channel_fd", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let fd = consumer(&mut guard)?.notify_fd()?.as_raw_fd();
        write_out(out, fd);
        Ok(())
    })
}

/// Closes this end of the channel; the peer sees LF_ERR_PEER_GONE (after reading what was
/// sent). NULL is accepted. Views into the channel become invalid, and so do the buffers of
/// GPU messages not released (`lf_message_buffer`).
///
/// # Safety
/// `channel` must not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_free(channel: *mut lf_channel) {
    boundary_void("lf_channel_free", || free_handle(channel, "channel"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{lf_alloc, lf_register};
    use crate::buffer::{lf_buffer_ptr, lf_free, lf_memory_kind};
    use crate::context::lf_gpu_policy;
    use crate::context::{lf_context_config, lf_context_create, lf_context_free};
    use crate::location::lf_location_detect;
    use crate::location::lf_location_free;
    use crate::status::lf_last_error_message;
    use std::ffi::CStr;
    use std::ptr;

    fn last_error() -> String {
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        unsafe { CStr::from_ptr(lf_last_error_message()) }.to_string_lossy().into_owned()
    }

    struct Loc(*mut lf_location, *mut lf_context);
    // SAFETY: locations are immutable and contexts thread-safe; the test frees them after both
    // threads finish.
    unsafe impl Send for Loc {}
    unsafe impl Sync for Loc {}

    #[test]
    fn send_loan_receive_release_through_the_c_api() {
        unsafe {
            let mut loc = ptr::null_mut();
            assert_eq!(lf_location_detect(&mut loc), lf_status::LF_OK);
            let context_config =
                lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&context_config, &mut context), lf_status::LF_OK);
            let loc = Loc(loc, context);
            let name = CString::new(format!("ffi-unit-{}", std::process::id())).unwrap();
            let mut config: lf_channel_config = std::mem::zeroed();
            assert_eq!(lf_channel_config_init(&mut config, std::mem::size_of_val(&config)), lf_status::LF_OK);
            config.wait_strategy = lf_wait_strategy::LF_WAIT_BLOCK as u32;
            config.capacity = 8;
            let (loc_ref, name_ref, config_ref) = (&loc, &name, &config);
            std::thread::scope(|s| {
                s.spawn(move || {
                    let mut ch = ptr::null_mut();
                    assert_eq!(
                        lf_channel_create(
                            loc_ref.1,
                            name_ref.as_ptr(),
                            lf_role::LF_ROLE_PRODUCER as u32,
                            loc_ref.0,
                            loc_ref.0,
                            config_ref,
                            &mut ch
                        ),
                        lf_status::LF_OK,
                        "{}",
                        last_error()
                    );
                    let mut seq = 99;
                    assert_eq!(lf_send(ch, b"hello".as_ptr().cast(), 5, -1, &mut seq), lf_status::LF_OK);
                    assert_eq!(seq, 0);
                    // Bad input.
                    assert_eq!(lf_send(ch, ptr::null(), 5, -1, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
                    assert_eq!(
                        lf_send(ch, b"x".as_ptr().cast(), 0, -1, ptr::null_mut()),
                        lf_status::LF_ERR_INVALID_ARGUMENT
                    );
                    let mut m: lf_message = std::mem::zeroed();
                    assert_eq!(lf_try_recv(ch, &mut m), lf_status::LF_ERR_INVALID_STATE);
                    let mut loan: lf_loan_region = std::mem::zeroed();
                    assert_eq!(lf_loan(ch, 1000, -1, &mut loan), lf_status::LF_OK);
                    let mut second: lf_loan_region = std::mem::zeroed();
                    assert_eq!(lf_loan(ch, 10, -1, &mut second), lf_status::LF_ERR_INVALID_STATE, "one loan at a time");
                    ptr::write_bytes(loan.data.cast::<u8>(), 0x5a, 1000);
                    let forged = lf_loan_region { token: loan.token + 1, ..loan };
                    assert_eq!(lf_publish(ch, &forged, 1000, ptr::null_mut()), lf_status::LF_ERR_INVALID_STATE);
                    assert_eq!(lf_publish(ch, &loan, 1001, ptr::null_mut()), lf_status::LF_ERR_INVALID_ARGUMENT);
                    assert_eq!(lf_publish(ch, &loan, 1000, &mut seq), lf_status::LF_OK);
                    assert_eq!(seq, 1);
                    assert_eq!(
                        lf_publish(ch, &loan, 1000, ptr::null_mut()),
                        lf_status::LF_ERR_INVALID_STATE,
                        "published twice"
                    );
                    assert_eq!(lf_wait_completed(ch, 1, 10_000_000_000), lf_status::LF_OK, "{}", last_error());
                    let mut done = 0;
                    assert_eq!(lf_completed(ch, &mut done), lf_status::LF_OK);
                    assert_eq!(done, 2);
                    // Buffer sends: explicit, and by itself for bytes inside a buffer.
                    let mut buf = ptr::null_mut();
                    assert_eq!(
                        lf_alloc(loc_ref.1, 8192, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, -1, 0, &mut buf),
                        lf_status::LF_OK
                    );
                    let mut base: *mut c_void = ptr::null_mut();
                    assert_eq!(lf_buffer_ptr(buf, &mut base), lf_status::LF_OK);
                    let base = base.cast::<u8>();
                    ptr::write_bytes(base, 0x33, 8192);
                    assert_eq!(lf_send_buffer(ch, buf, 100, 4000, -1, &mut seq), lf_status::LF_OK, "{}", last_error());
                    assert_eq!(seq, 2);
                    assert_eq!(lf_send(ch, base.add(200).cast(), 1000, -1, &mut seq), lf_status::LF_OK);
                    assert_eq!(seq, 3);
                    assert_eq!(
                        lf_send_buffer(ch, buf, 8000, 193, -1, ptr::null_mut()),
                        lf_status::LF_ERR_INVALID_ARGUMENT
                    );
                    assert_eq!(lf_send_buffer(ch, buf, 0, 0, -1, ptr::null_mut()), lf_status::LF_ERR_INVALID_ARGUMENT);
                    assert_eq!(
                        lf_send_buffer(ch, ptr::null(), 0, 1, -1, ptr::null_mut()),
                        lf_status::LF_ERR_NULL_POINTER
                    );
                    let mut user = vec![0u8; 4096];
                    let mut registered = ptr::null_mut();
                    assert_eq!(
                        lf_register(loc_ref.1, user.as_mut_ptr().cast(), 4096, &mut registered),
                        lf_status::LF_OK
                    );
                    assert_eq!(
                        lf_send_buffer(ch, registered, 0, 10, -1, ptr::null_mut()),
                        lf_status::LF_ERR_UNSUPPORTED
                    );
                    assert!(last_error().contains("registered user memory"), "{}", last_error());
                    lf_free(registered);
                    assert_eq!(lf_wait_completed(ch, 3, 10_000_000_000), lf_status::LF_OK, "{}", last_error());
                    lf_free(buf);
                    let (mut tname, mut reason) = (ptr::null(), ptr::null());
                    assert_eq!(lf_channel_transport(ch, &mut tname, &mut reason), lf_status::LF_OK);
                    assert_eq!(CStr::from_ptr(tname).to_str().unwrap(), "shm");
                    assert!(CStr::from_ptr(reason).to_str().unwrap().contains("scope local"));
                    lf_channel_free(ch);
                    assert_eq!(lf_send(ch, b"x".as_ptr().cast(), 1, -1, ptr::null_mut()), lf_status::LF_ERR_BAD_HANDLE);
                });
                s.spawn(move || {
                    let mut ch = ptr::null_mut();
                    assert_eq!(
                        lf_channel_create(
                            loc_ref.1,
                            name_ref.as_ptr(),
                            lf_role::LF_ROLE_CONSUMER as u32,
                            loc_ref.0,
                            loc_ref.0,
                            config_ref,
                            &mut ch
                        ),
                        lf_status::LF_OK,
                        "{}",
                        last_error()
                    );
                    let mut fd = -1;
                    assert_eq!(lf_channel_fd(ch, &mut fd), lf_status::LF_OK);
                    assert!(fd >= 0);
                    let mut m: lf_message = std::mem::zeroed();
                    assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_OK, "{}", last_error());
                    assert_eq!(std::slice::from_raw_parts(m.data.cast::<u8>(), m.len), b"hello");
                    let mut big: lf_message = std::mem::zeroed();
                    assert_eq!(lf_recv(ch, 10_000_000_000, &mut big), lf_status::LF_OK);
                    assert_eq!(big.len, 1000);
                    assert!(std::slice::from_raw_parts(big.data.cast::<u8>(), big.len).iter().all(|&b| b == 0x5a));
                    let forged = lf_message { len: 4, ..m };
                    assert_eq!(lf_release(ch, &forged), lf_status::LF_ERR_INVALID_STATE);
                    assert_eq!(lf_release(ch, &m), lf_status::LF_OK);
                    assert_eq!(lf_release(ch, &m), lf_status::LF_ERR_INVALID_STATE, "released twice");
                    assert!(last_error().contains("not held"), "{}", last_error());
                    assert_eq!(lf_release(ch, &big), lf_status::LF_OK);
                    assert_eq!(m.flags & LF_MESSAGE_ZERO_COPY, 0);
                    for (len, byte) in [(4000, 0x33u8), (1000, 0x33)] {
                        let mut view: lf_message = std::mem::zeroed();
                        assert_eq!(lf_recv(ch, 10_000_000_000, &mut view), lf_status::LF_OK, "{}", last_error());
                        assert_eq!((view.len, view.flags), (len, LF_MESSAGE_ZERO_COPY));
                        assert!(std::slice::from_raw_parts(view.data.cast::<u8>(), view.len)
                            .iter()
                            .all(|&b| b == byte));
                        assert_eq!(lf_release(ch, &view), lf_status::LF_OK);
                    }
                    assert_eq!(
                        lf_send(ch, b"x".as_ptr().cast(), 1, -1, ptr::null_mut()),
                        lf_status::LF_ERR_INVALID_STATE
                    );
                    assert_eq!(lf_recv(ch, 10_000_000_000, &mut m), lf_status::LF_ERR_PEER_GONE);
                    lf_channel_free(ch);
                    lf_channel_free(ptr::null_mut());
                });
            });
            lf_location_free(loc.0);
            assert_eq!(
                lf_channel_create(loc.1, ptr::null(), 1, ptr::null(), ptr::null(), ptr::null(), ptr::null_mut()),
                lf_status::LF_ERR_NULL_POINTER
            );
            let mut ch = ptr::null_mut();
            assert_eq!(
                lf_channel_create(
                    loc.1,
                    CString::new("x").unwrap().as_ptr(),
                    7,
                    ptr::null(),
                    ptr::null(),
                    ptr::null(),
                    &mut ch
                ),
                lf_status::LF_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                lf_channel_create(
                    ptr::null(),
                    CString::new("x").unwrap().as_ptr(),
                    1,
                    ptr::null(),
                    ptr::null(),
                    ptr::null(),
                    &mut ch
                ),
                lf_status::LF_ERR_NULL_POINTER
            );
            assert!(ch.is_null());
            lf_context_free(loc.1);
        }
    }

    /// An absurd pool size is refused at once, on either end, naming the field: not a
    /// rendezvous that fails later on one side and times out on the other.
    #[test]
    fn absurd_pool_sizes_are_refused_at_once() {
        unsafe {
            let mut loc = ptr::null_mut();
            assert_eq!(lf_location_detect(&mut loc), lf_status::LF_OK);
            let context_config =
                lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&context_config, &mut context), lf_status::LF_OK);
            let name = CString::new(format!("ffi-absurd-{}", std::process::id())).unwrap();
            let mut config: lf_channel_config = std::mem::zeroed();
            assert_eq!(lf_channel_config_init(&mut config, std::mem::size_of_val(&config)), lf_status::LF_OK);
            config.rendezvous_timeout_ns = 5_000_000_000;
            for pool_size in [u64::MAX, u64::MAX - 4095, 1 << 62, (1 << 40) + 1] {
                for role in [lf_role::LF_ROLE_PRODUCER as u32, lf_role::LF_ROLE_CONSUMER as u32] {
                    let config = lf_channel_config { pool_size, ..config };
                    let mut ch = ptr::null_mut();
                    let started = std::time::Instant::now();
                    let status = lf_channel_create(context, name.as_ptr(), role, loc, loc, &config, &mut ch);
                    assert_eq!(
                        status,
                        lf_status::LF_ERR_INVALID_ARGUMENT,
                        "pool_size {pool_size}, role {role}: {}",
                        last_error()
                    );
                    assert!(last_error().contains(&format!("pool_size {pool_size}")), "{}", last_error());
                    assert!(started.elapsed() < Duration::from_secs(1), "refused at once, not after a rendezvous");
                    assert!(ch.is_null());
                }
            }
            lf_location_free(loc);
            lf_context_free(context);
        }
    }

    #[test]
    fn config_values_are_checked() {
        let mut c: lf_channel_config = ChannelConfig::default().into();
        assert!(to_config(&c).ok().unwrap().auto_zero_copy, "on by default");
        c.auto_zero_copy = 0;
        assert!(!to_config(&c).ok().unwrap().auto_zero_copy);
        c.auto_zero_copy = 2;
        let err = to_config(&c).err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_INVALID_ARGUMENT);
        assert!(err.message.contains("auto_zero_copy is 2"), "{}", err.message);
        c.auto_zero_copy = 1;
        c.strict_gpu = 5;
        assert!(to_config(&c).is_err());
        c.strict_gpu = 0;
        c.wait_strategy = 9;
        assert!(to_config(&c).err().unwrap().message.contains("wait_strategy is 9, not an lf_wait_strategy: use LF_WAIT_BUSY_POLL (1), LF_WAIT_SPIN_THEN_BLOCK (2) or LF_WAIT_BLOCK (3)"));
    }
}
