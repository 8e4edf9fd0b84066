//! Exporting a buffer: a file descriptor for its arena plus the metadata another process (or
//! CUDA) needs to import it and find the buffer inside.
//!
//! The metadata travels as [`GpuExportDesc`], a `#[repr(C)]` plain struct with a magic and a
//! version. It comes from another process, so the importer validates every field before use.
//!
//! For CUDA (`cudaImportExternalMemory`): `handle.fd` = the fd, `size` = `arena_size`,
//! `flags` = `cudaExternalMemoryDedicated` if `flags & GPU_EXPORT_DEDICATED`; then
//! `cudaExternalMemoryGetMappedBuffer` with `offset` and `size`. Match the CUDA device whose
//! UUID equals `device_uuid`.

use std::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::allocator::GpuBuffer;
use super::arena::{ArenaId, GpuMemoryKind, HandleType};
use super::device::{external, format_uuid};
use crate::error::{Error, Result};
use crate::os::stream::{recv_exact_with_handle, send_with_handles, Stream};
use crate::os::OwnedHandle;

/// `"LFGX"` read as a little-endian u32.
pub const GPU_EXPORT_MAGIC: u32 = u32::from_le_bytes(*b"LFGX");
/// Bumped whenever the layout or meaning of [`GpuExportDesc`] changes.
pub const GPU_EXPORT_VERSION: u32 = 1;
/// `flags` bit: the arena is a dedicated allocation (one buffer, bound at offset 0); importers
/// must import it as dedicated (`VkMemoryDedicatedAllocateInfo`, `cudaExternalMemoryDedicated`).
pub const GPU_EXPORT_DEDICATED: u32 = 1;

/// The metadata of an export, in a fixed C layout (104 bytes, native byte order: exporter and
/// importer share a host).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct GpuExportDesc {
    /// [`GPU_EXPORT_MAGIC`].
    pub magic: u32,
    /// [`GPU_EXPORT_VERSION`].
    pub version: u32,
    /// A `VkExternalMemoryHandleTypeFlagBits` value ([`HandleType::to_raw`]).
    pub handle_type: u32,
    /// The exporter's memory type index; valid on the importer only when the UUIDs match.
    pub memory_type_index: u32,
    /// `VkMemoryPropertyFlags` of that memory type.
    pub memory_property_flags: u32,
    /// [`GPU_EXPORT_DEDICATED`] and future bits.
    pub flags: u32,
    /// 0: DEVICE_LOCAL, 1: HOST_VISIBLE.
    pub kind: u32,
    /// Arena identity, part 1: the exporting process.
    pub exporter_pid: u32,
    /// Arena identity, part 2: the exporter's random per-process token.
    pub arena_token: u64,
    /// Arena identity, part 3: the exporter's arena counter.
    pub arena_counter: u64,
    /// Size of the whole exported allocation (what `vkAllocateMemory`/CUDA import).
    pub arena_size: u64,
    /// Where the buffer starts inside the allocation.
    pub offset: u64,
    /// The buffer's size in bytes.
    pub size: u64,
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<GpuExportDesc>() == GpuExportDesc::SIZE);

impl GpuExportDesc {
    pub const SIZE: usize = 104;

    pub fn arena_id(&self) -> ArenaId {
        ArenaId { exporter_pid: self.exporter_pid, token: self.arena_token, counter: self.arena_counter }
    }

    pub fn handle(&self) -> Option<HandleType> {
        HandleType::from_raw(self.handle_type)
    }

    pub fn kind(&self) -> Option<GpuMemoryKind> {
        GpuMemoryKind::from_raw(self.kind)
    }

    pub fn is_dedicated(&self) -> bool {
        self.flags & GPU_EXPORT_DEDICATED != 0
    }

    /// The wire form: the record's bytes (fields in declaration order, native byte order).
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        zerocopy::transmute!(*self)
    }

    /// Parses and validates bytes from another process.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let desc = GpuExportDesc::read_from_bytes(bytes).map_err(|_| {
            Error::invalid(format!("a GPU export description is {} bytes, got {}", Self::SIZE, bytes.len()))
        })?;
        desc.validate()?;
        Ok(desc)
    }

    /// Checks what can be checked without a device: magic, version, known enums, and that the
    /// buffer lies inside the arena.
    pub fn validate(&self) -> Result<()> {
        if self.magic != GPU_EXPORT_MAGIC {
            return Err(Error::invalid(format!(
                "not a lava-flow GPU export (magic {:#010x}, expected {GPU_EXPORT_MAGIC:#010x})",
                self.magic
            )));
        }
        if self.version != GPU_EXPORT_VERSION {
            return Err(Error::Unsupported(format!(
                "GPU export format version {} (this lava-flow reads version {GPU_EXPORT_VERSION}); \
                 use the same lava-flow version on both sides",
                self.version
            )));
        }
        if self.handle().is_none() {
            return Err(Error::invalid(format!("unknown GPU export handle type {:#x}", self.handle_type)));
        }
        if self.kind().is_none() {
            return Err(Error::invalid(format!("unknown GPU memory kind {}", self.kind)));
        }
        if self.flags & !GPU_EXPORT_DEDICATED != 0 {
            return Err(Error::invalid(format!("unknown GPU export flags {:#x}", self.flags)));
        }
        if self.size == 0 || self.arena_size == 0 {
            return Err(Error::invalid(format!(
                "GPU export of {} bytes in an arena of {} bytes: sizes must be positive",
                self.size, self.arena_size
            )));
        }
        match self.offset.checked_add(self.size) {
            Some(end) if end <= self.arena_size => Ok(()),
            _ => Err(Error::invalid(format!(
                "GPU export range [{}, +{}) lies outside its arena of {} bytes",
                self.offset, self.size, self.arena_size
            ))),
        }
    }
}

impl fmt::Display for GpuExportDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU export of {} bytes at offset {} of arena {} ({} bytes, memory type {}, {}, device {}, driver {})",
            self.size,
            self.offset,
            self.arena_id(),
            self.arena_size,
            self.memory_type_index,
            match self.handle() {
                Some(handle) => handle.as_str().to_string(),
                None => format!("unknown handle type {:#x}", self.handle_type),
            },
            format_uuid(&self.device_uuid),
            format_uuid(&self.driver_uuid)
        )
    }
}

/// An exported buffer: the metadata and a file descriptor for its arena (on Windows an NT
/// handle), owned (closed on drop). Each export is a new handle; sending it to another process
/// (SCM_RIGHTS; on Windows the stream duplicates it into the peer) duplicates it, so the
/// sender may drop its export afterwards.
#[derive(Debug)]
pub struct GpuExport {
    pub desc: GpuExportDesc,
    pub fd: OwnedHandle,
}

impl GpuExport {
    /// Reassembles an export received from another process (metadata validated).
    pub fn from_parts(desc: GpuExportDesc, fd: OwnedHandle) -> Result<Self> {
        desc.validate()?;
        Ok(GpuExport { desc, fd })
    }

    /// Sends the export over the platform's stream (a Unix stream socket, a named pipe on
    /// Windows): the description as the payload and the handle attached. The handle stays open
    /// here; drop the export when done.
    pub fn send(&self, socket: &Stream) -> Result<()> {
        send_with_handles(socket, &self.desc.to_bytes(), &[external::lend(&self.fd)])
    }

    /// Receives one export sent with [`GpuExport::send`], validating its description. Any fd
    /// that arrives with a malformed message is closed.
    pub fn recv(socket: &Stream) -> Result<Self> {
        let mut buf = [0u8; GpuExportDesc::SIZE];
        let fd = recv_exact_with_handle(socket, &mut buf, "a GPU export")?;
        let desc = GpuExportDesc::from_bytes(&buf)?;
        Ok(GpuExport { desc, fd })
    }

    /// A second export of the same buffer with a duplicated fd.
    pub fn try_clone(&self) -> Result<Self> {
        let fd = self.fd.try_clone().map_err(|e| Error::os("duplicating a GPU export's handle", e))?;
        Ok(GpuExport { desc: self.desc, fd })
    }
}

impl GpuBuffer {
    /// Exports the buffer's arena as the platform's opaque handle ([`HandleType::OPAQUE`]: an
    /// opaque fd, for Vulkan or CUDA in another process; on Windows an opaque NT handle, for
    /// Vulkan).
    pub fn export(&self) -> Result<GpuExport> {
        self.export_as(HandleType::OPAQUE)
    }

    /// Exports the buffer's whole arena (same fd semantics as [`GpuBuffer::export`]): offset 0
    /// and the arena's size, for a peer that imports the arena once and then reads many
    /// buffers in it by offset. For a dedicated allocation: the dedicated buffer, whose export
    /// always covers the whole allocation from offset 0 (its size is the buffer's size).
    pub fn export_arena(&self) -> Result<GpuExport> {
        let mut export = self.export()?;
        if self.arena.dedicated_buffer.is_none() || export.desc.offset != 0 {
            // (A dedicated allocation's buffer spans all of it, so an import of part of one
            // exports it whole.)
            export.desc.offset = 0;
            export.desc.size = self.arena.size;
        }
        Ok(export)
    }

    /// Exports the buffer's arena as `handle`. Every call returns a new fd. Memory imported
    /// from an opaque fd is exported again as a copy of that fd, with the original
    /// exporter's arena identity (so that caches keyed by arena identity still match).
    pub fn export_as(&self, handle: HandleType) -> Result<GpuExport> {
        let fd = self.arena.export_fd(handle)?;
        Ok(GpuExport { desc: self.describe_as(handle), fd })
    }

    /// What [`export_as`](Self::export_as) says of the buffer, without making a file
    /// descriptor (a driver call each time): enough to recognise an arena imported before.
    pub fn describe_as(&self, handle: HandleType) -> GpuExportDesc {
        let arena = &self.arena;
        let info = arena.device.info();
        GpuExportDesc {
            magic: GPU_EXPORT_MAGIC,
            version: GPU_EXPORT_VERSION,
            handle_type: handle.to_raw(),
            memory_type_index: arena.memory_type_index,
            memory_property_flags: arena.property_flags.as_raw(),
            flags: if arena.dedicated_buffer.is_some() { GPU_EXPORT_DEDICATED } else { 0 },
            kind: arena.kind.to_raw(),
            exporter_pid: arena.id.exporter_pid,
            arena_token: arena.id.token,
            arena_counter: arena.id.counter,
            arena_size: arena.size,
            offset: self.offset,
            size: self.size,
            device_uuid: info.device_uuid,
            driver_uuid: info.driver_uuid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> GpuExportDesc {
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

    #[test]
    fn handle_types_print_by_their_vulkan_names() {
        let shown = sample().to_string();
        assert!(shown.contains("OPAQUE_FD") && !shown.contains("Some("), "{shown}");
        let mut unknown = sample();
        unknown.handle_type = 0x40;
        assert!(unknown.to_string().contains("unknown handle type 0x40"), "{unknown}");
        assert_eq!(HandleType::DmaBuf.to_string(), "DMA_BUF");
    }

    #[test]
    fn desc_round_trips_through_bytes() {
        let d = sample();
        assert_eq!(GpuExportDesc::from_bytes(&d.to_bytes()).unwrap(), d);
        assert_eq!(d.arena_id().to_string(), format!("42-{:016x}-7", 0xdead_beefu64));
    }

    /// The wire format byte by byte (the GPU route of channels sends it; peers of earlier
    /// versions read it): each field at its fixed offset, native byte order.
    #[test]
    fn wire_format_is_fixed() {
        let d = sample();
        let mut expected = [0u8; GpuExportDesc::SIZE];
        let mut put = |at: usize, bytes: &[u8]| expected[at..at + bytes.len()].copy_from_slice(bytes);
        let words = [GPU_EXPORT_MAGIC, GPU_EXPORT_VERSION, HandleType::OpaqueFd.to_raw(), 2, 0x7, 0, 1, 42];
        for (i, word) in words.into_iter().enumerate() {
            put(4 * i, &word.to_ne_bytes());
        }
        for (i, value) in [0xdead_beef, 7, 1 << 20, 4096, 100u64].into_iter().enumerate() {
            put(32 + 8 * i, &value.to_ne_bytes());
        }
        put(72, &[1; 16]);
        put(88, &[2; 16]);
        assert_eq!(d.to_bytes(), expected);
        assert_eq!(GpuExportDesc::from_bytes(&expected).unwrap(), d);
        assert!(GpuExportDesc::from_bytes(&expected[1..]).is_err());
    }

    // (The platform's stream on Unix: a socket pair and a memfd stand for the peer and the export.)
    #[cfg(unix)]
    #[test]
    fn malformed_export_messages_are_refused() {
        use std::os::fd::AsFd;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        send_with_handles(&a, &sample().to_bytes(), &[]).unwrap();
        assert!(matches!(GpuExport::recv(&b), Err(Error::Corrupt(ref m)) if m.contains("0 fds")));
        let fd = crate::os::shm::create("lf-test", 4096, Default::default()).unwrap();
        let mut bad = sample();
        bad.magic ^= 1;
        send_with_handles(&a, &bad.to_bytes(), &[fd.as_fd()]).unwrap();
        assert!(matches!(GpuExport::recv(&b), Err(Error::InvalidArgument(ref m)) if m.contains("magic")));
        send_with_handles(&a, &sample().to_bytes(), &[fd.as_fd()]).unwrap();
        let export = GpuExport::recv(&b).unwrap();
        assert_eq!(export.desc, sample());
        drop(a);
        assert!(matches!(GpuExport::recv(&b), Err(Error::PeerGone(_))));
    }

    #[test]
    fn bad_descs_are_refused() {
        let bytes = sample().to_bytes();
        assert!(GpuExportDesc::from_bytes(&bytes[..50]).is_err());
        let cases: [fn(&mut GpuExportDesc); 8] = [
            |d| d.magic = 0,
            |d| d.handle_type = 0x4,
            |d| d.kind = 9,
            |d| d.flags = 0x10,
            |d| d.size = 0,
            |d| d.offset = (1 << 20) - 99,
            |d| d.offset = u64::MAX,
            |d| d.arena_size = 0,
        ];
        for tamper in cases {
            let mut d = sample();
            tamper(&mut d);
            assert!(matches!(GpuExportDesc::from_bytes(&d.to_bytes()), Err(Error::InvalidArgument(_))), "{d:?}");
        }
        let mut d = sample();
        d.version = 99;
        assert!(matches!(d.validate(), Err(Error::Unsupported(_))));
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(4000))]

        /// A GPU export description from another process: what is accepted lies inside its
        /// arena, names a known handle type and kind, and is exactly what its bytes say.
        #[test]
        fn fuzz_gpu_export_descriptions(bytes in crate::fuzz::bytes_near(sample().to_bytes().to_vec(), 200)) {
            if let Ok(desc) = GpuExportDesc::from_bytes(&bytes) {
                prop_assert!(desc.handle().is_some() && desc.kind().is_some());
                prop_assert!(desc.size > 0 && desc.offset.checked_add(desc.size).is_some_and(|end| end <= desc.arena_size));
                prop_assert_eq!(&desc.to_bytes()[..], &bytes[..]);
            }
        }
    }
}
