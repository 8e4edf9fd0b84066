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

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use mpi_sys as ffi;

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, MemoryLocation};
use lava_flow::mpi::{Communicator, MpiWorld};

use crate::oneway::{one_way, Stream};
use crate::options::{human, parse_size};
use crate::pingpong::{percentiles, read_all, Percentiles};
use crate::table::{comment, mb_s, us};

/// This process's rank, for messages; -1 before the join.
static RANK: AtomicI32 = AtomicI32::new(-1);

const TAG_LATENCY: c_int = 1;
const TAG_BANDWIDTH: c_int = 2;
const TAG_ACK: c_int = 3;
/// Default bandwidth window (messages in flight), as OSU's `osu_bw`.
const WINDOW: usize = 64;
/// The most bytes a bandwidth window holds in flight; larger sizes get fewer messages.
const WINDOW_BYTES: usize = 128 << 20;
/// The latency target for small messages: lava-flow's p50 at most this much above raw MPI's.
const SMALL_DIFF_TARGET_NS: f64 = 500.0;
/// Sizes up to this have the latency target.
const SMALL_MAX: usize = 1 << 10;
/// Sizes from this have the bandwidth target.
const LARGE_MIN: usize = 64 << 10;
/// The bandwidth target: lava-flow at least this fraction of raw MPI.
const BW_RATIO_TARGET: f64 = 0.95;

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

#[derive(Clone, Debug)]
struct Options {
    quick: bool,
    json: bool,
    sizes: Vec<usize>,
    window: usize,
    rounds: usize,
    iters: Option<usize>,
    touch: bool,
    /// Skip the GPU row even where both ranks have a GPU.
    no_gpu: bool,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        quick: false,
        json: false,
        sizes: vec![],
        window: WINDOW,
        rounds: 0,
        iters: None,
        touch: true,
        no_gpu: false,
    };
    let mut i = 0;
    let value = |i: &mut usize| -> String {
        *i += 1;
        args.get(*i).cloned().unwrap_or_else(|| die("option needs a value"))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--mpi" => {}
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--untouched" => o.touch = false,
            "--no-gpu" => o.no_gpu = true,
            "--sizes" => o.sizes = value(&mut i).split(',').map(parse_size).collect(),
            "--window" => o.window = value(&mut i).parse().unwrap_or_else(|_| die("bad --window")),
            "--rounds" => o.rounds = value(&mut i).parse().unwrap_or_else(|_| die("bad --rounds")),
            "--iters" => o.iters = Some(value(&mut i).parse().unwrap_or_else(|_| die("bad --iters"))),
            "-h" | "--help" => {
                println!(
                    "usage: mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [OPTIONS] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [OPTIONS]\n\
                     options: [--quick] [--json] [--sizes LIST] [--window W] [--rounds N] [--iters N] [--untouched] [--no-gpu]"
                );
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other} (with --mpi: --quick, --json, --sizes, --window, --rounds, --iters, --untouched)")),
        }
        i += 1;
    }
    if o.sizes.is_empty() {
        o.sizes = vec![8, 64, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
    }
    if let Some(&bad) = o.sizes.iter().find(|&&s| s == 0 || s > i32::MAX as usize) {
        die(&format!("size {bad} is out of range (1 byte to 2 GiB - 1)"));
    }
    if o.window == 0 {
        die("--window must be at least 1");
    }
    if o.rounds == 0 {
        o.rounds = if o.quick { 2 } else { 3 };
    }
    o
}

/// Ping-pong iterations for `size`: a fixed count for small messages, a byte budget for
/// large ones.
fn latency_iters(o: &Options, size: usize) -> usize {
    if let Some(n) = o.iters {
        return n.max(1);
    }
    let (base, least, budget) = if o.quick { (1_000, 10, 64usize << 20) } else { (10_000, 20, 1usize << 30) };
    (budget / size).clamp(least, base)
}

/// The bandwidth window and iteration count (windows timed) for `size`.
fn bandwidth_shape(o: &Options, size: usize) -> (usize, usize) {
    let window = o.window.min((WINDOW_BYTES / size).max(1));
    let (max, budget) = if o.quick { (200, 256usize << 20) } else { (2_000, 2usize << 30) };
    (window, (budget / (size * window)).clamp(3, max))
}

// ----- raw MPI -----------------------------------------------------------------------------

/// A duplicate of `MPI_COMM_WORLD` with `MPI_ERRORS_RETURN`, so that every failure comes back
/// as a return code (checked) instead of the world's default abort.
struct Comm {
    comm: ffi::MPI_Comm,
    peer: c_int,
}

impl Comm {
    fn dup_world(peer: c_int) -> Comm {
        // SAFETY: reading extern statics that rsmpi's C shim initialises.
        let (world, mut comm) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_COMM_NULL) };
        // SAFETY: MPI is initialised (by the join); `comm` is valid storage for the handle.
        check(unsafe { ffi::MPI_Comm_dup(world, &mut comm) }, "MPI_Comm_dup(MPI_COMM_WORLD)");
        // SAFETY: a live communicator; ERRORS_RETURN is a predefined handler.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler");
        Comm { comm, peer }
    }

    fn send(&self, buf: &[u8], tag: c_int) {
        // SAFETY: `buf` holds `buf.len()` bytes (checked to fit an int by the options).
        let rc = unsafe {
            ffi::MPI_Send(buf.as_ptr().cast(), buf.len() as c_int, ffi::RSMPI_UINT8_T, self.peer, tag, self.comm)
        };
        check(rc, "MPI_Send");
    }

    fn recv(&self, buf: &mut [u8], tag: c_int) {
        // SAFETY: `buf` has room for `buf.len()` bytes; the status is ignored.
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                buf.len() as c_int,
                ffi::RSMPI_UINT8_T,
                self.peer,
                tag,
                self.comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        check(rc, "MPI_Recv");
    }

    /// # Safety
    /// `buf` must stay alive and unwritten until the request completes.
    unsafe fn isend(&self, buf: &[u8], tag: c_int) -> ffi::MPI_Request {
        let mut request = ffi::RSMPI_REQUEST_NULL;
        let rc = ffi::MPI_Isend(
            buf.as_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            self.peer,
            tag,
            self.comm,
            &mut request,
        );
        check(rc, "MPI_Isend");
        request
    }

    /// # Safety
    /// `buf` must stay alive and untouched until the request completes.
    unsafe fn irecv(&self, buf: &mut [u8], tag: c_int) -> ffi::MPI_Request {
        let mut request = ffi::RSMPI_REQUEST_NULL;
        let rc = ffi::MPI_Irecv(
            buf.as_mut_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            self.peer,
            tag,
            self.comm,
            &mut request,
        );
        check(rc, "MPI_Irecv");
        request
    }

    fn wait(&self, request: &mut ffi::MPI_Request) {
        // SAFETY: a request from isend/irecv (or the null request); the status is ignored.
        check(unsafe { ffi::MPI_Wait(request, ffi::RSMPI_STATUS_IGNORE) }, "MPI_Wait");
    }

    fn wait_all(&self, requests: &mut [ffi::MPI_Request]) {
        // SAFETY: requests from isend/irecv; the statuses are ignored.
        let rc =
            unsafe { ffi::MPI_Waitall(requests.len() as c_int, requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) };
        check(rc, "MPI_Waitall");
    }

    fn barrier(&self) {
        // SAFETY: a live communicator.
        check(unsafe { ffi::MPI_Barrier(self.comm) }, "MPI_Barrier");
    }

    /// Rank 0's value, on every rank.
    fn broadcast_u64(&self, value: u64) -> u64 {
        let mut v = value;
        // SAFETY: one 8-byte value in place.
        let rc = unsafe { ffi::MPI_Bcast((&mut v as *mut u64).cast::<c_void>(), 1, ffi::RSMPI_UINT64_T, 0, self.comm) };
        check(rc, "MPI_Bcast");
        v
    }

    fn send_text(&self, text: &str, tag: c_int) {
        self.send(&(text.len() as u64).to_le_bytes(), tag);
        self.send(text.as_bytes(), tag);
    }

    fn recv_text(&self, tag: c_int) -> String {
        let mut len = [0u8; 8];
        self.recv(&mut len, tag);
        let len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(0).min(1 << 20);
        let mut text = vec![0u8; len];
        self.recv(&mut text, tag);
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Every rank's flag, in rank order.
    fn all_gather_flag(&self, flag: bool) -> Vec<bool> {
        let mine: i32 = flag.into();
        let mut all = vec![0i32; 2];
        // SAFETY: one int sent; room for one int from each of the two ranks.
        let rc = unsafe {
            ffi::MPI_Allgather(
                (&mine as *const i32).cast(),
                1,
                ffi::RSMPI_INT32_T,
                all.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_INT32_T,
                self.comm,
            )
        };
        check(rc, "MPI_Allgather");
        all.into_iter().map(|f| f != 0).collect()
    }

    fn free(mut self) {
        // SAFETY: a communicator this code duplicated and has not freed.
        check(unsafe { ffi::MPI_Comm_free(&mut self.comm) }, "MPI_Comm_free");
    }
}

/// What MPI says it is (its first line).
fn mpi_library_version() -> String {
    // SAFETY: reading an extern static initialised by rsmpi's C shim.
    let max = unsafe { ffi::RSMPI_MAX_LIBRARY_VERSION_STRING }.max(1) as usize;
    let mut text = vec![0u8; max + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING bytes, as the call requires.
    check(unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr().cast(), &mut len) }, "MPI_Get_library_version");
    let text = String::from_utf8_lossy(&text[..(len.max(0) as usize).min(text.len())]).into_owned();
    text.lines().next().unwrap_or("").trim_end_matches(['\0', ',']).trim().to_owned()
}

/// Memory for the raw halves, grown as sizes grow and reused across rounds.
struct RawBuffers {
    bytes: Vec<u8>,
}

impl RawBuffers {
    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.bytes.len() < len {
            self.bytes = vec![0u8; len];
        }
        &mut self.bytes[..len]
    }
}

fn raw_latency(
    comm: &Comm,
    bufs: &mut RawBuffers,
    ping: bool,
    size: usize,
    iters: usize,
    touch: bool,
) -> Option<Percentiles> {
    let buf = bufs.get(size);
    let warm = (iters / 10).max(1);
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..warm + iters {
        let v = i as u8;
        if ping {
            let t = Instant::now();
            if touch {
                buf.fill(v);
            }
            comm.send(buf, TAG_LATENCY);
            comm.recv(buf, TAG_LATENCY);
            if touch {
                read_all(buf);
            }
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            comm.recv(buf, TAG_LATENCY);
            if touch {
                read_all(buf);
                buf.fill(v);
            }
            comm.send(buf, TAG_LATENCY);
        }
    }
    ping.then(|| percentiles(rtts))
}

/// Bytes per second, one direction: `window` messages in flight per iteration, then an ack.
fn raw_bandwidth(
    comm: &Comm,
    bufs: &mut RawBuffers,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    touch: bool,
) -> Option<f64> {
    let area = bufs.get(size * window);
    // SAFETY: reading an extern static initialised by rsmpi's C shim.
    let mut requests = vec![unsafe { ffi::RSMPI_REQUEST_NULL }; window];
    let mut ack = [0u8; 4];
    let mut start = Instant::now();
    // The first iteration is a warm-up (it also faults the buffers in).
    for it in 0..iters + 1 {
        if it == 1 {
            start = Instant::now();
        }
        if ping {
            for (w, chunk) in area.chunks_mut(size).enumerate() {
                if touch {
                    chunk.fill(w as u8);
                }
                // SAFETY: each chunk is sent once per window and not written again until the
                // wait below completes its request.
                requests[w] = unsafe { comm.isend(chunk, TAG_BANDWIDTH) };
            }
            comm.wait_all(&mut requests);
            comm.recv(&mut ack, TAG_ACK);
        } else {
            for (w, chunk) in area.chunks_mut(size).enumerate() {
                // SAFETY: each chunk receives one message per window and is read only after
                // its request completes below.
                requests[w] = unsafe { comm.irecv(chunk, TAG_BANDWIDTH) };
            }
            if touch {
                // In order, reading each message as it completes, as the channel's receiver does.
                for (w, chunk) in area.chunks(size).enumerate() {
                    comm.wait(&mut requests[w]);
                    read_all(chunk);
                }
            } else {
                comm.wait_all(&mut requests);
            }
            comm.send(&ack, TAG_ACK);
        }
    }
    ping.then(|| (iters * window * size) as f64 / start.elapsed().as_secs_f64())
}

// ----- lava-flow ---------------------------------------------------------------------------

struct Ends {
    tx: Producer,
    rx: Consumer,
}

/// Rank 0 produces on `<tag>-a2b` and consumes `<tag>-b2a`, rank 1 the reverse; each creates its
/// producer first.
fn open(context: &Context, world: &MpiWorld, tag: &str, ping: bool, config: &ChannelConfig) -> Result<Ends, String> {
    let other = if ping { 1 } else { 0 };
    let mine = world.me().location().clone();
    let peer = world.peer(other).map_err(|e| e.to_string())?.location().clone();
    let (a2b, b2a) = (format!("{tag}-a2b"), format!("{tag}-b2a"));
    let producer =
        |name: &str| Producer::create(context, name, &mine, &peer, config).map_err(|e| format!("producer {name}: {e}"));
    let consumer =
        |name: &str| Consumer::create(context, name, &mine, &peer, config).map_err(|e| format!("consumer {name}: {e}"));
    if ping {
        let tx = producer(&a2b)?;
        let rx = consumer(&b2a)?;
        Ok(Ends { tx, rx })
    } else {
        let rx = consumer(&a2b)?;
        let tx = producer(&b2a)?;
        Ok(Ends { tx, rx })
    }
}

/// Dies on a channel failure in the middle of a measurement: the peer would wait forever.
fn lf<T>(r: lava_flow::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| die(&format!("lava-flow {what} failed: {e}")))
}

fn lf_send(ends: &mut Ends, size: usize, v: u8, touch: bool) {
    let mut loan = lf(ends.tx.loan(size, None), "loan");
    if touch {
        loan.as_mut_slice().fill(v);
    }
    lf(loan.publish(), "publish");
}

fn lf_recv(ends: &mut Ends, touch: bool) {
    let m = lf(ends.rx.recv(), "recv");
    if touch {
        read_all(&m);
    } else {
        std::hint::black_box(m.len());
    }
}

fn lf_latency(ends: &mut Ends, ping: bool, size: usize, iters: usize, touch: bool) -> Option<Percentiles> {
    let warm = (iters / 10).max(1);
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..warm + iters {
        let v = i as u8;
        if ping {
            let t = Instant::now();
            lf_send(ends, size, v, touch);
            lf_recv(ends, touch);
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            lf_recv(ends, touch);
            lf_send(ends, size, v, touch);
        }
    }
    ping.then(|| percentiles(rtts))
}

fn lf_bandwidth(ends: &mut Ends, ping: bool, size: usize, window: usize, iters: usize, touch: bool) -> Option<f64> {
    windowed(ends, ping, size, window, iters, touch, |e, w| lf_send(e, size, w as u8, touch))
}

/// One direction: the ping side sends `window` messages with `send`, the pong side receives
/// them and answers with a small ack; B/s on the ping side, after one round of warm-up.
fn windowed(
    ends: &mut Ends,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    touch: bool,
    send: impl FnMut(&mut Ends, usize),
) -> Option<f64> {
    one_way(&mut EndsStream { ends, touch, send }, ping, size, window, iters)
}

/// A stream through `ends` whose messages `send` makes; the ack is a 4-byte send.
struct EndsStream<'a, F> {
    ends: &'a mut Ends,
    touch: bool,
    send: F,
}

impl<F: FnMut(&mut Ends, usize)> Stream for EndsStream<'_, F> {
    fn send(&mut self, w: usize) {
        (self.send)(self.ends, w);
    }

    fn wait_ack(&mut self) {
        lf_recv(self.ends, false);
    }

    fn recv(&mut self) {
        lf_recv(self.ends, self.touch);
    }

    fn ack(&mut self) {
        lf(self.ends.tx.send(&[0u8; 4]), "send of the ack");
    }
}

/// GPU buffers over the channel (staged through host memory: the consumer gets host bytes and
/// reads them): the one-way rate of 64 MiB messages, window 2, against the slower of its two
/// halves measured alone in the same job: the producer's GPU-to-host copy, and raw MPI at that
/// size. Both ranks must agree to run it; `None` where either has no GPU (rates in B/s).
fn gpu_row(
    world: &MpiWorld,
    comm: &Comm,
    tag: &str,
    ping: bool,
    bufs: &mut RawBuffers,
    o: &Options,
) -> Option<(f64, f64, f64)> {
    const SIZE: usize = 64 << 20;
    const WINDOW: usize = 2;
    let iters = if o.quick { 2 } else { 6 };
    let context = Context::new(ContextConfig::default()).ok().filter(|c| c.gpu_unavailable_reason().is_none());
    if comm.all_gather_flag(context.is_none()).contains(&true) {
        return None;
    }
    let context = context.expect("checked on both ranks");
    let config = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        pool_size: SIZE * (WINDOW + 1),
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    let mut ends = open(&context, world, &format!("{tag}-gpu"), ping, &config).unwrap_or_else(|e| die(&e));
    let gpu = lf(context.allocate(SIZE, MemoryLocation::GpuDeviceLocal), "GPU allocation");
    let mut host = vec![0u8; SIZE];
    let mut d2h = 0f64;
    if ping {
        host.fill(3);
        lf(gpu.write_at(0, &host), "GPU write");
        for _ in 0..3 {
            let t = Instant::now();
            lf(gpu.read_at(0, &mut host), "GPU read");
            d2h = d2h.max(SIZE as f64 / t.elapsed().as_secs_f64());
        }
    }
    comm.barrier();
    let raw = raw_bandwidth(comm, bufs, ping, SIZE, WINDOW, iters, o.touch);
    comm.barrier();
    let rate = windowed(&mut ends, ping, SIZE, WINDOW, iters, o.touch, |e, _| {
        lf(e.tx.send_buffer(&gpu, 0, SIZE), "send of a GPU buffer");
    });
    comm.barrier();
    rate.map(|rate| (rate, d2h, raw.unwrap_or(f64::NAN)))
}

// ----- driver ------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
struct Row {
    size: usize,
    lat_iters: usize,
    raw_lat: Vec<Percentiles>,
    lf_lat: Vec<Percentiles>,
    window: usize,
    bw_iters: usize,
    raw_bw: Vec<f64>,
    lf_bw: Vec<f64>,
    /// Why lava-flow has no figures for this size, if it has none.
    lf_skipped: Option<String>,
}

/// The round with the lowest p50.
fn best_latency(rounds: &[Percentiles]) -> Option<Percentiles> {
    rounds.iter().copied().min_by(|a, b| a.p50.total_cmp(&b.p50))
}

fn best_bandwidth(rounds: &[f64]) -> Option<f64> {
    rounds.iter().copied().max_by(f64::total_cmp)
}

impl Row {
    /// lava-flow's p50 minus raw MPI's, in ns.
    fn diff_ns(&self) -> Option<f64> {
        Some(best_latency(&self.lf_lat)?.p50 - best_latency(&self.raw_lat)?.p50)
    }

    fn bw_ratio(&self) -> Option<f64> {
        Some(best_bandwidth(&self.lf_bw)? / best_bandwidth(&self.raw_bw)?)
    }

    /// (latency target met, bandwidth target met), each `None` where this size has no target
    /// or lava-flow no figure.
    fn verdicts(&self) -> (Option<bool>, Option<bool>) {
        let lat = (self.size <= SMALL_MAX).then(|| self.diff_ns().map(|d| d <= SMALL_DIFF_TARGET_NS)).flatten();
        let bw = (self.size >= LARGE_MIN).then(|| self.bw_ratio().map(|r| r >= BW_RATIO_TARGET)).flatten();
        (lat, bw)
    }
}

/// What the report says about the lava-flow half.
struct LavaFlowStatus {
    /// The transport's names and reason, when the channels opened.
    transport: Option<(String, String)>,
    /// Why the channels did not open.
    error: Option<String>,
}

impl LavaFlowStatus {
    fn is_mpi(&self) -> bool {
        self.transport.as_ref().is_some_and(|(names, _)| names.split('+').any(|n| n == "mpi"))
    }
}

struct Report {
    machine: crate::machine::Machine,
    library: String,
    thread_level: String,
    locations: Vec<String>,
    lava_flow: LavaFlowStatus,
    rows: Vec<Row>,
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
        let slower = d2h.min(raw);
        comment("");
        comment("GPU buffers, 64 MiB, staged through host memory, against the slower of its halves measured alone; target >= 0.9x");
        let mut t = crate::table::Table::new(&[
            "Size",
            "Staged (MB/s)",
            "GPU-to-host (MB/s)",
            "Raw MPI (MB/s)",
            "x slower",
            "<Target",
        ]);
        t.row(vec![
            (64usize << 20).to_string(), // gpu_row's size
            mb_s(Some(rate)),
            mb_s(Some(d2h)),
            mb_s(Some(raw)),
            format!("{:.2}", rate / slower),
            verdict(Some(rate / slower >= 0.9)).to_owned(),
        ]);
        t.print();
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

// ----- output ------------------------------------------------------------------------------

fn what_is_measured(o: &Options) -> &'static str {
    if o.touch {
        "the sender writes every byte of each message, the receiver reads every byte"
    } else {
        "payloads untouched (plain OSU pattern)"
    }
}

fn not_mpi_warning(names: &str) -> String {
    format!(
        "WARNING: the lava-flow channels use {names}, not mpi: the lava-flow rows do not measure lava-flow over MPI. \
         Make the ranks different hosts as lava-flow sees them: mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi : -np 1 -x LF_HOST_ID=b lf-bench --mpi"
    )
}

/// The configuration lines (without `# `).
fn head_lines(r: &Report, o: &Options, world: &MpiWorld) -> Vec<String> {
    let mut l = vec!["lf-bench --mpi: lava-flow channels against raw MPI between two ranks".to_owned()];
    l.extend(r.machine.lines());
    l.push(format!("MPI: {} ({})", r.library, r.thread_level));
    l.extend(r.locations.iter().cloned());
    if !world.topology_report().is_empty() {
        l.extend(world.topology_report().lines().map(|d| format!("discovery: {d}")));
    }
    match (&r.lava_flow.transport, &r.lava_flow.error) {
        (Some((names, reason)), _) => {
            l.push(format!("lava-flow transport: {names} ({reason})"));
            if !r.lava_flow.is_mpi() {
                l.push(not_mpi_warning(names));
            }
        }
        (None, Some(error)) => {
            l.push("lava-flow channels: NOT CREATED:".to_owned());
            l.extend(error.lines().map(|e| format!("  {e}")));
            l.push("(only the raw MPI rows are measured)".to_owned());
        }
        (None, None) => {}
    }
    l.push("lava-flow channels: ChannelConfig::default() with busy-poll, a 30 s rendezvous timeout and a pool for the largest window".to_owned());
    l.push(format!(
        "Sizes: {}; {}; best of {} rounds, raw and lava-flow alternated",
        o.sizes.iter().map(|&s| human(s)).collect::<Vec<_>>().join(","),
        what_is_measured(o),
        o.rounds
    ));
    l.push(format!(
        "Bandwidth: windows of {} messages (at most {} in flight), then a 4-byte ack; MB/s = 10^6 bytes per second",
        o.window,
        human(WINDOW_BYTES)
    ));
    l.push(format!(
        "Targets: sizes <= {} lava-flow p50 <= raw p50 + {:.1} us; sizes >= {} lava-flow bandwidth >= {:.2}x raw",
        human(SMALL_MAX),
        SMALL_DIFF_TARGET_NS / 1e3,
        human(LARGE_MIN),
        BW_RATIO_TARGET
    ));
    l
}

/// The table's columns: (name, width); every row is printed with the same widths as it is
/// measured.
const COLUMNS: [(&str, usize); 15] = [
    ("Size", 10),
    ("Iters", 6),
    ("Raw p50 (us)", 12),
    ("Raw p99 (us)", 12),
    ("Raw p99.9 (us)", 14),
    ("lava-flow p50 (us)", 18),
    ("lava-flow p99 (us)", 18),
    ("lava-flow p99.9 (us)", 20),
    ("Diff p50 (us)", 13),
    ("Target", 6),
    ("Window", 6),
    ("BW iters", 8),
    ("Raw (MB/s)", 12),
    ("lava-flow (MB/s)", 16),
    ("Ratio", 6),
];
/// The last column, after [`COLUMNS`]: the bandwidth target's verdict.
const LAST: &str = "Target";

fn line(cells: &[String]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS.iter()).enumerate() {
        if i == 0 {
            out.push_str(&format!("{cell:<width$}"));
        } else if i == 9 {
            out.push_str(&format!("  {cell:<width$}"));
        } else {
            out.push_str(&format!("  {cell:>width$}"));
        }
    }
    if let Some(last) = cells.get(COLUMNS.len()) {
        out.push_str(&format!("  {last}"));
    }
    out.trim_end().to_owned()
}

fn print_head(r: &Report, o: &Options, world: &MpiWorld) {
    for l in head_lines(r, o, world) {
        comment(&l);
    }
    comment("");
    comment("Latency: half round trips, best round's percentiles; Diff = lava-flow p50 - raw p50. Bandwidth: best round; Ratio = lava-flow / raw");
    let mut names: Vec<String> = COLUMNS.iter().map(|(n, _)| (*n).to_owned()).collect();
    names[0] = "# Size".to_owned();
    names.push(LAST.to_owned());
    println!("{}", line(&names));
}

fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "",
    }
}

fn print_row(row: &Row) {
    let raw = best_latency(&row.raw_lat);
    let lfl = best_latency(&row.lf_lat);
    let (lat_ok, bw_ok) = row.verdicts();
    println!(
        "{}",
        line(&[
            row.size.to_string(),
            row.lat_iters.to_string(),
            us(raw.map(|p| p.p50)),
            us(raw.map(|p| p.p99)),
            us(raw.map(|p| p.p999)),
            us(lfl.map(|p| p.p50)),
            us(lfl.map(|p| p.p99)),
            us(lfl.map(|p| p.p999)),
            row.diff_ns().map_or("-".to_owned(), |d| format!("{:+.3}", d / 1e3)),
            verdict(lat_ok).to_owned(),
            row.window.to_string(),
            row.bw_iters.to_string(),
            mb_s(best_bandwidth(&row.raw_bw)),
            mb_s(best_bandwidth(&row.lf_bw)),
            row.bw_ratio().map_or("-".to_owned(), |r| format!("{r:.3}")),
            verdict(bw_ok).to_owned(),
        ])
    );
    if let Some(why) = &row.lf_skipped {
        comment(&format!("{}: lava-flow skipped: {why}", human(row.size)));
    }
}

fn print_tail(r: &Report, o: &Options, complete: bool, elapsed: Duration) {
    comment("");
    let verdicts: Vec<bool> = r
        .rows
        .iter()
        .flat_map(|row| {
            let (a, b) = row.verdicts();
            [a, b].into_iter().flatten()
        })
        .collect();
    if !verdicts.is_empty() {
        comment(&format!("Targets: {} of {} met", verdicts.iter().filter(|v| **v).count(), verdicts.len()));
    }
    if let Some((names, _)) = &r.lava_flow.transport {
        if !r.lava_flow.is_mpi() {
            comment(&not_mpi_warning(names));
        }
    }
    if r.lava_flow.error.is_some() {
        comment("lava-flow half not run: the channels were not created (see above)");
    }
    comment(&format!(
        "{} in {:.1} s{}",
        if complete { "complete" } else { "INCOMPLETE" },
        elapsed.as_secs_f64(),
        if o.quick { " (--quick)" } else { "" }
    ));
}

fn print_json(r: &Report, o: &Options, complete: bool, elapsed: Duration, head: Vec<String>) {
    use serde_json::json;
    let lat = |rounds: &[Percentiles]| match best_latency(rounds) {
        Some(best) => json!({
            "p50_ns": best.p50, "p99_ns": best.p99, "p999_ns": best.p999,
            "rounds": rounds.iter().map(|p| json!({"p50_ns": p.p50, "p99_ns": p.p99})).collect::<Vec<_>>(),
        }),
        None => serde_json::Value::Null,
    };
    let bw = |rounds: &[f64]| match best_bandwidth(rounds) {
        Some(best) => json!({"bytes_per_s": best, "mb_per_s": best / 1e6, "rounds_bytes_per_s": rounds}),
        None => serde_json::Value::Null,
    };
    let doc = json!({
        "config": {"machine": r.machine.to_json(), "text": head},
        "mode": "mpi",
        "mpi_library": r.library,
        "thread_level": r.thread_level,
        "locations": r.locations,
        "touch": o.touch,
        "quick": o.quick,
        "rounds": o.rounds,
        "lava_flow": {
            "transport": r.lava_flow.transport.as_ref().map(|(n, _)| n.clone()),
            "reason": r.lava_flow.transport.as_ref().map(|(_, why)| why.clone()),
            "is_mpi": r.lava_flow.is_mpi(),
            "warning": r.lava_flow.transport.as_ref().filter(|_| !r.lava_flow.is_mpi()).map(|(n, _)| not_mpi_warning(n)),
            "error": r.lava_flow.error,
        },
        "targets": {
            "small_max_size": SMALL_MAX, "small_p50_diff_max_ns": SMALL_DIFF_TARGET_NS,
            "large_min_size": LARGE_MIN, "large_bandwidth_ratio_min": BW_RATIO_TARGET,
        },
        "rows": r.rows.iter().map(|row| {
            let (lat_ok, bw_ok) = row.verdicts();
            json!({
                "size": row.size,
                "latency": {
                    "iters": row.lat_iters,
                    "raw": lat(&row.raw_lat),
                    "lava_flow": lat(&row.lf_lat),
                    "diff_p50_ns": row.diff_ns(),
                    "target_met": lat_ok,
                },
                "bandwidth": {
                    "window": row.window,
                    "iters": row.bw_iters,
                    "raw": bw(&row.raw_bw),
                    "lava_flow": bw(&row.lf_bw),
                    "ratio": row.bw_ratio(),
                    "target_met": bw_ok,
                },
                "lava_flow_skipped": row.lf_skipped,
            })
        }).collect::<Vec<_>>(),
        "complete": complete,
        "elapsed_s": elapsed.as_secs_f64(),
    });
    println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
}
