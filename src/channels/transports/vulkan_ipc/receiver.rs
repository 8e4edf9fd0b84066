//! The consumer's half of the Vulkan IPC route.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use super::wire::{
    ArenaRecord, Descriptor, Identity, ANSWER_GPU, ANSWER_SEMAPHORE, MAX_SLOTS, OFFER_RELEASED, OFFER_SEMAPHORE,
};
use super::ROUTE_ID;
use crate::channels::ready::{ReadyOffer, ReadyShare};
use crate::channels::transport::{
    Attachment, PayloadClass, Route, RouteReceiver, RoutedMemory, RoutedPayload, TransportId,
};
use crate::error::{Error, Result};
use crate::memory::gpu::{external, format_uuid, GpuBuffer, GpuExport, GpuImporter, TimelineSemaphore, VulkanDevice};
use crate::memory::{Buffer, BufferOrigin, Context};
use crate::os::OwnedHandle;

/// A producer's released semaphore, signalled as this consumer lets go of GPU messages: to
/// `seq + 1` once message `seq` and every GPU message before it are let go. Signalled here, on
/// the host, until the consumer signals it on its GPU instead (`released_by_caller`); from then
/// on only the consumer does, so that the values its GPU signals are never overtaken by a larger
/// one from here.
struct ReleaseTracker {
    semaphore: TimelineSemaphore,
    /// A descriptor of it kept for the consumer's GPU work (an imported semaphore need not be
    /// exportable again).
    fd: OwnedHandle,
    state: Mutex<ReleaseState>,
}

struct ReleaseState {
    /// GPU messages received and whether each was let go, oldest first.
    held: VecDeque<(u64, bool)>,
    /// The value last signalled, or handed to the consumer to signal.
    signalled: u64,
    /// The consumer signals on its GPU: nothing is signalled here any more.
    by_caller: bool,
}

impl ReleaseTracker {
    fn new(semaphore: TimelineSemaphore, fd: OwnedHandle) -> ReleaseTracker {
        let state = ReleaseState { held: VecDeque::new(), signalled: 0, by_caller: false };
        ReleaseTracker { semaphore, fd, state: Mutex::new(state) }
    }

    fn received(&self, seq: u64) {
        self.state.lock().held.push_back((seq, false));
    }

    fn released(&self, seq: u64) {
        let mut state = self.state.lock();
        if let Some(value) = state.signal_here(seq) {
            // A failed signal leaves the producer's GPU waiting; its host-side completion
            // (and peer-death detection) still work, so there is nothing better to do here.
            if self.semaphore.signal(value).is_ok() {
                state.signalled = value;
            }
        }
    }

    fn released_by_caller(&self, seq: u64) -> u64 {
        self.state.lock().signal_by_caller(seq)
    }
}

impl ReleaseState {
    /// Marks `seq` let go of; the value every message below is let go at (None: not held).
    fn let_go(&mut self, seq: u64) -> Option<u64> {
        let entry = self.held.iter_mut().find(|(s, _)| *s == seq)?;
        entry.1 = true;
        let mut value = self.signalled;
        while let Some(&(s, true)) = self.held.front() {
            self.held.pop_front();
            value = s + 1;
        }
        if let Some(&(first_held, _)) = self.held.front() {
            value = value.max(first_held);
        }
        Some(value)
    }

    /// `seq` was let go of: the value to signal on the host now, if any (the caller notes it
    /// in `signalled` once signalled).
    fn signal_here(&mut self, seq: u64) -> Option<u64> {
        let value = self.let_go(seq)?;
        (value > self.signalled && !self.by_caller).then_some(value)
    }

    /// `seq` was let go of, the signal left to the consumer's GPU from now on: the value to
    /// signal there, 0 for none.
    fn signal_by_caller(&mut self, seq: u64) -> u64 {
        self.by_caller = true;
        // A message let go of already has nothing more to signal.
        match self.let_go(seq) {
            Some(value) if value > self.signalled => {
                self.signalled = value;
                value
            }
            _ => 0,
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
    released: Released,
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
        if let Ok(tracker) = &self.released {
            tracker.released(seq);
        }
    }

    fn released_by_caller(&self, seq: u64) -> std::result::Result<u64, String> {
        match &self.released {
            Ok(tracker) => Ok(tracker.released_by_caller(seq)),
            Err(why) => Err(format!("the channel has no released semaphore: {why}")),
        }
    }
}

/// The current producer's released semaphore, or why it has none.
type Released = std::result::Result<Arc<ReleaseTracker>, Arc<str>>;

fn no_released(why: &str) -> Released {
    Err(Arc::from(why))
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
    semaphore_fd: Option<OwnedHandle>,
    /// The current producer's released semaphore, where it asked for one.
    released: Released,
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
            released: no_released("no producer attached yet"),
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
        let handles = external::HANDLE_NAME;
        format!(
            "{} (driver {}) cannot import timeline semaphores from {handles}s (timeline semaphores: {}; as {handles}s: {})",
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
        self.released = no_released("the producer offers no GPU route");
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
                    self.released = no_released(&self.no_semaphore);
                    return Ok(());
                }
                _ => return Err(self.corrupt("offer's semaphore flag and descriptors disagree".into())),
            };
        if !self.imports_semaphores {
            self.no_semaphore = self.own_semaphore_gap();
            self.released = no_released(&self.no_semaphore);
            return Ok(());
        }
        let kept = fd.try_clone().map_err(|e| Error::os("duplicating the producer's semaphore handle", e))?;
        self.semaphore = Some(Arc::new(TimelineSemaphore::import(&self.device, fd)?));
        self.semaphore_fd = Some(kept);
        if let Some(fd) = released_fd {
            let kept =
                fd.try_clone().map_err(|e| Error::os("duplicating the producer's released semaphore handle", e))?;
            let semaphore = TimelineSemaphore::import(&self.device, fd)?;
            self.released = Ok(Arc::new(ReleaseTracker::new(semaphore, kept)));
        } else {
            self.released = no_released(
                "the producer did not ask for one (set released_semaphore in the producer's channel config)",
            );
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
        self.released = no_released("the producer has gone");
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
        if let Ok(tracker) = &arena.arena.released {
            tracker.received(seq);
        }
        arena.last_seq = Some(seq);
        // SAFETY: the arena stays in `arenas`, or in `retired` until message `seq` is
        // released, or with the carrier's session while its views are held (end_session):
        // alive and in place (behind its Arc) until the payload, dropped before that release,
        // is gone.
        Ok(Some(unsafe { RoutedPayload::new(&*arena.arena, d.offset, d.len as usize, d.ready_value, seq) }))
    }

    fn ready_share(&self) -> ReadyOffer {
        Some(match &self.semaphore {
            Some(semaphore) => Ok(ReadyShare {
                device_uuid: self.device.info().device_uuid,
                last: Default::default(),
                semaphore: Some(Arc::clone(semaphore)),
            }),
            None => Err(match &self.staged {
                Some(why) => format!("GPU buffers are staged: {why}"),
                None => self.no_semaphore.clone(),
            }),
        })
    }

    fn released_semaphore(&self) -> Result<OwnedHandle> {
        match &self.released {
            Ok(tracker) => {
                tracker.fd.try_clone().map_err(|e| Error::os("duplicating the producer's released semaphore handle", e))
            }
            Err(why) => Err(Error::Unsupported(format!("the channel has no released semaphore: {why}"))),
        }
    }

    fn ready_semaphore(&self) -> Result<OwnedHandle> {
        match &self.semaphore_fd {
            Some(fd) => fd.try_clone().map_err(|e| Error::os("duplicating the producer's semaphore handle", e)),
            None => Err(Error::Unsupported(format!(
                "the channel shares no semaphore with its producer: {}",
                self.no_semaphore
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReleaseState;

    fn state(received: &[u64]) -> ReleaseState {
        ReleaseState { held: received.iter().map(|&s| (s, false)).collect(), signalled: 0, by_caller: false }
    }

    #[test]
    fn the_host_signals_the_released_prefix_until_the_caller_takes_over() {
        // GPU messages 0, 2, 3, 5 (1 and 4 went by shared memory).
        let mut s = state(&[0, 2, 3, 5]);
        assert_eq!(s.signal_here(0), Some(2), "everything below the first held GPU message is let go of");
        s.signalled = 2;
        assert_eq!(s.signal_here(3), None, "3 before 2: nothing new below 2");
        // The caller takes over: 2 covers 3, and 4 below the next held GPU message.
        assert_eq!(s.signal_by_caller(2), 5);
        // Released on the host after that: left to the caller's next value.
        s.held.push_back((6, false));
        assert_eq!(s.signal_here(5), None, "the host signals nothing once the caller does");
        assert_eq!(s.signal_by_caller(6), 7, "the caller's next value covers what the host let go of");
    }

    #[test]
    fn values_handed_to_the_caller_only_grow_whatever_the_release_order() {
        let mut s = state(&[0, 1, 2, 3, 4]);
        s.by_caller = true;
        let mut handed = Vec::new();
        for seq in [3, 1, 0, 4, 2] {
            let v = s.signal_by_caller(seq);
            if v != 0 {
                handed.push(v);
            }
        }
        // 3 and 1 are let go of while 0 is held: nothing due; 0 covers 1 (2 still held); 4
        // waits for 2, which covers everything.
        assert_eq!(handed, [2, 5]);
        assert!(handed.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s.signal_by_caller(2), 0, "released twice: nothing more");
        assert_eq!(s.signal_by_caller(99), 0, "never received: nothing");
    }
}
