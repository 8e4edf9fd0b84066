//! The layout of a shared-memory channel's region and checked access to it.
//!
//! Two memfds, mapped back to back, hold everything: the control part (the first page: what
//! both sides write) and the data part (slots and pool: what only the producer writes). The
//! data part is sealed with `F_SEAL_FUTURE_WRITE` once the producer has mapped it, so the
//! consumer's read-only view of it cannot be made writable (`mprotect`, a new mapping, a
//! reopened fd, `write`): the kernel refuses. The producer keeps writing through its own
//! mapping, made before the seal.
//!
//! ```text
//! 0      header: magic, version, geometry (written once by the producer)
//! 128    lifecycle line: producer_closed, consumer_closed,         (rarely written)
//!        producer_fast_wake, consumer_fast_wake (WAKE_* flags)
//! 256    tail line: how many messages the consumer has released  (consumer writes)
//! 384    data-wait line: futex word, sleeping flag, fd flag      (consumer sets flags)
//! 512    room-wait line: futex word, sleeping flag               (producer sets flag)
//! 4096   slots: slot_count x 128 B descriptors
//! ...    pool: payloads too large to go inline, 64-byte aligned
//! ```
//!
//! The lines are 128 bytes apart so that the adjacent-line prefetcher does not pair a line one
//! side writes with a line the other side writes.
//!
//! A slot holds `seq` (the message's sequence number + 1 once published: the consumer polls
//! this word, so a small message costs the consumer one or two cache lines and no separate
//! index line), `len`, `kind`, and either the payload inline (up to [`INLINE_MAX`] bytes),
//! the payload's pool offset, or (a buffer send, [`KIND_ARENA`]) the arena id, offset and
//! 64-bit length of bytes lying in one of the producer's arenas, which the consumer mapped
//! when the arena's fd came over the rendezvous socket, or ([`KIND_ROUTED`]) another route's
//! descriptor of the payload, inline.
//!
//! The producer's own state (head, pool allocator) lives in its process, never in the region,
//! so a consumer cannot corrupt it; the only value the producer reads back is the consumer's
//! tail, which it checks. The consumer checks every `seq`, `len`, `kind` and offset it reads.

use crate::os::OwnedHandle;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use zerocopy::{FromBytes, IntoBytes, KnownLayout};

use crate::error::{Error, Result};
use crate::os::{shm, Mapping, ShmOptions};

pub const MAGIC: u64 = u64::from_le_bytes(*b"LFSHMv01");
/// 2: buffer sends (arena slots, control records on the socket). 3: routed slots. 4: the
/// control and data parts in two memfds, the data part sealed against the consumer's writes.
/// 5: the fast-wake words hold [`WAKE_REGISTERED`] and [`WAKE_SLEEPER_BARRIER`], each
/// direction's wake protocol chosen by its sleeper, and a woken sleeping flag is taken by the
/// publisher that wakes; the header says whether the producer faulted the data part in.
/// 6: the producer signals an event loop through a socket pair whose end it keeps, not an eventfd.
/// 7: the producer's section names the channel's kind and its slot in a fan-in.
pub const VERSION: u32 = 7;

/// The producer's closed word when a fan-out's producer detached this consumer (too slow for
/// its bound); 1 is a plain close.
pub const PRODUCER_DETACHED: u32 = 2;

/// A fast-wake word's flag: this side is registered for global membarriers, so a barrier the
/// other side issues reaches it.
pub const WAKE_REGISTERED: u32 = 1;
/// A fast-wake word's flag: this side spins before it sleeps and issues a membarrier when it
/// does, so that what the other side publishes to it needs no fence (see `channels::wait`).
pub const WAKE_SLEEPER_BARRIER: u32 = 2;
pub const SLOT_SIZE: usize = 128;
/// Offset of the payload (or pool offset) inside a slot.
pub const SLOT_DATA: usize = 16;
/// The largest payload carried inside its slot.
pub const INLINE_MAX: usize = SLOT_SIZE - SLOT_DATA;
/// Pool allocations are aligned to cache lines.
pub const POOL_ALIGN: u64 = 64;
pub const MAX_SLOTS: u32 = 1 << 20;
/// The largest pool: a bound on what a peer can make the consumer map.
pub const MAX_POOL: u64 = crate::channels::MAX_POOL_SIZE;

pub const KIND_INLINE: u32 = 1;
pub const KIND_POOL: u32 = 2;
/// A buffer send: (arena id, offset, len) at [`SLOT_DATA`], the slot's 32-bit `len` unused.
pub const KIND_ARENA: u32 = 3;
/// Another route's descriptor, inline (as [`KIND_INLINE`]), the route id in bits 8-15 of the
/// kind word.
pub const KIND_ROUTED: u32 = 4;
/// The most arenas one channel's consumer keeps mapped: a bound on what a peer can make it map.
pub const MAX_ARENAS: usize = 16384;
/// The largest arena a consumer maps (1 TiB).
pub const MAX_ARENA_LEN: u64 = 1 << 40;

/// What the slot of the next message holds, as the consumer reads it, checked by
/// [`check_slot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Not published yet.
    Empty,
    /// `len` (1 to [`INLINE_MAX`]) bytes inline.
    Inline { len: usize },
    /// `len` bytes of pool at `offset`, inside the pool and aligned to [`POOL_ALIGN`].
    Pool { offset: u64, len: usize },
    /// A buffer send: its arena words are checked against the arena it names.
    Arena,
    /// Route `route`'s descriptor of `len` (1 to [`INLINE_MAX`]) bytes, inline.
    Routed { route: u32, len: usize },
}

/// The sequence word of the slot that will carry message `next` while it is still empty:
/// the previous lap's message number + 1, or 0 on the first lap.
#[inline]
pub fn expected_empty(next: u64, slot_count: u64) -> u64 {
    if next >= slot_count {
        next + 1 - slot_count
    } else {
        0
    }
}

/// Whether `len` bytes at `offset` lie inside a pool of `pool_size` bytes.
#[inline]
pub fn in_pool(offset: u64, len: u64, pool_size: u64) -> bool {
    len != 0 && offset.checked_add(len).is_some_and(|end| end <= pool_size)
}

/// Checks the words the producer wrote into the slot of message `next` (`seq`, `len_kind`,
/// and the pool offset word) against the region's geometry: everything a consumer reads from
/// a slot before it hands out a view. A pure function, so that it can be fuzzed. `Err` says
/// what is wrong.
pub fn check_slot(
    next: u64,
    geometry: &Geometry,
    seq: u64,
    len_kind: u64,
    pool_offset: u64,
) -> std::result::Result<Slot, String> {
    let slot_count = u64::from(geometry.slot_count);
    let empty = expected_empty(next, slot_count);
    if seq == empty {
        return Ok(Slot::Empty);
    }
    let index = next & (slot_count - 1);
    if seq != next.wrapping_add(1) {
        return Err(format!("slot {index} has sequence word {seq}, expected {} or {empty}", next.wrapping_add(1)));
    }
    let len = len_kind as u32 as usize;
    match (len_kind >> 32) as u32 {
        KIND_INLINE if (1..=INLINE_MAX).contains(&len) => Ok(Slot::Inline { len }),
        KIND_INLINE => Err(format!("inline message {next} has length {len}")),
        KIND_POOL if pool_offset % POOL_ALIGN == 0 && in_pool(pool_offset, len as u64, geometry.pool_size) => {
            Ok(Slot::Pool { offset: pool_offset, len })
        }
        KIND_POOL => Err(format!(
            "pool message {next} claims {len} bytes at offset {pool_offset}, outside the {}-byte pool or not \
             {POOL_ALIGN}-byte aligned",
            geometry.pool_size
        )),
        KIND_ARENA => Ok(Slot::Arena),
        kind if kind & 0xff == KIND_ROUTED && kind >> 16 == 0 => {
            if !(1..=INLINE_MAX).contains(&len) {
                return Err(format!("routed message {next} has length {len}"));
            }
            Ok(Slot::Routed { route: kind >> 8, len })
        }
        kind => Err(format!("message {next} has unknown kind {kind}")),
    }
}

/// Whether faulting in `len` bytes at a channel's creation leaves memory to spare: at most a
/// quarter of what the kernel calls available (`MemAvailable`), so that a large pool on a
/// small machine is faulted in as it is used instead.
pub fn prefault_fits(len: usize) -> bool {
    let available_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:")?.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    available_kib.is_some_and(|kib| (len as u64) <= kib.saturating_mul(1024) / 4)
}

/// Whether a buffer send's `len` bytes at `offset` lie inside an arena of `arena_len` bytes.
#[inline]
pub fn in_arena(offset: u64, len: u64, arena_len: u64) -> bool {
    len != 0 && offset.checked_add(len).is_some_and(|end| end <= arena_len)
}

/// The pool bytes a message of `len` bytes takes: rounded up to cache lines.
#[inline]
pub fn pool_need(len: usize) -> u64 {
    (len as u64 + POOL_ALIGN - 1) & !(POOL_ALIGN - 1)
}

#[cfg(not(target_endian = "little"))]
compile_error!("the shared region's slot layout (len and kind read as one word) assumes little-endian");

/// Packs a slot's length and kind into the word [`Region::slot_len_kind`] holds.
#[inline]
pub fn pack_len_kind(len: u32, kind: u32) -> u64 {
    u64::from(len) | u64::from(kind) << 32
}

/// The region's header, its first page: written once by the producer (magic to prefaulted),
/// then only the words the two sides share, each on its own cache line by group. Every bit
/// pattern is a valid header (`FromBytes`): a peer can write anything into it, and the
/// consumer checks what it reads.
#[derive(FromBytes, IntoBytes, KnownLayout)]
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    slot_count: AtomicU32,
    pool_size: AtomicU64,
    total_len: AtomicU64,
    /// 1 when the producer faulted the data part in at creation: the consumer then maps it in
    /// whole too (reading pages that exist costs no memory).
    prefaulted: AtomicU32,
    _reserved0: [u8; 92],
    producer_closed: AtomicU32,
    consumer_closed: AtomicU32,
    producer_fast_wake: AtomicU32,
    consumer_fast_wake: AtomicU32,
    _reserved1: [u8; 112],
    tail: AtomicU64,
    _reserved2: [u8; 120],
    data_futex: AtomicU32,
    data_sleeping: AtomicU32,
    fd_waiting: AtomicU32,
    _reserved3: [u8; 116],
    room_futex: AtomicU32,
    room_sleeping: AtomicU32,
    _reserved4: [u8; HEADER_END - 520],
}

const HEADER_END: usize = 4096;

// The wire format: these offsets are what version 5 of the region says.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(Header, magic) == 0 && offset_of!(Header, version) == 8);
    assert!(offset_of!(Header, slot_count) == 12 && offset_of!(Header, pool_size) == 16);
    assert!(offset_of!(Header, total_len) == 24 && offset_of!(Header, prefaulted) == 32);
    assert!(offset_of!(Header, producer_closed) == 128 && offset_of!(Header, consumer_closed) == 132);
    assert!(offset_of!(Header, producer_fast_wake) == 136 && offset_of!(Header, consumer_fast_wake) == 140);
    assert!(offset_of!(Header, tail) == 256);
    assert!(offset_of!(Header, data_futex) == 384 && offset_of!(Header, data_sleeping) == 388);
    assert!(offset_of!(Header, fd_waiting) == 392);
    assert!(offset_of!(Header, room_futex) == 512 && offset_of!(Header, room_sleeping) == 516);
    assert!(size_of::<Header>() == HEADER_END);
    assert!(size_of::<SlotWords>() == SLOT_SIZE && offset_of!(SlotWords, data) == SLOT_DATA);
};

/// One slot of the ring: the sequence word, the length and kind (one word, see
/// [`pack_len_kind`]), then [`INLINE_MAX`] bytes of inline payload, or a pool message's
/// offset, or a buffer send's arena id, offset and length, in the first data words.
#[derive(FromBytes, IntoBytes, KnownLayout)]
#[repr(C)]
pub struct SlotWords {
    pub seq: AtomicU64,
    /// `len` (low half, byte 8) and `kind` (high half, byte 12) as one word, so that each side
    /// moves them with one access (little-endian targets, all lava-flow supports).
    pub len_kind: AtomicU64,
    data: [AtomicU64; INLINE_MAX / 8],
}

impl SlotWords {
    /// The pool offset of a pool message (shares the inline bytes' place).
    #[inline]
    pub fn pool_offset(&self) -> &AtomicU64 {
        &self.data[0]
    }
    /// A buffer send's arena id, offset and length (in place of the inline bytes).
    #[inline]
    pub fn arena(&self) -> [&AtomicU64; 3] {
        [&self.data[0], &self.data[1], &self.data[2]]
    }
    /// Where the inline payload starts ([`INLINE_MAX`] bytes, to the slot's end). The bytes
    /// are written and read through this pointer (the atomics' cells allow it), not as words.
    #[inline]
    pub fn inline(&self) -> *mut u8 {
        self.data.as_ptr().cast_mut().cast()
    }
}

/// The `T` at `offset` of `map`.
///
/// # Safety
/// `offset` must be a multiple of `T`'s alignment (the mapping is page-aligned) and
/// `offset + size_of::<T>() <= map.len()`.
#[inline]
unsafe fn shared_at<T: FromBytes + KnownLayout>(map: &Mapping, offset: usize) -> &T {
    debug_assert!(offset % std::mem::align_of::<T>() == 0 && offset + std::mem::size_of::<T>() <= map.len());
    // SAFETY: in bounds and aligned (the caller's promise); every bit pattern is a valid `T`
    // (`FromBytes`), so whatever the other process wrote there is one; and every word of
    // the shared types is an atomic (or a cell of bytes only reached through raw pointers),
    // so the other process's writes are not data races.
    unsafe { &*map.as_ptr().add(offset).cast::<T>() }
}

/// The header of a mapping of a region's control part (or of the whole region): every such
/// mapping is at least `slots_offset >= HEADER_END` bytes long (see [`Geometry::new`]).
#[inline]
fn header(map: &Mapping) -> &Header {
    // SAFETY: offset 0, and the mappings of regions and of their control parts hold the
    // whole header (see above).
    unsafe { shared_at(map, 0) }
}

/// `value` rounded up to a multiple of `to`, or `None` where that does not fit in a u64.
fn round_up(value: u64, to: u64) -> Option<u64> {
    value.div_ceil(to).checked_mul(to)
}

/// Sizes and offsets of a region, computed by each side from the slot count and pool size,
/// never read back from shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub slot_count: u32,
    pub pool_size: u64,
    pub slots_offset: usize,
    pub pool_offset: usize,
    pub total_len: usize,
}

impl Geometry {
    pub fn new(slot_count: u32, pool_size: u64) -> Result<Geometry> {
        if !slot_count.is_power_of_two() || !(2..=MAX_SLOTS).contains(&slot_count) {
            return Err(Error::invalid(format!(
                "channel capacity {slot_count} must be a power of two from 2 to {MAX_SLOTS}"
            )));
        }
        // Checked before any arithmetic: an absurd size must be refused, not wrap around.
        if pool_size > MAX_POOL {
            return Err(Error::invalid(format!(
                "pool_size {pool_size} exceeds the limit of {MAX_POOL} bytes (1 TiB); the pool also bounds the largest message"
            )));
        }
        // The control and data parts are mapped back to back, each from offset 0 of its own
        // memory object: both lengths must be multiples of the mapping granularity (the page
        // size on Unix, 64 KiB on Windows).
        let page = crate::os::map_granularity() as u64;
        let too_large =
            || Error::invalid(format!("pool_size {pool_size} with capacity {slot_count} does not fit in memory"));
        let pool_size = round_up(pool_size.max(page), page).ok_or_else(too_large)?;
        let slots_offset = round_up(HEADER_END as u64, page).ok_or_else(too_large)?;
        let slots_end = u64::from(slot_count).checked_mul(SLOT_SIZE as u64).and_then(|s| s.checked_add(slots_offset));
        let pool_offset = slots_end.and_then(|end| round_up(end, page)).ok_or_else(too_large)?;
        let total_len = pool_offset.checked_add(pool_size).ok_or_else(too_large)?;
        let (Ok(pool_offset), Ok(total_len)) = (usize::try_from(pool_offset), usize::try_from(total_len)) else {
            return Err(too_large());
        };
        Ok(Geometry { slot_count, pool_size, slots_offset: slots_offset as usize, pool_offset, total_len })
    }
}

/// A second mapping of a region's control part, owned by what must wake a side's sleeper
/// without holding the region: the callback of the peer watcher, which may run while the
/// channel is being dropped. A futex in shared memory is keyed by its file and offset, so a
/// wake through this mapping reaches a sleeper on the region's own.
pub struct WaitWords(Mapping);

impl WaitWords {
    /// Maps the control part of a region of `geometry` from its memfd.
    pub fn map(control: &OwnedHandle, geometry: &Geometry) -> Result<WaitWords> {
        Ok(WaitWords(Mapping::shared(control, 0, geometry.slots_offset)?))
    }
    /// The futex word the consumer sleeps on for messages.
    pub fn data_futex(&self) -> &AtomicU32 {
        &header(&self.0).data_futex
    }
    /// The futex word the producer sleeps on for room and completions.
    pub fn room_futex(&self) -> &AtomicU32 {
        &header(&self.0).room_futex
    }
    /// Set by a consumer that closes its end (see [`Region::consumer_closed`]).
    pub fn consumer_closed(&self) -> &AtomicU32 {
        &header(&self.0).consumer_closed
    }
}

/// A mapped channel region. All shared words are accessed through atomics.
#[derive(Debug)]
pub struct Region {
    map: Mapping,
    pub geometry: Geometry,
}

/// The descriptors of a region, to pass to the consumer.
pub struct RegionFds {
    pub control: OwnedHandle,
    pub data: OwnedHandle,
}

impl Region {
    /// Creates the two memfds, maps them, seals them (the data part also against writes by
    /// anyone but this mapping, where the kernel offers `F_SEAL_FUTURE_WRITE`, since 5.1) and
    /// writes the header. Returns the region and the fds to pass.
    /// `prefault`: fault the data part in now (where memory allows, see [`prefault_fits`]), so
    /// that first touches of slots and pool do not fault in the message path.
    pub fn create(name: &str, geometry: Geometry, prefault: bool) -> Result<(Region, RegionFds)> {
        let options = ShmOptions { huge_page_size: None, sealable: true };
        let control_len = geometry.slots_offset;
        let data_len = geometry.total_len - control_len;
        let control = shm::create(&format!("lava-flow:{name}"), control_len as u64, options)?;
        let data = shm::create(&format!("lava-flow:{name}:data"), data_len as u64, options)?;
        let map = Mapping::shared_pair((&control, control_len), (&data, data_len), true)?;
        // Neither part can be resized (so the consumer can never be made to touch pages beyond
        // an end), nor sealed further by the peer.
        shm::fix_size(&control, "the channel's control memfd")?;
        // After our mapping, which keeps writing; every later writable use is refused. Where
        // that cannot be had, the consumer still maps the data part read-only, and what it
        // could write there by remapping it writable reaches only its own reads: the producer
        // reads nothing back from the data part.
        let data = match shm::read_only(&data, "the channel's data memfd") {
            Ok(read_only) => read_only,
            Err(e) => {
                crate::logging::log_first!(
                    log::Level::Info,
                    "a channel's consumer maps the data part of its shared memory read-only, but could remap it \
                     writable: {e}"
                );
                data
            }
        };
        shm::fix_size(&data, "the channel's data memfd")?;
        let region = Region { map, geometry };
        let prefaulted = prefault && {
            let fits = prefault_fits(data_len);
            let populated = fits && region.map.populate(control_len, data_len, true);
            if !populated {
                log::info!(
                    "channel {name:?}: its {data_len} bytes of slots and pool are not prefaulted ({}): first touches \
                     fault pages in on the message path",
                    if fits {
                        "MADV_POPULATE_WRITE failed: it needs Linux 5.14".to_owned()
                    } else {
                        "more than a quarter of the available memory; choose a smaller pool_size".to_owned()
                    }
                );
            }
            populated
        };
        let header = region.header();
        header.prefaulted.store(u32::from(prefaulted), Ordering::Relaxed);
        header.version.store(VERSION, Ordering::Relaxed);
        header.slot_count.store(geometry.slot_count, Ordering::Relaxed);
        header.pool_size.store(geometry.pool_size, Ordering::Relaxed);
        header.total_len.store(geometry.total_len as u64, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
        Ok((region, RegionFds { control, data }))
    }

    /// Maps a region received from a producer (its data part read-only) after checking that
    /// both files are sealed against shrinking, large enough, and that the header is what
    /// `geometry` predicts.
    pub fn attach(control: &OwnedHandle, data: &OwnedHandle, geometry: Geometry) -> Result<Region> {
        let control_len = geometry.slots_offset;
        let data_len = geometry.total_len - control_len;
        for (fd, part, len) in [(control, "control", control_len), (data, "data", data_len)] {
            if !shm::size_is_fixed(fd) {
                return Err(Error::Corrupt(format!(
                    "the producer's {part} memfd is not sealed against shrinking; refusing to map it"
                )));
            }
            let size = shm::size_of(fd)?;
            if size < len as u64 {
                return Err(Error::Corrupt(format!(
                    "the producer's {part} memfd has {size} bytes, its hello promised {len}"
                )));
            }
        }
        let map = Mapping::shared_pair((control, control_len), (data, data_len), false)?;
        let region = Region { map, geometry };
        let header = region.header();
        let header_ok = header.magic.load(Ordering::Acquire) == MAGIC
            && header.version.load(Ordering::Relaxed) == VERSION
            && header.slot_count.load(Ordering::Relaxed) == geometry.slot_count
            && header.pool_size.load(Ordering::Relaxed) == geometry.pool_size
            && header.total_len.load(Ordering::Relaxed) == geometry.total_len as u64;
        if !header_ok {
            return Err(Error::Corrupt("the shared region's header does not match the producer's hello".into()));
        }
        if header.prefaulted.load(Ordering::Relaxed) == 1 {
            region.map.populate(control_len, data_len, false);
        }
        Ok(region)
    }
    #[inline]
    fn header(&self) -> &Header {
        header(&self.map)
    }
    #[inline]
    pub fn producer_closed(&self) -> &AtomicU32 {
        &self.header().producer_closed
    }
    #[inline]
    pub fn consumer_closed(&self) -> &AtomicU32 {
        &self.header().consumer_closed
    }
    /// The producer's [`WAKE_REGISTERED`] and [`WAKE_SLEEPER_BARRIER`] flags (written before
    /// the hello): with the consumer's, they decide for each direction whether its publisher
    /// skips the StoreLoad fence and its sleeper issues a membarrier instead (see
    /// `os::membarrier`).
    #[inline]
    pub fn producer_fast_wake(&self) -> &AtomicU32 {
        &self.header().producer_fast_wake
    }
    /// The consumer's flags, as the producer's (written before the ack).
    #[inline]
    pub fn consumer_fast_wake(&self) -> &AtomicU32 {
        &self.header().consumer_fast_wake
    }
    #[inline]
    pub fn tail(&self) -> &AtomicU64 {
        &self.header().tail
    }
    #[inline]
    pub fn data_futex(&self) -> &AtomicU32 {
        &self.header().data_futex
    }
    #[inline]
    pub fn data_sleeping(&self) -> &AtomicU32 {
        &self.header().data_sleeping
    }
    #[inline]
    pub fn fd_waiting(&self) -> &AtomicU32 {
        &self.header().fd_waiting
    }
    #[inline]
    pub fn room_futex(&self) -> &AtomicU32 {
        &self.header().room_futex
    }
    #[inline]
    pub fn room_sleeping(&self) -> &AtomicU32 {
        &self.header().room_sleeping
    }
    /// Slot `index` (below the slot count, or this panics).
    #[inline]
    pub fn slot(&self, index: usize) -> &SlotWords {
        assert!(index < self.geometry.slot_count as usize, "slot index {index} out of range");
        // SAFETY: the slots lie from slots_offset (page-aligned) to slot_count slots on, inside
        // the mapping (the geometry says so and the mapping has its total length).
        unsafe { shared_at(&self.map, self.geometry.slots_offset + index * SLOT_SIZE) }
    }

    /// `len` bytes of pool at `offset`, after checking that they lie inside the pool.
    #[inline]
    pub fn pool_range(&self, offset: u64, len: u64) -> Option<*mut u8> {
        if !in_pool(offset, len, self.geometry.pool_size) {
            return None;
        }
        // SAFETY: offset + len <= pool_size, so the range lies inside the mapping.
        Some(unsafe { self.map.as_ptr().add(self.geometry.pool_offset + offset as usize) })
    }

    /// The data part (slots and pool) of the mapping: read-only at the consumer.
    #[cfg(all(test, target_os = "linux"))]
    pub fn data_part(&self) -> (*mut u8, usize) {
        let at = self.geometry.slots_offset;
        // SAFETY: slots_offset < total_len, the mapping's length.
        (unsafe { self.map.as_ptr().add(at) }, self.geometry.total_len - at)
    }
}

// The seals and descriptors these tests check are Linux and macOS memory files.
#[cfg(all(unix, test))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn geometry_is_checked() {
        assert!(Geometry::new(3, 4096).is_err());
        assert!(Geometry::new(1, 4096).is_err());
        let g = Geometry::new(64, 1).unwrap();
        assert_eq!(g.pool_size, 4096);
        assert_eq!(g.pool_offset, 4096 + 64 * 128);
        // Absurd sizes are refused before any arithmetic could wrap them into small ones.
        for absurd in [u64::MAX, u64::MAX - 4095, 1 << 62, MAX_POOL + 1] {
            let err = Geometry::new(64, absurd).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(ref m) if m.contains("pool_size")), "{absurd}: {err}");
        }
        assert_eq!(Geometry::new(MAX_SLOTS, MAX_POOL).unwrap().pool_size, MAX_POOL);
    }

    /// The consumer's view of the data part cannot be made writable, by any route the kernel
    /// offers: `mprotect`, a writable mapping of the fd it received, of the fd reopened
    /// read-write through /proc, or of /proc/self/map_files; nor can it `write` the file.
    /// The producer still writes through its own mapping. (Linux: macOS has no such seal.)
    #[cfg(target_os = "linux")]
    #[test]
    fn the_consumer_cannot_write_the_data_part() {
        use std::os::fd::AsRawFd;
        let g = Geometry::new(8, 8192).unwrap();
        let (producer, fds) = Region::create("sealed", g, true).unwrap();
        if !crate::os::shm::seals(&fds.data).unwrap().contains(rustix::fs::SealFlags::FUTURE_WRITE) {
            println!("skipped: this kernel has no F_SEAL_FUTURE_WRITE (Linux 5.1), so the data part is not sealed");
            return;
        }
        let consumer = Region::attach(&fds.control, &fds.data, g).unwrap();
        let (data, len) = consumer.data_part();
        let errno = || std::io::Error::last_os_error().raw_os_error();
        // SAFETY: mprotect of the consumer's own mapping; it fails, leaving it as it was.
        let rc = unsafe { libc::mprotect(data.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!((rc, errno()), (-1, Some(libc::EACCES)), "mprotect to writable is refused");
        let writable_map = |fd: i32| {
            // SAFETY: a fresh mapping at a kernel-chosen address; unmapped if it succeeds.
            let p = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            };
            if p != libc::MAP_FAILED {
                // SAFETY: the mapping just made.
                unsafe { libc::munmap(p, len) };
                return None;
            }
            errno()
        };
        assert_eq!(writable_map(fds.data.as_raw_fd()), Some(libc::EPERM), "a writable mapping of the fd is refused");
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", fds.data.as_raw_fd()))
            .unwrap();
        assert_eq!(writable_map(reopened.as_raw_fd()), Some(libc::EPERM), "nor of the fd reopened read-write");
        // SAFETY: a one-byte write from a live local; it fails.
        let n = unsafe { libc::pwrite(reopened.as_raw_fd(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!((n, errno()), (-1, Some(libc::EPERM)), "write to the file is refused");
        let map_file = format!("/proc/self/map_files/{:x}-{:x}", data as usize, data as usize + len);
        match std::fs::OpenOptions::new().read(true).write(true).open(&map_file) {
            Ok(file) => assert_eq!(writable_map(file.as_raw_fd()), Some(libc::EPERM), "nor through {map_file}"),
            // Opening map_files needs CAP_SYS_ADMIN: without it that route is closed anyway.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{map_file}: {e}"),
        }
        // The producer's own mapping, made before the seal, still writes, and the consumer sees it.
        producer.slot(2).seq.store(77, Ordering::Release);
        assert_eq!(consumer.slot(2).seq.load(Ordering::Acquire), 77);
        // SAFETY: the producer's pool lies inside its writable mapping.
        unsafe { producer.pool_range(0, 8).unwrap().write_bytes(0x5a, 8) };
        // SAFETY: the consumer's view of the same bytes, readable.
        assert_eq!(unsafe { consumer.pool_range(0, 8).unwrap().read() }, 0x5a);
    }

    #[test]
    fn attach_checks_seals_size_and_header() {
        let g = Geometry::new(8, 8192).unwrap();
        let (region, fds) = Region::create("t", g, false).unwrap();
        let other = Region::attach(&fds.control, &fds.data, g).unwrap();
        region.slot(3).seq.store(9, Ordering::Relaxed);
        assert_eq!(other.slot(3).seq.load(Ordering::Relaxed), 9);
        other.tail().store(5, Ordering::Relaxed);
        assert_eq!(region.tail().load(Ordering::Relaxed), 5, "the control part is shared both ways");
        let wrong = Geometry::new(16, 8192).unwrap();
        assert!(Region::attach(&fds.control, &fds.data, wrong).is_err());
        let unsealed = shm::create("u", g.total_len as u64, ShmOptions::default()).unwrap();
        assert!(matches!(Region::attach(&fds.control, &unsealed, g), Err(Error::Corrupt(_))));
        assert!(matches!(Region::attach(&unsealed, &fds.data, g), Err(Error::Corrupt(_))));
        assert!(region.pool_range(8192 - 64, 64).is_some());
        assert!(region.pool_range(8192 - 64, 65).is_none());
        assert!(region.pool_range(u64::MAX, 2).is_none());
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(4000))]

        /// Whatever a producer writes into a slot, the consumer's check answers, and what it
        /// accepts lies inside the slot or the pool.
        #[test]
        fn fuzz_slot_words(
            capacity_log in 1u32..=20,
            pool_size in 1u64..(1 << 24),
            next in any::<u64>(),
            near in any::<bool>(),
            seq in any::<u64>(),
            len in any::<u32>(),
            kind in prop_oneof![0u32..8, any::<u32>(), (0u32..256).prop_map(|r| r << 8 | KIND_ROUTED)],
            pool_offset in prop_oneof![0u64..(1 << 24), any::<u64>()],
        ) {
            let g = Geometry::new(1 << capacity_log, pool_size).unwrap();
            // Half the cases name the message the consumer waits for.
            let seq = if near { next.wrapping_add(1) } else { seq };
            match check_slot(next, &g, seq, pack_len_kind(len, kind), pool_offset) {
                Ok(Slot::Empty) => prop_assert_eq!(seq, expected_empty(next, u64::from(g.slot_count))),
                Ok(Slot::Inline { len }) | Ok(Slot::Routed { len, .. }) => prop_assert!((1..=INLINE_MAX).contains(&len)),
                Ok(Slot::Pool { offset, len }) => {
                    prop_assert!(len > 0 && offset % POOL_ALIGN == 0);
                    prop_assert!(offset.checked_add(len as u64).is_some_and(|end| end <= g.pool_size));
                }
                Ok(Slot::Arena) => prop_assert_eq!(kind, KIND_ARENA),
                Err(what) => prop_assert!(!what.is_empty()),
            }
        }

        /// Arena ranges: accepted only inside the arena.
        #[test]
        fn fuzz_arena_ranges(offset in any::<u64>(), len in any::<u64>(), arena in any::<u64>()) {
            if in_arena(offset, len, arena) {
                prop_assert!(len > 0 && offset + len <= arena);
            }
        }
    }
}
