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
//!
//! This file holds the handle (creation, transport report, fd, free) and the lock and role
//! checks every call takes; the options are in `channel_config`, the producer's calls in
//! `send`, the consumer's in `receive`, and what GPU messages keep alive until their release in
//! `gpu_messages`.

use std::ffi::{c_char, c_int, CString};

use parking_lot::Mutex;

use super::abi::{read_struct, CEnum};
use super::channel_config::{lf_channel_config, lf_role, to_config};
use super::context::lf_context;
use super::exclusive::{Exclusive, ExclusiveGuard};
use super::gpu_messages::GpuMessages;
use super::location::lf_location;
use super::raw;
use super::status::lf_status;
use super::{
    boundary, boundary_void, c_str, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult,
};
use lava_flow::channels::{raw as ends, Channel, ChannelConfig, Consumer, Producer, Role};

/// Opaque handle on one end of a channel.
#[allow(non_camel_case_types)]
pub struct lf_channel {
    channel: Exclusive<Channel>,
    /// GPU messages handed to C and not yet released; only touched with `channel` locked.
    pub(crate) gpu_messages: GpuMessages,
    /// The report as last handed out, (name, reason): C holds pointers into these. Reports
    /// that change (a new producer brings another GPU route) are kept, never freed before the
    /// channel, so that no pointer handed out dangles.
    reports: Mutex<Vec<(CString, CString)>>,
}

impl Drop for lf_channel {
    fn drop(&mut self) {
        // GPU messages never released go with the channel: each one's buffer and payload, then
        // its view, so that the consumer's imports of the producer's memory are let go too.
        let channel = self.channel.get_mut();
        self.gpu_messages.release_all(|view| {
            if let Channel::Consumer(c) = channel {
                // SAFETY: the table held the view, and its buffer and payload are let go of
                // first; the channel closes, so nothing uses any of them after.
                let _ = unsafe { ends::release(c, view) };
            }
        });
    }
}

fn report_strings(info: &lava_flow::channels::TransportInfo) -> (CString, CString) {
    let name = CString::new(info.names()).expect("no NUL in transport names");
    let reason = CString::new(info.reason.replace('\0', "")).expect("NULs removed");
    (name, reason)
}

/// Locks the channel for this call; another thread in the middle of a call is an error, not
/// a wait.
#[inline]
pub(crate) fn lock(ch: &lf_channel) -> FfiResult<ExclusiveGuard<'_, Channel>> {
    ch.channel.try_lock().ok_or_else(|| Failure {
        status: lf_status::LF_ERR_INVALID_STATE,
        message: "the channel is in use by another thread; use a channel from one thread at a time".into(),
    })
}

/// The producing end, or LF_ERR_INVALID_STATE for a consumer.
#[inline]
pub(crate) fn producer(guard: &mut Channel) -> FfiResult<&mut Producer> {
    match guard {
        Channel::Producer(p) => Ok(p),
        Channel::Consumer(_) => Err(Failure {
            status: lf_status::LF_ERR_INVALID_STATE,
            message: "this channel end is a consumer; only a producer sends".into(),
        }),
    }
}

/// The consuming end, or LF_ERR_INVALID_STATE for a producer.
#[inline]
pub(crate) fn consumer(guard: &mut Channel) -> FfiResult<&mut Consumer> {
    match guard {
        Channel::Consumer(c) => Ok(c),
        Channel::Producer(_) => Err(Failure {
            status: lf_status::LF_ERR_INVALID_STATE,
            message: "this channel end is a producer; only a consumer receives".into(),
        }),
    }
}

/// Creates this process's end of channel `name` (1-64 bytes of letters, digits, `-_.`) and
/// waits for the other end; either may start first. `context` is this process's memory
/// context: `lf_send` of bytes inside one of its buffers goes by reference. The channel
/// keeps what it needs of the context, which may be freed before the channel. `role` says
/// which end this is. The transport follows the scope between
/// `my_location` and `peer_location` (and `LF_TRANSPORTS`); `lf_channel_transport` tells
/// which and why. `config` may be NULL for the defaults.
///
/// A pair channel (`config.kind`, LF_CHANNEL_PAIR by default) has one producer and one
/// consumer at a time: a second one of a live channel is refused at once with
/// LF_ERR_INVALID_STATE ("already has a live producer (pid N)"). A new producer may attach
/// once the previous one has closed or died. A fan-in takes up to `max_peers` producers (its
/// consumer returns once the first attached), a fan-out up to `max_peers` consumers (its
/// producer returns once the first attached); one past `max_peers` is refused with
/// LF_ERR_INVALID_STATE naming it.
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
        let gpu_messages = GpuMessages::default();
        write_out(out, new_handle(lf_channel { channel: Exclusive::new(channel), gpu_messages, reports })?);
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

/// A file descriptor for poll/epoll: readable while a message waits or after the producer
/// has gone, and then the next `lf_try_recv` has something to say (never LF_ERR_WOULD_BLOCK
/// right after a wake-up for the producer's end). Owned by the channel (do not close it).
/// After each wake-up, call `lf_try_recv` until LF_ERR_WOULD_BLOCK, or LF_ERR_PEER_GONE: the
/// producer has gone (the fd stays readable; a new producer is taken up by a later
/// `lf_try_recv`). Consumers only.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_fd(channel: *mut lf_channel, out: *mut c_int) -> lf_status {
    boundary("lf_channel_fd", || {
        let out = out_ptr(out, "out")?;
        let ch = handle_ref(channel as *const lf_channel, "channel")?;
        let mut guard = lock(ch)?;
        let fd = crate::descriptor_lent_to_c(consumer(&mut guard)?.notify_fd()?, "lf_channel_fd")?;
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
    use crate::channel_config::lf_channel_config_init;
    use crate::context::{lf_context_config, lf_context_create, lf_context_free, lf_gpu_policy};
    use crate::location::{lf_location_detect, lf_location_free};
    use crate::tests::last_error;
    use std::ffi::CString;
    use std::ptr;
    use std::time::Duration;

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
}
