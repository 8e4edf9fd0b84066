//! The consumer's half of the CUDA IPC route: the producer's allocations opened here, by
//! slot, closed when the producer says they changed, when more are open than the cache
//! allows (least recently used first, never one a held message points into), or when the
//! producer has gone and no message holds them.

use std::any::Any;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::cuda::{Mapping, Opener};
use super::wire::{AllocationRecord, Announce, Descriptor, Section, ANSWER_CUDA, MAX_SLOTS, MEMORY_VMM};
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
    fd: OwnedFd,
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

    fn released(&self, _seq: u64) {}

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
    fd: Option<OwnedFd>,
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
    /// Whether the current producer offered the route (its process has CUDA).
    offered: bool,
    slots: Vec<Option<Slot>>,
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
        Receiver {
            opener,
            #[cfg(feature = "vulkan")]
            vulkan: None,
            devices,
            session: 0,
            off: Some("no producer attached yet".into()),
            offered: false,
            slots: Vec::new(),
            retired: Vec::new(),
            open: 0,
            bound: bound.max(1),
            tick: 0,
            released_below: 0,
            opened: 0,
            ready: Err(crate::channels::ready::NO_SHARED_READY.into()),
            last_ready: 0,
        }
    }

    /// Imports VMM pieces of `device`'s own GPU into Vulkan too, for `Message::buffer`.
    #[cfg(feature = "vulkan")]
    pub(crate) fn with_vulkan(mut self, device: Option<&crate::memory::gpu::VulkanDevice>) -> Receiver {
        self.vulkan = device.map(crate::memory::gpu::GpuImporter::new);
        self
    }

    /// This route's answer to every producer's hello: the devices it opens memory on.
    pub(crate) fn answer(&self) -> Attachment {
        let section = match &self.devices {
            Ok(devices) if !devices.is_empty() => {
                Section { flags: ANSWER_CUDA, devices: devices.clone(), declined: String::new() }
            }
            Ok(_) => Section { flags: 0, devices: Vec::new(), declined: "this process sees no CUDA device".into() },
            Err(why) => Section { flags: 0, devices: Vec::new(), declined: why.clone() },
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
        let opened = if slot.allocation.exporter_pid == std::process::id() {
            // Both ends in this process (a CUDA IPC handle does not open where it was made):
            // the producer's address is this process's.
            Ok(Box::new(SameProcess { address: slot.allocation.base, device: slot.device }) as Box<dyn Mapping>)
        } else {
            self.opener.open(&slot.allocation, slot.fd.as_ref().map(|fd| fd.as_fd()), slot.device)
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
            mapping,
            #[cfg(feature = "vulkan")]
            vulkan,
        });
        self.slots[index].as_mut().expect("found above").open = Some(import);
        self.open += 1;
        self.opened += 1;
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

    /// What slot `index`'s Vulkan import needs, where it is a VMM piece of this process's
    /// Vulkan device.
    #[cfg(feature = "vulkan")]
    fn vulkan_import(&self, index: usize) -> Result<Option<VulkanImport>> {
        let slot = self.slots[index].as_ref().expect("the caller found it");
        let (Some(importer), Some(fd)) = (&self.vulkan, &slot.fd) else { return Ok(None) };
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
            (Some(offer), Ok(_)) => {
                Section::decode(&offer.bytes, "producer")?;
                None
            }
        };
        Ok(())
    }

    fn route(&self, carrier: TransportId) -> Route {
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
                     legacy CUDA IPC, VMM pieces mapped from their fds; at most {} open at once)",
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
        self.open = 0;
        self.off = Some("the producer has gone".into());
        (self.session, Box::new(kept))
    }

    fn attach(&mut self, attachment: Attachment, released_below: u64) -> Result<()> {
        self.released_below = released_below;
        self.retired.retain(|(_, last)| *last >= released_below);
        let count = attachment.handles.len();
        match AllocationRecord::decode(&attachment.bytes, count)? {
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
                debug_assert!(fd.is_some() == (allocation.memory == MEMORY_VMM), "decode checked the fds");
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
        slot.used = self.tick;
        slot.last_seq = Some(seq);
        let import = slot.open.as_ref().expect("opened above");
        // SAFETY: the import stays in its slot while a message into it is held (eviction skips
        // those), or in `retired` until message `seq` is released, or with the carrier's
        // session while its views are held (end_session): alive and in place (behind its Arc)
        // until the payload, dropped before that release, is gone.
        Ok(Some(unsafe { RoutedPayload::new(&**import, d.offset, d.len as usize, d.ready_value, seq) }))
    }

    fn ready_semaphore(&self) -> Result<OwnedFd> {
        Err(Error::Unsupported(
            "the cuda_ipc route has no semaphore of its own: its ready values count on the GPU route's".into(),
        ))
    }

    fn share_ready(&mut self, share: &SharedReady) {
        self.ready = share.clone();
    }
}
