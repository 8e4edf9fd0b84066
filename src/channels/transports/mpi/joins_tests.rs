//! The MPI side of a fan-out, under `mpirun` (the test starts it, and itself again in each
//! rank): rank 0 a fan-out's producer on host a, ranks 1 to 3 its consumers on host b. Two
//! consumers join a fan-out of two and each receives every message, in order; a third is
//! refused, naming `max_peers`; a consumer's second join from the same process is refused;
//! after the producer closes, each consumer sees its end after the last message.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::*;
use crate::channels::transport::{ConsumerSession, ProducerTransport, TransportInfo};
use crate::mpi::{Communicator, MpiWorld};

const MESSAGES: u64 = 2000;

fn payload(seq: u64) -> Vec<u8> {
    let len = 16 + (seq as usize * 13) % 400;
    let mut bytes = vec![(seq % 251) as u8; len];
    bytes[..8].copy_from_slice(&seq.to_le_bytes());
    bytes
}

fn config() -> ChannelConfig {
    ChannelConfig {
        kind: ChannelKind::FanOut,
        max_peers: 2,
        capacity: 64,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    }
}

fn deadline() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(60))
}

/// Sends `bytes` on an out, waiting for room.
fn send(out: &mut MpiProducer, bytes: &[u8]) -> u64 {
    out.wait_for_room(bytes.len(), deadline()).unwrap();
    let loan = out.try_loan(bytes.len()).unwrap();
    // SAFETY: the loan lends `bytes.len()` writable bytes at its pointer until it is published.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), loan.ptr, bytes.len());
        out.publish(loan, bytes.len()).unwrap()
    }
}

/// The slots of a fan-out of `n`, as the core's slot table would hand them out.
fn slot_table(n: usize) -> ClaimSlot {
    let taken = std::sync::Arc::new(Mutex::new(vec![false; n]));
    Box::new(move |slot| {
        let mut table = taken.lock();
        if table[slot as usize] {
            return Ok(None);
        }
        table[slot as usize] = true;
        struct Held(std::sync::Arc<Mutex<Vec<bool>>>, usize);
        impl Drop for Held {
            fn drop(&mut self) {
                self.0.lock()[self.1] = false;
            }
        }
        Ok(Some(Box::new(Held(std::sync::Arc::clone(&taken), slot as usize)) as Box<dyn std::any::Any + Send + Sync>))
    })
}

#[test]
fn consumers_join_a_fan_out_over_mpi() {
    under_mpirun("channels::transports::mpi::joins::tests::consumers_join_a_fan_out_over_mpi", 4, |world| {
        let name = "fan-out-joins";
        let dir = signal_dir();
        let (attached, refused) = (dir.join("attached"), dir.join("refused"));
        if world.rank() == 0 {
            let here = crate::mpi::here(None).unwrap();
            let mut joins =
                MpiJoins::new(name, TransportInfo::new(Vec::new()), &config(), here, slot_table(2)).unwrap();
            let mut outs = Vec::new();
            let until = deadline().unwrap();
            // The third consumer's join is answered (refused) while the producer looks.
            while outs.len() < 2 || !refused.exists() {
                if let Some(joined) = joins.try_join().unwrap() {
                    outs.push(joined);
                    if outs.len() == 2 {
                        std::fs::write(&attached, b"").unwrap();
                    }
                }
                assert!(Instant::now() < until, "{} consumers joined", outs.len());
                std::thread::sleep(Duration::from_micros(100));
            }
            let mut slots: Vec<u32> = outs.iter().map(|j| j.slot).collect();
            slots.sort_unstable();
            assert_eq!(slots, [0, 1]);
            for seq in 0..MESSAGES {
                for out in outs.iter_mut() {
                    assert_eq!(send(&mut out.producer, &payload(seq)), seq);
                }
            }
            for out in outs.iter_mut() {
                out.producer.wait_completed(MESSAGES - 1, deadline()).unwrap();
            }
            // Closing the outs: each consumer sees its end after the last message.
            drop(outs);
        } else if world.rank() < 3 {
            let to = crate::mpi::endpoint(world.peer(0).unwrap().location().mpi.unwrap()).unwrap();
            let mut session = super::join(name, &config(), to).unwrap();
            let again = crate::mpi::endpoint(world.peer(0).unwrap().location().mpi.unwrap()).unwrap();
            match super::join(name, &config(), again) {
                Err(Error::InvalidState(m)) => assert!(m.contains("one consumer per MPI rank on a fan-out"), "{m}"),
                other => panic!("a second consumer in one process: {:?}", other.map(|_| ())),
            }
            for seq in 0..MESSAGES {
                let view = session.recv(deadline()).unwrap();
                assert_eq!(view.token, seq);
                // SAFETY: the view's bytes stay valid until it is released below.
                let bytes = unsafe { std::slice::from_raw_parts(view.ptr, view.len) };
                assert_eq!(bytes, &payload(seq)[..], "message {seq}");
                // SAFETY: received from this session, released once, not used after.
                unsafe { session.release(&view).unwrap() };
            }
            match session.recv(deadline()) {
                Err(Error::PeerGone(_)) => {}
                other => panic!("after the last message: {:?}", other.map(|v| v.token)),
            }
        } else {
            await_file(&attached);
            let to = crate::mpi::endpoint(world.peer(0).unwrap().location().mpi.unwrap()).unwrap();
            match super::join(name, &config(), to) {
                Err(Error::InvalidState(m)) => {
                    assert!(m.contains("fan-out channel \"fan-out-joins\" is full: it takes max_peers = 2"), "{m}")
                }
                other => panic!("a third consumer of a fan-out of two: {:?}", other.map(|_| ())),
            }
            std::fs::write(&refused, b"").unwrap();
        }
    });
}

fn signal_dir() -> PathBuf {
    std::env::var_os("LF_TEST_SIGNALS").expect("under_mpirun sets LF_TEST_SIGNALS").into()
}

fn await_file(path: &std::path::Path) {
    let until = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(Instant::now() < until, "{} never came", path.display());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `test` as the test named `name` on `ranks` ranks under mpirun, rank 0 on host a and
/// the others on host b; skipped where mpirun cannot start (unless `LF_REQUIRE_MPI` is set).
fn under_mpirun(name: &str, ranks: u32, test: impl FnOnce(&MpiWorld)) {
    if std::env::var_os("OMPI_COMM_WORLD_RANK").is_some() {
        let world = MpiWorld::join(Communicator::World, None).unwrap();
        assert_eq!(world.size(), ranks);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&world))).is_err() {
            // SAFETY: MPI is initialised; aborting the job is what a failed rank wants.
            unsafe { mpi_sys::MPI_Abort(mpi_sys::RSMPI_COMM_WORLD, 1) };
        }
        return;
    }
    let exe = std::env::current_exe().expect("the test executable");
    let signals = std::env::temp_dir().join(format!("lf-mpi-joins-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&signals);
    std::fs::create_dir_all(&signals).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]);
    for (at, (host, n)) in [("a", 1), ("b", ranks - 1)].into_iter().enumerate() {
        if at > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", &n.to_string(), "-x", &format!("LF_HOST_ID={host}"), "-x"]);
        cmd.arg(format!("LF_TEST_SIGNALS={}", signals.display()));
        cmd.arg(&exe).args(["--exact", name, "--nocapture", "--test-threads", "1"]);
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            assert!(std::env::var_os("LF_REQUIRE_MPI").is_none(), "LF_REQUIRE_MPI is set but mpirun cannot start: {e}");
            eprintln!("skipped: mpirun cannot start ({e})");
            return;
        }
    };
    let _ = std::fs::remove_dir_all(&signals);
    assert!(status.success(), "the ranks of {name} under mpirun: {status}");
}
