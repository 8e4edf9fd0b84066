//! The CUDA driver API for the hardware baselines, loaded at run time (`dlopen` of
//! `libcuda.so.1`), so that the bench builds and runs without CUDA and says why the CUDA rows
//! are missing. Only what the bench needs: contexts, device and pinned host memory, the
//! synchronous copies, memory info and IPC handles.
//!
//! Through lava-flow's binding of the driver API (`lava_flow_cuda`): `LF_DISABLE_CUDA=1` keeps
//! the bench away from libcuda as it keeps the library away.
//!
//! Everything runs on the thread that called [`Cuda::open`] (the context is made current
//! there); the handles are neither `Send` nor `Sync`.

use std::ffi::c_void;

use lava_flow::memory::gpu::format_uuid;
use lava_flow_cuda::sys::{CUcontext, CUdevice, CUdeviceptr, CUipcMemHandle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS};
use lava_flow_cuda::Driver;

/// `CU_IPC_HANDLE_SIZE`.
pub const IPC_HANDLE_SIZE: usize = lava_flow_cuda::sys::CU_IPC_HANDLE_SIZE;

/// The CUDA device that is the Vulkan device in use, with its primary context current on
/// this thread.
pub struct Cuda {
    api: &'static Driver,
    device: CUdevice,
    _context: CUcontext,
    pub ordinal: i32,
    pub name: String,
    /// `cuDriverGetVersion`, e.g. 13000 for 13.0.
    pub driver_version: i32,
}

/// A binding error as the bench's text.
fn text(e: lava_flow_cuda::Error) -> String {
    e.to_string()
}

impl Cuda {
    /// Loads the driver, initialises it, picks the CUDA device whose UUID is `uuid` (the
    /// Vulkan deviceUUID: NVIDIA reports the same UUID to both APIs) and makes its primary
    /// context current. The error says why CUDA is unavailable.
    pub fn open(uuid: &[u8; 16]) -> Result<Cuda, String> {
        let api = lava_flow_cuda::driver().map_err(text)?;
        let count = api.device_count().map_err(text)?;
        let mut seen = Vec::new();
        for ordinal in 0..count {
            let device = api.device(ordinal).map_err(text)?;
            let found = api.device_uuid(device).map_err(text)?;
            if &found != uuid {
                seen.push(format_uuid(&found));
                continue;
            }
            let name = api.device_name(device).unwrap_or_else(|e| format!("(cuDeviceGetName: {e})"));
            let mut context: CUcontext = std::ptr::null_mut();
            // SAFETY: context is a valid out-pointer; device is a valid handle.
            unsafe { api.device_primary_ctx_retain(&mut context, device) }
                .map_err(|e| e.context(format!("cuDevicePrimaryCtxRetain({ordinal})")))
                .map_err(text)?;
            // SAFETY: context was just retained and is live.
            if let Err(e) = unsafe { api.ctx_set_current(context) } {
                // SAFETY: balances the retain above.
                let _ = unsafe { api.device_primary_ctx_release(device) };
                return Err(text(e));
            }
            return Ok(Cuda { api, device, _context: context, ordinal, name, driver_version: api.version() });
        }
        Err(format!(
            "no CUDA device has the Vulkan device's UUID {} (CUDA devices: {})",
            format_uuid(uuid),
            if seen.is_empty() { "none".into() } else { seen.join(", ") }
        ))
    }

    /// `cuCtxSynchronize`: waits for all work of the context.
    pub fn synchronize(&self) -> Result<(), String> {
        // SAFETY: no arguments; the context is current on this thread.
        unsafe { self.api.ctx_synchronize() }.map_err(text)
    }

    /// `cuMemAlloc_v2` of `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<DeviceMemory<'_>, String> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: ptr is a valid out-pointer.
        unsafe { self.api.mem_alloc(&mut ptr, len) }
            .map_err(|e| text(e.context(format!("cuMemAlloc({len} bytes)"))))?;
        Ok(DeviceMemory { cuda: self, ptr, len })
    }

    /// `cuMemAllocHost_v2` of `len` bytes (page-locked, mapped for the device), filled with
    /// `fill` so that every page is touched before timing.
    pub fn alloc_host(&self, len: usize, fill: u8) -> Result<PinnedHost<'_>, String> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: ptr is a valid out-pointer.
        unsafe { self.api.mem_alloc_host(&mut ptr, len) }
            .map_err(|e| text(e.context(format!("cuMemAllocHost({len} bytes)"))))?;
        // SAFETY: a fresh allocation of len writable bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), fill, len) };
        Ok(PinnedHost { cuda: self, ptr: ptr.cast(), len })
    }

    /// `cuMemcpyDtoD_v2` of `len` bytes, then `cuCtxSynchronize` (the copy is asynchronous
    /// to the host otherwise).
    pub fn copy_dtod(&self, dst: &DeviceMemory, src: &DeviceMemory, len: usize) -> Result<(), String> {
        assert!(len <= dst.len && len <= src.len, "copy of {len} bytes overruns a CUDA buffer");
        // SAFETY: both are live allocations of this context at least `len` bytes long.
        unsafe { self.api.memcpy_dtod(dst.ptr, src.ptr, len) }
            .map_err(|e| text(e.context(format!("cuMemcpyDtoD({len} bytes)"))))?;
        self.synchronize()
    }

    /// `cuMemcpyHtoD_v2` from `src`, then `cuCtxSynchronize` (from pageable memory the call
    /// may return before the data has arrived).
    pub fn copy_htod(&self, dst: &DeviceMemory, src: &[u8]) -> Result<(), String> {
        assert!(src.len() <= dst.len, "copy of {} bytes overruns a CUDA buffer", src.len());
        // SAFETY: dst is a live allocation of at least src.len() bytes; src is readable for
        // its length and stays borrowed until the copy is done (synchronised below).
        unsafe { self.api.memcpy_htod(dst.ptr, src.as_ptr().cast(), src.len()) }
            .map_err(|e| text(e.context(format!("cuMemcpyHtoD({} bytes)", src.len()))))?;
        self.synchronize()
    }

    /// `cuMemcpyDtoH_v2` into `dst` (synchronous), then `cuCtxSynchronize`.
    pub fn copy_dtoh(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<(), String> {
        assert!(dst.len() <= src.len, "copy of {} bytes overruns a CUDA buffer", dst.len());
        let len = dst.len();
        // SAFETY: src is a live allocation of at least dst.len() bytes; dst is writable for
        // its length and exclusively borrowed until the copy is done.
        unsafe { self.api.memcpy_dtoh(dst.as_mut_ptr().cast(), src.ptr, len) }
            .map_err(|e| text(e.context(format!("cuMemcpyDtoH({len} bytes)"))))?;
        self.synchronize()
    }

    /// `cuMemGetInfo_v2`: the device's free and total memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), String> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers.
        unsafe { self.api.mem_get_info(&mut free, &mut total) }.map_err(text)?;
        Ok((free as u64, total as u64))
    }

    /// `cuIpcGetMemHandle` of an allocation: the 64 bytes another process opens.
    pub fn ipc_handle(&self, memory: &DeviceMemory) -> Result<[u8; IPC_HANDLE_SIZE], String> {
        let mut handle = CUipcMemHandle { reserved: [0; IPC_HANDLE_SIZE] };
        // SAFETY: handle is a valid out-pointer; memory is a live cuMemAlloc allocation.
        unsafe { self.api.ipc_get_mem_handle(&mut handle, memory.ptr) }.map_err(text)?;
        Ok(handle.reserved)
    }

    /// `cuIpcOpenMemHandle_v2` (lazy peer access, as `cudaIpcOpenMemHandle`) of another
    /// process's handle; closed when the result drops.
    pub fn ipc_open(&self, handle: &[u8; IPC_HANDLE_SIZE]) -> Result<IpcMemory<'_>, String> {
        let mut ptr: CUdeviceptr = 0;
        let handle = CUipcMemHandle { reserved: *handle };
        // SAFETY: ptr is a valid out-pointer; the handle is passed by value as cuda.h says.
        unsafe { self.api.ipc_open_mem_handle(&mut ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) }.map_err(text)?;
        Ok(IpcMemory { cuda: self, ptr })
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: balances the retain of `open`; every allocation borrowed `self` and is gone.
        let _ = unsafe { self.api.device_primary_ctx_release(self.device) };
    }
}

/// A `cuMemAlloc` allocation, freed on drop.
pub struct DeviceMemory<'a> {
    cuda: &'a Cuda,
    ptr: CUdeviceptr,
    len: usize,
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: a live allocation of this context, freed once; copies are synchronous.
        if let Err(e) = unsafe { self.cuda.api.mem_free(self.ptr) } {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}

/// A `cuMemAllocHost` allocation, freed on drop.
pub struct PinnedHost<'a> {
    cuda: &'a Cuda,
    ptr: *mut u8,
    len: usize,
}

impl PinnedHost<'_> {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes, written only through &mut self (copies
        // into it borrow it mutably and are synchronous).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of len bytes, borrowed exclusively through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedHost<'_> {
    fn drop(&mut self) {
        // SAFETY: a live cuMemAllocHost allocation, freed once; no copy is in flight.
        if let Err(e) = unsafe { self.cuda.api.mem_free_host(self.ptr.cast()) } {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}

/// Memory of another process opened with `cuIpcOpenMemHandle`, closed on drop.
pub struct IpcMemory<'a> {
    cuda: &'a Cuda,
    ptr: CUdeviceptr,
}

impl Drop for IpcMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: a pointer cuIpcOpenMemHandle returned, closed once.
        if let Err(e) = unsafe { self.cuda.api.ipc_close_mem_handle(self.ptr) } {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}
