//! lava-flow's GPU buffers over the route, against stand-ins for the CUDA driver (these run
//! without CUDA): which GPUs' buffers a consumer takes, an arena announced, imported once and
//! reached from the GPU in use, forgotten, the reports, hostile announcements of the new kind,
//! and the producer's half on a real Vulkan device where there is one.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::cuda::{Mapping, Opener};
use super::receiver::Receiver;
use super::wire::{
    AllocationRecord, Announce, Descriptor, Section, ANSWER_ARENAS, MEMORY_ARENA, MEMORY_ARENA_DEDICATED, OFFER_ARENAS,
    OFFER_NO_CUDA_MEMORY,
};
use super::{arena, ID, ROUTE_ID};
use crate::channels::transport::{Attachment, PayloadClass, RouteReceiver, TransportId};
use crate::error::Error;

const GPUS: [[u8; 16]; 3] = [[10; 16], [11; 16], [12; 16]];
const CARRIER: TransportId = TransportId::new("shm");

/// A consumer's CUDA: the device current on its thread, the pairs of devices with a peer
/// path, and what it was asked to open, enable and close.
#[derive(Default)]
struct Peers {
    current: Option<i32>,
    paths: Vec<(i32, i32)>,
    enabled: Mutex<Vec<(i32, i32)>>,
    granted: Arc<Mutex<Vec<i32>>>,
    opened: AtomicUsize,
    closed: Arc<AtomicUsize>,
}

struct Import {
    address: u64,
    device: i32,
    granted: Arc<Mutex<Vec<i32>>>,
    closed: Arc<AtomicUsize>,
}

impl Mapping for Import {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn grant(&self, device: i32) -> crate::Result<()> {
        self.granted.lock().push(device);
        Ok(())
    }
}

impl Drop for Import {
    fn drop(&mut self) {
        self.closed.fetch_add(1, Ordering::Relaxed);
    }
}

impl Opener for Peers {
    fn open(&self, allocation: &Announce, fd: Option<BorrowedFd<'_>>, device: i32) -> crate::Result<Box<dyn Mapping>> {
        assert!(fd.is_some(), "an arena comes with its fd");
        self.opened.fetch_add(1, Ordering::Relaxed);
        let address = 0x5000_0000_0000 + (allocation.buffer_id << 24);
        Ok(Box::new(Import { address, device, granted: Arc::clone(&self.granted), closed: Arc::clone(&self.closed) }))
    }
    fn current_device(&self) -> Option<i32> {
        self.current
    }
    fn peer_path(&self, device: i32, peer: i32) -> bool {
        self.paths.contains(&(device, peer))
    }
    fn enable_peer_access(&self, device: i32, peer: i32) -> crate::Result<bool> {
        self.enabled.lock().push((device, peer));
        Ok(true)
    }
}

/// A consumer seeing the three GPUs, whose thread uses GPU 1, which reaches GPU 0 only.
fn consumer() -> (Receiver, Arc<Peers>) {
    let peers = Arc::new(Peers { current: Some(1), paths: vec![(1, 0)], ..Default::default() });
    let receiver = Receiver::new(Arc::clone(&peers) as Arc<dyn Opener>, Ok(GPUS.to_vec()), 8);
    (receiver, peers)
}

/// The offer of a producer without CUDA, with GPU buffers of `gpu`.
fn offer(gpu: [u8; 16]) -> Attachment {
    let section = Section { flags: OFFER_NO_CUDA_MEMORY | OFFER_ARENAS, devices: vec![gpu], ..Section::default() };
    Attachment::new(ROUTE_ID, section.encode())
}

fn arena(counter: u64, gpu: [u8; 16]) -> Announce {
    Announce {
        memory: MEMORY_ARENA,
        device_ordinal: -1,
        exporter_pid: 42,
        size: 1 << 20,
        base: 0xabcd,
        buffer_id: counter,
        device_uuid: gpu,
        ipc_handle: [0; 64],
        pool: 0,
        pieces: 0,
    }
}

fn some_fd() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

fn announce(r: &mut Receiver, slot: u32, allocation: Announce, fds: Vec<OwnedFd>) -> crate::Result<()> {
    let bytes = AllocationRecord::Announce { slot, generation: 1, allocation }.encode();
    r.attach(Attachment { route: ROUTE_ID, bytes, handles: fds }, 0)
}

#[test]
fn a_consumer_takes_gpu_buffers_of_the_gpus_its_own_reaches_in_place() {
    let (r, _) = consumer();
    let answer = Section::decode(&r.answer().bytes, "consumer").unwrap();
    assert!(answer.flags & ANSWER_ARENAS != 0);
    assert_eq!(answer.arenas, 0b011, "its own GPU 1, and GPU 0 over a peer path; not GPU 2");
    assert_eq!(arena::takes(&answer, &GPUS[0]), Ok(()));
    assert_eq!(arena::takes(&answer, &GPUS[1]), Ok(()));
    let why = arena::takes(&answer, &GPUS[2]).unwrap_err();
    assert!(why.contains("no peer path"), "{why}");
    let why = arena::takes(&answer, &[9; 16]).unwrap_err();
    assert!(why.contains("cannot open memory of the producer's GPU") && why.contains("CUDA_VISIBLE_DEVICES"), "{why}");

    // A process that uses no GPU works in the producer's GPU's context: it takes them all.
    assert_eq!(arena::mask(3, &[], |_, _| false), 0b111);
    // Two GPUs in use: a device counts only where both reach it.
    assert_eq!(arena::mask(3, &[0, 1], |a, b| (a, b) == (1, 0) || (a, b) == (0, 2)), 0b001);
}

#[test]
fn an_arena_is_imported_once_reached_from_the_gpu_in_use_and_closed_when_forgotten() {
    let (mut r, peers) = consumer();
    r.new_session(1, Some(offer(GPUS[0]))).unwrap();
    let route = r.route(CARRIER);
    assert_eq!((route.class, route.kind), (PayloadClass::Gpu, ID), "{}", route.reason);
    assert!(
        route.reason.contains("by reference on GPU 0 (") && route.reason.contains("peer access from GPU 1"),
        "{}",
        route.reason
    );
    assert!(r.second_route(CARRIER).is_none(), "a producer without CUDA has no CUDA memory to report");

    announce(&mut r, 0, arena(7, GPUS[0]), vec![some_fd()]).unwrap();
    let descriptor = Descriptor { slot: 0, generation: 1, offset: 4096, len: 256, ready_value: 0 }.encode();
    let payload = r.resolve(0, &descriptor).unwrap().expect("announced");
    assert_eq!(payload.cuda_ptr(), Some((0x5000_0000_0000 + (7 << 24) + 4096, 0)), "on the producer's GPU 0");
    assert!(payload.as_ptr().is_null() && payload.to_buffer().is_none(), "CUDA memory only");
    drop(payload);
    drop(r.resolve(1, &descriptor).unwrap().unwrap());
    assert_eq!(peers.opened.load(Ordering::Relaxed), 1, "imported once");
    // GPU 1's context reaches GPU 0's memory, and GPU 0's (where copies out of it go fastest)
    // GPU 1's.
    assert_eq!(*peers.enabled.lock(), [(1, 0), (0, 1)], "peer access both ways");
    assert_eq!(*peers.granted.lock(), [1], "and GPU 1 was let into the import's mapping");

    let forget = AllocationRecord::Forget { slot: 0, generation: 1 }.encode();
    r.attach(Attachment::new(ROUTE_ID, forget), 2).unwrap();
    assert_eq!(peers.closed.load(Ordering::Relaxed), 1, "closed once every message into it was released");
    assert!(r.resolve(2, &descriptor).unwrap().is_none(), "a forgotten slot names nothing");
}

#[test]
fn gpu_buffers_of_a_gpu_without_a_peer_path_are_reported_staged() {
    let (mut r, _) = consumer();
    r.new_session(1, Some(offer(GPUS[2]))).unwrap();
    let route = r.route(CARRIER);
    assert_eq!((route.class, route.kind), (PayloadClass::Gpu, CARRIER), "{}", route.reason);
    assert!(route.reason.contains("staged") && route.reason.contains("no peer path from GPU 1"), "{}", route.reason);

    // A producer with CUDA as well: its CUDA memory's line first, the GPU buffers' second.
    let with_cuda = Section { flags: OFFER_ARENAS, devices: vec![GPUS[0]], ..Section::default() };
    r.new_session(2, Some(Attachment::new(ROUTE_ID, with_cuda.encode()))).unwrap();
    assert_eq!(r.route(CARRIER).class, PayloadClass::Cuda);
    assert_eq!(r.second_route(CARRIER).map(|l| (l.class, l.kind)), Some((PayloadClass::Gpu, ID)));
}

#[test]
fn hostile_announcements_of_arenas_are_corrupt() {
    let (mut r, _) = consumer();
    r.new_session(1, Some(offer(GPUS[0]))).unwrap();
    let corrupt = |e: crate::Result<()>| matches!(e, Err(Error::Corrupt(_)));
    // Of a GPU whose buffers this consumer said it does not take.
    assert!(corrupt(announce(&mut r, 0, arena(1, GPUS[2]), vec![some_fd()])));
    // Without its fd, with two, with a CUDA handle or ordinal, empty.
    assert!(corrupt(announce(&mut r, 0, arena(1, GPUS[0]), Vec::new())));
    assert!(corrupt(announce(&mut r, 0, arena(1, GPUS[0]), vec![some_fd(), some_fd()])));
    assert!(corrupt(announce(&mut r, 0, Announce { ipc_handle: [3; 64], ..arena(1, GPUS[0]) }, vec![some_fd()])));
    assert!(corrupt(announce(&mut r, 0, Announce { device_ordinal: 0, ..arena(1, GPUS[0]) }, vec![some_fd()])));
    assert!(corrupt(announce(&mut r, 0, Announce { size: 0, ..arena(1, GPUS[0]) }, vec![some_fd()])));
    // Bytes past the arena.
    let dedicated = Announce { memory: MEMORY_ARENA_DEDICATED, ..arena(1, GPUS[0]) };
    announce(&mut r, 0, dedicated, vec![some_fd()]).unwrap();
    let past = Descriptor { slot: 0, generation: 1, offset: (1 << 20) - 8, len: 16, ready_value: 0 }.encode();
    assert!(matches!(r.resolve(0, &past), Err(Error::Corrupt(_))));
    // An offer of GPU buffers must name the one device they are on.
    let two = Section { flags: OFFER_ARENAS, devices: GPUS[..2].to_vec(), ..Section::default() };
    assert!(matches!(r.new_session(2, Some(Attachment::new(ROUTE_ID, two.encode()))), Err(Error::Corrupt(_))));
}

/// The producer's half on this machine's Vulkan device (lavapipe in CI): a GPU buffer's
/// arena announced once with its fd, a message at the buffer's offset in it, refused with a
/// ready value.
#[cfg(feature = "vulkan")]
#[test]
fn the_sender_announces_a_gpu_buffer_s_arena_once() {
    use crate::channels::routes::SenderTable;
    use crate::channels::transport::{MemoryKind, Packed, Payload, PayloadMemory, PeerHolds, RouteSender};
    use crate::memory::{Context, ContextConfig, MemoryLocation};

    let context = Context::new(ContextConfig::default()).unwrap();
    let Some(device) = super::arena::ArenaDevice::of(&context) else {
        println!("skipped: no Vulkan device exporting opaque fds");
        return;
    };
    let uuid = device.uuid;
    let holds = Arc::new(PeerHolds::default());
    // Where vulkan_ipc takes GPU buffers (the same GPU), this route keeps to CUDA memory, or
    // goes where the producer has none.
    let both = super::Sender::new(vec![uuid], true, Some(device.clone()), Arc::clone(&holds), super::exporter());
    assert_eq!(both.second_route().map(|l| l.class), Some(PayloadClass::Gpu));
    let cuda_only = both.without_gpu_buffers().expect("it sends CUDA memory");
    assert!(cuda_only.serves(MemoryKind::Cuda) && !cuda_only.serves(MemoryKind::Vulkan));
    assert!(cuda_only.second_route().is_none());
    let arenas_only =
        super::Sender::new(vec![uuid], false, Some(device.clone()), Arc::clone(&holds), super::exporter());
    assert!(arenas_only.without_gpu_buffers().is_none());

    let sender = super::Sender::new(vec![uuid], false, Some(device), Arc::clone(&holds), super::exporter());
    assert!(sender.serves(MemoryKind::Vulkan) && !sender.serves(MemoryKind::Cuda));
    assert_eq!(sender.route().class, PayloadClass::Gpu, "{}", sender.route().reason);
    let mut table = SenderTable::new(vec![sender]);
    let buffer = context.allocate(1 << 16, MemoryLocation::GpuDeviceLocal).unwrap();
    let (gpu, start) = buffer.gpu_region().unwrap();
    let (arena_id, in_arena) = (gpu.arena_id(), gpu.offset() + start);
    let mut pack = |buffer: &crate::memory::Buffer, ready_value: u64, completed: u64, seq: u64| {
        let payload = Payload {
            memory: PayloadMemory::Buffer(buffer),
            kind: MemoryKind::Vulkan,
            offset: 512,
            len: 1024,
            ready_value,
        };
        let route = table.for_kind(MemoryKind::Vulkan).expect("the route serves GPU buffers");
        let mut out = Packed::default();
        route.pack(&payload, completed, &mut out)?;
        route.sent(seq);
        Ok::<_, Error>(out)
    };
    let out = pack(&buffer, 0, 0, 0).unwrap();
    let d = Descriptor::decode(&out.descriptor[..out.descriptor_len]).unwrap();
    assert_eq!((d.offset, d.len), (in_arena + 512, 1024));
    let [attachment] = &out.attachments[..] else { panic!("one announcement: {}", out.attachments.len()) };
    assert_eq!(attachment.handles.len(), 1, "the arena's fd");
    match AllocationRecord::decode(&attachment.bytes, 1).unwrap() {
        AllocationRecord::Announce { allocation: a, .. } => {
            assert!(a.memory == MEMORY_ARENA || a.memory == MEMORY_ARENA_DEDICATED);
            assert_eq!(
                (a.base, a.buffer_id, a.device_uuid, a.device_ordinal),
                (arena_id.token, arena_id.counter, uuid, -1)
            );
            assert!(a.size >= in_arena + (1 << 16), "the whole arena: {}", a.size);
        }
        other => panic!("{other:?}"),
    }
    assert!(pack(&buffer, 0, 0, 1).unwrap().attachments.is_empty(), "announced once");
    assert!(matches!(pack(&buffer, 5, 0, 2), Err(Error::Unsupported(m)) if m.contains("without a ready value")));

    holds.consumer_died();
}

/// What the producer makes of the consumer's answer, per class of payload: GPU buffers by this
/// route where the consumer takes those of the producer's GPU, else staged saying why; CUDA
/// memory refused at send only where the producer has some.
#[cfg(feature = "vulkan")]
#[test]
fn the_producer_takes_the_answer_per_class_of_payload() {
    use crate::channels::transport::{MemoryKind, PeerHolds, RouteSender};
    use crate::memory::{Context, ContextConfig};

    let context = Context::new(ContextConfig::default()).unwrap();
    let Some(device) = super::arena::ArenaDevice::of(&context) else {
        println!("skipped: no Vulkan device exporting opaque fds");
        return;
    };
    let uuid = device.uuid;
    let answer = |arenas: u32| {
        let section = Section {
            flags: super::wire::ANSWER_CUDA | ANSWER_ARENAS,
            devices: vec![GPUS[1], uuid],
            arenas,
            declined: String::new(),
        };
        Some(Attachment::new(ROUTE_ID, section.encode()))
    };
    let holds = || Arc::new(PeerHolds::default());
    let no_cuda = Some("the producer had not loaded the CUDA driver");

    // A producer without CUDA, a consumer that takes its GPU's buffers: GPU buffers only.
    let accepted = super::Offer::for_tests(no_cuda, Some(device.clone())).accept(answer(0b10), holds()).unwrap();
    let sender = accepted.sender.expect("a route for GPU buffers");
    assert!(sender.serves(MemoryKind::Vulkan) && !sender.serves(MemoryKind::Cuda));
    assert_eq!(sender.route().class, PayloadClass::Gpu);
    assert!(accepted.refused.is_empty(), "{:?}", accepted.refused);

    // No peer path from the consumer's GPU: GPU buffers staged, saying why; no CUDA line.
    let accepted = super::Offer::for_tests(no_cuda, Some(device.clone())).accept(answer(0b01), holds()).unwrap();
    assert!(accepted.sender.is_none());
    assert!(
        matches!(&accepted.refused[..], [(PayloadClass::Gpu, why)] if why.contains("no peer path")),
        "{:?}",
        accepted.refused
    );

    // A consumer without CUDA: GPU buffers staged; CUDA memory refused only where there is some.
    let declined = || {
        let section = Section { declined: "no CUDA here".into(), ..Section::default() };
        Some(Attachment::new(ROUTE_ID, section.encode()))
    };
    let accepted = super::Offer::for_tests(no_cuda, Some(device.clone())).accept(declined(), holds()).unwrap();
    assert!(accepted.sender.is_none());
    assert!(
        matches!(&accepted.refused[..], [(PayloadClass::Gpu, why)] if why.contains("no CUDA here")),
        "{:?}",
        accepted.refused
    );
    let accepted = super::Offer::for_tests(None, Some(device)).accept(declined(), holds()).unwrap();
    let classes: Vec<PayloadClass> = accepted.refused.iter().map(|(class, _)| *class).collect();
    assert_eq!(classes, [PayloadClass::Cuda, PayloadClass::Gpu]);

    // A producer without CUDA offers GPU buffers of one device, and says it sends no CUDA memory.
    let mut offer = super::Offer::for_tests(no_cuda, super::arena::ArenaDevice::of(&context));
    let section = Section::decode(&offer.sections().pop().unwrap().bytes, "producer").unwrap();
    assert_eq!(section.flags, OFFER_NO_CUDA_MEMORY | OFFER_ARENAS);
    assert_eq!(section.devices, [uuid]);
}
