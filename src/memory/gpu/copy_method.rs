//! [`CopyMethod`]: how GPU copies between buffers are made, and [`GPU_COPY_ENV`], which the
//! device reads when it opens.

use crate::error::{Error, Result};

/// How the GPU makes a copy between two buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMethod {
    /// The fastest the process has for the size on this device: CUDA where the application
    /// already uses CUDA on the device (see [`CopyMethod::Cuda`]; never for a copy that waits
    /// on semaphores); otherwise the shader for copies of
    /// [`SHADER_COPY_MIN`](super::SHADER_COPY_MIN) bytes and more on GPUs, the engine otherwise
    /// (and on CPU devices such as lavapipe, where the engine is a `memcpy`). [`GPU_COPY_ENV`]
    /// can force any one.
    #[default]
    Auto,
    /// `vkCmdCopyBuffer`: on NVIDIA GPUs the copy engines, a fraction of the memory's
    /// bandwidth for large copies.
    Engine,
    /// A compute shader: every shader core reads and writes 16-byte vectors (4-byte words
    /// where the source and destination offsets are congruent mod 4 but not mod 16), near the
    /// memory's bandwidth. The engine still copies the unaligned bytes at the ends, and whole
    /// copies whose offsets are not congruent mod 4.
    Shader,
    /// CUDA's own copy (`cuMemcpyDtoDAsync` on a stream of lava-flow's, waited for) on the
    /// arenas' memory imported into CUDA once per arena, in the primary context of the CUDA
    /// device that is the Vulkan device: on NVIDIA's driver a Vulkan submission and its fence
    /// cost as much as CUDA's whole copy up to a few MiB. NVIDIA GPUs only; not for copies that
    /// wait on semaphores. `Auto` takes it only where the application already uses CUDA, since
    /// making a CUDA context costs hundreds of MiB of GPU memory.
    Cuda,
}

impl CopyMethod {
    /// `auto`, `engine`, `shader` or `cuda`, as [`GPU_COPY_ENV`] takes them.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyMethod::Auto => "auto",
            CopyMethod::Engine => "engine",
            CopyMethod::Shader => "shader",
            CopyMethod::Cuda => "cuda",
        }
    }
}

impl std::str::FromStr for CopyMethod {
    type Err = Error;

    /// `auto`, `engine`, `shader` or `cuda` (any case, spaces around ignored).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(CopyMethod::Auto),
            "engine" => Ok(CopyMethod::Engine),
            "shader" => Ok(CopyMethod::Shader),
            "cuda" => Ok(CopyMethod::Cuda),
            _ => Err(Error::invalid(format!(
                "{s:?} is not a GPU copy method; the methods are auto, engine, shader and cuda"
            ))),
        }
    }
}

impl std::fmt::Display for CopyMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment variable that says how [`CopyMethod::Auto`] copies (every copy but those
/// of `copy_buffer_timed_with` with another method) are made: `auto` (the default: by size,
/// device and whether the process uses CUDA), `engine`, `shader` or `cuda`. Read when a device opens; another value makes opening
/// fail (`InvalidArgument`).
pub const GPU_COPY_ENV: &str = crate::env::GPU_COPY.name;

/// The method [`GPU_COPY_ENV`] sets (`Auto` where it is unset or empty).
pub(crate) fn copy_method_from_env() -> Result<CopyMethod> {
    match std::env::var(GPU_COPY_ENV) {
        Ok(v) if !v.trim().is_empty() => v.parse().map_err(|_| {
            Error::invalid(format!(
                "{GPU_COPY_ENV}={v:?}: the accepted values are auto, engine, shader and cuda; unset it for auto"
            ))
        }),
        _ => Ok(CopyMethod::Auto),
    }
}
