//! The fan-in peers, run while lf-bench's own processes are idle, with the same protocol and
//! core layout (`gather.rs`): iceoryx2 with N publishers on one publish-subscribe service and
//! one subscriber (`iceoryx2-fanin` from `benchmarks/peers`), and Open MPI with N ranks sending
//! to rank 0, which receives with `MPI_ANY_SOURCE` (`benchmarks/mpi_fanin.c` under `mpirun`).
//! Each prints the JSON line of its tally, read back here.
//!
//! Where a program is found: `--iceoryx2-fanin PATH` / `--mpi-fanin PATH`, else the
//! environment (`LF_BENCH_ICEORYX2_FANIN`, `LF_BENCH_MPI_FANIN`), else next to lf-bench's own
//! executable. A peer that is not found is skipped, and the report says why.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use super::FanInOptions;
use crate::peers::{in_path, locate, version, Peer};

/// How long one peer run may take before it is killed.
const PEER_TIMEOUT_S: u32 = 120;

pub struct FanInPeers {
    iceoryx2: Result<PathBuf, String>,
    mpi: Result<PathBuf, String>,
}

impl FanInPeers {
    pub fn find(o: &FanInOptions) -> FanInPeers {
        let off = || Err("--no-peers was given".to_owned());
        let iceoryx2 = if o.peers { locate(&o.iceoryx2, "LF_BENCH_ICEORYX2_FANIN", "iceoryx2-fanin") } else { off() };
        let mpi = if !o.peers {
            off()
        } else if in_path("mpirun").is_none() {
            Err("mpirun is not in PATH".to_owned())
        } else {
            locate(&o.mpi, "LF_BENCH_MPI_FANIN", "mpi_fanin")
        };
        FanInPeers { iceoryx2, mpi }
    }

    pub fn program(&self, peer: Peer) -> Result<&Path, &str> {
        match peer {
            Peer::Iceoryx2 => &self.iceoryx2,
            Peer::OpenMpi => &self.mpi,
        }
        .as_deref()
        .map_err(String::as_str)
    }

    pub fn describe(&self, peer: Peer) -> Value {
        match self.program(peer) {
            Ok(path) => json!({"peer": peer.name(), "found": true, "path": path, "version": version(peer, path)}),
            Err(why) => json!({"peer": peer.name(), "found": false, "why": why}),
        }
    }

    /// `peer` with `producers` senders: its tally, or what went wrong.
    pub fn run(&self, peer: Peer, producers: usize, o: &FanInOptions) -> Result<Value, String> {
        let program = self.program(peer)?;
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=5", &PEER_TIMEOUT_S.to_string()]);
        match peer {
            Peer::Iceoryx2 => {
                cmd.arg(program).args(["--producers", &producers.to_string()]);
            }
            Peer::OpenMpi => {
                // More ranks than cores on a small machine: oversubscribed, each rank pinning
                // itself as lf-bench's processes are pinned (gather.rs's layout).
                cmd.args(["mpirun", "-np", &(producers + 1).to_string(), "--oversubscribe", "--bind-to", "none"]);
                cmd.args(["--mca", "btl", "self,vader"]);
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } == 0 {
                    cmd.arg("--allow-run-as-root")
                        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
                }
                cmd.arg(program);
            }
        }
        cmd.args(["--size", &o.size.to_string()]);
        cmd.args(["--warm", &o.warm.as_secs_f64().to_string(), "--window", &o.window.as_secs_f64().to_string()]);
        if !o.pin {
            cmd.arg("--no-pin");
        }
        let out = cmd.output().map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let found = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["producers"].as_u64() == Some(producers as u64));
        found.ok_or_else(|| {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            format!(
                "{} exited with {} and no result for {producers} producers: {}",
                peer.name(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )
        })
    }
}
