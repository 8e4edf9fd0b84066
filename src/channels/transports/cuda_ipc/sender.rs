//! The producer's half of the CUDA IPC route.

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::cuda::{Exporter, Keep};
use super::wire::{AllocationRecord, Announce, Descriptor, Section, ANSWER_CUDA, MAX_SLOTS, MEMORY_LEGACY, MEMORY_VMM};
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

/// The producer's offer: made only in a process that has the CUDA driver loaded already (it
/// has no CUDA memory otherwise, and must not be made to initialise CUDA).
pub(crate) struct Offer;

impl Offer {
    /// The offer, or why this process offers none.
    pub(crate) fn new() -> std::result::Result<Offer, String> {
        if super::fake() {
            return Ok(Offer);
        }
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
        lava_flow_cuda::driver().map(|_| Offer).map_err(|e| format!("the producer's CUDA driver: {e}"))
    }

    pub(crate) fn sections(&mut self) -> Vec<Attachment> {
        vec![Attachment::new(ROUTE_ID, Section { flags: 0, devices: Vec::new(), declined: String::new() }.encode())]
    }

    /// Reads the consumer's answer: the sender where it opens CUDA memory, else why not.
    pub(crate) fn accept(
        self,
        answer: Option<Attachment>,
        holds: Arc<PeerHolds>,
    ) -> Result<std::result::Result<Sender, String>> {
        let Some(answer) = answer else {
            return Ok(Err("the consumer offers no CUDA route (cuda_ipc is not allowed there, or it runs an older \
                           lava-flow)"
                .into()));
        };
        let section = Section::decode(&answer.bytes, "consumer")?;
        if section.flags & ANSWER_CUDA == 0 || section.devices.is_empty() {
            return Ok(Err(format!("the consumer cannot open CUDA memory: {}", section.declined)));
        }
        Ok(Ok(Sender::new(section.devices, holds, super::exporter())))
    }
}

/// An allocation the consumer knows, by base: its slot, generation and `BUFFER_ID`; `held`
/// watches the registration that the hold keeps (never upgraded, so that a count of one is
/// the hold's alone: the application let go of the allocation).
struct Sent {
    slot: u32,
    generation: u32,
    buffer_id: u64,
    held: Weak<dyn Any + Send + Sync>,
}

/// The producer's side of a connected route.
pub(crate) struct Sender {
    route: Route,
    /// The report's words before those on synchronisation.
    reason_head: String,
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
    since_sweep: u32,
    /// The channel's ready semaphore, which the GPU route shares with the consumer, or why the
    /// channel has none: CUDA messages with a ready value count on it.
    ready: SharedReady,
}

impl Sender {
    pub(crate) fn new(devices: Vec<[u8; 16]>, holds: Arc<PeerHolds>, exporter: Arc<dyn Exporter>) -> Sender {
        let reason = format!(
            "CUDA memory: cuda_ipc, by reference to a consumer that opens it on {}: cudaMalloc memory as a legacy CUDA IPC \
             handle, CUDA VMM memory as one fd per piece (each allocation announced once per channel); {}",
            format_uuids(&devices),
            refused_kinds()
        );
        let ready: SharedReady = Err(NO_GPU_ROUTE.into());
        Sender {
            route: Route { class: PayloadClass::Cuda, kind: ID, reason: format!("{reason}; {}", sync_words(&ready)) },
            reason_head: reason,
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
            since_sweep: 0,
            ready,
        }
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
        self.dying.push((gone.slot, self.last_seqs[gone.slot as usize]));
        if self.last.is_some_and(|(_, _, slot, _)| slot == gone.slot) {
            self.last = None;
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
            // from its import of the old allocation.
            let stale = self.allocations.remove(&pointer.base).expect("found above");
            self.forget(stale, attachments);
        }
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
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if (self.generations.len() as u32) < MAX_SLOTS => {
                self.generations.push(0);
                self.last_seqs.push(0);
                self.generations.len() as u32 - 1
            }
            None => {
                return Err(Error::OutOfMemory(format!(
                "this channel already shares {MAX_SLOTS} CUDA allocations alive at once; drop the lava-flow buffers \
                     of allocations no longer sent (their registrations), or send from fewer allocations"
            )))
            }
        };
        let registration = buffer.cuda_keep().expect("a CUDA buffer has a registration");
        let (memory, ipc_handle, retained, fd) = match pointer.kind {
            CudaMemoryKind::Legacy => (MEMORY_LEGACY, self.exporter.export_legacy(pointer)?, None, None),
            CudaMemoryKind::Vmm => {
                let (retained, fd) = self.exporter.export_vmm(pointer)?;
                (MEMORY_VMM, [0; 64], Some(retained), Some(fd))
            }
            other => return Err(Error::Unsupported(refusal(other, buffer.id()))),
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
        };
        attachments.push(Attachment {
            route: ROUTE_ID,
            bytes: AllocationRecord::Announce { slot, generation, allocation }.encode(),
            handles: fd.into_iter().collect::<Vec<OwnedFd>>(),
        });
        let held = Arc::downgrade(&registration);
        self.holds.hold(hold_key(slot), Arc::new(Keep { _registration: registration, _retained: retained }));
        self.allocations.insert(pointer.base, Sent { slot, generation, buffer_id: pointer.buffer_id, held });
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
    "memory of a CUDA memory pool (cudaMallocAsync), managed memory and other CUDA memory without a handle another \
     process can open refused at send (the way out: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, lava-flow's \
     GPU buffers, or a copy into cudaMalloc memory)"
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
        kind == MemoryKind::Cuda
    }

    fn pack(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()> {
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
        if !matches!(pointer.kind, CudaMemoryKind::Legacy | CudaMemoryKind::Vmm) {
            return Err(Error::Unsupported(refusal(pointer.kind, buffer.id())));
        }
        let (offset, len) = (payload.offset as u64, payload.len as u64);
        if len == 0 || offset.checked_add(len).map_or(true, |end| end > pointer.size as u64) {
            return Err(Error::invalid(format!(
                "{len} bytes at offset {offset} do not lie in buffer {}'s CUDA allocation of {} bytes (a message \
                 that spans several CUDA VMM pieces is not supported: send each piece's part)",
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
        if let Some((_, _, slot, _)) = self.last {
            self.last_seqs[slot as usize] = seq;
        }
    }

    fn released_semaphore(&self) -> Result<OwnedFd> {
        Err(Error::Unsupported("the cuda_ipc route has no released semaphore: completion is the carrier's".into()))
    }

    fn ready_semaphore(&self) -> Result<OwnedFd> {
        Err(Error::Unsupported(
            "the cuda_ipc route has no semaphore of its own: its ready values count on the GPU route's".into(),
        ))
    }

    fn share_ready(&mut self, share: &SharedReady) {
        self.ready = share.clone();
        self.route.reason = format!("{}; {}", self.reason_head, sync_words(share));
    }
}
