//! What the CUDA IPC route sends: its rendezvous sections, attachments and descriptors, each
//! with a parser that checks everything a peer could get wrong.

use zerocopy::little_endian::{I32, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::{Error, Result};

/// Version 3: memory of CUDA memory pools (pools announced with their fds, allocations with
/// their export data and pool), spans of VMM pieces (each piece announced with its fd before
/// the span). Version 2: a message's descriptor names its ready value.
const VERSION: u32 = 3;
/// The consumer's answer: it opens CUDA memory on the devices listed.
pub(super) const ANSWER_CUDA: u32 = 1;
/// The consumer's answer: it takes lava-flow's GPU buffers (Vulkan arenas, imported into CUDA)
/// of the devices whose bits a 4-byte mask after the UUIDs sets (bit i: the i-th UUID): those
/// its own GPU reaches in place (the same GPU, or one with a peer path to it).
pub(super) const ANSWER_ARENAS: u32 = 2;
/// The producer's offer: its process has not loaded CUDA, so it sends no CUDA memory (only
/// lava-flow's GPU buffers, where it offers them). An offer without it sends CUDA memory.
pub(super) const OFFER_NO_CUDA_MEMORY: u32 = 1;
/// The producer's offer: it sends lava-flow's GPU buffers of the one device its UUID list
/// names, as Vulkan arenas for the consumer to import into CUDA.
pub(super) const OFFER_ARENAS: u32 = 4;
/// The most devices an answer lists.
pub(super) const MAX_DEVICES: usize = 16;
/// The longest reason a section carries.
const MAX_REASON: usize = 512;

/// A rendezvous section of either side: the producer's offer (no devices, or the device of
/// the GPU buffers it offers), or the consumer's answer: the CUDA devices it can open memory
/// on, or why it cannot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Section {
    pub(super) flags: u32,
    pub(super) devices: Vec<[u8; 16]>,
    /// With [`ANSWER_ARENAS`]: bit i set where the consumer takes GPU buffers of `devices[i]`.
    pub(super) arenas: u32,
    pub(super) declined: String,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SectionHead {
    version: U32,
    flags: U32,
    devices: U32,
}
const SECTION_HEAD: usize = std::mem::size_of::<SectionHead>();

impl Section {
    pub(super) fn encode(&self) -> Vec<u8> {
        let devices = &self.devices[..self.devices.len().min(MAX_DEVICES)];
        let mut out = Vec::with_capacity(SECTION_HEAD + 16 * devices.len() + self.declined.len());
        let head =
            SectionHead { version: VERSION.into(), flags: self.flags.into(), devices: (devices.len() as u32).into() };
        out.extend_from_slice(head.as_bytes());
        for uuid in devices {
            out.extend_from_slice(uuid);
        }
        if self.flags & ANSWER_ARENAS != 0 {
            out.extend_from_slice(&self.arenas.to_le_bytes());
        }
        let mut end = self.declined.len().min(MAX_REASON);
        while !self.declined.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&self.declined.as_bytes()[..end]);
        out
    }

    pub(super) fn decode(bytes: &[u8], whose: &str) -> Result<Section> {
        let bad = |what: String| Error::Corrupt(format!("the {whose}'s CUDA route section {what}"));
        let Ok((head, rest)) = SectionHead::read_from_prefix(bytes) else {
            return Err(bad(format!("has {} bytes", bytes.len())));
        };
        let version = head.version.get();
        if version != VERSION {
            return Err(Error::Unsupported(format!(
                "the {whose}'s CUDA route speaks version {version}, this process version {VERSION}; use the same lava-flow on both sides"
            )));
        }
        let count = head.devices.get() as usize;
        if count > MAX_DEVICES || rest.len() < 16 * count || rest.len() - 16 * count > MAX_REASON {
            return Err(bad(format!("lists {count} devices in {} bytes", rest.len())));
        }
        let (uuids, mut reason) = rest.split_at(16 * count);
        let devices = uuids.chunks_exact(16).map(|c| c.try_into().expect("16 bytes")).collect();
        let flags = head.flags.get();
        let mut arenas = 0;
        if flags & ANSWER_ARENAS != 0 {
            let Some((mask, after)) = reason.split_first_chunk::<4>() else {
                return Err(bad(format!("takes GPU buffers but has {} bytes for their mask", reason.len())));
            };
            arenas = u32::from_le_bytes(*mask);
            if count < 32 && arenas >> count != 0 {
                return Err(bad(format!("takes GPU buffers of devices {arenas:#x} of the {count} it lists")));
            }
            reason = after;
        }
        Ok(Section { flags, devices, arenas, declined: String::from_utf8_lossy(reason).into_owned() })
    }
}

/// The most allocation slots a channel uses at once: a bound on what a producer can make the
/// consumer import.
pub(super) const MAX_SLOTS: u32 = 4096;
/// The most CUDA memory pools a channel announces at once.
pub(super) const MAX_POOLS: u32 = 64;

const ATTACH_ANNOUNCE: u32 = 1;
const ATTACH_FORGET: u32 = 2;
/// A memory pool announced (its fd attached), in the head's slot field: its pool index.
const ATTACH_POOL: u32 = 3;
/// A memory pool's index free again (no allocation announced from it is left).
const ATTACH_FORGET_POOL: u32 = 4;
/// One piece of a span of VMM pieces (its fd attached), for the slot and generation whose
/// announcement follows its pieces.
const ATTACH_PIECE: u32 = 5;
/// The most pieces a span holds.
pub(super) const MAX_PIECES: u32 = crate::memory::cuda::MAX_PIECES as u32;
/// `Announce::memory`: legacy CUDA IPC (the handle in the record, no fd).
pub(super) const MEMORY_LEGACY: u32 = 1;
/// `Announce::memory`: a VMM piece (its fd attached).
pub(super) const MEMORY_VMM: u32 = 2;
/// `Announce::memory`: a lava-flow GPU buffer's Vulkan arena, an opaque fd attached for
/// `cuImportExternalMemory` (base and buffer id: the arena's token and counter; no CUDA
/// ordinal, -1: the producer need not use CUDA).
pub(super) const MEMORY_ARENA: u32 = 3;
/// `Announce::memory`: as [`MEMORY_ARENA`], of a dedicated Vulkan allocation (CUDA imports
/// it with `CUDA_EXTERNAL_MEMORY_DEDICATED`).
pub(super) const MEMORY_ARENA_DEDICATED: u32 = 4;

/// `Announce::memory`: an allocation of a CUDA memory pool announced before (`Announce::pool`),
/// its `cuMemPoolExportPointer` data in the record's handle, no fd.
pub(super) const MEMORY_POOL: u32 = 5;
/// `Announce::memory`: a span of VMM pieces mapped back to back, its `Announce::pieces`
/// pieces announced (each with its fd) right before it; no fd of its own.
pub(super) const MEMORY_VMM_SPAN: u32 = 6;

/// Whether `memory` is a lava-flow GPU buffer's arena.
pub(super) fn is_arena(memory: u32) -> bool {
    matches!(memory, MEMORY_ARENA | MEMORY_ARENA_DEDICATED)
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AttachmentHead {
    kind: U32,
    slot: U32,
    generation: U32,
}
const ATTACHMENT_HEAD: usize = std::mem::size_of::<AttachmentHead>();

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AnnounceWire {
    memory: U32,
    device_ordinal: I32,
    exporter_pid: U32,
    size: U64,
    base: U64,
    buffer_id: U64,
    device_uuid: [u8; 16],
    ipc_handle: [u8; 64],
    pool: U32,
    pieces: U32,
}
const ANNOUNCE: usize = std::mem::size_of::<AnnounceWire>();

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PieceWire {
    index: U32,
    reserved: U32,
    offset: U64,
    size: U64,
    buffer_id: U64,
}
const PIECE: usize = std::mem::size_of::<PieceWire>();

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PoolWire {
    device_uuid: [u8; 16],
    exporter_pid: U32,
    reserved: U32,
}
const POOL: usize = std::mem::size_of::<PoolWire>();

/// One of the producer's CUDA allocations, as the consumer opens it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Announce {
    /// [`MEMORY_LEGACY`], [`MEMORY_VMM`] or an arena's ([`is_arena`]).
    pub(crate) memory: u32,
    /// The producer's ordinal of the device (for messages: ordinals differ between processes).
    pub(crate) device_ordinal: i32,
    /// The producer's process: with base and buffer id, what names the memory on this host.
    pub(crate) exporter_pid: u32,
    pub(crate) size: u64,
    /// The allocation's address in the producer, and CUDA's id of it there (for messages).
    pub(crate) base: u64,
    pub(crate) buffer_id: u64,
    /// The device that holds the memory, which the consumer finds by this UUID.
    pub(crate) device_uuid: [u8; 16],
    /// The legacy IPC handle, or a pool allocation's `cuMemPoolExportPointer` data (zeros
    /// for VMM memory and arenas).
    pub(crate) ipc_handle: [u8; 64],
    /// A pool allocation's pool index (0 for other memory).
    pub(crate) pool: u32,
    /// A span's number of pieces (0 for other memory).
    pub(crate) pieces: u32,
}

/// One piece of a span: where it lies in the span, its size and the producer's `BUFFER_ID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PieceRecord {
    pub(crate) index: u32,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) buffer_id: u64,
}

/// A CUDA memory pool that exports POSIX fds, as the consumer imports it (its fd attached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolAnnounce {
    /// The device whose memory the pool holds, which the consumer finds by this UUID.
    pub(crate) device_uuid: [u8; 16],
    pub(crate) exporter_pid: u32,
}

/// An attachment: an allocation announced for a slot (a VMM piece's fd attached), or the end
/// of a slot's allocation (freed, or re-allocated at the same address); a memory pool
/// announced for a pool index (its fd attached), or the end of the pool's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AllocationRecord {
    Announce { slot: u32, generation: u32, allocation: Announce },
    Forget { slot: u32, generation: u32 },
    Pool { index: u32, pool: PoolAnnounce },
    ForgetPool { index: u32 },
    Piece { slot: u32, generation: u32, piece: PieceRecord },
}

impl AllocationRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        let (kind, slot, generation) = match self {
            AllocationRecord::Announce { slot, generation, .. } => (ATTACH_ANNOUNCE, *slot, *generation),
            AllocationRecord::Forget { slot, generation } => (ATTACH_FORGET, *slot, *generation),
            AllocationRecord::Pool { index, .. } => (ATTACH_POOL, *index, 0),
            AllocationRecord::ForgetPool { index } => (ATTACH_FORGET_POOL, *index, 0),
            AllocationRecord::Piece { slot, generation, .. } => (ATTACH_PIECE, *slot, *generation),
        };
        let mut out = Vec::with_capacity(ATTACHMENT_HEAD + ANNOUNCE);
        out.extend_from_slice(
            AttachmentHead { kind: kind.into(), slot: slot.into(), generation: generation.into() }.as_bytes(),
        );
        if let AllocationRecord::Announce { allocation: a, .. } = self {
            let wire = AnnounceWire {
                memory: a.memory.into(),
                device_ordinal: a.device_ordinal.into(),
                exporter_pid: a.exporter_pid.into(),
                size: a.size.into(),
                base: a.base.into(),
                buffer_id: a.buffer_id.into(),
                device_uuid: a.device_uuid,
                ipc_handle: a.ipc_handle,
                pool: a.pool.into(),
                pieces: a.pieces.into(),
            };
            out.extend_from_slice(wire.as_bytes());
        }
        if let AllocationRecord::Pool { pool, .. } = self {
            let wire =
                PoolWire { device_uuid: pool.device_uuid, exporter_pid: pool.exporter_pid.into(), reserved: 0.into() };
            out.extend_from_slice(wire.as_bytes());
        }
        if let AllocationRecord::Piece { piece: p, .. } = self {
            let wire = PieceWire {
                index: p.index.into(),
                reserved: 0.into(),
                offset: p.offset.into(),
                size: p.size.into(),
                buffer_id: p.buffer_id.into(),
            };
            out.extend_from_slice(wire.as_bytes());
        }
        out
    }

    /// Parses an attachment that came with `fds` descriptors.
    pub(super) fn decode(bytes: &[u8], fds: usize) -> Result<AllocationRecord> {
        let bad = |what: String| Error::Corrupt(format!("the producer's CUDA route attachment {what}"));
        let Ok((head, body)) = AttachmentHead::read_from_prefix(bytes) else {
            return Err(bad(format!("has {} bytes", bytes.len())));
        };
        let (kind, slot, generation) = (head.kind.get(), head.slot.get(), head.generation.get());
        if matches!(kind, ATTACH_POOL | ATTACH_FORGET_POOL) {
            return Self::decode_pool(kind, slot, generation, body, fds);
        }
        if slot >= MAX_SLOTS {
            return Err(bad(format!("names slot {slot}, beyond the {MAX_SLOTS} a channel uses")));
        }
        match (kind, body.len()) {
            (ATTACH_ANNOUNCE, ANNOUNCE) => {
                let wire = AnnounceWire::read_from_bytes(body).expect("the length was checked");
                let allocation = Announce {
                    memory: wire.memory.get(),
                    device_ordinal: wire.device_ordinal.get(),
                    exporter_pid: wire.exporter_pid.get(),
                    size: wire.size.get(),
                    base: wire.base.get(),
                    buffer_id: wire.buffer_id.get(),
                    device_uuid: wire.device_uuid,
                    ipc_handle: wire.ipc_handle,
                    pool: wire.pool.get(),
                    pieces: wire.pieces.get(),
                };
                if (allocation.memory == MEMORY_VMM_SPAN) != (allocation.pieces != 0) {
                    return Err(bad(format!(
                        "announces {} pieces for memory of kind {} (only a span of VMM pieces has pieces)",
                        allocation.pieces, allocation.memory
                    )));
                }
                if allocation.memory != MEMORY_POOL && allocation.pool != 0 {
                    return Err(bad(format!(
                        "names pool {} for memory of kind {}, which is no pool's",
                        allocation.pool, allocation.memory
                    )));
                }
                let expected_fds = match allocation.memory {
                    MEMORY_LEGACY => 0,
                    MEMORY_VMM => 1,
                    MEMORY_POOL if allocation.pool >= MAX_POOLS => {
                        return Err(bad(format!(
                            "announces an allocation of pool {}, beyond the {MAX_POOLS} a channel uses",
                            allocation.pool
                        )));
                    }
                    MEMORY_POOL => 0,
                    MEMORY_VMM_SPAN if !(2..=MAX_PIECES).contains(&allocation.pieces) => {
                        return Err(bad(format!(
                            "announces a span of {} VMM pieces (a span has 2 to {MAX_PIECES})",
                            allocation.pieces
                        )));
                    }
                    MEMORY_VMM_SPAN => 0,
                    m if is_arena(m) => {
                        if allocation.ipc_handle != [0; 64] || allocation.device_ordinal != -1 {
                            return Err(bad(format!(
                                "announces a GPU buffer's arena with a CUDA handle or ordinal ({})",
                                allocation.device_ordinal
                            )));
                        }
                        1
                    }
                    other => return Err(bad(format!("announces memory of kind {other}"))),
                };
                if fds != expected_fds || allocation.size == 0 {
                    return Err(bad(format!(
                        "announces {} bytes of kind {} with {fds} descriptors",
                        allocation.size, allocation.memory
                    )));
                }
                Ok(AllocationRecord::Announce { slot, generation, allocation })
            }
            (ATTACH_FORGET, 0) if fds == 0 => Ok(AllocationRecord::Forget { slot, generation }),
            (ATTACH_PIECE, PIECE) if fds == 1 => {
                let wire = PieceWire::read_from_bytes(body).expect("the length was checked");
                let piece = PieceRecord {
                    index: wire.index.get(),
                    offset: wire.offset.get(),
                    size: wire.size.get(),
                    buffer_id: wire.buffer_id.get(),
                };
                if wire.reserved.get() != 0 || piece.index >= MAX_PIECES || piece.size == 0 {
                    return Err(bad(format!(
                        "announces VMM piece {} of {} bytes (reserved bits {:#x}; a span has at most {MAX_PIECES} \
                         pieces, none empty)",
                        piece.index,
                        piece.size,
                        wire.reserved.get()
                    )));
                }
                Ok(AllocationRecord::Piece { slot, generation, piece })
            }
            (kind, len) => Err(bad(format!("has kind {kind}, {len} bytes of body and {fds} descriptors"))),
        }
    }

    /// Parses a pool's announcement (with its one fd) or the end of its index.
    fn decode_pool(kind: u32, index: u32, generation: u32, body: &[u8], fds: usize) -> Result<AllocationRecord> {
        let bad = |what: String| Error::Corrupt(format!("the producer's CUDA route attachment {what}"));
        if index >= MAX_POOLS {
            return Err(bad(format!("names pool {index}, beyond the {MAX_POOLS} a channel uses")));
        }
        if generation != 0 {
            return Err(bad(format!("names pool {index} with generation {generation} (pools have none)")));
        }
        match (kind, body.len(), fds) {
            (ATTACH_POOL, POOL, 1) => {
                let wire = PoolWire::read_from_bytes(body).expect("the length was checked");
                if wire.reserved.get() != 0 {
                    return Err(bad(format!("sets reserved bits {:#x} of pool {index}", wire.reserved.get())));
                }
                let pool = PoolAnnounce { device_uuid: wire.device_uuid, exporter_pid: wire.exporter_pid.get() };
                Ok(AllocationRecord::Pool { index, pool })
            }
            (ATTACH_FORGET_POOL, 0, 0) => Ok(AllocationRecord::ForgetPool { index }),
            (kind, len, fds) => Err(bad(format!(
                "announces pool {index} with kind {kind}, {len} bytes of body and {fds} descriptors (a pool comes with \
                 {POOL} bytes and its one fd)"
            ))),
        }
    }
}

/// A routed message: where the payload lies in which allocation, and the value of the
/// channel's ready semaphore at which it is in place (0: now).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Descriptor {
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) ready_value: u64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DescriptorWire {
    slot: U32,
    generation: U32,
    offset: U64,
    len: U64,
    ready_value: U64,
}

impl Descriptor {
    pub(super) const LEN: usize = std::mem::size_of::<DescriptorWire>();

    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let wire = DescriptorWire {
            slot: self.slot.into(),
            generation: self.generation.into(),
            offset: self.offset.into(),
            len: self.len.into(),
            ready_value: self.ready_value.into(),
        };
        zerocopy::transmute!(wire)
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Descriptor> {
        let Ok(wire) = DescriptorWire::read_from_bytes(bytes) else {
            return Err(Error::Corrupt(format!(
                "a CUDA memory descriptor has {} bytes, not {}",
                bytes.len(),
                Self::LEN
            )));
        };
        Ok(Descriptor {
            slot: wire.slot.get(),
            generation: wire.generation.get(),
            offset: wire.offset.get(),
            len: wire.len.get(),
            ready_value: wire.ready_value.get(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Announce {
        Announce {
            memory: MEMORY_LEGACY,
            device_ordinal: 1,
            exporter_pid: 42,
            size: 2 << 20,
            base: 0x7f00_0000_0000,
            buffer_id: 9,
            device_uuid: [3; 16],
            ipc_handle: [5; 64],
            pool: 0,
            pieces: 0,
        }
    }

    #[test]
    fn wire_records_round_trip_and_reject_garbage() {
        assert_eq!((SECTION_HEAD, ATTACHMENT_HEAD, ANNOUNCE, POOL, Descriptor::LEN), (12, 12, 124, 24, 32));
        let answer = Section { flags: ANSWER_CUDA, devices: vec![[1; 16], [2; 16]], arenas: 0, declined: "é".into() };
        assert_eq!(Section::decode(&answer.encode(), "consumer").unwrap(), answer);
        assert!(matches!(Section::decode(&[0; 5], "consumer"), Err(Error::Corrupt(_))));
        let mut many = answer.encode();
        many[8] = 17;
        assert!(matches!(Section::decode(&many, "consumer"), Err(Error::Corrupt(_))));
        let mut other = answer.encode();
        other[0] = 9;
        assert!(matches!(Section::decode(&other, "consumer"), Err(Error::Unsupported(_))));

        let d = Descriptor { slot: 3, generation: 1, offset: 4096, len: 100, ready_value: 7 };
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert!(Descriptor::decode(&d.encode()[..31]).is_err());
        // A version-1 descriptor (no ready value) is refused, not misread.
        assert!(Descriptor::decode(&d.encode()[..24]).is_err());

        let legacy = AllocationRecord::Announce { slot: 2, generation: 1, allocation: sample() };
        assert_eq!(AllocationRecord::decode(&legacy.encode(), 0).unwrap(), legacy);
        assert!(AllocationRecord::decode(&legacy.encode(), 1).is_err(), "legacy memory comes without an fd");
        let vmm = AllocationRecord::Announce {
            slot: 2,
            generation: 1,
            allocation: Announce { memory: MEMORY_VMM, ..sample() },
        };
        assert_eq!(AllocationRecord::decode(&vmm.encode(), 1).unwrap(), vmm);
        assert!(AllocationRecord::decode(&vmm.encode(), 0).is_err(), "a VMM piece comes with its fd");
        let odd = AllocationRecord::Announce { slot: 2, generation: 1, allocation: Announce { memory: 7, ..sample() } };
        assert!(AllocationRecord::decode(&odd.encode(), 0).is_err());
        let empty = AllocationRecord::Announce { slot: 2, generation: 1, allocation: Announce { size: 0, ..sample() } };
        assert!(AllocationRecord::decode(&empty.encode(), 0).is_err());
        let forget = AllocationRecord::Forget { slot: 1, generation: 2 };
        assert_eq!(AllocationRecord::decode(&forget.encode(), 0).unwrap(), forget);
        assert!(AllocationRecord::decode(&forget.encode(), 1).is_err());
        let far = AllocationRecord::Forget { slot: MAX_SLOTS, generation: 0 };
        assert!(AllocationRecord::decode(&far.encode(), 0).is_err());
    }

    /// A pool: announced with its one fd at an index below the bound, forgotten without a
    /// body; its allocations name it, other memory names none.
    #[test]
    fn pool_records_round_trip_and_reject_garbage() {
        let pool = AllocationRecord::Pool {
            index: MAX_POOLS - 1,
            pool: PoolAnnounce { device_uuid: [3; 16], exporter_pid: 42 },
        };
        assert_eq!(AllocationRecord::decode(&pool.encode(), 1).unwrap(), pool);
        for fds in [0, 2] {
            assert!(matches!(AllocationRecord::decode(&pool.encode(), fds), Err(Error::Corrupt(_))), "{fds} fds");
        }
        let mut far = pool.encode();
        far[4..8].copy_from_slice(&MAX_POOLS.to_le_bytes());
        assert!(matches!(AllocationRecord::decode(&far, 1), Err(Error::Corrupt(m)) if m.contains("beyond")));
        let mut reserved = pool.encode();
        reserved[ATTACHMENT_HEAD + 20] = 1;
        assert!(matches!(AllocationRecord::decode(&reserved, 1), Err(Error::Corrupt(m)) if m.contains("reserved")));
        let encoded = pool.encode();
        assert!(AllocationRecord::decode(&encoded[..encoded.len() - 1], 1).is_err());
        let forget = AllocationRecord::ForgetPool { index: 3 };
        assert_eq!(AllocationRecord::decode(&forget.encode(), 0).unwrap(), forget);
        assert!(AllocationRecord::decode(&forget.encode(), 1).is_err());

        let allocation = Announce { memory: MEMORY_POOL, pool: 7, ..sample() };
        let record = AllocationRecord::Announce { slot: 1, generation: 1, allocation };
        assert_eq!(AllocationRecord::decode(&record.encode(), 0).unwrap(), record);
        assert!(AllocationRecord::decode(&record.encode(), 1).is_err(), "pool memory comes without an fd");
        for bad in [Announce { pool: MAX_POOLS, ..allocation }, Announce { pool: 1, ..sample() }] {
            let bytes = AllocationRecord::Announce { slot: 1, generation: 1, allocation: bad }.encode();
            assert!(matches!(AllocationRecord::decode(&bytes, 0), Err(Error::Corrupt(_))), "{bad:?}");
        }
        let mut pieces = record.encode();
        let at = pieces.len() - 1;
        pieces[at] = 1;
        assert!(matches!(AllocationRecord::decode(&pieces, 0), Err(Error::Corrupt(m)) if m.contains("pieces")));
    }

    /// A span of VMM pieces: each piece with its fd before the span, which has none and names
    /// how many pieces it has.
    #[test]
    fn span_records_round_trip_and_reject_garbage() {
        let piece = AllocationRecord::Piece {
            slot: 4,
            generation: 2,
            piece: PieceRecord { index: 1, offset: 2 << 20, size: 2 << 20, buffer_id: 8 },
        };
        assert_eq!(AllocationRecord::decode(&piece.encode(), 1).unwrap(), piece);
        for fds in [0, 2] {
            assert!(matches!(AllocationRecord::decode(&piece.encode(), fds), Err(Error::Corrupt(_))), "{fds} fds");
        }
        for bad in [
            PieceRecord { index: MAX_PIECES, offset: 0, size: 1, buffer_id: 1 },
            PieceRecord { index: 0, offset: 0, size: 0, buffer_id: 1 },
        ] {
            let bytes = AllocationRecord::Piece { slot: 4, generation: 2, piece: bad }.encode();
            assert!(matches!(AllocationRecord::decode(&bytes, 1), Err(Error::Corrupt(_))), "{bad:?}");
        }
        let span = Announce { memory: MEMORY_VMM_SPAN, pieces: 3, ..sample() };
        let record = AllocationRecord::Announce { slot: 4, generation: 2, allocation: span };
        assert_eq!(AllocationRecord::decode(&record.encode(), 0).unwrap(), record);
        assert!(AllocationRecord::decode(&record.encode(), 1).is_err(), "a span's fds come with its pieces");
        for bad in [
            Announce { pieces: 1, ..span },
            Announce { pieces: MAX_PIECES + 1, ..span },
            Announce { pieces: 0, ..span },
            Announce { pieces: 2, ..sample() },
        ] {
            let bytes = AllocationRecord::Announce { slot: 4, generation: 2, allocation: bad }.encode();
            assert!(matches!(AllocationRecord::decode(&bytes, 0), Err(Error::Corrupt(_))), "{bad:?}");
        }
    }

    /// A GPU buffer's arena: announced with its one fd, no CUDA handle and no CUDA ordinal;
    /// the consumer's mask of the devices whose buffers it takes travels with its answer.
    #[test]
    fn arena_records_and_answers_round_trip_and_reject_garbage() {
        let arena = Announce { memory: MEMORY_ARENA, device_ordinal: -1, ipc_handle: [0; 64], ..sample() };
        let record = AllocationRecord::Announce { slot: 1, generation: 3, allocation: arena };
        assert_eq!(AllocationRecord::decode(&record.encode(), 1).unwrap(), record);
        for fds in [0, 2] {
            assert!(matches!(AllocationRecord::decode(&record.encode(), fds), Err(Error::Corrupt(_))), "{fds} fds");
        }
        let dedicated = AllocationRecord::Announce {
            slot: 1,
            generation: 3,
            allocation: Announce { memory: MEMORY_ARENA_DEDICATED, ..arena },
        };
        assert_eq!(AllocationRecord::decode(&dedicated.encode(), 1).unwrap(), dedicated);
        for bad in [
            Announce { ipc_handle: [1; 64], ..arena },
            Announce { device_ordinal: 0, ..arena },
            Announce { size: 0, ..arena },
        ] {
            let bytes = AllocationRecord::Announce { slot: 1, generation: 3, allocation: bad }.encode();
            assert!(matches!(AllocationRecord::decode(&bytes, 1), Err(Error::Corrupt(_))), "{bad:?}");
        }

        let answer = Section {
            flags: ANSWER_CUDA | ANSWER_ARENAS,
            devices: vec![[1; 16], [2; 16]],
            arenas: 0b10,
            declined: String::new(),
        };
        assert_eq!(Section::decode(&answer.encode(), "consumer").unwrap(), answer);
        let beyond = Section { arenas: 0b100, ..answer.clone() };
        assert!(matches!(Section::decode(&beyond.encode(), "consumer"), Err(Error::Corrupt(_))));
        let encoded = answer.encode();
        assert!(matches!(Section::decode(&encoded[..encoded.len() - 2], "consumer"), Err(Error::Corrupt(_))));
        let offer =
            Section { flags: OFFER_NO_CUDA_MEMORY | OFFER_ARENAS, devices: vec![[1; 16]], ..Section::default() };
        assert_eq!(Section::decode(&offer.encode(), "producer").unwrap(), offer);
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(2000))]

        #[test]
        fn fuzz_section(bytes in crate::fuzz::bytes_near(
            Section { flags: ANSWER_CUDA | ANSWER_ARENAS, devices: vec![[1; 16]], arenas: 1, declined: "no".into() }.encode(),
            700,
        )) {
            if let Ok(s) = Section::decode(&bytes, "peer") {
                prop_assert!(s.devices.len() <= MAX_DEVICES);
                prop_assert_eq!(&s.encode()[..SECTION_HEAD], &bytes[..SECTION_HEAD]);
            }
        }

        #[test]
        fn fuzz_attachment(
            bytes in crate::fuzz::bytes_near(
                AllocationRecord::Announce { slot: 3, generation: 1, allocation: sample() }.encode(),
                200,
            ),
            fds in 0usize..3,
        ) {
            if let Ok(record) = AllocationRecord::decode(&bytes, fds) {
                prop_assert_eq!(record.encode(), bytes);
                prop_assert!(fds <= 1);
            }
        }

        #[test]
        fn fuzz_descriptor(bytes in crate::fuzz::bytes_near(
            Descriptor { slot: 1, generation: 2, offset: 64, len: 4096, ready_value: 9 }.encode().to_vec(),
            64,
        )) {
            if let Ok(d) = Descriptor::decode(&bytes) {
                prop_assert_eq!(&d.encode()[..], &bytes[..]);
            }
        }
    }
}
