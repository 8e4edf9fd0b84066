//! `lf_channel_config`: a channel's options as C fills them (`lf_channel_config_init`), the
//! enums they name (`lf_role`, `lf_wait_strategy`), and their checks and conversion into the
//! core's `ChannelConfig`.

use std::time::Duration;

use super::abi::{c_enum, write_struct, CEnum, GrowableStruct};
use super::raw;
use super::status::lf_status;
use super::{boundary, out_ptr, Failure, FfiResult};
use lava_flow::channels::{ChannelConfig, ChannelKind, WaitStrategy};

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

/// How many processes share a channel (`lf_channel_config.kind`). Every end names the same.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_channel_kind {
    /// One producer, one consumer. The default.
    LF_CHANNEL_PAIR = 0,
    /// Up to `max_peers` producers, one consumer: order and exactly-once per producer, the
    /// producers served in turn; `lf_message.producer` says whose a message is.
    LF_CHANNEL_FAN_IN = 1,
    /// One producer, up to `max_peers` consumers: each message goes to every consumer attached
    /// when it was sent, a buffer by reference shared by all and complete once every one of
    /// them released it.
    LF_CHANNEL_FAN_OUT = 2,
}
c_enum!(lf_channel_kind: LF_CHANNEL_PAIR, LF_CHANNEL_FAN_IN, LF_CHANNEL_FAN_OUT);

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
    /// LF_CHANNEL_PAIR (the default), LF_CHANNEL_FAN_IN or LF_CHANNEL_FAN_OUT; every end of a
    /// channel names the same kind.
    pub kind: raw::lf_channel_kind,
    /// A fan-in's most producers (the consumer's value rules), or a fan-out's most consumers
    /// (the producer's): 1 to 64 (`LF_MAX_PEERS`); 8 by default. A pair ignores it.
    pub max_peers: u32,
    /// Fan-out only: a consumer that keeps the producer waiting for room longer than this is
    /// detached; negative (the default): a slow consumer holds the producer back. Set on
    /// another kind: LF_ERR_INVALID_ARGUMENT.
    pub slow_consumer_timeout_ns: i64,
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
    const SIZES: &'static [usize] = &[56, 72];
}

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
            rendezvous_timeout_ns: timeout_ns(c.rendezvous_timeout),
            auto_zero_copy: u32::from(c.auto_zero_copy),
            strict_gpu: u32::from(c.strict_gpu),
            released_semaphore: u32::from(c.released_semaphore),
            prefault: u32::from(c.prefault),
            reserved: 0,
            kind: match c.kind {
                ChannelKind::Pair => lf_channel_kind::LF_CHANNEL_PAIR,
                ChannelKind::FanIn => lf_channel_kind::LF_CHANNEL_FAN_IN,
                ChannelKind::FanOut => lf_channel_kind::LF_CHANNEL_FAN_OUT,
            }
            .to_c(),
            max_peers: c.max_peers,
            slow_consumer_timeout_ns: timeout_ns(c.slow_consumer_timeout),
        }
    }
}

/// A duration as C passes it: nanoseconds, negative for none.
fn timeout_ns(t: Option<Duration>) -> i64 {
    t.map_or(-1, |t| t.as_nanos().min(i64::MAX as u128) as i64)
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

pub(crate) fn to_config(c: &lf_channel_config) -> FfiResult<ChannelConfig> {
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
    let kind = match lf_channel_kind::from_c(c.kind, "kind")? {
        lf_channel_kind::LF_CHANNEL_PAIR => ChannelKind::Pair,
        lf_channel_kind::LF_CHANNEL_FAN_IN => ChannelKind::FanIn,
        lf_channel_kind::LF_CHANNEL_FAN_OUT => ChannelKind::FanOut,
    };
    Ok(ChannelConfig {
        kind,
        max_peers: c.max_peers,
        slow_consumer_timeout: timeout(c.slow_consumer_timeout_ns),
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

/// A timeout as C passes it, in nanoseconds; a negative value waits forever.
#[inline]
pub(crate) fn timeout(ns: i64) -> Option<Duration> {
    u64::try_from(ns).ok().map(Duration::from_nanos)
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

#[cfg(test)]
mod tests {
    use super::*;

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
