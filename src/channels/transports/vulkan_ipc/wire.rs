//! What the Vulkan IPC route sends: its rendezvous sections, attachments and descriptors,
//! each with a parser that checks everything a peer could get wrong.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::{Error, Result};
use crate::memory::gpu::GpuExportDesc;

const VERSION: u32 = 1;
/// The producer's offer: a ready semaphore is attached.
pub(super) const OFFER_SEMAPHORE: u32 = 1;
/// The producer's offer: a released semaphore is attached too (after the ready one), which
/// the consumer signals as it lets go of GPU messages.
pub(super) const OFFER_RELEASED: u32 = 2;
/// The consumer's answer: it has a Vulkan device.
pub(super) const ANSWER_GPU: u32 = 1;
/// The consumer's answer: its device can import timeline semaphores from opaque fds.
pub(super) const ANSWER_SEMAPHORE: u32 = 2;

/// A rendezvous section of either side: who its device is, what it offers, and (a consumer
/// that serves no GPU route) why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) flags: u32,
    pub(super) device_uuid: [u8; 16],
    pub(super) driver_uuid: [u8; 16],
    pub(super) declined: String,
}

/// The longest reason a section carries.
const MAX_REASON: usize = 512;

/// An [`Identity`] on the wire: these 40 bytes, then the reason's UTF-8 bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct IdentityWire {
    version: U32,
    flags: U32,
    device_uuid: [u8; 16],
    driver_uuid: [u8; 16],
}

impl Identity {
    const LEN: usize = std::mem::size_of::<IdentityWire>();

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN + self.declined.len());
        let wire = IdentityWire {
            version: VERSION.into(),
            flags: self.flags.into(),
            device_uuid: self.device_uuid,
            driver_uuid: self.driver_uuid,
        };
        out.extend_from_slice(wire.as_bytes());
        let mut end = self.declined.len().min(MAX_REASON);
        while !self.declined.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&self.declined.as_bytes()[..end]);
        out
    }

    pub(super) fn decode(bytes: &[u8], whose: &str) -> Result<Identity> {
        if !(Self::LEN..=Self::LEN + MAX_REASON).contains(&bytes.len()) {
            return Err(Error::Corrupt(format!("the {whose}'s GPU route section has {} bytes", bytes.len())));
        }
        let (wire, reason) = IdentityWire::read_from_prefix(bytes).expect("the length was checked");
        let version = wire.version.get();
        if version != VERSION {
            return Err(Error::Unsupported(format!(
                "the {whose}'s GPU route speaks version {version}, this process version {VERSION}; use the same lava-flow on both sides"
            )));
        }
        Ok(Identity {
            flags: wire.flags.get(),
            device_uuid: wire.device_uuid,
            driver_uuid: wire.driver_uuid,
            declined: String::from_utf8_lossy(reason).into_owned(),
        })
    }
}

/// The most arena slots a channel uses at once: a bound on what a producer can make the
/// consumer import.
pub(super) const MAX_SLOTS: u32 = 4096;

const ATTACH_ANNOUNCE: u32 = 1;
const ATTACH_FORGET: u32 = 2;

/// The head of an attachment on the wire, followed by the export's description (announce).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AttachmentHead {
    kind: U32,
    slot: U32,
    generation: U32,
}
const ATTACHMENT_HEAD: usize = std::mem::size_of::<AttachmentHead>();

/// An attachment: an arena's export (its fd attached) for a slot, or the end of a slot's
/// arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArenaRecord {
    Announce { slot: u32, generation: u32, desc: GpuExportDesc },
    Forget { slot: u32, generation: u32 },
}

impl ArenaRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        let (kind, slot, generation) = match self {
            ArenaRecord::Announce { slot, generation, .. } => (ATTACH_ANNOUNCE, *slot, *generation),
            ArenaRecord::Forget { slot, generation } => (ATTACH_FORGET, *slot, *generation),
        };
        let mut out = Vec::with_capacity(ATTACHMENT_HEAD + GpuExportDesc::SIZE);
        out.extend_from_slice(
            AttachmentHead { kind: kind.into(), slot: slot.into(), generation: generation.into() }.as_bytes(),
        );
        if let ArenaRecord::Announce { desc, .. } = self {
            out.extend_from_slice(&desc.to_bytes());
        }
        out
    }

    /// Parses an attachment that came with `fds` descriptors.
    pub(super) fn decode(bytes: &[u8], fds: usize) -> Result<ArenaRecord> {
        let bad = |what: String| Error::Corrupt(format!("the producer's GPU route attachment {what}"));
        let Ok((head, body)) = AttachmentHead::read_from_prefix(bytes) else {
            return Err(bad(format!("has {} bytes", bytes.len())));
        };
        let (kind, slot, generation) = (head.kind.get(), head.slot.get(), head.generation.get());
        if slot >= MAX_SLOTS {
            return Err(bad(format!("names slot {slot}, beyond the {MAX_SLOTS} a channel uses")));
        }
        match (kind, body.len(), fds) {
            (ATTACH_ANNOUNCE, GpuExportDesc::SIZE, 1) => {
                let desc =
                    GpuExportDesc::from_bytes(body).map_err(|e| bad(format!("describes no valid export: {e}")))?;
                Ok(ArenaRecord::Announce { slot, generation, desc })
            }
            (ATTACH_FORGET, 0, 0) => Ok(ArenaRecord::Forget { slot, generation }),
            (kind, len, fds) => Err(bad(format!("has kind {kind}, {len} bytes of body and {fds} descriptors"))),
        }
    }
}

/// A routed message: where the payload lies in which arena, and when it is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Descriptor {
    pub(super) slot: u32,
    pub(super) generation: u32,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) ready_value: u64,
}

/// A [`Descriptor`] on the wire.
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
        if bytes.len() != Self::LEN {
            return Err(Error::Corrupt(format!(
                "a GPU buffer descriptor has {} bytes, not {}",
                bytes.len(),
                Self::LEN
            )));
        }
        let wire = DescriptorWire::read_from_bytes(bytes).expect("the length was checked");
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

    #[test]
    fn wire_records_round_trip_and_reject_garbage() {
        assert_eq!((Identity::LEN, ATTACHMENT_HEAD, Descriptor::LEN), (40, 12, 32));
        let id = Identity { flags: ANSWER_GPU, device_uuid: [1; 16], driver_uuid: [2; 16], declined: "none é".into() };
        assert_eq!(Identity::decode(&id.encode(), "peer").unwrap(), id);
        assert!(matches!(Identity::decode(&[0; 3], "peer"), Err(Error::Corrupt(_))));
        assert!(matches!(Identity::decode(&[0; 600], "peer"), Err(Error::Corrupt(_))));
        let mut other = id.encode();
        other[0] = 9;
        assert!(matches!(Identity::decode(&other, "peer"), Err(Error::Unsupported(_))));

        let d = Descriptor { slot: 3, generation: 1, offset: 4096, len: 100, ready_value: 7 };
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        let fields = [&3u32.to_le_bytes()[..], &1u32.to_le_bytes(), &4096u64.to_le_bytes(), &100u64.to_le_bytes()];
        assert_eq!(d.encode()[..], [&fields.concat()[..], &7u64.to_le_bytes()].concat()[..], "little-endian, packed");
        assert!(Descriptor::decode(&d.encode()[..31]).is_err());

        let forget = ArenaRecord::Forget { slot: 1, generation: 2 };
        assert_eq!(forget.encode(), [2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(ArenaRecord::decode(&forget.encode(), 0).unwrap(), forget);
        assert!(ArenaRecord::decode(&forget.encode(), 1).is_err(), "a descriptor it should not carry");
        let far = ArenaRecord::Forget { slot: MAX_SLOTS, generation: 0 };
        assert!(ArenaRecord::decode(&far.encode(), 0).is_err());
        // An announce whose export description is garbage.
        let mut announce = vec![0u8; 12 + GpuExportDesc::SIZE];
        announce[0] = 1;
        assert!(matches!(ArenaRecord::decode(&announce, 1), Err(Error::Corrupt(_))));
    }

    fn sample_desc() -> GpuExportDesc {
        use crate::memory::gpu::{HandleType, GPU_EXPORT_MAGIC, GPU_EXPORT_VERSION};
        GpuExportDesc {
            magic: GPU_EXPORT_MAGIC,
            version: GPU_EXPORT_VERSION,
            handle_type: HandleType::OpaqueFd.to_raw(),
            memory_type_index: 2,
            memory_property_flags: 0x7,
            flags: 0,
            kind: 1,
            exporter_pid: 42,
            arena_token: 0xdead_beef,
            arena_counter: 7,
            arena_size: 1 << 20,
            offset: 4096,
            size: 100,
            device_uuid: [1; 16],
            driver_uuid: [2; 16],
        }
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(3000))]

        /// The GPU route's records from a peer: sections, attachments (with 0 to 2
        /// descriptors) and message descriptors. Whatever is accepted is what its bytes say.
        #[test]
        fn fuzz_identity(bytes in crate::fuzz::bytes_near(
            Identity { flags: ANSWER_GPU, device_uuid: [1; 16], driver_uuid: [2; 16], declined: "no".into() }.encode(),
            700,
        )) {
            if let Ok(id) = Identity::decode(&bytes, "peer") {
                prop_assert!(id.declined.len() <= 3 * MAX_REASON);
                prop_assert_eq!(&id.encode()[..40], &bytes[..40]);
            }
        }

        #[test]
        fn fuzz_attachment(
            bytes in crate::fuzz::bytes_near(
                ArenaRecord::Announce { slot: 3, generation: 1, desc: sample_desc() }.encode(),
                200,
            ),
            fds in 0usize..3,
        ) {
            if let Ok(attachment) = ArenaRecord::decode(&bytes, fds) {
                let (slot, expected_fds) = match attachment {
                    ArenaRecord::Announce { slot, desc, .. } => {
                        prop_assert!(desc.validate().is_ok(), "an announced export is valid");
                        (slot, 1)
                    }
                    ArenaRecord::Forget { slot, .. } => (slot, 0),
                };
                prop_assert!(slot < MAX_SLOTS);
                prop_assert_eq!(fds, expected_fds);
                prop_assert_eq!(attachment.encode(), bytes);
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
