//! The fan-out peer, run while lf-bench's own processes are idle, with the same protocol and
//! core layout (`scatter.rs`): iceoryx2 with one publisher and N subscribers on one
//! publish-subscribe service (`iceoryx2-fanout` from `benchmarks/peers`). It prints the
//! publisher's JSON line and each subscriber's, read back here.
//!
//! Where it is found: `--iceoryx2-fanout PATH`, else `LF_BENCH_ICEORYX2_FANOUT`, else next to
//! lf-bench's own executable. Not found, it is skipped, and the report says why.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use super::{gather_lines, FanOutOptions};
use crate::peers::{locate, version, Peer};

/// How long one peer run may take before it is killed.
const PEER_TIMEOUT_S: u32 = 120;

pub struct FanOutPeers {
    pub iceoryx2: Result<PathBuf, String>,
}

impl FanOutPeers {
    pub fn find(o: &FanOutOptions) -> FanOutPeers {
        let iceoryx2 = if o.peers {
            locate(&o.iceoryx2, "LF_BENCH_ICEORYX2_FANOUT", "iceoryx2-fanout")
        } else {
            Err("--no-peers was given".to_owned())
        };
        FanOutPeers { iceoryx2 }
    }

    pub fn describe(&self) -> Value {
        match &self.iceoryx2 {
            Ok(path) => {
                json!({"peer": "iceoryx2", "found": true, "path": path, "version": version(Peer::Iceoryx2, path)})
            }
            Err(why) => json!({"peer": "iceoryx2", "found": false, "why": why}),
        }
    }

    /// iceoryx2 with `consumers` subscribers: the publisher's line with the subscribers', or
    /// what went wrong.
    pub fn run(&self, consumers: usize, o: &FanOutOptions) -> Result<Value, String> {
        let program = self.iceoryx2.as_ref().map_err(String::clone)?;
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=5", &PEER_TIMEOUT_S.to_string()]);
        cmd.arg(program).args(["--consumers", &consumers.to_string(), "--size", &o.size.to_string()]);
        cmd.args(["--warm", &o.warm.as_secs_f64().to_string(), "--window", &o.window.as_secs_f64().to_string()]);
        if !o.pin {
            cmd.arg("--no-pin");
        }
        let out = cmd.output().map_err(|e| format!("could not start {}: {e}", program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let why = match gather_lines(&stdout, consumers) {
            Ok(v) if out.status.success() => return Ok(v),
            Ok(_) => "its lines came out, but it failed".to_owned(),
            Err(e) => e,
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        Err(format!(
            "iceoryx2 with {consumers} subscribers exited with {}: {why}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ))
    }
}
