//! Moving data without writing Vulkan code: host writes and reads, GPU copies between
//! buffers, and mapping.
//!
//! - Host writes go straight into memory the host may write (host memory, and the GPU's own
//!   memory behind a resizable BAR); host reads straight out of memory the host caches.
//!   Everything else is staged: in pieces through a few pinned staging buffers, the host's
//!   copy of one piece overlapping the GPU's copy of another.
//! - Large host copies run on several threads (`LF_COPY_THREADS`).
//!
//! Every operation is synchronous: it submits its command buffers on the device's queue and
//! waits for their fences, so the data is in place when the call returns.
//!
//! GPU copies between buffers ([`copy_buffer`] and its variants, and so `Context::copy`,
//! `lf_buffer_copy` and the GPU channel route) are made one of three ways ([`CopyMethod`]):
//! by the copy engine (`vkCmdCopyBuffer`), which on an NVIDIA H200 moves large copies at about
//! a fifth of cudaMemcpy's rate, or by a compute shader in which every shader core
//! reads and writes 16-byte vectors (4-byte words where the offsets are congruent mod 4 only;
//! `super::shader_copy`), the engine copying the unaligned bytes at the ends.
//! [`CopyMethod::Auto`] gives the shader copies of [`SHADER_COPY_MIN`] bytes and more between
//! `DEVICE_LOCAL` memory on GPUs, and the engine the rest: small copies, host memory, offsets
//! not congruent mod 4, CPU devices (lavapipe, whose engine is a `memcpy`). Or, where the
//! process already uses CUDA on the device ([`copies_by_cuda`]), by CUDA (`super::cuda`) for
//! every copy between `DEVICE_LOCAL` memory that waits on no semaphore. [`GPU_COPY_ENV`]
//! (`LF_GPU_COPY=auto|engine|shader|cuda`, read when the device opens) forces one method for
//! every `Auto` copy; [`copy_buffer_timed_with`] takes one per call.
//!
//! Its parts, each on the ones before: `submitter` (the device's transfer queue: command
//! buffers, submission, fences), `staging` (staged host transfers, in pieces), `host_io`
//! (writes, reads and mapping of a `GpuBuffer`) and `copy` (copies between GPU buffers, and
//! how each is made).
//!
//! [`CopyMethod`]: super::CopyMethod
//! [`CopyMethod::Auto`]: super::CopyMethod::Auto
//! [`GPU_COPY_ENV`]: super::GPU_COPY_ENV

mod copy;
mod host_io;
mod staging;
mod submitter;

pub use copy::{
    chosen_copy_method, copies_by_cuda, copy_buffer, copy_buffer_timed, copy_buffer_timed_with, copy_buffer_waiting,
    shader_copy_unavailable, CopyTiming, SHADER_COPY_MIN,
};
pub use host_io::MappedRange;
