//! A fan-out's bell: one shared word that the producer moves on after it published a message
//! to every consumer's ring, and that spinning consumers watch instead of their rings' next
//! slots.
//!
//! Why: a consumer that spins on its own ring's next slot keeps pulling that slot's line back
//! while the producer writes it, so the producer's stores to N rings each wait for a line of
//! their own, one after the other (about a pair's whole send per consumer on a Xeon host).
//! Spinning on one line that every consumer shares instead, the producer's writes to the
//! rings meet no one, and its one store to the bell reaches every consumer at once.
//!
//! The bell is a hint: a consumer still decides by its ring's slot (a message is there or not),
//! so whatever value a producer writes into it, nothing is lost or read early; the futex wake
//! protocol of each ring is unchanged for consumers that sleep.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::SealFlags;

use crate::error::{Error, Result};
use crate::os::mapping::{page_size, Mapping};
use crate::os::memfd::{add_seals, fd_size, memfd_create, seals, MemfdFlags, RESIZE_SEALS};

/// The producer's side: the bell's memory, which it alone writes.
pub(crate) struct Bell {
    map: Mapping,
    fd: OwnedFd,
}

impl Bell {
    /// A new bell for fan-out channel `name`: one page, sealed against resizing.
    pub(crate) fn create(name: &str) -> Result<Bell> {
        let len = page_size();
        let fd = memfd_create(
            &format!("lava-flow bell {name}"),
            len as u64,
            MemfdFlags { allow_sealing: true, ..MemfdFlags::default() },
        )?;
        add_seals(&fd, RESIZE_SEALS, "the fan-out's bell memfd")?;
        let map = Mapping::shared(&fd, 0, len)?;
        Ok(Bell { map, fd })
    }

    /// Tells every spinning consumer that a message was published (after it was, to every
    /// ring: the release store orders those stores before this one).
    #[inline]
    pub(crate) fn ring(&self) {
        let word = word(&self.map);
        word.store(word.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// A descriptor of the bell's memory for a consumer.
    pub(crate) fn share(&self) -> Result<OwnedFd> {
        self.fd.try_clone().map_err(|e| Error::os("duplicating the fan-out's bell memfd", e))
    }
}

/// A consumer's view of its producer's bell, mapped read-only.
pub(crate) struct BellView {
    map: Mapping,
}

impl BellView {
    /// Maps the bell the producer sent, once it is sealed against shrinking and a page long
    /// (a shorter file would fault on the read).
    pub(crate) fn attach(fd: &OwnedFd) -> Result<BellView> {
        let len = page_size();
        if !seals(fd).is_some_and(|s| s.contains(SealFlags::SHRINK)) {
            return Err(Error::Corrupt("the fan-out producer's bell memfd is not sealed against shrinking".into()));
        }
        let size = fd_size(fd)?;
        if size < len as u64 {
            return Err(Error::Corrupt(format!("the fan-out producer's bell memfd has {size} bytes, not {len}")));
        }
        Ok(BellView { map: Mapping::shared_read_only(fd, 0, len)? })
    }

    /// How often the bell has rung (any value: only its changes count).
    #[inline]
    pub(crate) fn rung(&self) -> u64 {
        word(&self.map).load(Ordering::Acquire)
    }
}

/// The bell's word, at the start of its page.
#[inline]
fn word(map: &Mapping) -> &AtomicU64 {
    // SAFETY: the mapping is a page long (at least 8 bytes) and page-aligned; every bit
    // pattern is a valid `u64`, and the word is only reached atomically, so the other
    // process's writes are not data races.
    unsafe { &*map.as_ptr().cast::<AtomicU64>() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_sees_the_bell_ring() {
        let bell = Bell::create("test").unwrap();
        let view = BellView::attach(&bell.share().unwrap()).unwrap();
        let before = view.rung();
        bell.ring();
        bell.ring();
        assert_eq!(view.rung(), before.wrapping_add(2));
    }

    #[test]
    fn an_unsealed_or_short_bell_is_refused() {
        let fd = memfd_create("short", 8, MemfdFlags { allow_sealing: true, ..MemfdFlags::default() }).unwrap();
        let e = BellView::attach(&fd).err().unwrap();
        assert!(e.to_string().contains("not sealed"), "{e}");
        add_seals(&fd, RESIZE_SEALS, "test").unwrap();
        let e = BellView::attach(&fd).err().unwrap();
        assert!(e.to_string().contains("has 8 bytes"), "{e}");
    }
}
