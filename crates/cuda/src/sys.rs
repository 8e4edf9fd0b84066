//! The types, constants and structs of `cuda.h` (CUDA 12 and 13) that lava-flow uses, with the
//! numeric values of the header. The enums of `cuda.h` are C `enum`s (32 bits); they are
//! plain integer constants here, so that a value the driver returns that this list does not
//! know is still a value, never undefined behaviour.

use std::ffi::{c_int, c_uint, c_void};

/// `CUresult`.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr`: `unsigned long long` on every 64-bit platform.
pub type CUdeviceptr = u64;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream`.
pub type CUstream = *mut c_void;
/// `CUevent`.
pub type CUevent = *mut c_void;
/// `CUhostFn`: a host function a stream runs (`cuLaunchHostFunc`).
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
/// `CUexternalMemory`.
pub type CUexternalMemory = *mut c_void;
/// `CUexternalSemaphore`.
pub type CUexternalSemaphore = *mut c_void;
/// `CUmemoryPool`.
pub type CUmemoryPool = *mut c_void;
/// `CUmemGenericAllocationHandle`: `unsigned long long`.
pub type CUmemGenericAllocationHandle = u64;
/// `CUpointer_attribute`.
pub type CUpointer_attribute = c_uint;
/// `CUdevice_attribute`.
pub type CUdevice_attribute = c_int;
/// `CUmemAllocationHandleType` (a bit of `ALLOWED_HANDLE_TYPES` masks).
pub type CUmemAllocationHandleType = c_uint;
/// `CUmemorytype`.
pub type CUmemorytype = c_uint;

pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_NOT_READY`: an event's or stream's work is not done yet (`cuEventQuery`).
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

// CUpointer_attribute.
pub const CU_POINTER_ATTRIBUTE_CONTEXT: CUpointer_attribute = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CUpointer_attribute = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: CUpointer_attribute = 3;
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: CUpointer_attribute = 4;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: CUpointer_attribute = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: CUpointer_attribute = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: CUpointer_attribute = 9;
pub const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: CUpointer_attribute = 10;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: CUpointer_attribute = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: CUpointer_attribute = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: CUpointer_attribute = 13;
pub const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: CUpointer_attribute = 14;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: CUpointer_attribute = 17;
pub const CU_POINTER_ATTRIBUTE_MAPPING_SIZE: CUpointer_attribute = 18;
pub const CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: CUpointer_attribute = 19;
pub const CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: CUpointer_attribute = 20;

// CUmemorytype.
pub const CU_MEMORYTYPE_HOST: CUmemorytype = 1;
pub const CU_MEMORYTYPE_DEVICE: CUmemorytype = 2;
pub const CU_MEMORYTYPE_ARRAY: CUmemorytype = 3;
pub const CU_MEMORYTYPE_UNIFIED: CUmemorytype = 4;

// CUmemAllocationHandleType: bits.
pub const CU_MEM_HANDLE_TYPE_NONE: CUmemAllocationHandleType = 0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 1;
pub const CU_MEM_HANDLE_TYPE_WIN32: CUmemAllocationHandleType = 2;
pub const CU_MEM_HANDLE_TYPE_WIN32_KMT: CUmemAllocationHandleType = 4;
pub const CU_MEM_HANDLE_TYPE_FABRIC: CUmemAllocationHandleType = 8;

// CUmemAllocationType, CUmemLocationType, CUmemAccess_flags, CUmemAllocationGranularity_flags.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_uint = 2;
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_uint = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 3;
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 1;

// CUdevice_attribute.
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: CUdevice_attribute = 41;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: CUdevice_attribute = 102;
pub const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: CUdevice_attribute = 103;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: CUdevice_attribute = 115;
pub const CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: CUdevice_attribute = 119;

/// Pinned for every CUDA context, not just the primary context of one device.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
/// `CU_MEM_ATTACH_GLOBAL`, the flag of `cuMemAllocManaged`.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the flag `cudaIpcOpenMemHandle` passes.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `CU_IPC_HANDLE_SIZE`.
pub const CU_IPC_HANDLE_SIZE: usize = 64;
/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD`.
pub const CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_int = 1;
/// `CUDA_EXTERNAL_MEMORY_DEDICATED`.
pub const CUDA_EXTERNAL_MEMORY_DEDICATED: c_uint = 1;
/// `CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD`: a Vulkan timeline semaphore's
/// opaque fd.
pub const CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD: c_int = 9;
/// `CU_STREAM_LEGACY`: the legacy default stream, ordered after every blocking stream.
pub const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
pub const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;
/// `CU_STREAM_NON_BLOCKING`: the stream does not wait for the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub const CU_EVENT_DEFAULT: c_uint = 0;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
pub const CU_EVENT_INTERPROCESS: c_uint = 4;

/// `CUipcMemHandle`: `struct { char reserved[64]; }`, passed by value to
/// `cuIpcOpenMemHandle_v2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUipcMemHandle {
    pub reserved: [u8; CU_IPC_HANDLE_SIZE],
}

/// `CUmemPoolPtrExportData`: `struct { unsigned char reserved[64]; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUmemPoolPtrExportData {
    pub reserved: [u8; 64],
}

/// `CUmemLocation` (in CUDA 13.2 and later `id` is a union of one `int`: the same layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp::allocFlags`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemAllocationProp {
    pub type_: c_uint,
    pub requested_handle_types: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: CUmemAllocFlags,
}

impl Default for CUmemAllocationProp {
    fn default() -> Self {
        CUmemAllocationProp {
            type_: 0,
            requested_handle_types: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation::default(),
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: CUmemAllocFlags::default(),
        }
    }
}

/// `CUmemPoolProps`: the 64 bytes after the security attributes are `maxSize`, `usage` and
/// reserved bytes in CUDA 12.2 and later, all reserved (zero) before: zero means the defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: CUmemAllocationHandleType,
    pub location: CUmemLocation,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

impl Default for CUmemPoolProps {
    fn default() -> Self {
        CUmemPoolProps {
            alloc_type: 0,
            handle_types: CU_MEM_HANDLE_TYPE_NONE,
            location: CUmemLocation::default(),
            win32_security_attributes: std::ptr::null_mut(),
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC`: the handle union is 16 bytes, of which an fd takes
/// the first 4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    pub type_: c_int,
    pub handle: [u64; 2],
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
    pub offset: u64,
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC`: the handle union is 16 bytes, of which an fd takes
/// the first 4.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
    pub type_: c_int,
    pub handle: [u64; 2],
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS`: a timeline semaphore takes `fence_value`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS {
    pub fence_value: u64,
    pub nv_sci_sync: u64,
    pub keyed_mutex_key: u64,
    pub params_reserved: [c_uint; 12],
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS`: a timeline semaphore takes `fence_value`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS {
    pub fence_value: u64,
    pub nv_sci_sync: u64,
    pub keyed_mutex_key: u64,
    pub keyed_mutex_timeout_ms: c_uint,
    pub keyed_mutex_padding: c_uint,
    pub params_reserved: [c_uint; 10],
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

// The sizes cuda.h gives these structs on 64-bit platforms.
const _: () = assert!(
    std::mem::size_of::<CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC>() == 96
        && std::mem::size_of::<CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS>() == 144
        && std::mem::size_of::<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS>() == 144
);
const _: () = assert!(
    std::mem::size_of::<CUmemAllocationProp>() == 32
        && std::mem::size_of::<CUmemAccessDesc>() == 12
        && std::mem::size_of::<CUDA_EXTERNAL_MEMORY_HANDLE_DESC>() == 104
        && std::mem::size_of::<CUDA_EXTERNAL_MEMORY_BUFFER_DESC>() == 88
        && std::mem::size_of::<CUipcMemHandle>() == 64
        && std::mem::size_of::<CUmemPoolProps>() == 88
        && std::mem::size_of::<CUmemPoolPtrExportData>() == 64
);
