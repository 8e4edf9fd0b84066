//! `lf-bench --fan-in`: many producers to one consumer, each in a process of its own, through
//! lava-flow's C API (a fan-in channel, and the pair channel for one producer as the reference)
//! beside iceoryx2 (N publishers on one service) and Open MPI (N ranks to rank 0 with
//! `MPI_ANY_SOURCE`), all in one run and with the same protocol (`gather.rs`).
//!
//! ```text
//! lf-bench --fan-in [--quick] [--json] [--json-out FILE] [--size 64] [--producers 1,2,4,8]
//!                   [--warm S] [--window S] [--no-pin] [--no-peers]
//!                   [--iceoryx2-fanin PATH] [--mpi-fanin PATH]
//! ```
//!
//! Every case is at saturation: the producers send as fast as they can for a warm-up and a
//! timed window, the consumer reads every message. Per case: the consumer's time per message
//! (p50 and p99 over blocks of 64 consecutive messages: with messages always waiting, the
//! consumer's inter-arrival time, so its cost per message), the aggregate throughput, and the
//! fairness (the slowest producer's messages in the window over the fastest's). The consumer is
//! pinned to core 0 and the producers share the other cores in turn: on a 2-core machine all
//! of them run on core 1 (oversubscribed), and the report says so.
//!
//! lf-bench's main process only forks and reads results: each case's consumer and producers
//! are processes of their own, forked before any of them opens lava-flow.
//!
//! `--over mpi` (built with the `mpi` feature) is the fan-in across host identities instead,
//! run under `mpirun`: rank 0 the consumer, the other ranks its producers (`mpi/fanin.rs`).

pub mod gather;
pub mod lf;
mod peers;
mod report;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};
use lava_flow_c_api::channel_config::lf_channel_kind;
use lava_flow_tools::cli::{self, LIST};
use serde_json::Value;

use crate::machine::Machine;
use crate::options::die;
use crate::peers::Peer;
use gather::{cores_allowed, producer_core, Control, MIN_SIZE};
use peers::FanInPeers;

/// The most producers a case takes: the default `max_peers` of a fan-in.
const MAX_PRODUCERS: usize = 8;

/// lf-bench --fan-in: many producers to one consumer, each in a process of its own, through
/// the C API (a fan-in channel, the pair channel for one producer as the reference), beside
/// iceoryx2 and Open MPI with the same protocol, at saturation.
///
/// Under mpirun, `--over mpi` measures the fan-in across host identities instead (rank 0
/// consumes; see benchmarks/run-fan-in-mpi.sh).
#[derive(Parser, Clone, Debug)]
#[command(
    name = "lf-bench",
    override_usage = "lf-bench --fan-in [OPTIONS]
       mpirun -np 1 -x LF_HOST_ID=a lf-bench --fan-in --over mpi [OPTIONS]
            : -np N -x LF_HOST_ID=b lf-bench --fan-in --over mpi [the same OPTIONS]"
)]
pub struct FanInOptions {
    /// Measure many producers to one consumer (this benchmark)
    #[arg(long = "fan-in", required = true)]
    _fan_in: bool,
    /// A short warm-up and window (0.1 s and 0.5 s)
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON to this file (the text still goes to stdout)
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Bytes per message: at least the producer's counter and index, at most the default pool
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = cli::size)]
    pub size: usize,
    /// Producer counts, one case each, like 1,2,4,8 (1 to 8: a fan-in's default max_peers)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "1,2,4,8", value_parser = cli::count_up_to(MAX_PRODUCERS))]
    pub producers: Vec<usize>,
    /// Seconds of warm-up before each case's timed window (0.1 with --quick)
    #[arg(long, value_name = "S", value_parser = cli::seconds, default_value = "0.3",
          default_value_if("quick", "true", Some("0.1")))]
    pub warm: Duration,
    /// Seconds of each case's timed window (0.5 with --quick)
    #[arg(long, value_name = "S", value_parser = cli::seconds, default_value = "2",
          default_value_if("quick", "true", Some("0.5")))]
    pub window: Duration,
    /// Leave the processes unpinned (default: the consumer on core 0, the producers on the others)
    #[arg(long = "no-pin", action = ArgAction::SetFalse)]
    pub pin: bool,
    /// Measure lava-flow alone: no iceoryx2 or Open MPI rows
    #[arg(long = "no-peers", action = ArgAction::SetFalse)]
    pub peers: bool,
    /// The iceoryx2 fan-in to run beside lava-flow (default: found beside lf-bench)
    #[arg(long = "iceoryx2-fanin", value_name = "PATH")]
    pub iceoryx2: Option<PathBuf>,
    /// The Open MPI fan-in to run beside lava-flow (default: found beside lf-bench)
    #[arg(long = "mpi-fanin", value_name = "PATH")]
    pub mpi: Option<PathBuf>,
    /// The producers are MPI ranks of another host identity (run under mpirun)
    #[arg(long, value_name = "CARRIER", value_enum)]
    pub over: Option<Over>,
}

/// What a fan-in can be measured over alone.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// MPI ranks: rank 0 consumes, the others produce
    Mpi,
}

fn options() -> FanInOptions {
    let o = cli::parse::<FanInOptions>();
    if o.size < MIN_SIZE || o.size > crate::capi::default_pool() {
        cli::refuse::<FanInOptions>(format!(
            "--size {} is out of range: a fan-in message carries its producer's counter and index ({MIN_SIZE} bytes) and fits the default pool",
            o.size
        ));
    }
    o
}

/// One row: who, how many producers, and its tally (`gather::Tally::json`) or why none.
pub struct Row {
    pub who: String,
    pub producers: usize,
    pub tally: Result<Value, String>,
}

/// Forks a process that runs `f` (pinned to `core` when given) and exits.
pub fn fork_into(core: Option<usize>, f: impl FnOnce()) -> libc::pid_t {
    // SAFETY: this process has no other threads (it never opens lava-flow; peers are run and
    // waited for); the child runs `f` and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die(&format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: prctl with integer arguments: the child dies with lf-bench.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        if let Some(core) = core {
            crate::pingpong::pin_to(core);
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
        // SAFETY: _exit ends the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    pid
}

/// A lava-flow case: a consumer and `producers` producers on channel `name` of `kind`.
fn run_lf(o: &FanInOptions, control: &Control, name: &str, kind: lf_channel_kind, producers: usize) -> Row {
    control.reset();
    let cores = cores_allowed();
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors; checked.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe");
    // SAFETY: two new descriptors that nothing else owns.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (size, warm, window) = (o.size, o.warm, o.window);
    let mut pids = vec![fork_into(o.pin.then_some(0), || {
        let line = lf::consumer(control, name, kind, producers, size, warm, window);
        let mut out = std::fs::File::from(write_end.try_clone().expect("dup"));
        std::io::Write::write_all(&mut out, line.as_bytes()).expect("writing the result");
    })];
    for i in 0..producers {
        let core = o.pin.then(|| producer_core(i, cores));
        pids.push(fork_into(core, || lf::producer(control, name, kind, i as u64, size)));
    }
    drop(write_end);
    let mut text = String::new();
    let _ = std::fs::File::from(read_end).read_to_string(&mut text);
    let mut failed = Vec::new();
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for a child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            failed.push(format!("process {pid} ended with status {status:#x}"));
        }
    }
    let who = if kind == lf_channel_kind::LF_CHANNEL_PAIR { "lava-flow pair" } else { "lava-flow fan-in" };
    let tally = match serde_json::from_str::<Value>(&text) {
        Ok(v) if failed.is_empty() => Ok(v),
        Ok(_) => Err(failed.join("; ")),
        Err(_) => Err(format!("no result ({}); see stderr", failed.join("; "))),
    };
    Row { who: who.to_owned(), producers, tally }
}

/// The whole run: lava-flow's rows, then each peer's, for every producer count.
pub fn main() {
    let o = options();
    if o.over == Some(Over::Mpi) {
        #[cfg(feature = "mpi")]
        {
            crate::mpi::fanin::main(&o);
            return;
        }
        #[cfg(not(feature = "mpi"))]
        die("this lf-bench was built without MPI support: build it with `cargo build --release --features mpi --bin lf-bench` (needs the MPI headers and libclang)");
    }
    let machine = Machine::probe();
    let peers = FanInPeers::find(&o);
    let tag = format!("lfb{}", std::process::id());
    let made_dir = crate::runtime_dir(&tag);
    let control = Control::map();
    let mut rows = Vec::new();
    rows.push(run_lf(&o, &control, &format!("{tag}-pair"), lf_channel_kind::LF_CHANNEL_PAIR, 1));
    for &n in &o.producers {
        rows.push(run_lf(&o, &control, &format!("{tag}-fanin{n}"), lf_channel_kind::LF_CHANNEL_FAN_IN, n));
    }
    for peer in Peer::ALL {
        if peers.program(peer).is_err() {
            continue;
        }
        for &n in &o.producers {
            rows.push(Row { who: peer.name().to_owned(), producers: n, tally: peers.run(peer, n, &o) });
        }
    }
    if let Some(dir) = made_dir {
        let _ = std::fs::remove_dir(&dir);
    }
    report::print(&o, &machine, &peers, &rows);
}
