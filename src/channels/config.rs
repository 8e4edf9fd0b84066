//! Channel options: how ends wait, how much may be in flight, which transports they may take.

use std::time::Duration;

use super::transports::TransportKind;
use crate::error::{Error, Result};

/// The largest `pool_size` (1 TiB): a bound on what a peer can make the other end map.
pub const MAX_POOL_SIZE: u64 = 1 << 40;

/// How a blocking call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// Spin on the word the peer writes; lowest latency, one core busy while waiting.
    BusyPoll,
    /// Spin for this long, then sleep on a futex. The sender publishes without a memory
    /// fence; a wait that does sleep pays a `membarrier` (it interrupts the cores that run
    /// lava-flow processes) before it does.
    SpinThenBlock { spin: Duration },
    /// Sleep on a futex at once; no CPU used while waiting, a syscall on the sender's side
    /// per message that finds the receiver asleep, and a memory fence per message (cheaper
    /// than a `membarrier` per sleep for a side that sleeps on nearly every wait).
    Block,
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::SpinThenBlock { spin: Duration::from_micros(50) }
    }
}

/// Channel options. The producer's sizes decide the shared region; the consumer's are
/// ignored (it takes what the producer offers, after checking it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    pub wait: WaitStrategy,
    /// How many messages may be in flight: between the oldest one not yet released and the
    /// newest sent, a power of two from 2 to 2^20. Views may be released in any order, but
    /// space is reclaimed in order, so a view held while `capacity` more messages arrive makes
    /// the producer wait (or `WouldBlock`).
    pub capacity: u32,
    /// Bytes of payload memory the channel sets aside for messages in flight (each carrier
    /// rounds it as its memory needs); also the largest message.
    pub pool_size: usize,
    /// How long `create` waits for the peer; `None` waits forever.
    pub rendezvous_timeout: Option<Duration>,
    /// Allowed transports in order of preference; `None` reads `LF_TRANSPORTS`, and when that
    /// is unset too, every built transport is allowed.
    pub transports: Option<Vec<TransportKind>>,
    /// Whether `Producer::send` of bytes that lie inside a lava-flow buffer sends them by
    /// reference (zero copy; the sender must not rewrite them until the message completes).
    /// Off: `send` always copies, and the bytes may be reused as soon as it returns.
    pub auto_zero_copy: bool,
    /// GPU buffers must go by reference with GPU-side synchronisation: where they would be
    /// staged through host memory (the consumer on another GPU, or without one) or
    /// synchronised on the host (the driver cannot share semaphores), creating the channel
    /// fails instead, saying why.
    pub strict_gpu: bool,
    /// Producer: the consumer signals a Vulkan timeline semaphore of the producer's (the
    /// *released* semaphore, [`Producer::released_semaphore`]) to `seq + 1` once it let go of
    /// GPU message `seq` and every GPU message before it, so that the producer's GPU work can
    /// wait on the GPU before rewriting a buffer it sent. Off by default: it costs a host-side
    /// semaphore signal per GPU message. Where semaphores cannot be shared, the report says so
    /// (strict_gpu: creating the channel fails).
    pub released_semaphore: bool,
    /// Producer: fault in the memory the channel sets aside for messages when it is made (and
    /// have the consumer do so), so that first touches do not fault in the message path.
    /// Skipped where it is over a quarter of the memory the kernel calls available. On by
    /// default.
    pub prefault: bool,
}

impl ChannelConfig {
    /// Refuses sizes no channel can have, at once and on either end, naming the field: a pool
    /// of 0 bytes or more than 1 TiB. (The capacity is the producer's to choose; its
    /// transport checks it.)
    pub fn validate(&self) -> Result<()> {
        if self.pool_size == 0 || self.pool_size as u64 > MAX_POOL_SIZE {
            return Err(Error::invalid(format!(
                "pool_size {} must be from 1 to {MAX_POOL_SIZE} bytes (1 TiB); it is also the largest message",
                self.pool_size
            )));
        }
        Ok(())
    }
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            wait: WaitStrategy::default(),
            capacity: 256,
            pool_size: 16 << 20,
            rendezvous_timeout: Some(Duration::from_secs(10)),
            transports: None,
            auto_zero_copy: true,
            strict_gpu: false,
            released_semaphore: false,
            prefault: true,
        }
    }
}

