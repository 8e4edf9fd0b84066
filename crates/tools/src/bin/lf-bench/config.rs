//! The configuration lf-bench prints first (each line `# `, as OSU's benchmarks do) and puts
//! in its JSON under `config`: the machine, the build, the pinning, the channels'
//! configuration, the sizes, modes and iterations, and the peers found.

use serde_json::{json, Value};

use crate::machine::Machine;
use crate::options::{bytes, human, Options};
use crate::peers::{Peer, Peers};
use crate::table::comment;

/// Read before the fork (and before lf-bench pins itself).
pub struct Config {
    pub machine: Machine,
    /// `lf_channel_config_init`: (capacity, pool bytes).
    c_api: (u32, u64),
    rust_pool: usize,
    peers: Vec<Value>,
    /// Whether the two processes were pinned (two cores at least, and no `--no-pin`).
    pub pinned: bool,
}

fn sizes(list: &[usize]) -> String {
    list.iter().map(|&s| human(s)).collect::<Vec<_>>().join(",")
}

impl Config {
    pub fn probe(o: &Options, peers: &Peers) -> Config {
        let machine = Machine::probe();
        let cfg = crate::capi::default_config();
        Config {
            pinned: o.pin && std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2,
            machine,
            c_api: (cfg.capacity, cfg.pool_size),
            rust_pool: crate::rustapi::pool_for(o),
            peers: Peer::ALL.iter().map(|&p| peers.describe(p)).collect(),
        }
    }

    pub fn lines(&self, o: &Options) -> Vec<String> {
        let mut l = vec!["lf-bench: lava-flow channels between two processes, beside the machine's floors and the peers (iceoryx2, Open MPI), all in one run".to_owned()];
        l.extend(self.machine.lines());
        l.push(if self.pinned {
            "Pinning: ping on core 0, pong on core 1; the peers run on the same two cores while lf-bench's processes wait".to_owned()
        } else {
            "Pinning: none (--no-pin, or fewer than two cores)".to_owned()
        });
        l.push(format!("Modes: {}", o.modes.join(",")));
        if o.has_mode("capi") {
            l.push(format!(
                "C API channels: lf_channel_config_init (capacity {}, pool {} = the largest message) with LF_WAIT_BUSY_POLL and a 30 s rendezvous timeout; the pool raised to the message where larger",
                self.c_api.0,
                bytes(self.c_api.1 as usize)
            ));
        }
        if o.has_mode("busy") || o.has_mode("block") {
            let payloads = if o.payloads.is_empty() { "all".to_owned() } else { o.payloads.join(",") };
            l.push(format!(
                "Rust API channels: capacity 256, pool {}, 30 s rendezvous timeout, otherwise ChannelConfig::default(); payloads: {payloads}",
                bytes(self.rust_pool)
            ));
        }
        l.push(format!("Sizes (latency): {}; bandwidth sizes (Rust API): {}", sizes(&o.sizes), sizes(&o.bw_sizes)));
        l.extend(o.iterations_text());
        for p in &self.peers {
            let name = p["peer"].as_str().unwrap_or_default();
            if p["found"] == true {
                let version = p["version"].as_str().unwrap_or("version unknown");
                l.push(format!("Peer {name}: {version} ({})", p["path"].as_str().unwrap_or_default()));
            } else {
                l.push(format!("Peer {name}: skipped: {}", p["why"].as_str().unwrap_or_default()));
            }
        }
        l.push(
            "Latency: half round trips of a ping-pong, percentiles by nearest rank; MB/s = 10^6 bytes per second"
                .to_owned(),
        );
        l
    }

    pub fn print(&self, o: &Options) {
        for line in self.lines(o) {
            comment(&line);
        }
        comment("");
    }

    pub fn to_json(&self, o: &Options) -> Value {
        json!({
            "machine": self.machine.to_json(),
            "pinned": self.pinned,
            "cores": if self.pinned { json!([0, 1]) } else { Value::Null },
            "quick": o.quick,
            "modes": o.modes,
            "payloads": o.payloads,
            "sizes": o.sizes,
            "bw_sizes": o.bw_sizes,
            "window": o.window,
            "iters": o.iters,
            "iterations": o.iterations_text(),
            "c_api_channel": {
                "config": "lf_channel_config_init",
                "capacity": self.c_api.0,
                "pool_bytes": self.c_api.1,
                "wait": "busy-poll",
                "rendezvous_timeout_s": 30,
            },
            "rust_api_channel": {"capacity": 256, "pool_bytes": self.rust_pool, "rendezvous_timeout_s": 30},
            "peers": self.peers,
            "text": self.lines(o),
        })
    }
}
