//! The consumer's half of the Vulkan IPC route.

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use parking_lot::Mutex;

use super::wire::{
    ArenaRecord, Descriptor, Identity, ANSWER_GPU, ANSWER_SEMAPHORE, MAX_SLOTS, OFFER_RELEASED, OFFER_SEMAPHORE,
};
use super::ROUTE_ID;
use crate::channels::transport::{
    Attachment, PayloadClass, Route, RouteReceiver, RoutedMemory, RoutedPayload, TransportId,
};
use crate::error::{Error, Result};
use crate::memory::gpu::{format_uuid, GpuBuffer, GpuExport, GpuImporter, TimelineSemaphore, VulkanDevice};
use crate::memory::{Buffer, BufferOrigin, Context};

/// A producer's released semaphore, signalled as this consumer lets go of GPU messages: to
/// `seq + 1` once message `seq` and every GPU message before it are let go.
struct ReleaseTracker {
    semaphore: TimelineSemaphore,
    /// GPU messages received and whether each was let go, oldest first; and the value last
    /// signalled.
    state: Mutex<(VecDeque<(u64, bool)>, u64)>,
}

impl ReleaseTracker {
    fn received(&self, seq: u64) {
        self.state.lock().0.push_back((seq, false));
    }

    fn released(&self, seq: u64) {
        let mut state = self.state.lock();
        let (held, signalled) = &mut *state;
        let Some(entry) = held.iter_mut().find(|(s, _)| *s == seq) else { return };
        entry.1 = true;
        let mut value = *signalled;
        while let Some(&(s, true)) = held.front() {
            held.pop_front();
            value = s + 1;
        }
        if let Some(&(first_held, _)) = held.front() {
            value = value.max(first_held);
        }
        if value > *signalled {
            // A failed signal leaves the producer's GPU waiting; its host-side completion
            // (and peer-death detection) still work, so there is nothing better to do here.
            if self.semaphore.signal(value).is_ok() {
                *signalled = value;
            }
        }
    }
}

/// An arena of the current producer, imported on this process's device, with what its
/// messages' views need: its mapping and the session's semaphores.
struct ImportedArena {
    /// A buffer over the whole arena; a message's buffer is a view of it.
    whole: Arc<GpuBuffer>,
    size: u64,
    /// Byte 0 in this process, or null where the host cannot map the memory.
    base: *mut u8,
    semaphore: Option<Arc<TimelineSemaphore>>,
    released: Option<Arc<ReleaseTracker>>,
    exporter_pid: u32,
}

// SAFETY: `base` is the arena's mapping, which lives as long as `whole`; GpuBuffer and
// TimelineSemaphore are Send + Sync, and the pointer is only read.
unsafe impl Send for ImportedArena {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for ImportedArena {}

impl RoutedMemory for ImportedArena {
    #[inline]
    fn host_base(&self) -> *mut u8 {
        self.base
    }

    fn view(&self, offset: u64, len: usize, ready_value: u64) -> Option<Buffer> {
        let wait = self.semaphore.as_ref().filter(|_| ready_value != 0).map(|s| (Arc::clone(s), ready_value));
        let origin = BufferOrigin::Imported { exporter_pid: self.exporter_pid };
        Some(Buffer::gpu_view_mapped(Arc::clone(&self.whole), offset, len, self.base, wait, origin))
    }

    #[inline]
    fn released(&self, seq: u64) {
        if let Some(tracker) = &self.released {
            tracker.released(seq);
        }
    }
}

/// A slot's arena, its generation, and the last message that pointed into it (messages hold
/// no reference: the arena is let go only once that one is released).
struct Imported {
    generation: u32,
    arena: Arc<ImportedArena>,
    last_seq: Option<u64>,
}

/// The consumer's side of the route: the producer's arenas imported here, by slot.
pub(crate) struct Receiver {
    device: VulkanDevice,
    importer: GpuImporter,
    /// Whether this device can import the producer's semaphore.
    imports_semaphores: bool,
    session: u64,
    semaphore: Option<Arc<TimelineSemaphore>>,
    /// A descriptor of the producer's semaphore kept for handing on (to CUDA), since an
    /// imported semaphore need not be exportable again.
    semaphore_fd: Option<OwnedFd>,
    /// The current producer's released semaphore, where it asked for one.
    released: Option<Arc<ReleaseTracker>>,
    /// Why the current producer shares no semaphore.
    no_semaphore: String,
    /// Why the current producer stages its GPU buffers, when it does.
    staged: Option<String>,
    arenas: Vec<Option<Imported>>,
    /// Arenas the producer said died while a message into them was still held, with that
    /// message's sequence number (a well-behaved producer says so only after the release).
    retired: Vec<(Arc<ImportedArena>, u64)>,
    last_ready: u64,
    imports: u64,
}

impl Receiver {
    pub(crate) fn new(context: &Context) -> Result<Receiver> {
        let device = context
            .gpu_device()
            .cloned()
            .ok_or_else(|| Error::Unsupported("the Vulkan IPC route needs a Vulkan device in this process".into()))?;
        let info = device.info();
        let imports_semaphores = info.timeline_semaphores && info.semaphore_fd.importable;
        Ok(Receiver {
            importer: GpuImporter::new(&device),
            device,
            imports_semaphores,
            session: 0,
            semaphore: None,
            semaphore_fd: None,
            released: None,
            no_semaphore: "no producer attached yet".into(),
            staged: None,
            arenas: Vec::new(),
            retired: Vec::new(),
            last_ready: 0,
            imports: 0,
        })
    }

    /// This route's answer to every producer's hello: who this process's device is.
    pub(crate) fn answer(&self) -> Attachment {
        let info = self.device.info();
        let mut flags = ANSWER_GPU;
        if self.imports_semaphores {
            flags |= ANSWER_SEMAPHORE;
        }
        Attachment::new(
            ROUTE_ID,
            Identity { flags, device_uuid: info.device_uuid, driver_uuid: info.driver_uuid, declined: String::new() }
                .encode(),
        )
    }

    /// The answer of a consumer that serves no GPU route, saying why (the producer stages).
    pub(crate) fn decline(why: &str) -> Attachment {
        Attachment::new(
            ROUTE_ID,
            Identity { flags: 0, device_uuid: [0; 16], driver_uuid: [0; 16], declined: why.to_owned() }.encode(),
        )
    }

    /// Why this process's device cannot take the producer's semaphore.
    fn own_semaphore_gap(&self) -> String {
        let info = self.device.info();
        format!(
            "{} (driver {}) cannot import timeline semaphores from opaque fds (timeline semaphores: {}; as opaque fds: {})",
            info.name,
            info.driver_name,
            if info.timeline_semaphores { "yes" } else { "no" },
            info.semaphore_fd
        )
    }

    /// Lets go of an arena the producer replaced or said died, once no message into it is held.
    fn retire(&mut self, old: Imported, released_below: u64) {
        if let Some(last) = old.last_seq.filter(|last| *last >= released_below) {
            self.retired.push((old.arena, last));
        }
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!("the producer's GPU route {what}"))
    }
}

impl RouteReceiver for Receiver {
    fn route_id(&self) -> u32 {
        ROUTE_ID
    }

    fn new_session(&mut self, session: u64, offer: Option<Attachment>) -> Result<()> {
        debug_assert!(self.arenas.is_empty() && self.retired.is_empty(), "the earlier session was ended first");
        self.session = session;
        self.semaphore = None;
        self.semaphore_fd = None;
        self.released = None;
        self.last_ready = 0;
        self.staged = Some(
            "the producer offers no GPU route (it has no Vulkan device, or vulkan_ipc is not allowed there)".into(),
        );
        let Some(offer) = offer else { return Ok(()) };
        let identity = Identity::decode(&offer.bytes, "producer")?;
        let mine = self.device.info();
        if identity.device_uuid != mine.device_uuid || identity.driver_uuid != mine.driver_uuid {
            // The producer stages: nothing of its device is imported here.
            self.staged =
                Some(format!("it uses another GPU or driver (deviceUUID {})", format_uuid(&identity.device_uuid)));
            return Ok(());
        }
        self.staged = None;
        let wants_released = identity.flags & OFFER_RELEASED != 0;
        let mut fds = offer.handles.into_iter();
        let (fd, released_fd) =
            match (identity.flags & OFFER_SEMAPHORE != 0, wants_released, fds.next(), fds.next(), fds.next()) {
                (true, false, Some(fd), None, None) => (fd, None),
                (true, true, Some(fd), Some(released), None) => (fd, Some(released)),
                (false, false, None, None, None) => {
                    self.no_semaphore = match self.imports_semaphores {
                        false => self.own_semaphore_gap(),
                        true => "the producer's driver cannot share timeline semaphores".into(),
                    };
                    return Ok(());
                }
                _ => return Err(self.corrupt("offer's semaphore flag and descriptors disagree".into())),
            };
        if !self.imports_semaphores {
            self.no_semaphore = self.own_semaphore_gap();
            return Ok(());
        }
        let kept = fd.try_clone().map_err(|e| Error::os("dup of the producer's semaphore descriptor", e))?;
        self.semaphore = Some(Arc::new(TimelineSemaphore::import(&self.device, fd)?));
        self.semaphore_fd = Some(kept);
        if let Some(fd) = released_fd {
            let semaphore = TimelineSemaphore::import(&self.device, fd)?;
            self.released = Some(Arc::new(ReleaseTracker { semaphore, state: Mutex::new((VecDeque::new(), 0)) }));
        }
        Ok(())
    }

    fn route(&self, carrier: TransportId) -> Route {
        let info = self.device.info();
        if let Some(why) = &self.staged {
            return Route {
                class: PayloadClass::Gpu,
                kind: carrier,
                reason: format!("GPU buffers: staged through {carrier} by the producer (copied to host memory): {why}"),
            };
        }
        let sync = match &self.semaphore {
            Some(_) => "GPU-side synchronisation through the producer's timeline semaphore".to_owned(),
            None => {
                format!("host-side synchronisation (buffers are complete when sent), because {}", self.no_semaphore)
            }
        };
        Route {
            class: PayloadClass::Gpu,
            kind: super::ID,
            reason: format!(
                "GPU buffers: vulkan_ipc, by reference (imported on {} {} once per arena); {sync}",
                info.name,
                format_uuid(&info.device_uuid)
            ),
        }
    }

    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>) {
        let mut kept: Vec<Arc<ImportedArena>> = self.retired.drain(..).map(|(arena, _)| arena).collect();
        kept.extend(self.arenas.drain(..).flatten().filter(|a| a.last_seq.is_some()).map(|a| a.arena));
        self.semaphore = None;
        self.semaphore_fd = None;
        self.released = None;
        self.no_semaphore = "the producer has gone".into();
        (self.session, Box::new(kept))
    }

    fn attach(&mut self, attachment: Attachment, released_below: u64) -> Result<()> {
        self.retired.retain(|(_, last)| *last >= released_below);
        let count = attachment.handles.len();
        match ArenaRecord::decode(&attachment.bytes, count)? {
            ArenaRecord::Announce { slot, generation, desc } => {
                let fd = attachment.handles.into_iter().next().expect("decode checked one descriptor");
                if let Some(Some(old)) = self.arenas.get(slot as usize) {
                    if old.generation == generation {
                        return Err(self.corrupt(format!("passed slot {slot} generation {generation} twice")));
                    }
                }
                let exporter_pid = desc.exporter_pid;
                let whole = self
                    .importer
                    .import(GpuExport { desc, fd })
                    .map_err(|e| self.corrupt(format!("passed an arena this device cannot import: {e}")))?;
                // Mapped once here, so that no message's view needs to.
                let base = if whole.is_host_mappable() { whole.map()?.as_ptr() } else { std::ptr::null_mut() };
                let arena = ImportedArena {
                    size: whole.size(),
                    whole: Arc::new(whole),
                    base,
                    semaphore: self.semaphore.clone(),
                    released: self.released.clone(),
                    exporter_pid,
                };
                let index = slot as usize;
                if self.arenas.len() <= index {
                    self.arenas.resize_with(index + 1, || None);
                }
                if let Some(old) = self.arenas[index].take() {
                    self.retire(old, released_below);
                }
                self.arenas[index] = Some(Imported { generation, arena: Arc::new(arena), last_seq: None });
                self.imports += 1;
            }
            ArenaRecord::Forget { slot, generation } => {
                if let Some(entry) = self.arenas.get_mut(slot as usize) {
                    if entry.as_ref().is_some_and(|a| a.generation == generation) {
                        let old = entry.take().expect("checked");
                        self.retire(old, released_below);
                    }
                }
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> Result<Option<RoutedPayload>> {
        let d = Descriptor::decode(descriptor).map_err(|e| self.corrupt(e.to_string()))?;
        if d.slot >= MAX_SLOTS {
            return Err(self.corrupt(format!("names slot {}, beyond the {MAX_SLOTS} a channel uses", d.slot)));
        }
        let Some(arena) =
            self.arenas.get(d.slot as usize).and_then(Option::as_ref).filter(|a| a.generation == d.generation)
        else {
            // Its arena's attachment has not been read yet (the caller reads and retries).
            return Ok(None);
        };
        let size = arena.arena.size;
        if d.len == 0 || d.offset.checked_add(d.len).map_or(true, |end| end > size) {
            return Err(
                self.corrupt(format!("names {} bytes at offset {} of an arena of {size} bytes", d.len, d.offset))
            );
        }
        if d.ready_value != 0 {
            if arena.arena.semaphore.is_none() {
                return Err(self.corrupt(format!(
                    "names ready value {} but shares no semaphore ({})",
                    d.ready_value, self.no_semaphore
                )));
            }
            if d.ready_value < self.last_ready {
                return Err(self.corrupt(format!(
                    "names ready value {}, below the previous message's {}: semaphore values must not go backwards",
                    d.ready_value, self.last_ready
                )));
            }
            self.last_ready = d.ready_value;
        }
        let arena = self.arenas[d.slot as usize].as_mut().expect("found above");
        if let Some(tracker) = &arena.arena.released {
            tracker.received(seq);
        }
        arena.last_seq = Some(seq);
        // SAFETY: the arena stays in `arenas`, or in `retired` until message `seq` is
        // released, or with the carrier's session while its views are held (end_session):
        // alive and in place (behind its Arc) until the payload, dropped before that release,
        // is gone.
        Ok(Some(unsafe { RoutedPayload::new(&*arena.arena, d.offset, d.len as usize, d.ready_value, seq) }))
    }

    fn ready_semaphore(&self) -> Result<OwnedFd> {
        match &self.semaphore_fd {
            Some(fd) => fd.try_clone().map_err(|e| Error::os("dup of the producer's semaphore descriptor", e)),
            None => Err(Error::Unsupported(format!(
                "the channel shares no semaphore with its producer: {}",
                self.no_semaphore
            ))),
        }
    }
}
