//! How enums and growable structs cross the C boundary.
//!
//! Enums: the header declares each as a C enum (fixed to `uint32_t` where C allows it, else a
//! `uint32_t` typedef), and the functions and fields that take one from C are declared with
//! the [`raw`] alias of the same name, a `u32`: C may pass any value, and a Rust enum must
//! never hold one it does not list. [`CEnum::from_c`] checks the value and names the valid ones.
//!
//! Growable structs: the structs a caller fills (`lf_context_config`, `lf_channel_config`) or
//! lends to be filled (`lf_device_info`) start with `uint32_t struct_size`, the struct's size
//! as the caller's header has it. The library reads and writes only that many bytes, so a
//! program built against an older header keeps working with a newer library, and one built
//! against a newer header is told when it asks for something this library does not know.
//! A field added later must mean "as before" when it is 0: a shorter struct reads as zeros.

use std::mem::size_of;

use super::status::lf_status;
use super::{Failure, FfiResult};

/// The C enums as the integers C passes. The header names each function parameter and struct
/// field of these types by the enum's name (cbindgen sees the name, not the alias); Rust reads
/// them as `u32` and checks them with [`CEnum::from_c`].
#[allow(non_camel_case_types)]
pub mod raw {
    pub type lf_status = u32;
    pub type lf_log_level = u32;
    pub type lf_hugepage_policy = u32;
    pub type lf_gpu_policy = u32;
    pub type lf_gpu_device_select = u32;
    pub type lf_device_type = u32;
    pub type lf_memory_kind = u32;
    pub type lf_origin = u32;
    pub type lf_role = u32;
    pub type lf_wait_strategy = u32;
    pub type lf_scope = u32;
}

/// A C enum: its values, to check an integer from C against.
pub(crate) trait CEnum: Copy + std::fmt::Debug + 'static {
    /// The C type's name, for messages.
    const NAME: &'static str;
    /// Every value, in the header's order.
    const ALL: &'static [Self];

    fn to_c(self) -> u32;

    /// The enum value `value` stands for; LF_ERR_INVALID_ARGUMENT naming `what` (the argument
    /// or field) and every valid name otherwise.
    fn from_c(value: u32, what: &str) -> FfiResult<Self> {
        Self::ALL.iter().copied().find(|v| v.to_c() == value).ok_or_else(|| Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("{what} is {value}, not an {}: use {}", Self::NAME, Self::names()),
        })
    }

    /// "A (1), B (2) or C (3)".
    fn names() -> String {
        let names: Vec<String> = Self::ALL.iter().map(|v| format!("{v:?} ({})", v.to_c())).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }
}

/// Implements [`CEnum`] for a `#[repr(u32)]` enum whose variants are listed.
macro_rules! c_enum {
    ($name:ident: $($variant:ident),+ $(,)?) => {
        impl $crate::abi::CEnum for $name {
            const NAME: &'static str = stringify!($name);
            const ALL: &'static [Self] = &[$($name::$variant),+];
            fn to_c(self) -> u32 {
                self as u32
            }
        }
    };
}
pub(crate) use c_enum;

/// The largest `struct_size` taken: a larger one is not the size of a struct but garbage (an
/// uninitialised field), and the library must not read that far.
const MAX_STRUCT_SIZE: usize = 4096;

/// A struct that starts with `uint32_t struct_size` and may grow.
///
/// # Safety
/// The implementer is `#[repr(C)]`, starts with a `u32` (the size), and every bit pattern is a
/// valid value of it (integers and arrays of them only), so that bytes from C can be copied in.
pub(crate) unsafe trait GrowableStruct: Copy + Default {
    /// The C type's name, for messages.
    const NAME: &'static str;
    /// Every size a published header gave the struct, oldest first; the last is this one's.
    const SIZES: &'static [usize];
}

/// Checks a `struct_size` (see the module's documentation). `input`: the library reads the
/// struct, so the bytes of a newer header's struct that this library does not know must be 0
/// (at `ptr`). Returns how many bytes the library reads or writes.
///
/// # Safety
/// For `input` and a `size` larger than `T`, `ptr` must be readable for `size` bytes.
unsafe fn checked_size<T: GrowableStruct>(ptr: *const T, size: usize, input: bool) -> FfiResult<usize> {
    let name = T::NAME;
    let known = size_of::<T>();
    debug_assert_eq!(T::SIZES.last(), Some(&known), "{name}: SIZES must end with size_of");
    let expected = || {
        let sizes: Vec<String> = T::SIZES.iter().map(usize::to_string).collect();
        format!(
            "set it to sizeof({name}) ({known} bytes with the header of this library, lava-flow {}; the sizes it \
             takes are {} and, from newer headers, larger ones)",
            env!("CARGO_PKG_VERSION"),
            sizes.join(", ")
        )
    };
    if size == 0 {
        return Err(Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("{name}.struct_size is 0: {}", expected()),
        });
    }
    if size > MAX_STRUCT_SIZE || size < T::SIZES[0] || (size <= known && !T::SIZES.contains(&size)) {
        return Err(Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("{name}.struct_size is {size}, not a size of {name}: {}", expected()),
        });
    }
    if input && size > known {
        // SAFETY: the caller promises `size` readable bytes at `ptr`, and `known < size`.
        let unknown = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>().add(known), size - known) };
        if let Some(at) = unknown.iter().position(|&b| b != 0) {
            return Err(Failure {
                status: lf_status::LF_ERR_UNSUPPORTED,
                message: format!(
                    "{name}.struct_size is {size} but this library (lava-flow {}) knows {known} bytes of {name}, and \
                     byte {} is set: the header is newer than the library, and a setting this library does not have \
                     is used; run with the library of that header, or leave the newer settings 0",
                    env!("CARGO_PKG_VERSION"),
                    known + at
                ),
            });
        }
    }
    Ok(size.min(known))
}

/// Reads the struct C passed at `ptr` (non-NULL), as far as its `struct_size` says; fields past
/// it are 0. `zero_means_default`: a `struct_size` of 0 is allowed when the struct is all
/// zeros (`T c = {0};`), and gives `T::default()`.
///
/// # Safety
/// `ptr` must be readable for its `struct_size` bytes (for `T`'s oldest size when that is 0).
pub(crate) unsafe fn read_struct<T: GrowableStruct>(ptr: *const T, zero_means_default: bool) -> FfiResult<T> {
    // SAFETY: the caller promises a readable struct, which starts with its u32 size.
    let size = unsafe { ptr.cast::<u32>().read() } as usize;
    if size == 0 && zero_means_default {
        // SAFETY: every published header's struct has at least the oldest size.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), T::SIZES[0]) };
        if bytes.iter().all(|&b| b == 0) {
            return Ok(T::default());
        }
        return Err(Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!(
                "{0}.struct_size is 0 but other fields are set: set struct_size to sizeof({0}) (or fill the struct \
                 with {0}_init); a struct of zeros alone means the defaults",
                T::NAME
            ),
        });
    }
    // SAFETY: as promised by the caller.
    let len = unsafe { checked_size(ptr, size, true) }?;
    let mut value = T::default();
    // SAFETY: `len` is at most size_of::<T>() and at most the caller's size; every bit pattern
    // is a valid T (GrowableStruct's contract).
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&mut value as *mut T).cast::<u8>(), len) };
    Ok(value)
}

/// Writes `value` into the caller's struct at `ptr` (non-NULL) of `size` bytes: the part this
/// library knows, zeros after it, and `struct_size` set to `size`.
///
/// # Safety
/// `ptr` must be writable for `size` bytes.
pub(crate) unsafe fn write_struct<T: GrowableStruct>(ptr: *mut T, size: usize, value: T) -> FfiResult<()> {
    // SAFETY: nothing is read for an output struct.
    let len = unsafe { checked_size(ptr, size, false) }?;
    let bytes = ptr.cast::<u8>();
    // SAFETY: the caller promises `size` writable bytes; `len <= size` and `len <= size_of::<T>()`.
    unsafe {
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), bytes, len);
        std::ptr::write_bytes(bytes.add(len), 0, size - len);
        ptr.cast::<u32>().write(size as u32);
    }
    Ok(())
}

/// The `struct_size` the caller set in an output struct at `ptr` (non-NULL), checked, for
/// [`write_struct`].
///
/// # Safety
/// `ptr` must be readable for 4 bytes.
pub(crate) unsafe fn output_struct_size<T: GrowableStruct>(ptr: *const T) -> FfiResult<usize> {
    // SAFETY: the caller promises a struct whose first field is its size.
    let size = unsafe { ptr.cast::<u32>().read() } as usize;
    // SAFETY: nothing is read for an output struct.
    unsafe { checked_size(ptr, size, false) }?;
    Ok(size)
}
