//! `lf-bench --fan-in --over mpi`: a fan-in channel whose producers are MPI ranks, run under
//! `mpirun` with the ranks on the host identities `LF_HOST_ID` gives them: rank 0 the consumer,
//! every other rank a producer, each over the carrier of its scope to rank 0 (MPI from another
//! host identity, shared memory from rank 0's). The protocol and the tally are those of the
//! other fan-in rows (`fanin/gather.rs`), so that the row compares with
//! `benchmarks/mpi_fanin.c` (raw MPI, `MPI_ANY_SOURCE`) run with the same ranks and transport:
//! `benchmarks/run-fan-in-mpi.sh` runs both.
//!
//! ```text
//! mpirun -np 1 -x LF_HOST_ID=a lf-bench --fan-in --over mpi [--size 64] [--warm S] [--window S] [--no-pin] [--json] \
//!      : -np N -x LF_HOST_ID=b lf-bench --fan-in --over mpi [the same options]
//! ```
//!
//! The producers attach, then meet the consumer in a barrier and send (loans, the payload
//! written in place) until rank 0 tells each to stop (a message on the application's
//! communicator, looked for every 256 messages); rank 0 receives (busy-poll), reads every
//! byte, checks each producer's counter, and drains until every producer's end. Rank 0 prints
//! the slots' routes and the row (text), or one JSON line (`--json`).

use std::ffi::c_int;
use std::time::{Duration, Instant};

use mpi_sys as ffi;
use serde_json::{json, Value};

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, Producer, WaitStrategy};
use lava_flow::mpi::{Communicator, MpiWorld};
use lava_flow::Error;

use super::{check, die};
use crate::fanin::gather::{cores_allowed, producer_core, write_payload, Tally};
use crate::fanin::FanInOptions;

/// The tag of the consumer's stop notices on `MPI_COMM_WORLD` (lava-flow's channels use a
/// communicator of their own).
const TAG_STOP: c_int = 11;

/// How many messages a producer sends between looks for the stop notice.
const STOP_EVERY: u64 = 256;

pub(crate) fn main(o: &FanInOptions) {
    let world = MpiWorld::join(Communicator::World, None).unwrap_or_else(|e| die(&format!("joining MPI failed: {e}")));
    super::RANK.store(world.rank() as i32, std::sync::atomic::Ordering::Relaxed);
    let producers = world.size().saturating_sub(1);
    if producers == 0 || producers > lava_flow::channels::MAX_PEERS {
        die(&format!(
            "run with 2 to {} ranks (this job has {}): rank 0 is the consumer, the others its producers",
            lava_flow::channels::MAX_PEERS + 1,
            world.size()
        ));
    }
    let cores = cores_allowed();
    if o.pin {
        let core = if world.rank() == 0 { 0 } else { producer_core(world.rank() as usize - 1, cores) };
        crate::pingpong::pin_to(core);
    }
    let context = crate::rustapi::cpu_context();
    let config = ChannelConfig {
        kind: ChannelKind::FanIn,
        max_peers: producers,
        wait: WaitStrategy::BusyPoll,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    let name = format!("lfbfm{}", broadcast_u64(u64::from(std::process::id())));
    let me = world.me().location().clone();
    if world.rank() == 0 {
        let first = world.peer(1).expect("a producer").location().clone();
        let mut rx = Consumer::create(&context, &name, &me, &first, &config)
            .unwrap_or_else(|e| die(&format!("the fan-in's consumer: {e}")));
        // Receiving takes up the producers that attach; none sends before the barrier.
        let deadline = Instant::now() + Duration::from_secs(60);
        while rx.producers() < producers as usize {
            match rx.try_recv() {
                Err(Error::WouldBlock(_)) => std::hint::spin_loop(),
                other => die(&format!("before the start, no message was due: {other:?}")),
            }
            if Instant::now() >= deadline {
                die(&format!("{} of {producers} producers attached within 60 s", rx.producers()));
            }
        }
        let routes: Vec<Value> = rx
            .peers()
            .iter()
            .map(|p| json!({"slot": p.slot, "route": p.route, "rank": p.rank, "host": p.host, "pid": p.pid}))
            .collect();
        barrier();
        let mut tally = Tally::new(producers as usize, o.warm, o.window);
        tally.start();
        loop {
            let m = rx.recv().unwrap_or_else(|e| die(&format!("recv: {e}")));
            if !tally.take(m.producer() as usize, &m) {
                break;
            }
        }
        for rank in 1..=producers {
            let stop: c_int = 1;
            // SAFETY: one int of valid memory; MPI runs at MULTIPLE (lava-flow initialised it).
            let rc = unsafe {
                ffi::MPI_Send(
                    (&stop as *const c_int).cast(),
                    1,
                    ffi::RSMPI_INT32_T,
                    rank as c_int,
                    TAG_STOP,
                    world_comm(),
                )
            };
            check(rc, "MPI_Send of a stop notice");
        }
        // Drained, so that no producer stays blocked on a full channel; each one's end comes
        // after its last message.
        let mut gone = 0;
        while gone < producers {
            match rx.recv() {
                Ok(_) => {}
                Err(Error::PeerGone(_)) => gone += 1,
                Err(e) => die(&format!("draining: {e}")),
            }
        }
        let mut row: Value = serde_json::from_str(&tally.json("lava-flow fan-in over mpi", o.size)).expect("a tally");
        row["routes"] = Value::Array(routes.clone());
        row["transport"] = Value::String(rx.transport().reason.clone());
        if o.json {
            println!("{row}");
        } else {
            print_text(&row, &routes);
        }
        drop(rx);
    } else {
        let to = world.peer(0).expect("rank 0").location().clone();
        let mut tx = Producer::create(&context, &name, &me, &to, &config)
            .unwrap_or_else(|e| die(&format!("the fan-in's producer: {e}")));
        let index = u64::from(world.rank() - 1);
        let private: Vec<u8> = (0..o.size).map(|i| (i * 31 + 7) as u8).collect();
        barrier();
        let mut counter = 0u64;
        loop {
            if counter % STOP_EVERY == 0 && stop_notice() {
                break;
            }
            let mut loan = tx.loan(o.size, None).unwrap_or_else(|e| die(&format!("loan: {e}")));
            write_payload(loan.as_mut_slice(), counter, index, &private);
            loan.publish().unwrap_or_else(|e| die(&format!("publish: {e}")));
            counter += 1;
        }
        drop(tx);
    }
    // Every channel is closed before MPI goes.
    barrier();
    drop(context);
    drop(world);
}

fn print_text(row: &Value, routes: &[Value]) {
    println!("lf-bench --fan-in --over mpi: {} producers to rank 0, {} B messages", row["producers"], row["size"]);
    println!("transport: {}", row["transport"].as_str().unwrap_or(""));
    for r in routes {
        println!(
            "  slot {}: {} from {}",
            r["slot"],
            r["route"].as_str().unwrap_or("-"),
            match r["rank"].as_i64() {
                Some(rank) => format!("MPI rank {rank} on {}", r["host"].as_str().unwrap_or("?")),
                None => format!("pid {} on this host", r["pid"]),
            }
        );
    }
    let per: Vec<u64> =
        row["per_producer"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
    let fairness = match (per.iter().min(), per.iter().max()) {
        (Some(&lo), Some(&hi)) if hi > 0 => lo as f64 / hi as f64,
        _ => f64::NAN,
    };
    println!(
        "{}: {:.0} msgs/s, {:.1} ns/msg p50, {:.1} p99, fairness {fairness:.2}, errors {}",
        row["who"].as_str().unwrap_or(""),
        row["msgs_per_s"].as_f64().unwrap_or(f64::NAN),
        row["per_msg_p50_ns"].as_f64().unwrap_or(f64::NAN),
        row["per_msg_p99_ns"].as_f64().unwrap_or(f64::NAN),
        row["errors"]
    );
    println!("{row}");
}

fn world_comm() -> ffi::MPI_Comm {
    // SAFETY: reading an extern static that rsmpi's C shim initialises.
    unsafe { ffi::RSMPI_COMM_WORLD }
}

fn barrier() {
    // SAFETY: MPI is initialised; COMM_WORLD is predefined.
    check(unsafe { ffi::MPI_Barrier(world_comm()) }, "MPI_Barrier");
}

/// Rank 0's value, on every rank.
fn broadcast_u64(value: u64) -> u64 {
    let mut v = value;
    // SAFETY: one 8-byte value in place.
    let rc = unsafe { ffi::MPI_Bcast((&mut v as *mut u64).cast(), 1, ffi::RSMPI_UINT64_T, 0, world_comm()) };
    check(rc, "MPI_Bcast");
    v
}

/// Whether rank 0's stop notice has come (then it is received).
fn stop_notice() -> bool {
    let mut found: c_int = 0;
    // SAFETY: MPI_Status is plain data that MPI fills in.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; COMM_WORLD is predefined.
    check(unsafe { ffi::MPI_Iprobe(0, TAG_STOP, world_comm(), &mut found, &mut status) }, "MPI_Iprobe");
    if found == 0 {
        return false;
    }
    let mut stop: c_int = 0;
    // SAFETY: one int of valid memory to receive into.
    let rc = unsafe {
        ffi::MPI_Recv(
            (&mut stop as *mut c_int).cast(),
            1,
            ffi::RSMPI_INT32_T,
            0,
            TAG_STOP,
            world_comm(),
            ffi::RSMPI_STATUS_IGNORE,
        )
    };
    check(rc, "MPI_Recv of the stop notice");
    true
}
