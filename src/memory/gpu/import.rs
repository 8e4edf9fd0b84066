//! Importing another process's export on this process's own device.
//!
//! Rules, each a lesson from drivers and UCX:
//! - The metadata is validated in full before Vulkan sees it; a device or driver UUID that
//!   differs from ours is a clear error, never an attempt (importing opaque memory on another
//!   GPU or driver is undefined behaviour).
//! - An arena is imported once per device: the cache is keyed by the exporter's [`ArenaId`];
//!   a second import of the same arena closes its (redundant) fd and binds the new buffer to
//!   the memory already imported.
//! - Vulkan owns an imported fd only after `vkAllocateMemory` succeeds; on every other path
//!   the fd stays an `OwnedFd` here and is closed when it drops, unless the driver closed it
//!   already (Mesa's lavapipe closes the fd of a failed import). On Windows the importer keeps
//!   the NT handle on every path and closes it once the import is done. (The platform's side
//!   of it, with the memfd rule below, is `device::external`.)
//! - A memfd (lavapipe's exports) is imported through a description of its own: the driver
//!   reads the memfd's header at its file position, which the copies of one export that several
//!   processes received share, so that their imports at the same moment would race.
//! - Imported buffers hold the arena; its memory is freed when the last one goes.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use ash::vk;
use parking_lot::Mutex;

use super::allocator::GpuBuffer;
use super::arena::{self, Arena, ArenaId, ArenaOrigin, ArenaParts, HandleType};
use super::device::{describe_memory_flags, external, format_uuid, vk_err, DeviceState, VulkanDevice};
use super::export::{GpuExport, GpuExportDesc};
use crate::error::{Error, Result};
use crate::os::OwnedHandle;

/// Imports exports on one device. Importers of the same device share one cache.
#[derive(Clone, Debug)]
pub struct GpuImporter {
    device: VulkanDevice,
    cache: Arc<ImportCache>,
}

/// The arenas imported on a device, by exporter id, so that one arena is imported once: one
/// cache per device, kept on it.
#[derive(Debug, Default)]
struct ImportCache(Mutex<HashMap<ArenaId, Weak<Arena>>>);

impl DeviceState for ImportCache {
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl GpuImporter {
    pub fn new(device: &VulkanDevice) -> Self {
        let cache = match device.state(|_| Ok(ImportCache::default())) {
            Ok(cache) => cache,
            Err(e) => unreachable!("making an empty import cache cannot fail: {e}"),
        };
        GpuImporter { device: device.clone(), cache }
    }

    pub fn device(&self) -> &VulkanDevice {
        &self.device
    }

    /// Imports `export` and returns a buffer of `export.desc.size` bytes bound at its offset.
    /// The fd is consumed on every path (owned by Vulkan, or closed).
    pub fn import(&self, export: GpuExport) -> Result<GpuBuffer> {
        let GpuExport { desc, fd } = export;
        self.check(&desc)?;
        let handle = desc.handle().expect("validated");
        let id = desc.arena_id();

        let arena = {
            let mut cache = self.cache.0.lock();
            cache.retain(|_, arena| arena.strong_count() > 0);
            match cache.get(&id).and_then(|weak| weak.upgrade()) {
                Some(arena) => {
                    drop(fd);
                    arena
                }
                None => {
                    let arena = Arc::new(self.import_arena(&desc, handle, fd)?);
                    cache.insert(id, Arc::downgrade(&arena));
                    arena
                }
            }
        };
        // The cache lock is released: dropping `arena` on an error below may free the memory.
        if arena.size != desc.arena_size
            || arena.memory_type_index != desc.memory_type_index
            || arena.dedicated_buffer.is_some() != desc.is_dedicated()
        {
            return Err(Error::invalid(format!(
                "{desc} contradicts the earlier import of the same arena ({} bytes, memory type {}, dedicated {})",
                arena.size,
                arena.memory_type_index,
                arena.dedicated_buffer.is_some()
            )));
        }
        if let Some(dedicated) = arena.dedicated_buffer {
            // The dedicated buffer spans the whole allocation; this buffer starts at the
            // export's offset in it (validate() checked offset + size <= arena size).
            return Ok(GpuBuffer {
                arena,
                buffer: dedicated,
                owns_buffer: false,
                offset: desc.offset,
                vk_offset: desc.offset,
                size: desc.size,
                range: None,
                pool: None,
            });
        }
        // A buffer at an offset that is not a multiple of the buffer alignment (an export of
        // part of a buffer) is bound at the aligned offset below and starts `vk_offset` in.
        let probe = arena::create_buffer(&self.device, desc.size, handle.to_vk())?;
        let align = probe.requirements.alignment.max(1);
        let vk_offset = desc.offset % align;
        let new = if vk_offset == 0 {
            probe
        } else {
            arena::destroy_buffer(&self.device, probe.buffer);
            arena::create_buffer(&self.device, vk_offset + desc.size, handle.to_vk())?
        };
        let requirements = new.requirements;
        let bind_at = desc.offset - vk_offset;
        let problem = if requirements.memory_type_bits & (1 << desc.memory_type_index) == 0 {
            Some(format!(
                "a buffer of {} bytes may not live in memory type {} here (allowed: {:#x})",
                desc.size, desc.memory_type_index, requirements.memory_type_bits
            ))
        } else if bind_at % requirements.alignment.max(1) != 0 {
            Some(format!("offset {bind_at} is not a multiple of the buffer alignment {}", requirements.alignment))
        } else if bind_at.checked_add(requirements.size).map_or(true, |end| end > desc.arena_size) {
            Some(format!(
                "the buffer needs {} bytes at offset {bind_at}, past the arena's end ({} bytes)",
                requirements.size, desc.arena_size
            ))
        } else {
            None
        };
        let buffer = GpuBuffer {
            arena,
            buffer: new.buffer,
            owns_buffer: true,
            offset: desc.offset,
            vk_offset,
            size: desc.size,
            range: None,
            pool: None,
        };
        if let Some(problem) = problem {
            return Err(Error::invalid(format!("cannot import {desc}: {problem}")));
        }
        buffer.bind()?;
        Ok(buffer)
    }

    /// Imports memory that another API exported as an opaque fd (a CUDA VMM piece, from
    /// `cuMemExportToShareableHandle`): `size` bytes of this device's DEVICE_LOCAL memory, named
    /// `id` in the import cache (the exporter's process and what identifies the memory there).
    /// The exporter must be this device (NVIDIA's Vulkan deviceUUID is the CUDA device's UUID),
    /// which the caller checked. The fd is consumed on every path.
    pub fn import_foreign_opaque_fd(&self, fd: OwnedHandle, size: u64, id: ArenaId) -> Result<GpuBuffer> {
        let handle = HandleType::OPAQUE;
        let probe = arena::create_buffer(&self.device, size, handle.to_vk())?;
        arena::destroy_buffer(&self.device, probe.buffer);
        let device_local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let Some(memory_type_index) = self.device.find_memory_type(
            probe.requirements.memory_type_bits,
            device_local,
            &[],
            vk::MemoryPropertyFlags::HOST_VISIBLE,
        ) else {
            return Err(Error::Unsupported(format!(
                "Vulkan device {} has no DEVICE_LOCAL memory type for imported {}s (allowed: {:#x})",
                self.device.info().name,
                external::HANDLE_NAME,
                probe.requirements.memory_type_bits
            )));
        };
        let flags = self.device.memory_type_flags(memory_type_index).expect("found above");
        let dedicated = probe.requires_dedicated || self.device.info().opaque_fd.dedicated_only;
        let info = self.device.info();
        let desc = GpuExportDesc {
            magic: super::export::GPU_EXPORT_MAGIC,
            version: super::export::GPU_EXPORT_VERSION,
            handle_type: handle.to_raw(),
            memory_type_index,
            memory_property_flags: flags.as_raw(),
            flags: if dedicated { super::export::GPU_EXPORT_DEDICATED } else { 0 },
            kind: super::arena::GpuMemoryKind::DeviceLocal.to_raw(),
            exporter_pid: id.exporter_pid,
            arena_token: id.token,
            arena_counter: id.counter,
            arena_size: size,
            offset: 0,
            size,
            device_uuid: info.device_uuid,
            driver_uuid: info.driver_uuid,
        };
        self.import(GpuExport { desc, fd })
    }

    /// How many imported arenas are alive on this device.
    pub fn cached_arenas(&self) -> usize {
        self.cache.0.lock().values().filter(|a| a.strong_count() > 0).count()
    }

    /// Everything that must hold before Vulkan sees the export.
    fn check(&self, desc: &GpuExportDesc) -> Result<()> {
        desc.validate()?;
        let info = self.device.info();
        if desc.device_uuid != info.device_uuid || desc.driver_uuid != info.driver_uuid {
            return Err(Error::Unsupported(format!(
                "{desc} comes from another GPU or driver: this process uses device {} ({}) with \
                 deviceUUID {} and driverUUID {}; open the same GPU (LF_VULKAN_DEVICE=<deviceUUID>) \
                 with the same driver in both processes, or copy through host memory",
                info.index,
                info.name,
                format_uuid(&info.device_uuid),
                format_uuid(&info.driver_uuid)
            )));
        }
        let handle = desc.handle().expect("validated");
        // Another platform's opaque handle type is never importable here.
        let enabled = match handle {
            HandleType::DmaBuf => info.dma_buf.importable,
            opaque => opaque == HandleType::OPAQUE && info.opaque_fd.importable,
        };
        if !enabled {
            return Err(Error::Unsupported(format!(
                "Vulkan device {} ({}) cannot import {handle} memory",
                info.index, info.name
            )));
        }
        let Some(flags) = self.device.memory_type_flags(desc.memory_type_index) else {
            return Err(Error::invalid(format!(
                "{desc}: memory type {} does not exist here ({} types)",
                desc.memory_type_index,
                self.device.memory_type_count()
            )));
        };
        if flags.as_raw() != desc.memory_property_flags {
            return Err(Error::invalid(format!(
                "{desc}: memory type {} is {} here but {} for the exporter",
                desc.memory_type_index,
                describe_memory_flags(flags.as_raw()),
                describe_memory_flags(desc.memory_property_flags)
            )));
        }
        Ok(())
    }

    fn import_arena(&self, desc: &GpuExportDesc, handle: HandleType, fd: OwnedHandle) -> Result<Arena> {
        let device = &self.device;
        // A copy of the platform's opaque handle, taken before Vulkan takes the original, so
        // that the memory can be exported again (dma-bufs are not: their exporter is not Vulkan).
        let reexport_fd = if handle == HandleType::OPAQUE {
            Some(fd.try_clone().map_err(|e| {
                Error::os(format!("duplicating the {} of {desc} (to export it again later)", external::HANDLE_NAME), e)
            })?)
        } else {
            None
        };
        // The exporter's dedicated buffer spans the whole allocation (see the allocator), and
        // the import of a dedicated allocation needs an identical buffer.
        let dedicated = if desc.is_dedicated() {
            Some(arena::create_buffer(device, desc.arena_size, handle.to_vk())?.buffer)
        } else {
            None
        };
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default();
        let mut info = vk::MemoryAllocateInfo::default()
            .allocation_size(desc.arena_size)
            .memory_type_index(desc.memory_type_index);
        if let Some(buffer) = dedicated {
            dedicated_info = dedicated_info.buffer(buffer);
            info = info.push_next(&mut dedicated_info);
        }
        let ash_device = &device.shared.device;
        // SAFETY: the chain is live; the UUIDs, memory type and sizes were checked against
        // this device above, which is what the spec requires of an opaque import.
        let memory = match unsafe {
            external::import_memory(ash_device, &device.shared.memory_export, info, handle.to_vk(), fd, desc)
        } {
            Ok(memory) => memory,
            Err(e) => {
                if let Some(buffer) = dedicated {
                    arena::destroy_buffer(device, buffer);
                }
                return Err(e);
            }
        };
        if let Some(buffer) = dedicated {
            // SAFETY: both are live, the memory was allocated dedicated to this buffer.
            if let Err(r) = unsafe { ash_device.bind_buffer_memory(buffer, memory, 0) } {
                // SAFETY: nothing else uses either object yet.
                unsafe {
                    ash_device.destroy_buffer(buffer, None);
                    ash_device.free_memory(memory, None);
                }
                return Err(vk_err(&format!("binding the dedicated buffer of {desc}"))(r));
            }
        }
        Ok(Arena::new(
            device,
            ArenaParts {
                memory,
                size: desc.arena_size,
                memory_type_index: desc.memory_type_index,
                kind: desc.kind().expect("validated"),
                id: desc.arena_id(),
                handle_types: vk::ExternalMemoryHandleTypeFlags::empty(),
                dedicated_buffer: dedicated,
                origin: ArenaOrigin::Imported,
                host_pointer: None,
                reexport_fd,
                counted: None,
            },
        ))
    }
}
