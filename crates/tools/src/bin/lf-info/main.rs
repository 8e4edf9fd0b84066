//! lf-info: what lava-flow can do on this machine, and why not where it cannot (like UCX's
//! `ucx_info` and iceoryx2's `iox2`).
//!
//! ```text
//! lf-info                 capabilities: each with available / unavailable, why, and how to fix it
//! lf-info -d              Vulkan devices: UUIDs, memory heaps and types, external memory, semaphores
//! lf-info -c              every LF_* environment variable: value, where it came from, default
//! lf-info -p PEER         the route a channel to PEER would take, and why
//! lf-info --channels      channels in the runtime directory, alive or dead: each one's kind and ends (a fan-in's producers by slot), with pids
//! lf-info --cleanup       removes what dead channels left there
//! lf-info --json ...      any of the above as one JSON object on stdout
//! ```
//!
//! Every answer comes from the library's own probes (a context opened as an application opens
//! it, allocations of each kind of memory, a channel between two threads, the semaphore
//! probe, MPI's join), so what lf-info says is what an application would get.

mod capabilities;
mod channels;
mod config;
mod devices;
mod peer;
mod text;

use clap::Parser;
use serde_json::{json, Map, Value};

/// What lava-flow can do on this machine, and why not where it cannot.
///
/// Without a view option, lf-info probes every capability (CPU memory kinds, Vulkan, memory
/// export and import, semaphore export, CUDA, channels, MPI) and says for each whether it is
/// available and, where it is not, why and how to fix it.
#[derive(Parser, Debug)]
#[command(name = "lf-info", version, max_term_width = 100)]
struct Args {
    /// List the Vulkan devices: name, type, deviceUUID, driverUUID, memory heaps and types,
    /// external memory handle types, semaphore support.
    #[arg(short = 'd', long)]
    devices: bool,

    /// List every LF_* environment variable lava-flow reads: its value now, where it came from
    /// (default or environment) and its default.
    #[arg(short = 'c', long)]
    config: bool,

    /// Say which transports a channel to PEER would take, and why. PEER is a location: a
    /// hostname, optionally with numa-node=N, device=N and host-id=ID (`node7`,
    /// `node7,host-id=rack1-7`), or FILE:NAME for process NAME of a config file.
    #[arg(short = 'p', long, value_name = "PEER")]
    peer: Option<String>,

    /// List the channels whose files are in the runtime directory, each alive or dead, with its
    /// kind (pair or fan-in) and each end's state and pid (a fan-in's producers by slot).
    #[arg(long)]
    channels: bool,

    /// Remove the files that dead channels left in the runtime directory (files of live
    /// channels are never touched), then list the channels.
    #[arg(long)]
    cleanup: bool,

    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,

    /// Do not probe MPI (lf-info otherwise joins MPI, initialising it as a singleton when not
    /// started by mpirun).
    #[arg(long)]
    no_mpi: bool,
}

/// The cargo features this lf-info was built with.
fn features() -> Vec<&'static str> {
    let mut features = Vec::new();
    if cfg!(feature = "vulkan") {
        features.push("vulkan");
    }
    if cfg!(feature = "mpi") {
        features.push("mpi");
    }
    features
}

/// Whether this build has MPI (channels to other hosts), and how that was decided: CMake's
/// LAVA_FLOW_MPI choice where CMake built it (cmake/LavaFlowMpi.cmake passes it to cargo),
/// else the cargo feature. lf-info is built with the library's features, so this is the
/// library's answer too.
fn mpi_build() -> (bool, String) {
    let built = cfg!(feature = "mpi");
    let how = match option_env!("LAVA_FLOW_MPI_CHOICE") {
        Some(choice) if !choice.is_empty() => choice.to_owned(),
        _ if built => "cargo feature `mpi`".to_owned(),
        _ => "cargo feature `mpi` off: cargo build --features mpi, or cmake -DLAVA_FLOW_MPI=ON \
              (CMake builds it in by itself where it finds MPI)"
            .to_owned(),
    };
    (built, how)
}

/// A failure that ends lf-info: said on stderr (and in the JSON), exit status 1.
#[derive(Debug)]
pub struct Failure(pub String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string())
    }
}

fn main() {
    // A reader that stops early (`lf-info | head`) ends lf-info as it ends other Unix tools,
    // rather than with a panic at the next print: lf-info writes to no socket or pipe but
    // its output, so it needs no SIGPIPE ignored (Rust's default).
    // SAFETY: sets a signal's disposition to the default, before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = Args::parse();
    let wants_default = !(args.devices || args.config || args.peer.is_some() || args.channels || args.cleanup);
    let mut out = Map::new();
    let (mpi_built, mpi_how) = mpi_build();
    out.insert(
        "lava_flow".into(),
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "features": features(),
            "mpi": { "built": mpi_built, "how": mpi_how },
        }),
    );
    let mut texts: Vec<String> = Vec::new();
    let mut failed = false;
    let mut record = |key: &str, result: Result<(Value, String), Failure>| match result {
        Ok((value, text)) => {
            out.insert(key.into(), value);
            texts.push(text);
        }
        Err(Failure(message)) => {
            failed = true;
            out.insert(key.into(), json!({ "error": message }));
            texts.push(format!("lf-info: {message}\n"));
        }
    };
    if wants_default {
        record("capabilities", Ok(capabilities::view(!args.no_mpi)));
    }
    if args.devices {
        record("devices", Ok(devices::view()));
    }
    if args.config {
        record("config", Ok(config::view()));
    }
    if let Some(spec) = &args.peer {
        record("peer", peer::view(spec));
    }
    if args.channels || args.cleanup {
        record("channels", channels::view(args.cleanup));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Object(out)).expect("JSON values serialise"));
        if failed {
            std::process::exit(1);
        }
        return;
    }
    let header = format!(
        "lava-flow {} (cargo features: {})\nmpi: {} ({mpi_how})\n",
        env!("CARGO_PKG_VERSION"),
        features().join(", "),
        if mpi_built { "built in" } else { "not built" },
    );
    print!("{header}");
    for text in &texts {
        if text.starts_with("lf-info: ") {
            eprint!("\n{text}");
        } else {
            print!("\n{text}");
        }
    }
    if failed {
        std::process::exit(1);
    }
}
