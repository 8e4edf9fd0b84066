//! The route's consumer half against a stand-in for the CUDA driver (these run without CUDA):
//! what a hostile producer's records and descriptors get, the stale-import rule, the cache
//! bound and what outlives the producer. The GPU host's tests (tests/layer2/cuda_ipc.rs) run
//! both halves against the driver.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::cuda::{ImportedPool, Mapping, Opener};
use super::receiver::Receiver;
use super::wire::{
    AllocationRecord, Announce, Descriptor, PoolAnnounce, MAX_SLOTS, MEMORY_LEGACY, MEMORY_POOL, MEMORY_VMM,
    MEMORY_VMM_SPAN,
};
use super::{Offer, ROUTE_ID};
use crate::channels::ready::ReadyShare;
use crate::channels::transport::{Attachment, PeerHolds, RouteReceiver, RoutedPayload};
use crate::error::Error;

pub(super) const DEVICE: [u8; 16] = [7; 16];

/// Counts what the receiver opens and closes.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) opened: AtomicUsize,
    pub(super) closed: AtomicUsize,
    /// Pools imported, and pools given back.
    pub(super) pools: AtomicUsize,
    pub(super) pools_closed: AtomicUsize,
    /// Pool allocations imported and freed.
    pub(super) imports: AtomicUsize,
    pub(super) frees: AtomicUsize,
    /// Each span opened: its pieces' (offset, size).
    pub(super) spans: parking_lot::Mutex<Vec<Vec<(u64, u64)>>>,
}

struct FakePool(Arc<Counts>);

impl ImportedPool for FakePool {
    fn import(&self, data: &[u8; 64]) -> crate::Result<u64> {
        self.0.imports.fetch_add(1, Ordering::Relaxed);
        Ok(0x1000_0000 * u64::from(data[0]))
    }
    fn free(&self, _address: u64) -> crate::Result<()> {
        self.0.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for FakePool {
    fn drop(&mut self) {
        self.0.pools_closed.fetch_add(1, Ordering::Relaxed);
    }
}

struct FakeMapping {
    address: u64,
    counts: Arc<Counts>,
}

impl Mapping for FakeMapping {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        0
    }
}

impl Drop for FakeMapping {
    fn drop(&mut self) {
        self.counts.closed.fetch_add(1, Ordering::Relaxed);
    }
}

pub(super) struct FakeOpener(pub(super) Arc<Counts>);

impl Opener for FakeOpener {
    fn open(&self, allocation: &Announce, fd: Option<BorrowedFd<'_>>, _device: i32) -> crate::Result<Box<dyn Mapping>> {
        assert_eq!(fd.is_some(), allocation.memory != MEMORY_LEGACY);
        assert_ne!(allocation.memory, MEMORY_POOL, "pool memory is imported through its pool");
        self.0.opened.fetch_add(1, Ordering::Relaxed);
        // Each allocation at its own place here, told apart by its id.
        Ok(Box::new(FakeMapping { address: 0x1000_0000 * allocation.buffer_id, counts: Arc::clone(&self.0) }))
    }

    fn open_span(
        &self,
        allocation: &Announce,
        pieces: &[(u64, u64, BorrowedFd<'_>)],
        _device: i32,
    ) -> crate::Result<Box<dyn Mapping>> {
        assert_eq!(allocation.memory, MEMORY_VMM_SPAN);
        let layout: Vec<(u64, u64)> = pieces.iter().map(|&(offset, size, _)| (offset, size)).collect();
        self.0.spans.lock().push(layout);
        self.0.opened.fetch_add(1, Ordering::Relaxed);
        // (A span id has its top bit set: the low bits tell spans apart here.)
        let address = 0x1000_0000 * (allocation.buffer_id & 0xffff);
        Ok(Box::new(FakeMapping { address, counts: Arc::clone(&self.0) }))
    }

    fn open_pool(
        &self,
        _pool: &PoolAnnounce,
        _fd: BorrowedFd<'_>,
        _device: i32,
    ) -> crate::Result<Arc<dyn ImportedPool>> {
        self.0.pools.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(FakePool(Arc::clone(&self.0))))
    }
}

pub(super) fn receiver(bound: usize) -> (Receiver, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let mut r = Receiver::new(Arc::new(FakeOpener(Arc::clone(&counts))), Ok(vec![[1; 16], DEVICE]), bound);
    let offer = Offer::cuda_only().sections().pop().unwrap();
    r.new_session(1, Some(offer)).unwrap();
    (r, counts)
}

pub(super) fn legacy(buffer_id: u64) -> Announce {
    Announce {
        memory: MEMORY_LEGACY,
        device_ordinal: 0,
        exporter_pid: 42,
        size: 1 << 20,
        base: 0x7f00_0000_0000,
        buffer_id,
        device_uuid: DEVICE,
        ipc_handle: [buffer_id as u8; 64],
        pool: 0,
        pieces: 0,
    }
}

pub(super) fn announce(
    r: &mut Receiver,
    slot: u32,
    generation: u32,
    allocation: Announce,
    released_below: u64,
) -> crate::Result<()> {
    let bytes = AllocationRecord::Announce { slot, generation, allocation }.encode();
    r.attach(Attachment::new(ROUTE_ID, bytes), released_below)
}

pub(super) fn forget(r: &mut Receiver, slot: u32, generation: u32, released_below: u64) {
    let bytes = AllocationRecord::Forget { slot, generation }.encode();
    r.attach(Attachment::new(ROUTE_ID, bytes), released_below).unwrap();
}

pub(super) fn resolve(
    r: &mut Receiver,
    seq: u64,
    slot: u32,
    generation: u32,
    offset: u64,
    len: u64,
) -> crate::Result<Option<RoutedPayload>> {
    r.resolve(seq, &Descriptor { slot, generation, offset, len, ready_value: 0 }.encode())
}

fn share(device_uuid: [u8; 16]) -> ReadyShare {
    ReadyShare {
        device_uuid,
        last: Arc::default(),
        #[cfg(feature = "vulkan")]
        semaphore: None,
    }
}

fn resolve_ready(r: &mut Receiver, seq: u64, ready_value: u64) -> crate::Result<Option<RoutedPayload>> {
    r.resolve(seq, &Descriptor { slot: 0, generation: 1, offset: 0, len: 64, ready_value }.encode())
}

#[test]
fn a_message_gets_the_cuda_address_of_its_bytes_and_no_host_pointer() {
    let (mut r, counts) = receiver(8);
    announce(&mut r, 0, 1, legacy(2), 0).unwrap();
    let payload = resolve(&mut r, 0, 0, 1, 64, 100).unwrap().expect("announced");
    assert_eq!(payload.cuda_ptr(), Some((0x2000_0000 + 64, 0)));
    assert!(payload.as_ptr().is_null(), "device memory has no host address");
    assert!(payload.to_buffer().is_none());
    drop(payload);
    // The second message into the allocation opens nothing.
    let again = resolve(&mut r, 1, 0, 1, 0, 1 << 20).unwrap().unwrap();
    assert_eq!(again.cuda_ptr(), Some((0x2000_0000, 0)));
    assert_eq!(counts.opened.load(Ordering::Relaxed), 1);
}

#[test]
fn hostile_descriptors_and_records_are_corrupt_or_wait_for_their_attachment() {
    let (mut r, _) = receiver(8);
    announce(&mut r, 3, 1, legacy(2), 0).unwrap();
    // Out of range, empty, and wrapping: corrupt.
    for (offset, len) in [(0, (1 << 20) + 1), (1 << 20, 1), (0, 0), (u64::MAX, 2)] {
        let err = resolve(&mut r, 0, 3, 1, offset, len).err().expect("refused");
        assert!(matches!(&err, Error::Corrupt(m) if m.contains("bytes at offset")), "{err}");
    }
    // A slot beyond any channel's, a short descriptor: corrupt.
    let err = resolve(&mut r, 0, MAX_SLOTS, 1, 0, 1).err().unwrap();
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("beyond")), "{err}");
    let err = r.resolve(0, &[0; 23]).err().unwrap();
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("23 bytes")), "{err}");
    // A slot never announced, or another generation: not known yet (the channel reads the
    // attachments before it, and finding none, calls the message corrupt).
    assert!(resolve(&mut r, 0, 5, 1, 0, 1).unwrap().is_none());
    assert!(resolve(&mut r, 0, 3, 2, 0, 1).unwrap().is_none());
    // The same slot and generation twice, memory of a device this process does not see.
    let err = announce(&mut r, 3, 1, legacy(4), 0).unwrap_err();
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("twice")), "{err}");
    let err = announce(&mut r, 4, 1, Announce { device_uuid: [9; 16], ..legacy(4) }, 0).unwrap_err();
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("does not see")), "{err}");
    // A VMM piece without its fd.
    let bytes =
        AllocationRecord::Announce { slot: 6, generation: 1, allocation: Announce { memory: MEMORY_VMM, ..legacy(5) } }
            .encode();
    assert!(matches!(r.attach(Attachment::new(ROUTE_ID, bytes), 0), Err(Error::Corrupt(_))));
    // What was announced well still serves.
    assert!(resolve(&mut r, 0, 3, 1, 0, 8).unwrap().is_some());
}

/// Memory freed and re-allocated at the same address gets a new `BUFFER_ID`, which the
/// producer announces in a new generation: the message reads the new import, never the
/// stale one, which is closed once no message holds it.
#[test]
fn a_reallocation_at_the_same_address_is_never_served_from_the_stale_import() {
    let (mut r, counts) = receiver(8);
    announce(&mut r, 0, 1, legacy(2), 0).unwrap();
    let old = resolve(&mut r, 0, 0, 1, 0, 16).unwrap().unwrap();
    assert_eq!(old.cuda_ptr().unwrap().0, 0x2000_0000);
    // Message 0 still held: the old import stays.
    forget(&mut r, 0, 1, 0);
    announce(&mut r, 0, 2, legacy(3), 0).unwrap();
    let new = resolve(&mut r, 1, 0, 2, 0, 16).unwrap().unwrap();
    assert_eq!(new.cuda_ptr().unwrap().0, 0x3000_0000, "the new allocation's import");
    assert_eq!(counts.closed.load(Ordering::Relaxed), 0, "message 0 holds the old import");
    assert_eq!(old.cuda_ptr().unwrap().0, 0x2000_0000);
    drop(old);
    // Message 0 released: the next attachment lets go of the old import.
    announce(&mut r, 1, 1, legacy(4), 1).unwrap();
    assert_eq!((counts.opened.load(Ordering::Relaxed), counts.closed.load(Ordering::Relaxed)), (2, 1));
    // The old generation names nothing any more.
    assert!(resolve(&mut r, 2, 0, 1, 0, 16).unwrap().is_none());
}

#[test]
fn the_cache_closes_the_least_recently_used_import_no_message_holds() {
    let (mut r, counts) = receiver(2);
    for slot in 0..3 {
        announce(&mut r, slot, 1, legacy(u64::from(slot) + 1), 0).unwrap();
    }
    drop(resolve(&mut r, 0, 0, 1, 0, 8).unwrap());
    drop(resolve(&mut r, 1, 1, 1, 0, 8).unwrap());
    // Messages 0 and 1 not known to be released: the cache grows rather than close them.
    drop(resolve(&mut r, 2, 2, 1, 0, 8).unwrap());
    assert_eq!((counts.opened.load(Ordering::Relaxed), counts.closed.load(Ordering::Relaxed)), (3, 0));
    // Released, as the carrier says with the next attachment: opening a fourth closes the
    // least recently used until fewer than the bound are open (slots 0 and 1).
    announce(&mut r, 3, 1, legacy(4), 3).unwrap();
    drop(resolve(&mut r, 3, 3, 1, 0, 8).unwrap());
    assert_eq!((counts.opened.load(Ordering::Relaxed), counts.closed.load(Ordering::Relaxed)), (4, 2));
    // A message into a closed one opens it again from its announcement, closing slot 2 (slot
    // 3's message 3 is not known to be released).
    let reopened = resolve(&mut r, 4, 0, 1, 0, 8).unwrap().unwrap();
    assert_eq!(reopened.cuda_ptr().unwrap().0, 0x1000_0000);
    assert_eq!((counts.opened.load(Ordering::Relaxed), counts.closed.load(Ordering::Relaxed)), (5, 3));
    assert_eq!(r.opened(), 5);
}

/// A producer gone: the imports its held messages point into stay until they are released,
/// the others close at once.
#[test]
fn a_gone_producer_s_imports_close_once_no_message_holds_them() {
    let (mut r, counts) = receiver(8);
    announce(&mut r, 0, 1, legacy(1), 0).unwrap();
    announce(&mut r, 1, 1, legacy(2), 0).unwrap();
    let held = resolve(&mut r, 0, 0, 1, 0, 8).unwrap().unwrap();
    drop(resolve(&mut r, 1, 1, 1, 0, 8).unwrap());
    let (session, kept) = r.end_session();
    assert_eq!(session, 1);
    assert_eq!(held.cuda_ptr().unwrap().0, 0x1000_0000, "still readable");
    drop(held);
    assert_eq!(counts.closed.load(Ordering::Relaxed), 0, "the carrier keeps them while views are held");
    drop(kept);
    assert_eq!(counts.closed.load(Ordering::Relaxed), 2);
}

/// Without a CUDA driver (CI), a consumer declines, naming why, and the producer's offer reads
/// that as the reason its sends of CUDA memory are refused.
#[test]
fn a_consumer_without_cuda_declines_and_says_why() {
    let r = super::receiver();
    let answer = r.answer();
    match super::cuda::devices() {
        Ok(devices) if !devices.is_empty() => println!("skipped: this process has CUDA devices"),
        outcome => {
            let accepted = Offer::cuda_only().accept(Some(answer), Arc::new(PeerHolds::default())).unwrap();
            assert!(accepted.sender.is_none(), "declined");
            let why = accepted.refused[0].1.clone();
            assert!(why.starts_with("the consumer cannot open CUDA memory: "), "{why}");
            match outcome {
                Err(reason) => assert!(why.contains(&reason), "{why}"),
                Ok(_) => assert!(why.contains("no CUDA device"), "{why}"),
            }
        }
    }
    let accepted = Offer::cuda_only().accept(None, Arc::new(PeerHolds::default())).unwrap();
    assert!(accepted.sender.is_none());
    let why = &accepted.refused[0].1;
    assert!(why.contains("offers no CUDA route"), "{why}");
}

/// The producer's half on the stand-in exporter: each allocation announced once, memory
/// re-allocated at the same base (a new buffer id) forgotten and announced anew in another
/// slot, a slot reused only once its last message was released, and an allocation the
/// application let go of forgotten at the next sweep.
#[test]
fn the_sender_announces_once_and_forgets_what_changed_or_was_let_go_of() {
    use crate::channels::transport::{MemoryKind, Packed, Payload, PayloadMemory, RouteSender};
    use crate::memory::{CudaMemoryKind, CudaPointer};

    let context = crate::memory::Context::new(crate::memory::ContextConfig {
        gpu: crate::memory::GpuPolicy::Disabled,
        ..Default::default()
    })
    .unwrap();
    let holds = Arc::new(PeerHolds::default());
    let mut sender =
        super::Sender::new(vec![super::fake::UUID], true, None, Arc::clone(&holds), Arc::new(super::fake::Exporter));
    let pointer = |buffer_id| CudaPointer {
        kind: CudaMemoryKind::Legacy,
        base: 0x7000_0000_0000,
        size: 1 << 20,
        buffer_id,
        device_ordinal: 0,
        context: 0,
    };
    let mut seq = 0;
    let mut send = |sender: &mut super::Sender, buffer: &crate::memory::Buffer, completed: u64| {
        let payload = Payload {
            memory: PayloadMemory::Buffer(buffer),
            kind: MemoryKind::Cuda,
            offset: 64,
            len: 128,
            ready_value: 0,
        };
        let mut out = Packed::default();
        sender.pack(&payload, completed, &mut out).unwrap();
        sender.sent(seq);
        seq += 1;
        let d = Descriptor::decode(&out.descriptor[..out.descriptor_len]).unwrap();
        assert_eq!((d.offset, d.len), (64, 128));
        let records: Vec<AllocationRecord> =
            out.attachments.iter().map(|a| AllocationRecord::decode(&a.bytes, a.handles.len()).unwrap()).collect();
        (d.slot, d.generation, records)
    };
    let first = context.register_cuda_for_tests(pointer(1)).unwrap();
    let (slot, generation, records) = send(&mut sender, &first, 0);
    assert!(matches!(records[..], [AllocationRecord::Announce { slot: 0, generation: 1, allocation }]
        if allocation.buffer_id == 1 && allocation.memory == MEMORY_LEGACY && allocation.device_uuid == super::fake::UUID));
    assert_eq!((slot, generation), (0, 1));
    assert!(send(&mut sender, &first, 0).2.is_empty(), "announced once");

    // Freed and re-allocated at the same base: the old one forgotten, the new one in slot 1
    // (slot 0's messages 0 and 1 are not released yet).
    drop(first);
    let second = context.register_cuda_for_tests(pointer(2)).unwrap();
    let (slot, generation, records) = send(&mut sender, &second, 0);
    assert!(
        matches!(
            records[..],
            [
                AllocationRecord::Forget { slot: 0, generation: 1 },
                AllocationRecord::Announce { slot: 1, generation: 1, .. }
            ]
        ),
        "{records:?}"
    );
    assert_eq!((slot, generation), (1, 1));

    // Again, once everything sent is released: slot 0 is free again, in its next generation.
    drop(second);
    let third = context.register_cuda_for_tests(pointer(3)).unwrap();
    let (slot, generation, records) = send(&mut sender, &third, 3);
    assert!(
        matches!(records[..], [AllocationRecord::Forget { slot: 1, generation: 1 }, AllocationRecord::Announce { .. }]),
        "{records:?}"
    );
    assert_eq!((slot, generation), (1, 2), "a released slot reused in its next generation");

    // An allocation the application let go of (no buffer of it left) is forgotten at the
    // next sweep, once its messages are released.
    drop(third);
    let other = context.register_cuda_for_tests(CudaPointer { base: 0x7100_0000_0000, ..pointer(4) }).unwrap();
    let (_, _, records) = send(&mut sender, &other, 4);
    assert!(
        matches!(records[..], [AllocationRecord::Forget { slot: 1, generation: 2 }, AllocationRecord::Announce { .. }]),
        "{records:?}"
    );
    assert!(format!("{holds:?}").contains("1 held") || format!("{holds:?}").contains("2 held"), "{holds:?}");
    holds.consumer_died();
}

/// Both ends in one process (threads over shared memory): the producer's address is the
/// consumer's, and nothing is opened (a CUDA IPC handle does not open where it was made).
#[test]
fn an_allocation_of_this_very_process_is_used_where_it_lies() {
    let (mut r, counts) = receiver(8);
    let own = Announce { exporter_pid: std::process::id(), ..legacy(5) };
    announce(&mut r, 0, 1, own, 0).unwrap();
    let payload = resolve(&mut r, 0, 0, 1, 16, 32).unwrap().unwrap();
    assert_eq!(payload.cuda_ptr(), Some((own.base + 16, 1)), "device 1: the UUID's ordinal here");
    assert_eq!(counts.opened.load(Ordering::Relaxed), 0);
}

/// A message's ready value counts on the producer's ready semaphore, which the GPU route
/// imported: without one, for memory of another GPU than the semaphore's, or going backwards,
/// a descriptor's value is the producer's error; a new producer starts without one.
#[test]
fn hostile_ready_values_are_corrupt_and_good_ones_reach_the_message() {
    let (mut r, _) = receiver(8);
    announce(&mut r, 0, 1, legacy(2), 0).unwrap();
    let err = resolve_ready(&mut r, 0, 3).err().expect("no semaphore shared");
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("shares no ready semaphore")), "{err}");

    r.share_ready(&Ok(share(DEVICE)));
    let payload = resolve_ready(&mut r, 0, 3).unwrap().unwrap();
    assert_eq!(payload.ready_value, 3);
    drop(payload);
    assert_eq!(resolve_ready(&mut r, 1, 3).unwrap().unwrap().ready_value, 3, "the same value again");
    assert_eq!(resolve_ready(&mut r, 2, 0).unwrap().unwrap().ready_value, 0, "ready now");
    let err = resolve_ready(&mut r, 3, 2).err().expect("backwards");
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("must not go backwards")), "{err}");

    r.share_ready(&Ok(share([1; 16])));
    let err = resolve_ready(&mut r, 4, 5).err().expect("another GPU's semaphore");
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("ready semaphore is of GPU")), "{err}");

    let _ = r.end_session();
    r.new_session(2, Some(Offer::cuda_only().sections().pop().unwrap())).unwrap();
    announce(&mut r, 0, 1, legacy(2), 0).unwrap();
    let err = resolve_ready(&mut r, 0, 1).err().expect("the new producer shares none yet");
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("shares no ready semaphore")), "{err}");
}

/// A stream-ordered send of CUDA memory: refused, naming why and the way out (synchronise and
/// send without a ready value), where the channel shares no ready semaphore or shares one of
/// another GPU; with one of the memory's GPU, the value goes in the descriptor and must grow
/// across the channel's routes (the GPU route's values count on the same semaphore).
#[test]
fn a_ready_value_needs_the_channel_s_semaphore_on_the_memory_s_gpu() {
    use crate::channels::transport::{MemoryKind, Packed, Payload, PayloadMemory, RouteSender};
    use crate::memory::{CudaMemoryKind, CudaPointer};

    let context = crate::memory::Context::new(crate::memory::ContextConfig {
        gpu: crate::memory::GpuPolicy::Disabled,
        ..Default::default()
    })
    .unwrap();
    let holds = Arc::new(PeerHolds::default());
    let mut sender =
        super::Sender::new(vec![super::fake::UUID], true, None, Arc::clone(&holds), Arc::new(super::fake::Exporter));
    let pointer = CudaPointer {
        kind: CudaMemoryKind::Legacy,
        base: 0x7000_0000_0000,
        size: 1 << 20,
        buffer_id: 1,
        device_ordinal: 0,
        context: 0,
    };
    let buffer = context.register_cuda_for_tests(pointer).unwrap();
    let pack = |sender: &mut super::Sender, ready_value: u64| {
        let payload =
            Payload { memory: PayloadMemory::Buffer(&buffer), kind: MemoryKind::Cuda, offset: 0, len: 64, ready_value };
        let mut out = Packed::default();
        sender.pack(&payload, 0, &mut out)?;
        Ok::<_, Error>(Descriptor::decode(&out.descriptor[..out.descriptor_len]).unwrap())
    };
    assert!(sender.route().reason.contains("host-side synchronisation"), "{}", sender.route().reason);
    let fix = "synchronise the work that writes it (cudaStreamSynchronize) and send it without a ready value";
    let err = pack(&mut sender, 5).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("no GPU route") && m.contains(fix)), "{err}");
    sender.share_ready(&Err("the consumer's device cannot import timeline semaphores".into()));
    let err = pack(&mut sender, 5).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("cannot import timeline") && m.contains(fix)), "{err}");
    sender.share_ready(&Ok(share([1; 16])));
    let err = pack(&mut sender, 5).unwrap_err();
    assert!(matches!(&err, Error::Unsupported(m) if m.contains("LF_VULKAN_DEVICE") && m.contains(fix)), "{err}");
    assert_eq!(pack(&mut sender, 0).unwrap().ready_value, 0, "a send without a ready value goes as before");

    let shared = share(super::fake::UUID);
    sender.share_ready(&Ok(shared.clone()));
    assert!(sender.route().reason.contains("stream-ordered"), "{}", sender.route().reason);
    assert_eq!(pack(&mut sender, 5).unwrap().ready_value, 5);
    let err = pack(&mut sender, 4).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("values must grow")), "{err}");
    // The GPU route sent value 9 meanwhile: one timeline.
    shared.last.store(9, std::sync::atomic::Ordering::Relaxed);
    assert!(pack(&mut sender, 6).is_err(), "below the GPU route's last value");
    assert_eq!(pack(&mut sender, 9).unwrap().ready_value, 9);
    assert_eq!(shared.last.load(std::sync::atomic::Ordering::Relaxed), 9);
    assert_eq!(pack(&mut sender, 0).unwrap().ready_value, 0);
    holds.consumer_died();
}
