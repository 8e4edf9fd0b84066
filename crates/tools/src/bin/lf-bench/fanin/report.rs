//! The fan-in report: the configuration (the machine, its cores and how the processes share
//! them, the channel configuration, the protocol, the peers found), then two OSU-style tables
//! (per-message cost, and aggregate throughput with fairness), the fairness target with ok /
//! MISSED, and the same as JSON.

use serde_json::{json, Value};

use super::gather::{cores_allowed, producer_core, BLOCK};
use super::lf::config;
use super::peers::FanInPeers;
use super::{FanInOptions, Row};
use crate::machine::Machine;
use crate::options::{bytes, die};
use crate::peers::Peer;
use crate::spread::layout;
use crate::table::{comment, ratio, Table};
use lava_flow_c_api::channel_config::lf_channel_kind;

/// The fairness target: at saturation with the most producers, the slowest producer's
/// throughput over the fastest's.
const FAIRNESS_BOUND: f64 = 0.8;

fn field(row: &Row, name: &str) -> Option<f64> {
    row.tally.as_ref().ok()?[name].as_f64()
}

/// Slowest producer's messages in the window over the fastest's.
fn fairness(row: &Row) -> Option<f64> {
    let per: Vec<f64> = row.tally.as_ref().ok()?["per_producer"].as_array()?.iter().filter_map(Value::as_f64).collect();
    let max = per.iter().copied().fold(0.0, f64::max);
    (max > 0.0).then(|| per.iter().copied().fold(f64::INFINITY, f64::min) / max)
}

fn find<'a>(rows: &'a [Row], who: &str, producers: usize) -> Option<&'a Row> {
    rows.iter().find(|r| r.who == who && r.producers == producers && r.tally.is_ok())
}

/// Whose rows a row compares with: lava-flow's fan-in against its pair and the peers.
fn is_lf_fan_in(row: &Row) -> bool {
    row.who == "lava-flow fan-in"
}

/// `row`'s p50 per message over `other`'s (lower is better).
fn per_msg_ratio(row: &Row, other: Option<&Row>) -> Option<f64> {
    Some(field(row, "per_msg_p50_ns")? / field(other?, "per_msg_p50_ns")?)
}

/// `row`'s throughput over `other`'s (higher is better).
fn throughput_ratio(row: &Row, other: Option<&Row>) -> Option<f64> {
    Some(field(row, "msgs_per_s")? / field(other?, "msgs_per_s")?)
}

fn config_lines(o: &FanInOptions, machine: &Machine, peers: &FanInPeers) -> Vec<String> {
    let cfg = config(lf_channel_kind::LF_CHANNEL_FAN_IN);
    let wait = match cfg.wait_strategy {
        1 => "busy-poll".to_owned(),
        2 => format!("spin-then-block, {} ns spin", cfg.spin_ns),
        3 => "block".to_owned(),
        other => format!("wait strategy {other}"),
    };
    let mut l = vec![
        "lf-bench --fan-in: producers in processes of their own to one consumer, through lava-flow's C API, beside iceoryx2 and Open MPI, all in one run".to_owned(),
    ];
    l.extend(machine.lines());
    l.push(format!("Cores: {}", layout(o.pin, cores_allowed(), &o.producers, ("consumer", "producer"), producer_core)));
    l.push(format!(
        "C API channels: lf_channel_config_init (capacity {} per producer, pool {}, wait {wait}, max_peers {}) with kind LF_CHANNEL_FAN_IN (LF_CHANNEL_PAIR for the pair row) and a 30 s rendezvous timeout",
        cfg.capacity,
        bytes(cfg.pool_size as usize),
        cfg.max_peers
    ));
    l.push(format!(
        "Messages: {}; each producer writes its counter, its index and the rest from private bytes into an lf_loan and lf_publishes it; the consumer lf_recvs, reads every byte, checks the producer's counter (order, exactly once) and lf_releases before the next",
        bytes(o.size)
    ));
    l.push(format!(
        "Protocol: all producers attach, start together, send as fast as they can; a {:.1} s warm-up, then a {:.1} s timed window; then stopped and drained",
        o.warm.as_secs_f64(),
        o.window.as_secs_f64()
    ));
    l.push(format!(
        "Per message: the consumer's inter-arrival time at saturation (the producers send as fast as they can, so where messages wait it is the consumer's cost per message; where the consumer waits for producers that are descheduled, the wait is in it), p50 and p99 over blocks of {BLOCK} consecutive messages; the same for the pair row"
    ));
    l.push("Fairness: the slowest producer's messages in the window over the fastest's".to_owned());
    l.push("No floor: the pair channel in the same run is the fan-in's reference".to_owned());
    for peer in Peer::ALL {
        let p = peers.describe(peer);
        if p["found"] == true {
            let version = p["version"].as_str().unwrap_or("version unknown");
            l.push(format!("Peer {}: {version} ({})", peer.name(), p["path"].as_str().unwrap_or_default()));
        } else {
            l.push(format!("Peer {}: skipped: {}", peer.name(), p["why"].as_str().unwrap_or_default()));
        }
    }
    l.push("iceoryx2: N publishers on one publish-subscribe service, one subscriber (buffer 256, no overflow: a publisher waits for room), loans".to_owned());
    l.push("Open MPI: N ranks MPI_Send to rank 0, which MPI_Recvs from MPI_ANY_SOURCE; a sender waits for a credit per 256 messages (at most 512 ahead), mpirun --oversubscribe --bind-to none, the ranks pinning themselves as above".to_owned());
    l
}

fn per_message_table(rows: &[Row]) -> Table {
    let mut t = Table::new(&[
        "Producers",
        "<Who",
        "Per msg p50 (ns)",
        "p99 (ns)",
        "x pair",
        "x iceoryx2",
        "x Open MPI",
        "<Note",
    ]);
    let pair = find(rows, "lava-flow pair", 1);
    for r in rows {
        let lf = is_lf_fan_in(r);
        t.row(vec![
            r.producers.to_string(),
            r.who.clone(),
            ns(field(r, "per_msg_p50_ns")),
            ns(field(r, "per_msg_p99_ns")),
            if lf { ratio(per_msg_ratio(r, pair)) } else { String::new() },
            if lf { ratio(per_msg_ratio(r, find(rows, Peer::Iceoryx2.name(), r.producers))) } else { String::new() },
            if lf { ratio(per_msg_ratio(r, find(rows, Peer::OpenMpi.name(), r.producers))) } else { String::new() },
            r.tally.as_ref().err().map(|e| format!("failed: {e}")).unwrap_or_default(),
        ]);
    }
    t
}

fn throughput_table(rows: &[Row], size: usize) -> Table {
    let mut t = Table::new(&[
        "Producers",
        "<Who",
        "Msgs/s (M)",
        "MB/s",
        "x iceoryx2",
        "x Open MPI",
        "Fairness",
        "Errors",
        "<Per producer (messages in the window)",
    ]);
    for r in rows {
        let lf = is_lf_fan_in(r);
        let mps = field(r, "msgs_per_s");
        let per = r.tally.as_ref().ok().and_then(|v| v["per_producer"].as_array().cloned()).unwrap_or_default();
        t.row(vec![
            r.producers.to_string(),
            r.who.clone(),
            mps.map_or("-".into(), |m| format!("{:.3}", m / 1e6)),
            mps.map_or("-".into(), |m| format!("{:.1}", m * size as f64 / 1e6)),
            if lf { ratio(throughput_ratio(r, find(rows, Peer::Iceoryx2.name(), r.producers))) } else { String::new() },
            if lf { ratio(throughput_ratio(r, find(rows, Peer::OpenMpi.name(), r.producers))) } else { String::new() },
            ratio(fairness(r)),
            field(r, "errors").map_or("-".into(), |e| format!("{e:.0}")),
            per.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "),
        ]);
    }
    t
}

fn ns(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.1}"),
        _ => "-".into(),
    }
}

/// The fairness target at the most producers, for lava-flow (the peers' own fairness beside it).
fn target(rows: &[Row], o: &FanInOptions) -> Value {
    let most = o.producers.iter().copied().max().unwrap_or(1);
    let row = find(rows, "lava-flow fan-in", most);
    let value = row.and_then(fairness);
    let peers: Vec<String> = Peer::ALL
        .iter()
        .filter_map(|p| Some(format!("{} {:.2}", p.name(), fairness(find(rows, p.name(), most)?)?)))
        .collect();
    json!({
        "name": format!("fan-in {most} to 1: slowest producer / fastest >= {FAIRNESS_BOUND}"),
        "value": value,
        "target": FAIRNESS_BOUND,
        "pass": value.map(|v| v >= FAIRNESS_BOUND),
        "detail": if peers.is_empty() { "no peer measured".to_owned() } else { format!("peers: {}", peers.join(", ")) },
    })
}

fn row_json(r: &Row) -> Value {
    json!({
        "who": r.who,
        "producers": r.producers,
        "tally": r.tally.as_ref().ok(),
        "error": r.tally.as_ref().err(),
        "fairness": fairness(r),
    })
}

pub fn print(o: &FanInOptions, machine: &Machine, peers: &FanInPeers, rows: &[Row]) {
    let lines = config_lines(o, machine, peers);
    let target = target(rows, o);
    let doc = json!({
        "config": {
            "machine": machine.to_json(),
            "cores_allowed": cores_allowed(),
            "pinned": o.pin,
            "size": o.size,
            "producers": o.producers,
            "warm_s": o.warm.as_secs_f64(),
            "window_s": o.window.as_secs_f64(),
            "block": BLOCK,
            "peers": Peer::ALL.iter().map(|&p| peers.describe(p)).collect::<Vec<_>>(),
            "text": lines,
        },
        "command": crate::machine::command(),
        "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
        "targets": [target.clone()],
    });
    let pretty = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
    if let Some(path) = &o.json_out {
        std::fs::write(path, format!("{pretty}\n"))
            .unwrap_or_else(|e| die(&format!("writing {}: {e}", path.display())));
    }
    if o.json {
        println!("{pretty}");
        return;
    }
    for line in &lines {
        comment(line);
    }
    comment("");
    comment(&format!("Per message at saturation, {}: the consumer's time per message (p50, p99 over blocks of {BLOCK}); x pair, x iceoryx2, x Open MPI = p50 / theirs (lower is better)", bytes(o.size)));
    per_message_table(rows).print();
    comment("");
    comment("Aggregate throughput and fairness: x iceoryx2, x Open MPI = lava-flow's messages per second / theirs at the same producer count (higher is better)");
    throughput_table(rows, o.size).print();
    comment("");
    comment("Target");
    let mut t = Table::new(&["Target", "Value", "Bound", "<Verdict", "<Detail"]);
    let verdict = match target["pass"].as_bool() {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "n/a",
    };
    t.row(vec![
        target["name"].as_str().unwrap_or_default().to_owned(),
        ratio(target["value"].as_f64()),
        format!("{FAIRNESS_BOUND:.2}"),
        verdict.to_owned(),
        target["detail"].as_str().unwrap_or_default().to_owned(),
    ]);
    t.print();
}
