//! What lf-bench's fan-out rows and the iceoryx2 fan-out peer (`benchmarks/peers`, which
//! includes this file) do the same way, so that their figures compare: the control words the
//! producer and its consumers share, the consumers' cores, the payload the producer writes, the
//! consumers' check of every message, and the producer's samples.
//!
//! A run: every consumer attaches and says so (`ready`); the producer sends for a warm-up and
//! a timed window, writing the whole payload before each message (its counter in the first and
//! the last 8 bytes, the rest from private bytes), and times each message (or, for small
//! messages, each block of [`BLOCK`]); then it ends and the consumers, which read every byte of
//! every message and check its counter and its sum, report what they received.
//!
//! Plain `std` and `libc` only: the peers crate builds it without lava-flow.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sends per timed block of a small-message row: the producer reads the clock once per block.
pub const BLOCK: usize = 64;

/// The smallest message: a counter at each end, 8-byte words.
pub const MIN_SIZE: usize = 16;

/// Words shared by the producer and its consumers, each on a cache line of its own, in a
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
        assert_ne!(p, libc::MAP_FAILED, "mapping the fan-out control words: {}", std::io::Error::last_os_error());
        Control { base: p.cast() }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: word `i` (< 4) sits at 128 * i inside the 4096-byte mapping, aligned, and is
        // used only through atomics.
        unsafe { &*(self.base.add(128 * i) as *const AtomicU64) }
    }

    /// Consumers attached so far.
    pub fn ready(&self) -> &AtomicU64 {
        self.word(0)
    }

    /// Set by the peer's producer once its service exists: its consumers may open it.
    #[allow(dead_code)]
    pub fn listening(&self) -> &AtomicU64 {
        self.word(1)
    }

    /// Set by the peer's producer once its last message was released by every consumer.
    #[allow(dead_code)]
    pub fn stop(&self) -> &AtomicU64 {
        self.word(2)
    }

    /// The peer's releases, all consumers together: its producer's completion wait (lava-flow
    /// has `lf_wait_completed` instead).
    #[allow(dead_code)]
    pub fn released(&self) -> &AtomicU64 {
        self.word(3)
    }

    /// Zeroes the words for the next run (lf-bench runs several in one mapping).
    #[allow(dead_code)]
    pub fn reset(&self) {
        (0..4).for_each(|i| self.word(i).store(0, Ordering::SeqCst));
    }
}

/// The core of consumer `i` (from 0) where the machine has `cores`: the producer has core 0 to
/// itself, the consumers share the others in turn (all on core 1 on a 2-core machine).
pub fn consumer_core(i: usize, cores: usize) -> usize {
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

/// The producer's private bytes that every payload is copied from: a pattern, not zeros.
pub fn private_bytes(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i * 31 + 7) as u8).collect()
}

/// Writes message `counter` into `dst` (all of it): the private bytes, then the counter in the
/// first and the last 8 bytes (little-endian), so that a reader that sees both ends agree and
/// the sum right read one whole message, not one half-rewritten.
#[inline]
pub fn write_payload(dst: &mut [u8], counter: u64, private: &[u8]) {
    let n = dst.len();
    dst.copy_from_slice(&private[..n]);
    dst[..8].copy_from_slice(&counter.to_le_bytes());
    dst[n - 8..].copy_from_slice(&counter.to_le_bytes());
}

/// The wrapping sum of `buf`'s 8-byte words (its length a multiple of 8).
#[inline]
fn word_sum(buf: &[u8]) -> u64 {
    buf.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).fold(0u64, u64::wrapping_add)
}

/// A consumer's check of what it receives: every byte read (a sum over the payload), the
/// counter at both ends and the sum as [`write_payload`] made them, the counters consecutive
/// from 0.
pub struct Check {
    size: usize,
    /// The sum of the payload with both counters 0.
    base_sum: u64,
    pub received: u64,
    /// Messages out of order, repeated, lost, torn, or of another size.
    pub errors: u64,
    /// Messages whose bytes were the producer's own memory (lava-flow's LF_MESSAGE_ZERO_COPY).
    pub zero_copy: u64,
}

impl Check {
    pub fn new(size: usize) -> Check {
        let mut model = private_bytes(size);
        write_payload(&mut model, 0, &private_bytes(size));
        Check { size, base_sum: word_sum(&model), received: 0, errors: 0, zero_copy: 0 }
    }

    /// One message: read in full and checked.
    #[inline]
    pub fn take(&mut self, payload: &[u8], zero_copy: bool) {
        let expected = self.received;
        self.received += 1;
        self.zero_copy += u64::from(zero_copy);
        if payload.len() != self.size {
            self.errors += 1;
            return;
        }
        let sum = std::hint::black_box(word_sum(payload));
        let first = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
        let last = u64::from_le_bytes(payload[self.size - 8..].try_into().expect("8 bytes"));
        if first != expected || last != expected || sum != self.base_sum.wrapping_add(expected.wrapping_mul(2)) {
            self.errors += 1;
        }
    }

    /// The consumer's line: `consumer` (its index), what it received, as one JSON object.
    pub fn json(&self, consumer: usize) -> String {
        format!(
            "{{\"consumer\":{consumer},\"received\":{},\"errors\":{},\"zero_copy\":{}}}",
            self.received, self.errors, self.zero_copy
        )
    }
}

/// Writes `line` and a newline to stdout in one write (lines from several processes share the
/// pipe; one write of less than PIPE_BUF bytes is never interleaved).
#[allow(dead_code)]
pub fn print_line(line: &str) {
    let text = format!("{line}\n");
    // SAFETY: writes the bytes of a live String to fd 1.
    let n = unsafe { libc::write(1, text.as_ptr().cast(), text.len()) };
    assert_eq!(n, text.len() as isize, "writing a result line: {}", std::io::Error::last_os_error());
}

/// The producer's samples of the timed window, ns each.
#[derive(Default)]
pub struct Samples {
    /// Per message: the time in the send call.
    pub send: Vec<u64>,
    /// Per message: the send and the wait until every consumer released it.
    pub cycle: Vec<u64>,
    /// Per message: writing the payload (a loan's too, where the sender loans).
    pub write: Vec<u64>,
    /// Messages sent in all (warm-up included), and the timed window's length.
    pub sent: u64,
    pub window_s: f64,
}

/// p50 and p99 of `v` (NaN where empty).
fn quantiles(v: &[u64], per: f64) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_unstable();
    let at = |q: f64| {
        if s.is_empty() {
            f64::NAN
        } else {
            s[((s.len() as f64 - 1.0) * q).round() as usize] as f64 / per
        }
    };
    (at(0.5), at(0.99))
}

fn number(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "null".to_owned()
    }
}

impl Samples {
    /// The producer's line, as one JSON object: `who`, `consumers`, `size`, `mode` ("ref":
    /// timed per message; "copy": `send` holds blocks of [`BLOCK`] sends), the messages sent in
    /// all and in the window, the window's length, and `extra` (JSON members, without braces).
    pub fn json(&self, who: &str, consumers: usize, size: usize, mode: &str, extra: &str) -> String {
        let (sent, window_s) = (self.sent, self.window_s);
        let per = if mode == "copy" { BLOCK as f64 } else { 1.0 };
        let (send50, send99) = quantiles(&self.send, per);
        let (cycle50, cycle99) = quantiles(&self.cycle, 1.0);
        let (write50, _) = quantiles(&self.write, 1.0);
        let timed = self.send.len() as f64 * per;
        format!(
            "{{\"who\":\"{who}\",\"consumers\":{consumers},\"size\":{size},\"mode\":\"{mode}\",\"sent\":{sent},\
             \"timed\":{timed},\"window_s\":{window_s:.6},\"msgs_per_s\":{},\"send_p50_ns\":{},\"send_p99_ns\":{},\
             \"cycle_p50_ns\":{},\"cycle_p99_ns\":{},\"write_p50_ns\":{}{}{extra}}}",
            number(timed / window_s),
            number(send50),
            number(send99),
            number(cycle50),
            number(cycle99),
            number(write50),
            if extra.is_empty() { "" } else { "," },
        )
    }
}
