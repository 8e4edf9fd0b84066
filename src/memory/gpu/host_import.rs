//! GPU-pinned host memory through `VK_EXT_external_memory_host`: a range of this process's
//! memory (e.g. an mlock'd CPU buffer) becomes a `VkBuffer` the GPU copies from and to
//! directly, with no staging.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;

use super::allocator::GpuBuffer;
use super::arena::{self, Arena, ArenaId, ArenaOrigin, ArenaParts, GpuMemoryKind};
use super::device::{vk_err, VulkanDevice};
use crate::error::{Error, Result};

/// Host memory registered with a Vulkan device; unregistered (the `VkDeviceMemory` freed) on
/// drop. The memory itself stays the caller's.
pub struct HostMemoryImport {
    buffer: GpuBuffer,
}

impl fmt::Debug for HostMemoryImport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMemoryImport").field("buffer", &self.buffer).finish()
    }
}

impl HostMemoryImport {
    /// A GPU buffer over the host range: use it with [`super::copy_buffer`], `read`, `write`.
    pub fn buffer(&self) -> &GpuBuffer {
        &self.buffer
    }

    pub fn len(&self) -> u64 {
        self.buffer.size()
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.size() == 0
    }
}

/// Registers `[ptr, ptr + len)` with `device`. `ptr` and `len` must be multiples of
/// `DeviceInfo::min_imported_host_pointer_alignment` (the page size on common drivers).
///
/// Errors: `Unsupported` where the device lacks `VK_EXT_external_memory_host`,
/// `InvalidArgument` for a misaligned or empty range.
///
/// # Safety
/// The range must be mapped, readable and writable memory of this process that stays mapped
/// (not unmapped, not remapped) until the returned guard and every copy through it are done.
pub unsafe fn import_host_memory(device: &VulkanDevice, ptr: *mut u8, len: usize) -> Result<HostMemoryImport> {
    // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
    // the unsafe operations below rely on.
    unsafe {
        let info = device.info();
        let (Some(host), Some(align)) = (device.shared.memory_host.as_ref(), info.min_imported_host_pointer_alignment)
        else {
            return Err(Error::Unsupported(format!(
                "Vulkan device {} ({}) does not offer VK_EXT_external_memory_host; pin host memory with \
                 CUDA (cuda_host_register) or copy through a HOST_VISIBLE GPU buffer",
                info.index, info.name
            )));
        };
        let Some(base) = NonNull::new(ptr) else {
            return Err(Error::invalid("host pointer to import is NULL"));
        };
        let align = align.max(1);
        if len == 0 || (ptr as u64) % align != 0 || (len as u64) % align != 0 {
            return Err(Error::invalid(format!(
                "host range {ptr:p} + {len} bytes: address and length must be non-zero multiples of {align} \
                 (minImportedHostPointerAlignment of {})",
                info.name
            )));
        }
        let handle = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;
        let mut pointer_props = vk::MemoryHostPointerPropertiesEXT::default();
        // SAFETY: the pointer is a host allocation of this process (the caller's contract).
        (host.fp().get_memory_host_pointer_properties_ext)(
            device.shared.device.handle(),
            handle,
            ptr.cast_const().cast(),
            &mut pointer_props,
        )
        .result()
        .map_err(vk_err(&format!("vkGetMemoryHostPointerPropertiesEXT({ptr:p})")))?;

        let new = arena::create_buffer(device, len as u64, handle)?;
        use vk::MemoryPropertyFlags as F;
        let bits = new.requirements.memory_type_bits & pointer_props.memory_type_bits;
        let Some(type_index) = device.find_memory_type(
            bits,
            F::empty(),
            &[F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED, F::HOST_VISIBLE | F::HOST_COHERENT],
            F::empty(),
        ) else {
            arena::destroy_buffer(device, new.buffer);
            return Err(Error::Unsupported(format!(
                "no memory type of {} takes both this host pointer ({:#x}) and a buffer ({:#x})",
                info.name, pointer_props.memory_type_bits, new.requirements.memory_type_bits
            )));
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default().handle_type(handle).host_pointer(ptr.cast());
        let allocate = vk::MemoryAllocateInfo::default()
            .allocation_size(len as u64)
            .memory_type_index(type_index)
            .push_next(&mut import);
        // SAFETY: the chain is live; pointer and size are aligned as the extension requires and
        // the memory type accepts this pointer.
        let memory = match device.shared.device.allocate_memory(&allocate, None) {
            Ok(m) => m,
            Err(r) => {
                arena::destroy_buffer(device, new.buffer);
                return Err(vk_err(&format!("importing host memory {ptr:p} + {len} bytes"))(r));
            }
        };
        let arena = Arc::new(Arena::new(
            device,
            ArenaParts {
                memory,
                size: len as u64,
                memory_type_index: type_index,
                kind: GpuMemoryKind::HostVisible,
                id: ArenaId::new_local(),
                handle_types: vk::ExternalMemoryHandleTypeFlags::empty(),
                dedicated_buffer: None,
                origin: ArenaOrigin::HostPointer,
                host_pointer: Some(base),
                reexport_fd: None,
                counted: None,
            },
        ));
        let buffer = GpuBuffer {
            arena,
            buffer: new.buffer,
            owns_buffer: true,
            offset: 0,
            vk_offset: 0,
            size: len as u64,
            range: None,
            pool: None,
        };
        buffer.bind()?;
        Ok(HostMemoryImport { buffer })
    }
}
