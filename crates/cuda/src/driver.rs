//! [`Driver`]: the CUDA driver API's functions, looked up in libcuda once.
//!
//! Every function is an `unsafe fn` named after its C function in snake case without the
//! `cu` prefix (`cuMemAlloc_v2` is [`Driver::mem_alloc`]); it returns `Ok(())` for
//! `CUDA_SUCCESS` and otherwise an [`Error`] with the `CUresult`, its name and description,
//! and the C function's name as what was attempted (callers say more with
//! [`Error::context`]). A function the driver lacks is [`Error::SymbolMissing`] when called:
//! an old driver still serves the calls it has. Where `cuda.h` maps a name to a `_v2` (or
//! later) symbol, that symbol is bound, as a program compiled against `cuda.h` would.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::mem::ManuallyDrop;

use crate::error::{Error, Result};
use crate::sys::*;

macro_rules! driver_api {
    ($(
        $(#[$meta:meta])*
        fn $method:ident = $symbol:literal ($($arg:ident: $ty:ty),* $(,)?);
    )*) => {
        /// The functions of one loaded CUDA driver library (see the module's documentation).
        /// Obtain the process's one with [`driver`](crate::driver).
        pub struct Driver {
            library: String,
            version: c_int,
            get_error_name: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
            get_error_string: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
            $($method: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,)*
            /// Never closed: the CUDA driver does not support being unloaded, and the function
            /// pointers above point into it.
            _library: ManuallyDrop<libloading::Library>,
        }

        impl Driver {
            /// Looks up every function of the list in `library`, each `None` where missing.
            fn resolve(library: &libloading::Library) -> Functions {
                Functions {
                    $($method: {
                        // SAFETY: the symbol is the driver function of that name, whose C
                        // signature in cuda.h the field's type spells out; the library is never
                        // unloaded (ManuallyDrop), so the pointer stays valid.
                        unsafe { library.get::<unsafe extern "C" fn($($ty),*) -> CUresult>(
                            concat!($symbol, "\0").as_bytes()) }.ok().map(|f| *f)
                    },)*
                }
            }

            $(
                $(#[$meta])*
                #[doc = ""]
                #[doc = concat!("`", $symbol, "`.")]
                #[doc = ""]
                #[doc = "# Safety"]
                #[doc = concat!("The arguments keep `", $symbol, "`'s contract in the CUDA driver API \
                    reference: out-pointers valid for writes of their type, handles and device \
                    pointers live (and of the current context where the function works in one), \
                    ranges inside their allocations.")]
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn $method(&self, $($arg: $ty),*) -> Result<()> {
                    let Some(function) = self.$method else {
                        return Err(Error::SymbolMissing { library: self.library.clone(), symbol: $symbol });
                    };
                    // SAFETY: the caller keeps the function's contract (see # Safety).
                    let result = unsafe { function($($arg),*) };
                    self.check(result, $symbol)
                }
            )*
        }

        /// The looked-up functions, before they join a [`Driver`].
        struct Functions {
            $($method: Option<unsafe extern "C" fn($($ty),*) -> CUresult>,)*
        }

        impl Driver {
            fn assemble(
                library: String,
                get_error_name: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
                get_error_string: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
                functions: Functions,
                handle: libloading::Library,
            ) -> Driver {
                Driver {
                    library,
                    version: 0,
                    get_error_name,
                    get_error_string,
                    $($method: functions.$method,)*
                    _library: ManuallyDrop::new(handle),
                }
            }
        }
    };
}

driver_api! {
    /// Initialises the driver (flags must be 0).
    fn init = "cuInit"(flags: c_uint);
    fn driver_get_version = "cuDriverGetVersion"(version: *mut c_int);
    fn device_get_count = "cuDeviceGetCount"(count: *mut c_int);
    fn device_get = "cuDeviceGet"(device: *mut CUdevice, ordinal: c_int);
    fn device_get_uuid = "cuDeviceGetUuid_v2"(uuid: *mut [u8; 16], device: CUdevice);
    fn device_get_name = "cuDeviceGetName"(name: *mut c_char, len: c_int, device: CUdevice);
    fn device_get_attribute = "cuDeviceGetAttribute"(value: *mut c_int, attribute: CUdevice_attribute, device: CUdevice);
    fn device_primary_ctx_retain = "cuDevicePrimaryCtxRetain"(context: *mut CUcontext, device: CUdevice);
    fn device_primary_ctx_release = "cuDevicePrimaryCtxRelease_v2"(device: CUdevice);
    fn device_primary_ctx_get_state = "cuDevicePrimaryCtxGetState"(device: CUdevice, flags: *mut c_uint, active: *mut c_int);
    fn ctx_push_current = "cuCtxPushCurrent_v2"(context: CUcontext);
    fn ctx_pop_current = "cuCtxPopCurrent_v2"(context: *mut CUcontext);
    fn ctx_set_current = "cuCtxSetCurrent"(context: CUcontext);
    fn ctx_get_current = "cuCtxGetCurrent"(context: *mut CUcontext);
    fn ctx_get_device = "cuCtxGetDevice"(device: *mut CUdevice);
    fn ctx_synchronize = "cuCtxSynchronize"();
    /// Whether `device` can read and write memory of `peer` directly (NVLink or PCIe peer to
    /// peer): `*can` is 1 where it can.
    fn device_can_access_peer = "cuDeviceCanAccessPeer"(can: *mut c_int, device: CUdevice, peer: CUdevice);
    /// Lets the current context reach memory of `peer`'s device (flags must be 0);
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` where it already can.
    fn ctx_enable_peer_access = "cuCtxEnablePeerAccess"(peer: CUcontext, flags: c_uint);
    fn mem_alloc = "cuMemAlloc_v2"(ptr: *mut CUdeviceptr, bytes: usize);
    fn mem_free = "cuMemFree_v2"(ptr: CUdeviceptr);
    fn mem_alloc_managed = "cuMemAllocManaged"(ptr: *mut CUdeviceptr, bytes: usize, flags: c_uint);
    fn mem_alloc_async = "cuMemAllocAsync"(ptr: *mut CUdeviceptr, bytes: usize, stream: CUstream);
    fn mem_free_async = "cuMemFreeAsync"(ptr: CUdeviceptr, stream: CUstream);
    fn mem_alloc_host = "cuMemAllocHost_v2"(ptr: *mut *mut c_void, bytes: usize);
    fn mem_free_host = "cuMemFreeHost"(ptr: *mut c_void);
    fn mem_host_register = "cuMemHostRegister_v2"(ptr: *mut c_void, bytes: usize, flags: c_uint);
    fn mem_host_unregister = "cuMemHostUnregister"(ptr: *mut c_void);
    fn mem_get_info = "cuMemGetInfo_v2"(free: *mut usize, total: *mut usize);
    fn mem_get_address_range = "cuMemGetAddressRange_v2"(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr);
    fn memset_d8 = "cuMemsetD8_v2"(ptr: CUdeviceptr, value: u8, count: usize);
    fn memcpy_dtod = "cuMemcpyDtoD_v2"(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize);
    fn memcpy_htod = "cuMemcpyHtoD_v2"(dst: CUdeviceptr, src: *const c_void, bytes: usize);
    fn memcpy_dtoh = "cuMemcpyDtoH_v2"(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
    fn memcpy_dtod_async = "cuMemcpyDtoDAsync_v2"(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
    fn memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2"(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream);
    fn memset_d8_async = "cuMemsetD8Async"(ptr: CUdeviceptr, value: u8, count: usize, stream: CUstream);
    /// Unlike `cuPointerGetAttribute`, answers for any address: attributes of memory CUDA does
    /// not know are left at their NULL values and `CUDA_SUCCESS` is returned.
    fn pointer_get_attributes = "cuPointerGetAttributes"(count: c_uint, attributes: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: CUdeviceptr);
    fn pointer_get_attribute = "cuPointerGetAttribute"(data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr);
    fn ipc_get_mem_handle = "cuIpcGetMemHandle"(handle: *mut CUipcMemHandle, ptr: CUdeviceptr);
    fn ipc_open_mem_handle = "cuIpcOpenMemHandle_v2"(ptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint);
    fn ipc_close_mem_handle = "cuIpcCloseMemHandle"(ptr: CUdeviceptr);
    fn mem_create = "cuMemCreate"(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong);
    fn mem_release = "cuMemRelease"(handle: CUmemGenericAllocationHandle);
    fn mem_retain_allocation_handle = "cuMemRetainAllocationHandle"(handle: *mut CUmemGenericAllocationHandle, ptr: *mut c_void);
    fn mem_get_allocation_granularity = "cuMemGetAllocationGranularity"(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_uint);
    fn mem_get_allocation_properties_from_handle = "cuMemGetAllocationPropertiesFromHandle"(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle);
    /// For `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, `shareable` points to an `int` that
    /// receives a new fd, which the caller owns.
    fn mem_export_to_shareable_handle = "cuMemExportToShareableHandle"(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: c_ulonglong);
    /// For `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, `os_handle` is the fd itself cast to a
    /// pointer; the fd stays the caller's.
    fn mem_import_from_shareable_handle = "cuMemImportFromShareableHandle"(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType);
    fn mem_address_reserve = "cuMemAddressReserve"(ptr: *mut CUdeviceptr, size: usize, alignment: usize, address: CUdeviceptr, flags: c_ulonglong);
    fn mem_address_free = "cuMemAddressFree"(ptr: CUdeviceptr, size: usize);
    fn mem_map = "cuMemMap"(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong);
    fn mem_unmap = "cuMemUnmap"(ptr: CUdeviceptr, size: usize);
    fn mem_set_access = "cuMemSetAccess"(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize);
    fn mem_pool_export_to_shareable_handle = "cuMemPoolExportToShareableHandle"(shareable: *mut c_void, pool: CUmemoryPool, handle_type: CUmemAllocationHandleType, flags: c_ulonglong);
    fn mem_pool_import_from_shareable_handle = "cuMemPoolImportFromShareableHandle"(pool: *mut CUmemoryPool, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType, flags: c_ulonglong);
    fn mem_pool_export_pointer = "cuMemPoolExportPointer"(data: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr);
    /// The import must be freed (`cuMemFree`, `cuMemFreeAsync`) before the exporting process
    /// frees the allocation.
    fn mem_pool_import_pointer = "cuMemPoolImportPointer"(ptr: *mut CUdeviceptr, pool: CUmemoryPool, data: *mut CUmemPoolPtrExportData);
    fn mem_pool_create = "cuMemPoolCreate"(pool: *mut CUmemoryPool, props: *const CUmemPoolProps);
    /// Returns at once; a pool with allocations outstanding is released once they are freed.
    fn mem_pool_destroy = "cuMemPoolDestroy"(pool: CUmemoryPool);
    /// An imported pool is reached from its own device only until access is set for others.
    fn mem_pool_set_access = "cuMemPoolSetAccess"(pool: CUmemoryPool, map: *const CUmemAccessDesc, count: usize);
    fn mem_alloc_from_pool_async = "cuMemAllocFromPoolAsync"(ptr: *mut CUdeviceptr, bytes: usize, pool: CUmemoryPool, stream: CUstream);
    fn import_external_memory = "cuImportExternalMemory"(memory: *mut CUexternalMemory, desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC);
    fn external_memory_get_mapped_buffer = "cuExternalMemoryGetMappedBuffer"(ptr: *mut CUdeviceptr, memory: CUexternalMemory, desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC);
    fn destroy_external_memory = "cuDestroyExternalMemory"(memory: CUexternalMemory);
    /// On success the driver owns the fd in `desc`; on failure it stays the caller's.
    fn import_external_semaphore = "cuImportExternalSemaphore"(semaphore: *mut CUexternalSemaphore, desc: *const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC);
    fn signal_external_semaphores_async = "cuSignalExternalSemaphoresAsync"(semaphores: *const CUexternalSemaphore, params: *const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, count: c_uint, stream: CUstream);
    fn wait_external_semaphores_async = "cuWaitExternalSemaphoresAsync"(semaphores: *const CUexternalSemaphore, params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, count: c_uint, stream: CUstream);
    fn destroy_external_semaphore = "cuDestroyExternalSemaphore"(semaphore: CUexternalSemaphore);
    fn stream_create = "cuStreamCreate"(stream: *mut CUstream, flags: c_uint);
    fn stream_destroy = "cuStreamDestroy_v2"(stream: CUstream);
    fn stream_synchronize = "cuStreamSynchronize"(stream: CUstream);
    /// `Err` with `CUDA_ERROR_NOT_READY` while work queued on the stream is not done.
    fn stream_query = "cuStreamQuery"(stream: CUstream);
    /// Runs `f(user_data)` on a driver thread once the stream's earlier work is done; the
    /// stream's later work waits for it to return. `f` must not call CUDA.
    fn launch_host_func = "cuLaunchHostFunc"(stream: CUstream, f: CUhostFn, user_data: *mut c_void);
    fn stream_wait_event = "cuStreamWaitEvent"(stream: CUstream, event: CUevent, flags: c_uint);
    fn event_create = "cuEventCreate"(event: *mut CUevent, flags: c_uint);
    fn event_record = "cuEventRecord"(event: CUevent, stream: CUstream);
    fn event_synchronize = "cuEventSynchronize"(event: CUevent);
    /// `Err` with `CUDA_ERROR_NOT_READY` while the work before the event is not done.
    fn event_query = "cuEventQuery"(event: CUevent);
    fn event_destroy = "cuEventDestroy_v2"(event: CUevent);
}

impl Driver {
    /// Loads the driver library `library` (`libcuda.so.1` for the installed driver), looks up
    /// its functions and initialises it (`cuInit`). Each call loads anew; the process's one
    /// driver is [`driver`](crate::driver), which also honours `LF_DISABLE_CUDA`. A library that
    /// cannot be opened, one without `cuInit`, `cuDriverGetVersion`, `cuGetErrorName` or
    /// `cuGetErrorString`, and a failing `cuInit` (no device visible) are errors.
    pub fn load(library: &str) -> Result<Driver> {
        // SAFETY: opening the CUDA driver library runs its initialisers, which are made to run
        // in any process; a library by another name runs its own, as any dlopen would.
        let handle = unsafe { libloading::Library::new(library) }
            .map_err(|e| Error::LibraryMissing { library: library.to_owned(), reason: e.to_string() })?;
        let required = |symbol: &'static str| {
            // SAFETY: both error functions have this signature in cuda.h; the library stays
            // loaded for the process's life (never closed).
            unsafe { handle.get::<unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult>(symbol.as_bytes()) }
                .map(|f| *f)
                .map_err(|_| Error::SymbolMissing {
                    library: library.to_owned(),
                    symbol: symbol.trim_end_matches('\0'),
                })
        };
        let get_error_name = required("cuGetErrorName\0")?;
        let get_error_string = required("cuGetErrorString\0")?;
        let functions = Driver::resolve(&handle);
        let mut driver = Driver::assemble(library.to_owned(), get_error_name, get_error_string, functions, handle);
        // SAFETY: cuInit takes flags, which must be 0.
        unsafe { driver.init(0) }.map_err(|e| {
            e.context("cuInit (is an NVIDIA GPU visible to this process? check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        })?;
        let mut version = 0;
        // SAFETY: version is a valid out-pointer.
        unsafe { driver.driver_get_version(&mut version) }?;
        driver.version = version;
        Ok(driver)
    }

    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The library the functions come from.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error of `what` with the code's name and description.
    pub fn check(&self, result: CUresult, what: &str) -> Result<()> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        let text = |f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult| {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: the function writes a pointer to a static string of the driver, or
            // leaves it NULL.
            let ok = unsafe { f(result, &mut p) } == CUDA_SUCCESS && !p.is_null();
            // SAFETY: a NUL-terminated string inside the driver, which is never unloaded.
            ok.then(|| unsafe { CStr::from_ptr::<'static>(p) }.to_str().ok()).flatten()
        };
        Err(Error::Call {
            what: what.to_owned(),
            code: result,
            name: text(self.get_error_name),
            description: text(self.get_error_string),
        })
    }

    /// The number of CUDA devices.
    pub fn device_count(&self) -> Result<i32> {
        let mut count = 0;
        // SAFETY: count is a valid out-pointer.
        unsafe { self.device_get_count(&mut count) }?;
        Ok(count)
    }

    /// The device of `ordinal` (`cuDeviceGet`).
    pub fn device(&self, ordinal: i32) -> Result<CUdevice> {
        let mut device = 0;
        // SAFETY: device is a valid out-pointer; the driver checks the ordinal.
        unsafe { self.device_get(&mut device, ordinal) }.map_err(|e| e.context(format!("cuDeviceGet({ordinal})")))?;
        Ok(device)
    }

    /// The UUID of `device` (the same UUID NVIDIA's Vulkan driver reports as deviceUUID).
    pub fn device_uuid(&self, device: CUdevice) -> Result<[u8; 16]> {
        let mut uuid = [0u8; 16];
        // SAFETY: uuid is a valid CUuuid (16 bytes) out-pointer; the driver checks the device.
        unsafe { self.device_get_uuid(&mut uuid, device) }
            .map_err(|e| e.context(format!("cuDeviceGetUuid({device})")))?;
        Ok(uuid)
    }

    /// The name of `device` ("NVIDIA H200").
    pub fn device_name(&self, device: CUdevice) -> Result<String> {
        let mut name = [0 as c_char; 256];
        // SAFETY: name is writable for the length passed; the driver NUL-terminates it.
        unsafe { self.device_get_name(name.as_mut_ptr(), name.len() as c_int, device) }?;
        // SAFETY: NUL-terminated by the driver within the buffer.
        Ok(unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// An attribute of `device` (`cuDeviceGetAttribute`).
    pub fn device_attribute(&self, device: CUdevice, attribute: CUdevice_attribute) -> Result<i32> {
        let mut value = 0;
        // SAFETY: value is a valid out-pointer; the driver checks the attribute and device.
        unsafe { self.device_get_attribute(&mut value, attribute, device) }
            .map_err(|e| e.context(format!("cuDeviceGetAttribute({attribute}) of device {device}")))?;
        Ok(value)
    }

    /// Whether the primary context of `device` is active, that is whether the process (the
    /// CUDA runtime, PyTorch, CuPy) uses the device. Makes no context.
    pub fn primary_context_active(&self, device: CUdevice) -> Result<bool> {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: both are valid out-pointers.
        unsafe { self.device_primary_ctx_get_state(device, &mut flags, &mut active) }?;
        Ok(active != 0)
    }

    /// Several attributes of the memory at `ptr` in one `cuPointerGetAttributes` call: each
    /// value as the driver wrote it into a zeroed 8-byte slot, read as a little-endian `u64`,
    /// so that every attribute reads back right whatever width up to 8 bytes the driver writes
    /// it as (booleans and enums are narrower than ids, sizes, addresses and handles). Memory CUDA does not know
    /// (host memory never registered with it) reads as zeros.
    pub fn pointer_attributes<const N: usize>(
        &self,
        ptr: CUdeviceptr,
        attributes: [CUpointer_attribute; N],
    ) -> Result<[u64; N]> {
        let mut attributes = attributes;
        let mut values = [0u64; N];
        let base = values.as_mut_ptr();
        let mut slots: [*mut c_void; N] = [std::ptr::null_mut(); N];
        for (i, slot) in slots.iter_mut().enumerate() {
            // SAFETY: i < N: inside `values`.
            *slot = unsafe { base.add(i) }.cast();
        }
        // SAFETY: N attributes and N slots of 8 bytes each, the widest any attribute of this
        // crate's list is written as; the address is only looked up by the driver, never
        // dereferenced on the host.
        unsafe { self.pointer_get_attributes(N as c_uint, attributes.as_mut_ptr(), slots.as_mut_ptr(), ptr) }
            .map_err(|e| e.context(format!("cuPointerGetAttributes of {ptr:#x}")))?;
        Ok(values)
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("library", &self.library).field("version", &self.version).finish()
    }
}

// SAFETY: plain function pointers into a library that stays loaded for the process's life;
// the CUDA driver API is thread-safe.
unsafe impl Send for Driver {}
// SAFETY: see Send.
unsafe impl Sync for Driver {}
