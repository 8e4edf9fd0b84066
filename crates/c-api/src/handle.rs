//! The handle table: how C's opaque pointers map to Rust values, checked on every use.
//!
//! A handle is not an address but a token, `(generation << 32) | slot`, into a table of slots
//! that only grows (chunks are never moved or freed). Checking one is a bounds test and two
//! atomic loads, without a lock or a hash, so the C hot path (send/recv) pays a few
//! nanoseconds; and a NULL, freed, foreign, forged or wrong-type handle is recognised without
//! ever being dereferenced. Creating and freeing take a mutex.
//!
//! A slot's generation is odd while it holds a value and even while free; freeing bumps it, so
//! a stale token never matches a reused slot (until the 32-bit generation wraps, after two
//! billion reuses of that one slot).

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use parking_lot::Mutex;

use super::status::lf_status;
use super::{kind_name, Failure, FfiResult};

/// A Rust type that C holds through a handle. `KIND` tells handle types apart; every
/// implementation is in the crate root's [`handle_types!`] list, so the kinds are visibly
/// distinct (this module names none of the handle types).
pub(crate) trait HandleType: Send + Sync + 'static {
    const KIND: u32;
    const NAME: &'static str;
}

/// Implements [`HandleType`] for each listed type and defines `kind_name`, the C name of a
/// kind, for messages about wrong-type handles.
macro_rules! handle_types {
    ($($(#[$attr:meta])* $ty:path => $kind:literal, $name:literal;)*) => {
        $($(#[$attr])* impl $crate::handle::HandleType for $ty {
            const KIND: u32 = $kind;
            const NAME: &'static str = $name;
        })*
        /// The C name of a kind, for messages about wrong-type handles.
        pub(crate) fn kind_name(kind: u32) -> &'static str {
            match kind {
                $($(#[$attr])* $kind => $name,)*
                _ => "unknown",
            }
        }
    };
}
pub(crate) use handle_types;

const CHUNK_BITS: u32 = 10;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;
/// 16,384 chunks of 1,024 slots: up to 16 million live handles.
const MAX_CHUNKS: usize = 1 << 14;

struct Slot {
    generation: AtomicU32,
    kind: AtomicU32,
    value: AtomicPtr<()>,
}

struct Table {
    chunks: [AtomicPtr<Slot>; MAX_CHUNKS],
    /// Slots ever handed out, and the free ones among them; only under this lock.
    alloc: Mutex<(usize, Vec<u32>)>,
}

static TABLE: Table =
    Table { chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_CHUNKS], alloc: Mutex::new((0, Vec::new())) };

impl Table {
    #[inline(always)]
    fn slot(&self, index: usize) -> Option<&'static Slot> {
        let chunk = self.chunks.get(index >> CHUNK_BITS)?.load(Ordering::Acquire);
        if chunk.is_null() {
            return None;
        }
        // SAFETY: a non-NULL chunk pointer was published (Release) after its CHUNK_LEN slots
        // were initialised, and chunks are never freed, so the slot lives for 'static.
        Some(unsafe { &*chunk.add(index & (CHUNK_LEN - 1)) })
    }

    /// A free slot's index, growing the table by a chunk when none is free.
    fn take_free(&self, next: &mut usize, free: &mut Vec<u32>) -> Option<usize> {
        if let Some(index) = free.pop() {
            return Some(index as usize);
        }
        let index = *next;
        if index >= MAX_CHUNKS * CHUNK_LEN {
            return None;
        }
        if index % CHUNK_LEN == 0 {
            let chunk: Box<[Slot]> = (0..CHUNK_LEN)
                .map(|_| Slot {
                    generation: AtomicU32::new(0),
                    kind: AtomicU32::new(0),
                    value: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect();
            // Leaked on purpose: slots must outlive every token that names them.
            let chunk = Box::leak(chunk).as_mut_ptr();
            self.chunks[index >> CHUNK_BITS].store(chunk, Ordering::Release);
        }
        *next += 1;
        Some(index)
    }
}

fn token(index: usize, generation: u32) -> usize {
    ((generation as u64) << 32 | index as u64) as usize
}

fn bad_handle(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_BAD_HANDLE, message }
}

/// The live slot a handle names when it holds a value of `kind`; `None` for anything else
/// (NULL, freed, forged, wrong type: [`handle_failure`] says which). The path of every call.
#[inline(always)]
fn live_slot(handle: usize, kind: u32) -> Option<&'static Slot> {
    let raw = handle as u64;
    let (index, generation) = ((raw & 0xFFFF_FFFF) as usize, (raw >> 32) as u32);
    // An even generation is never live; NULL has generation 0.
    if generation & 1 == 0 {
        return None;
    }
    let slot = TABLE.slot(index)?;
    if slot.generation.load(Ordering::Acquire) != generation || slot.kind.load(Ordering::Relaxed) != kind {
        return None;
    }
    Some(slot)
}

/// Why `handle` is not a live handle of kind `kind` (`name`): the failure of a call given one.
#[cold]
#[inline(never)]
fn handle_failure(handle: usize, kind: u32, name: &str, arg: &str) -> Failure {
    if handle == 0 {
        return Failure::null(arg);
    }
    let raw = handle as u64;
    let (index, generation) = ((raw & 0xFFFF_FFFF) as usize, (raw >> 32) as u32);
    let live = generation & 1 == 1;
    match TABLE.slot(index).filter(|slot| live && slot.generation.load(Ordering::Acquire) == generation) {
        Some(slot) if slot.kind.load(Ordering::Relaxed) != kind => bad_handle(format!(
            "argument `{arg}` is an {} handle, not an {name}",
            kind_name(slot.kind.load(Ordering::Relaxed))
        )),
        _ => bad_handle(format!(
            "argument `{arg}` is not a live {name} handle (already freed, or never created by lava-flow)"
        )),
    }
}

/// Finds the live slot a handle names, checking that it holds a T.
#[inline(always)]
fn lookup<T: HandleType>(handle: *const T, arg: &str) -> FfiResult<&'static Slot> {
    match live_slot(handle as usize, T::KIND) {
        Some(slot) => Ok(slot),
        None => Err(handle_failure(handle as usize, T::KIND, T::NAME, arg)),
    }
}

/// Moves a value to the heap and returns the handle C will hold.
pub(crate) fn new_handle<T: HandleType>(value: T) -> FfiResult<*mut T> {
    let value = Box::into_raw(Box::new(value));
    let mut alloc = TABLE.alloc.lock();
    let (next, free) = &mut *alloc;
    let Some(index) = TABLE.take_free(next, free) else {
        drop(alloc);
        // SAFETY: `value` came from Box::into_raw above and was never shared.
        drop(unsafe { Box::from_raw(value) });
        return Err(Failure {
            status: lf_status::LF_ERR_OUT_OF_MEMORY,
            message: format!("too many live lava-flow handles ({}); free some", MAX_CHUNKS * CHUNK_LEN),
        });
    };
    let slot = TABLE.slot(index).expect("take_free returns slots of published chunks");
    let generation = slot.generation.load(Ordering::Relaxed).wrapping_add(1) | 1;
    slot.value.store(value.cast(), Ordering::Relaxed);
    slot.kind.store(T::KIND, Ordering::Relaxed);
    // Publishes value and kind to readers that see this generation (Acquire in `lookup`).
    slot.generation.store(generation, Ordering::Release);
    Ok(token(index, generation) as *mut T)
}

/// Borrows the value behind a handle after checking that it is live and holds a T.
#[inline]
pub(crate) fn handle_ref<'a, T: HandleType>(handle: *const T, arg: &str) -> FfiResult<&'a T> {
    let slot = lookup(handle, arg)?;
    // SAFETY: the slot is live with kind T::KIND, so `value` is the Box<T> pointer stored by
    // `new_handle::<T>` and not yet freed; the C contract forbids freeing a handle while
    // another call uses it.
    Ok(unsafe { &*slot.value.load(Ordering::Relaxed).cast::<T>() })
}

/// Frees a handle and drops its value. NULL is accepted and does nothing.
pub(crate) fn free_handle<T: HandleType>(handle: *mut T, arg: &str) -> FfiResult<()> {
    if handle.is_null() {
        return Ok(());
    }
    let value = {
        let mut alloc = TABLE.alloc.lock();
        // Checked under the lock, so two racing frees of one handle cannot both pass.
        let slot = lookup(handle, arg)?;
        let index = (handle as usize as u64 & 0xFFFF_FFFF) as u32;
        let value = slot.value.swap(std::ptr::null_mut(), Ordering::Relaxed);
        slot.generation.fetch_add(1, Ordering::Release);
        alloc.1.push(index);
        value
    };
    // SAFETY: the value was live in the slot (so it came from Box::into_raw in
    // `new_handle::<T>`) and the slot is now free, so no other free can reach it.
    drop(unsafe { Box::from_raw(value.cast::<T>()) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::lf_location;

    struct Probe(u64);
    impl HandleType for Probe {
        const KIND: u32 = 0xFFFF;
        const NAME: &'static str = "probe";
    }

    #[test]
    fn live_stale_forged_and_wrong_type_handles() {
        let a = new_handle(Probe(7)).ok().unwrap();
        assert_eq!(handle_ref(a, "a").ok().unwrap().0, 7);
        let as_location = a.cast::<lf_location>();
        let err = handle_ref(as_location, "loc").err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_BAD_HANDLE);
        assert_eq!(err.message, "argument `loc` is an unknown handle, not an lf_location");
        assert!(free_handle(as_location, "loc").is_err(), "a wrong-type free frees nothing");

        free_handle(a, "a").ok().unwrap();
        assert!(handle_ref(a, "a").is_err(), "stale after free");
        assert!(free_handle(a, "a").is_err(), "double free refused");
        // The slot is reused with a new generation: the old token stays stale.
        let b = new_handle(Probe(8)).ok().unwrap();
        assert_ne!(a, b);
        assert!(handle_ref(a, "a").is_err());
        assert_eq!(handle_ref(b, "b").ok().unwrap().0, 8);
        free_handle(b, "b").ok().unwrap();

        let mut on_stack = 0u64;
        for forged in [1usize, 0x1234, &mut on_stack as *mut u64 as usize, usize::MAX, 3usize << 32] {
            let err = handle_ref(forged as *const Probe, "f").err().unwrap();
            assert_eq!(err.status, lf_status::LF_ERR_BAD_HANDLE, "{forged:#x}");
        }
    }

    #[test]
    fn many_handles_across_chunks_and_threads() {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let handles: Vec<_> =
                        (0..3000).map(|i| new_handle(Probe(t * 10_000 + i)).ok().unwrap() as usize).collect();
                    for (i, &h) in handles.iter().enumerate() {
                        assert_eq!(handle_ref(h as *const Probe, "h").ok().unwrap().0, t * 10_000 + i as u64);
                    }
                    for h in handles {
                        free_handle(h as *mut Probe, "h").ok().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
