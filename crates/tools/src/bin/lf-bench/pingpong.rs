//! What lf-bench and the peer programs (`benchmarks/peers`, which includes this file) do the
//! same way, so that their figures compare: the ping-pong loop and its warm-up, half round
//! trips from round-trip samples, the receiver's read of every byte, the spinning floor, sizes
//! written as `64K`, and pinning to a core.
//!
//! Plain `std` and `libc` only: the peers crate builds it without lava-flow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Percentiles of the half round trip, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

/// Half round trips in ns from round-trip samples (nearest rank).
pub fn percentiles(mut rtts: Vec<u64>) -> Percentiles {
    if rtts.is_empty() {
        return Percentiles { p50: f64::NAN, p99: f64::NAN, p999: f64::NAN };
    }
    rtts.sort_unstable();
    let at = |q: f64| rtts[((rtts.len() as f64 - 1.0) * q).round() as usize] as f64 / 2.0;
    Percentiles { p50: at(0.5), p99: at(0.99), p999: at(0.999) }
}

/// Runs `iters` timed round trips after a tenth as many (at least 5) untimed ones. `step` is
/// one round trip on the ping side (send, then wait for the answer) and one answer on the pong
/// side (wait, then send); ping times each and gets the half round trips.
pub fn ping_pong(ping: bool, iters: usize, mut step: impl FnMut()) -> Option<Percentiles> {
    let warm = (iters / 10).max(5);
    let mut rtts = Vec::with_capacity(if ping { iters } else { 0 });
    for i in 0..warm + iters {
        let start = ping.then(Instant::now);
        step();
        if let Some(t) = start.filter(|_| i >= warm) {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    ping.then(|| percentiles(rtts))
}

/// One side's turn in a round trip: ping sends, then receives the answer; pong receives,
/// then answers.
pub fn in_turn(ping: bool, send: impl FnOnce(), recv: impl FnOnce()) {
    if ping {
        send();
        recv();
    } else {
        recv();
        send();
    }
}

/// Reads every byte (summing 8-byte words), so that a touched message really moves the data
/// to the reader's core.
pub fn read_all(buf: &[u8]) -> u64 {
    // SAFETY: u64 has no invalid bit patterns; align_to splits at aligned boundaries.
    let (head, words, tail) = unsafe { buf.align_to::<u64>() };
    let mut sum = 0u64;
    for w in words {
        sum = sum.wrapping_add(*w);
    }
    for b in head.iter().chain(tail) {
        sum = sum.wrapping_add(*b as u64);
    }
    std::hint::black_box(sum)
}

/// A fresh shared anonymous mapping of `len` bytes (zeroed), populated now so that page
/// faults are not timed; it lives until the process exits.
pub fn shared_map(len: usize, what: &str) -> *mut u8 {
    // SAFETY: mmap of fresh anonymous memory; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mapping {what}: {}", std::io::Error::last_os_error());
    p.cast()
}

/// The atomic word at byte `offset` of a mapping from [`shared_map`].
///
/// # Safety
/// `offset` is 8-aligned and 8 bytes lie there inside the mapping, which is used only through
/// atomics at that place.
pub unsafe fn word_at(base: *mut u8, offset: usize) -> &'static AtomicU64 {
    // SAFETY: as the caller promises; the mapping is never unmapped.
    unsafe { &*(base.add(offset) as *const AtomicU64) }
}

pub fn spin_until(word: &AtomicU64, value: u64) {
    while word.load(Ordering::Acquire) != value {
        std::hint::spin_loop();
    }
}

/// The spinning floor: two processes bouncing a counter on one cache line of memory they
/// share (mapped before they fork); the least any busy-polling transport pays for a small
/// message.
pub struct SpinLine {
    line: &'static AtomicU64,
    /// The last value this process saw on the line (it starts at 0; each round trip adds 2).
    last: u64,
}

impl SpinLine {
    pub fn map() -> SpinLine {
        // SAFETY: offset 0 of a fresh page, used only through this atomic.
        SpinLine { line: unsafe { word_at(shared_map(4096, "the spinning floor's line"), 0) }, last: 0 }
    }

    /// `iters` round trips on the line: ping stores odd values, pong even ones.
    pub fn probe(&mut self, ping: bool, iters: usize) -> Option<Percentiles> {
        let (line, last) = (self.line, &mut self.last);
        ping_pong(ping, iters, || {
            if ping {
                line.store(*last + 1, Ordering::Release);
                spin_until(line, *last + 2);
            } else {
                spin_until(line, *last + 1);
                line.store(*last + 2, Ordering::Release);
            }
            *last += 2;
        })
    }
}

/// Pins the calling thread (the whole process, before it starts others) to one core.
pub fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("could not pin to core {cpu}: {}", std::io::Error::last_os_error());
        }
    }
}
