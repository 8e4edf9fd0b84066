//! The record each process contributes to discovery: its name and location, as bytes.
//!
//! Records come from other processes, so decoding trusts nothing: every length is checked
//! against what is left, every string is checked as UTF-8 and as what it claims to be (a
//! process name, a hostname, a host identity), and a record must end where its fields do. A
//! truncated, oversized or hostile record is an `Error::Corrupt` naming the rank it came from;
//! it never makes lava-flow read out of bounds or allocate more than [`MAX_RECORD_LEN`].
//!
//! Layout (integers little-endian; a string is a u16 byte count and the bytes):
//!
//! ```text
//! magic "LFD1" | flags u8 | shared-memory group u32 | numa node u32 | device u32
//! | name str | hostname str | host identity str (empty: none) | gpu count u8 | gpu uuid str...
//! ```

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::{Error, Result};
use crate::types::{validate_host_id, validate_hostname, ProcessLocation, ProcessName};

/// The largest record a process may send. Bounds what a peer can make every rank allocate.
pub(crate) const MAX_RECORD_LEN: usize = 4096;
/// At most this many GPU UUIDs per process.
pub(crate) const MAX_GPUS: usize = 64;
/// The longest GPU UUID string (`GPU-` and 36 characters on NVIDIA).
pub(crate) const MAX_GPU_UUID_LEN: usize = 64;

const MAGIC: &[u8; 4] = b"LFD1";
const HAS_NODE: u8 = 1;
const HAS_DEVICE: u8 = 2;

/// The fixed start of a record; the strings and the GPU list follow.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RecordHead {
    magic: [u8; 4],
    flags: u8,
    shared_memory_group: U32,
    node: U32,
    device: U32,
}

/// One process as discovery sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LocationRecord {
    pub name: ProcessName,
    pub location: ProcessLocation,
    /// GPU UUIDs of the host, as its driver names them; empty when not cheaply known.
    pub gpu_uuids: Vec<String>,
    /// The lowest rank of the process's `MPI_COMM_TYPE_SHARED` group: equal for two processes
    /// exactly when MPI says they can share memory.
    pub shared_memory_group: u32,
}

impl LocationRecord {
    pub fn encode(&self) -> Result<Vec<u8>> {
        let loc = &self.location;
        let mut out = Vec::with_capacity(256);
        let flags =
            if loc.node_id.is_some() { HAS_NODE } else { 0 } | if loc.device_id.is_some() { HAS_DEVICE } else { 0 };
        let head = RecordHead {
            magic: *MAGIC,
            flags,
            shared_memory_group: self.shared_memory_group.into(),
            node: loc.node_id.unwrap_or(0).into(),
            device: loc.device_id.unwrap_or(0).into(),
        };
        out.extend_from_slice(head.as_bytes());
        put_str(&mut out, self.name.as_str());
        put_str(&mut out, &loc.hostname);
        put_str(&mut out, loc.host_id.as_deref().unwrap_or(""));
        if self.gpu_uuids.len() > MAX_GPUS {
            return Err(Error::invalid(format!(
                "{} GPU UUIDs; at most {MAX_GPUS} are exchanged",
                self.gpu_uuids.len()
            )));
        }
        out.push(self.gpu_uuids.len() as u8);
        for uuid in &self.gpu_uuids {
            put_str(&mut out, uuid);
        }
        if out.len() > MAX_RECORD_LEN {
            return Err(Error::invalid(format!(
                "the location record of process {:?} is {} bytes; the limit is {MAX_RECORD_LEN} (shorten the hostname or LF_HOST_ID)",
                self.name.as_str(),
                out.len()
            )));
        }
        Ok(out)
    }

    /// Decodes the record that rank `rank` sent, in a job of `size` processes.
    pub fn decode(bytes: &[u8], rank: usize, size: usize) -> Result<Self> {
        let corrupt = |what: String| Error::Corrupt(format!("the discovery record from MPI rank {rank} {what}"));
        if bytes.len() > MAX_RECORD_LEN {
            return Err(corrupt(format!("is {} bytes; the limit is {MAX_RECORD_LEN}", bytes.len())));
        }
        let mut reader = Reader { bytes, at: 0, rank };
        let head = RecordHead::ref_from_bytes(reader.take(std::mem::size_of::<RecordHead>(), "the fixed fields")?)
            .expect("the length was taken");
        if &head.magic != MAGIC {
            return Err(corrupt(
                "does not start with lava-flow's format marker: is every process running the same lava-flow version?"
                    .into(),
            ));
        }
        let flags = head.flags;
        if flags & !(HAS_NODE | HAS_DEVICE) != 0 {
            return Err(corrupt(format!("has unknown flags {flags:#04x}")));
        }
        let shared_memory_group = head.shared_memory_group.get();
        if shared_memory_group as usize >= size {
            return Err(corrupt(format!("names shared-memory group {shared_memory_group}, not a rank of the {size}")));
        }
        let (node, device) = (head.node.get(), head.device.get());
        // An absent field is written as 0: anything else is not what lava-flow sends.
        if (flags & HAS_NODE == 0 && node != 0) || (flags & HAS_DEVICE == 0 && device != 0) {
            return Err(corrupt(format!(
                "has a NUMA node {node} or device {device} that its flags {flags:#04x} say is absent"
            )));
        }
        let name = reader.str("the process name")?;
        let name = ProcessName::new(name).map_err(|e| corrupt(format!("has a bad process name: {e}")))?;
        let hostname = reader.str("the hostname")?;
        validate_hostname(hostname).map_err(|e| corrupt(format!("has a bad hostname: {e}")))?;
        let host_id = reader.str("the host identity")?;
        let host_id = if host_id.is_empty() {
            None
        } else {
            validate_host_id(host_id).map_err(|e| corrupt(format!("has a bad host identity: {e}")))?;
            Some(host_id.to_owned())
        };
        let gpu_count = reader.u8("the GPU count")? as usize;
        if gpu_count > MAX_GPUS {
            return Err(corrupt(format!("lists {gpu_count} GPUs; the limit is {MAX_GPUS}")));
        }
        let mut gpu_uuids = Vec::with_capacity(gpu_count);
        for i in 0..gpu_count {
            let uuid = reader.str("a GPU UUID")?;
            if let Some(problem) = gpu_uuid_problem(uuid) {
                return Err(corrupt(format!("has a bad GPU UUID (#{i}): {problem}")));
            }
            gpu_uuids.push(uuid.to_owned());
        }
        if reader.at != bytes.len() {
            return Err(corrupt(format!("has {} bytes after its last field", bytes.len() - reader.at)));
        }
        Ok(LocationRecord {
            name,
            location: ProcessLocation {
                hostname: hostname.to_owned(),
                node_id: (flags & HAS_NODE != 0).then_some(node),
                device_id: (flags & HAS_DEVICE != 0).then_some(device),
                host_id,
                mpi: None,
                name: None,
            },
            gpu_uuids,
            shared_memory_group,
        })
    }
}

/// Why a string is not usable as a GPU UUID, if it is not.
pub(crate) fn gpu_uuid_problem(uuid: &str) -> Option<String> {
    if uuid.is_empty() || uuid.len() > MAX_GPU_UUID_LEN {
        return Some(format!("{} bytes long; expected 1 to {MAX_GPU_UUID_LEN}", uuid.len()));
    }
    uuid.chars().find(|c| !c.is_ascii_graphic()).map(|c| format!("{uuid:?} contains {c:?}"))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Every string written is validated to at most 255 bytes (names 64, hostnames and host
    // identities 255, GPU UUIDs 64), so the length always fits.
    debug_assert!(s.len() <= u16::MAX as usize);
    out.extend_from_slice(U16::new(s.len() as u16).as_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    rank: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.at;
        if len > left {
            return Err(Error::Corrupt(format!(
                "the discovery record from MPI rank {} is truncated: {what} needs {len} bytes at offset {}, {left} are left",
                self.rank, self.at
            )));
        }
        let field = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(field)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn str(&mut self, what: &str) -> Result<&'a str> {
        let len = U16::read_from_bytes(self.take(2, what)?).expect("2 bytes").get() as usize;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|e| {
            Error::Corrupt(format!("the discovery record from MPI rank {}: {what} is not UTF-8 ({e})", self.rank))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> LocationRecord {
        LocationRecord {
            name: ProcessName::new("trainer-0").unwrap(),
            location: ProcessLocation::new("gpu-node-7", Some(1), None).unwrap().with_host_id("box-a").unwrap(),
            gpu_uuids: vec!["GPU-8c1d2e3f-0000-1111-2222-333344445555".into()],
            shared_memory_group: 2,
        }
    }

    fn corrupt_message(bytes: &[u8]) -> String {
        match LocationRecord::decode(bytes, 3, 4) {
            Err(Error::Corrupt(message)) => message,
            other => panic!("expected a Corrupt error, got {other:?}"),
        }
    }

    #[test]
    fn a_record_round_trips() {
        let record = sample();
        let bytes = record.encode().unwrap();
        assert_eq!(LocationRecord::decode(&bytes, 3, 4).unwrap(), record);
        let bare = LocationRecord {
            location: ProcessLocation::new("h", None, Some(0)).unwrap(),
            gpu_uuids: vec![],
            shared_memory_group: 0,
            ..sample()
        };
        assert_eq!(LocationRecord::decode(&bare.encode().unwrap(), 0, 1).unwrap(), bare);
    }

    #[test]
    fn every_truncation_is_refused_with_the_rank() {
        let bytes = sample().encode().unwrap();
        for len in 0..bytes.len() {
            let message = corrupt_message(&bytes[..len]);
            assert!(message.contains("MPI rank 3"), "{len}: {message}");
        }
        assert!(corrupt_message(&bytes[..10]).contains("truncated"));
    }

    #[test]
    fn hostile_records_are_refused() {
        let good = sample().encode().unwrap();
        // Offsets in `good`: magic 0..4, flags 4, group 5..9, node 9..13, device 13..17,
        // name length 17..19, name 19..28.
        let name_at = 19;

        let mut trailing = good.clone();
        trailing.push(0);
        assert!(corrupt_message(&trailing).contains("1 bytes after its last field"));

        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(corrupt_message(&magic).contains("same lava-flow version"));

        let mut flags = good.clone();
        flags[4] = 0x80;
        assert!(corrupt_message(&flags).contains("unknown flags"));

        let mut group = good.clone();
        group[5..9].copy_from_slice(&4u32.to_le_bytes());
        assert!(corrupt_message(&group).contains("shared-memory group 4"));

        let mut huge_length = good.clone();
        huge_length[17..19].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(corrupt_message(&huge_length).contains("truncated"));

        let mut not_utf8 = good.clone();
        not_utf8[name_at] = 0xFF;
        assert!(corrupt_message(&not_utf8).contains("not UTF-8"));

        let mut bad_name = good.clone();
        bad_name[name_at] = b'/';
        assert!(corrupt_message(&bad_name).contains("bad process name"));

        let mut too_many_gpus = sample();
        too_many_gpus.gpu_uuids.clear();
        let mut bytes = too_many_gpus.encode().unwrap();
        *bytes.last_mut().unwrap() = 200;
        assert!(corrupt_message(&bytes).contains("200 GPUs"));

        let mut space_in_uuid = sample();
        space_in_uuid.gpu_uuids = vec!["GPU 1".into()];
        assert!(corrupt_message(&space_in_uuid.encode().unwrap()).contains("bad GPU UUID"));

        let oversized = vec![0u8; MAX_RECORD_LEN + 1];
        assert!(corrupt_message(&oversized).contains("limit"));
    }

    #[test]
    fn encoding_refuses_what_it_could_not_send() {
        let mut record = sample();
        record.gpu_uuids = vec!["GPU-x".into(); MAX_GPUS + 1];
        assert!(matches!(record.encode(), Err(Error::InvalidArgument(_))));
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(3000))]

        /// Another rank's discovery record: accepted only within the size limit, with valid
        /// names, hostname, host identity and GPU UUIDs and a real rank as its group, and then
        /// exactly what its bytes encode.
        #[test]
        fn fuzz_records(bytes in crate::fuzz::bytes_near(sample().encode().unwrap(), 300), size in 1usize..8) {
            if let Ok(record) = LocationRecord::decode(&bytes, 0, size) {
                prop_assert!((record.shared_memory_group as usize) < size);
                prop_assert!(validate_hostname(&record.location.hostname).is_ok());
                prop_assert!(record.gpu_uuids.iter().all(|u| gpu_uuid_problem(u).is_none()));
                prop_assert_eq!(record.encode().unwrap(), bytes);
            }
        }
    }
}
