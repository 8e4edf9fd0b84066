//! Channels between "hosts" over MPI: this test starts itself under `mpirun` with two ranks
//! that lava-flow sees on different hosts (`LF_HOST_ID=a` and `b`) and Open MPI's TCP path,
//! so the messages really cross MPI. Every payload kind in one order (copies inline and
//! chunked, loans, buffer sends of CPU buffers), exactly once; completion; timeouts; a
//! consumer's wait for the producer's close; a GPU buffer staged (where a Vulkan device is);
//! malformed messages from a hostile producer, each `Corrupt`. Then the ends' duties to a
//! peer that does not call lava-flow: a quiet consumer's releases still complete the
//! producer's messages, and a consumer's close reaches a producer that keeps sending. And the
//! carrier contract every carrier keeps (`tests/contract/cases.rs`), rank 0 the producer.
#![cfg(feature = "mpi")]

#[path = "contract/cases.rs"]
mod cases;

#[path = "common/mpirun.rs"]
mod mpirun;
use std::process::Command;
use std::time::{Duration, Instant};

use lava_flow::channels::{
    ChannelConfig, ChannelKind, Consumer, Producer, TransportKind, WaitStrategy, AUTO_ZERO_COPY_MIN,
};
use lava_flow::memory::{Context, ContextConfig, MemoryLocation};
use lava_flow::mpi::{Communicator, MpiWorld, ThreadLevel};
use lava_flow::Error;
use mpi_sys as ffi;

const MESSAGES: u64 = 20_000;

/// The length of message `seq`: mostly small, some over the inline limit, a few chunked.
fn size_of(seq: u64) -> usize {
    match seq % 1000 {
        999 => 3 << 20,
        n if n % 10 == 9 => 100_000,
        n => 8 + (n as usize * 7) % 300,
    }
}

fn fill(buf: &mut [u8], seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..].iter_mut().enumerate() {
        *b = (seq as usize + i) as u8;
    }
}

fn check(buf: &[u8], seq: u64) {
    assert_eq!(buf.len(), size_of(seq), "message {seq}'s length");
    assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), seq, "message {seq} out of order");
    assert!(buf[8..].iter().enumerate().all(|(i, &b)| b == (seq as usize + i) as u8), "message {seq}'s bytes");
}

fn config() -> ChannelConfig {
    ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        capacity: 64,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    }
}

fn role(world: &MpiWorld, context: &Context) {
    let other = 1 - world.rank();
    let mine = world.me().location().clone();
    let peer = world.peer(other).unwrap().location().clone();
    if world.rank() == 0 {
        let mut p = Producer::create(context, "over-mpi", &mine, &peer, &config()).unwrap();
        let report = p.transport().clone();
        assert_eq!(report.kind, TransportKind::Mpi, "{}", report.reason);
        assert!(
            report.reason.contains("mpi carries the messages") && report.reason.contains("staged through mpi"),
            "{}",
            report.reason
        );
        let buffer = context.allocate(3 << 20, MemoryLocation::CpuStandard).unwrap();
        for seq in 0..MESSAGES {
            let len = size_of(seq);
            let sent = match seq % 3 {
                0 => {
                    let mut bytes = vec![0u8; len];
                    fill(&mut bytes, seq);
                    p.send(&bytes).unwrap()
                }
                1 => {
                    let mut loan = p.loan(len, None).unwrap();
                    fill(loan.as_mut_slice(), seq);
                    loan.publish().unwrap()
                }
                _ => {
                    // A buffer send: the buffer may be rewritten once the message is complete.
                    // SAFETY: the buffer's len bytes are ours; nothing reads them now.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr(), len) };
                    fill(bytes, seq);
                    let sent = p.send_buffer(&buffer, 0, len).unwrap();
                    p.wait_completed(sent, Some(Duration::from_secs(60))).unwrap();
                    sent
                }
            };
            assert_eq!(sent, seq);
        }
        // Completion of a copy: the producer asks for a report.
        p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(60))).unwrap();
        assert!(p.completed().unwrap() >= MESSAGES);
        // Messages too large are refused at once, saying why.
        assert!(
            matches!(p.send(&vec![0u8; (16 << 20) + 1]), Err(Error::InvalidArgument(m)) if m.contains("pool_size"))
        );
        // A GPU buffer goes staged through MPI (where this process has a GPU).
        if let Ok(gpu) = context.allocate(5 << 20, MemoryLocation::GpuDeviceLocal) {
            if gpu.location().is_gpu() {
                let mut bytes = vec![0u8; 5 << 20];
                fill(&mut bytes, 7);
                gpu.write_at(0, &bytes).unwrap();
                p.send_buffer(&gpu, 0, 5 << 20).unwrap();
            }
        }
        p.send(b"last").unwrap();
    } else {
        let mut c = Consumer::create(context, "over-mpi", &mine, &peer, &config()).unwrap();
        assert_eq!(c.transport().kind, TransportKind::Mpi, "{}", c.transport().reason);
        // Message 3k is held across the receive of 3k + 1, and released after it: releases
        // out of order, all done before the buffer send 3k + 2, whose completion the
        // producer waits for.
        let mut held: Option<lava_flow::channels::Message> = None;
        for seq in 0..MESSAGES {
            let m = c.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
            assert_eq!(m.sequence(), seq);
            check(&m, seq);
            // Buffer sends of more than 112 bytes go by reference; shorter ones are copied.
            assert_eq!(m.is_zero_copy(), seq % 3 == 2 && m.len() >= AUTO_ZERO_COPY_MIN, "buffer sends say so");
            match seq % 3 {
                0 => held = Some(m),
                1 => {
                    drop(m);
                    drop(held.take().expect("message 3k is held"));
                }
                _ => {}
            }
        }
        let mut next = c.recv_timeout(Duration::from_secs(60)).unwrap();
        if next.len() == 5 << 20 {
            assert!(next.buffer().is_none() && !next.is_zero_copy(), "staged: host bytes");
            let mut expected = vec![0u8; 5 << 20];
            fill(&mut expected, 7);
            assert!(*next == expected[..], "the staged GPU buffer's bytes");
            drop(next);
            next = c.recv_timeout(Duration::from_secs(60)).unwrap();
        }
        assert_eq!(&*next, b"last");
        drop(next);
        // Nothing more until the producer closes: PeerGone, not a hang.
        assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_)) | Err(Error::PeerGone(_))));
        match c.recv_timeout(Duration::from_secs(60)) {
            Err(Error::PeerGone(_)) => {}
            Err(Error::Timeout(_)) => panic!("the producer's close never came"),
            other => panic!("after the last message: {other:?}"),
        }
    }
}

/// A producer that sends malformed messages: the consumer says `Corrupt`, naming what is
/// wrong, and reads nothing out of bounds (one channel per kind: a malformed one is done).
fn hostile_producer(world: &MpiWorld, context: &Context) {
    let other = 1 - world.rank();
    let mine = world.me().location().clone();
    let peer = world.peer(other).unwrap().location().clone();
    let expected = [
        "cut message 0 short",
        "sent message 5 where 0 was next",
        "sent 132 bytes for a message of 8",
        "asked for a report on message 18446744073709551615 before sending it (0 was next)",
    ];
    for (how, words) in expected.iter().enumerate() {
        let name = format!("hostile-{how}");
        if world.rank() == 0 {
            let mut p = Producer::create(context, &name, &mine, &peer, &config()).unwrap();
            p.send_malformed_for_tests(how as u32).unwrap();
            // Until the consumer has looked: it closes once it has.
            let mut tries = 0;
            while !matches!(p.try_loan(8), Err(Error::PeerGone(_))) && tries < 60_000 {
                std::thread::sleep(Duration::from_millis(1));
                tries += 1;
            }
        } else {
            let mut c = Consumer::create(context, &name, &mine, &peer, &config()).unwrap();
            match c.recv_timeout(Duration::from_secs(60)) {
                Err(Error::Corrupt(why)) => assert!(why.contains(words), "malformed message {how}: {why}"),
                other => panic!("malformed message {how}: {other:?}"),
            }
        }
    }
}

#[test]
fn channels_cross_mpi_between_hosts() {
    under_mpirun("channels_cross_mpi_between_hosts", |world| {
        let context = Context::new(ContextConfig::default()).unwrap();
        role(world, &context);
        hostile_producer(world, &context);
    });
}

/// A consumer that receives and releases message 0 and then makes no lava-flow call for
/// 2.5 s: the producer learns of the release all the same (lava-flow's own thread sends it),
/// within its 2 s wait. Sequence numbers never sent are refused, not waited for.
#[test]
fn a_quiet_consumer_still_completes_the_producers_messages() {
    under_mpirun("a_quiet_consumer_still_completes_the_producers_messages", |world| {
        signals_allowed(world);
        let context = Context::new(ContextConfig::default()).unwrap();
        let (mine, peer) = ends(world);
        if world.rank() == 0 {
            let mut p = Producer::create(&context, "quiet", &mine, &peer, &config()).unwrap();
            assert_eq!(p.send(b"message 0").unwrap(), 0);
            // Not sent yet: refused at once, saying so, not waited for.
            for never in [1, 2, u64::MAX - 1] {
                match p.wait_completed(never, Some(Duration::from_secs(1))) {
                    Err(Error::InvalidArgument(m)) => assert!(m.contains("has not been sent"), "{m}"),
                    other => panic!("wait_completed({never}) of a message never sent: {other:?}"),
                }
            }
            // The consumer has released message 0 and gone quiet.
            await_signal(1);
            p.wait_completed(0, Some(Duration::from_secs(2)))
                .expect("message 0 completes while the consumer makes no lava-flow call");
            assert!(p.completed().unwrap() >= 1);
            signal(1);
        } else {
            let mut c = Consumer::create(&context, "quiet", &mine, &peer, &config()).unwrap();
            let m = c.recv_timeout(Duration::from_secs(60)).unwrap();
            assert_eq!((&*m, m.sequence()), (&b"message 0"[..], 0));
            drop(m);
            signal(0);
            std::thread::sleep(Duration::from_millis(2500));
            await_signal(0);
        }
    });
}

/// A consumer that closes while its producer keeps sending small messages: once the close
/// has reached the producer's process, the producer's next wait is `PeerGone`, and at most 32
/// more of its sends succeed.
#[test]
fn a_producer_learns_that_its_consumer_closed() {
    under_mpirun("a_producer_learns_that_its_consumer_closed", |world| {
        signals_allowed(world);
        let context = Context::new(ContextConfig::default()).unwrap();
        let (mine, peer) = ends(world);
        // Room for far more than 32 messages: the producer does not learn of the close by
        // running out of it, nor look at every message's send (as it does once half the
        // capacity is in flight).
        let config = ChannelConfig { capacity: 1 << 16, ..config() };
        const RECEIVED: u64 = 3000;
        // A wait after the close: PeerGone, not success or a timeout.
        if world.rank() == 0 {
            let mut p = Producer::create(&context, "closing-wait", &mine, &peer, &config).unwrap();
            for seq in 0..RECEIVED + 5 {
                assert_eq!(p.send(&seq.to_le_bytes()).unwrap(), seq);
            }
            await_signal(1);
            match p.wait_completed(RECEIVED + 4, Some(Duration::from_secs(30))) {
                Err(Error::PeerGone(_)) => {}
                other => panic!("a wait for a message the consumer never released, after its close: {other:?}"),
            }
            assert!(matches!(p.send(b"after"), Err(Error::PeerGone(_))));
        } else {
            let mut c = Consumer::create(&context, "closing-wait", &mine, &peer, &config).unwrap();
            for seq in 0..RECEIVED {
                assert_eq!(c.recv_timeout(Duration::from_secs(60)).unwrap().sequence(), seq);
            }
            drop(c);
            signal(0);
        }
        // Sends after the close: at most 32 succeed. The consumer reads some messages and
        // closes, then says so in a file (not through MPI, whose receive would take the close
        // in on the producer's side first); the producer keeps sending all along and counts
        // the sends that succeed once the file is there. It sends every 30 µs or so, busy all
        // the while (MPI is left alone between sends, as by a producer that computes its
        // messages), so that 32 sends take longer than the consumer's last steps. A few
        // rounds: one where the producer learns of the close before it sees the file proves
        // nothing.
        for round in 0..4 {
            let name = format!("closing-sends-{round}");
            let closed = signal_dir().join(&name);
            if world.rank() == 0 {
                let mut p = Producer::create(&context, &name, &mine, &peer, &config).unwrap();
                let mut after_close: Option<u32> = None;
                for seq in 0.. {
                    if after_close.is_none() && closed.exists() {
                        after_close = Some(0);
                    }
                    let computed = Instant::now();
                    while computed.elapsed() < Duration::from_micros(30) {
                        std::hint::spin_loop();
                    }
                    match p.send_timeout(&u64::to_le_bytes(seq), Duration::from_secs(30)) {
                        Ok(sent) => {
                            assert_eq!(sent, seq);
                            if let Some(n) = after_close.as_mut() {
                                *n += 1;
                                assert!(*n <= 32, "{n} sends succeeded after the consumer's close had returned");
                            }
                        }
                        Err(Error::PeerGone(_)) => {
                            assert!(seq >= RECEIVED, "PeerGone at message {seq}, before the consumer closed");
                            match after_close {
                                Some(n) => println!("round {round}: {n} sends succeeded after the consumer's close"),
                                None => println!("round {round}: the producer learned of the close before the file"),
                            }
                            break;
                        }
                        Err(e) => panic!("message {seq}: {e}"),
                    }
                }
            } else {
                let mut c = Consumer::create(&context, &name, &mine, &peer, &config).unwrap();
                for seq in 0..RECEIVED {
                    assert_eq!(c.recv_timeout(Duration::from_secs(60)).unwrap().sequence(), seq);
                }
                drop(c);
                std::fs::write(&closed, b"closed").unwrap();
            }
        }
    });
}

/// The bytes of the CUDA test's allocation: a pattern no two nearby offsets share.
fn cuda_pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
}

/// CUDA memory the application allocated (`cuMemAlloc`) goes to a consumer on another host:
/// copied through host memory over MPI (no process there opens it), every byte right, large
/// messages in pieces; the report says so, and a ready value is refused naming the way out.
/// Skipped (both ranks) where rank 0 has no CUDA device.
#[test]
fn cuda_memory_is_staged_to_another_host() {
    under_mpirun("cuda_memory_is_staged_to_another_host", |world| {
        const LEN: usize = 5 << 20;
        // (offset, length) of each message in the allocation: a short one, one over the inline
        // limit, and one the carrier sends in pieces.
        const SENDS: [(usize, usize); 3] = [(3, 100), (4096, (1 << 20) + 17), (1, LEN - 1)];
        let context = Context::new(ContextConfig::default()).unwrap();
        let (mine, peer) = ends(world);
        if world.rank() == 1 {
            let mut c = Consumer::create(&context, "cuda-staged", &mine, &peer, &config()).unwrap();
            let first = c.recv_timeout(Duration::from_secs(60)).unwrap();
            if &*first == b"no CUDA" {
                println!("skipped: rank 0 has no CUDA device");
                return;
            }
            drop(first);
            let pattern = cuda_pattern(LEN);
            for (offset, len) in SENDS {
                let m = c.recv_timeout(Duration::from_secs(60)).unwrap();
                assert!(*m == pattern[offset..offset + len], "{len} bytes from offset {offset}");
            }
            return;
        }
        let mut p = Producer::create(&context, "cuda-staged", &mine, &peer, &config()).unwrap();
        let driver = lava_flow_cuda::driver().ok().filter(|d| d.device_count().unwrap_or(0) > 0);
        let Some(driver) = driver else {
            p.send(b"no CUDA").unwrap();
            p.wait_completed(0, Some(Duration::from_secs(60))).unwrap();
            return;
        };
        let reason = p.transport().reason.clone();
        assert!(reason.contains("CUDA memory: staged through host memory over mpi"), "{reason}");
        let device = driver.device(0).unwrap();
        let mut cuda_context = std::ptr::null_mut();
        let mut memory = 0;
        let pattern = cuda_pattern(LEN);
        // SAFETY: valid out-pointers; device 0's primary context, retained for the process's
        // life and made current; `LEN` bytes allocated and written from `pattern`.
        unsafe {
            driver.device_primary_ctx_retain(&mut cuda_context, device).unwrap();
            driver.ctx_set_current(cuda_context).unwrap();
            driver.mem_alloc(&mut memory, LEN).unwrap();
            driver.memcpy_htod(memory, pattern.as_ptr().cast(), LEN).unwrap();
        }
        // SAFETY: CUDA device memory of this process, freed only at the end.
        let buffer = unsafe { context.register(memory as usize as *mut u8, LEN) }.unwrap();
        assert_eq!(buffer.cuda().expect("CUDA memory").base, memory);
        p.send(b"CUDA").unwrap();
        match p.send_buffer_after(&buffer, 0, 64, 1, None) {
            Err(Error::Unsupported(m)) => assert!(m.contains("cannot wait for a ready value"), "{m}"),
            other => panic!("a ready value on CUDA memory staged to another host: {other:?}"),
        }
        let mut last = 0;
        for (offset, len) in SENDS {
            last = p.send_buffer(&buffer, offset, len).unwrap();
        }
        p.wait_completed(last, Some(Duration::from_secs(60))).unwrap();
        drop(buffer);
        // SAFETY: the allocation made above; every message from it is complete.
        unsafe { driver.mem_free(memory) }.unwrap();
    });
}

/// This process's location and its peer's (the other rank).
fn ends(world: &MpiWorld) -> (lava_flow::ProcessLocation, lava_flow::ProcessLocation) {
    let other = 1 - world.rank();
    (world.me().location().clone(), world.peer(other).unwrap().location().clone())
}

/// The tag of the tests' own messages on MPI_COMM_WORLD (lava-flow's channels use a
/// communicator of their own).
const SIGNAL_TAG: i32 = 7;

/// Tells rank `to` that something happened, with a plain MPI message on the application's
/// communicator: it arrives after everything this process sent to `to` before.
fn signal(to: u32) {
    let byte = 1u8;
    // SAFETY: one byte of valid memory; MPI is initialised (a world is alive) at thread level
    // MULTIPLE (`signals_allowed`), so this thread may call MPI beside lava-flow's.
    let rc = unsafe {
        ffi::MPI_Send((&byte as *const u8).cast(), 1, ffi::RSMPI_UINT8_T, to as i32, SIGNAL_TAG, ffi::RSMPI_COMM_WORLD)
    };
    assert_eq!(rc, 0, "MPI_Send of a signal");
}

/// The tests' signals call MPI from the test's thread beside lava-flow's own progress thread.
fn signals_allowed(world: &MpiWorld) {
    assert_eq!(
        world.thread_level(),
        ThreadLevel::Multiple,
        "lava-flow asks MPI for MPI_THREAD_MULTIPLE, which this test needs for its signals"
    );
}

/// A folder both ranks see, for signals that must not go through MPI (`under_mpirun` makes it).
fn signal_dir() -> std::path::PathBuf {
    std::env::var_os("LF_TEST_SIGNALS").expect("under_mpirun sets LF_TEST_SIGNALS").into()
}

/// Waits for rank `from`'s signal.
fn await_signal(from: u32) {
    let mut byte = 0u8;
    // SAFETY: as in `signal`; one byte of valid memory to receive into.
    let rc = unsafe {
        ffi::MPI_Recv(
            (&mut byte as *mut u8).cast(),
            1,
            ffi::RSMPI_UINT8_T,
            from as i32,
            SIGNAL_TAG,
            ffi::RSMPI_COMM_WORLD,
            ffi::RSMPI_STATUS_IGNORE,
        )
    };
    assert_eq!(rc, 0, "MPI_Recv of a signal");
}

/// The carrier contract over mpi: each case's producer half on rank 0, its consumer half on
/// rank 1 (GPU buffers are staged between hosts, and a consumer takes one producer: the route
/// and new-producer cases are for carriers of one host).
#[test]
fn mpi_keeps_the_contract() {
    mpi_contract("mpi_keeps_the_contract", cases::Carrier { name: "mpi", ..mpi_carrier() });
}

/// The contract over an MPI fan-in with one producer (on the other host) at a time: what a
/// pair promises, but for the end of a producer, which is reported once, for its slot.
#[test]
fn mpi_fan_in_keeps_the_contract() {
    mpi_contract("mpi_fan_in_keeps_the_contract", cases::Carrier { name: "mpi fan-in", fan_in: true, ..mpi_carrier() });
}

/// The contract over an MPI fan-out with one consumer (on the other host): what a pair
/// promises, but that a consumer's close does not end the producer's sends.
#[test]
fn mpi_fan_out_keeps_the_contract() {
    mpi_contract(
        "mpi_fan_out_keeps_the_contract",
        cases::Carrier { name: "mpi fan-out", fan_out: true, ..mpi_carrier() },
    );
}

fn mpi_carrier() -> cases::Carrier {
    cases::Carrier {
        name: "mpi",
        reattach: false,
        gpu_route: false,
        fd_wakes_for_control: true,
        fan_in: false,
        fan_out: false,
    }
}

fn mpi_contract(test: &str, carrier: cases::Carrier) {
    under_mpirun(test, |world| {
        let kind = match (carrier.fan_in, carrier.fan_out) {
            (true, _) => ChannelKind::FanIn,
            (_, true) => ChannelKind::FanOut,
            _ => ChannelKind::Pair,
        };
        let mut config = ContextConfig::default();
        config.gpu = lava_flow::memory::GpuPolicy::Disabled;
        let context = Context::new(config).unwrap();
        let (mine, peer) = ends(world);
        let dir = signal_dir().join("contract");
        std::fs::create_dir_all(&dir).unwrap();
        for case in cases::cases().iter().filter(|c| (c.runs_on)(&carrier)) {
            let name = format!("contract-{}-{}", carrier.name.replace(' ', "-"), case.name);
            let config = ChannelConfig { transports: Some(vec![TransportKind::Mpi]), kind, ..(case.config)() };
            let producer = world.rank() == 0;
            let sync = cases::Sync::new(dir.clone(), case.name, producer, carrier);
            if producer {
                let open = || Producer::create(&context, &name, &mine, &peer, &config).unwrap();
                (case.producer)(open(), &sync, &open);
            } else {
                (case.consumer)(Consumer::create(&context, &name, &mine, &peer, &config).unwrap(), &sync);
            }
            // Both halves are done before the next case's channel.
            sync.point("done");
            println!("{} (rank {}): {} kept", carrier.name, world.rank(), case.name);
        }
    });
}

/// Runs `test` as the test named `name` on two ranks under mpirun (this process starts
/// mpirun, which starts the test again in each rank).
fn under_mpirun(name: &str, test: impl FnOnce(&MpiWorld)) {
    if std::env::var_os("OMPI_COMM_WORLD_RANK").is_some() {
        let world = MpiWorld::join(Communicator::World, None).unwrap();
        assert_eq!(world.size(), 2);
        // A rank that fails ends the job: its peer may wait for it in MPI (for a signal, or
        // in MPI_Finalize when the world goes) and would never return.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&world))).is_err() {
            // SAFETY: MPI is initialised; aborting the job is what a failed rank wants.
            unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
        }
        return;
    }
    let Ok(exe) = std::env::current_exe() else { panic!("no test executable") };
    let signals = std::env::temp_dir().join(format!("lf-mpi-signals-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&signals);
    std::fs::create_dir_all(&signals).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]);
    for host in ["a", "b"] {
        if host == "b" {
            cmd.arg(":");
        }
        cmd.args(["-np", "1", "-x", &format!("LF_HOST_ID={host}"), "-x"]);
        cmd.arg(format!("LF_TEST_SIGNALS={}", signals.display()));
        cmd.arg(&exe).args(["--exact", name, "--nocapture"]);
    }
    mpirun::run_ranks(cmd, name, "two", &signals);
}
