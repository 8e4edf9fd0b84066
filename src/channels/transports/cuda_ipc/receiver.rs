//! The consumer's half of the CUDA IPC route: the producer's allocations opened here, by
//! slot, closed when the producer says they changed, when more are open than the cache
//! allows (least recently used first, never one a held message points into), or when the
//! producer has gone and no message holds them. Memory of a CUDA memory pool is imported only
//! while a message into it is held (see `pool`). A span of VMM pieces is mapped into one
//! address range, each piece at its offset; it has no Vulkan view (Vulkan imports one fd per
//! `VkDeviceMemory`, and a buffer is bound to one memory).

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::sync::Arc;

use super::cuda::{Mapping, Opener};
use super::pool::{Pool, PoolMapping};
use super::wire::{
    is_arena, AllocationRecord, Announce, Descriptor, PieceRecord, Section, ANSWER_ARENAS, ANSWER_CUDA, MAX_PIECES,
    MAX_SLOTS, MEMORY_LEGACY, MEMORY_POOL, MEMORY_VMM_SPAN, OFFER_ARENAS, OFFER_NO_CUDA_MEMORY,
};
use super::{format_uuid, format_uuids, ID, ROUTE_ID};
use crate::channels::ready::SharedReady;
use crate::channels::transport::{
    Attachment, PayloadClass, Route, RouteReceiver, RoutedMemory, RoutedPayload, TransportId,
};
use crate::error::{Error, Result};
use crate::memory::Buffer;

/// How many of one producer's allocations stay open at once, by default.
pub(crate) const OPEN_BOUND: usize = 64;

/// An allocation opened here: what a message's payload points into.
struct Import {
    mapping: Box<dyn Mapping>,
    /// Whether the mapping is made per held message (pool memory): told of each release.
    per_message: bool,
    /// A VMM piece where this process's Vulkan device is the CUDA device that holds it: the
    /// piece imported into Vulkan as well, when a message's buffer is first asked for.
    #[cfg(feature = "vulkan")]
    vulkan: Option<VulkanImport>,
}

/// What a VMM piece's Vulkan import needs, and the import once made (`None`: it failed, and
/// the log says why).
#[cfg(feature = "vulkan")]
struct VulkanImport {
    importer: crate::memory::gpu::GpuImporter,
    fd: OwnedHandle,
    size: u64,
    id: crate::memory::gpu::ArenaId,
    imported: std::sync::OnceLock<Option<Arc<crate::memory::gpu::GpuBuffer>>>,
    /// The producer's ready semaphore as this process imported it, which the work on a
    /// message's Vulkan view waits for.
    ready: Option<Arc<crate::memory::gpu::TimelineSemaphore>>,
}

#[cfg(feature = "vulkan")]
impl VulkanImport {
    fn buffer(&self) -> Option<&Arc<crate::memory::gpu::GpuBuffer>> {
        self.imported
            .get_or_init(|| {
                let imported = self
                    .fd
                    .try_clone()
                    .map_err(|e| Error::os("duplicating a CUDA VMM piece's fd", e))
                    .and_then(|fd| self.importer.import_foreign_opaque_fd(fd, self.size, self.id));
                match imported {
                    Ok(buffer) => Some(Arc::new(buffer)),
                    Err(e) => {
                        log::warn!("the producer's CUDA VMM piece could not be imported into Vulkan: {e}");
                        None
                    }
                }
            })
            .as_ref()
    }
}

impl RoutedMemory for Import {
    fn host_base(&self) -> *mut u8 {
        // Device memory: the host has no address for it.
        std::ptr::null_mut()
    }

    #[cfg(feature = "vulkan")]
    fn view(&self, offset: u64, len: usize, ready_value: u64) -> Option<Buffer> {
        let vulkan = self.vulkan.as_ref()?;
        let whole = Arc::clone(vulkan.buffer()?);
        let origin = crate::memory::BufferOrigin::Imported { exporter_pid: vulkan.id.exporter_pid };
        let wait = vulkan.ready.as_ref().filter(|_| ready_value != 0).map(|s| (Arc::clone(s), ready_value));
        Some(Buffer::gpu_view_mapped(whole, offset, len, std::ptr::null_mut(), wait, origin))
    }

    #[cfg(not(feature = "vulkan"))]
    fn view(&self, _offset: u64, _len: usize, _ready_value: u64) -> Option<Buffer> {
        None
    }

    fn released(&self, _seq: u64) {
        if self.per_message {
            self.mapping.let_go();
        }
    }

    fn cuda(&self) -> Option<(u64, i32)> {
        Some((self.mapping.address(), self.mapping.device()))
    }
}

/// An allocation of this very process (the producer is a thread here): nothing to open or
/// close.
struct SameProcess {
    address: u64,
    device: i32,
}

impl Mapping for SameProcess {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.device
    }
}

/// A slot's allocation: what the producer announced (with a VMM piece's fd, to open it again
/// after the cache closed it), the import while open, and the last message into it.
struct Slot {
    generation: u32,
    allocation: Announce,
    fd: Option<OwnedHandle>,
    /// A span's pieces, each with its fd, in order.
    pieces: Vec<(PieceRecord, OwnedHandle)>,
    /// The pool of a pool allocation, as announced before it.
    pool: Option<Arc<Pool>>,
    /// This process's ordinal of the device that holds the memory.
    device: i32,
    open: Option<Arc<Import>>,
    last_seq: Option<u64>,
    /// When a message last named it (the cache closes the least recently used).
    used: u64,
}

/// The consumer's side of the route for one producer.
pub(crate) struct Receiver {
    opener: Arc<dyn Opener>,
    /// This process's Vulkan device, which imports VMM pieces of its own CUDA device.
    #[cfg(feature = "vulkan")]
    vulkan: Option<crate::memory::gpu::GpuImporter>,
    /// The UUIDs of this process's CUDA devices, by ordinal (empty: it cannot open CUDA memory).
    devices: std::result::Result<Vec<[u8; 16]>, String>,
    session: u64,
    /// Why the current producer sends no CUDA memory this way, when it does not.
    off: Option<String>,
    /// Whether the current producer offered the route.
    offered: bool,
    /// Whether the current producer sends CUDA memory (its process has CUDA).
    producer_cuda: bool,
    /// The device whose GPU buffers the current producer offers.
    producer_arenas: Option<[u8; 16]>,
    /// The ordinals of the CUDA devices this process uses: its Vulkan device's, and the one
    /// current on the thread that made the channel.
    used: Vec<i32>,
    /// The devices whose GPU buffers this process takes (bit i: ordinal i).
    arena_mask: u32,
    /// The devices holding imports, to whose memory the used devices' contexts were let reach.
    peered: Vec<i32>,
    slots: Vec<Option<Slot>>,
    /// The memory pools the producer announced, by index.
    pools: Vec<Option<Arc<Pool>>>,
    /// The pieces announced for the span whose announcement comes next: (slot, generation,
    /// piece, fd).
    pending_pieces: Vec<(u32, u32, PieceRecord, OwnedHandle)>,
    /// Imports the producer replaced or forgot while a message into them was held, with that
    /// message's sequence number.
    retired: Vec<(Arc<Import>, u64)>,
    open: usize,
    bound: usize,
    tick: u64,
    /// The carrier's last word on what is released (every message below it).
    released_below: u64,
    opened: u64,
    /// The current producer's ready semaphore, as the GPU route imported it, or why it shares
    /// none: what a message's ready value counts on.
    ready: SharedReady,
    last_ready: u64,
}

impl Receiver {
    pub(crate) fn new(
        opener: Arc<dyn Opener>,
        devices: std::result::Result<Vec<[u8; 16]>, String>,
        bound: usize,
    ) -> Receiver {
        let used: Vec<i32> = match &devices {
            Ok(d) if !d.is_empty() => opener.current_device().into_iter().collect(),
            _ => Vec::new(),
        };
        let mut receiver = Receiver {
            opener,
            #[cfg(feature = "vulkan")]
            vulkan: None,
            devices,
            session: 0,
            off: Some("no producer attached yet".into()),
            offered: false,
            producer_cuda: false,
            producer_arenas: None,
            used,
            arena_mask: 0,
            peered: Vec::new(),
            slots: Vec::new(),
            pools: Vec::new(),
            pending_pieces: Vec::new(),
            retired: Vec::new(),
            open: 0,
            bound: bound.max(1),
            tick: 0,
            released_below: 0,
            opened: 0,
            ready: Err(crate::channels::ready::NO_SHARED_READY.into()),
            last_ready: 0,
        };
        receiver.settle_arena_mask();
        receiver
    }

    /// Takes `current` as the CUDA device this process uses (with its Vulkan device's).
    pub(crate) fn with_current(mut self, current: Option<i32>) -> Receiver {
        if self.devices.as_ref().is_ok_and(|d| !d.is_empty()) {
            self.used = current.into_iter().collect();
            self.settle_arena_mask();
        }
        self
    }

    /// The GPU buffers this process takes: of the devices every GPU it uses reaches in place.
    fn settle_arena_mask(&mut self) {
        let count = self.devices.as_ref().map_or(0, Vec::len);
        let opener = &self.opener;
        self.arena_mask = super::arena::mask(count, &self.used, |a, b| opener.peer_path(a, b));
    }

    /// This process's ordinal of the device with `uuid`, if it sees it.
    fn ordinal_of(&self, uuid: &[u8; 16]) -> Option<i32> {
        self.devices.as_deref().ok()?.iter().position(|d| d == uuid).map(|i| i as i32)
    }

    /// Imports VMM pieces of `device`'s own GPU into Vulkan too, for `Message::buffer`.
    #[cfg(feature = "vulkan")]
    pub(crate) fn with_vulkan(mut self, device: Option<&crate::memory::gpu::VulkanDevice>) -> Receiver {
        self.vulkan = device.map(crate::memory::gpu::GpuImporter::new);
        if let Some(ordinal) = device.and_then(|d| self.ordinal_of(&d.info().device_uuid)) {
            if !self.used.contains(&ordinal) {
                self.used.insert(0, ordinal);
                self.settle_arena_mask();
            }
        }
        self
    }

    /// This route's answer to every producer's hello: the devices it opens memory on.
    pub(crate) fn answer(&self) -> Attachment {
        let section = match &self.devices {
            Ok(devices) if !devices.is_empty() => Section {
                flags: ANSWER_CUDA | ANSWER_ARENAS,
                devices: devices.clone(),
                arenas: self.arena_mask,
                declined: String::new(),
            },
            Ok(_) => Section { declined: "this process sees no CUDA device".into(), ..Section::default() },
            Err(why) => Section { declined: why.clone(), ..Section::default() },
        };
        Attachment::new(ROUTE_ID, section.encode())
    }

    /// How many allocations were opened (cache misses included), for tests.
    #[cfg(test)]
    pub(crate) fn opened(&self) -> u64 {
        self.opened
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!("the producer's CUDA route {what}"))
    }

    fn retire(&mut self, old: Slot) {
        if let Some(import) = old.open {
            self.open -= 1;
            if let Some(last) = old.last_seq.filter(|last| *last >= self.released_below) {
                self.retired.push((import, last));
            }
        }
    }

    /// Closes the least recently used imports that no held message points into, until fewer
    /// than the bound are open.
    fn evict(&mut self) {
        while self.open >= self.bound {
            let released_below = self.released_below;
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
                .filter(|(_, s)| s.open.is_some() && s.last_seq.map_or(true, |last| last < released_below))
                .min_by_key(|(_, s)| s.used)
                .map(|(i, _)| i);
            let Some(victim) = victim else {
                // Every open import is held by a message: the cache grows until one is released.
                return;
            };
            self.slots[victim].as_mut().expect("found above").open = None;
            self.open -= 1;
        }
    }

    /// Opens slot `index`'s allocation (again, where the cache closed it).
    #[cold]
    fn open_slot(&mut self, index: usize) -> Result<()> {
        self.evict();
        let slot = self.slots[index].as_ref().expect("the caller found it");
        let arena = is_arena(slot.allocation.memory);
        let opened = if slot.allocation.exporter_pid == std::process::id() && !arena {
            // Both ends in this process (a CUDA IPC handle does not open where it was made):
            // the producer's address is this process's.
            Ok(Box::new(SameProcess { address: slot.allocation.base, device: slot.device }) as Box<dyn Mapping>)
        } else if slot.allocation.memory == MEMORY_VMM_SPAN {
            let pieces: Vec<(u64, u64, BorrowedHandle<'_>)> =
                slot.pieces.iter().map(|(p, fd)| (p.offset, p.size, crate::os::borrow(fd))).collect();
            self.opener.open_span(&slot.allocation, &pieces, slot.device)
        } else if let Some(pool) = &slot.pool {
            pool.imported(&*self.opener).map(|imported| {
                Box::new(PoolMapping::new(imported, slot.allocation.ipc_handle, slot.device)) as Box<dyn Mapping>
            })
        } else {
            self.opener.open(&slot.allocation, slot.fd.as_ref().map(crate::os::borrow), slot.device)
        };
        let mapping = opened.map_err(|e| {
            Error::Unsupported(format!(
                "the producer's CUDA allocation ({} bytes at {:#x}, buffer id {}) cannot be opened here: {e}",
                slot.allocation.size, slot.allocation.base, slot.allocation.buffer_id
            ))
        })?;
        #[cfg(feature = "vulkan")]
        let vulkan = self.vulkan_import(index)?;
        let import = Arc::new(Import {
            per_message: mapping.per_message(),
            mapping,
            #[cfg(feature = "vulkan")]
            vulkan,
        });
        let device = self.slots[index].as_ref().expect("found above").device;
        // A VMM piece's mapping is reached only by the devices granted access to it.
        for &from in self.used.iter().filter(|&&u| u != device) {
            if self.opener.peer_path(from, device) {
                if let Err(e) = import.mapping.grant(from) {
                    log::warn!("the producer's memory on CUDA device {device} is not reached from device {from}: {e}");
                }
            }
        }
        self.slots[index].as_mut().expect("found above").open = Some(import);
        self.open += 1;
        self.opened += 1;
        self.reach(device);
        Ok(())
    }
}

impl Receiver {
    /// Checks ready value `value` of a message into slot `index`: the producer shares a ready
    /// semaphore, on the GPU that holds the memory, and values do not go backwards.
    #[cold]
    fn check_ready(&mut self, index: usize, value: u64) -> Result<()> {
        let device = self.slots[index].as_ref().expect("the caller found it").allocation.device_uuid;
        let share = match &self.ready {
            Ok(share) => share,
            Err(why) => {
                return Err(self
                    .corrupt(format!("names ready value {value}, but the producer shares no ready semaphore: {why}")))
            }
        };
        if share.device_uuid != device {
            return Err(self.corrupt(format!(
                "names ready value {value} for memory of CUDA device {}, but its ready semaphore is of GPU {}",
                format_uuid(&device),
                format_uuid(&share.device_uuid)
            )));
        }
        if value < self.last_ready {
            return Err(self.corrupt(format!(
                "names ready value {value}, below the previous message's {}: semaphore values must not go backwards",
                self.last_ready
            )));
        }
        self.last_ready = value;
        Ok(())
    }

    /// The report's line for the GPU buffers the current producer offers, if it offers any.
    fn arena_route(&self, carrier: TransportId) -> Option<Route> {
        let uuid = self.producer_arenas?;
        let staged = |why: String| Route {
            class: PayloadClass::Gpu,
            kind: carrier,
            reason: format!("GPU buffers: staged through {carrier} by the producer (copied to host memory): {why}"),
        };
        if let Some(why) = &self.off {
            return Some(staged(format!("cuda_ipc: this process cannot open CUDA memory: {why}")));
        }
        let Some(n) = self.ordinal_of(&uuid) else {
            return Some(staged(format!(
                "cuda_ipc: the producer's GPU {} is not among this process's CUDA devices (CUDA_VISIBLE_DEVICES)",
                format_uuid(&uuid)
            )));
        };
        let others: Vec<String> = self.used.iter().filter(|&&u| u != n).map(|u| format!("GPU {u}")).collect();
        if n >= 32 || self.arena_mask & (1 << n) == 0 {
            return Some(staged(format!(
                "cuda_ipc: no peer path from {} (which this process uses) to the producer's GPU {n} ({})",
                others.join(" and "),
                format_uuid(&uuid)
            )));
        }
        // Peer access is enabled only from a GPU whose CUDA context the application made.
        let (active, idle): (Vec<i32>, Vec<i32>) =
            self.used.iter().filter(|&&u| u != n).partition(|&&u| self.opener.in_use(u));
        let gpus = |list: &[i32]| list.iter().map(|u| format!("GPU {u}")).collect::<Vec<_>>().join(" and ");
        let mut access = match (active.len(), idle.len()) {
            (0, 0) if self.used.is_empty() => " (this process uses no other GPU)".to_owned(),
            (0, 0) => " (the GPU this process uses)".to_owned(),
            (0, _) => String::new(),
            _ => format!(" with peer access from {}", gpus(&active)),
        };
        if !idle.is_empty() {
            access.push_str(&format!(
                " ({} not in use through CUDA here yet: peer access from it is enabled where its CUDA context is \
                 active when the first buffer arrives)",
                gpus(&idle)
            ));
        }
        Some(Route {
            class: PayloadClass::Gpu,
            kind: ID,
            reason: format!(
                "GPU buffers: cuda_ipc, by reference on GPU {n} ({}, the producer's){access}: each arena imported \
                 into CUDA once, \
                 messages are CUDA memory (lf_message_cuda_ptr); host-side synchronisation (buffers are complete \
                 when sent)",
                format_uuid(&uuid)
            ),
        })
    }

    /// Lets every other GPU this process uses reach the memory of `device`, which holds an
    /// import now (once per device; a failure is logged: the memory is still usable from its
    /// own GPU, and copies from it are staged by the driver).
    #[cold]
    fn reach(&mut self, device: i32) {
        if self.peered.contains(&device) {
            return;
        }
        self.peered.push(device);
        for &from in self.used.iter().filter(|&&u| u != device) {
            if !self.opener.peer_path(from, device) {
                continue;
            }
            match self.opener.enable_peer_access(from, device) {
                Ok(true) => log::debug!("CUDA device {from} reaches the producer's memory on device {device}"),
                Ok(false) => log::debug!(
                    "CUDA device {from} is not in use here (no active primary context): no peer access to device \
                     {device} enabled"
                ),
                Err(e) => log::warn!("the producer's memory on CUDA device {device} is not reached in place: {e}"),
            }
            // And the other way: a copy out of the import at NVLink speed is one issued on a
            // stream of the memory's own device (measured on two H200s: 370 GB/s, where a copy
            // issued from the consumer's device moved 37 GB/s), which writes `from`'s memory.
            if let Err(e) = self.opener.enable_peer_access(device, from) {
                log::warn!("copies from the producer's memory on CUDA device {device} cannot write device {from}: {e}");
            }
        }
    }

    /// What slot `index`'s Vulkan import needs, where it is a VMM piece of this process's
    /// Vulkan device.
    #[cfg(feature = "vulkan")]
    fn vulkan_import(&self, index: usize) -> Result<Option<VulkanImport>> {
        let slot = self.slots[index].as_ref().expect("the caller found it");
        let (Some(importer), Some(fd)) = (&self.vulkan, &slot.fd) else { return Ok(None) };
        if slot.allocation.memory != super::wire::MEMORY_VMM {
            // (A GPU buffer's arena on this process's own Vulkan device goes by vulkan_ipc,
            // where it is allowed.)
            return Ok(None);
        }
        if importer.device().info().device_uuid != slot.allocation.device_uuid {
            return Ok(None);
        }
        let fd = fd.try_clone().map_err(|e| Error::os("duplicating a CUDA VMM piece's fd", e))?;
        let a = &slot.allocation;
        Ok(Some(VulkanImport {
            importer: importer.clone(),
            fd,
            size: a.size,
            id: crate::memory::gpu::ArenaId { exporter_pid: a.exporter_pid, token: a.base, counter: a.buffer_id },
            imported: std::sync::OnceLock::new(),
            ready: self.ready.as_ref().ok().and_then(|share| share.semaphore.clone()),
        }))
    }
}

impl Receiver {
    /// Takes the pool the producer announced at `index` (its fd `fd`).
    #[cold]
    fn announce_pool(&mut self, index: u32, pool: super::wire::PoolAnnounce, fd: OwnedHandle) -> Result<()> {
        let i = index as usize;
        if self.pools.get(i).is_some_and(Option::is_some) {
            return Err(self.corrupt(format!("announced pool {index} twice without forgetting it")));
        }
        let Some(device) = self.ordinal_of(&pool.device_uuid) else {
            let devices = self.devices.as_deref().unwrap_or_default();
            return Err(self.corrupt(format!(
                "passed a memory pool of CUDA device {}, which this process does not see (it sees {})",
                format_uuid(&pool.device_uuid),
                format_uuids(devices)
            )));
        };
        if self.pools.len() <= i {
            self.pools.resize_with(i + 1, || None);
        }
        self.pools[i] = Some(Arc::new(Pool::new(pool, fd, device)));
        Ok(())
    }

    /// The pieces announced right before span `allocation` of `slot` and `generation`: each of
    /// them, in order, back to back from offset 0 to the span's end.
    fn span_pieces(
        &mut self,
        slot: u32,
        generation: u32,
        allocation: &Announce,
    ) -> Result<Vec<(PieceRecord, OwnedHandle)>> {
        let pending = std::mem::take(&mut self.pending_pieces);
        if pending.len() != allocation.pieces as usize {
            return Err(self.corrupt(format!(
                "announced a span of {} VMM pieces after {} pieces",
                allocation.pieces,
                pending.len()
            )));
        }
        let mut end = 0u64;
        let mut pieces = Vec::with_capacity(pending.len());
        for (i, (s, g, piece, fd)) in pending.into_iter().enumerate() {
            if (s, g) != (slot, generation) || piece.index as usize != i || piece.offset != end {
                return Err(self.corrupt(format!(
                    "announced VMM piece {} (slot {s} generation {g}, at offset {}) as piece {i} of the span of slot \
                     {slot} generation {generation}, whose piece {i} lies at offset {end}",
                    piece.index, piece.offset
                )));
            }
            end = end.saturating_add(piece.size);
            pieces.push((piece, fd));
        }
        if end != allocation.size {
            return Err(
                self.corrupt(format!("announced a span of {} bytes whose pieces hold {end} bytes", allocation.size))
            );
        }
        Ok(pieces)
    }

    /// The pool a pool allocation's announcement names: announced before it, of its device and
    /// its process.
    fn pool_of(&self, allocation: &Announce) -> Result<Arc<Pool>> {
        let index = allocation.pool;
        let Some(pool) = self.pools.get(index as usize).and_then(Option::as_ref) else {
            return Err(self.corrupt(format!("announced an allocation of pool {index}, which it never announced")));
        };
        if pool.announce.device_uuid != allocation.device_uuid || pool.announce.exporter_pid != allocation.exporter_pid
        {
            return Err(self.corrupt(format!(
                "announced an allocation of pool {index} on CUDA device {} of process {}, but the pool is of device \
                 {} of process {}",
                format_uuid(&allocation.device_uuid),
                allocation.exporter_pid,
                format_uuid(&pool.announce.device_uuid),
                pool.announce.exporter_pid
            )));
        }
        Ok(Arc::clone(pool))
    }
}

impl RouteReceiver for Receiver {
    fn route_id(&self) -> u32 {
        ROUTE_ID
    }

    fn new_session(&mut self, session: u64, offer: Option<Attachment>) -> Result<()> {
        self.session = session;
        self.released_below = 0;
        self.last_ready = 0;
        self.ready = Err(crate::channels::ready::NO_SHARED_READY.into());
        self.offered = offer.is_some();
        self.off = match (&offer, &self.devices) {
            (None, _) => Some(
                "the producer offers no CUDA route (its process had not used CUDA when it created the \
                               channel, or cuda_ipc is not allowed there)"
                    .into(),
            ),
            (Some(_), Err(why)) => Some(format!("this process cannot open CUDA memory: {why}")),
            (Some(_), Ok(devices)) if devices.is_empty() => Some("this process sees no CUDA device".into()),
            (Some(_), Ok(_)) => None,
        };
        self.producer_cuda = offer.is_some();
        self.producer_arenas = None;
        if let Some(offer) = &offer {
            let section = Section::decode(&offer.bytes, "producer")?;
            self.producer_cuda = section.flags & OFFER_NO_CUDA_MEMORY == 0;
            if section.flags & OFFER_ARENAS != 0 {
                let [uuid] = section.devices[..] else {
                    return Err(
                        self.corrupt(format!("offers GPU buffers of {} devices, not one", section.devices.len()))
                    );
                };
                self.producer_arenas = Some(uuid);
            }
        }
        Ok(())
    }

    fn second_route(&self, carrier: TransportId) -> Option<Route> {
        match self.producer_cuda {
            true => self.arena_route(carrier),
            false => None,
        }
    }

    fn route(&self, carrier: TransportId) -> Route {
        if !self.producer_cuda {
            if let Some(route) = self.arena_route(carrier) {
                return route;
            }
        }
        match (&self.off, &self.devices) {
            (Some(why), _) => Route {
                class: PayloadClass::Cuda,
                kind: carrier,
                reason: format!("CUDA memory: refused at the producer's send (no copy is made): {why}"),
            },
            (None, devices) => Route {
                class: PayloadClass::Cuda,
                kind: ID,
                reason: format!(
                    "CUDA memory: cuda_ipc, by reference, opened on {} once per allocation (cudaMalloc memory through \
                     legacy CUDA IPC, VMM pieces mapped from their fds; at most {} open at once); memory of a CUDA \
                     memory pool imported from its pool (imported once) while a message into it is held, and freed \
                     with the last one",
                    format_uuids(devices.as_deref().unwrap_or_default()),
                    self.bound
                ),
            },
        }
    }

    fn reported(&self) -> bool {
        self.offered
    }

    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>) {
        let mut kept: Vec<Arc<Import>> = self.retired.drain(..).map(|(import, _)| import).collect();
        kept.extend(self.slots.drain(..).flatten().filter(|s| s.last_seq.is_some()).filter_map(|s| s.open));
        self.pools.clear();
        self.pending_pieces.clear();
        self.open = 0;
        self.off = Some("the producer has gone".into());
        (self.session, Box::new(kept))
    }

    fn attach(&mut self, attachment: Attachment, released_below: u64) -> Result<()> {
        self.released_below = released_below;
        self.retired.retain(|(_, last)| *last >= released_below);
        let count = attachment.handles.len();
        let record = AllocationRecord::decode(&attachment.bytes, count)?;
        let span =
            matches!(record, AllocationRecord::Announce { allocation, .. } if allocation.memory == MEMORY_VMM_SPAN);
        if !self.pending_pieces.is_empty() && !span && !matches!(record, AllocationRecord::Piece { .. }) {
            return Err(self.corrupt(format!(
                "announced {} VMM pieces without the span they belong to",
                self.pending_pieces.len()
            )));
        }
        match record {
            AllocationRecord::Announce { slot, generation, allocation } => {
                let fd = attachment.handles.into_iter().next();
                if let Some(Some(old)) = self.slots.get(slot as usize) {
                    if old.generation == generation {
                        return Err(self.corrupt(format!("passed slot {slot} generation {generation} twice")));
                    }
                }
                let devices = self.devices.as_deref().unwrap_or_default();
                let Some(device) = devices.iter().position(|d| *d == allocation.device_uuid) else {
                    return Err(self.corrupt(format!(
                        "passed memory of CUDA device {}, which this process does not see (it sees {})",
                        format_uuid(&allocation.device_uuid),
                        format_uuids(devices)
                    )));
                };
                if is_arena(allocation.memory) && (device >= 32 || self.arena_mask & (1 << device) == 0) {
                    return Err(self.corrupt(format!(
                        "passed a GPU buffer's arena of CUDA device {device} {}, whose GPU buffers this process does \
                         not take (the GPU it uses has no peer path there)",
                        format_uuid(&allocation.device_uuid)
                    )));
                }
                debug_assert!(
                    fd.is_some() == !matches!(allocation.memory, MEMORY_LEGACY | MEMORY_POOL | MEMORY_VMM_SPAN),
                    "decode checked the fds"
                );
                let pool = match allocation.memory {
                    MEMORY_POOL => Some(self.pool_of(&allocation)?),
                    _ => None,
                };
                let pieces = match allocation.memory {
                    MEMORY_VMM_SPAN => self.span_pieces(slot, generation, &allocation)?,
                    _ => Vec::new(),
                };
                let index = slot as usize;
                if self.slots.len() <= index {
                    self.slots.resize_with(index + 1, || None);
                }
                if let Some(old) = self.slots[index].take() {
                    self.retire(old);
                }
                self.slots[index] = Some(Slot {
                    generation,
                    allocation,
                    fd,
                    pieces,
                    pool,
                    device: device as i32,
                    open: None,
                    last_seq: None,
                    used: 0,
                });
            }
            AllocationRecord::Forget { slot, generation } => {
                let index = slot as usize;
                if self.slots.get(index).and_then(Option::as_ref).is_some_and(|s| s.generation == generation) {
                    let old = self.slots[index].take().expect("checked");
                    self.retire(old);
                }
            }
            AllocationRecord::Pool { index, pool } => {
                let fd = attachment.handles.into_iter().next().expect("decode checked the fd");
                self.announce_pool(index, pool, fd)?;
            }
            AllocationRecord::Piece { slot, generation, piece } => {
                if self.pending_pieces.len() >= MAX_PIECES as usize {
                    return Err(self.corrupt(format!("announced more than {MAX_PIECES} VMM pieces of one span")));
                }
                let fd = attachment.handles.into_iter().next().expect("decode checked the fd");
                self.pending_pieces.push((slot, generation, piece, fd));
            }
            AllocationRecord::ForgetPool { index } => {
                // Allocations announced from it keep it (and their imports) while they are in use.
                if self.pools.get_mut(index as usize).and_then(Option::take).is_none() {
                    return Err(self.corrupt(format!("forgot pool {index}, which it never announced")));
                }
            }
        }
        Ok(())
    }

    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> Result<Option<RoutedPayload>> {
        let d = Descriptor::decode(descriptor).map_err(|e| self.corrupt(e.to_string()))?;
        if d.slot >= MAX_SLOTS {
            return Err(self.corrupt(format!("names slot {}, beyond the {MAX_SLOTS} a channel uses", d.slot)));
        }
        let index = d.slot as usize;
        let Some(slot) = self.slots.get(index).and_then(Option::as_ref).filter(|s| s.generation == d.generation) else {
            // Its allocation's attachment has not been read yet (the caller reads and retries).
            return Ok(None);
        };
        let size = slot.allocation.size;
        if d.len == 0 || d.offset.checked_add(d.len).map_or(true, |end| end > size) {
            return Err(
                self.corrupt(format!("names {} bytes at offset {} of an allocation of {size} bytes", d.len, d.offset))
            );
        }
        let closed = slot.open.is_none();
        if d.ready_value != 0 {
            self.check_ready(index, d.ready_value)?;
        }
        if closed {
            self.open_slot(index)?;
        }
        self.tick += 1;
        let slot = self.slots[index].as_mut().expect("found above");
        let import = slot.open.as_ref().expect("opened above");
        if import.per_message {
            import.mapping.hold().map_err(|e| {
                Error::Unsupported(format!(
                    "the producer's CUDA pool allocation ({} bytes at {:#x}, buffer id {}) cannot be imported here: {e}",
                    slot.allocation.size, slot.allocation.base, slot.allocation.buffer_id
                ))
            })?;
        }
        slot.used = self.tick;
        slot.last_seq = Some(seq);
        // SAFETY: the import stays in its slot while a message into it is held (eviction skips
        // those), or in `retired` until message `seq` is released, or with the carrier's
        // session while its views are held (end_session): alive and in place (behind its Arc)
        // until the payload, dropped before that release, is gone.
        Ok(Some(unsafe { RoutedPayload::new(&**import, d.offset, d.len as usize, d.ready_value, seq) }))
    }

    fn ready_semaphore(&self) -> Result<OwnedHandle> {
        Err(Error::Unsupported(
            "the cuda_ipc route has no semaphore of its own: its ready values count on the GPU route's".into(),
        ))
    }

    fn share_ready(&mut self, share: &SharedReady) {
        self.ready = share.clone();
    }
}
