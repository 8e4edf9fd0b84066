//! Arenas: one `VkDeviceMemory` each, exported once and shared by many buffers.
//!
//! An arena is the unit of export and import: one file descriptor covers every buffer carved
//! out of it, and the importing process imports the arena once (its import cache is keyed by
//! [`ArenaId`]) and binds each buffer at its offset. The [`Suballocator`] (the one CPU arenas
//! use too) hands out the ranges of pooled arenas.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ash::vk;
use parking_lot::Mutex;

use super::cuda::CudaArena;
use super::device::{external, vk_err, VulkanDevice, BUFFER_USAGE};
use crate::error::{Error, Result};
use crate::memory::suballocator::Suballocator;
use crate::memory::token::process_token;
use crate::os::OwnedHandle;

/// The two kinds of GPU memory lava-flow hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuMemoryKind {
    /// The GPU's own memory (HBM/VRAM): fastest for the GPU, reached from the host by
    /// staging copies (or directly where the driver maps it, as on resizable-BAR or CPU
    /// drivers).
    DeviceLocal,
    /// Host memory the GPU reaches over the bus, mapped into the host: for staging and for
    /// data the CPU produces or consumes.
    HostVisible,
}

impl GpuMemoryKind {
    pub const ALL: [GpuMemoryKind; 2] = [GpuMemoryKind::DeviceLocal, GpuMemoryKind::HostVisible];

    pub(crate) fn index(self) -> usize {
        match self {
            GpuMemoryKind::DeviceLocal => 0,
            GpuMemoryKind::HostVisible => 1,
        }
    }

    pub(crate) fn to_raw(self) -> u32 {
        self.index() as u32
    }

    pub(crate) fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(GpuMemoryKind::DeviceLocal),
            1 => Some(GpuMemoryKind::HostVisible),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GpuMemoryKind::DeviceLocal => "DEVICE_LOCAL",
            GpuMemoryKind::HostVisible => "HOST_VISIBLE",
        }
    }
}

impl fmt::Display for GpuMemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of OS handle an export carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleType {
    /// `VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT`: for Vulkan and CUDA on the same GPU
    /// and driver, on Linux.
    OpaqueFd,
    /// `VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_WIN32_BIT`: an NT handle, for Vulkan on the same
    /// GPU and driver, on Windows.
    OpaqueWin32,
    /// `VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT`: a Linux dma-buf, for other devices
    /// (NICs, other drivers). Only where the device offers `VK_EXT_external_memory_dma_buf`.
    DmaBuf,
}

impl HandleType {
    const ALL: [HandleType; 3] = [HandleType::OpaqueFd, HandleType::OpaqueWin32, HandleType::DmaBuf];

    /// The opaque handle type of this platform, which Vulkan on the same GPU and driver
    /// imports: [`HandleType::OpaqueFd`] on Linux, [`HandleType::OpaqueWin32`] on Windows.
    pub const OPAQUE: HandleType =
        if external::MEMORY_HANDLE.as_raw() == vk::ExternalMemoryHandleTypeFlags::OPAQUE_WIN32.as_raw() {
            HandleType::OpaqueWin32
        } else {
            HandleType::OpaqueFd
        };

    pub(crate) fn to_vk(self) -> vk::ExternalMemoryHandleTypeFlags {
        match self {
            HandleType::OpaqueFd => vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD,
            HandleType::OpaqueWin32 => vk::ExternalMemoryHandleTypeFlags::OPAQUE_WIN32,
            HandleType::DmaBuf => vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT,
        }
    }

    /// The Vulkan bit value, as stored in [`GpuExportDesc::handle_type`](super::GpuExportDesc::handle_type).
    pub fn to_raw(self) -> u32 {
        self.to_vk().as_raw()
    }

    pub fn from_raw(raw: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.to_raw() == raw)
    }

    /// `OPAQUE_FD`, `OPAQUE_WIN32` or `DMA_BUF`, as Vulkan names the handle types.
    pub fn as_str(self) -> &'static str {
        match self {
            HandleType::OpaqueFd => "OPAQUE_FD",
            HandleType::OpaqueWin32 => "OPAQUE_WIN32",
            HandleType::DmaBuf => "DMA_BUF",
        }
    }
}

impl fmt::Display for HandleType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The handle types in `flags` by name (`OPAQUE_FD|DMA_BUF`), for messages.
pub(crate) fn describe_handle_types(flags: vk::ExternalMemoryHandleTypeFlags) -> String {
    let mut names: Vec<String> =
        HandleType::ALL.into_iter().filter(|h| flags.contains(h.to_vk())).map(|h| h.as_str().to_string()).collect();
    let rest = flags.as_raw() & !HandleType::ALL.into_iter().fold(0, |all, h| all | h.to_raw());
    if rest != 0 {
        names.push(format!("unknown handle types {rest:#x}"));
    }
    if names.is_empty() {
        "no handle type".into()
    } else {
        names.join("|")
    }
}

/// The identity of an arena, unique across the processes of a host: the exporting process's
/// pid, a random token drawn once per process (pids are reused), and a per-process counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArenaId {
    pub exporter_pid: u32,
    pub token: u64,
    pub counter: u64,
}

impl ArenaId {
    pub(crate) fn new_local() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        ArenaId {
            exporter_pid: std::process::id(),
            token: process_token(),
            counter: COUNTER.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl fmt::Display for ArenaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:016x}-{}", self.exporter_pid, self.token, self.counter)
    }
}

/// Where an arena's memory came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArenaOrigin {
    /// Allocated here, shared by many buffers.
    Pooled,
    /// Allocated here for one (large) buffer.
    Own,
    /// Imported from another process's export.
    Imported,
    /// A host pointer imported through `VK_EXT_external_memory_host`.
    HostPointer,
}

pub(crate) struct Arena {
    pub(crate) device: VulkanDevice,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) size: u64,
    pub(crate) memory_type_index: u32,
    pub(crate) property_flags: vk::MemoryPropertyFlags,
    pub(crate) kind: GpuMemoryKind,
    pub(crate) id: ArenaId,
    /// The handle types it can be exported as (empty: not exportable).
    pub(crate) handle_types: vk::ExternalMemoryHandleTypeFlags,
    /// For a dedicated allocation: the one buffer it may be bound to, owned by the arena.
    pub(crate) dedicated_buffer: Option<vk::Buffer>,
    pub(crate) origin: ArenaOrigin,
    /// For arenas imported from the platform's opaque handle (an opaque fd, an opaque NT
    /// handle): a duplicate of that handle, taken before Vulkan took the original, so that the memory can be exported again (to CUDA, or to another
    /// process); closed when the arena drops.
    pub(crate) reexport_fd: Option<OwnedHandle>,
    /// Base of the persistent mapping of the whole arena; null until first mapped.
    mapped: AtomicPtr<u8>,
    map_lock: Mutex<()>,
    pub(crate) free: Mutex<Suballocator>,
    /// The memory imported into CUDA, for copies by CUDA; made at the first such copy.
    cuda: OnceLock<std::result::Result<CudaArena, String>>,
    /// See [`ArenaParts::counted`].
    counted: Option<Arc<AtomicU64>>,
}

pub(crate) struct ArenaParts {
    pub memory: vk::DeviceMemory,
    pub size: u64,
    pub memory_type_index: u32,
    pub kind: GpuMemoryKind,
    pub id: ArenaId,
    pub handle_types: vk::ExternalMemoryHandleTypeFlags,
    pub dedicated_buffer: Option<vk::Buffer>,
    pub origin: ArenaOrigin,
    /// For host-pointer arenas: the host memory itself serves as the mapping.
    pub host_pointer: Option<NonNull<u8>>,
    /// See [`Arena::reexport_fd`].
    pub reexport_fd: Option<OwnedHandle>,
    /// The allocator's count of live bytes ([`GpuAllocator::allocated_bytes`]), which the
    /// arena's memory is part of until it is freed; `None` for memory no allocator made.
    ///
    /// [`GpuAllocator::allocated_bytes`]: super::GpuAllocator::allocated_bytes
    pub counted: Option<Arc<AtomicU64>>,
}

impl Arena {
    /// Takes ownership of the memory (and dedicated buffer) in `parts`.
    pub(crate) fn new(device: &VulkanDevice, parts: ArenaParts) -> Self {
        let property_flags = device.memory_type_flags(parts.memory_type_index).unwrap_or_default();
        let free = Suballocator::new(if parts.origin == ArenaOrigin::Pooled { parts.size } else { 0 });
        if let Some(live) = &parts.counted {
            live.fetch_add(parts.size, Ordering::Relaxed);
        }
        Arena {
            device: device.clone(),
            memory: parts.memory,
            size: parts.size,
            memory_type_index: parts.memory_type_index,
            property_flags,
            kind: parts.kind,
            id: parts.id,
            handle_types: parts.handle_types,
            dedicated_buffer: parts.dedicated_buffer,
            origin: parts.origin,
            reexport_fd: parts.reexport_fd,
            mapped: AtomicPtr::new(parts.host_pointer.map_or(std::ptr::null_mut(), |p| p.as_ptr())),
            map_lock: Mutex::new(()),
            free: Mutex::new(free),
            cuda: OnceLock::new(),
            counted: parts.counted,
        }
    }

    /// A new handle (fd, NT handle) of the arena's memory as `handle`: the memory's own export
    /// where it was allocated exportable as that type, a copy of the handle it was imported from
    /// for memory imported from the platform's opaque handle. Errors say why the arena cannot be
    /// exported so.
    pub(crate) fn export_fd(&self, handle: HandleType) -> Result<OwnedHandle> {
        let fd = if self.handle_types.contains(handle.to_vk()) {
            let what = format!("arena {} as {handle}", self.id);
            // SAFETY: the memory is live and was allocated exportable as this handle type.
            unsafe { external::export_memory(&self.device.shared.memory_export, self.memory, handle.to_vk(), &what) }?
        } else if let (Some(kept), true) = (&self.reexport_fd, handle == HandleType::OPAQUE) {
            kept.try_clone().map_err(|e| {
                Error::os(
                    format!(
                        "duplicating the {} of imported arena {} to export it again",
                        external::HANDLE_NAME,
                        self.id
                    ),
                    e,
                )
            })?
        } else if self.handle_types.is_empty() && self.reexport_fd.is_none() {
            return Err(Error::InvalidState(format!(
                "buffer in arena {} is not exportable: it was allocated without export, imported \
                 from a dma-buf, or is host memory imported into the GPU",
                self.id
            )));
        } else {
            let offered = if self.reexport_fd.is_some() {
                format!("{} (memory imported from an {})", HandleType::OPAQUE, external::HANDLE_NAME)
            } else {
                describe_handle_types(self.handle_types)
            };
            return Err(Error::Unsupported(format!(
                "arena {} is exportable as {offered}, not as {handle} (the device does not offer it)",
                self.id
            )));
        };
        Ok(fd)
    }

    /// The arena imported into CUDA, made at the first call (see [`CudaArena`]); a failure is
    /// kept, and said again by every later call.
    pub(crate) fn cuda(&self) -> std::result::Result<&CudaArena, &str> {
        self.cuda
            .get_or_init(|| {
                let why = |e: Error| match e {
                    Error::Unsupported(why) => why,
                    e => e.to_string(),
                };
                let fd = self.export_fd(HandleType::OPAQUE).map_err(why)?;
                let uuid = self.device.info().device_uuid;
                CudaArena::import(fd, self.size, self.dedicated_buffer.is_some(), uuid).map_err(why)
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Whether the host may access the memory itself (host-visible memory, or a host pointer
    /// imported whatever its type's flags): GPU writes to it must be made visible to the host.
    pub(crate) fn host_accessible(&self) -> bool {
        self.origin == ArenaOrigin::HostPointer || self.property_flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
    }

    /// Host-visible and coherent: the host may write it through a mapping with no flush. For
    /// the GPU's own memory behind a resizable BAR, only writes go at the bus's speed.
    pub(crate) fn host_writable(&self) -> bool {
        self.property_flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT)
    }

    /// Host-writable, and readable by the host at memory speed: host memory, or device memory
    /// the host caches (a CPU driver's). Reads of uncached device memory through the BAR
    /// crawl, so that memory is not offered for mapping.
    pub(crate) fn host_mappable(&self) -> bool {
        use vk::MemoryPropertyFlags as F;
        self.host_writable()
            && (self.property_flags.contains(F::HOST_CACHED) || !self.property_flags.contains(F::DEVICE_LOCAL))
    }

    /// The base of a persistent mapping of the whole arena, made on first use.
    pub(crate) fn map(&self) -> Result<NonNull<u8>> {
        if let Some(p) = NonNull::new(self.mapped.load(Ordering::Acquire)) {
            return Ok(p);
        }
        if !self.host_writable() {
            return Err(Error::InvalidState(format!(
                "arena {} (memory type {} {}) is not host-visible and coherent, so it cannot be mapped; \
                 use write/read, which stage through host-visible memory",
                self.id,
                self.memory_type_index,
                super::device::describe_memory_flags(self.property_flags.as_raw())
            )));
        }
        let _guard = self.map_lock.lock();
        if let Some(p) = NonNull::new(self.mapped.load(Ordering::Acquire)) {
            return Ok(p);
        }
        // SAFETY: the memory is host-visible, not mapped yet (checked under map_lock, which
        // serialises vkMapMemory on this memory object) and lives as long as self.
        let ptr = unsafe {
            self.device.shared.device.map_memory(self.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
        }
        .map_err(vk_err(&format!("vkMapMemory of arena {} ({} bytes)", self.id, self.size)))?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::Vulkan(format!("vkMapMemory of arena {} returned NULL", self.id)))?;
        self.mapped.store(ptr.as_ptr(), Ordering::Release);
        Ok(ptr)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let device = &self.device.shared.device;
        // SAFETY: the arena is the last user of its memory: every buffer bound to it held an
        // Arc to it and is gone, and the device is alive (self.device). No GPU work uses the
        // memory any more: transfers wait for their fence before returning.
        unsafe {
            if let Some(buffer) = self.dedicated_buffer {
                device.destroy_buffer(buffer, None);
            }
            if !self.mapped.load(Ordering::Acquire).is_null() && self.origin != ArenaOrigin::HostPointer {
                device.unmap_memory(self.memory);
            }
            device.free_memory(self.memory, None);
        }
        if let Some(live) = &self.counted {
            live.fetch_sub(self.size, Ordering::Relaxed);
        }
    }
}

/// Allocates `size` bytes of memory type `type_index`, exportable as `handle_types` (none:
/// not exportable), dedicated to `dedicated` if given.
pub(crate) fn allocate_memory(
    device: &VulkanDevice,
    size: u64,
    type_index: u32,
    handle_types: vk::ExternalMemoryHandleTypeFlags,
    dedicated: Option<vk::Buffer>,
) -> Result<vk::DeviceMemory> {
    let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(handle_types);
    let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default();
    let mut info = vk::MemoryAllocateInfo::default().allocation_size(size).memory_type_index(type_index);
    if !handle_types.is_empty() {
        info = info.push_next(&mut export);
    }
    if let Some(buffer) = dedicated {
        dedicated_info = dedicated_info.buffer(buffer);
        info = info.push_next(&mut dedicated_info);
    }
    // SAFETY: the allocate info chain is live for the call; the type index is one of the
    // device's (chosen from its memory properties).
    unsafe { device.shared.device.allocate_memory(&info, None) }.map_err(vk_err(&format!(
        "vkAllocateMemory({size} bytes, memory type {type_index}, export as {})",
        describe_handle_types(handle_types)
    )))
}

/// A buffer and what it needs from memory.
pub(crate) struct NewBuffer {
    pub buffer: vk::Buffer,
    pub requirements: vk::MemoryRequirements,
    /// The driver requires a dedicated allocation for it.
    pub requires_dedicated: bool,
}

/// Creates a buffer of `size` bytes with lava-flow's usage, for memory of `handle_types`.
pub(crate) fn create_buffer(
    device: &VulkanDevice,
    size: u64,
    handle_types: vk::ExternalMemoryHandleTypeFlags,
) -> Result<NewBuffer> {
    let ash_device = &device.shared.device;
    let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle_types);
    let mut info =
        vk::BufferCreateInfo::default().size(size).usage(BUFFER_USAGE).sharing_mode(vk::SharingMode::EXCLUSIVE);
    if !handle_types.is_empty() {
        info = info.push_next(&mut external);
    }
    // SAFETY: the create info chain is live for the call.
    let buffer =
        unsafe { ash_device.create_buffer(&info, None) }.map_err(vk_err(&format!("vkCreateBuffer({size} bytes)")))?;
    let mut dedicated = vk::MemoryDedicatedRequirements::default();
    let mut requirements = vk::MemoryRequirements2::default().push_next(&mut dedicated);
    let query = vk::BufferMemoryRequirementsInfo2::default().buffer(buffer);
    // SAFETY: buffer is live; the output chain is live for the call (Vulkan 1.1 core).
    unsafe { ash_device.get_buffer_memory_requirements2(&query, &mut requirements) };
    let requirements = requirements.memory_requirements;
    Ok(NewBuffer { buffer, requirements, requires_dedicated: dedicated.requires_dedicated_allocation == vk::TRUE })
}

pub(crate) fn destroy_buffer(device: &VulkanDevice, buffer: vk::Buffer) {
    // SAFETY: callers pass a buffer they own that no pending GPU work uses.
    unsafe { device.shared.device.destroy_buffer(buffer, None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_type_sets_print_by_their_vulkan_names() {
        let both = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD | vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT;
        assert_eq!(describe_handle_types(both), "OPAQUE_FD|DMA_BUF");
        assert_eq!(describe_handle_types(vk::ExternalMemoryHandleTypeFlags::empty()), "no handle type");
        let win32 =
            vk::ExternalMemoryHandleTypeFlags::OPAQUE_WIN32 | vk::ExternalMemoryHandleTypeFlags::from_raw(1 << 20);
        assert_eq!(describe_handle_types(win32), "OPAQUE_WIN32|unknown handle types 0x100000");
    }

    /// An export names its handle type by Vulkan's bit; every type lava-flow knows reads back as
    /// itself, and the platform's opaque type is the one its allocator exports.
    #[test]
    fn handle_types_round_trip_and_the_opaque_one_is_the_platforms() {
        for handle in HandleType::ALL {
            assert_eq!(HandleType::from_raw(handle.to_raw()), Some(handle));
        }
        assert_eq!(HandleType::from_raw(vk::ExternalMemoryHandleTypeFlags::OPAQUE_WIN32_KMT.as_raw()), None);
        assert_eq!(HandleType::OPAQUE.to_vk(), external::MEMORY_HANDLE);
        #[cfg(unix)]
        assert_eq!(HandleType::OPAQUE, HandleType::OpaqueFd);
        #[cfg(windows)]
        assert_eq!(HandleType::OPAQUE, HandleType::OpaqueWin32);
    }

    #[test]
    fn arena_ids_are_unique_and_carry_the_pid() {
        let a = ArenaId::new_local();
        let b = ArenaId::new_local();
        assert_ne!(a, b);
        assert_eq!(a.exporter_pid, std::process::id());
        assert_eq!(a.token, b.token);
        assert_ne!(a.token, 0);
    }
}
