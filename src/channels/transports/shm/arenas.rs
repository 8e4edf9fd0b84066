//! Buffer sends: the arena protocol, and the records the producer sends after the handshake.
//!
//! A buffer send carries no payload, only (arena id, offset, len) of bytes in one of the
//! producer's arenas. The first time an arena goes over
//! the channel, the producer passes its fd over the rendezvous socket ([`ControlRecord::Arena`])
//! before publishing; the consumer maps it once, read-only, and caches it per channel. The
//! producer keeps each arena alive until the messages pointing into it are released, and tells
//! the consumer which arenas died since ([`ControlRecord::Forget`]) when it announces a new one.

use crate::os::OwnedHandle;
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::ring::MAX_ARENA_LEN;
use crate::channels::transport::SharedRegion;
use crate::error::{Error, Result};
use crate::memory::SharedArena;
use crate::os::shm;
use crate::os::Mapping;

// SAFETY: an arena maps its whole memory file (`len` bytes from `base`) for as long as a clone
// of `keep_alive` lives, and `fd` is that file.
unsafe impl SharedRegion for SharedArena {
    fn fd(&self) -> crate::os::BorrowedHandle<'_> {
        SharedArena::fd(self)
    }
    fn arena_len(&self) -> usize {
        self.len()
    }
    fn identity(&self) -> usize {
        SharedArena::identity(self)
    }
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        SharedArena::keep_alive(self)
    }
    fn base(&self) -> *const u8 {
        SharedArena::base(self)
    }
}

/// The arenas a producer has passed to its consumer, by [`SharedRegion::identity`]. Each
/// entry holds a `Weak` of the arena, which keeps its address from being reused by another
/// arena: a known identity always means the same arena.
#[derive(Default)]
pub(super) struct SentArenas {
    /// What keeps the memory of messages in flight alive until the consumer releases them:
    /// (the last message of a run of sends from one arena, the arena's identity, a reference).
    pub(super) in_flight: VecDeque<(u64, usize, Arc<dyn Any + Send + Sync>)>,
    pub(super) by_identity: HashMap<usize, (u64, Weak<dyn Any + Send + Sync>)>,
    /// The last arena sent, (identity, id): a stream usually sends from one arena.
    pub(super) last: Option<(usize, u64)>,
    pub(super) next_id: u64,
    pub(super) sent: u64,
}

/// The arenas a consumer has mapped for one producer, by the id it gave them, and the last
/// one used.
#[derive(Default)]
pub(super) struct ReceivedArenas {
    pub(super) by_id: HashMap<u64, Arc<Mapping>>,
    pub(super) last: Option<(u64, Arc<Mapping>)>,
}

/// Maps an arena passed by a producer, read-only, after checking that it is a memory file
/// sealed against shrinking (so that reading it can never fault) and holds at least `len`
/// bytes.
pub(super) fn map_arena(fd: &OwnedHandle, len: u64) -> Result<Mapping> {
    if len == 0 || len > MAX_ARENA_LEN {
        return Err(Error::Corrupt(format!("its length {len} is not between 1 and {MAX_ARENA_LEN}")));
    }
    // A memfd is a regular file; a Windows section is none, and is recognised as a section.
    use crate::os::facts::{facts, HandleKind};
    let size = match facts(fd) {
        Ok(f) if f.kind == HandleKind::RegularFile || (f.kind == HandleKind::Other && shm::is_shm(fd)) => f.size,
        _ => return Err(Error::Corrupt("its fd is not a memory file".into())),
    };
    if !shm::size_is_fixed(fd) {
        return Err(Error::Corrupt("its memory file is not sealed against shrinking; refusing to map it".into()));
    }
    if size < len {
        return Err(Error::Corrupt(format!("its memory file has {size} bytes, {len} were announced")));
    }
    Mapping::shared_read_only(fd, 0, len as usize)
}

/// What the producer sends over the rendezvous socket after the handshake, each record in one
/// message of [`ControlRecord::LEN`] bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ControlRecord {
    /// Arena `id` of `len` bytes: its memory file is attached (one fd). Sent before the first
    /// message that points into it.
    Arena { id: u64, len: u64 },
    /// Arena `id` is gone at the producer and no message in flight points into it: unmap it.
    Forget { id: u64 },
    /// Another route's record (its descriptors attached), carried for it unread, in order
    /// with the messages: sent before the first message that needs it.
    Attachment { route: u32, bytes: Vec<u8> },
}

const RECORD_MAGIC: &[u8; 4] = b"LFCR";
const RECORD_ARENA: u32 = 1;
const RECORD_FORGET: u32 = 2;
const RECORD_ATTACHMENT: u32 = 3;
/// The most bytes an attachment carries.
pub(crate) const MAX_ATTACHMENT_LEN: usize = ControlRecord::LEN - 24;

/// A [`ControlRecord`] on the wire: its kind and two words (arena id and length, or route
/// and attachment length), then the attachment's bytes, zero past them.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordWire {
    magic: [u8; 4],
    kind: U32,
    a: U64,
    b: U64,
    attachment: [u8; MAX_ATTACHMENT_LEN],
}

impl ControlRecord {
    /// Every record has this size, so that records are read whole from the stream socket.
    pub(super) const LEN: usize = 256;

    /// The record in words, for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            ControlRecord::Arena { id, len } => format!("the record of arena {id} ({len} bytes)"),
            ControlRecord::Forget { id } => format!("the record forgetting arena {id}"),
            ControlRecord::Attachment { route, bytes } => {
                format!("an attachment of {} bytes for route {route}", bytes.len())
            }
        }
    }

    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut attachment = [0u8; MAX_ATTACHMENT_LEN];
        let (kind, a, b) = match self {
            ControlRecord::Arena { id, len } => (RECORD_ARENA, *id, *len),
            ControlRecord::Forget { id } => (RECORD_FORGET, *id, 0),
            ControlRecord::Attachment { route, bytes } => {
                attachment[..bytes.len()].copy_from_slice(bytes);
                (RECORD_ATTACHMENT, u64::from(*route), bytes.len() as u64)
            }
        };
        let wire = RecordWire { magic: *RECORD_MAGIC, kind: kind.into(), a: a.into(), b: b.into(), attachment };
        zerocopy::transmute!(wire)
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<ControlRecord> {
        let bad = |what: String| Error::Corrupt(format!("the producer sent a control record that {what}"));
        let wire = match RecordWire::ref_from_bytes(bytes) {
            Ok(wire) if &wire.magic == RECORD_MAGIC => wire,
            _ => return Err(bad(format!("is not one (wrong magic or {} bytes, not {})", bytes.len(), Self::LEN))),
        };
        let unused_zero = |from: usize| wire.attachment[from..].iter().all(|&b| b == 0);
        match (wire.kind.get(), wire.a.get(), wire.b.get()) {
            (RECORD_ARENA, id, len) if unused_zero(0) => Ok(ControlRecord::Arena { id, len }),
            (RECORD_FORGET, id, 0) if unused_zero(0) => Ok(ControlRecord::Forget { id }),
            (RECORD_ATTACHMENT, route, len) if route <= u64::from(u32::MAX) && len as usize <= MAX_ATTACHMENT_LEN => {
                let len = len as usize;
                if !unused_zero(len) {
                    return Err(bad("has non-zero bytes past its attachment".into()));
                }
                Ok(ControlRecord::Attachment { route: route as u32, bytes: wire.attachment[..len].to_vec() })
            }
            (kind, _, _) => Err(bad(format!("has unknown kind {kind} or malformed fields"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_records_round_trip_and_reject_garbage() {
        for r in [
            ControlRecord::Arena { id: 7, len: 1 << 21 },
            ControlRecord::Forget { id: 9 },
            ControlRecord::Attachment { route: 2, bytes: vec![1, 2, 3] },
        ] {
            assert_eq!(ControlRecord::decode(&r.encode()).unwrap(), r);
        }
        let mut bytes = ControlRecord::Forget { id: 1 }.encode();
        bytes[4] = 9;
        assert!(matches!(ControlRecord::decode(&bytes), Err(Error::Corrupt(_))));
        assert!(matches!(ControlRecord::decode(&bytes[..8]), Err(Error::Corrupt(_))));
        let mut long = ControlRecord::Attachment { route: 2, bytes: vec![1; 4] }.encode();
        long[16] = 240;
        assert!(matches!(ControlRecord::decode(&long), Err(Error::Corrupt(_))));
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(4000))]

        /// Control records from the producer's socket: a record accepted is exactly the one its
        /// bytes encode (no byte of it goes unchecked).
        #[test]
        fn fuzz_control_record_bytes(bytes in crate::fuzz::bytes_near(ControlRecord::Attachment { route: 2, bytes: vec![7; 9] }.encode().to_vec(), 300)) {
            if let Ok(record) = ControlRecord::decode(&bytes) {
                prop_assert_eq!(&record.encode()[..], &bytes[..]);
            }
        }

        #[test]
        fn fuzz_arena_record_bytes(bytes in crate::fuzz::mutated(ControlRecord::Arena { id: 3, len: 1 << 21 }.encode().to_vec())) {
            if let Ok(record) = ControlRecord::decode(&bytes) {
                prop_assert_eq!(&record.encode()[..], &bytes[..]);
            }
        }
    }
}
