//! `lf-bench --mpi`: lava-flow channels between two MPI ranks, next to raw MPI between the
//! same two ranks, measured in the same job.
//!
//! ```text
//! mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [--quick] [--json] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [...]
//!        [--sizes 8,64,1K,64K,1M,16M,64M] [--window 64] [--rounds N] [--iters N] [--untouched] [--no-gpu]
//! ```
//!
//! Rank 0 pings, rank 1 pongs. Per message size, alternated (raw, lava-flow, raw, lava-flow,
//! ...; the best of the rounds is reported for each, so that noise treats both alike):
//!
//! - **raw MPI** (the OSU `osu_latency` / `osu_bw` pattern, through `mpi_sys` on a duplicate of
//!   `MPI_COMM_WORLD`): `MPI_Send`/`MPI_Recv` ping-pong, half round trip p50/p99; bandwidth as a
//!   window of `MPI_Isend`s (the receiver: `MPI_Irecv`s) completed together, then a 4-byte ack.
//! - **lava-flow**: two channels (rank 0 to rank 1 and back), busy-poll, between the locations
//!   MPI discovery found (`MpiWorld::join`). The same ping-pong through loans, and the same
//!   windowed bandwidth (the producer waits for pool room when the window is out).
//!
//! Both halves do the same work per message: the sender writes every byte of the payload
//! before sending it and the receiver reads every byte after receiving it (`--untouched`:
//! neither does, the plain OSU pattern on both sides). Bandwidth windows are 64 messages, fewer
//! for large sizes (at most 128 MiB in flight), the same for both halves.
//!
//! Where both ranks have a GPU (`--no-gpu`: skip it), a last row sends 64 MiB GPU buffers
//! through a channel (staged through host memory piece by piece) and compares the rate with
//! the slower of its halves measured alone in the same job: the producer's GPU-to-host copy,
//! and raw MPI at 64 MiB.
//!
//! lava-flow's channels go over MPI only when the ranks are different hosts as lava-flow sees
//! them (`LF_HOST_ID`); the report names the transport the channels chose and warns when it is
//! not mpi. When the channels cannot be created, the error is printed and the raw MPI rows
//! still are; the exit status is then 1.
//!
//! Its parts: `options` (the command line and the shape of each measurement), `raw` (the raw
//! MPI half, and the communicator both halves share), `channels` (the lava-flow half, and the
//! GPU row) and `report` (the rows, their targets, and the text and JSON reports); this module
//! joins MPI and runs them.

mod channels;
pub(crate) mod fanin;
mod options;
mod raw;
mod report;

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use mpi_sys as ffi;

use lava_flow::channels::{ChannelConfig, WaitStrategy};
use lava_flow::mpi::{Communicator, MpiWorld};

use self::channels::{gpu_row, lf_bandwidth, lf_latency, open};
use self::options::{bandwidth_shape, latency_iters, options};
use self::raw::{mpi_library_version, raw_bandwidth, raw_latency, Comm, RawBuffers, TAG_ACK};
use self::report::{
    head_lines, print_gpu_row, print_head, print_json, print_row, print_tail, LavaFlowStatus, Report, Row,
};

/// This process's rank, for messages; -1 before the join.
static RANK: AtomicI32 = AtomicI32::new(-1);

fn die(msg: &str) -> ! {
    let rank = RANK.load(Ordering::Relaxed);
    if rank >= 0 {
        eprintln!("lf-bench --mpi (rank {rank}): {msg}");
    } else {
        eprintln!("lf-bench --mpi: {msg}");
    }
    if mpi_active() {
        // The peer may be waiting in a call that will never complete: end the whole job.
        // SAFETY: MPI is initialised and not finalized.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 2) };
    }
    std::process::exit(2)
}

/// Whether MPI is initialised and not finalized (a failing query counts as not).
fn mpi_active() -> bool {
    let (mut initialised, mut finalized): (c_int, c_int) = (0, 0);
    // SAFETY: both may be called at any time; valid out-pointers.
    unsafe {
        ffi::MPI_Initialized(&mut initialised) == ffi::MPI_SUCCESS as c_int
            && initialised != 0
            && ffi::MPI_Finalized(&mut finalized) == ffi::MPI_SUCCESS as c_int
            && finalized == 0
    }
}

/// Dies unless `rc` is `MPI_SUCCESS`, with MPI's own words for the failure.
fn check(rc: c_int, call: &str) {
    if rc == ffi::MPI_SUCCESS as c_int {
        return;
    }
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds at least MPI_MAX_ERROR_STRING bytes; any code may be described.
    let described =
        unsafe { ffi::MPI_Error_string(rc, text.as_mut_ptr().cast(), &mut len) } == ffi::MPI_SUCCESS as c_int;
    let what = if described {
        String::from_utf8_lossy(&text[..(len.max(0) as usize).min(text.len())]).into_owned()
    } else {
        format!("MPI error code {rc}")
    };
    die(&format!("{call} failed: {what}"));
}

pub(crate) fn main() {
    let o = options();
    let machine = crate::machine::Machine::probe();
    let world = MpiWorld::join(Communicator::World, None).unwrap_or_else(|e| die(&format!("joining MPI failed: {e}")));
    RANK.store(world.rank() as i32, Ordering::Relaxed);
    if world.size() != 2 {
        if world.rank() == 0 {
            eprintln!(
                "lf-bench --mpi: run with exactly 2 ranks (this job has {}), e.g. mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi : -np 1 -x LF_HOST_ID=b lf-bench --mpi",
                world.size()
            );
        }
        drop(world);
        std::process::exit(2);
    }
    let ping = world.rank() == 0;
    let comm = Comm::dup_world(if ping { 1 } else { 0 });
    let tag = format!("lfbm{}", comm.broadcast_u64(u64::from(std::process::id())));
    let started = Instant::now();

    // The lava-flow half: opened once, before any measurement; both ranks agree on whether it
    // runs, so that neither waits for a peer that gave up.
    let context = crate::rustapi::cpu_context();
    let largest = o.sizes.iter().copied().max().unwrap_or(64);
    let in_flight = o.sizes.iter().map(|&s| bandwidth_shape(&o, s).0 * s).max().unwrap_or(0);
    let defaults = ChannelConfig::default();
    let config = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        // The pool is also the largest message: room for the largest size and a full window
        // of the largest in flight, with slack for the pool's own rounding.
        pool_size: defaults.pool_size.max(largest.max(in_flight) / 4 * 5),
        // Starting two ranks side by side on a busy machine can be slow.
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..defaults
    };
    let opened = open(&context, &world, &tag, ping, &config);
    let failed = comm.all_gather_flag(opened.is_err());
    let mut lava_flow = LavaFlowStatus { transport: None, error: None };
    let mut ends = None;
    if failed.contains(&true) {
        // Rank 1's own words travel to rank 0: where only one rank failed, the other's error
        // (a rendezvous time-out) is only the echo of it.
        let mine = opened.as_ref().err().cloned().unwrap_or_default();
        let theirs = if failed[1] {
            if ping {
                comm.recv_text(TAG_ACK)
            } else {
                comm.send_text(&mine, TAG_ACK);
                String::new()
            }
        } else {
            String::new()
        };
        let mut errors = Vec::new();
        if failed[0] {
            errors.push(format!("rank 0: {}", if ping { &mine } else { "(see rank 0)" }));
        }
        if failed[1] {
            errors.push(format!("rank 1: {}", if ping { &theirs } else { &mine }));
        }
        lava_flow.error = Some(errors.join("\n"));
    } else if let Ok(e) = opened {
        let info = e.tx.transport();
        lava_flow.transport = Some((info.names(), info.reason.clone()));
        ends = Some(e);
    }

    let report_head = Report {
        machine,
        library: mpi_library_version(),
        thread_level: world.thread_level().to_string(),
        locations: world.peers().iter().map(|p| format!("rank {}: {}", p.rank(), p.location())).collect(),
        lava_flow,
        rows: Vec::new(),
    };
    if ping && !o.json {
        print_head(&report_head, &o, &world);
    }
    let mut report = report_head;

    let mut bufs = RawBuffers { bytes: Vec::new() };
    for &size in &o.sizes {
        let lat_iters = latency_iters(&o, size);
        let (window, bw_iters) = bandwidth_shape(&o, size);
        let mut row = Row { size, lat_iters, window, bw_iters, ..Row::default() };
        // Both ranks skip a size the channels cannot carry.
        let too_large = ends.as_ref().is_some_and(|e| size > e.tx.max_message_len());
        let run_lf = ends.is_some() && !comm.all_gather_flag(too_large).contains(&true);
        if ends.is_some() && !run_lf {
            row.lf_skipped = Some("larger than the channel's largest message".into());
        }
        comm.barrier();
        for _ in 0..o.rounds {
            row.raw_lat.extend(raw_latency(&comm, &mut bufs, ping, size, lat_iters, o.touch));
            if run_lf {
                let e = ends.as_mut().expect("channels are open");
                row.lf_lat.extend(lf_latency(e, ping, size, lat_iters, o.touch));
            }
        }
        comm.barrier();
        for _ in 0..o.rounds {
            row.raw_bw.extend(raw_bandwidth(&comm, &mut bufs, ping, size, window, bw_iters, o.touch));
            if run_lf {
                let e = ends.as_mut().expect("channels are open");
                row.lf_bw.extend(lf_bandwidth(e, ping, size, window, bw_iters, o.touch));
            }
        }
        if ping && !o.json {
            print_row(&row);
        }
        report.rows.push(row);
    }
    let gpu = if ends.is_some() && !o.no_gpu { gpu_row(&world, &comm, &tag, ping, &mut bufs, &o) } else { None };
    if let (true, false, Some((rate, d2h, raw))) = (ping, o.json, gpu) {
        print_gpu_row(rate, d2h, raw);
    }
    // Neither rank closes its channels while the other still uses them.
    comm.barrier();
    let complete = ends.is_some() && report.rows.iter().all(|r| r.lf_skipped.is_none());
    if ping {
        if o.json {
            let head = head_lines(&report, &o, &world);
            print_json(&report, &o, complete, started.elapsed(), head);
        } else {
            print_tail(&report, &o, complete, started.elapsed());
        }
    }
    drop(ends);
    comm.free();
    drop(context);
    // Finalizes MPI (lava-flow initialised it).
    drop(world);
    std::process::exit(if complete { 0 } else { 1 });
}
