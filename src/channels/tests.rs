//! The channel core's own tests, over the loopback carrier (no processes): the route table
//! (several routes of one payload class, chosen per message by the memory's kind), routed
//! messages the core must refuse, and the producer's completion bookkeeping.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::transport::{
    Attachment, MemoryKind, Packed, Payload, PayloadClass, PayloadMemory, ProducerTransport, Route, RouteReceiver,
    RouteSender, RoutedMemory, RoutedPayload, TransportId,
};
use super::transports::{AnyRouteReceiver, AnyRouteSender};
use super::*;
use crate::memory::{Buffer, ContextConfig, GpuPolicy, MemoryLocation};

#[test]
fn names_are_checked() {
    assert!(validate_channel_name("cam-0.frames_x").is_ok());
    for bad in ["", ".hidden", "a/b", "with space", &"x".repeat(65)] {
        assert!(validate_channel_name(bad).is_err(), "{bad:?}");
    }
}

fn here() -> ProcessLocation {
    ProcessLocation::new("host-a", None, None).unwrap()
}

fn context(gpu: bool) -> Context {
    let gpu = if gpu { GpuPolicy::default() } else { GpuPolicy::Disabled };
    Context::new(ContextConfig { gpu, ..Default::default() }).unwrap()
}

/// Both ends of loopback channel `name` in this thread (met from two).
fn pair(name: &str, context: &Context, routes: Vec<TransportKind>) -> (Producer, Consumer) {
    let config = ChannelConfig {
        transports: Some([vec![TransportKind::Loopback], routes].concat()),
        capacity: 16,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    std::thread::scope(|s| {
        let consumer = s.spawn(|| Consumer::create(context, name, &here(), &here(), &config).unwrap());
        let producer = Producer::create(context, name, &here(), &here(), &config).unwrap();
        (producer, consumer.join().unwrap())
    })
}

/// Memory "another allocator" made: the foreign memory a test route carries.
struct Foreign(Vec<u8>);

/// A route of the core's tests: payloads of one memory kind, which both ends of a loopback
/// channel reach by address. Its descriptor is (address, length).
struct TestSender {
    id: u32,
    kind: MemoryKind,
    route: Route,
    /// What the messages sent point into, kept alive for the channel's life.
    kept: Vec<Arc<Foreign>>,
}

impl TestSender {
    fn boxed(id: u32, kind: MemoryKind) -> AnyRouteSender {
        let route =
            Route { class: PayloadClass::Gpu, kind: TransportId::new("test"), reason: format!("{kind}: route {id}") };
        AnyRouteSender::Other(Box::new(TestSender { id, kind, route, kept: Vec::new() }))
    }
}

impl RouteSender for TestSender {
    fn route_id(&self) -> u32 {
        self.id
    }
    fn route(&self) -> &Route {
        &self.route
    }
    fn serves(&self, kind: MemoryKind) -> bool {
        kind == self.kind
    }
    fn pack(&mut self, payload: &Payload<'_>, _completed: u64, out: &mut Packed) -> crate::Result<()> {
        let PayloadMemory::Foreign(memory) = payload.memory else {
            return Err(Error::Unsupported("the test route carries foreign memory".into()));
        };
        let memory = memory.downcast_ref::<Arc<Foreign>>().expect("the tests' foreign memory");
        let address = memory.0.as_ptr() as u64 + payload.offset as u64;
        self.kept.push(Arc::clone(memory));
        out.descriptor[..8].copy_from_slice(&address.to_le_bytes());
        out.descriptor[8..16].copy_from_slice(&(payload.len as u64).to_le_bytes());
        out.descriptor_len = 16;
        Ok(())
    }
    fn released_semaphore(&self) -> crate::Result<OwnedFd> {
        Err(Error::Unsupported("no semaphore".into()))
    }
    fn sent(&mut self, _seq: u64) {}
    fn ready_semaphore(&self) -> crate::Result<OwnedFd> {
        Err(Error::Unsupported("no semaphore".into()))
    }
}

/// The test route's memory at the consumer: the producer's bytes, by address.
struct TestMemory {
    base: *mut u8,
    released: Arc<AtomicU64>,
}

// SAFETY: the tests' foreign memory is only read, and outlives the channel.
unsafe impl Send for TestMemory {}
// SAFETY: as above.
unsafe impl Sync for TestMemory {}

impl RoutedMemory for TestMemory {
    fn host_base(&self) -> *mut u8 {
        self.base
    }
    fn view(&self, _offset: u64, _len: usize, _ready_value: u64) -> Option<Buffer> {
        None
    }
    fn released(&self, _seq: u64) {
        self.released.fetch_add(1, Ordering::Relaxed);
    }
}

struct TestReceiver {
    id: u32,
    /// Each message's memory, kept while the route lives (boxed: payloads point at it, and
    /// the vector moves as it grows).
    #[allow(clippy::vec_box)]
    memories: Vec<Box<TestMemory>>,
    resolved: Arc<AtomicU64>,
    released: Arc<AtomicU64>,
}

impl TestReceiver {
    /// The route, and its counts of messages resolved and released.
    fn boxed(id: u32) -> (AnyRouteReceiver, Arc<AtomicU64>, Arc<AtomicU64>) {
        let (resolved, released) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let receiver =
            TestReceiver { id, memories: Vec::new(), resolved: Arc::clone(&resolved), released: Arc::clone(&released) };
        (AnyRouteReceiver::Other(Box::new(receiver)), resolved, released)
    }
}

impl RouteReceiver for TestReceiver {
    fn route_id(&self) -> u32 {
        self.id
    }
    fn new_session(&mut self, _session: u64, _offer: Option<Attachment>) -> crate::Result<()> {
        Ok(())
    }
    fn route(&self, _carrier: TransportId) -> Route {
        Route { class: PayloadClass::Gpu, kind: TransportId::new("test"), reason: format!("route {}", self.id) }
    }
    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>) {
        (0, Box::new(()))
    }
    fn attach(&mut self, _attachment: Attachment, _released_below: u64) -> crate::Result<()> {
        Ok(())
    }
    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> crate::Result<Option<RoutedPayload>> {
        let address = u64::from_le_bytes(descriptor[..8].try_into().unwrap());
        let len = u64::from_le_bytes(descriptor[8..16].try_into().unwrap()) as usize;
        self.resolved.fetch_add(1, Ordering::Relaxed);
        self.memories.push(Box::new(TestMemory { base: address as *mut u8, released: Arc::clone(&self.released) }));
        let memory: &(dyn RoutedMemory + 'static) = &**self.memories.last().unwrap();
        // SAFETY: the memory is boxed and kept for the route's life, longer than any message.
        Ok(Some(unsafe { RoutedPayload::new(memory, 0, len, 0, seq) }))
    }
    fn ready_semaphore(&self) -> crate::Result<OwnedFd> {
        Err(Error::Unsupported("no semaphore".into()))
    }
}

/// Sends `len` bytes at `offset` of foreign memory of `kind`.
fn send_foreign(p: &mut Producer, memory: &Arc<Foreign>, kind: MemoryKind, offset: usize, len: usize) -> u64 {
    let payload = Payload { memory: PayloadMemory::Foreign(memory), kind, offset, len, ready_value: 0 };
    p.send_payload(&payload, None).unwrap()
}

/// Two routes of one payload class side by side: each message takes the one its memory's
/// kind calls for, in the one order of every message, with CPU messages between.
#[test]
fn each_message_takes_the_route_its_memory_kind_calls_for() {
    let context = context(false);
    let (mut p, mut c) = pair("two-routes", &context, Vec::new());
    p.add_route(TestSender::boxed(200, MemoryKind::Cuda));
    p.add_route(TestSender::boxed(201, MemoryKind::Vulkan));
    let (cuda, cuda_resolved, cuda_released) = TestReceiver::boxed(200);
    let (vulkan, vulkan_resolved, _) = TestReceiver::boxed(201);
    c.add_route(cuda);
    c.add_route(vulkan);
    let memory = Arc::new(Foreign((0..=255).collect()));
    assert_eq!(send_foreign(&mut p, &memory, MemoryKind::Cuda, 10, 5), 0);
    assert_eq!(p.send(b"cpu").unwrap(), 1);
    assert_eq!(send_foreign(&mut p, &memory, MemoryKind::Vulkan, 100, 3), 2);
    assert_eq!(send_foreign(&mut p, &memory, MemoryKind::Cuda, 200, 4), 3);
    let expected: [(&[u8], u64, u64); 4] =
        [(&[10, 11, 12, 13, 14], 1, 0), (b"cpu", 1, 0), (&[100, 101, 102], 1, 1), (&[200, 201, 202, 203], 2, 1)];
    for (seq, (bytes, cuda_count, vulkan_count)) in expected.into_iter().enumerate() {
        let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((m.sequence(), &*m), (seq as u64, bytes));
        assert_eq!(
            (cuda_resolved.load(Ordering::Relaxed), vulkan_resolved.load(Ordering::Relaxed)),
            (cuda_count, vulkan_count),
            "message {seq} took the route of its memory's kind"
        );
        // Foreign memory has no lava-flow buffer over it.
        assert!(m.buffer().is_none());
    }
    assert_eq!(cuda_released.load(Ordering::Relaxed), 2, "each payload told its route of the release");
    p.wait_completed(3, Some(Duration::from_secs(10))).unwrap();
}

/// A kind no route serves is staged through the carrier where the bytes are a lava-flow
/// buffer's, and refused, saying why, where they are foreign memory.
#[test]
fn a_kind_without_a_route_is_staged_or_refused() {
    let context = context(false);
    let (mut p, mut c) = pair("no-route", &context, Vec::new());
    p.add_route(TestSender::boxed(200, MemoryKind::Cuda));
    let memory = Arc::new(Foreign(vec![7; 64]));
    let payload = Payload {
        memory: PayloadMemory::Foreign(&memory),
        kind: MemoryKind::Vulkan,
        offset: 0,
        len: 8,
        ready_value: 0,
    };
    let refused = p.send_payload(&payload, None).unwrap_err();
    assert!(
        matches!(&refused, Error::Unsupported(m) if m.contains("no route for lava-flow's Vulkan memory")),
        "{refused}"
    );
    let buffer = context.allocate(4096, MemoryLocation::CpuStandard).unwrap();
    buffer.write_at(0, &[5; 40]).unwrap();
    let payload = Payload {
        memory: PayloadMemory::Buffer(&buffer),
        kind: MemoryKind::Vulkan,
        offset: 0,
        len: 40,
        ready_value: 0,
    };
    assert_eq!(p.send_payload(&payload, None).unwrap(), 0);
    let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(*m == [5; 40] && !m.is_zero_copy(), "staged: copied into the channel");
}

/// The GPU route of lava-flow's Vulkan memory and a route of another kind on one channel:
/// a Vulkan buffer goes by reference through vulkan_ipc, foreign memory through its own route.
#[cfg(feature = "vulkan")]
#[test]
fn vulkan_ipc_and_another_gpu_route_share_a_channel() {
    let context = context(true);
    if let Some(why) = context.gpu_unavailable_reason() {
        assert!(std::env::var("LF_REQUIRE_VULKAN").is_err(), "LF_REQUIRE_VULKAN is set but: {why}");
        eprintln!("skipped: no Vulkan device ({why})");
        return;
    }
    let (mut p, mut c) = pair("vulkan-and-cuda", &context, vec![TransportKind::VulkanIpc]);
    p.add_route(TestSender::boxed(200, MemoryKind::Cuda));
    let (cuda, cuda_resolved, _) = TestReceiver::boxed(200);
    c.add_route(cuda);
    let gpu = context.allocate(1 << 16, MemoryLocation::GpuDeviceLocal).unwrap();
    gpu.write_at(0, &[9; 1 << 16]).unwrap();
    let memory = Arc::new(Foreign(vec![3; 32]));
    assert_eq!(p.send_buffer(&gpu, 0, 1 << 16).unwrap(), 0);
    assert_eq!(send_foreign(&mut p, &memory, MemoryKind::Cuda, 0, 32), 1);
    let first = c.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut bytes = vec![0; 1 << 16];
    first.buffer().expect("vulkan_ipc's message carries a buffer").read_at(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 9) && cuda_resolved.load(Ordering::Relaxed) == 0);
    let second = c.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(*second == [3; 32] && cuda_resolved.load(Ordering::Relaxed) == 1);
    assert!(c.transport().routes.iter().any(|r| r.kind == TransportKind::VulkanIpc), "{}", c.transport().reason);
}

/// A routed message naming a route the channel does not have, or with a descriptor longer than
/// any route's, is `Corrupt`, saying which.
#[test]
fn routed_messages_of_no_route_are_corrupt() {
    let context = context(false);
    let (mut p, mut c) = pair("no-such-route", &context, Vec::new());
    p.carrier().send_routed(77, b"descriptor", &mut Vec::new(), None).unwrap();
    p.carrier().send_routed(78, &[0; Packed::MAX_DESCRIPTOR + 1], &mut Vec::new(), None).unwrap();
    let first = c.recv_timeout(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(&first, Error::Corrupt(m) if m.contains("names route 77")), "{first}");
    let second = c.recv_timeout(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(&second, Error::Corrupt(m) if m.contains("65-byte route descriptor")), "{second}");
    // Both were released: the producer sees them complete.
    p.wait_completed(1, Some(Duration::from_secs(10))).unwrap();
}

/// A short buffer send is copied into its message, complete for the producer at once; a
/// sequence number never sent is refused, u64::MAX too.
#[test]
fn short_buffer_sends_complete_at_once_and_unsent_ones_are_refused() {
    let context = context(false);
    let (mut p, mut c) = pair("completion", &context, Vec::new());
    let buffer = context.allocate(4096, MemoryLocation::CpuStandard).unwrap();
    let seq = p.send_buffer(&buffer, 0, 16).unwrap();
    p.wait_completed(seq, Some(Duration::ZERO)).unwrap();
    for never in [seq + 1, u64::MAX - 1, u64::MAX] {
        let refused = p.wait_completed(never, Some(Duration::ZERO));
        assert!(matches!(refused, Err(Error::InvalidArgument(_))), "message {never}: {refused:?}");
    }
    let long = p.send_buffer(&buffer, 0, 1024).unwrap();
    let held = c.recv_timeout(Duration::from_secs(10)).unwrap();
    let by_reference = c.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(by_reference.is_zero_copy() && !held.is_zero_copy());
    assert!(matches!(p.wait_completed(long, Some(Duration::from_millis(20))), Err(Error::Timeout(_))));
    drop((held, by_reference));
    p.wait_completed(long, Some(Duration::from_secs(10))).unwrap();
}

/// A consumer holds the sessions of several producers at once: messages of a producer that
/// has gone stay readable, and releasable by value, while the next producer's arrive.
#[test]
fn a_consumer_holds_sessions_of_several_producers() {
    let context = context(false);
    let config = ChannelConfig {
        transports: Some(vec![TransportKind::Loopback]),
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let open = || Producer::create(&context, "sessions", &here(), &here(), &config).unwrap();
    let (mut first, mut c) = std::thread::scope(|s| {
        let consumer = s.spawn(|| Consumer::create(&context, "sessions", &here(), &here(), &config).unwrap());
        (open(), consumer.join().unwrap())
    });
    first.send(b"first, held").unwrap();
    first.send(b"first, by value").unwrap();
    drop(first);
    let held = c.recv_timeout(Duration::from_secs(10)).unwrap();
    let by_value = c.recv_raw_within(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(c.try_recv(), Err(Error::PeerGone(_))), "the first producer's end is reported");
    std::thread::scope(|s| {
        // A new producer waits until the consumer takes it up, at its next receive.
        let second = s.spawn(|| {
            let mut second = open();
            second.send(b"second").unwrap();
            second.wait_completed(0, Some(Duration::from_secs(10))).unwrap();
        });
        let next = loop {
            match c.recv_raw_within(Some(Duration::from_secs(10))) {
                Err(Error::PeerGone(_)) => std::thread::sleep(Duration::from_millis(1)),
                other => break other.unwrap(),
            }
        };
        // SAFETY: the view's bytes lie in the channel until it is released, below.
        let bytes = unsafe { std::slice::from_raw_parts(next.ptr, next.len) };
        assert_eq!((next.token, bytes), (0, &b"second"[..]), "the second producer's messages start at 0");
        assert_ne!(next.session, by_value.session, "each producer's messages are a session of their own");
        // The first session's messages outlive its producer and the switch.
        assert_eq!(&*held, b"first, held");
        // SAFETY: the view was received from `c` above and nothing reads it any more.
        unsafe { c.release_raw(&by_value).unwrap() };
        // SAFETY: as above; a second release of it is refused.
        assert!(matches!(unsafe { c.release_raw(&by_value) }, Err(Error::InvalidState(_))));
        // SAFETY: received above, not used after.
        unsafe { c.release_raw(&next).unwrap() };
        second.join().unwrap();
    });
    drop(held);
}

/// A fan-in over loopback: producers threads of this process, each in a slot of its own, each
/// producer's messages in its order; a full fan-in and a producer of another kind refused in
/// the words every carrier uses; a producer's end reported for its slot, which a new producer
/// then takes.
#[test]
fn a_loopback_fan_in_serves_several_producers_and_refuses_what_does_not_fit() {
    const MESSAGES: u64 = 2_000;
    let context = context(false);
    let config = ChannelConfig {
        transports: Some(vec![TransportKind::Loopback]),
        kind: ChannelKind::FanIn,
        max_peers: 3,
        capacity: 16,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let open = |config: &ChannelConfig| Producer::create(&context, "fan-in", &here(), &here(), config);
    std::thread::scope(|s| {
        let consumer = s.spawn(|| Consumer::create(&context, "fan-in", &here(), &here(), &config).unwrap());
        let mut producers: Vec<Producer> = (0..3).map(|_| open(&config).unwrap()).collect();
        let mut c = consumer.join().unwrap();
        let full = open(&config).unwrap_err();
        assert!(
            matches!(full, Error::InvalidState(ref m) if m.contains("is full") && m.contains("max_peers = 3")),
            "{full}"
        );
        let pair = open(&ChannelConfig { kind: ChannelKind::Pair, ..config.clone() }).unwrap_err();
        assert!(matches!(pair, Error::InvalidState(ref m) if m.contains("is a fan-in channel")), "{pair}");
        let senders: Vec<_> = producers
            .drain(..)
            .map(|mut p| {
                s.spawn(move || {
                    for seq in 0..MESSAGES {
                        p.send(&seq.to_le_bytes()).unwrap();
                    }
                })
            })
            .collect();
        let mut next = [0u64; 3];
        let mut gone = Vec::new();
        while gone.len() < 3 {
            match c.recv_timeout(Duration::from_secs(30)) {
                Ok(m) => {
                    let slot = m.producer() as usize;
                    assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), next[slot], "slot {slot}'s order");
                    next[slot] += 1;
                }
                Err(Error::PeerGone(why)) => {
                    let slot = c.last_gone().unwrap();
                    assert!(why.contains(&format!("slot {slot}")), "{why}");
                    assert_eq!(next[slot as usize], MESSAGES, "slot {slot}'s end comes after its last message");
                    gone.push(slot);
                }
                Err(e) => panic!("{e}"),
            }
        }
        gone.sort_unstable();
        assert_eq!(gone, [0, 1, 2], "each producer in a slot of its own");
        for sender in senders {
            sender.join().unwrap();
        }
        // A slot freed is taken again.
        let mut late = open(&config).unwrap();
        late.send(b"late").unwrap();
        let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!((&m[..], m.sequence()), (&b"late"[..], 0));
    });
}

/// A fan-out over loopback: consumers threads of this process, each in a slot of its own, each
/// getting every message in order; a consumer past max_peers, a consumer of another kind and a
/// second producer refused in the words every carrier uses; a consumer that closes dropped at
/// the producer's next send, which goes on to the others and frees the slot.
#[test]
fn a_loopback_fan_out_serves_several_consumers_and_refuses_what_does_not_fit() {
    const MESSAGES: u64 = 2_000;
    let context = context(false);
    let config = ChannelConfig {
        transports: Some(vec![TransportKind::Loopback]),
        kind: ChannelKind::FanOut,
        max_peers: 3,
        capacity: 16,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let join = |config: &ChannelConfig| Consumer::create(&context, "fan-out", &here(), &here(), config);
    let alive = |p: &Producer| p.peers().iter().filter(|peer| peer.state == PeerState::Alive).count();
    std::thread::scope(|s| {
        let consumers: Vec<_> = (0..3)
            .map(|index| {
                let (join, config) = (&join, &config);
                s.spawn(move || {
                    let mut c = join(config).unwrap();
                    for seq in 0..MESSAGES {
                        let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                        assert_eq!(u64::from_le_bytes(m[..8].try_into().unwrap()), seq, "consumer {index}'s order");
                    }
                    if index == 0 {
                        return;
                    }
                    let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                    assert_eq!((&m[..], m.sequence()), (&b"after"[..], MESSAGES));
                    drop(m);
                    let end = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
                    assert!(matches!(end, Error::PeerGone(_)), "{end}");
                })
            })
            .collect();
        let mut p = Producer::create(&context, "fan-out", &here(), &here(), &config).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while alive(&p) < 3 {
            assert!(std::time::Instant::now() < deadline, "3 consumers joined: {:?}", p.peers());
            std::thread::sleep(Duration::from_millis(1));
        }
        let full = join(&config).unwrap_err();
        assert!(
            matches!(full, Error::InvalidState(ref m) if m.contains("is full") && m.contains("max_peers = 3")),
            "{full}"
        );
        let pair = join(&ChannelConfig { kind: ChannelKind::Pair, ..config.clone() }).unwrap_err();
        assert!(matches!(pair, Error::InvalidState(ref m) if m.contains("created a fan-out one")), "{pair}");
        let second = Producer::create(&context, "fan-out", &here(), &here(), &config).unwrap_err();
        assert!(matches!(second, Error::InvalidState(ref m) if m.contains("a fan-out has one producer")), "{second}");
        for seq in 0..MESSAGES {
            p.send(&seq.to_le_bytes()).unwrap();
        }
        let mut consumers = consumers.into_iter();
        consumers.next().unwrap().join().unwrap();
        // The closed consumer is dropped at this send; the others get it.
        p.send(b"after").unwrap();
        let peers = p.peers();
        assert_eq!(alive(&p), 2, "{peers:?}");
        assert_eq!(peers.iter().filter(|peer| peer.state == PeerState::Free).count(), 1, "{peers:?}");
        drop(p);
        for consumer in consumers {
            consumer.join().unwrap();
        }
    });
}

/// CUDA memory of the application's (here described by hand, at an address that is no memory
/// at all, so that any host read of it would crash the test) is refused by every send, small
/// or not, and by the host paths, each with a status naming what works; the registration is
/// still found by address.
#[test]
fn cuda_memory_is_refused_without_touching_its_bytes() {
    use crate::memory::{BufferOrigin, CudaMemoryKind, CudaPointer};
    let context = context(false);
    // The first page is never mapped: reading it would fault.
    let pointer = CudaPointer {
        kind: CudaMemoryKind::Legacy,
        base: 0x100,
        size: 0x400,
        buffer_id: 9,
        device_ordinal: 0,
        context: 0,
    };
    let cuda = context.register_cuda_for_tests(pointer).unwrap();
    assert_eq!(cuda.location(), MemoryLocation::CudaDevice { ordinal: 0 });
    assert_eq!(cuda.origin(), BufferOrigin::Cuda { kind: CudaMemoryKind::Legacy });
    assert_eq!(cuda.cuda(), Some(pointer));
    assert!(cuda.as_ptr().is_null());
    let found = context.find(0x180 as *const u8).unwrap();
    assert_eq!((found.info.id, found.offset), (cuda.id(), 0x80));

    let (mut producer, _consumer) = pair("cuda-refused", &context, vec![]);
    for (offset, len) in [(0, 8), (0x10, 0x3f0), (0, 0x400)] {
        let err = producer.try_send_buffer(&cuda, offset, len).unwrap_err();
        assert!(matches!(err, crate::Error::Unsupported(_)), "{err}");
        // Without CUDA in this process, the channel has no CUDA route and says why; with it
        // (another test loaded the driver), the driver refuses an address that is no memory.
        let text = err.to_string();
        assert!(
            text.contains("and copies none: the producer had not loaded the CUDA driver")
                || text.contains("cuIpcGetMemHandle"),
            "{err}"
        );
    }
    // Kinds no other process can open are refused before any route, naming the way out (for
    // memory of a pool without IPC: a pool with POSIX fd handle types).
    for (kind, words) in [
        (CudaMemoryKind::Managed, "cudaMallocManaged"),
        (CudaMemoryKind::Other, "create the pool with POSIX fd handle types"),
        (CudaMemoryKind::Other, "expandable_segments:True"),
    ] {
        let other =
            context.register_cuda_for_tests(CudaPointer { kind, base: 0x1000, buffer_id: 10, ..pointer }).unwrap();
        let err = producer.try_send_buffer(&other, 0, 8).unwrap_err();
        assert!(matches!(&err, crate::Error::Unsupported(m) if m.contains(words) && m.contains("lf_alloc")), "{err}");
    }
    let err = cuda.read_at(0, &mut [0u8; 8]).unwrap_err();
    assert!(matches!(err, crate::Error::InvalidState(_)) && err.to_string().contains("cudaMemcpy"), "{err}");
    assert!(matches!(cuda.write_at(0, &[1u8; 8]).unwrap_err(), crate::Error::InvalidState(_)));
    let host = context.allocate(64, MemoryLocation::CpuStandard).unwrap();
    assert!(matches!(context.copy(&host, 0, &cuda, 0, 64).unwrap_err(), crate::Error::InvalidState(_)));
    assert!(matches!(context.copy(&cuda, 0, &host, 0, 64).unwrap_err(), crate::Error::InvalidState(_)));
    assert!(matches!(cuda.export().unwrap_err(), crate::Error::Unsupported(_)));
    assert!(context.holds_registered(&cuda));
    context.deregister(cuda).unwrap();
    assert!(context.find(0x180 as *const u8).is_none());
}

/// A route that shares a ready semaphore with the others (`offers`), or one whose account of
/// itself changes once it is handed one.
struct ReadySender {
    route: Route,
    offers: bool,
}

impl RouteSender for ReadySender {
    fn route_id(&self) -> u32 {
        if self.offers {
            7
        } else {
            8
        }
    }
    fn route(&self) -> &Route {
        &self.route
    }
    fn serves(&self, _kind: MemoryKind) -> bool {
        false
    }
    fn pack(&mut self, _payload: &Payload<'_>, _completed: u64, _out: &mut Packed) -> crate::Result<()> {
        Err(Error::Unsupported("packs nothing".into()))
    }
    fn released_semaphore(&self) -> crate::Result<OwnedFd> {
        Err(Error::Unsupported("no semaphore".into()))
    }
    fn sent(&mut self, _seq: u64) {}
    fn ready_semaphore(&self) -> crate::Result<OwnedFd> {
        Err(Error::Unsupported("no semaphore".into()))
    }
    fn ready_share(&self) -> super::transport::ReadyOffer {
        self.offers.then(|| {
            Ok(super::transport::ReadyShare {
                device_uuid: [7; 16],
                last: Arc::default(),
                #[cfg(feature = "vulkan")]
                semaphore: None,
            })
        })
    }
    fn share_ready(&mut self, share: &super::transport::SharedReady) {
        if !self.offers {
            self.route.reason = format!("stream-ordered on {:?}", share.as_ref().map(|s| s.device_uuid[0]));
        }
    }
}

#[test]
fn the_report_says_what_the_routes_became_once_linked() {
    let route = |class, reason: &str| Route { class, kind: TransportId::new("test"), reason: reason.into() };
    let routes = vec![
        AnyRouteSender::Other(Box::new(ReadySender { route: route(PayloadClass::Gpu, "owns it"), offers: true })),
        AnyRouteSender::Other(Box::new(ReadySender { route: route(PayloadClass::Cuda, "before"), offers: false })),
    ];
    // The report is made from the routes before the table links them.
    let mut info = super::transport::TransportInfo::new(routes.iter().map(|r| r.route().clone()).collect());
    let table = super::routes::SenderTable::new(routes);
    table.report_into(&mut info);
    assert!(info.reason.contains("owns it. stream-ordered on Ok(7)"), "{}", info.reason);
    assert!(!info.reason.contains("before"), "{}", info.reason);
}
