//! Allocation: one API for every location, and the automatic choice between peers.

use std::ptr::NonNull;
use std::sync::Arc;

use super::arena::{Arena, Pool, Strategy};
use super::buffer::{Backing, Buffer, BufferParts};
use super::config::HugepagePolicy;
use super::context::Context;
use super::location::{HugePageSize, MemoryLocation};
use super::registry::BufferOrigin;
use crate::error::{Error, Result};
use crate::types::{detect_scope, CommunicationScope, ProcessLocation};

/// The location (and hugepage policy) [`Context::allocate_auto`] picks for a buffer that
/// `mine` fills and `peer` reads:
///
/// - Different hosts (the data goes through MPI): huge-page staging memory (2 MiB pages),
///   best-effort, since it only speeds the transfer up and must not make it fail.
/// - Same host, and the host has several NUMA nodes and `mine` names one: memory bound to
///   `mine`'s node (the writer's; a reader on another node still maps it).
/// - Same host otherwise: standard shareable memory.
///
/// Every choice is shareable memory, so the buffer can be exported to a local peer. GPU
/// locations join the policy with the Vulkan layer.
pub fn auto_location(
    mine: &ProcessLocation,
    peer: &ProcessLocation,
    numa_nodes: &[u32],
) -> (MemoryLocation, HugepagePolicy) {
    match detect_scope(mine, peer) {
        CommunicationScope::Remote => {
            (MemoryLocation::CpuHugepage { page: HugePageSize::Size2M }, HugepagePolicy::BestEffort)
        }
        CommunicationScope::Local => match mine.node_id {
            Some(node) if numa_nodes.len() > 1 && numa_nodes.contains(&node) => {
                (MemoryLocation::CpuNuma { node: Some(node) }, HugepagePolicy::Strict)
            }
            _ => (MemoryLocation::CpuStandard, HugepagePolicy::Strict),
        },
    }
}

impl Context {
    /// Allocates `size` bytes at `location`, with the context's hugepage policy. The buffer
    /// says what it really obtained ([`Buffer::location`], [`Buffer::page_size`]).
    ///
    /// GPU locations come from the context's Vulkan device (pooled, exportable arenas).
    /// Without a device they fall back to CPU standard memory, visibly
    /// ([`Buffer::location`], [`Buffer::fallback`]), or fail under `strict_gpu`.
    /// GPU-pinned memory is registered with Vulkan and CUDA where present
    /// ([`Buffer::registrations`]).
    ///
    /// Errors: size 0 or an unknown NUMA node (InvalidArgument, naming the nodes there are);
    /// more than the host (or the GPU heap) has, or no huge pages reserved under the strict
    /// policy (OutOfMemory, saying how to reserve them); a locked-memory limit too small for
    /// GPU-pinned memory (PermissionDenied, naming the limit); a GPU location without a
    /// device under `strict_gpu` (Unsupported, saying why there is no device).
    pub fn allocate(&self, size: usize, location: MemoryLocation) -> Result<Buffer> {
        self.allocate_with(size, location, self.inner.config.hugepage_policy)
    }

    /// [`Context::allocate`] with an explicit hugepage policy for this one call.
    pub fn allocate_with(&self, size: usize, location: MemoryLocation, policy: HugepagePolicy) -> Result<Buffer> {
        if location.is_gpu() {
            return self.allocate_gpu(size, location, policy);
        }
        self.check_size(size, location)?;
        let strategy = match location {
            MemoryLocation::CpuStandard => Strategy::Standard,
            MemoryLocation::CpuNuma { node } => Strategy::Numa(self.inner.topology.resolve(node)?),
            MemoryLocation::CpuHugepage { page } => Strategy::Hugetlb(page),
            MemoryLocation::CpuGpuPinned => Strategy::Pinned,
            MemoryLocation::GpuDeviceLocal | MemoryLocation::GpuHostVisible => unreachable!("handled above"),
            MemoryLocation::CudaDevice { ordinal } => {
                return Err(Error::invalid(format!(
                    "lava-flow does not allocate CUDA memory (CUDA device {ordinal} was asked for): allocate it \
                     with CUDA and register it (Context::register), or allocate lava-flow GPU memory \
                     (MemoryLocation::GpuDeviceLocal)"
                )))
            }
        };
        match self.allocate_from(strategy, size) {
            Err(why @ (Error::OutOfMemory(_) | Error::Unsupported(_)))
                if matches!(strategy, Strategy::Hugetlb(_)) && policy == HugepagePolicy::BestEffort =>
            {
                let mut buffer = self.allocate_from(Strategy::TransparentHuge, size)?;
                let why = why.to_string();
                let why = why.strip_suffix(super::cpu::hugepage::BEST_EFFORT_HINT).unwrap_or(&why);
                let reason = format!(
                    "{location} was asked for with the best-effort hugepage policy, but {why}; the buffer is \
                     CPU standard memory (transparent huge pages advised, base pages promised)"
                );
                crate::logging::log_first!(log::Level::Info, "{size} bytes: {reason}");
                buffer.set_fallback(reason);
                Ok(buffer)
            }
            result => result,
        }
    }

    /// Allocates `size` bytes where [`auto_location`] says suits traffic from `mine` to `peer`.
    pub fn allocate_auto(&self, size: usize, mine: &ProcessLocation, peer: &ProcessLocation) -> Result<Buffer> {
        let (location, policy) = auto_location(mine, peer, self.numa_nodes());
        log::debug!(
            "{size} bytes for traffic to a peer on {:?}: {location} ({policy:?} hugepage policy)",
            peer.hostname
        );
        self.allocate_with(size, location, policy)
    }

    fn check_size(&self, size: usize, location: MemoryLocation) -> Result<()> {
        if size == 0 {
            return Err(Error::invalid(format!("size 0 asked for {location}: a buffer needs at least one byte")));
        }
        let limit = match location {
            MemoryLocation::CpuGpuPinned => self.inner.ram,
            _ => self.inner.memory_limit,
        };
        if size as u64 > limit || size > isize::MAX as usize / 2 {
            return Err(Error::OutOfMemory(format!(
                "{size} bytes asked for {location}, more than this host can ever give ({limit} bytes of {})",
                if location == MemoryLocation::CpuGpuPinned { "RAM" } else { "RAM and swap" }
            )));
        }
        Ok(())
    }

    fn pool(&self, strategy: Strategy) -> Arc<Pool> {
        if let Some(pool) = self.inner.pools.read().get(&strategy) {
            return Arc::clone(pool);
        }
        let size = strategy.pooled_arena_size(self.inner.config.arena_size);
        let mut pools = self.inner.pools.write();
        Arc::clone(pools.entry(strategy).or_insert_with(|| Arc::new(Pool::new(strategy, size))))
    }

    fn allocate_from(&self, strategy: Strategy, size: usize) -> Result<Buffer> {
        let pool = self.pool(strategy);
        let (arena, offset, backing) = if pool.serves(size) {
            let block = pool.allocate(size, &self.inner.topology, &self.inner.gpu)?;
            let arena = Arc::clone(&block.arena);
            (
                arena,
                block.offset,
                Backing::Pooled { pool, arena: block.arena, offset: block.offset, range: block.range },
            )
        } else {
            let page = strategy.page_size();
            let rounded = size
                .checked_next_multiple_of(page)
                .ok_or_else(|| Error::OutOfMemory(format!("{size} bytes cannot be rounded up to {page}-byte pages")))?;
            let arena = Arc::new(Arena::create(strategy, rounded, &self.inner.topology, &self.inner.gpu)?);
            (Arc::clone(&arena), 0, Backing::Dedicated { arena })
        };
        // SAFETY: offset + size lies inside the arena's mapping (the block or the arena is at
        // least `size` bytes), so the pointer is non-null and in bounds.
        let ptr = unsafe { NonNull::new_unchecked(arena.mapping.as_ptr().add(offset)) };
        let parts = BufferParts {
            ptr: Some(ptr),
            len: size,
            location: arena.location,
            page_size: arena.page_size,
            origin: BufferOrigin::Allocated,
            backing,
        };
        Buffer::new(parts, &self.inner.registry, false)
    }

    /// A GPU location: from the device's pooled exportable arenas, or, without a device,
    /// CPU standard memory that says it fell back (an error under `strict_gpu`).
    fn allocate_gpu(&self, size: usize, location: MemoryLocation, policy: HugepagePolicy) -> Result<Buffer> {
        #[cfg(feature = "vulkan")]
        if let Some(open) = &self.inner.gpu.open {
            let gpu = open.allocate(size, location)?;
            return self.gpu_buffer(gpu, BufferOrigin::Allocated);
        }
        let reason = self.inner.gpu.reason();
        if self.inner.config.strict_gpu {
            return Err(Error::Unsupported(format!(
                "{location} of {size} bytes: this context has no Vulkan device and strict_gpu forbids \
                 the CPU fallback: {reason}"
            )));
        }
        let mut buffer = self.allocate_with(size, MemoryLocation::CpuStandard, policy)?;
        let fallback = format!(
            "{location} was asked for, but this context has no Vulkan device ({reason}); the buffer is CPU standard memory"
        );
        crate::logging::log_first!(
            log::Level::Warn,
            "{size} bytes: {fallback}. Set strict_gpu to make this an error instead"
        );
        buffer.set_fallback(fallback);
        Ok(buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(host: &str, node: Option<u32>) -> ProcessLocation {
        ProcessLocation::new(host, node, None).unwrap()
    }

    #[test]
    fn auto_policy_follows_scope_and_numa() {
        let (remote, policy) = auto_location(&at("a", Some(0)), &at("b", Some(0)), &[0]);
        assert_eq!(remote, MemoryLocation::CpuHugepage { page: HugePageSize::Size2M });
        assert_eq!(policy, HugepagePolicy::BestEffort);
        assert_eq!(auto_location(&at("a", Some(0)), &at("a", None), &[0]).0, MemoryLocation::CpuStandard);
        assert_eq!(
            auto_location(&at("a", Some(1)), &at("A", Some(0)), &[0, 1]).0,
            MemoryLocation::CpuNuma { node: Some(1) }
        );
        assert_eq!(auto_location(&at("a", Some(7)), &at("a", None), &[0, 1]).0, MemoryLocation::CpuStandard);
    }
}
