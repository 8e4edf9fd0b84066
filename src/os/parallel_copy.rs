//! Large host copies on several cores: one core's `memcpy` moves 10-15 GB/s, a PCIe Gen5 link
//! 50 and a server's memory several times that. Large copies are cut into chunks that a small
//! crew of threads (made on first use, kept for the process) and the calling thread copy
//! together: the host side of GPU transfers, and what a send copies into a shared-memory
//! channel ([`copy_message`]).
//!
//! `LF_COPY_THREADS` sets how many threads copy, the caller included (default: 8, at most
//! the cores this process may use; 1 copies on the calling thread alone). One copy at a time
//! has the crew: a copy that finds it busy is made on its own thread.
//!
//! A copy into memory that the CPU will not read next (a staging buffer the GPU reads) can
//! write with streaming stores ([`Stores::Streaming`]), which skip the cache: an ordinary
//! store first reads the line it writes, a third of a copy's memory traffic.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// The environment variable that sets how many threads copy (the caller included).
pub const COPY_THREADS_ENV: &str = crate::env::COPY_THREADS.name;
const DEFAULT_THREADS: usize = 8;
/// Copies below this go on the calling thread alone: waking the crew costs microseconds.
const PARALLEL_MIN: usize = 2 << 20;
/// Channel messages from this size on are copied by the crew (where it may run). On the H200
/// host (p50, touched, processes not pinned) 512 KiB messages went from 68 to 54 us and 1 MiB
/// from 138 to 94 us with the crew; smaller messages were not tried.
const MESSAGE_PARALLEL_MIN: usize = 512 << 10;
/// The fewest cores on which a channel's message is copied by the crew unless
/// `LF_COPY_THREADS` asks for it: on fewer, the crew would take the core of the process that
/// receives it.
const MESSAGE_PARALLEL_CORES: usize = 4;
/// How long an idle worker polls for the next job before it sleeps.
const WORKER_SPIN: Duration = Duration::from_micros(300);
/// The most one thread takes at a time; a copy of less than this per thread is shared out
/// evenly, in pieces of at least [`CHUNK_MIN`].
const CHUNK: usize = 512 << 10;
const CHUNK_MIN: usize = 64 << 10;

/// How a copy writes its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stores {
    /// Ordinary stores: the destination ends up in the cache.
    Cached,
    // (Only GPU transfers write with streaming stores.)
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    /// Streaming (non-temporal) stores, which bypass the cache and do not read the lines
    /// they write: for destinations the CPU does not read next.
    Streaming,
}

/// One copy, shared by the threads working on it. Addresses are plain numbers so that a
/// worker that picks the job up late touches no memory: it finds no chunk left.
struct Job {
    src: usize,
    dst: usize,
    len: usize,
    stores: Stores,
    chunk: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl Job {
    /// Copies chunks until none is left.
    fn run(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.chunks {
                return;
            }
            let start = i * self.chunk;
            let n = self.chunk.min(self.len - start);
            // SAFETY: `Crew::copy` hands out each chunk of its valid, non-overlapping ranges
            // once, and waits for every chunk before it returns, so the ranges are live here.
            unsafe { copy_one((self.src + start) as *const u8, (self.dst + start) as *mut u8, n, self.stores) };
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Crew {
    /// Threads copying, the caller included.
    threads: usize,
    /// One copy at a time.
    busy: Mutex<()>,
    /// The current job and its number, which the workers wait to change.
    posted: Mutex<(u64, Option<Arc<Job>>)>,
    /// The number of the current job, for workers to poll without the lock.
    generation: AtomicU64,
    wake: Condvar,
}

impl Crew {
    /// A crew of `threads` copiers: the caller and `threads - 1` workers. A worker that
    /// cannot be started is simply missing: the others copy its chunks.
    fn new(threads: usize) -> Arc<Crew> {
        let crew = Arc::new(Crew {
            threads,
            busy: Mutex::new(()),
            posted: Mutex::new((0, None)),
            generation: AtomicU64::new(0),
            wake: Condvar::new(),
        });
        for n in 1..threads {
            let worker = crew.clone();
            let _ = std::thread::Builder::new().name(format!("lf-copy-{n}")).spawn(move || worker.work());
        }
        crew
    }

    /// Copies each job posted. Between jobs a worker polls for the next one for
    /// [`WORKER_SPIN`] before it sleeps: a staged transfer posts a piece every hundred
    /// microseconds or so, and a sleeping thread wakes too late for such a piece.
    fn work(&self) {
        let mut seen = 0;
        loop {
            let polled = Instant::now();
            while self.generation.load(Ordering::Acquire) == seen && polled.elapsed() < WORKER_SPIN {
                std::hint::spin_loop();
            }
            let job = {
                let mut posted = self.posted.lock();
                while posted.0 == seen {
                    self.wake.wait(&mut posted);
                }
                seen = posted.0;
                posted.1.clone()
            };
            if let Some(job) = job {
                job.run();
            }
        }
    }

    /// Posts a copy to the workers and returns at once; dropping the [`Started`] joins it.
    /// `None` when another copy has the crew.
    ///
    /// # Safety
    /// As [`copy`], until the copy is finished.
    unsafe fn start(&'static self, src: *const u8, dst: *mut u8, len: usize, stores: Stores) -> Option<Started> {
        let one_at_a_time = self.busy.try_lock()?;
        let chunk = len.div_ceil(self.threads).next_multiple_of(CHUNK_MIN).clamp(CHUNK_MIN, CHUNK);
        let job = Arc::new(Job {
            src: src as usize,
            dst: dst as usize,
            len,
            stores,
            chunk,
            chunks: len.div_ceil(chunk),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        });
        {
            let mut posted = self.posted.lock();
            posted.0 += 1;
            posted.1 = Some(job.clone());
            self.generation.store(posted.0, Ordering::Release);
        }
        self.wake.notify_all();
        Some(Started { crew: self, job, _one_at_a_time: one_at_a_time })
    }
}

/// A copy posted to the crew: the workers copy its chunks until it is dropped, when the
/// caller copies what is left and waits for the rest. It must be dropped while both ranges
/// are live (forgetting it breaks [`start_with`]'s contract).
pub(crate) struct Started {
    crew: &'static Crew,
    job: Arc<Job>,
    _one_at_a_time: parking_lot::MutexGuard<'static, ()>,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.job.run();
        // The last chunks other threads took: at most one chunk's copy each.
        while self.job.done.load(Ordering::Acquire) < self.job.chunks {
            std::hint::spin_loop();
        }
        self.crew.posted.lock().1 = None;
    }
}

fn crew() -> &'static Crew {
    static CREW: OnceLock<Arc<Crew>> = OnceLock::new();
    CREW.get_or_init(|| {
        let threads = copy_threads();
        if let Ok(value) = std::env::var(COPY_THREADS_ENV) {
            if !value.trim().parse::<usize>().is_ok_and(|n| n >= 1) {
                log::warn!(
                    "{COPY_THREADS_ENV}={value:?} is not a number of threads (1 or more); copying on {threads} threads, \
                     the default. Set it to a whole number, or unset it"
                );
            }
        }
        log::debug!("large host copies are made on {threads} thread(s), the caller included");
        Crew::new(threads)
    })
}

/// How many threads copy large pieces, the caller included.
pub fn copy_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::env::var(COPY_THREADS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(DEFAULT_THREADS.min(cores))
}

/// Copies `len` bytes from `src` to `dst`, on several threads when it is large.
///
/// # Safety
/// `src` is readable and `dst` writable for `len` bytes, the ranges do not overlap, and
/// nothing else writes them (or reads `dst`) during the call.
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: as this function's contract.
    unsafe { copy_with(src, dst, len, Stores::Cached, PARALLEL_MIN) }
}

/// [`copy`] with a choice of stores, on several threads from `parallel_min` bytes.
///
/// # Safety
/// As [`copy`].
pub(crate) unsafe fn copy_with(src: *const u8, dst: *mut u8, len: usize, stores: Stores, parallel_min: usize) {
    // SAFETY: as this function's contract; the copy is finished when the result drops, here.
    drop(unsafe { start_with(src, dst, len, stores, parallel_min) });
}

/// [`copy_with`], but a copy shared out among the crew is only started: the workers copy
/// while the caller goes on, and dropping the [`Started`] has the caller copy what is left and
/// wait for the rest. A copy too small to share is made at once (`None`).
///
/// # Safety
/// As [`copy`], until the copy is finished.
pub(crate) unsafe fn start_with(
    src: *const u8,
    dst: *mut u8,
    len: usize,
    stores: Stores,
    parallel_min: usize,
) -> Option<Started> {
    // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
    // the unsafe operations below rely on.
    unsafe {
        let crew = if len < parallel_min.max(2 * CHUNK_MIN) { None } else { Some(crew()) };
        let started = match crew {
            Some(crew) if crew.threads > 1 => crew.start(src, dst, len, stores),
            _ => None,
        };
        if started.is_none() {
            copy_one(src, dst, len, stores);
        }
        started
    }
}

/// Copies a message of `len` bytes from `src` into a channel's shared memory at `dst`: with the
/// crew from [`MESSAGE_PARALLEL_MIN`] bytes where this process may run on
/// [`MESSAGE_PARALLEL_CORES`] cores or more or `LF_COPY_THREADS` is set, else on this thread.
/// The receiver reads the message next, so the stores are cached ones.
///
/// # Safety
/// As [`copy`].
#[inline(always)]
pub(crate) unsafe fn copy_message(src: *const u8, dst: *mut u8, len: usize) {
    #[cold]
    #[inline(never)]
    unsafe fn large(src: *const u8, dst: *mut u8, len: usize) {
        static SHARED: OnceLock<bool> = OnceLock::new();
        let shared = *SHARED.get_or_init(|| {
            std::env::var_os(COPY_THREADS_ENV).is_some()
                || std::thread::available_parallelism().is_ok_and(|n| n.get() >= MESSAGE_PARALLEL_CORES)
        });
        let min = if shared { MESSAGE_PARALLEL_MIN } else { usize::MAX };
        // SAFETY: as this function's contract.
        unsafe { copy_with(src, dst, len, Stores::Cached, min) }
    }
    // SAFETY: as this function's contract.
    unsafe {
        if len >= MESSAGE_PARALLEL_MIN {
            large(src, dst, len)
        } else {
            std::ptr::copy_nonoverlapping(src, dst, len)
        }
    }
}

/// Copies on this thread.
///
/// # Safety
/// As [`copy`].
unsafe fn copy_one(src: *const u8, dst: *mut u8, len: usize, stores: Stores) {
    // SAFETY: as this function's contract.
    unsafe {
        match stores {
            Stores::Cached => std::ptr::copy_nonoverlapping(src, dst, len),
            Stores::Streaming => copy_streaming(src, dst, len),
        }
    }
}

/// Copies with streaming stores: ordinary ones up to the destination's first 16-byte
/// boundary and after its last whole 64 bytes, then a store fence, so that the bytes are
/// visible to whoever this thread next tells (the GPU, through a submission) before it tells.
///
/// # Safety
/// As [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = (dst as usize).wrapping_neg() & 15;
    // SAFETY: every load and store below lies within `src..src + len` and `dst..dst + len`
    // (the caller's ranges): the head and tail by their lengths, the body in whole 64-byte
    // blocks below `len - head`; the streaming stores' addresses are 16-byte aligned (the head
    // brings `d` to a boundary and it moves in 64-byte steps); SSE2 is part of x86_64.
    unsafe {
        if len < head + 64 {
            std::ptr::copy_nonoverlapping(src, dst, len);
            return;
        }
        std::ptr::copy_nonoverlapping(src, dst, head);
        let body = (len - head) & !63;
        let (mut s, mut d) = (src.add(head), dst.add(head));
        let end = d.add(body);
        while d < end {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            s = s.add(64);
            d = d.add(64);
        }
        std::ptr::copy_nonoverlapping(s, d, len - head - body);
        _mm_sfence();
    }
}

/// Elsewhere, an ordinary copy.
///
/// # Safety
/// As [`copy`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: as this function's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_of_odd_sizes_and_offsets() {
        let lens = [0, 1, 15, 63, 64, 65, 127, 200, CHUNK_MIN + 3, PARALLEL_MIN - 1, PARALLEL_MIN, PARALLEL_MIN + 4097];
        for stores in [Stores::Cached, Stores::Streaming] {
            for len in lens.into_iter().chain([9 * CHUNK + 13]) {
                for (from, to) in [(7, 3), (0, 0), (16, 5), (3, 16)] {
                    let src: Vec<u8> = (0..len + from).map(|i| (i * 31 % 251) as u8).collect();
                    let mut dst = vec![0u8; len + to + 70];
                    // SAFETY: both ranges lie inside their vectors and do not overlap.
                    unsafe { copy_with(src.as_ptr().add(from), dst.as_mut_ptr().add(to), len, stores, 0) };
                    let what = format!("{stores:?}, len {len}, offsets {from} -> {to}");
                    assert!(dst[to..to + len] == src[from..from + len], "{what}");
                    assert!(
                        dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0),
                        "bytes outside the range written, {what}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_crew_of_threads_shares_the_chunks() {
        let crew: &'static Crew = Box::leak(Box::new(Crew::new(3)));
        let len = 40 * CHUNK + 5;
        let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; len];
        for _ in 0..20 {
            dst.fill(0);
            // SAFETY: both vectors are `len` long and distinct.
            let started = unsafe { crew.start(src.as_ptr(), dst.as_mut_ptr(), len, Stores::Streaming) };
            assert!(started.is_some(), "the crew is idle");
            drop(started);
            assert!(dst == src);
        }
    }

    #[test]
    fn a_busy_crew_turns_a_second_copy_away() {
        let crew: &'static Crew = Box::leak(Box::new(Crew::new(2)));
        let (src, mut dst) = (vec![1u8; 4 * CHUNK], vec![0u8; 4 * CHUNK]);
        let (other_src, mut other_dst) = (vec![2u8; 4 * CHUNK], vec![0u8; 4 * CHUNK]);
        // SAFETY: each pair of vectors is distinct and as long as the copy.
        let first = unsafe { crew.start(src.as_ptr(), dst.as_mut_ptr(), src.len(), Stores::Cached) };
        assert!(first.is_some());
        // SAFETY: as above.
        let second = unsafe { crew.start(other_src.as_ptr(), other_dst.as_mut_ptr(), src.len(), Stores::Cached) };
        assert!(second.is_none(), "a second copy must not wait for the crew");
        drop(first);
        assert!(dst == src);
    }

    #[test]
    fn messages_are_copied_whole_on_either_side_of_the_crew_threshold() {
        let min = MESSAGE_PARALLEL_MIN;
        for len in [0, 1, 4095, min - 1, min, min + 12345, PARALLEL_MIN + 77, 3 * PARALLEL_MIN] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 249) as u8).collect();
            let mut dst = vec![0u8; len + 64];
            // SAFETY: both vectors hold the range and are distinct.
            unsafe { copy_message(src.as_ptr(), dst.as_mut_ptr(), len) };
            assert!(dst[..len] == src[..], "len {len}");
            assert!(dst[len..].iter().all(|&b| b == 0), "len {len}: bytes past the message written");
        }
    }
}
