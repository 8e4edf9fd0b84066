//! The machine's floors: what two processes pinned to two cores pay with no channel at all,
//! measured in the same run as the channels.
//!
//! Probes, taken right before and right after each headline case (the cross-core latency of
//! these VMs moves between levels within seconds, so a floor from another moment says little):
//! - `SpinLine` (in `pingpong.rs`, which the peers share): two processes bounce a counter on
//!   one shared cache line; the least any busy-polling transport pays for a small message.
//! - [`TouchFloor`]: a raw copy-and-read ping-pong of `size` bytes over plain shared memory
//!   (the sender copies from a private buffer and bumps a counter, the receiver reads every
//!   byte and answers the same way); the least any transport pays for a touched message.
//! - [`EventFds`]: an eventfd ping-pong; the least a sleeping receiver pays to be woken.
//!
//! Measured once, as context for the Rust API rows: the minimal ring ([`ring_floor`]), a
//! single-thread memcpy ([`memcpy_bandwidth`]) and the cross-core copy bandwidth
//! ([`copy_bandwidth`]).
//!
//! Every mapping here is made before the fork, so both processes share it; each process keeps
//! its own count of what it has sent, so that probes can follow each other.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::oneway::{one_way, Stream};
use crate::pingpong::{in_turn, ping_pong, read_all, shared_map, spin_until, word_at, Percentiles};

/// Two blocking eventfds, one per direction.
pub struct EventFds {
    to_pong: OwnedFd,
    to_ping: OwnedFd,
}

fn blocking_eventfd() -> OwnedFd {
    // SAFETY: eventfd takes integers; the result is checked and then owned here.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: a new fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn efd_write(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn efd_read(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

impl EventFds {
    pub fn new() -> EventFds {
        EventFds { to_pong: blocking_eventfd(), to_ping: blocking_eventfd() }
    }

    /// `iters` round trips, each side sleeping in `read` until the other writes.
    pub fn probe(&self, ping: bool, iters: usize) -> Option<Percentiles> {
        let (out, inp) = if ping { (&self.to_pong, &self.to_ping) } else { (&self.to_ping, &self.to_pong) };
        ping_pong(ping, iters, || in_turn(ping, || efd_write(out), || efd_read(inp)))
    }

    /// Ping does `work` while pong sleeps in `read` (its core idle, for a peer program pinned
    /// there); pong wakes once ping is done.
    pub fn pause_pong<T>(&self, ping: bool, work: impl FnOnce() -> T) -> Option<T> {
        if ping {
            let result = work();
            efd_write(&self.to_pong);
            Some(result)
        } else {
            efd_read(&self.to_pong);
            None
        }
    }
}

/// The copy-and-read ping-pong floor for touched messages: a header page with one counter per
/// direction, then one area per direction of `cap` bytes, all plain shared memory.
pub struct TouchFloor {
    to_pong: &'static AtomicU64,
    to_ping: &'static AtomicU64,
    areas: *mut u8,
    cap: usize,
    /// Messages this process has sent (and so received) so far.
    count: u64,
}

impl TouchFloor {
    pub fn map(cap: usize) -> TouchFloor {
        let base = shared_map(4096 + 2 * cap, "the touch floor's memory");
        // SAFETY: two 8-aligned words on cache lines of their own in the header page, used only
        // through atomics.
        let (to_pong, to_ping) = unsafe { (word_at(base, 128), word_at(base, 256)) };
        // SAFETY: the areas follow the header page inside the mapping.
        TouchFloor { to_pong, to_ping, areas: unsafe { base.add(4096) }, cap, count: 0 }
    }

    /// `iters` round trips of `size` bytes: each side copies `private` into its area, bumps
    /// its counter, waits for the other's, and reads every byte of the other's area.
    pub fn probe(&mut self, ping: bool, size: usize, iters: usize, private: &[u8]) -> Option<Percentiles> {
        assert!(size <= self.cap && size <= private.len());
        let (out, inp, out_area, in_area) =
            if ping { (self.to_pong, self.to_ping, 0, self.cap) } else { (self.to_ping, self.to_pong, self.cap, 0) };
        let areas = self.areas;
        // SAFETY: `size` bytes inside this side's own area, which only this process writes;
        // the peer reads it only after `out` is bumped, and it is rewritten only after the
        // peer's answer (it has finished reading by then).
        let send = |n: u64| unsafe {
            std::ptr::copy_nonoverlapping(private.as_ptr(), areas.add(out_area), size);
            out.store(n, Ordering::Release);
        };
        // SAFETY: `size` bytes inside the peer's area, written before its counter was bumped
        // (the acquire load orders this read after that write).
        let recv = |n: u64| unsafe {
            spin_until(inp, n);
            read_all(std::slice::from_raw_parts(areas.add(in_area), size));
        };
        let count = &mut self.count;
        ping_pong(ping, iters, || {
            *count += 1;
            let n = *count;
            in_turn(ping, || send(n), || recv(n));
        })
    }
}

/// Slots of the minimal-ring floor, as many as the benchmark channels have.
const RING_SLOTS: usize = 256;

/// One slot of the minimal ring: a sequence word and a length, 128 bytes apart like the
/// shared-memory transport's slots.
#[repr(C, align(128))]
struct RingSlot {
    seq: AtomicU64,
    len: AtomicU64,
}

/// The minimal ring's memory: two rings of [`RING_SLOTS`] slots, then one tail slot per ring.
pub struct Rings(*mut RingSlot);

impl Rings {
    pub fn map() -> Rings {
        Rings(shared_map((2 * RING_SLOTS + 2) * std::mem::size_of::<RingSlot>(), "the ring floor").cast())
    }
}

/// The minimal-ring floor, measured once: the same ping-pong as the channels' over two rings
/// in plain shared memory, each message one slot write and one release (a tail word), with no
/// checks, pool, wake-up protocol or API. What any ring-based channel of this capacity pays
/// on this machine; lava-flow's software is the difference.
pub fn ring_floor(rings: &Rings, ping: bool, iters: usize) -> Option<Percentiles> {
    let rings = rings.0;
    // SAFETY: inside the mapping from `Rings::map` (zeroed: every sequence word starts at 0),
    // used only through atomics.
    let slot = |ring: usize, i: usize| unsafe { &*rings.add(ring * RING_SLOTS + i % RING_SLOTS) };
    // SAFETY: as above; the tail slots follow the two rings.
    let tail = |ring: usize| unsafe { &(*rings.add(2 * RING_SLOTS + ring)).seq };
    let (out, inp) = if ping { (0, 1) } else { (1, 0) };
    let send = |i: usize| {
        let s = slot(out, i);
        s.len.store(64, Ordering::Relaxed);
        s.seq.store(i as u64 + 1, Ordering::Release);
    };
    let recv = |i: usize| {
        let s = slot(inp, i);
        spin_until(&s.seq, i as u64 + 1);
        std::hint::black_box(s.len.load(Ordering::Relaxed));
        tail(inp).store(i as u64 + 1, Ordering::Release);
    };
    let mut i = 0usize;
    ping_pong(ping, iters, || {
        in_turn(ping, || send(i), || recv(i));
        i += 1;
    })
}

/// Single-thread memcpy of `size` bytes, bytes per second: in cache up to the cache's size.
pub fn memcpy_bandwidth(size: usize, quick: bool) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src);
    let budget: usize = if quick { 1 << 30 } else { 4 << 30 };
    let reps = (budget / size).clamp(3, 10_000);
    let t = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (reps * size) as f64 / t.elapsed().as_secs_f64()
}

/// Plain shared memory for the cross-core copy bandwidth floor: two counters on their own
/// cache lines and a buffer area as large as a channel's pool.
pub struct CopyFloorMem {
    published: &'static AtomicU64,
    acked: &'static AtomicU64,
    buf: *mut u8,
    len: usize,
    /// Buffers and windows this process has passed so far (both processes count alike, so
    /// that neither reads the shared counters' start while the other may be moving them).
    sent: u64,
    windows: u64,
}

impl CopyFloorMem {
    pub fn map(len: usize) -> CopyFloorMem {
        let base = shared_map(len + 4096, "the copy floor's memory");
        // SAFETY: two 8-aligned words on lines of their own in the header page, used only
        // through atomics; the buffer follows the header page inside the mapping.
        unsafe {
            CopyFloorMem {
                published: word_at(base, 128),
                acked: word_at(base, 256),
                buf: base.add(4096),
                len,
                sent: 0,
                windows: 0,
            }
        }
    }
}

/// The cross-core copy floor for touch bandwidth: exactly the Rust rows' touch bandwidth
/// pipeline (the sender copies `window` buffers of `size` bytes from `private`, publishing
/// each; the receiver reads every byte of each; then acknowledges the window), over plain
/// shared memory with two counters and no channel. What the machine allows one core to hand
/// another.
pub fn copy_bandwidth(
    mem: &mut CopyFloorMem,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    private: &[u8],
) -> Option<f64> {
    // Like a channel's pool (the area is as large), the buffers move on through the whole area:
    // reusing the same few would make every write wait for the reader's copies to be
    // invalidated.
    let count = (mem.len / size).max(1);
    assert!(count >= window && size <= mem.len && size <= private.len());
    one_way(&mut CopyStream { mem, size, private, count, next: 0 }, ping, size, window, iters)
}

/// The copy floor's stream of `size`-byte buffers through [`CopyFloorMem`].
struct CopyStream<'a> {
    mem: &'a mut CopyFloorMem,
    size: usize,
    private: &'a [u8],
    /// Buffers of `size` in the area, and the next one's index (both sides walk them alike).
    count: usize,
    next: usize,
}

impl CopyStream<'_> {
    fn next_buffer(&mut self) -> &mut [u8] {
        let at = self.next % self.count * self.size;
        self.next += 1;
        // SAFETY: `size` bytes at a multiple of `size` inside the shared area; the counters
        // order the writes and reads, and a buffer is rewritten only after the window holding
        // it is acknowledged.
        unsafe { std::slice::from_raw_parts_mut(self.mem.buf.add(at), self.size) }
    }
}

fn spin_until_at_least(word: &AtomicU64, value: u64) {
    while word.load(Ordering::Acquire) < value {
        std::hint::spin_loop();
    }
}

impl Stream for CopyStream<'_> {
    fn send(&mut self, _: usize) {
        let (private, size) = (self.private, self.size);
        self.next_buffer().copy_from_slice(&private[..size]);
        self.mem.sent += 1;
        self.mem.published.store(self.mem.sent, Ordering::Release);
    }

    fn wait_ack(&mut self) {
        self.mem.windows += 1;
        spin_until_at_least(self.mem.acked, self.mem.windows);
    }

    fn recv(&mut self) {
        self.mem.sent += 1;
        spin_until_at_least(self.mem.published, self.mem.sent);
        read_all(self.next_buffer());
    }

    fn ack(&mut self) {
        self.mem.windows += 1;
        self.mem.acked.store(self.mem.windows, Ordering::Release);
    }
}
