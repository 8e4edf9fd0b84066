//! What the Vulkan IPC route sends: its rendezvous sections, attachments and descriptors,
//! each with a parser that checks everything a peer could get wrong.

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

impl Identity {
    const LEN: usize = 40;

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::LEN + self.declined.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.device_uuid);
        out.extend_from_slice(&self.driver_uuid);
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
        let version = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(Error::Unsupported(format!(
                "the {whose}'s GPU route speaks version {version}, this process version {VERSION}; use the same lava-flow on both sides"
            )));
        }
        Ok(Identity {
            flags: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
            device_uuid: bytes[8..24].try_into().expect("16 bytes"),
            driver_uuid: bytes[24..40].try_into().expect("16 bytes"),
            declined: String::from_utf8_lossy(&bytes[40..]).into_owned(),
        })
    }
}

/// The most arena slots a channel uses at once: a bound on what a producer can make the
/// consumer import.
pub(super) const MAX_SLOTS: u32 = 4096;

const ATTACH_ANNOUNCE: u32 = 1;
const ATTACH_FORGET: u32 = 2;

/// An attachment: an arena's export (its fd attached) for a slot, or the end of a slot's
/// arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Attachment {
    Announce { slot: u32, generation: u32, desc: GpuExportDesc },
    Forget { slot: u32, generation: u32 },
}

impl Attachment {
    pub(super) fn encode(&self) -> Vec<u8> {
        let (kind, slot, generation) = match self {
            Attachment::Announce { slot, generation, .. } => (ATTACH_ANNOUNCE, *slot, *generation),
            Attachment::Forget { slot, generation } => (ATTACH_FORGET, *slot, *generation),
        };
        let mut out = Vec::with_capacity(12 + GpuExportDesc::SIZE);
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
        if let Attachment::Announce { desc, .. } = self {
            out.extend_from_slice(&desc.to_bytes());
        }
        out
    }

    /// Parses an attachment that came with `fds` descriptors.
    pub(super) fn decode(bytes: &[u8], fds: usize) -> Result<Attachment> {
        let bad = |what: String| Error::Corrupt(format!("the producer's GPU route attachment {what}"));
        if bytes.len() < 12 {
            return Err(bad(format!("has {} bytes", bytes.len())));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let (kind, slot, generation) = (u32_at(0), u32_at(4), u32_at(8));
        if slot >= MAX_SLOTS {
            return Err(bad(format!("names slot {slot}, beyond the {MAX_SLOTS} a channel uses")));
        }
        match (kind, bytes.len() - 12, fds) {
            (ATTACH_ANNOUNCE, GpuExportDesc::SIZE, 1) => {
                let desc = GpuExportDesc::from_bytes(&bytes[12..])
                    .map_err(|e| bad(format!("describes no valid export: {e}")))?;
                Ok(Attachment::Announce { slot, generation, desc })
            }
            (ATTACH_FORGET, 0, 0) => Ok(Attachment::Forget { slot, generation }),
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

impl Descriptor {
    pub(super) const LEN: usize = 32;

    pub(super) fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&self.slot.to_le_bytes());
        out[4..8].copy_from_slice(&self.generation.to_le_bytes());
        out[8..16].copy_from_slice(&self.offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..32].copy_from_slice(&self.ready_value.to_le_bytes());
        out
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Descriptor> {
        if bytes.len() != Self::LEN {
            return Err(Error::Corrupt(format!(
                "a GPU buffer descriptor has {} bytes, not {}",
                bytes.len(),
                Self::LEN
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Ok(Descriptor {
            slot: u32_at(0),
            generation: u32_at(4),
            offset: u64_at(8),
            len: u64_at(16),
            ready_value: u64_at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wire_records_round_trip_and_reject_garbage() {
        let id = Identity { flags: ANSWER_GPU, device_uuid: [1; 16], driver_uuid: [2; 16], declined: "none é".into() };
        assert_eq!(Identity::decode(&id.encode(), "peer").unwrap(), id);
        assert!(matches!(Identity::decode(&[0; 3], "peer"), Err(Error::Corrupt(_))));
        assert!(matches!(Identity::decode(&[0; 600], "peer"), Err(Error::Corrupt(_))));
        let mut other = id.encode();
        other[0] = 9;
        assert!(matches!(Identity::decode(&other, "peer"), Err(Error::Unsupported(_))));

        let d = Descriptor { slot: 3, generation: 1, offset: 4096, len: 100, ready_value: 7 };
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert!(Descriptor::decode(&d.encode()[..31]).is_err());

        let forget = Attachment::Forget { slot: 1, generation: 2 };
        assert_eq!(Attachment::decode(&forget.encode(), 0).unwrap(), forget);
        assert!(Attachment::decode(&forget.encode(), 1).is_err(), "a descriptor it should not carry");
        let far = Attachment::Forget { slot: MAX_SLOTS, generation: 0 };
        assert!(Attachment::decode(&far.encode(), 0).is_err());
        // An announce whose export description is garbage.
        let mut announce = vec![0u8; 12 + GpuExportDesc::SIZE];
        announce[0] = 1;
        assert!(matches!(Attachment::decode(&announce, 1), Err(Error::Corrupt(_))));
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
                Attachment::Announce { slot: 3, generation: 1, desc: sample_desc() }.encode(),
                200,
            ),
            fds in 0usize..3,
        ) {
            if let Ok(attachment) = Attachment::decode(&bytes, fds) {
                let (slot, expected_fds) = match attachment {
                    Attachment::Announce { slot, desc, .. } => {
                        prop_assert!(desc.validate().is_ok(), "an announced export is valid");
                        (slot, 1)
                    }
                    Attachment::Forget { slot, .. } => (slot, 0),
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
