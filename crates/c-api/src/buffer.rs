//! `lf_buffer`: a range of memory from lava-flow (allocated, imported or registered; CPU or
//! GPU), its properties (what it really is, why it fell back, which GPU APIs it is registered
//! with) and its release. Moving data in and out is in `buffer_io.rs`.
//!
//! Ownership: each `lf_buffer` is owned by the caller that received it from `lf_alloc`,
//! `lf_alloc_auto`, `lf_import` or `lf_register`, and released with `lf_free` (or
//! `lf_deregister` for registered memory). `lf_buffer_find` lends an existing handle; it does
//! not create one. Reading a buffer's properties from several threads at once is safe;
//! freeing it while another thread uses it is not.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::abi::c_enum;
use super::location::LF_UNSET;
use super::raw;
use super::status::lf_status;
use super::{boundary, boundary_void, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult};
use lava_flow::memory::location::code;
use lava_flow::memory::{Buffer, BufferId, BufferOrigin, DeviceRegistration};

/// Where memory lives: what `lf_alloc` is asked for, and what a buffer really is
/// (`lf_buffer_location`, `lf_export.location`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_memory_kind {
    /// Ordinary pageable memory.
    LF_MEMORY_CPU_STANDARD = 1,
    /// Memory bound to one NUMA node (`lf_alloc`'s `numa_node`).
    LF_MEMORY_CPU_NUMA = 2,
    /// Memory backed by 2 MiB huge pages.
    LF_MEMORY_CPU_HUGEPAGE_2MB = 3,
    /// Memory backed by 1 GiB huge pages.
    LF_MEMORY_CPU_HUGEPAGE_1GB = 4,
    /// Locked host memory registered with the GPU APIs present (`lf_buffer_registrations`).
    LF_MEMORY_CPU_GPU_PINNED = 5,
    /// GPU memory of the context's Vulkan device, fastest for the GPU.
    LF_MEMORY_GPU_DEVICE_LOCAL = 6,
    /// GPU memory the host can map.
    LF_MEMORY_GPU_HOST_VISIBLE = 7,
    /// CUDA device memory the application allocated and registered (`lf_register`); never
    /// allocated by lava-flow. `lf_buffer_cuda_kind` says which allocator made it and on which
    /// CUDA device.
    LF_MEMORY_CUDA_DEVICE = 8,
}
c_enum!(
    lf_memory_kind: LF_MEMORY_CPU_STANDARD,
    LF_MEMORY_CPU_NUMA,
    LF_MEMORY_CPU_HUGEPAGE_2MB,
    LF_MEMORY_CPU_HUGEPAGE_1GB,
    LF_MEMORY_CPU_GPU_PINNED,
    LF_MEMORY_GPU_DEVICE_LOCAL,
    LF_MEMORY_GPU_HOST_VISIBLE,
    LF_MEMORY_CUDA_DEVICE,
);

// The C values are the Rust core's codes.
const _: () = assert!(
    lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32 == code::CPU_STANDARD
        && lf_memory_kind::LF_MEMORY_CPU_NUMA as u32 == code::CPU_NUMA
        && lf_memory_kind::LF_MEMORY_CPU_HUGEPAGE_2MB as u32 == code::CPU_HUGEPAGE_2MB
        && lf_memory_kind::LF_MEMORY_CPU_HUGEPAGE_1GB as u32 == code::CPU_HUGEPAGE_1GB
        && lf_memory_kind::LF_MEMORY_CPU_GPU_PINNED as u32 == code::CPU_GPU_PINNED
        && lf_memory_kind::LF_MEMORY_GPU_DEVICE_LOCAL as u32 == code::GPU_DEVICE_LOCAL
        && lf_memory_kind::LF_MEMORY_GPU_HOST_VISIBLE as u32 == code::GPU_HOST_VISIBLE
        && lf_memory_kind::LF_MEMORY_CUDA_DEVICE as u32 == code::CUDA_DEVICE
);

/// How a buffer came to be (`lf_buffer_origin`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_origin {
    /// Allocated here (exportable).
    LF_ORIGIN_ALLOCATED = 1,
    /// The caller's memory, entered with `lf_register`.
    LF_ORIGIN_REGISTERED = 2,
    /// Imported from an export (`lf_import`): the exporter's memory.
    LF_ORIGIN_IMPORTED = 3,
    /// The caller's CUDA device memory, entered with `lf_register`: the whole CUDA allocation
    /// holding the pointer registered (`lf_buffer_cuda_kind` says which kind).
    LF_ORIGIN_CUDA = 4,
}

/// How CUDA memory was allocated, which decides how another process can reach it
/// (`lf_buffer_cuda_kind`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_cuda_kind {
    /// Not CUDA memory: every buffer whose origin is not LF_ORIGIN_CUDA.
    LF_CUDA_KIND_NONE = 0,
    /// `cudaMalloc`/`cuMemAlloc` memory (PyTorch's and CuPy's default allocators): only legacy
    /// CUDA IPC handles reach it.
    LF_CUDA_KIND_LEGACY = 1,
    /// CUDA VMM memory (`cuMemCreate`) with POSIX fd handles (PyTorch under
    /// `expandable_segments:True`): the registration is one piece of it, or the span of the
    /// pieces mapped back to back that the registered range covers.
    LF_CUDA_KIND_VMM = 2,
    /// Memory of a CUDA memory pool that exports POSIX fds (`cudaMallocAsync`).
    LF_CUDA_KIND_POOL = 3,
    /// Managed memory (`cudaMallocManaged`).
    LF_CUDA_KIND_MANAGED = 4,
    /// Other CUDA memory: VMM memory without fd handles, a pool without IPC.
    LF_CUDA_KIND_OTHER = 5,
}

// The C values are the Rust core's codes.
const _: () = assert!(
    lf_cuda_kind::LF_CUDA_KIND_LEGACY as u32 == 1
        && lf_cuda_kind::LF_CUDA_KIND_VMM as u32 == 2
        && lf_cuda_kind::LF_CUDA_KIND_POOL as u32 == 3
        && lf_cuda_kind::LF_CUDA_KIND_MANAGED as u32 == 4
        && lf_cuda_kind::LF_CUDA_KIND_OTHER as u32 == 5
);

/// The GPU APIs GPU-pinned memory is registered with: bits of `lf_buffer_registrations`'s
/// `flags`, which may hold several.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_registration {
    /// Imported into the context's Vulkan device (`VK_EXT_external_memory_host`).
    LF_REGISTRATION_VULKAN = 1,
    /// Registered with CUDA (`cuMemHostRegister`, portable).
    LF_REGISTRATION_CUDA = 2,
}

/// Opaque handle on a buffer.
#[allow(non_camel_case_types)]
pub struct lf_buffer {
    pub(crate) buffer: Buffer,
    /// `Buffer::fallback` and `Buffer::registration_failures` as C strings.
    fallback: Option<CString>,
    registration_failures: Option<CString>,
    /// Lent by a received message (`lf_message_buffer`): freed by `lf_release`, not `lf_free`.
    borrowed: bool,
}

const _: () = assert!(
    DeviceRegistration::Vulkan { device_uuid: [0; 16] }.flag() == lf_registration::LF_REGISTRATION_VULKAN as u32
        && DeviceRegistration::Cuda { device: 0 }.flag() == lf_registration::LF_REGISTRATION_CUDA as u32
);

fn c_string(text: &str) -> CString {
    CString::new(text.replace('\0', " ")).unwrap_or_default()
}

/// Buffer id -> C handle addresses, oldest first, so that a lookup by address can answer with
/// a handle C already holds. An id has several handles where several `lf_register` calls
/// registered memory of one CUDA allocation (one registration, one id).
fn handles() -> &'static Mutex<HashMap<BufferId, Vec<usize>>> {
    static HANDLES: OnceLock<Mutex<HashMap<BufferId, Vec<usize>>>> = OnceLock::new();
    HANDLES.get_or_init(Default::default)
}

impl lf_buffer {
    pub(crate) fn into_handle(buffer: Buffer) -> FfiResult<*mut lf_buffer> {
        Self::make(buffer, false)
    }

    /// A handle lent by a received message until its release ([`release_borrowed`]).
    #[cfg_attr(not(unix), allow(dead_code))] // lent by channels, which are Unix-only so far
    pub(crate) fn into_borrowed_handle(buffer: Buffer) -> FfiResult<*mut lf_buffer> {
        Self::make(buffer, true)
    }

    fn make(buffer: Buffer, borrowed: bool) -> FfiResult<*mut lf_buffer> {
        let id = buffer.id();
        let fallback = buffer.fallback().map(c_string);
        let failures = buffer.registration_failures();
        let registration_failures = (!failures.is_empty()).then(|| c_string(&failures.join("; ")));
        let handle = new_handle(lf_buffer { buffer, fallback, registration_failures, borrowed })?;
        handles().lock().entry(id).or_default().push(handle as usize);
        Ok(handle)
    }

    pub(crate) fn handle_of(id: BufferId) -> Option<*mut lf_buffer> {
        handles().lock().get(&id).and_then(|all| all.first()).map(|&address| address as *mut lf_buffer)
    }
}

pub(crate) fn release(buffer: *mut lf_buffer) -> Result<(), Failure> {
    if let Ok(live) = handle_ref(buffer, "buffer") {
        if live.borrowed {
            return Err(Failure {
                status: lf_status::LF_ERR_INVALID_STATE,
                message: "this buffer belongs to a received message (lf_message_buffer); lf_release the message instead of freeing the buffer".into(),
            });
        }
    }
    release_any(buffer)
}

/// Frees a buffer lent by a message, at the message's release.
#[cfg_attr(not(unix), allow(dead_code))] // lent by channels, which are Unix-only so far
pub(crate) fn release_borrowed(buffer: *mut lf_buffer) -> Result<(), Failure> {
    release_any(buffer)
}

fn release_any(buffer: *mut lf_buffer) -> Result<(), Failure> {
    if let Ok(live) = handle_ref(buffer, "buffer") {
        let mut handles = handles().lock();
        if let Some(all) = handles.get_mut(&live.buffer.id()) {
            all.retain(|&address| address != buffer as usize);
            if all.is_empty() {
                handles.remove(&live.buffer.id());
            }
        }
    }
    free_handle(buffer, "buffer")
}

/// Releases a buffer: its memory goes back to its arena (an importer mapping it keeps it
/// alive); registered memory is only forgotten. NULL is ignored, as is (with a note in
/// `lf_last_error_message()`) a pointer that is not a live buffer.
///
/// # Safety
/// `buffer` must not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_free(buffer: *mut lf_buffer) {
    boundary_void("lf_free", || release(buffer));
}

/// The first byte of the buffer in this process, valid for `lf_buffer_size` bytes until it
/// is freed: CPU memory, and GPU memory the host can map (LF_MEMORY_GPU_HOST_VISIBLE;
/// device-local memory where the driver maps it). GPU memory the host cannot map has no
/// address here: LF_ERR_INVALID_STATE, and `lf_buffer_write`/`lf_buffer_read` move its data.
/// For registered CUDA memory (LF_MEMORY_CUDA_DEVICE), the CUDA device pointer of the
/// allocation's first byte: an address for CUDA, which the host must not dereference.
///
/// # Safety
/// `buffer` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_ptr(buffer: *const lf_buffer, out: *mut *mut c_void) -> lf_status {
    boundary("lf_buffer_ptr", || {
        let out = out_ptr(out, "out")?;
        let buffer = &handle_ref(buffer, "buffer")?.buffer;
        let address = match buffer.cuda() {
            Some(cuda) => cuda.base as usize as *mut c_void,
            None => buffer.host_ptr()?.cast(),
        };
        write_out(out, address);
        Ok(())
    })
}

/// The buffer's size in bytes (as asked for).
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_size(buffer: *const lf_buffer, out: *mut usize) -> lf_status {
    boundary("lf_buffer_size", || {
        let out = out_ptr(out, "out")?;
        write_out(out, handle_ref(buffer, "buffer")?.buffer.len());
        Ok(())
    })
}

/// The kind of memory really obtained: a best-effort hugepage request that
/// fell back, and a GPU request of a context without a GPU, give LF_MEMORY_CPU_STANDARD.
/// Imported buffers carry the exporter's.
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_location(buffer: *const lf_buffer, out: *mut raw::lf_memory_kind) -> lf_status {
    boundary("lf_buffer_location", || {
        let out = out_ptr(out, "out")?;
        write_out(out, handle_ref(buffer, "buffer")?.buffer.location().code());
        Ok(())
    })
}

/// The NUMA node of LF_MEMORY_CPU_NUMA memory, LF_UNSET for other locations.
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_numa_node(buffer: *const lf_buffer, out: *mut i64) -> lf_status {
    boundary("lf_buffer_numa_node", || {
        let out = out_ptr(out, "out")?;
        let node = handle_ref(buffer, "buffer")?.buffer.location().numa_node();
        write_out(out, node.map_or(LF_UNSET, i64::from));
        Ok(())
    })
}

/// The page size the memory is guaranteed to be backed by, in bytes (the huge page size for
/// hugepage memory, the base page size otherwise).
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_page_size(buffer: *const lf_buffer, out: *mut usize) -> lf_status {
    boundary("lf_buffer_page_size", || {
        let out = out_ptr(out, "out")?;
        write_out(out, handle_ref(buffer, "buffer")?.buffer.page_size());
        Ok(())
    })
}

/// How the buffer came to be: LF_ORIGIN_ALLOCATED, LF_ORIGIN_REGISTERED,
/// LF_ORIGIN_IMPORTED or LF_ORIGIN_CUDA.
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_origin(buffer: *const lf_buffer, out: *mut raw::lf_origin) -> lf_status {
    boundary("lf_buffer_origin", || {
        let out = out_ptr(out, "out")?;
        let origin = match handle_ref(buffer, "buffer")?.buffer.origin() {
            BufferOrigin::Allocated => lf_origin::LF_ORIGIN_ALLOCATED,
            BufferOrigin::Registered => lf_origin::LF_ORIGIN_REGISTERED,
            BufferOrigin::Imported { .. } => lf_origin::LF_ORIGIN_IMPORTED,
            BufferOrigin::Cuda { .. } => lf_origin::LF_ORIGIN_CUDA,
        };
        write_out(out, origin as u32);
        Ok(())
    })
}

/// What CUDA memory the buffer is: `*kind` receives how it was allocated (LF_CUDA_KIND_LEGACY,
/// LF_CUDA_KIND_VMM, LF_CUDA_KIND_POOL, LF_CUDA_KIND_MANAGED or LF_CUDA_KIND_OTHER) for
/// registered CUDA memory (origin LF_ORIGIN_CUDA), LF_CUDA_KIND_NONE for every other buffer;
/// `*device` (when `device` is not NULL) the CUDA device's ordinal in this process, LF_UNSET
/// for other buffers. `lf_buffer_ptr` gives the allocation's device pointer,
/// `lf_buffer_size` its size.
///
/// # Safety
/// `buffer` as `lf_buffer_ptr`; `kind` NULL or writable; `device` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_cuda_kind(
    buffer: *const lf_buffer,
    kind: *mut raw::lf_cuda_kind,
    device: *mut i64,
) -> lf_status {
    boundary("lf_buffer_cuda_kind", || {
        let kind = out_ptr(kind, "kind")?;
        let cuda = handle_ref(buffer, "buffer")?.buffer.cuda();
        write_out(kind, cuda.map_or(lf_cuda_kind::LF_CUDA_KIND_NONE as u32, |c| c.kind.code()));
        if !device.is_null() {
            write_out(device, cuda.map_or(LF_UNSET, |c| i64::from(c.device_ordinal)));
        }
        Ok(())
    })
}

/// Why the buffer is not at the location asked for: `*out` receives NULL when it is, else the
/// reason, a string owned by the buffer and valid until `lf_free`: a GPU location asked of a
/// context without a Vulkan device (and why it has none), or huge pages under the best-effort
/// policy (`lf_alloc`'s `hugepage_policy`, the context's policy, or `lf_alloc_auto`'s staging
/// memory for a remote peer) that the kernel could not give (and why). Every buffer whose
/// `lf_buffer_location` differs from what was asked has a reason.
///
/// # Safety
/// As `lf_buffer_ptr`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_fallback_reason(buffer: *const lf_buffer, out: *mut *const c_char) -> lf_status {
    boundary("lf_buffer_fallback_reason", || {
        let out = out_ptr(out, "out")?;
        write_out(out, handle_ref(buffer, "buffer")?.fallback.as_deref().map_or(std::ptr::null(), CStr::as_ptr));
        Ok(())
    })
}

/// The GPU APIs the buffer's memory is registered with: `*flags` receives the `lf_registration`
/// bits LF_REGISTRATION_VULKAN and/or LF_REGISTRATION_CUDA for LF_MEMORY_CPU_GPU_PINNED memory
/// (where each API is present), 0 otherwise. `lf_buffer_registration_failures` says why a
/// registration is missing.
///
/// # Safety
/// `buffer` as `lf_buffer_ptr`; `flags` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_registrations(buffer: *const lf_buffer, flags: *mut u32) -> lf_status {
    boundary("lf_buffer_registrations", || {
        let flags = out_ptr(flags, "flags")?;
        let registrations = handle_ref(buffer, "buffer")?.buffer.registrations();
        write_out(flags, registrations.iter().fold(0, |bits, r| bits | r.flag()));
        Ok(())
    })
}

/// Why GPU-pinned memory lacks a registration: `*out` receives NULL when nothing is missing
/// (or the buffer is not GPU-pinned), else one line per missing API ("CUDA: ..."), a string
/// owned by the buffer and valid until `lf_free`. A missing registration is no failure of
/// the allocation.
///
/// # Safety
/// As `lf_buffer_fallback_reason`.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_registration_failures(
    buffer: *const lf_buffer,
    out: *mut *const c_char,
) -> lf_status {
    boundary("lf_buffer_registration_failures", || {
        let out = out_ptr(out, "out")?;
        let failures = &handle_ref(buffer, "buffer")?.registration_failures;
        write_out(out, failures.as_deref().map_or(std::ptr::null(), CStr::as_ptr));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{lf_alloc, lf_deregister, lf_register};
    use crate::context::{lf_context_create, lf_context_free};
    use std::ptr;

    #[test]
    fn properties_and_release() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, 100, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            let (mut size, mut page, mut origin, mut node) = (0usize, 0usize, 0u32, 0i64);
            assert_eq!(lf_buffer_size(buffer, &mut size), lf_status::LF_OK);
            assert_eq!(lf_buffer_page_size(buffer, &mut page), lf_status::LF_OK);
            assert_eq!(lf_buffer_origin(buffer, &mut origin), lf_status::LF_OK);
            assert_eq!(lf_buffer_numa_node(buffer, &mut node), lf_status::LF_OK);
            assert_eq!(
                (size, page, origin, node),
                (100, libc::sysconf(libc::_SC_PAGESIZE) as usize, lf_origin::LF_ORIGIN_ALLOCATED as u32, LF_UNSET)
            );
            // Allocated memory is not deregistered: refused, and the buffer stays usable.
            assert_eq!(lf_deregister(context, buffer), lf_status::LF_ERR_INVALID_ARGUMENT);
            let mut p = ptr::null_mut();
            assert_eq!(lf_buffer_ptr(buffer, &mut p), lf_status::LF_OK);
            p.cast::<u8>().write_bytes(0xab, 100);
            lf_free(buffer);
            assert_eq!(lf_buffer_size(buffer, &mut size), lf_status::LF_ERR_BAD_HANDLE);
            lf_free(buffer);
            lf_free(ptr::null_mut());
            assert_eq!(lf_buffer_size(buffer, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);

            let mut user = [0u8; 256];
            let mut registered = ptr::null_mut();
            assert_eq!(lf_register(context, user.as_mut_ptr().cast(), 256, &mut registered), lf_status::LF_OK);
            assert_eq!(lf_buffer_origin(registered, &mut origin), lf_status::LF_OK);
            assert_eq!(origin, lf_origin::LF_ORIGIN_REGISTERED as u32);
            let (mut kind, mut device) = (99u32, 7i64);
            assert_eq!(lf_buffer_cuda_kind(registered, &mut kind, &mut device), lf_status::LF_OK);
            assert_eq!((kind, device), (lf_cuda_kind::LF_CUDA_KIND_NONE as u32, LF_UNSET));
            assert_eq!(lf_buffer_cuda_kind(registered, &mut kind, ptr::null_mut()), lf_status::LF_OK);
            assert_eq!(lf_buffer_cuda_kind(registered, ptr::null_mut(), &mut device), lf_status::LF_ERR_NULL_POINTER);
            // An address that is no memory: not host memory, and no CUDA driver (or not CUDA
            // memory where one is loaded) to recognise it by.
            let mut none = ptr::null_mut();
            assert_eq!(lf_register(context, 0x200 as *mut c_void, 64, &mut none), lf_status::LF_ERR_INVALID_ARGUMENT);
            let message = crate::tests::last_error();
            assert!(message.contains("not entirely mapped memory") && message.contains("CUDA"), "{message}");
            assert!(none.is_null());
            assert_eq!(lf_deregister(ptr::null(), registered), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(lf_deregister(context, registered), lf_status::LF_OK);
            assert_eq!(lf_deregister(context, registered), lf_status::LF_ERR_BAD_HANDLE);
            lf_context_free(context);
        }
    }
}
