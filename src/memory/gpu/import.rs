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
//!   already (Mesa's lavapipe closes the fd of a failed import).
//! - A memfd (lavapipe's exports) is imported through a description of its own: the driver
//!   reads the memfd's header at its file position, which the copies of one export that several
//!   processes received share, so that their imports at the same moment would race.
//! - Imported buffers hold the arena; its memory is freed when the last one goes.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::{Arc, Weak};

use ash::vk;
use parking_lot::Mutex;

use super::allocator::GpuBuffer;
use super::arena::{self, Arena, ArenaId, ArenaOrigin, ArenaParts, HandleType};
use super::device::{describe_memory_flags, format_uuid, vk_err, DeviceState, VulkanDevice};
use super::export::{GpuExport, GpuExportDesc};
use crate::error::{Error, Result};

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
    pub fn import_foreign_opaque_fd(&self, fd: OwnedFd, size: u64, id: ArenaId) -> Result<GpuBuffer> {
        let handle = HandleType::OpaqueFd;
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
                "Vulkan device {} has no DEVICE_LOCAL memory type for imported opaque fds (allowed: {:#x})",
                self.device.info().name,
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
        let enabled = match handle {
            HandleType::OpaqueFd => info.opaque_fd.importable,
            HandleType::DmaBuf => info.dma_buf.importable,
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

    fn import_arena(&self, desc: &GpuExportDesc, handle: HandleType, fd: OwnedFd) -> Result<Arena> {
        let device = &self.device;
        let ash_device = &device.shared.device;
        if handle == HandleType::DmaBuf {
            // Only dma-bufs can be asked which memory types they fit (not opaque fds).
            let mut props = vk::MemoryFdPropertiesKHR::default();
            // SAFETY: fd is a live descriptor; the query does not take ownership.
            unsafe { device.shared.memory_fd.get_memory_fd_properties(handle.to_vk(), fd.as_raw_fd(), &mut props) }
                .map_err(vk_err("vkGetMemoryFdPropertiesKHR"))?;
            if props.memory_type_bits & (1 << desc.memory_type_index) == 0 {
                return Err(Error::invalid(format!(
                    "{desc}: the dma-buf does not fit memory type {} (fits {:#x})",
                    desc.memory_type_index, props.memory_type_bits
                )));
            }
        }
        // A copy of an opaque fd, taken before Vulkan takes the original, so that the memory
        // can be exported again (dma-bufs are not: their exporter is not Vulkan).
        let reexport_fd = if handle == HandleType::OpaqueFd {
            // SAFETY: fd is a live descriptor; F_DUPFD_CLOEXEC makes a new one (or fails) and
            // touches nothing else.
            let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
            if raw < 0 {
                return Err(Error::os(
                    format!("duplicating the fd of {desc} (to export it again later)"),
                    std::io::Error::last_os_error(),
                ));
            }
            // SAFETY: fcntl returned a new descriptor that nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(raw) })
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
        let fd = own_position(fd);
        let named = file_id(fd.as_raw_fd());
        let mut import = vk::ImportMemoryFdInfoKHR::default().handle_type(handle.to_vk()).fd(fd.as_raw_fd());
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default();
        let mut info = vk::MemoryAllocateInfo::default()
            .allocation_size(desc.arena_size)
            .memory_type_index(desc.memory_type_index)
            .push_next(&mut import);
        if let Some(buffer) = dedicated {
            dedicated_info = dedicated_info.buffer(buffer);
            info = info.push_next(&mut dedicated_info);
        }
        // SAFETY: the chain is live; the UUIDs, memory type and sizes were checked against
        // this device above, which is what the spec requires of an opaque-fd import.
        let memory = match unsafe { ash_device.allocate_memory(&info, None) } {
            Ok(memory) => {
                // Vulkan owns the descriptor now and closes it when the memory is freed.
                let _ = fd.into_raw_fd();
                memory
            }
            Err(r) => {
                if let Some(buffer) = dedicated {
                    arena::destroy_buffer(device, buffer);
                }
                // A failed import leaves the descriptor with us, but lavapipe closes it: closed
                // here only if its number still names the file it named.
                let raw = fd.into_raw_fd();
                if named.is_some() && file_id(raw) == named {
                    // SAFETY: `raw` is the descriptor given up above, still open on that file.
                    drop(unsafe { OwnedFd::from_raw_fd(raw) });
                }
                return Err(vk_err(&format!("importing {desc} (vkAllocateMemory)"))(r));
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

/// `fd`, or, where it is a memfd, a new description of the same memory with a file position of
/// its own (opened through `/proc/self/fd`); `fd` itself where that cannot be done.
fn own_position(fd: OwnedFd) -> OwnedFd {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if !std::fs::read_link(&path).is_ok_and(|target| target.to_string_lossy().starts_with("/memfd:")) {
        return fd;
    }
    match std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&path) {
        Ok(file) => file.into(),
        Err(_) => fd,
    }
}

/// The file that descriptor `raw` names (device and inode), `None` where it names none.
fn file_id(raw: std::os::fd::RawFd) -> Option<(u64, u64)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `stat` into the buffer given, whatever `raw` is (EBADF otherwise).
    if unsafe { libc::fstat(raw, stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    // (`st_dev` is signed on macOS.)
    #[allow(clippy::unnecessary_cast)]
    Some((stat.st_dev as u64, stat.st_ino as u64))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::own_position;
    use crate::os::{shm, ShmOptions};

    /// The copies of one export share a file position; the memfd an import reads gets its own,
    /// on the same memory.
    #[test]
    fn a_memfd_is_imported_through_a_position_of_its_own() {
        let memfd = shm::create("lf-import-test", 4096, ShmOptions::default()).unwrap();
        let copy = memfd.try_clone().unwrap();
        let own = own_position(copy);
        // SAFETY: lseek on descriptors this test owns.
        let (moved, position) = unsafe {
            (libc::lseek(memfd.as_raw_fd(), 100, libc::SEEK_SET), libc::lseek(own.as_raw_fd(), 0, libc::SEEK_CUR))
        };
        assert_eq!((moved, position), (100, 0), "the imported descriptor moved with the exporter's");
        // SAFETY: as above; the other file's size says it is the same memory.
        let size = unsafe { libc::lseek(own.as_raw_fd(), 0, libc::SEEK_END) };
        assert_eq!(size, 4096);
        // A descriptor that is no memfd is kept as it is.
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let raw = file.as_raw_fd();
        assert_eq!(own_position(file.into()).as_raw_fd(), raw);
    }
}
