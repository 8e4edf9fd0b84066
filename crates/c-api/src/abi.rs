//! How enums and growable structs cross the C boundary.
//!
//! Enums: the header declares each as a C enum (fixed to `uint32_t` where C allows it, else a
//! `uint32_t` typedef), and the functions and fields that take one from C are declared with
//! the `raw` alias of the same name (the `raw` module), a `u32`: C may pass any value, and a Rust enum must
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
/// `Default` gives the defaults with `struct_size` set: what the `_init` functions write, and
/// what the fields a caller's older, shorter struct lacks are taken from.
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
/// it keep their defaults. `zero_means_default`: a `struct_size` of 0 is allowed when the
/// struct is all zeros (`T c = {0};`), and gives `T::default()`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel_config::{lf_channel_config, lf_channel_config_init, lf_wait_strategy};
    use crate::context::lf_gpu_policy;
    use crate::context::{lf_context_config, lf_context_config_init, lf_context_create, lf_context_free};
    use crate::device::{lf_context_device_info, lf_device_info};
    use crate::tests::last_error;
    use std::mem::{offset_of, size_of};
    use std::ptr;

    /// A struct of a newer header: this library's struct and `extra` bytes after it.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer<T> {
        known: T,
        extra: [u64; 2],
    }

    fn create(config: *const lf_context_config) -> lf_status {
        let mut context = ptr::null_mut();
        // SAFETY: `config` points to a readable struct of its struct_size bytes; out is writable.
        let status = unsafe { lf_context_create(config, &mut context) };
        // SAFETY: NULL or a context just made.
        unsafe { lf_context_free(context) };
        status
    }

    #[test]
    fn the_structs_have_no_padding_and_their_published_sizes() {
        assert_eq!(offset_of!(lf_context_config, gpu_arena_size) + 8, size_of::<lf_context_config>());
        assert_eq!(offset_of!(lf_channel_config, slow_consumer_timeout_ns) + 8, size_of::<lf_channel_config>());
        assert_eq!(offset_of!(lf_device_info, memory_type_heaps) + 128, size_of::<lf_device_info>());
        assert_eq!(lf_context_config::SIZES.last(), Some(&size_of::<lf_context_config>()));
        assert_eq!(lf_channel_config::SIZES.last(), Some(&size_of::<lf_channel_config>()));
        assert_eq!(lf_device_info::SIZES.last(), Some(&size_of::<lf_device_info>()));
    }

    #[test]
    fn a_context_config_of_zeros_means_the_defaults_and_needs_its_size_otherwise() {
        let disabled = lf_gpu_policy::LF_GPU_DISABLED as u32;
        // SAFETY: all-zero bytes are a valid lf_context_config.
        let zeros: lf_context_config = unsafe { std::mem::zeroed() };
        assert_eq!(create(&zeros), lf_status::LF_OK);
        let forgot_size = lf_context_config { struct_size: 0, gpu_policy: disabled, ..zeros };
        assert_eq!(create(&forgot_size), lf_status::LF_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("struct_size is 0 but other fields are set"), "{}", last_error());
        let mut config = forgot_size;
        // SAFETY: config is writable for its size.
        assert_eq!(unsafe { lf_context_config_init(&mut config, size_of::<lf_context_config>()) }, lf_status::LF_OK);
        assert_eq!(config.struct_size as usize, size_of::<lf_context_config>());
        assert_eq!(config.gpu_policy, 0, "init gives the defaults");
        assert_eq!(create(&lf_context_config { gpu_policy: disabled, ..config }), lf_status::LF_OK);
    }

    #[test]
    fn a_size_that_is_not_one_of_the_struct_is_refused_naming_the_sizes() {
        for size in [4, 12, 55, 5000, u32::MAX] {
            let config = lf_context_config { struct_size: size, ..Default::default() };
            assert_eq!(create(&config), lf_status::LF_ERR_INVALID_ARGUMENT, "{size}");
            let message = last_error();
            assert!(
                message.contains(&format!("lf_context_config.struct_size is {size}, not a size of lf_context_config"))
                    && message.contains("set it to sizeof(lf_context_config) (56 bytes"),
                "{message}"
            );
        }
        let mut config = lf_channel_config::default();
        // SAFETY: config is writable for the sizes given (all at most its own).
        unsafe {
            assert_eq!(lf_channel_config_init(&mut config, 0), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("lf_channel_config.struct_size is 0"), "{}", last_error());
            assert_eq!(lf_channel_config_init(&mut config, 8), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("is 8, not a size of lf_channel_config"), "{}", last_error());
            assert_eq!(lf_channel_config_init(ptr::null_mut(), 56), lf_status::LF_ERR_NULL_POINTER);
        }
        let zero_size = lf_channel_config { struct_size: 0, ..Default::default() };
        // SAFETY: a readable struct.
        let err = unsafe { read_struct(&zero_size, false) }.err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_INVALID_ARGUMENT);
        assert!(err.message.contains("lf_channel_config.struct_size is 0"), "{}", err.message);
    }

    #[test]
    fn a_newer_header_is_taken_when_its_new_fields_are_zero() {
        let size = size_of::<Newer<lf_context_config>>() as u32;
        let disabled = lf_gpu_policy::LF_GPU_DISABLED as u32;
        let mut newer = Newer {
            known: lf_context_config { struct_size: size, gpu_policy: disabled, ..Default::default() },
            extra: [0; 2],
        };
        assert_eq!(create(&newer.known), lf_status::LF_OK);
        newer.extra[1] = 1;
        assert_eq!(create(&newer.known), lf_status::LF_ERR_UNSUPPORTED);
        let message = last_error();
        assert!(
            message.contains("struct_size is 72 but this library")
                && message.contains("knows 56 bytes of lf_context_config, and byte 64 is set")
                && message.contains("the header is newer than the library"),
            "{message}"
        );

        let mut channel = Newer { known: lf_channel_config::default(), extra: [7; 2] };
        let size = size_of::<Newer<lf_channel_config>>();
        // SAFETY: `channel` is writable for `size` bytes.
        assert_eq!(unsafe { lf_channel_config_init(&mut channel.known, size) }, lf_status::LF_OK);
        assert_eq!(channel.known.struct_size as usize, size);
        assert_eq!(channel.extra, [0; 2], "what the library does not know is zeroed");
        assert_eq!(channel.known.wait_strategy, lf_wait_strategy::LF_WAIT_SPIN_THEN_BLOCK as u32);
        // SAFETY: readable for its struct_size bytes.
        let read = unsafe { read_struct(&channel.known, false) }.ok().unwrap();
        assert_eq!(read.capacity, 256);
        channel.extra[0] = 1;
        // SAFETY: as above.
        let err = unsafe { read_struct(&channel.known, false) }.err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_UNSUPPORTED);
    }

    #[test]
    fn output_structs_are_written_as_far_as_their_size_says() {
        let mut newer = Newer { known: lf_device_info::default(), extra: [u64::MAX; 2] };
        let size = size_of::<lf_device_info>() + 8;
        newer.known.struct_size = size as u32;
        // SAFETY: `newer` is writable for more than `size` bytes.
        unsafe {
            let size = output_struct_size(&newer.known).ok().unwrap();
            write_struct(&mut newer.known, size, lf_device_info { index: 3, ..Default::default() }).ok().unwrap();
        }
        assert_eq!((newer.known.index, newer.known.struct_size as usize), (3, size));
        assert_eq!(newer.extra, [0, u64::MAX], "zeros up to struct_size, nothing after it");

        // A bad size is refused before anything is written, with or without a GPU.
        let mut context = ptr::null_mut();
        let mut info = lf_device_info { struct_size: 100, index: 9, ..Default::default() };
        // SAFETY: out-pointers writable; the context is made here.
        unsafe {
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            assert_eq!(lf_context_device_info(context, &mut info), lf_status::LF_ERR_INVALID_ARGUMENT);
            lf_context_free(context);
        }
        assert!(last_error().contains("lf_device_info.struct_size is 100"), "{}", last_error());
        assert_eq!(info.index, 9);
    }

    #[test]
    fn enum_values_are_checked_and_the_valid_names_listed() {
        assert_eq!(lf_wait_strategy::from_c(3, "w").ok(), Some(lf_wait_strategy::LF_WAIT_BLOCK));
        let err = lf_wait_strategy::from_c(0, "wait_strategy").err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_INVALID_ARGUMENT);
        assert_eq!(
            err.message,
            "wait_strategy is 0, not an lf_wait_strategy: use LF_WAIT_BUSY_POLL (1), LF_WAIT_SPIN_THEN_BLOCK (2) or \
             LF_WAIT_BLOCK (3)"
        );
    }
}
