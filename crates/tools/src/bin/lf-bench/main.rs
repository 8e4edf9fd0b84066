//! lf-bench: lava-flow's channels between two processes, beside the machine's floors and the
//! peers a user would compare them with (iceoryx2, Open MPI), all measured in one run.
//!
//! ```text
//! lf-bench [--quick] [--json] [--json-out FILE] [--plot DIR] [--sizes 8,64,1K,64M] [--iters N]
//!          [--modes capi,busy,block] [--no-peers] [--iceoryx2 PATH] [--mpi-pingpong PATH]
//!          [--bw-sizes 1M,16M] [--window W] [--payloads zero-copy,touch,buffer,buf-touch,copy]
//!          [--no-pin]
//! lf-bench --plot DIR --from-json FILE
//! ```
//!
//! The report reads as OSU's micro-benchmarks do (`table.rs`): the configuration first (the
//! machine, the build, the pinning, the channels' configuration, sizes, iterations, the peers
//! found and their versions; `config.rs`), each line starting with `# `, then per case a
//! table with a `# Size` column and the latency percentiles, the bandwidth, the floor and the
//! ratios, and the targets with ok / MISSED. `--json` prints the same as one JSON object
//! (`config` included), `--json-out FILE` writes it beside the text, and `--plot DIR` writes
//! latency-vs-size and bandwidth-vs-size charts as SVG and PNG (`plot.rs`); with
//! `--from-json FILE` it charts a saved result without measuring.
//!
//! - `capi`, the headline (`headline.rs`, `capi.rs`, `peers.rs`, `report.rs`): ping-pong
//!   through the C API with the default channel configuration (busy-poll): copy sends, loans
//!   and buffer sends (with the completion wait before a buffer is rewritten), untouched for
//!   the small sizes and touched from 64 B (the sender copies the payload from a private
//!   buffer, the receiver reads every byte); iceoryx2 and an Open MPI ping-pong for the same
//!   sizes; a floor probed right before and right after every case (spinning on a cache line
//!   for untouched messages, a raw copy-and-read ping-pong for touched ones); the blocking
//!   8 B wake-up against an eventfd ping-pong; the requirement's targets with ok / MISSED.
//! - `busy`, `block` (`rustapi.rs`, secondary): the Rust API's rows per payload handling,
//!   one-direction bandwidth, the registry lookup of copy sends, and the floors measured once.
//!
//! The two processes (fork) are pinned to cores 0 and 1 unless `--no-pin`; the peers run on
//! the same two cores while lf-bench's own processes wait.
//!
//! `lf-bench --gpu [--quick] [--json]` measures GPU buffers through channels instead: see
//! `gpu.rs`.
//!
//! `lf-bench --fan-in [--quick] [--json] [--producers 1,2,4,8] [--size 64]` measures many
//! producers to one consumer (a fan-in channel through the C API, the pair channel beside it,
//! iceoryx2 and Open MPI with the same protocol): see `fanin/`.
//!
//! `lf-bench --fan-out [--quick] [--json] [--consumers 1,2,4,8] [--size 1M]` measures one
//! producer to many consumers (1 MiB by reference on a fan-out channel through the C API, the
//! pair channel beside it, iceoryx2 with N subscribers; 64 B copies): see `fanout/`.
//! `lf-bench --fan-out --gpu [--quick] [--consumers 4] [--sizes 4K,1M]` measures a GPU buffer
//! fanned out by reference against the pair channel's GPU hand-off: see `fanout/gpu.rs`.
//!
//! `mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [--quick] [--json] : -np 1 -x LF_HOST_ID=b
//! lf-bench --mpi [...]` measures lava-flow channels between two MPI ranks against raw MPI
//! between the same ranks (built with the cargo feature `mpi`): see `mpi/`.

mod capi;
mod config;
mod fanin;
mod fanout;
mod floors;
#[cfg(feature = "vulkan")]
mod gpu;
mod headline;
mod machine;
#[cfg(feature = "mpi")]
mod mpi;
mod oneway;
mod options;
mod peers;
mod pingpong;
mod plot;
mod report;
mod rustapi;
mod spread;
mod table;

use config::Config;
use floors::{CopyFloorMem, EventFds, Rings, TouchFloor};
use options::{die, options, Benchmarks, Options};
use peers::Peers;
use pingpong::SpinLine;

/// One process's share of the run: which side it is, the floors' shared memory (mapped before
/// the fork) with this process's own counts, and the application's private bytes that
/// touched messages are copied from (made after the fork, so each process has its own).
pub struct Side {
    pub ping: bool,
    pub spin: SpinLine,
    pub efd: EventFds,
    pub touch: TouchFloor,
    pub rings: Rings,
    pub copy: CopyFloorMem,
    pub private: Vec<u8>,
}

impl Side {
    /// The shared mappings, before the fork.
    fn map(o: &Options) -> Side {
        let touch_max = o.touch_sizes().max().unwrap_or(0);
        Side {
            ping: true,
            spin: SpinLine::map(),
            efd: EventFds::new(),
            touch: TouchFloor::map(touch_max),
            rings: Rings::map(),
            copy: CopyFloorMem::map(rustapi::pool_for(o)),
            private: Vec::new(),
        }
    }

    /// This process's private source bytes: a pattern (not zeros, which the kernel could
    /// share) as large as the largest message.
    fn make_private(&mut self, o: &Options) {
        let len = o.max_size().max(o.bw_sizes.iter().copied().max().unwrap_or(0));
        self.private = (0..len).map(|i| (i * 31 + 7) as u8).collect();
    }
}

/// What ping prints.
struct Results {
    headline: Option<headline::Headline>,
    rust: Option<rustapi::Results>,
}

fn run(o: &Options, side: &mut Side, peers: &Peers, tag: &str) -> Option<Results> {
    let headline = if o.has_mode("capi") { headline::run(o, side, peers, tag) } else { None };
    let rust = if o.has_mode("busy") || o.has_mode("block") { rustapi::run(o, side, tag) } else { None };
    side.ping.then_some(Results { headline, rust })
}

fn to_json(r: &Results, o: &Options, config: &Config) -> serde_json::Value {
    serde_json::json!({
        "config": config.to_json(o),
        "pinned": o.pin,
        "quick": o.quick,
        "command": machine::command(),
        "unix_time_s": config.machine.unix_time_s,
        "headline": r.headline.as_ref().map(report::to_json),
        "rust_api": r.rust.as_ref().map(rustapi::to_json),
    })
}

fn print(r: &Results, o: &Options, config: &Config) {
    let doc = to_json(r, o, config);
    let pretty = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
    if let Some(path) = &o.json_out {
        std::fs::write(path, format!("{pretty}\n"))
            .unwrap_or_else(|e| die(&format!("writing {}: {e}", path.display())));
    }
    if o.json {
        println!("{pretty}");
    } else {
        config.print(o);
        if let Some(h) = &r.headline {
            report::print_text(h);
            println!();
        }
        if let Some(rust) = &r.rust {
            rustapi::print_text(rust);
            println!();
        }
    }
    if let Some(dir) = &o.plot {
        plot_into(dir, plot::write(&doc, dir), o.json);
    }
}

/// Reports the charts written (on stderr under `--json`, which keeps stdout one JSON object),
/// or dies saying why there are none.
fn plot_into(dir: &std::path::Path, written: Result<Vec<std::path::PathBuf>, String>, json: bool) {
    let files = written.unwrap_or_else(|e| die(&format!("--plot {}: {e}", dir.display())));
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let line = format!("# Charts: {}", names.join(" "));
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// `--gpu`, `--mpi`, `--fan-in` and `--fan-out` are benchmarks of their own, each with its own
/// command line.
fn other_benchmarks() {
    let chosen = Benchmarks::chosen();
    if chosen.fan_out && chosen.gpu {
        #[cfg(feature = "vulkan")]
        {
            fanout::gpu::main();
            std::process::exit(0);
        }
        #[cfg(not(feature = "vulkan"))]
        die("this lf-bench was built without the cargo feature `vulkan`");
    }
    if chosen.fan_out {
        fanout::main();
        std::process::exit(0);
    }
    if chosen.fan_in {
        fanin::main();
        std::process::exit(0);
    }
    if chosen.gpu {
        #[cfg(feature = "vulkan")]
        {
            gpu::main();
            std::process::exit(0);
        }
        #[cfg(not(feature = "vulkan"))]
        die("this lf-bench was built without the cargo feature `vulkan`");
    }
    if chosen.mpi {
        #[cfg(feature = "mpi")]
        {
            mpi::main();
            std::process::exit(0);
        }
        #[cfg(not(feature = "mpi"))]
        die("this lf-bench was built without MPI support: build it with `cargo build --release --features mpi --bin lf-bench` (needs the MPI headers and libclang)");
    }
}

/// A private runtime dir for the channels' sockets unless the caller chose one; returns it
/// when it was made here.
fn runtime_dir(tag: &str) -> Option<std::path::PathBuf> {
    if std::env::var_os("LF_RUNTIME_DIR").is_some() {
        return None;
    }
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("{tag}-rt"));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("runtime dir");
    std::env::set_var("LF_RUNTIME_DIR", &dir);
    Some(dir)
}

fn main() {
    other_benchmarks();
    let o = options();
    if let (Some(file), Some(dir)) = (&o.from_json, &o.plot) {
        plot_into(dir, plot::from_json(file, dir), false);
        return;
    }
    let tag = format!("lfb{}", std::process::id());
    let made_dir = runtime_dir(&tag);
    let peers = Peers::find(&o);
    let config = Config::probe(&o, &peers);
    let mut side = Side::map(&o);
    // SAFETY: no other threads exist yet; the child only runs this function's code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    side.ping = child > 0;
    if !side.ping {
        // SAFETY: prctl with integer arguments: the child dies with its parent.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    if config.pinned {
        pingpong::pin_to(if side.ping { 0 } else { 1 });
    }
    side.make_private(&o);
    let results = run(&o, &mut side, &peers, &tag);
    if !side.ping {
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: waiting for the child we forked.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if let Some(dir) = made_dir {
        let _ = std::fs::remove_dir(&dir);
    }
    print(&results.expect("ping side has results"), &o, &config);
}
