//! A failed Vulkan call as the crate's error: the one mapping every GPU module uses.

use ash::vk;

use crate::error::Error;

/// Maps a failed call's `vk::Result` to an error that says `what` failed; running out of host
/// or device memory is `OutOfMemory`.
pub(crate) fn vk_err(what: &str) -> impl Fn(vk::Result) -> Error + '_ {
    move |r| match r {
        vk::Result::ERROR_OUT_OF_HOST_MEMORY | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => {
            Error::OutOfMemory(format!("{what}: {r}"))
        }
        _ => Error::Vulkan(format!("{what}: {r}")),
    }
}
