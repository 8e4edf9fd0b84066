//! The producer's half of the Vulkan IPC route.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::wire::{
    ArenaRecord, Descriptor, Identity, ANSWER_GPU, ANSWER_SEMAPHORE, MAX_SLOTS, OFFER_RELEASED, OFFER_SEMAPHORE,
};
use super::ROUTE_ID;
use crate::channels::ready::{ReadyOffer, ReadyShare};
use crate::channels::transport::{
    Attachment, MemoryKind, Packed, Payload, PayloadClass, PayloadMemory, PeerHolds, Route, RouteSender,
};
use crate::error::{Error, Result};
use crate::memory::gpu::{format_uuid, probe_semaphore_sharing, ArenaId, GpuBuffer, TimelineSemaphore, VulkanDevice};
use crate::memory::{BufferOrigin, Context};
use crate::os::OwnedHandle;

/// How many messages go between two looks for arenas that died (and whose GPU memory the
/// channel still holds).
const SWEEP_EVERY: u32 = 256;

/// What keeps each arena alive for every consumer of a fan-out, shared by their senders: one
/// reference to the arena per fan-out, which each consumer's hold shares, so that the arena's
/// own count still says whether anything besides the channel uses it.
type FanOutKeeps = Arc<Mutex<HashMap<ArenaId, Weak<FanOutKeep>>>>;

/// A fan-out's one reference to an arena.
struct FanOutKeep(Arc<dyn Any + Send + Sync>);

/// The producer's side before the consumer answered: its device and, where the driver can
/// share them, the ready semaphore it offers and the released semaphore it asks for.
pub(crate) struct Offer {
    device: VulkanDevice,
    semaphore: Option<Arc<TimelineSemaphore>>,
    /// Why there is no shared semaphore.
    no_semaphore: Option<String>,
    released: Option<TimelineSemaphore>,
    want_released: bool,
    strict: bool,
    /// The arenas' references shared by a fan-out's consumers (`None` for a pair's offer).
    fan_out: Option<FanOutKeeps>,
}

impl Offer {
    /// Opens the route on `context`'s device, probing whether timeline semaphores can be
    /// shared (create, export, import, one signal and wait). `released`: the consumer is
    /// asked to signal a released semaphore.
    pub(crate) fn new(context: &Context, strict: bool, released_wanted: bool) -> Result<Offer> {
        let device = context
            .gpu_device()
            .cloned()
            .ok_or_else(|| Error::Unsupported("the Vulkan IPC route needs a Vulkan device in this process".into()))?;
        let (semaphore, no_semaphore) = match probe_semaphore_sharing(&device) {
            Ok(()) => (Some(Arc::new(TimelineSemaphore::new_exportable(&device, 0)?)), None),
            Err(why) => (None, Some(why)),
        };
        if strict {
            if let Some(why) = &no_semaphore {
                return Err(Error::Unsupported(format!(
                    "GPU buffers would be synchronised on the host, which strict_gpu forbids: {why}"
                )));
            }
        }
        let released = match (&semaphore, released_wanted) {
            (Some(_), true) => Some(TimelineSemaphore::new_exportable(&device, 0)?),
            _ => None,
        };
        Ok(Offer { device, semaphore, no_semaphore, released, want_released: released_wanted, strict, fan_out: None })
    }

    /// The offer to one more consumer of a fan-out: the same device and ready semaphore (the
    /// producer's GPU work signals one for every consumer), and no released semaphore, which
    /// each consumer would signal on its own (the producer waits for every consumer's release
    /// on the host). The senders of one offer's others share what keeps each arena alive.
    pub(crate) fn another(&mut self) -> Offer {
        let keeps = self.fan_out.get_or_insert_with(FanOutKeeps::default);
        Offer {
            fan_out: Some(Arc::clone(keeps)),
            device: self.device.clone(),
            semaphore: self.semaphore.clone(),
            no_semaphore: self.no_semaphore.clone(),
            released: None,
            want_released: false,
            strict: self.strict,
        }
    }

    /// This route's section of the hello (a new semaphore descriptor each time).
    pub(crate) fn sections(&mut self) -> Result<Vec<Attachment>> {
        let info = self.device.info();
        let mut identity = Identity {
            flags: 0,
            device_uuid: info.device_uuid,
            driver_uuid: info.driver_uuid,
            declined: String::new(),
        };
        let mut fds = Vec::new();
        if let Some(semaphore) = &self.semaphore {
            identity.flags |= OFFER_SEMAPHORE;
            fds.push(semaphore.export_fd()?);
        }
        if let Some(released) = &self.released {
            identity.flags |= OFFER_RELEASED;
            fds.push(released.export_fd()?);
        }
        Ok(vec![Attachment { route: ROUTE_ID, bytes: identity.encode(), handles: fds }])
    }

    /// Reads the consumer's answer: `Ok(sender)` when buffers can go by reference, `Err(why)`
    /// when they must be staged (an error instead under strict_gpu). `holds`: where the
    /// carrier has the sender keep the arenas the consumer may read.
    pub(crate) fn accept(
        self,
        channel: &str,
        answer: Option<Attachment>,
        holds: Arc<PeerHolds>,
    ) -> Result<std::result::Result<Sender, String>> {
        let mine = self.device.info();
        let why = match answer {
            None => Some(
                "the consumer offers no GPU route (vulkan_ipc is not allowed there, or it runs an older lava-flow)"
                    .to_owned(),
            ),
            Some(section) => {
                let peer = Identity::decode(&section.bytes, "consumer")?;
                if peer.flags & ANSWER_GPU == 0 {
                    Some(format!("the consumer serves no GPU route ({})", peer.declined))
                } else if peer.device_uuid != mine.device_uuid || peer.driver_uuid != mine.driver_uuid {
                    Some(format!(
                        "the consumer uses another GPU or driver (deviceUUID {}, driverUUID {}; this process: {} ({}), {}, {})",
                        format_uuid(&peer.device_uuid),
                        format_uuid(&peer.driver_uuid),
                        mine.name,
                        mine.index,
                        format_uuid(&mine.device_uuid),
                        format_uuid(&mine.driver_uuid)
                    ))
                } else {
                    return Ok(Ok(self.into_sender(peer.flags & ANSWER_SEMAPHORE != 0, channel, holds)?));
                }
            }
        };
        let why = why.expect("set on every other path");
        if self.strict {
            return Err(Error::Unsupported(format!(
                "channel {channel:?}: GPU buffers would be staged through host memory, which strict_gpu forbids: {why}"
            )));
        }
        Ok(Err(why))
    }

    fn into_sender(self, peer_imports_semaphores: bool, channel: &str, holds: Arc<PeerHolds>) -> Result<Sender> {
        let info = self.device.info();
        let (semaphore, sync) = match (self.semaphore, peer_imports_semaphores) {
            (Some(s), true) => (Some(s), "GPU-side synchronisation through a shared timeline semaphore".to_owned()),
            (mine, _) => {
                let why = match (mine, self.no_semaphore) {
                    (None, Some(why)) => why,
                    _ => "the consumer's device cannot import timeline semaphores".to_owned(),
                };
                if self.strict {
                    return Err(Error::Unsupported(format!(
                        "channel {channel:?}: GPU buffers would be synchronised on the host, which strict_gpu forbids: {why}"
                    )));
                }
                (None, format!("host-side synchronisation (buffers are complete when sent), because {why}"))
            }
        };
        let released = match (self.released, &semaphore) {
            (Some(released), Some(_)) => Ok(released),
            _ if !self.want_released => Err("the channel was not created with released_semaphore set".to_owned()),
            _ => {
                let why = format!("the consumer cannot signal a released semaphore: {sync}");
                if self.strict {
                    return Err(Error::Unsupported(format!("channel {channel:?}: {why}, which strict_gpu forbids")));
                }
                Err(why)
            }
        };
        let released_text = match &released {
            Ok(_) => "; the consumer signals a released semaphore as it lets go of GPU messages",
            Err(_) => "",
        };
        let reason = format!(
            "GPU buffers: vulkan_ipc, by reference (both processes on {} {}, each arena exported once per channel); {sync}{released_text}",
            info.name,
            format_uuid(&info.device_uuid)
        );
        let released = released.map(Arc::new);
        let released_due = Arc::new(AtomicU64::new(0));
        if let Ok(released) = &released {
            // A consumer that dies owes the producer's GPU work the values of the messages it
            // held (it may have released them with a signal on its GPU still to come): the
            // producer signals them itself, so that no stream waits for a dead process.
            let (released, due) = (Arc::clone(released), Arc::clone(&released_due));
            holds.on_death(Box::new(move || {
                let value = due.load(Ordering::Acquire);
                if value > released.value().unwrap_or(u64::MAX) {
                    let _ = released.signal(value);
                }
            }));
        }
        Ok(Sender {
            route: Route { class: PayloadClass::Gpu, kind: super::ID, reason },
            device: self.device,
            semaphore,
            released,
            released_due,
            arenas: HashMap::new(),
            holds,
            generations: Vec::new(),
            last_seqs: Vec::new(),
            free_slots: Vec::new(),
            last: None,
            last_ready: Arc::default(),
            since_sweep: 0,
            fan_out: self.fan_out,
        })
    }
}

/// An arena the consumer knows: its slot and generation. The reference that keeps its memory
/// alive until the consumer released the last message into it is in the sender's holds, under
/// the slot; `held` only watches it (never upgraded, so that a count of one is that hold's
/// alone).
struct SentArena {
    slot: u32,
    generation: u32,
    held: Weak<dyn Any + Send + Sync>,
}

/// The producer's side of a connected route.
pub(crate) struct Sender {
    route: Route,
    device: VulkanDevice,
    semaphore: Option<Arc<TimelineSemaphore>>,
    /// The semaphore the consumer signals as it lets go of GPU messages, or why there is none.
    released: std::result::Result<Arc<TimelineSemaphore>, String>,
    /// The released value that covers every GPU message sent so far (the last one's sequence
    /// number + 1): what the producer signals itself if the consumer dies.
    released_due: Arc<AtomicU64>,
    arenas: HashMap<ArenaId, SentArena>,
    /// The arenas the consumer may read, by slot, kept alive until it released every message
    /// into them, or died.
    holds: Arc<PeerHolds>,
    /// Per slot, the generation of its current (or last) arena, and the last message into it.
    generations: Vec<u32>,
    last_seqs: Vec<u64>,
    free_slots: Vec<u32>,
    /// The last arena sent: a stream usually sends from one.
    last: Option<(ArenaId, u32, u32)>,
    /// The last ready value sent, by this route or the CUDA route, which shares the semaphore.
    last_ready: Arc<AtomicU64>,
    /// Messages packed since arenas that died were last looked for.
    since_sweep: u32,
    /// The arenas' references shared with the fan-out's other consumers' senders.
    fan_out: Option<FanOutKeeps>,
}

impl Sender {
    /// Lets go of arenas that died here and whose messages are all released, telling the
    /// consumer to drop its imports (an attachment on the next message).
    fn sweep(&mut self, completed: u64, attachments: &mut Vec<Attachment>) {
        self.since_sweep = 0;
        // Nothing here uses the arena any more (the hold is its one reference), and every
        // message into it has been released.
        let last_seqs = &self.last_seqs;
        let done: Vec<ArenaId> = self
            .arenas
            .iter()
            .filter(|(_, a)| a.held.strong_count() == 1 && last_seqs[a.slot as usize] < completed)
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            let gone = self.arenas.remove(&id).expect("listed above");
            self.holds.release(u64::from(gone.slot));
            attachments.push(Attachment::new(
                ROUTE_ID,
                ArenaRecord::Forget { slot: gone.slot, generation: gone.generation }.encode(),
            ));
            self.free_slots.push(gone.slot);
            if self.last.is_some_and(|(last, _, _)| last == id) {
                self.last = None;
            }
        }
    }

    /// The consumer's slot and generation for `arena`, with the attachments that must reach it
    /// first: the arena's export the first time, and the end of arenas that died since.
    fn slot_of(&mut self, gpu: &GpuBuffer, completed: u64, attachments: &mut Vec<Attachment>) -> Result<(u32, u32)> {
        let arena = gpu.arena_id();
        if let Some((id, slot, generation)) = self.last {
            if id == arena {
                return Ok((slot, generation));
            }
        }
        if let Some(known) = self.arenas.get(&arena) {
            let found = (known.slot, known.generation);
            self.last = Some((arena, found.0, found.1));
            return Ok(found);
        }
        self.sweep(completed, attachments);
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if (self.generations.len() as u32) < MAX_SLOTS => {
                self.generations.push(0);
                self.last_seqs.push(0);
                self.generations.len() as u32 - 1
            }
            None => {
                return Err(Error::OutOfMemory(format!(
                    "this channel already shares {MAX_SLOTS} GPU arenas alive at once; free buffers, or send from fewer arenas (larger pools)"
                )))
            }
        };
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        let generation = self.generations[slot as usize];
        let export = gpu.export_arena()?;
        attachments.push(Attachment {
            route: ROUTE_ID,
            bytes: ArenaRecord::Announce { slot, generation, desc: export.desc }.encode(),
            handles: vec![export.fd],
        });
        let (keep, held) = self.keep(gpu);
        self.arenas.insert(arena, SentArena { slot, generation, held });
        self.holds.hold(u64::from(slot), keep);
        self.last = Some((arena, slot, generation));
        Ok((slot, generation))
    }
}

impl Sender {
    /// What the consumer's hold keeps of `gpu`'s arena, and the reference that is the channel's
    /// only one once nothing else uses the arena (a fan-out's one reference, shared by every
    /// consumer's hold, holds the arena's).
    fn keep(&self, gpu: &GpuBuffer) -> (Arc<dyn Any + Send + Sync>, Weak<dyn Any + Send + Sync>) {
        let Some(keeps) = &self.fan_out else {
            let keep = gpu.arena_keep_alive();
            let held = Arc::downgrade(&keep);
            return (keep, held);
        };
        let mut keeps = keeps.lock();
        let shared = match keeps.get(&gpu.arena_id()).and_then(Weak::upgrade) {
            Some(shared) => shared,
            None => {
                keeps.retain(|_, k| k.strong_count() > 0);
                let shared = Arc::new(FanOutKeep(gpu.arena_keep_alive()));
                keeps.insert(gpu.arena_id(), Arc::downgrade(&shared));
                shared
            }
        };
        let held = Arc::downgrade(&shared.0);
        (shared, held)
    }
}

impl RouteSender for Sender {
    fn route_id(&self) -> u32 {
        ROUTE_ID
    }

    fn route(&self) -> &Route {
        &self.route
    }

    fn serves(&self, kind: MemoryKind) -> bool {
        kind == MemoryKind::Vulkan
    }

    fn pack(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()> {
        let (offset, len, ready_value) = (payload.offset, payload.len, payload.ready_value);
        let PayloadMemory::Buffer(buffer) = payload.memory else {
            return Err(Error::Unsupported(format!(
                "the vulkan_ipc route sends lava-flow's GPU buffers, not {}",
                payload.kind
            )));
        };
        // Allocated here (a view of such a buffer too): a received buffer is the producer's.
        let Some((gpu, start)) = buffer.gpu_region().filter(|_| buffer.origin() == BufferOrigin::Allocated) else {
            return Err(Error::Unsupported(format!(
                "buffer {} is {} that this channel cannot send by reference (a received GPU buffer is the producer's: copy it into a buffer of your own first)",
                buffer.id(),
                buffer.location()
            )));
        };
        if !gpu.device().same_device(&self.device) {
            return Err(Error::invalid(format!(
                "buffer {} belongs to another context's Vulkan device than the channel's; allocate it from the channel's context",
                buffer.id()
            )));
        }
        if ready_value != 0 {
            if self.semaphore.is_none() {
                return Err(Error::Unsupported(format!(
                    "this channel cannot wait for a ready value: {}",
                    self.route.reason
                )));
            }
            let last = self.last_ready.load(Ordering::Relaxed);
            if ready_value < last {
                return Err(Error::invalid(format!(
                    "ready value {ready_value} is below the previous message's {last}: values must grow"
                )));
            }
            self.last_ready.store(ready_value, Ordering::Relaxed);
        }
        self.since_sweep += 1;
        if self.since_sweep >= SWEEP_EVERY {
            self.sweep(completed, &mut out.attachments);
        }
        let (slot, generation) = self.slot_of(gpu, completed, &mut out.attachments)?;
        let descriptor =
            Descriptor { slot, generation, offset: gpu.offset() + start + offset as u64, len: len as u64, ready_value };
        out.descriptor[..Descriptor::LEN].copy_from_slice(&descriptor.encode());
        out.descriptor_len = Descriptor::LEN;
        Ok(())
    }

    fn sent(&mut self, seq: u64) {
        if let Some((_, slot, _)) = self.last {
            self.last_seqs[slot as usize] = seq;
        }
        if self.released.is_ok() {
            self.released_due.store(seq + 1, Ordering::Release);
        }
    }

    fn ready_semaphore(&self) -> Result<OwnedHandle> {
        match &self.semaphore {
            Some(s) => s.export_fd(),
            None => Err(Error::Unsupported(format!(
                "the channel shares no semaphore with its consumer: {}",
                self.route.reason
            ))),
        }
    }

    fn ready_share(&self) -> ReadyOffer {
        Some(match &self.semaphore {
            Some(_) => Ok(ReadyShare {
                device_uuid: self.device.info().device_uuid,
                last: Arc::clone(&self.last_ready),
                semaphore: None,
            }),
            None => Err(self.route.reason.clone()),
        })
    }

    fn released_semaphore(&self) -> Result<OwnedHandle> {
        match &self.released {
            Ok(s) => s.export_fd(),
            Err(why) => Err(Error::Unsupported(format!("the channel has no released semaphore: {why}"))),
        }
    }
}
