//! The GPU settings of a [`Context`](super::Context): whether to open Vulkan at all, which
//! device, and what a GPU request without a device means. Plain data, in every build (with
//! or without the `vulkan` feature).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// What [`Context::new`](super::Context::new) does about the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuPolicy {
    /// Open Vulkan eagerly; where there is no loader, driver or usable device, go on without a
    /// GPU and record why ([`Context::gpu_unavailable_reason`](super::Context::gpu_unavailable_reason)).
    /// GPU allocations then fall back to CPU memory, visibly, unless `strict_gpu` is set. A
    /// device that was asked for by index or deviceUUID and does not exist is still an error.
    #[default]
    Auto,
    /// Open Vulkan eagerly and fail `Context::new` with the Vulkan error when it cannot.
    Required,
    /// Touch no GPU API: no Vulkan device, no CUDA registration of GPU-pinned memory.
    Disabled,
}

impl GpuPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuPolicy::Auto => "auto",
            GpuPolicy::Required => "required",
            GpuPolicy::Disabled => "disabled",
        }
    }
}

/// Which physical device to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSelector {
    /// The n-th device the loader enumerates (the order of `vulkaninfo --summary`).
    Index(u32),
    /// The device whose `deviceUUID` is this (equal to CUDA's device UUID on NVIDIA).
    Uuid([u8; 16]),
}

impl FromStr for DeviceSelector {
    type Err = Error;

    /// A decimal index, or a 32-digit hex UUID (dashes and a `GPU-` prefix allowed).
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse::<u32>()
                .map(DeviceSelector::Index)
                .map_err(|e| Error::invalid(format!("Vulkan device index {text:?}: {e}")));
        }
        let hex: String = text.strip_prefix("GPU-").unwrap_or(text).chars().filter(|&c| c != '-').collect();
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "Vulkan device selector {text:?} is neither a device index nor a deviceUUID \
                 (32 hex digits, e.g. 6d657361-3232-2e33-2e36-000000000000)"
            )));
        }
        let mut uuid = [0u8; 16];
        for (i, byte) in uuid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex digits");
        }
        Ok(DeviceSelector::Uuid(uuid))
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Index(i) => write!(f, "index {i}"),
            DeviceSelector::Uuid(u) => write!(f, "deviceUUID {}", format_uuid(u)),
        }
    }
}

/// The UUID in the 8-4-4-4-12 form `vulkaninfo` prints.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_indices_and_uuids() {
        assert_eq!("3".parse::<DeviceSelector>().unwrap(), DeviceSelector::Index(3));
        let u = "6d657361-3232-2e33-2e36-000000000000".parse::<DeviceSelector>().unwrap();
        let DeviceSelector::Uuid(bytes) = u else { panic!("not a uuid") };
        assert_eq!(format_uuid(&bytes), "6d657361-3232-2e33-2e36-000000000000");
        assert_eq!("GPU-6d6573613232 2e332e36000000000000".parse::<DeviceSelector>().ok(), None);
        assert!(matches!("gpu0".parse::<DeviceSelector>(), Err(Error::InvalidArgument(_))));
        assert!(matches!("99999999999".parse::<DeviceSelector>(), Err(Error::InvalidArgument(_))));
    }
}
