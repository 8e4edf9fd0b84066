//! The peers lf-bench measures beside lava-flow, in the same run and on the same two cores:
//! iceoryx2 (`iceoryx2-pingpong` from `benchmarks/peers`) and Open MPI
//! (`benchmarks/mpi_pingpong.c` under `mpirun`). Each runs one size at a time while
//! lf-bench's own two processes wait, the pong one asleep (see `EventFds::pause_pong`), and
//! prints a JSON line of half round trips that is read back here.
//!
//! Where a program is found: `--iceoryx2 PATH` / `--mpi-pingpong PATH`, else the environment
//! (`LF_BENCH_ICEORYX2`, `LF_BENCH_MPI_PINGPONG`), else next to lf-bench's own executable
//! (`iceoryx2-pingpong`, `mpi_pingpong`). A peer that is not found is skipped, and the report
//! says why.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::headline::Measured;
use crate::options::Options;
use crate::pingpong::Percentiles;

/// How long one peer run may take before it is killed (its whole process group).
const PEER_TIMEOUT_S: u32 = 180;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Iceoryx2,
    OpenMpi,
}

impl Peer {
    pub const ALL: [Peer; 2] = [Peer::Iceoryx2, Peer::OpenMpi];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Iceoryx2 => "iceoryx2",
            Peer::OpenMpi => "Open MPI",
        }
    }
}

/// The peer programs found (or why not), and what they need to start.
pub struct Peers {
    iceoryx2: Result<PathBuf, String>,
    mpi: Result<PathBuf, String>,
    /// The cores the two processes of a peer run on.
    cores: (usize, usize),
    /// lf-bench's CPU affinity before it pinned itself: a peer's processes start with it, so
    /// that mpirun can bind its ranks anywhere.
    affinity: libc::cpu_set_t,
}

/// The program at `option`, else `$env`, else `name` beside this executable; the error says
/// where it was looked for.
pub fn locate(option: &Option<PathBuf>, env: &str, name: &str) -> Result<PathBuf, String> {
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join(name)));
    let (path, how) = match (option, std::env::var_os(env)) {
        (Some(p), _) => (p.clone(), "given on the command line"),
        (None, Some(p)) => (PathBuf::from(p), env),
        (None, None) => match beside {
            Some(p) => (p, "beside lf-bench"),
            None => return Err(format!("not found (no path given, {env} unset)")),
        },
    };
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(format!("{} ({how}) is not an executable file", path.display()))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `program` found in `$PATH`.
pub fn in_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(program)).find(|p| is_executable(p))
}

fn current_affinity() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it (all zero on failure, which
    // `restore_affinity` then leaves alone).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        set
    }
}

impl Peers {
    /// Looks for the peers (call before lf-bench pins itself). None at all with `--no-peers`.
    pub fn find(o: &Options) -> Peers {
        let off = || Err("--no-peers was given".to_owned());
        let iceoryx2 = if o.peers { locate(&o.iceoryx2, "LF_BENCH_ICEORYX2", "iceoryx2-pingpong") } else { off() };
        let mpi = if !o.peers {
            off()
        } else if in_path("mpirun").is_none() {
            Err("mpirun is not in PATH".to_owned())
        } else {
            locate(&o.mpi_pingpong, "LF_BENCH_MPI_PINGPONG", "mpi_pingpong")
        };
        Peers { iceoryx2, mpi, cores: (0, 1), affinity: current_affinity() }
    }

    /// The program of `peer`, or why it is skipped.
    pub fn program(&self, peer: Peer) -> Result<&Path, &str> {
        let found = match peer {
            Peer::Iceoryx2 => &self.iceoryx2,
            Peer::OpenMpi => &self.mpi,
        };
        found.as_deref().map_err(String::as_str)
    }

    /// What the report says about `peer`: its program and version, or why it is skipped.
    pub fn describe(&self, peer: Peer) -> Value {
        match self.program(peer) {
            Ok(path) => json!({"peer": peer.name(), "found": true, "path": path, "version": version(peer, path)}),
            Err(why) => json!({"peer": peer.name(), "found": false, "why": why}),
        }
    }

    /// One size of `peer`: its half round trips and its own spinning-floor probes, or what
    /// went wrong.
    pub fn run(&self, peer: Peer, size: usize, touch: bool, iters: usize) -> Result<Measured, String> {
        let program = self.program(peer)?;
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=5", &PEER_TIMEOUT_S.to_string()]);
        match peer {
            Peer::Iceoryx2 => {
                cmd.arg(program).arg("--cores").arg(format!("{},{}", self.cores.0, self.cores.1));
            }
            Peer::OpenMpi => {
                cmd.args(["mpirun", "-np", "2", "--bind-to", "core", "--map-by", "core", "--mca", "btl", "self,vader"]);
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } == 0 {
                    cmd.arg("--allow-run-as-root")
                        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
                }
                cmd.arg(program);
            }
        }
        cmd.args(["--sizes", &size.to_string(), "--iters", &iters.to_string()]);
        if touch {
            cmd.arg("--touch");
        }
        let affinity = self.affinity;
        // SAFETY: only sched_setaffinity runs between fork and exec (async-signal-safe); it
        // gives the peer the affinity lf-bench had before pinning itself to one core.
        unsafe {
            cmd.pre_exec(move || {
                if libc::CPU_COUNT(&affinity) > 0 {
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &affinity);
                }
                Ok(())
            });
        }
        let out = cmd.output().map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        parse(&stdout, size, touch).ok_or_else(|| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            format!(
                "{} exited with {} and no result for {size} B: {}",
                peer.name(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        })
    }
}

/// The version of a peer: Open MPI's own words (`mpirun --version`); for iceoryx2, the one in
/// the `Cargo.lock` of the crate the program was built in (`<crate>/target/release/<program>`).
pub fn version(peer: Peer, program: &Path) -> Option<String> {
    match peer {
        Peer::OpenMpi => {
            let out = Command::new("mpirun").arg("--version").output().ok()?;
            String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_owned)
        }
        Peer::Iceoryx2 => {
            let lock = std::fs::read_to_string(program.parent()?.parent()?.parent()?.join("Cargo.lock")).ok()?;
            let mut lines = lock.lines();
            lines.find(|l| *l == "name = \"iceoryx2\"")?;
            let v = lines.next()?.strip_prefix("version = ")?.trim_matches('"');
            Some(format!("iceoryx2 {v}"))
        }
    }
}

/// The row of `size` (touched or not) from a peer's JSON lines.
fn parse(stdout: &str, size: usize, touch: bool) -> Option<Measured> {
    let rows = stdout.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    let v =
        rows.into_iter().find(|v| v["size"].as_u64() == Some(size as u64) && v["touch"].as_bool() == Some(touch))?;
    let field = |name: &str| v[name].as_f64();
    let lat = Percentiles { p50: field("p50_ns")?, p99: field("p99_ns")?, p999: field("p999_ns")? };
    let own_spin = field("spin_before_p50_ns").zip(field("spin_after_p50_ns"));
    Some(Measured { lat, own_spin })
}
