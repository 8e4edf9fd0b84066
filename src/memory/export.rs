//! Export and import: another process on this host maps (or, for GPU memory, imports on
//! its own Vulkan device) the very same memory.
//!
//! An [`ExportHandle`] is a file descriptor (the buffer's arena: a sealed memfd, or a Vulkan
//! allocation exported as an opaque fd) plus an [`ExportDescriptor`]: a fixed-size plain-data
//! record with the offset and size of the buffer in the arena, its location, the arena's
//! identity and the exporter's, and for GPU memory what Vulkan (or CUDA) needs to import it.
//! Send the descriptor's bytes and the fd together over a Unix socket (`SCM_RIGHTS`):
//! [`ExportHandle::send`] and [`ExportHandle::recv`] do that. The importer validates
//! everything before mapping, since the sender may be buggy or hostile; importing two buffers
//! of one arena maps (imports) it once.

use std::ptr::NonNull;
use std::sync::Arc;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::arena::{ImportCache, MIN_BLOCK};
use super::buffer::{Backing, Buffer, BufferParts};
use super::cpu::standard::ARENA_NAME;
use super::location::MemoryLocation;
use super::registry::{BufferOrigin, Registry};
pub use super::token::process_token;
use crate::error::{Error, Result};
use crate::os::facts::{facts, HandleFacts, HandleKind};
use crate::os::shm;
use crate::os::stream::{recv_exact_with_handle, send_with_handles, Stream};
use crate::os::{page_size, BorrowedHandle, OwnedHandle};

/// The first field of every descriptor: "LFEX".
pub const EXPORT_MAGIC: u32 = 0x4c46_4558;
/// The descriptor layout this library writes and reads (2: with the GPU section).
pub const EXPORT_VERSION: u32 = 2;
/// `gpu_flags` bit: the GPU arena is a dedicated allocation (import it as dedicated:
/// `VkMemoryDedicatedAllocateInfo`, `cudaExternalMemoryDedicated`).
pub const EXPORT_GPU_DEDICATED: u32 = 1;

/// The plain-data part of an export, identical in layout to the C `lf_export` minus its fd.
///
/// For GPU memory (`location` is a GPU location) `arena_id` and `exporter_token` are the
/// GPU arena's counter and its exporter's token, and the GPU section is filled in; for CPU
/// memory the GPU section is zero.
///
/// The record is its own wire form: `#[repr(C)]` with every field naturally aligned and no
/// padding, read and written as bytes through `zerocopy` (native byte order: both ends share
/// a host). The C API's `lf_export` has the very same layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct ExportDescriptor {
    pub magic: u32,
    pub version: u32,
    /// The `LF_MEMORY_*` code of the memory.
    pub location: u32,
    /// The NUMA node of `LF_MEMORY_CPU_NUMA` memory, else -1.
    pub numa_node: i32,
    /// Where the buffer starts in the arena (a multiple of 64 for CPU memory).
    pub offset: u64,
    pub size: u64,
    /// The arena's id in the process that created it.
    pub arena_id: u64,
    /// The arena's size: the whole memory file, or the whole Vulkan allocation (what
    /// `vkAllocateMemory` and `cudaImportExternalMemory` import).
    pub arena_size: u64,
    /// The process that created the arena, and its per-run random token (pids get reused).
    pub exporter_pid: u32,
    pub reserved: u32,
    pub exporter_token: u64,
    /// GPU: the `VkExternalMemoryHandleTypeFlagBits` value of the fd (OPAQUE_FD: 0x1).
    pub handle_type: u32,
    /// GPU: the exporter's memory type index and its `VkMemoryPropertyFlags`.
    pub memory_type_index: u32,
    pub memory_property_flags: u32,
    /// GPU: [`EXPORT_GPU_DEDICATED`].
    pub gpu_flags: u32,
    /// GPU: the exporting device's deviceUUID (CUDA's device UUID on NVIDIA) and driverUUID;
    /// an importer on another GPU or driver refuses the export.
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
    pub reserved2: [u64; 2],
}

impl ExportDescriptor {
    /// The size of the wire form (and of the struct: all fields are naturally aligned).
    pub const SIZE: usize = 128;

    /// The wire form: the record's bytes (the fields in declaration order, native byte order:
    /// both ends share a host).
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        zerocopy::transmute!(*self)
    }

    /// Parses the wire form. Only the length is checked here; [`Context::import`](super::Context::import)
    /// validates the contents.
    pub fn from_bytes(bytes: &[u8]) -> Result<ExportDescriptor> {
        ExportDescriptor::read_from_bytes(bytes)
            .map_err(|_| Error::invalid(format!("an export descriptor is {} bytes, not {}", Self::SIZE, bytes.len())))
    }

    /// The location the descriptor names, checked.
    fn memory_location(&self) -> Result<MemoryLocation> {
        let node = match self.numa_node {
            -1 => None,
            n => Some(u32::try_from(n).map_err(|_| Error::invalid(format!("export handle names NUMA node {n}")))?),
        };
        MemoryLocation::from_code(self.location, node)
    }

    /// Checks what every export must have (magic, version, a known location, no bits in
    /// reserved fields) and returns the location.
    pub(crate) fn validate_header(&self) -> Result<MemoryLocation> {
        if self.magic != EXPORT_MAGIC {
            return Err(Error::invalid(format!(
                "not a lava-flow export handle (magic {:#010x}, expected {EXPORT_MAGIC:#010x})",
                self.magic
            )));
        }
        if self.version != EXPORT_VERSION {
            return Err(Error::Unsupported(format!(
                "export handle version {}; this library reads version {EXPORT_VERSION}: use the same \
                 lava-flow version on both sides",
                self.version
            )));
        }
        if self.reserved2 != [0, 0] {
            return Err(Error::invalid("export handle with non-zero reserved fields"));
        }
        let location = self.memory_location()?;
        let gpu_section = ExportDescriptor {
            handle_type: self.handle_type,
            memory_type_index: self.memory_type_index,
            memory_property_flags: self.memory_property_flags,
            gpu_flags: self.gpu_flags,
            device_uuid: self.device_uuid,
            driver_uuid: self.driver_uuid,
            ..ExportDescriptor::default()
        };
        if !location.is_gpu() && gpu_section != ExportDescriptor::default() {
            return Err(Error::invalid(format!("export handle of {location} carries GPU fields")));
        }
        Ok(location)
    }
}

const _: () = assert!(std::mem::size_of::<ExportDescriptor>() == ExportDescriptor::SIZE);

/// A buffer ready to travel to another process: its arena's fd (owned: closed on drop) and
/// the descriptor. Consumed by [`Context::import`](super::Context::import).
#[derive(Debug)]
pub struct ExportHandle {
    pub fd: OwnedHandle,
    pub descriptor: ExportDescriptor,
}

impl ExportDescriptor {
    /// Sends the descriptor over a Unix stream socket with `fd`, the memory it describes,
    /// attached (`SCM_RIGHTS`), as [`ExportHandle::send`] does; for bindings that keep the
    /// descriptor and the fd apart (the C API's `lf_export`). The fd stays open here.
    pub fn send_with(&self, socket: &Stream, fd: BorrowedHandle<'_>) -> Result<()> {
        send_with_handles(socket, &self.to_bytes(), &[fd])
    }
}

impl ExportHandle {
    /// Sends the handle over a Unix stream socket: the descriptor's bytes with the fd attached.
    /// The fd stays open here too.
    pub fn send(&self, socket: &Stream) -> Result<()> {
        self.descriptor.send_with(socket, crate::os::borrow(&self.fd))
    }

    /// Receives one handle sent with [`ExportHandle::send`]. A message that is not exactly one
    /// descriptor with one fd is refused, and whatever fds came with it are closed; so is a
    /// descriptor that fails [`check_received_descriptor`], or an fd that is not memory of at
    /// least the arena's size ([`check_received_fd`]): `Corrupt`, saying what is wrong.
    pub fn recv(socket: &Stream) -> Result<ExportHandle> {
        let mut bytes = [0u8; ExportDescriptor::SIZE];
        let fd = recv_exact_with_handle(socket, &mut bytes, "an export handle")?;
        let descriptor = ExportDescriptor::from_bytes(&bytes)?;
        let location = check_received_descriptor(&descriptor)?;
        check_received_fd(&fd, &descriptor, location)?;
        Ok(ExportHandle { fd, descriptor })
    }
}

fn corrupt_export(problem: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!(
        "the export received is not one lava-flow sends ({problem}); send exports with lf_export_send \
         (ExportHandle::send) of a buffer's lf_buffer_export, from the same lava-flow version"
    ))
}

/// The `VkExternalMemoryHandleTypeFlagBits` values a GPU export may carry: OPAQUE_FD, DMA_BUF.
const GPU_HANDLE_TYPES: [u32; 2] = [0x1, 0x200];

/// Checks a descriptor that arrived from another process, before anything is done with it:
/// magic, version, reserved fields, a known location (and NUMA node only for NUMA memory), the
/// GPU section only for GPU memory (a known handle type, known flags), and a non-empty range
/// inside a non-empty arena. Returns the location; everything else is `Corrupt`, naming the
/// field. Pure: it reads nothing but the bytes.
pub fn check_received_descriptor(d: &ExportDescriptor) -> Result<MemoryLocation> {
    let location = d.validate_header().map_err(|e| corrupt_export(strip_class(&e)))?;
    if d.size == 0 || d.arena_size == 0 {
        return Err(corrupt_export(format!(
            "size {} in an arena of {} bytes: both must be positive",
            d.size, d.arena_size
        )));
    }
    if d.offset.checked_add(d.size).map_or(true, |end| end > d.arena_size) {
        return Err(corrupt_export(format!(
            "the range [{}, {} + {}) lies outside its {}-byte arena",
            d.offset, d.offset, d.size, d.arena_size
        )));
    }
    if location.is_gpu() {
        if !GPU_HANDLE_TYPES.contains(&d.handle_type) {
            return Err(corrupt_export(format!("unknown GPU handle type {:#x}", d.handle_type)));
        }
        if d.gpu_flags & !EXPORT_GPU_DEDICATED != 0 {
            return Err(corrupt_export(format!("unknown GPU flags {:#x}", d.gpu_flags)));
        }
    } else if d.offset % MIN_BLOCK as u64 != 0 {
        return Err(corrupt_export(format!("offset {} is not a multiple of {MIN_BLOCK}", d.offset)));
    }
    Ok(location)
}

/// An error's message without its class prefix ("invalid argument: "), to be wrapped in
/// another.
fn strip_class(error: &Error) -> String {
    match error {
        Error::InvalidArgument(m) | Error::Unsupported(m) | Error::Corrupt(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Kinds of descriptors that are never memory, as `/proc/self/fd` names them.
const NOT_MEMORY: [&str; 11] = [
    "anon_inode:[eventfd]",
    "anon_inode:[eventpoll]",
    "anon_inode:[timerfd]",
    "anon_inode:[signalfd]",
    "anon_inode:[pidfd]",
    "anon_inode:inotify",
    "anon_inode:[fanotify]",
    "anon_inode:[io_uring]",
    "anon_inode:[userfaultfd]",
    "anon_inode:[perf_event]",
    "anon_inode:bpf",
];

/// Checks the fd that came with a received descriptor: for CPU memory a memfd sealed against
/// shrinking of at least the arena's size; for GPU memory something a driver exports (a memfd
/// or dma-buf of at least the arena's size, a GPU device file, an anonymous driver object),
/// never a socket, pipe, directory, terminal or the like. `Corrupt` otherwise, naming it.
pub fn check_received_fd(fd: &OwnedHandle, d: &ExportDescriptor, location: MemoryLocation) -> Result<()> {
    let HandleFacts { size, kind, target, .. } =
        facts(fd).map_err(|e| corrupt_export(format!("fstat of its fd failed: {e}")))?;
    let at_least_arena = || -> Result<()> {
        if size < d.arena_size {
            return Err(corrupt_export(format!(
                "its fd ({target}) holds {size} bytes, fewer than the {}-byte arena it claims",
                d.arena_size
            )));
        }
        Ok(())
    };
    if shm::is_shm(fd) {
        if !location.is_gpu() && !shm::size_is_fixed(fd) {
            return Err(corrupt_export(format!("its fd ({target}) is not sealed against shrinking")));
        }
        return at_least_arena();
    }
    if !location.is_gpu() {
        return Err(corrupt_export(format!("its fd is {}, not a memory file (memfd)", describe_fd(&target, kind))));
    }
    if target.starts_with("/dmabuf:") || target.starts_with("anon_inode:dmabuf") {
        return at_least_arena();
    }
    let device_file =
        kind == HandleKind::CharDevice && (target.starts_with("/dev/nvidia") || target.starts_with("/dev/dri/"));
    let driver_object = target.starts_with("anon_inode:") && !NOT_MEMORY.iter().any(|n| target.starts_with(n));
    if device_file || driver_object {
        return Ok(());
    }
    Err(corrupt_export(format!("its fd is {}, not GPU memory a driver exports", describe_fd(&target, kind))))
}

fn describe_fd(target: &str, kind: HandleKind) -> String {
    let what = match kind {
        HandleKind::Socket => "a socket",
        HandleKind::Pipe => "a pipe",
        HandleKind::Directory => "a directory",
        HandleKind::CharDevice => "a character device",
        HandleKind::BlockDevice => "a block device",
        HandleKind::RegularFile => "a regular file",
        HandleKind::Other => "a descriptor",
    };
    if target.is_empty() {
        what.to_owned()
    } else {
        format!("{what} ({target})")
    }
}

/// The GPU section of the wire format <-> the Vulkan module's own description.
#[cfg(feature = "vulkan")]
mod gpu_wire {
    use super::*;
    use crate::memory::gpu::{GpuExport, GpuExportDesc, GpuMemoryKind, GPU_EXPORT_MAGIC, GPU_EXPORT_VERSION};

    impl ExportDescriptor {
        pub(crate) fn from_gpu(d: &GpuExportDesc) -> ExportDescriptor {
            let location = match d.kind() {
                Some(GpuMemoryKind::HostVisible) => MemoryLocation::GpuHostVisible,
                _ => MemoryLocation::GpuDeviceLocal,
            };
            ExportDescriptor {
                magic: EXPORT_MAGIC,
                version: EXPORT_VERSION,
                location: location.code(),
                numa_node: -1,
                offset: d.offset,
                size: d.size,
                arena_id: d.arena_counter,
                arena_size: d.arena_size,
                exporter_pid: d.exporter_pid,
                reserved: 0,
                exporter_token: d.arena_token,
                handle_type: d.handle_type,
                memory_type_index: d.memory_type_index,
                memory_property_flags: d.memory_property_flags,
                gpu_flags: d.flags,
                device_uuid: d.device_uuid,
                driver_uuid: d.driver_uuid,
                reserved2: [0; 2],
            }
        }

        /// The Vulkan module's description of a GPU export, validated.
        pub(crate) fn to_gpu(self) -> Result<GpuExportDesc> {
            let kind = match self.memory_location()? {
                MemoryLocation::GpuDeviceLocal => GpuMemoryKind::DeviceLocal,
                MemoryLocation::GpuHostVisible => GpuMemoryKind::HostVisible,
                other => return Err(Error::invalid(format!("export handle of {other} is not GPU memory"))),
            };
            let desc = GpuExportDesc {
                magic: GPU_EXPORT_MAGIC,
                version: GPU_EXPORT_VERSION,
                handle_type: self.handle_type,
                memory_type_index: self.memory_type_index,
                memory_property_flags: self.memory_property_flags,
                flags: self.gpu_flags,
                kind: kind.to_raw(),
                exporter_pid: self.exporter_pid,
                arena_token: self.exporter_token,
                arena_counter: self.arena_id,
                arena_size: self.arena_size,
                offset: self.offset,
                size: self.size,
                device_uuid: self.device_uuid,
                driver_uuid: self.driver_uuid,
            };
            desc.validate()?;
            Ok(desc)
        }
    }

    impl From<GpuExport> for ExportHandle {
        fn from(export: GpuExport) -> Self {
            ExportHandle { descriptor: ExportDescriptor::from_gpu(&export.desc), fd: export.fd }
        }
    }
}

impl Buffer {
    /// Exports the buffer for another process on this host: see [`ExportHandle`].
    pub fn export(&self) -> Result<ExportHandle> {
        export(self)
    }

    /// What [`export`](Self::export) says of the buffer, without a file descriptor: its
    /// arena's identity (exporter, token, arena id), its place in it and how it would be
    /// imported. Makes no system or driver call: for recognising an arena imported before
    /// (an importer's cache key), where an export would make and close a descriptor per call.
    pub fn describe(&self) -> Result<ExportDescriptor> {
        describe(self).map(|(descriptor, _)| descriptor)
    }
}

fn export(buffer: &Buffer) -> Result<ExportHandle> {
    #[cfg(feature = "vulkan")]
    if let Backing::Gpu { buffer: gpu } | Backing::GpuView { whole: gpu, .. } = buffer.backing() {
        let fd = gpu.export()?.fd;
        return Ok(ExportHandle { fd, descriptor: describe(buffer)?.0 });
    }
    let (descriptor, fd) = describe(buffer)?;
    let Some(fd) = fd else {
        return Err(Error::Unsupported(format!("buffer {} lies in no memory file this build exports", buffer.id())));
    };
    let fd = fd.try_clone().map_err(|e| Error::os(format!("duplicating the fd of buffer {}", buffer.id()), e))?;
    Ok(ExportHandle { fd, descriptor })
}

/// The export's descriptor of `buffer`, and the file of a CPU arena (a GPU arena's is made by
/// the driver on export).
fn describe(buffer: &Buffer) -> Result<(ExportDescriptor, Option<&OwnedHandle>)> {
    let (fd, arena_id, arena_size, offset, pid, token) = match buffer.backing() {
        #[cfg(feature = "vulkan")]
        Backing::Gpu { buffer } => {
            return Ok((
                ExportDescriptor::from_gpu(&buffer.describe_as(crate::memory::gpu::HandleType::OpaqueFd)),
                None,
            ))
        }
        // A view: its whole buffer's arena, with the view's place in it.
        #[cfg(feature = "vulkan")]
        Backing::GpuView { whole, offset, .. } => {
            let mut desc = whole.describe_as(crate::memory::gpu::HandleType::OpaqueFd);
            desc.offset = whole.offset() + offset;
            desc.size = buffer.len() as u64;
            return Ok((ExportDescriptor::from_gpu(&desc), None));
        }
        Backing::Pooled { arena, offset, .. } => {
            (&arena.fd, arena.id, arena.mapping.len(), *offset, std::process::id(), process_token())
        }
        Backing::Dedicated { arena } => {
            (&arena.fd, arena.id, arena.mapping.len(), 0, std::process::id(), process_token())
        }
        Backing::Imported { arena, offset } => {
            (&arena.fd, arena.arena_id, arena.mapping.len(), *offset, arena.exporter_pid, arena.exporter_token)
        }
        Backing::Registered => {
            return Err(Error::Unsupported(format!(
                "buffer {} is registered user memory, which lives in no shareable memory file; \
                 allocate it from the context (lf_alloc) to export it",
                buffer.id()
            )))
        }
        Backing::Cuda { registration } => {
            return Err(Error::Unsupported(super::buffer::cuda_unsupported(buffer.id(), registration.pointer)))
        }
    };
    let location = buffer.location();
    Ok((
        ExportDescriptor {
            magic: EXPORT_MAGIC,
            version: EXPORT_VERSION,
            location: location.code(),
            numa_node: location.numa_node().map_or(-1, |n| n as i32),
            offset: offset as u64,
            size: buffer.len() as u64,
            arena_id,
            arena_size: arena_size as u64,
            exporter_pid: pid,
            exporter_token: token,
            ..ExportDescriptor::default()
        },
        Some(fd),
    ))
}

fn invalid_fd(fd: &OwnedHandle, problem: impl std::fmt::Display) -> Error {
    Error::invalid(format!("export handle fd {:?}: {problem}", crate::os::raw(fd)))
}

/// Checks the handle's fd: a sealed lava-flow memfd of exactly the arena's size, backed by
/// the page size its kind implies. Returns the file's identity (where the platform gives
/// one: else the exporter's token and the arena's id, which name it as well) and page size.
fn validate_fd(
    fd: &OwnedHandle,
    descriptor: &ExportDescriptor,
    location: MemoryLocation,
) -> Result<((u64, u64), usize)> {
    let HandleFacts { identity, size, target, .. } =
        facts(fd).map_err(|e| invalid_fd(fd, format!("fstat failed: {e}")))?;
    if !shm::is_shm(fd) {
        return Err(invalid_fd(fd, "not a memory file"));
    }
    if !shm::has_name_prefix(fd, ARENA_NAME) {
        return Err(invalid_fd(fd, format!("{target:?} is not a lava-flow memory file")));
    }
    if !shm::size_is_fixed(fd) {
        return Err(invalid_fd(fd, "the memory file is not sealed against shrinking"));
    }
    if size != descriptor.arena_size {
        return Err(invalid_fd(
            fd,
            format!("the memory file has {size} bytes, the handle says {}", descriptor.arena_size),
        ));
    }
    let file_page = shm::page_size_of(fd)?;
    let expected = match location {
        MemoryLocation::CpuHugepage { page } => page.bytes(),
        _ => page_size(),
    };
    if file_page != expected {
        return Err(invalid_fd(
            fd,
            format!("the memory file has {file_page}-byte pages, but {location} has {expected}-byte pages"),
        ));
    }
    Ok((identity.unwrap_or((descriptor.exporter_token, descriptor.arena_id)), file_page))
}

fn validate_descriptor(d: &ExportDescriptor) -> Result<MemoryLocation> {
    let location = d.validate_header()?;
    if location.is_gpu() {
        return Err(Error::Unsupported(format!("{location} is imported through the GPU (Vulkan) layer")));
    }
    if d.size == 0 || d.arena_size == 0 {
        return Err(Error::invalid(format!("export handle with size {} in an arena of {}", d.size, d.arena_size)));
    }
    if d.offset % MIN_BLOCK as u64 != 0 {
        return Err(Error::invalid(format!("export handle offset {} is not a multiple of {MIN_BLOCK}", d.offset)));
    }
    if d.offset.checked_add(d.size).map_or(true, |end| end > d.arena_size) || usize::try_from(d.arena_size).is_err() {
        return Err(Error::invalid(format!(
            "export handle range [{}, {} + {}) lies outside its {}-byte arena",
            d.offset, d.offset, d.size, d.arena_size
        )));
    }
    Ok(location)
}

/// Imports a handle into `registry`'s context. The handle's fd is consumed: kept for the
/// arena's mapping, or closed (when the arena is mapped already, and on every error).
pub(crate) fn import(handle: ExportHandle, registry: &Arc<Registry>, cache: &Arc<ImportCache>) -> Result<Buffer> {
    let ExportHandle { fd, descriptor: d } = handle;
    let location = validate_descriptor(&d)?;
    let (key, file_page) = validate_fd(&fd, &d, location)?;
    let arena = cache.get_or_map(key, fd, d.arena_size as usize, d.arena_id, (d.exporter_pid, d.exporter_token))?;
    let offset = d.offset as usize;
    // SAFETY: offset + size <= arena_size == the mapping's length (validated above).
    let ptr = unsafe { NonNull::new_unchecked(arena.mapping.as_ptr().add(offset)) };
    let parts = BufferParts {
        ptr: Some(ptr),
        len: d.size as usize,
        location,
        page_size: file_page,
        origin: BufferOrigin::Imported { exporter_pid: arena.exporter_pid },
        backing: Backing::Imported { arena, offset },
    };
    Buffer::new(parts, registry, false)
}

#[cfg(all(test, windows))]
#[path = "export_windows_tests.rs"]
mod windows_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn descriptors_round_trip_through_bytes() {
        let d = ExportDescriptor {
            magic: EXPORT_MAGIC,
            version: EXPORT_VERSION,
            location: 2,
            numa_node: 0,
            offset: 128,
            size: 100,
            arena_id: 7,
            arena_size: 1 << 21,
            exporter_pid: 42,
            exporter_token: 0xdead_beef_cafe,
            device_uuid: [3; 16],
            reserved2: [0, 9],
            ..ExportDescriptor::default()
        };
        assert_eq!(ExportDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
        assert!(ExportDescriptor::from_bytes(&[0u8; 10]).is_err());
        assert!(ExportDescriptor::from_bytes(&[0u8; 129]).is_err());
    }

    /// The wire format, byte by byte (the C header's `lf_export` and exporters of earlier
    /// versions use it): each field at its fixed offset, native byte order.
    #[test]
    fn wire_format_is_fixed() {
        let d = ExportDescriptor {
            magic: EXPORT_MAGIC,
            version: EXPORT_VERSION,
            location: 3,
            numa_node: -1,
            offset: 0x1010,
            size: 0x1018,
            arena_id: 0x1020,
            arena_size: 0x1028,
            exporter_pid: 0x30,
            reserved: 0x34,
            exporter_token: 0x1038,
            handle_type: 0x40,
            memory_type_index: 0x44,
            memory_property_flags: 0x48,
            gpu_flags: 0x4c,
            device_uuid: [0x50; 16],
            driver_uuid: [0x60; 16],
            reserved2: [0x1070, 0x1078],
        };
        let mut expected = [0u8; 128];
        let mut put = |at: usize, bytes: &[u8]| expected[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &EXPORT_MAGIC.to_ne_bytes());
        put(4, &EXPORT_VERSION.to_ne_bytes());
        put(8, &3u32.to_ne_bytes());
        put(12, &(-1i32).to_ne_bytes());
        for at in [16, 24, 32, 40, 56, 112, 120] {
            put(at, &(0x1000 + at as u64).to_ne_bytes());
        }
        for at in [48, 52, 64, 68, 72, 76] {
            put(at, &(at as u32).to_ne_bytes());
        }
        put(80, &[0x50; 16]);
        put(96, &[0x60; 16]);
        assert_eq!(d.to_bytes(), expected);
        assert_eq!(ExportDescriptor::from_bytes(&expected).unwrap(), d);
        assert_ne!(process_token(), 0);
    }

    #[test]
    fn importing_one_arena_twice_maps_it_once() {
        use crate::memory::{Context, ContextConfig, MemoryLocation};
        let context = Context::new(ContextConfig::default()).unwrap();
        let a = context.allocate(64, MemoryLocation::CpuStandard).unwrap();
        let b = context.allocate(64, MemoryLocation::CpuStandard).unwrap();
        let ia = context.import(a.export().unwrap()).unwrap();
        let ib = context.import(b.export().unwrap()).unwrap();
        let again = context.import(a.export().unwrap()).unwrap();
        assert_eq!(context.inner.imports.len(), 1);
        assert_eq!(ib.as_ptr() as usize - ia.as_ptr() as usize, b.as_ptr() as usize - a.as_ptr() as usize);
        assert_eq!(again.as_ptr(), ia.as_ptr());
        // Two imported buffers over the same bytes: the registry answers with one of them.
        let found = context.find(ia.as_ptr()).unwrap();
        assert!(found.info.id == ia.id() || found.info.id == again.id());
        drop((ia, ib, again));
        assert_eq!(context.inner.imports.len(), 0, "the mapping goes with its last buffer");
        // Re-exporting an imported buffer names the original arena.
        let first = a.export().unwrap();
        let imported = context.import(first).unwrap();
        let re = imported.export().unwrap();
        assert_eq!(re.descriptor.exporter_pid, std::process::id());
        assert_eq!(re.descriptor.offset, a.export().unwrap().descriptor.offset);
    }

    fn valid_descriptor() -> Vec<u8> {
        ExportDescriptor {
            magic: EXPORT_MAGIC,
            version: EXPORT_VERSION,
            location: MemoryLocation::CpuStandard.code(),
            numa_node: -1,
            offset: 128,
            size: 100,
            arena_id: 7,
            arena_size: 1 << 21,
            exporter_pid: 42,
            exporter_token: 9,
            ..ExportDescriptor::default()
        }
        .to_bytes()
        .to_vec()
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(4000))]

        /// An export record received from another process: accepted only with lava-flow's
        /// magic and version, no reserved bits, a known location and a non-empty range inside
        /// its arena; refused as Corrupt otherwise.
        #[test]
        fn fuzz_received_export_records(bytes in crate::fuzz::bytes_near(valid_descriptor(), 160)) {
            let Ok(d) = ExportDescriptor::from_bytes(&bytes) else { return Ok(()) };
            match check_received_descriptor(&d) {
                Ok(location) => {
                    prop_assert_eq!((d.magic, d.version, d.reserved2), (EXPORT_MAGIC, EXPORT_VERSION, [0, 0]));
                    prop_assert_eq!(location.code(), d.location);
                    prop_assert!(d.size > 0 && d.offset.checked_add(d.size).is_some_and(|end| end <= d.arena_size));
                    if !location.is_gpu() {
                        prop_assert!(d.offset % MIN_BLOCK as u64 == 0 && d.handle_type == 0 && d.gpu_flags == 0);
                    }
                }
                Err(e) => prop_assert!(matches!(e, Error::Corrupt(_)), "{}", e),
            }
        }
    }
}
