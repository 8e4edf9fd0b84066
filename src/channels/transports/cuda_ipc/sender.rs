//! The producer's half of the CUDA IPC route.

use crate::os::OwnedHandle;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::cuda::{Exporter, Keep};
use super::wire::{
    AllocationRecord, Announce, Descriptor, PieceRecord, PoolAnnounce, Section, ANSWER_CUDA, MAX_POOLS, MAX_SLOTS,
    MEMORY_LEGACY, MEMORY_POOL, MEMORY_VMM, MEMORY_VMM_SPAN, OFFER_ARENAS, OFFER_NO_CUDA_MEMORY,
};
use super::{format_uuid, format_uuids, refusal, ID, ROUTE_ID};
use crate::channels::ready::SharedReady;
use crate::channels::transport::{
    Attachment, MemoryKind, Packed, Payload, PayloadClass, PayloadMemory, PeerHolds, Route, RouteSender,
};
use crate::error::{Error, Result};
use crate::memory::CudaMemoryKind;

/// How many messages go between two looks for allocations that were let go of.
const SWEEP_EVERY: u32 = 256;

/// The key of a slot's hold among the producer's holds (which other routes share).
fn hold_key(slot: u32) -> u64 {
    u64::from(ROUTE_ID) << 32 | u64::from(slot)
}

/// The producer's offer: CUDA memory where its process had loaded the CUDA driver already (it
/// has no CUDA memory otherwise, and must not be made to initialise CUDA), and lava-flow's GPU
/// buffers of its Vulkan device (which need no CUDA here: the consumer imports their arenas'
/// fds into CUDA), for a consumer whose GPU is another than the producer's (on the same GPU,
/// vulkan_ipc takes them first).
#[derive(Clone)]
pub(crate) struct Offer {
    /// Why this process sends no CUDA memory, where it sends none.
    no_cuda: Option<String>,
    /// The UUID of the device whose GPU buffers this process offers, with that device.
    arenas: Option<super::arena::ArenaDevice>,
}

impl Offer {
    /// The offer of a process whose memory context is `context`, or why it offers nothing.
    pub(crate) fn new(context: &crate::memory::Context) -> std::result::Result<Offer, String> {
        let arenas = super::arena::ArenaDevice::of(context);
        if super::fake() {
            return Ok(Offer { no_cuda: None, arenas });
        }
        let no_cuda = Offer::cuda_memory().err();
        match (no_cuda, arenas) {
            (Some(why), None) => Err(why),
            (no_cuda, arenas) => Ok(Offer { no_cuda, arenas }),
        }
    }

    /// The offer of a process with CUDA memory and no GPU buffers to offer.
    #[cfg(test)]
    pub(crate) fn cuda_only() -> Offer {
        Offer { no_cuda: None, arenas: None }
    }

    /// The offer of a process without CUDA (where `no_cuda` says why) offering the GPU buffers
    /// of `arenas`.
    #[cfg(all(test, feature = "vulkan"))]
    pub(crate) fn for_tests(no_cuda: Option<&str>, arenas: Option<super::arena::ArenaDevice>) -> Offer {
        Offer { no_cuda: no_cuda.map(str::to_owned), arenas }
    }

    /// Whether this process sends CUDA memory, or why not.
    pub(crate) fn cuda_memory() -> std::result::Result<(), String> {
        if lava_flow_cuda::disabled() {
            return Err(format!("{}=1 keeps lava-flow from using CUDA here", lava_flow_cuda::DISABLE_CUDA_ENV));
        }
        if !lava_flow_cuda::is_loaded() {
            return Err(format!(
                "the producer had not loaded the CUDA driver ({}) when the channel was created; \
                 create the channel after the process first uses CUDA",
                lava_flow_cuda::LIBRARY
            ));
        }
        lava_flow_cuda::driver().map(|_| ()).map_err(|e| format!("the producer's CUDA driver: {e}"))
    }

    pub(crate) fn sections(&mut self) -> Vec<Attachment> {
        let mut section = Section::default();
        if let Some(why) = &self.no_cuda {
            section.flags |= OFFER_NO_CUDA_MEMORY;
            section.declined = why.clone();
        }
        if let Some(arenas) = &self.arenas {
            section.flags |= OFFER_ARENAS;
            section.devices.push(arenas.uuid);
        }
        vec![Attachment::new(ROUTE_ID, section.encode())]
    }

    /// Reads the consumer's answer: the sender where it takes CUDA memory or GPU buffers, and
    /// why it takes what it does not (per class of payload: CUDA memory is refused at send,
    /// GPU buffers are staged).
    pub(crate) fn accept(self, answer: Option<Attachment>, holds: Arc<PeerHolds>) -> Result<Accepted> {
        let section = match answer {
            Some(answer) => Section::decode(&answer.bytes, "consumer")?,
            None => Section {
                declined: "the consumer offers no CUDA route (cuda_ipc is not allowed there, or it runs an older \
                           lava-flow)"
                    .into(),
                ..Section::default()
            },
        };
        let mut refused = Vec::new();
        let opens = section.flags & ANSWER_CUDA != 0 && !section.devices.is_empty();
        let why_not = || format!("the consumer cannot open CUDA memory: {}", section.declined);
        let cuda = match &self.no_cuda {
            Some(_) => false,
            None if opens => true,
            None => {
                refused.push((PayloadClass::Cuda, why_not()));
                false
            }
        };
        let arenas = match self.arenas {
            Some(_) if !opens => {
                refused.push((PayloadClass::Gpu, format!("cuda_ipc: {}", why_not())));
                None
            }
            Some(arenas) => match super::arena::takes(&section, &arenas.uuid) {
                Ok(()) => Some(arenas),
                Err(why) => {
                    refused.push((PayloadClass::Gpu, format!("cuda_ipc: {why}")));
                    None
                }
            },
            None => None,
        };
        let sender = (cuda || arenas.is_some())
            .then(|| Sender::new(section.devices.clone(), cuda, arenas, holds, super::exporter()));
        Ok(Accepted { sender, refused })
    }
}

/// What came of an offer: the sender, where the consumer takes something by this route, and
/// why it does not take the rest, by class of payload.
pub(crate) struct Accepted {
    pub(crate) sender: Option<Sender>,
    pub(crate) refused: Vec<(PayloadClass, String)>,
}

/// An allocation the consumer knows, by base: its slot, generation and `BUFFER_ID`; `held`
/// watches the registration that the hold keeps (never upgraded, so that a count of one is
/// the hold's alone: the application let go of the allocation).
struct Sent {
    slot: u32,
    generation: u32,
    buffer_id: u64,
    held: Weak<dyn Any + Send + Sync>,
    /// A pool allocation's pool, by its handle here.
    pool: Option<u64>,
}

/// A memory pool the consumer knows: its index, and how many of the allocations it knows are
/// of the pool (the pool is forgotten with the last).
struct PoolSent {
    index: u32,
    allocations: u32,
}

/// The producer's side of a connected route.
pub(crate) struct Sender {
    route: Route,
    /// The report's words before those on synchronisation.
    reason_head: String,
    /// The report's line for GPU buffers, where the route serves CUDA memory as well.
    second: Option<Route>,
    /// Whether the route serves CUDA memory.
    cuda: bool,
    /// The device whose GPU buffers the route serves, where the consumer takes them.
    arenas: Option<super::arena::ArenaDevice>,
    /// The GPU buffers' arenas the consumer knows, by (token, counter) of their `ArenaId`.
    arena_sent: HashMap<(u64, u64), Sent>,
    /// The last arena sent: ((token, counter), slot, generation).
    last_arena: Option<((u64, u64), u32, u32)>,
    /// The slot of the GPU buffer just packed, for `sent`.
    arena_packed: Option<u32>,
    exporter: Arc<dyn Exporter>,
    /// The UUIDs of the devices the consumer opens memory on.
    devices: Vec<[u8; 16]>,
    /// This process's device UUIDs, by ordinal, as looked up.
    own_uuids: HashMap<i32, [u8; 16]>,
    holds: Arc<PeerHolds>,
    allocations: HashMap<u64, Sent>,
    generations: Vec<u32>,
    last_seqs: Vec<u64>,
    free_slots: Vec<u32>,
    /// Slots whose allocation the consumer was told to forget, with their last message: free
    /// again once it is released.
    dying: Vec<(u32, u64)>,
    /// The last allocation sent, (base, buffer id, slot, generation).
    last: Option<(u64, u64, u32, u32)>,
    /// The memory pools the consumer knows, by handle.
    pools: HashMap<u64, PoolSent>,
    free_pools: Vec<u32>,
    since_sweep: u32,
    /// The channel's ready semaphore, which the GPU route shares with the consumer, or why the
    /// channel has none: CUDA messages with a ready value count on it.
    ready: SharedReady,
}

impl Sender {
    pub(crate) fn new(
        devices: Vec<[u8; 16]>,
        cuda: bool,
        arenas: Option<super::arena::ArenaDevice>,
        holds: Arc<PeerHolds>,
        exporter: Arc<dyn Exporter>,
    ) -> Sender {
        let reason = format!(
            "CUDA memory: cuda_ipc, by reference to a consumer that opens it on {}: cudaMalloc memory as a legacy CUDA IPC \
             handle, CUDA VMM memory as one fd per piece (a message across pieces mapped back to back as their span, \
             mapped by the consumer into one range), memory of a CUDA memory pool that exports fds as its pool's \
             fd (once per channel) and the allocation's export data (each allocation announced once per channel; the \
             consumer imports pool memory while it holds a message into it); {}",
            format_uuids(&devices),
            refused_kinds()
        );
        let ready: SharedReady = Err(NO_GPU_ROUTE.into());
        let cuda_route =
            Route { class: PayloadClass::Cuda, kind: ID, reason: format!("{reason}; {}", sync_words(&ready)) };
        let arena_route = arenas.as_ref().map(|a| Route { class: PayloadClass::Gpu, kind: ID, reason: a.report() });
        let (route, second) = match (cuda, arena_route) {
            (true, second) => (cuda_route, second),
            (false, Some(arena_route)) => (arena_route, None),
            (false, None) => (cuda_route, None),
        };
        Sender {
            route,
            reason_head: reason,
            second,
            cuda,
            arenas,
            arena_sent: HashMap::new(),
            last_arena: None,
            arena_packed: None,
            exporter,
            devices,
            own_uuids: HashMap::new(),
            holds,
            allocations: HashMap::new(),
            generations: Vec::new(),
            last_seqs: Vec::new(),
            free_slots: Vec::new(),
            dying: Vec::new(),
            last: None,
            pools: HashMap::new(),
            free_pools: (0..MAX_POOLS).rev().collect(),
            since_sweep: 0,
            ready,
        }
    }

    /// The same route for CUDA memory alone (another route takes GPU buffers to this consumer),
    /// or `None` where the producer sends no CUDA memory: nothing is left for it.
    pub(crate) fn without_gpu_buffers(mut self) -> Option<Sender> {
        if !self.cuda {
            return None;
        }
        if self.arenas.take().is_some() {
            self.second = None;
        }
        Some(self)
    }

    /// Lets go of allocations the application let go of and whose messages are all released,
    /// telling the consumer to close its imports; frees the slots of forgotten ones.
    fn sweep(&mut self, completed: u64, attachments: &mut Vec<Attachment>) {
        self.since_sweep = 0;
        let last_seqs = &self.last_seqs;
        let done: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.held.strong_count() == 1 && last_seqs[a.slot as usize] < completed)
            .map(|(base, _)| *base)
            .collect();
        for base in done {
            let gone = self.allocations.remove(&base).expect("listed above");
            self.forget(gone, attachments);
        }
        let last_seqs = &self.last_seqs;
        let done: Vec<(u64, u64)> = self
            .arena_sent
            .iter()
            .filter(|(_, a)| a.held.strong_count() == 1 && last_seqs[a.slot as usize] < completed)
            .map(|(key, _)| *key)
            .collect();
        for key in done {
            let gone = self.arena_sent.remove(&key).expect("listed above");
            self.forget(gone, attachments);
        }
        let holds = &self.holds;
        let free = &mut self.free_slots;
        self.dying.retain(|&(slot, last)| {
            let done = last < completed;
            if done {
                holds.release(hold_key(slot));
                free.push(slot);
            }
            !done
        });
    }

    /// Tells the consumer to forget `gone`; its slot is reused once its last message is released.
    fn forget(&mut self, gone: Sent, attachments: &mut Vec<Attachment>) {
        attachments.push(Attachment::new(
            ROUTE_ID,
            AllocationRecord::Forget { slot: gone.slot, generation: gone.generation }.encode(),
        ));
        if let Some(handle) = gone.pool {
            self.pool_let_go(handle, attachments);
        }
        self.dying.push((gone.slot, self.last_seqs[gone.slot as usize]));
        if self.last.is_some_and(|(_, _, slot, _)| slot == gone.slot) {
            self.last = None;
        }
        if self.last_arena.is_some_and(|(_, slot, _)| slot == gone.slot) {
            self.last_arena = None;
        }
    }

    /// The consumer's index of memory pool `handle` (of device `uuid`), announcing the pool
    /// with its fd where the consumer does not know it yet; counts one more allocation of it.
    #[cold]
    fn pool_index(&mut self, handle: u64, uuid: [u8; 16], attachments: &mut Vec<Attachment>) -> Result<u32> {
        if let Some(known) = self.pools.get_mut(&handle) {
            known.allocations += 1;
            return Ok(known.index);
        }
        let Some(&index) = self.free_pools.last() else {
            return Err(Error::OutOfMemory(format!(
                "this channel already shares allocations of {MAX_POOLS} CUDA memory pools; drop the lava-flow buffers \
                 of pools' allocations no longer sent (their registrations), or allocate from fewer pools"
            )));
        };
        let fd = self.exporter.export_pool(handle)?;
        self.free_pools.pop();
        let pool = PoolAnnounce { device_uuid: uuid, exporter_pid: std::process::id() };
        attachments.push(Attachment {
            route: ROUTE_ID,
            bytes: AllocationRecord::Pool { index, pool }.encode(),
            handles: vec![fd],
        });
        self.pools.insert(handle, PoolSent { index, allocations: 1 });
        Ok(index)
    }

    /// One allocation of pool `handle` fewer that the consumer knows: with the last, the
    /// consumer forgets the pool (a pool the application destroys, and another made at the same
    /// handle, is announced anew).
    fn pool_let_go(&mut self, handle: u64, attachments: &mut Vec<Attachment>) {
        let Some(known) = self.pools.get_mut(&handle) else { return };
        known.allocations -= 1;
        if known.allocations == 0 {
            let index = known.index;
            self.pools.remove(&handle);
            self.free_pools.push(index);
            attachments.push(Attachment::new(ROUTE_ID, AllocationRecord::ForgetPool { index }.encode()));
        }
    }

    /// A free slot for a new allocation (its generation is bumped once it is announced).
    fn take_slot(&mut self) -> Result<u32> {
        match self.free_slots.pop() {
            Some(slot) => Ok(slot),
            None if (self.generations.len() as u32) < MAX_SLOTS => {
                self.generations.push(0);
                self.last_seqs.push(0);
                Ok(self.generations.len() as u32 - 1)
            }
            None => Err(Error::OutOfMemory(format!(
                "this channel already shares {MAX_SLOTS} CUDA allocations and GPU arenas alive at once; drop the \
                 lava-flow buffers of allocations no longer sent (their registrations), or send from fewer allocations"
            ))),
        }
    }

    fn own_uuid(&mut self, ordinal: i32) -> Result<[u8; 16]> {
        if let Some(uuid) = self.own_uuids.get(&ordinal) {
            return Ok(*uuid);
        }
        let uuid = self.exporter.device_uuid(ordinal)?;
        self.own_uuids.insert(ordinal, uuid);
        Ok(uuid)
    }

    /// The consumer's slot and generation for the allocation of `buffer`, with the attachments
    /// that must reach it first.
    fn slot_of(
        &mut self,
        buffer: &crate::memory::Buffer,
        pointer: &crate::memory::CudaPointer,
        completed: u64,
        attachments: &mut Vec<Attachment>,
    ) -> Result<(u32, u32)> {
        if let Some((base, id, slot, generation)) = self.last {
            if base == pointer.base && id == pointer.buffer_id {
                return Ok((slot, generation));
            }
        }
        if let Some(known) = self.allocations.get(&pointer.base) {
            if known.buffer_id == pointer.buffer_id {
                let found = (known.slot, known.generation);
                self.last = Some((pointer.base, pointer.buffer_id, found.0, found.1));
                return Ok(found);
            }
            // Freed and re-allocated at the same address: the consumer must never be served
            // from its import of the old allocation. It is forgotten first, and with it its
            // pool where it was the last allocation of the pool the consumer knew: the driver
            // gives a pool destroyed and a new one the same handle (and the new allocation the
            // same address), and the new pool must be announced anew, or the consumer imports
            // the allocation from the old one (measured on an H200: CUDA_ERROR_INVALID_VALUE).
            let stale = self.allocations.remove(&pointer.base).expect("found above");
            self.forget(stale, attachments);
        }
        self.announce(buffer, pointer, completed, attachments)
    }

    /// Announces the allocation of `buffer` in a free slot: its slot and generation.
    #[cold]
    fn announce(
        &mut self,
        buffer: &crate::memory::Buffer,
        pointer: &crate::memory::CudaPointer,
        completed: u64,
        attachments: &mut Vec<Attachment>,
    ) -> Result<(u32, u32)> {
        self.sweep(completed, attachments);
        let uuid = self.own_uuid(pointer.device_ordinal)?;
        if !self.devices.contains(&uuid) {
            return Err(Error::Unsupported(format!(
                "buffer {} is {} of CUDA device {} ({}), which the consumer cannot see (it opens CUDA memory on {}); \
                 make the device visible to the consumer (CUDA_VISIBLE_DEVICES), or copy the data to a device it sees",
                buffer.id(),
                pointer.kind,
                pointer.device_ordinal,
                format_uuid(&uuid),
                format_uuids(&self.devices)
            )));
        }
        let registration = buffer.cuda_keep().expect("a CUDA buffer has a registration");
        let mut pieces = Vec::new();
        let (memory, ipc_handle, retained, fd, pool) = match pointer.kind {
            CudaMemoryKind::Legacy => (MEMORY_LEGACY, self.exporter.export_legacy(pointer)?, None, None, None),
            CudaMemoryKind::Vmm if crate::memory::cuda::is_span(pointer) => {
                let mut kept = Vec::new();
                for (piece, retained, fd) in self.exporter.export_vmm_span(pointer)? {
                    kept.push(retained);
                    pieces.push((piece, fd));
                }
                let kept: Box<dyn Any + Send + Sync> = Box::new(kept);
                (MEMORY_VMM_SPAN, [0; 64], Some(kept), None, None)
            }
            CudaMemoryKind::Vmm => {
                let (retained, fd) = self.exporter.export_vmm(pointer)?;
                (MEMORY_VMM, [0; 64], Some(retained), Some(fd), None)
            }
            CudaMemoryKind::Pool => {
                let (handle, data) = self.exporter.export_pool_pointer(pointer)?;
                (MEMORY_POOL, data, None, None, Some(handle))
            }
            other => return Err(Error::Unsupported(refusal(other, buffer.id()))),
        };
        let slot = self.take_slot()?;
        let pool_index = match pool {
            Some(handle) => match self.pool_index(handle, uuid, attachments) {
                Ok(index) => index,
                Err(e) => {
                    self.free_slots.push(slot);
                    return Err(e);
                }
            },
            None => 0,
        };
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        let generation = self.generations[slot as usize];
        let allocation = Announce {
            memory,
            device_ordinal: pointer.device_ordinal,
            exporter_pid: std::process::id(),
            size: pointer.size as u64,
            base: pointer.base,
            buffer_id: pointer.buffer_id,
            device_uuid: uuid,
            ipc_handle,
            pool: pool_index,
            pieces: pieces.len() as u32,
        };
        // A span's pieces go right before it, each with its fd.
        for (index, (piece, fd)) in pieces.into_iter().enumerate() {
            let piece = PieceRecord {
                index: index as u32,
                offset: piece.offset,
                size: piece.size as u64,
                buffer_id: piece.buffer_id,
            };
            attachments.push(Attachment {
                route: ROUTE_ID,
                bytes: AllocationRecord::Piece { slot, generation, piece }.encode(),
                handles: vec![fd],
            });
        }
        attachments.push(Attachment {
            route: ROUTE_ID,
            bytes: AllocationRecord::Announce { slot, generation, allocation }.encode(),
            handles: fd.into_iter().collect::<Vec<OwnedHandle>>(),
        });
        let held = Arc::downgrade(&registration);
        // (Pool memory cannot be kept alive so: the application must not free it before its
        // messages are complete, and the consumer frees its import before it releases the last.)
        self.holds.hold(hold_key(slot), Arc::new(Keep { _registration: registration, _retained: retained }));
        self.allocations.insert(pointer.base, Sent { slot, generation, buffer_id: pointer.buffer_id, held, pool });
        self.last = Some((pointer.base, pointer.buffer_id, slot, generation));
        Ok((slot, generation))
    }
}

/// Why a channel without a GPU route shares no ready semaphore.
const NO_GPU_ROUTE: &str = "the channel has no GPU route (vulkan_ipc) to the consumer, whose timeline semaphore \
                            CUDA messages would share: both processes' contexts need a Vulkan device on the same GPU, \
                            whose driver shares timeline semaphores";

/// How the report says CUDA messages are synchronised.
fn sync_words(ready: &SharedReady) -> String {
    match ready {
        Ok(share) => format!(
            "stream-ordered sends (a ready value on the channel's timeline semaphore, which CUDA work on GPU {} \
             signals) or host-side synchronisation (complete when sent)",
            format_uuid(&share.device_uuid)
        ),
        Err(why) => format!("host-side synchronisation (CUDA memory is complete when sent), because {why}"),
    }
}

/// The way out of every refusal of a ready value.
const SYNCHRONISE: &str = "synchronise the work that writes it (cudaStreamSynchronize) and send it without a ready \
                           value (lf_send_buffer)";

impl Sender {
    /// Checks that CUDA memory of `pointer` can go with ready value `value`: the channel shares
    /// a ready semaphore with the consumer, on the GPU that holds the memory (CUDA work
    /// signals and waits for it there), and values grow across the channel's routes.
    #[cold]
    fn check_ready(
        &mut self,
        buffer: &crate::memory::Buffer,
        pointer: &crate::memory::CudaPointer,
        value: u64,
    ) -> Result<()> {
        let uuid = self.own_uuid(pointer.device_ordinal)?;
        let share = match &self.ready {
            Ok(share) => share,
            Err(why) => {
                return Err(Error::Unsupported(format!(
                    "buffer {} ({}) cannot go with ready value {value}: the channel shares no ready semaphore with \
                     its consumer ({why}); {SYNCHRONISE}",
                    buffer.id(),
                    pointer.kind
                )))
            }
        };
        if share.device_uuid != uuid {
            return Err(Error::Unsupported(format!(
                "buffer {} is {} of CUDA device {} ({}), but the channel's ready semaphore belongs to its context's \
                 Vulkan device ({}), and CUDA work signals it only on that GPU: open the context on the GPU that holds \
                 the memory (LF_VULKAN_DEVICE), or {SYNCHRONISE}",
                buffer.id(),
                pointer.kind,
                pointer.device_ordinal,
                format_uuid(&uuid),
                format_uuid(&share.device_uuid)
            )));
        }
        let last = share.last.load(Ordering::Relaxed);
        if value < last {
            return Err(Error::invalid(format!(
                "ready value {value} is below the previous message's {last}: values must grow"
            )));
        }
        share.last.store(value, Ordering::Relaxed);
        Ok(())
    }
}

/// The report's words for the kinds this route refuses.
fn refused_kinds() -> String {
    "managed memory and other CUDA memory without a handle another process can open (a memory pool without POSIX fd \
     handle types, such as the device's default pool) refused at send (the way out: a pool created with \
     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, lava-flow's GPU \
     buffers, or a copy into cudaMalloc memory)"
        .into()
}

impl RouteSender for Sender {
    fn route_id(&self) -> u32 {
        ROUTE_ID
    }

    fn route(&self) -> &Route {
        &self.route
    }

    fn serves(&self, kind: MemoryKind) -> bool {
        match kind {
            MemoryKind::Cuda => self.cuda,
            MemoryKind::Vulkan => self.arenas.is_some(),
        }
    }

    fn second_route(&self) -> Option<&Route> {
        self.second.as_ref()
    }

    fn pack(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()> {
        if payload.kind == MemoryKind::Vulkan {
            return self.pack_arena(payload, completed, out);
        }
        self.arena_packed = None;
        let PayloadMemory::Buffer(buffer) = payload.memory else {
            return Err(Error::Unsupported("the cuda_ipc route sends CUDA memory registered with lava-flow".into()));
        };
        let Some(pointer) = buffer.cuda() else {
            return Err(Error::Unsupported(format!(
                "buffer {} is {}, not CUDA memory: the cuda_ipc route cannot send it",
                buffer.id(),
                buffer.location()
            )));
        };
        if !matches!(pointer.kind, CudaMemoryKind::Legacy | CudaMemoryKind::Vmm | CudaMemoryKind::Pool) {
            return Err(Error::Unsupported(refusal(pointer.kind, buffer.id())));
        }
        let (offset, len) = (payload.offset as u64, payload.len as u64);
        if len == 0 || offset.checked_add(len).map_or(true, |end| end > pointer.size as u64) {
            return Err(Error::invalid(format!(
                "{len} bytes at offset {offset} do not lie in buffer {}'s CUDA allocation of {} bytes (register the \
                 range the message covers: a range across CUDA VMM pieces mapped back to back registers their span)",
                buffer.id(),
                pointer.size
            )));
        }
        if payload.ready_value != 0 {
            self.check_ready(buffer, &pointer, payload.ready_value)?;
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep(completed, &mut out.attachments);
        }
        let (slot, generation) = self.slot_of(buffer, &pointer, completed, &mut out.attachments)?;
        let descriptor = Descriptor { slot, generation, offset, len, ready_value: payload.ready_value };
        out.descriptor[..Descriptor::LEN].copy_from_slice(&descriptor.encode());
        out.descriptor_len = Descriptor::LEN;
        Ok(())
    }

    fn sent(&mut self, seq: u64) {
        if let Some(slot) = self.arena_packed.take() {
            self.last_seqs[slot as usize] = seq;
            return;
        }
        if let Some((_, _, slot, _)) = self.last {
            self.last_seqs[slot as usize] = seq;
        }
    }

    fn released_semaphore(&self) -> Result<OwnedHandle> {
        Err(Error::Unsupported("the cuda_ipc route has no released semaphore: completion is the carrier's".into()))
    }

    fn ready_semaphore(&self) -> Result<OwnedHandle> {
        Err(Error::Unsupported(
            "the cuda_ipc route has no semaphore of its own: its ready values count on the GPU route's".into(),
        ))
    }

    fn share_ready(&mut self, share: &SharedReady) {
        self.ready = share.clone();
        // The report's line is CUDA memory's where the route carries it (else GPU buffers').
        if self.cuda {
            self.route.reason = format!("{}; {}", self.reason_head, sync_words(share));
        }
    }
}

/// lava-flow's GPU buffers: each arena announced once per channel with its opaque fd, which
/// the consumer imports into CUDA on the producer's GPU; a message names its bytes' offset in
/// the arena. Kept apart from CUDA memory's path: the two share only the slots.
impl Sender {
    #[cfg(feature = "vulkan")]
    fn pack_arena(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()> {
        use crate::memory::BufferOrigin;
        let Some(arenas) = &self.arenas else {
            return Err(Error::Unsupported(format!(
                "the cuda_ipc route of this channel does not take lava-flow's GPU buffers: {}",
                self.route.reason
            )));
        };
        let PayloadMemory::Buffer(buffer) = payload.memory else {
            return Err(Error::Unsupported(format!(
                "the cuda_ipc route sends lava-flow's GPU buffers, not {}",
                payload.kind
            )));
        };
        // Allocated here (a view of such a buffer too): a received buffer is the producer's.
        let Some((gpu, start)) = buffer.gpu_region().filter(|_| buffer.origin() == BufferOrigin::Allocated) else {
            return Err(Error::Unsupported(format!(
                "buffer {} is {} that this channel cannot send by reference (a received GPU buffer is the producer's: \
                 copy it into a buffer of your own first)",
                buffer.id(),
                buffer.location()
            )));
        };
        if !gpu.device().same_device(&arenas.device) {
            return Err(Error::invalid(format!(
                "buffer {} belongs to another context's Vulkan device than the channel's; allocate it from the \
                 channel's context",
                buffer.id()
            )));
        }
        if payload.ready_value != 0 {
            return Err(Error::Unsupported(
                "GPU buffers to a consumer on another GPU are sent complete (it reads them through CUDA): wait for \
                 the work that writes them (a fence, or vkQueueWaitIdle) and send without a ready value"
                    .into(),
            ));
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep(completed, &mut out.attachments);
        }
        let (slot, generation) = self.arena_slot_of(gpu, completed, &mut out.attachments)?;
        let offset = gpu.offset() + start + payload.offset as u64;
        let descriptor = Descriptor { slot, generation, offset, len: payload.len as u64, ready_value: 0 };
        out.descriptor[..Descriptor::LEN].copy_from_slice(&descriptor.encode());
        out.descriptor_len = Descriptor::LEN;
        self.arena_packed = Some(slot);
        Ok(())
    }

    #[cfg(not(feature = "vulkan"))]
    fn pack_arena(&mut self, payload: &Payload<'_>, _completed: u64, _out: &mut Packed) -> Result<()> {
        Err(Error::Unsupported(format!("the cuda_ipc route of this build does not send {}", payload.kind)))
    }

    /// The consumer's slot and generation for `gpu`'s arena, with the attachments that must
    /// reach it first.
    #[cfg(feature = "vulkan")]
    fn arena_slot_of(
        &mut self,
        gpu: &crate::memory::gpu::GpuBuffer,
        completed: u64,
        attachments: &mut Vec<Attachment>,
    ) -> Result<(u32, u32)> {
        use super::wire::{MEMORY_ARENA, MEMORY_ARENA_DEDICATED};
        let id = gpu.arena_id();
        let key = (id.token, id.counter);
        if let Some((last, slot, generation)) = self.last_arena {
            if last == key {
                return Ok((slot, generation));
            }
        }
        if let Some(known) = self.arena_sent.get(&key) {
            let found = (known.slot, known.generation);
            self.last_arena = Some((key, found.0, found.1));
            return Ok(found);
        }
        self.sweep(completed, attachments);
        let uuid = self.arenas.as_ref().expect("pack_arena checked").uuid;
        let slot = self.take_slot()?;
        let export = match gpu.export_arena() {
            Ok(export) => export,
            Err(e) => {
                self.free_slots.push(slot);
                return Err(e);
            }
        };
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        let generation = self.generations[slot as usize];
        let dedicated = export.desc.flags & crate::memory::gpu::GPU_EXPORT_DEDICATED != 0;
        let allocation = Announce {
            memory: if dedicated { MEMORY_ARENA_DEDICATED } else { MEMORY_ARENA },
            device_ordinal: -1,
            exporter_pid: std::process::id(),
            size: export.desc.arena_size,
            base: id.token,
            buffer_id: id.counter,
            device_uuid: uuid,
            ipc_handle: [0; 64],
            pool: 0,
            pieces: 0,
        };
        attachments.push(Attachment {
            route: ROUTE_ID,
            bytes: AllocationRecord::Announce { slot, generation, allocation }.encode(),
            handles: vec![export.fd],
        });
        let keep = gpu.arena_keep_alive();
        let held = Arc::downgrade(&keep);
        self.holds.hold(hold_key(slot), keep);
        self.arena_sent.insert(key, Sent { slot, generation, buffer_id: id.counter, held, pool: None });
        self.last_arena = Some((key, slot, generation));
        Ok((slot, generation))
    }
}
