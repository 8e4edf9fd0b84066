//! What lf-bench's fan-in rows and the peers' fan-in programs (`benchmarks/peers`, which
//! includes this file; `benchmarks/mpi_fanin.c` does the same in C) do the same way, so that
//! their figures compare: the control words the consumer and its producers share, the
//! producers' cores, the payload each producer writes, and the consumer's tally of what it
//! reads.
//!
//! A run: every producer attaches, then waits; the consumer starts them all at once (`go`),
//! lets them run for a warm-up, then counts for a timed window what it receives, per producer,
//! and how long each block of [`BLOCK`] consecutive messages took; then it stops them (`stop`)
//! and drains what is left, so that no producer stays blocked on a full channel.
//!
//! Plain `std` and `libc` only: the peers crate builds it without lava-flow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Messages per timed block: the consumer reads the clock once per block, not per message.
pub const BLOCK: usize = 64;

/// The smallest message: a producer's counter and index.
pub const MIN_SIZE: usize = 16;

/// Words shared by the consumer and its producers, each on a cache line of its own, in a
/// mapping made before they fork.
pub struct Control {
    base: *mut u8,
}

// SAFETY: the mapping lives as long as the process and is used only through atomics.
unsafe impl Send for Control {}
// SAFETY: as above.
unsafe impl Sync for Control {}

impl Control {
    pub fn map() -> Control {
        // SAFETY: mmap of fresh anonymous shared memory; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mapping the fan-in control words: {}", std::io::Error::last_os_error());
        Control { base: p.cast() }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: word `i` (< 4) sits at 128 * i inside the 4096-byte mapping, aligned, and is
        // used only through atomics.
        unsafe { &*(self.base.add(128 * i) as *const AtomicU64) }
    }

    /// Producers attached so far.
    pub fn ready(&self) -> &AtomicU64 {
        self.word(0)
    }

    /// Set by the consumer once all are attached: the producers start sending.
    pub fn go(&self) -> &AtomicU64 {
        self.word(1)
    }

    /// Set by the consumer after its timed window: the producers stop.
    pub fn stop(&self) -> &AtomicU64 {
        self.word(2)
    }

    /// Set by a consumer whose producers must not open their ends before it listens (the
    /// peers'; a lava-flow producer waits for its consumer by itself).
    #[allow(dead_code)]
    pub fn listening(&self) -> &AtomicU64 {
        self.word(3)
    }

    /// Zeroes the words for the next run (lf-bench runs several in one mapping).
    #[allow(dead_code)]
    pub fn reset(&self) {
        (0..4).for_each(|i| self.word(i).store(0, Ordering::SeqCst));
    }

    /// A producer: says it is attached and waits for the start, yielding its core (producers
    /// may share one).
    pub fn attach_and_wait(&self) {
        self.ready().fetch_add(1, Ordering::SeqCst);
        while self.go().load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    }

    /// Whether the consumer has stopped the producers.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stop().load(Ordering::Relaxed) != 0
    }
}

/// The core of producer `i` (from 0) where the machine has `cores`: the consumer has core 0 to
/// itself, the producers share the others in turn (all on core 1 on a 2-core machine).
pub fn producer_core(i: usize, cores: usize) -> usize {
    1 + i % cores.saturating_sub(1).max(1)
}

/// The cores this process may run on.
pub fn cores_allowed() -> usize {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        (libc::CPU_COUNT(&set) as usize).max(1)
    }
}

/// Writes producer `index`'s message number `counter` into `dst`: the counter and the index
/// (8 bytes each, little-endian), then the rest copied from the producer's private bytes.
#[inline]
pub fn write_payload(dst: &mut [u8], counter: u64, index: u64, private: &[u8]) {
    dst[..8].copy_from_slice(&counter.to_le_bytes());
    dst[8..16].copy_from_slice(&index.to_le_bytes());
    let n = dst.len();
    dst[16..].copy_from_slice(&private[16..n]);
}

/// The producer's index a payload names (for the peers, whose messages carry no slot).
#[allow(dead_code)]
#[inline]
pub fn payload_index(payload: &[u8]) -> u64 {
    u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"))
}

/// The sum of every byte (8-byte words), so that a message really reaches the reader's core.
#[inline]
fn read_all(buf: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut words = buf.chunks_exact(8);
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    for b in words.remainder() {
        sum = sum.wrapping_add(u64::from(*b));
    }
    std::hint::black_box(sum)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Warm,
    Timed,
    Over,
}

/// The consumer's account of a run.
pub struct Tally {
    warm: Duration,
    window: Duration,
    phase: Phase,
    started: Instant,
    /// Messages since the last block boundary.
    in_block: usize,
    block_start: Instant,
    window_start: Instant,
    window_end: Instant,
    /// Per producer: messages received in the timed window, and the counter its next message
    /// must carry (over the whole run).
    counts: Vec<u64>,
    next: Vec<u64>,
    /// Messages out of order, repeated or lost, or from a producer that does not exist.
    pub errors: u64,
    /// ns per block of [`BLOCK`] messages in the timed window.
    blocks: Vec<u64>,
}

impl Tally {
    /// For `producers` producers; starts counting time at [`start`](Self::start).
    pub fn new(producers: usize, warm: Duration, window: Duration) -> Tally {
        let now = Instant::now();
        Tally {
            warm,
            window,
            phase: Phase::Warm,
            started: now,
            in_block: 0,
            block_start: now,
            window_start: now,
            window_end: now,
            counts: vec![0; producers],
            next: vec![0; producers],
            errors: 0,
            blocks: Vec::with_capacity(1 << 16),
        }
    }

    /// The producers have been started.
    pub fn start(&mut self) {
        self.started = Instant::now();
        self.block_start = self.started;
    }

    /// A message from producer `producer` (a slot or rank, from 0): every byte read, its
    /// counter checked against the producer's last. Returns false once the timed window is
    /// over.
    #[inline]
    pub fn take(&mut self, producer: usize, payload: &[u8]) -> bool {
        read_all(payload);
        let counter = u64::from_le_bytes(payload[..8].try_into().expect("at least 16 bytes"));
        match self.next.get_mut(producer) {
            Some(next) if *next == counter => *next += 1,
            Some(next) => {
                self.errors += 1;
                *next = counter + 1;
            }
            None => {
                self.errors += 1;
                return self.phase != Phase::Over;
            }
        }
        if self.phase == Phase::Timed {
            self.counts[producer] += 1;
        }
        self.in_block += 1;
        if self.in_block == BLOCK {
            self.in_block = 0;
            self.boundary();
        }
        self.phase != Phase::Over
    }

    #[cold]
    fn boundary(&mut self) {
        let now = Instant::now();
        match self.phase {
            Phase::Warm if now - self.started >= self.warm => {
                self.phase = Phase::Timed;
                self.window_start = now;
            }
            Phase::Warm => {}
            Phase::Timed => {
                self.blocks.push((now - self.block_start).as_nanos() as u64);
                if now - self.window_start >= self.window {
                    self.phase = Phase::Over;
                    self.window_end = now;
                }
            }
            Phase::Over => {}
        }
        self.block_start = now;
    }

    /// The run's figures, as one JSON object (no newline): `who` and `producers` name it.
    pub fn json(&self, who: &str, size: usize) -> String {
        let seconds = (self.window_end - self.window_start).as_secs_f64();
        let messages: u64 = self.counts.iter().sum();
        let mut blocks = self.blocks.clone();
        blocks.sort_unstable();
        let at = |q: f64| {
            if blocks.is_empty() {
                f64::NAN
            } else {
                blocks[((blocks.len() as f64 - 1.0) * q).round() as usize] as f64 / BLOCK as f64
            }
        };
        let per: Vec<String> = self.counts.iter().map(u64::to_string).collect();
        // Counted whole blocks only: the window ends at a block boundary, so messages in it
        // are a whole number of blocks (warm-up's last partial block aside).
        format!(
            "{{\"who\":\"{who}\",\"producers\":{},\"size\":{size},\"window_s\":{seconds:.6},\"messages\":{messages},\
             \"msgs_per_s\":{:.1},\"per_producer\":[{}],\"per_msg_p50_ns\":{:.2},\"per_msg_p99_ns\":{:.2},\
             \"blocks\":{},\"errors\":{}}}",
            self.counts.len(),
            messages as f64 / seconds,
            per.join(","),
            at(0.5),
            at(0.99),
            blocks.len(),
            self.errors
        )
    }
}
