//! GPU buffers by reference on a fan-in channel, between real processes on one GPU (lavapipe
//! in CI): several producers each send GPU buffers through the Vulkan IPC route, the consumer
//! resolves each through the imports of the producer that sent it; a killed producer's held
//! GPU message stays readable until released; a new producer in the freed slot is read
//! through its own imports; a hostile producer's descriptor ends only its own slot. The tests
//! skip, saying why, without a Vulkan device, and fail then under `LF_REQUIRE_VULKAN=1`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, Message, PeerState, Producer, WaitStrategy};
use lava_flow::memory::{Buffer, BufferOrigin, Context, ContextConfig, MemoryLocation};
use lava_flow::Error;

use crate::common::*;

const LONG: Duration = Duration::from_secs(30);

/// This process's context with its GPU, or `None` (the test then skips) when there is none.
fn gpu_ctx() -> Option<Context> {
    let context = Context::new(ContextConfig::default()).expect("memory context");
    match context.gpu_unavailable_reason() {
        None => Some(context),
        Some(why) => {
            assert!(
                std::env::var("LF_REQUIRE_VULKAN").is_err(),
                "LF_REQUIRE_VULKAN is set but there is no Vulkan device: {why}"
            );
            eprintln!("skipped: no Vulkan device ({why})");
            None
        }
    }
}

fn fan_in(max_peers: u32) -> ChannelConfig {
    ChannelConfig {
        kind: ChannelKind::FanIn,
        max_peers,
        ..config(WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) })
    }
}

/// Even messages are GPU buffers (device-local and host-visible in turn), odd ones CPU copies.
fn is_gpu(seq: u64) -> bool {
    seq % 2 == 0
}

fn len_of(id: u64, seq: u64) -> usize {
    if is_gpu(seq) {
        256 + ((id * 131 + seq * 17) % 4000) as usize
    } else {
        64
    }
}

/// Producer `id`'s message `seq`: its id, its sequence number, then bytes derived from both.
fn expected(id: u64, seq: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len_of(id, seq)];
    fill(&mut bytes[16..], id * 1_000_003 + seq);
    bytes[..8].copy_from_slice(&id.to_le_bytes());
    bytes[8..16].copy_from_slice(&seq.to_le_bytes());
    bytes
}

/// GPU buffers a producer rewrites in turn, each once its last message completed.
struct Sender {
    id: u64,
    p: Producer,
    device_local: Vec<Buffer>,
    host_visible: Vec<Buffer>,
}

const RING: usize = 8;

impl Sender {
    fn new(context: &Context, name: &str, id: u64, max_peers: u32) -> Sender {
        let p = Producer::create(context, name, &here(), &here(), &fan_in(max_peers)).unwrap();
        assert_eq!(p.transport().names(), "shm+vulkan_ipc", "{}", p.transport().reason);
        let ring = |location| (0..RING).map(|_| context.allocate(8 << 10, location).unwrap()).collect();
        Sender {
            id,
            p,
            device_local: ring(MemoryLocation::GpuDeviceLocal),
            host_visible: ring(MemoryLocation::GpuHostVisible),
        }
    }

    /// Sends message `seq`: a GPU buffer by reference, or a CPU copy.
    fn send(&mut self, seq: u64) {
        let bytes = expected(self.id, seq);
        let sent = if is_gpu(seq) {
            // The buffer's last message (two rounds of the ring ago) is let go of first.
            if let Some(before) = seq.checked_sub(4 * RING as u64) {
                self.p.wait_completed(before, Some(LONG)).unwrap();
            }
            let ring = if seq % 4 == 0 { &self.device_local } else { &self.host_visible };
            let buffer = &ring[(seq / 4) as usize % RING];
            buffer.write_at(0, &bytes).unwrap();
            self.p.send_buffer(buffer, 0, bytes.len())
        } else {
            self.p.send(&bytes)
        };
        assert_eq!(sent.unwrap(), seq, "producer {}: sequence numbers count per producer", self.id);
    }
}

/// A message's bytes, read through its GPU buffer where it carries one.
fn read(m: &Message) -> Vec<u8> {
    match m.buffer() {
        Some(buffer) => {
            let mut bytes = vec![0u8; m.len()];
            buffer.read_at(0, &mut bytes).unwrap();
            bytes
        }
        None => m.to_vec(),
    }
}

/// Checks a message against what its producer sent: its kind, its bytes, its sequence number.
/// Returns the producer's id.
fn check_message(m: &Message) -> u64 {
    let bytes = read(m);
    assert!(bytes.len() >= 16, "a {}-byte message", bytes.len());
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let seq = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    assert_eq!(m.sequence(), seq, "producer {id}: the message's sequence number and its bytes disagree");
    assert_eq!(m.buffer().is_some(), is_gpu(seq), "producer {id}'s message {seq}: GPU or not");
    if is_gpu(seq) {
        assert!(m.is_zero_copy(), "producer {id}'s GPU message {seq} came by reference");
        assert_eq!(m.ready_value(), 0, "lavapipe shares no semaphore: buffers are complete when sent");
    }
    assert!(bytes == expected(id, seq), "producer {id}'s message {seq}: its bytes");
    id
}

/// The process that exported a GPU message's memory.
fn exporter_of(m: &Message) -> u32 {
    match m.buffer().expect("a GPU message").origin() {
        BufferOrigin::Imported { exporter_pid } => exporter_pid,
        other => panic!("a GPU message's buffer is imported, not {other:?}"),
    }
}

/// Four producer processes send GPU buffers by reference with CPU copies between them; the
/// consumer gets each producer's messages in its order under one slot, each GPU buffer's bytes
/// read through its own producer's import, and reports and peers that say so.
#[test]
fn four_producers_send_gpu_buffers_by_reference() {
    const TEST: &str = "fan_in_gpu::four_producers_send_gpu_buffers_by_reference";
    const PRODUCERS: u64 = 4;
    const MESSAGES: u64 = 200;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let id: u64 = arg("id").parse().unwrap();
            let mut s = Sender::new(&context, "fanin-gpu4", id, 4);
            // All four attach before any sends, so that the consumer serves four at once.
            report("ready", id);
            while !Path::new(&arg("flag")).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            for seq in 0..MESSAGES {
                s.send(seq);
            }
            s.p.wait_completed(MESSAGES - 1, Some(LONG)).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "fanin-gpu4", &here(), &here(), &fan_in(4)).unwrap();
            assert_eq!(c.transport().names(), "shm+vulkan_ipc", "{}", c.transport().reason);
            let mut next: HashMap<u64, u64> = HashMap::new();
            let mut slot_of: HashMap<u64, u32> = HashMap::new();
            let mut exporter_of_slot: HashMap<u32, u32> = HashMap::new();
            let (mut ended, mut seen_all_four) = (0, false);
            while ended < PRODUCERS {
                match c.recv_timeout(LONG) {
                    Ok(m) => {
                        let id = check_message(&m);
                        let expected_seq = next.entry(id).or_insert(0);
                        assert_eq!(m.sequence(), *expected_seq, "producer {id}: out of order");
                        *expected_seq += 1;
                        let slot = *slot_of.entry(id).or_insert(m.producer());
                        assert_eq!(m.producer(), slot, "producer {id}'s messages came under two slots");
                        let peer = &c.peers()[slot as usize];
                        assert_eq!(peer.route, Some("shm"), "{peer:?}");
                        if m.buffer().is_some() {
                            // Each slot's GPU memory is its own producer's.
                            let exporter = *exporter_of_slot.entry(slot).or_insert(exporter_of(&m));
                            assert_eq!(exporter_of(&m), exporter, "slot {slot}'s GPU memory from two processes");
                            assert_eq!(exporter, peer.pid, "slot {slot}'s GPU memory is not its producer's");
                        }
                        let attached = c.peers().iter().filter(|p| p.state != PeerState::Free).count() as u64;
                        if !seen_all_four && attached == PRODUCERS && ended == 0 {
                            // Every producer attached (each did before any sent), none ended: the
                            // report names all four. Asked of the channel, not of the messages
                            // seen, since a producer the machine runs late may send its first
                            // message only after the others sent their last.
                            seen_all_four = true;
                            let reason = &c.transport().reason;
                            assert!(reason.contains("vulkan_ipc, by reference"), "{reason}");
                            assert!(reason.contains("slots 0, 1, 2, 3"), "{reason}");
                            assert!(c.peers().iter().all(|p| p.state != PeerState::Free), "{:?}", c.peers());
                        }
                    }
                    Err(Error::PeerGone(_)) => {
                        let slot = c.last_gone().expect("a fan-in names the slot that ended");
                        let id = slot_of.iter().find(|(_, s)| **s == slot).map(|(id, _)| *id).expect("a slot seen");
                        assert_eq!(next[&id], MESSAGES, "producer {id}'s end came before its last message");
                        ended += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(seen_all_four, "the four producers were never attached at once");
            let mut pids: Vec<u32> = exporter_of_slot.values().copied().collect();
            pids.sort_unstable();
            pids.dedup();
            assert_eq!(pids.len() as u64, PRODUCERS, "each producer's GPU memory is its own");
            // Each producer has a ready semaphore of its own: the channel-wide call says which
            // one to use.
            let err = c.ready_semaphore().unwrap_err();
            assert!(matches!(err, Error::InvalidState(ref m) if m.contains("producer_ready_semaphore")), "{err}");
            report("received", MESSAGES * PRODUCERS);
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("fanin-gpu4");
            let scratch = scratch_dir();
            let flag = scratch.path().join("go").display().to_string();
            let args = |id: u64| [("id", id.to_string()), ("flag", flag.clone())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args(9));
            let mut producers: Vec<_> =
                (0..PRODUCERS).map(|id| spawn_reporting(TEST, "producer", &dir, &args(id))).collect();
            for (_, out) in producers.iter_mut() {
                expect_line(out, "ready");
            }
            std::fs::write(&flag, b"go").unwrap();
            assert_eq!(expect_line(&mut c_out, "received"), (MESSAGES * PRODUCERS).to_string());
            for (p, _) in producers {
                wait_ok(p, "producer");
            }
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// How many messages the producer killed sends (it never sees them complete).
const VICTIM_MESSAGES: u64 = 6;

/// A producer killed (kill -9) while the consumer holds one of its GPU messages: the consumer
/// reads that message's bytes after the death and after the slot's end was reported, until it
/// releases it; the others go on; a new producer takes the freed slot (attaching before the
/// dead one's end was read), and its GPU buffers, named by the same arena slot numbers as the
/// dead one's, are read through its own imports.
#[test]
fn a_killed_producer_s_gpu_message_stays_readable_and_its_slot_is_taken_anew() {
    const TEST: &str = "fan_in_gpu::a_killed_producer_s_gpu_message_stays_readable_and_its_slot_is_taken_anew";
    const OTHERS: u64 = 3;
    const MESSAGES: u64 = 40;
    const NEWCOMER: u64 = 9;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let id: u64 = arg("id").parse().unwrap();
            let mut s = Sender::new(&context, "fanin-gpu-kill", id, 4);
            if id == 0 {
                for seq in 0..VICTIM_MESSAGES {
                    s.send(seq);
                }
                report("sent", id);
                // Killed while it lives, its buffers still in the consumer's hands.
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            report("attached", id);
            for seq in 0..MESSAGES {
                s.send(seq);
            }
            s.p.wait_completed(MESSAGES - 1, Some(LONG)).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let (killed, resume) = (arg("killed"), arg("resume"));
            let mut c = Consumer::create(&context, "fanin-gpu-kill", &here(), &here(), &fan_in(4)).unwrap();
            let mut next: HashMap<u64, u64> = HashMap::new();
            let mut slot_of: HashMap<u64, u32> = HashMap::new();
            // The victim's first GPU message, held across its death, and its bytes.
            let mut held: Option<(Message, Vec<u8>)> = None;
            let (mut victim_pid, mut ended) = (0, 0);
            let check_held = |held: &Option<(Message, Vec<u8>)>, when: &str| {
                let (m, bytes) = held.as_ref().expect("the victim's message is held");
                assert!(read(m) == *bytes, "the dead producer's held GPU message changed {when}");
                // Through the consumer's own mapping of the import too, where the host maps it.
                // (A device-local import that the host does not map, as on NVIDIA, has none.)
                assert!(m.as_slice().is_empty() || m.as_slice() == &bytes[..], "the held message's mapping {when}");
            };
            while ended < OTHERS + 2 {
                let m = match c.recv_timeout(LONG) {
                    Ok(m) => m,
                    Err(Error::PeerGone(why)) => {
                        let slot = c.last_gone().expect("a fan-in names the slot that ended");
                        let id = slot_of.iter().find(|(_, s)| **s == slot).map(|(id, _)| *id).expect("a slot seen");
                        if id == 0 {
                            assert!(Path::new(&killed).exists(), "the victim's end came before it was killed: {why}");
                            assert_eq!(next[&0], VICTIM_MESSAGES);
                            assert!(why.contains(&format!("slot {slot}")), "{why}");
                            // Its routes ended with the slot; the message keeps its memory.
                            check_held(&held, "once its producer's end was reported");
                            report("gone", slot);
                            // The newcomer's messages come in this slot from now on.
                            slot_of.remove(&0);
                        } else {
                            assert_eq!(next[&id], MESSAGES, "producer {id}'s end came before its last message");
                        }
                        ended += 1;
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                };
                let id = check_message(&m);
                let seq = next.entry(id).or_insert(0);
                assert_eq!(m.sequence(), *seq, "producer {id}: out of order");
                *seq += 1;
                let slot = *slot_of.entry(id).or_insert(m.producer());
                assert_eq!(m.producer(), slot, "producer {id}'s messages came under two slots");
                match id {
                    0 => {
                        victim_pid = c.peers()[slot as usize].pid;
                        if held.is_none() && m.buffer().is_some() {
                            assert_eq!(exporter_of(&m), victim_pid);
                            let bytes = read(&m);
                            held = Some((m, bytes));
                        }
                        if next[&0] == VICTIM_MESSAGES {
                            report("holding", slot);
                            // The newcomer attaches while the dead producer's session still
                            // holds the slot: it waits behind it, and its routes are made
                            // when the dead one's end has been reported.
                            while !Path::new(&resume).exists() {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    }
                    NEWCOMER => {
                        if m.buffer().is_some() {
                            let pid = c.peers()[slot as usize].pid;
                            assert_ne!(pid, victim_pid, "the newcomer is another process");
                            assert_eq!(exporter_of(&m), pid, "the newcomer's GPU buffer resolved to another's memory");
                            if held.is_some() {
                                // The dead producer's arenas are still imported while its
                                // message is held: the newcomer's did not alias them.
                                check_held(&held, "while the newcomer sends");
                                drop(held.take());
                            }
                        }
                    }
                    _ => {
                        if Path::new(&killed).exists() && held.is_some() {
                            check_held(&held, "after its producer was killed");
                        }
                    }
                }
            }
            assert!(held.is_none(), "the newcomer's GPU messages were checked beside the dead one's");
            assert_eq!(slot_of.get(&NEWCOMER), Some(&0), "the newcomer took the dead producer's slot");
            report("done", ended);
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("fanin-gpu-kill");
            let scratch = scratch_dir();
            let killed = scratch.path().join("killed").display().to_string();
            let resume = scratch.path().join("resume").display().to_string();
            let args = |id: u64| [("id", id.to_string()), ("killed", killed.clone()), ("resume", resume.clone())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args(0));
            // The victim first: it takes slot 0.
            let (mut victim, mut victim_out) = spawn_reporting(TEST, "producer", &dir, &args(0));
            expect_line(&mut victim_out, "sent");
            let mut others: Vec<_> =
                (1..=OTHERS).map(|id| spawn_reporting(TEST, "producer", &dir, &args(id))).collect();
            // Every slot taken: the only one the newcomer can take is the victim's.
            for (_, out) in others.iter_mut() {
                expect_line(out, "attached");
            }
            assert_eq!(expect_line(&mut c_out, "holding"), "0");
            // Said before the kill, which the consumer may see before kill9 returns.
            std::fs::write(&killed, b"").unwrap();
            kill9(&mut victim);
            // The newcomer takes the freed slot (its lock went with the victim) before the
            // consumer has read the victim's end.
            let (newcomer, mut newcomer_out) = spawn_reporting(TEST, "producer", &dir, &args(NEWCOMER));
            expect_line(&mut newcomer_out, "attached");
            std::fs::write(&resume, b"").unwrap();
            assert_eq!(expect_line(&mut c_out, "gone"), "0");
            assert_eq!(expect_line(&mut c_out, "done"), (OTHERS + 2).to_string());
            for (p, _) in others {
                wait_ok(p, "producer");
            }
            wait_ok(newcomer, "the producer in the freed slot");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

// The layout from src/channels/transports/shm/ring.rs and the Vulkan IPC route's descriptor
// (src/channels/transports/vulkan_ipc/wire.rs), as a hostile producer would learn them (as
// in gpu.rs).
const SLOTS: usize = 4096;
const SLOT: usize = 128;
const KIND_ROUTED_VULKAN: u32 = 4 | 2 << 8;

/// A hostile producer writes a GPU message whose descriptor names bytes past its arena: the
/// consumer reports `Corrupt` naming that producer's slot and detaches it; the other producer
/// goes on to its last message.
#[test]
fn a_hostile_gpu_descriptor_ends_only_its_own_slot() {
    const TEST: &str = "fan_in_gpu::a_hostile_gpu_descriptor_ends_only_its_own_slot";
    const MESSAGES: u64 = 40;
    match child_role().as_deref() {
        Some("hostile") => {
            use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
            let Some(context) = gpu_ctx() else { return };
            let mut s = Sender::new(&context, "fanin-gpu-hostile", 0, 2);
            s.send(0);
            s.p.wait_completed(0, Some(LONG)).unwrap();
            let (base, _) = region_of("fanin-gpu-hostile");
            let slot = SLOTS + SLOT;
            // SAFETY: the test owns the mapping and writes inside ring slot 1.
            unsafe {
                let at = |off: usize| &*(base.add(slot + off) as *const AtomicU64);
                let at32 = |off: usize| &*(base.add(slot + off) as *const AtomicU32);
                at32(16).store(0, Ordering::Relaxed);
                at32(20).store(1, Ordering::Relaxed);
                at(24).store(u64::MAX - 10, Ordering::Relaxed);
                at(32).store(64, Ordering::Relaxed);
                at(40).store(0, Ordering::Relaxed);
                at32(8).store(32, Ordering::Relaxed);
                at32(12).store(KIND_ROUTED_VULKAN, Ordering::Relaxed);
                at(0).store(2, Ordering::SeqCst);
            }
            report("written", 0);
            // Kept open until the consumer has judged the message; then detached.
            let _ = s.p.wait_completed(1, Some(Duration::from_secs(5)));
        }
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut s = Sender::new(&context, "fanin-gpu-hostile", 1, 2);
            for seq in 0..MESSAGES / 2 {
                s.send(seq);
            }
            // The rest once the hostile producer was detached.
            while !Path::new(&arg("flag")).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            for seq in MESSAGES / 2..MESSAGES {
                s.send(seq);
            }
            s.p.wait_completed(MESSAGES - 1, Some(LONG)).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "fanin-gpu-hostile", &here(), &here(), &fan_in(2)).unwrap();
            let mut next: HashMap<u64, u64> = HashMap::new();
            let mut slot_of: HashMap<u64, u32> = HashMap::new();
            let mut corrupt = 0;
            loop {
                match c.recv_timeout(LONG) {
                    Ok(m) => {
                        let id = check_message(&m);
                        let seq = next.entry(id).or_insert(0);
                        assert_eq!(m.sequence(), *seq, "producer {id}: out of order");
                        *seq += 1;
                        slot_of.insert(id, m.producer());
                    }
                    Err(Error::Corrupt(why)) => {
                        let hostile = slot_of[&0];
                        assert!(why.contains(&format!("slot {hostile}")) && why.contains("detached"), "{why}");
                        assert_eq!(c.peers()[hostile as usize].state, PeerState::Free, "{:?}", c.peers());
                        corrupt += 1;
                        println!("corrupt: {why}");
                        report("corrupt", hostile);
                    }
                    Err(Error::PeerGone(why)) => {
                        assert_eq!(Some(c.last_gone().unwrap()), slot_of.get(&1).copied(), "{why}");
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(corrupt, 1, "one hostile message, reported once");
            assert_eq!((next[&0], next[&1]), (1, MESSAGES), "the hostile producer's good message, every other one");
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("fanin-gpu-hostile");
            let scratch = scratch_dir();
            let flag = scratch.path().join("go").display().to_string();
            let args = [("flag", flag.clone())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args);
            let (hostile, mut h_out) = spawn_reporting(TEST, "hostile", &dir, &args);
            expect_line(&mut h_out, "written");
            let producer = spawn(TEST, "producer", &dir, &args);
            expect_line(&mut c_out, "corrupt");
            std::fs::write(&flag, b"go").unwrap();
            wait_ok(producer, "producer");
            wait_ok(hostile, "hostile producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}
