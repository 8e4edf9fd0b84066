//! The fan-out report: the configuration (the machine, its cores and how the processes share
//! them, the channel configuration, the protocol, the peer found), then OSU-style tables (the
//! producer's cost by reference, with what the consumers got; the small copies), the target
//! with ok / MISSED, and the same as JSON.

use serde_json::{json, Value};

use super::lf::config;
use super::peers::FanOutPeers;
use super::scatter::{consumer_core, cores_allowed, BLOCK};
use super::{FanOutOptions, Row};
use crate::machine::Machine;
use crate::options::{bytes, die};
use crate::spread::layout;
use crate::table::{comment, ratio, us, Table};
use lava_flow_c_api::channel_config::lf_channel_kind;

/// The target: at the most consumers, the producer's time in the send call by reference at
/// most this many times the pair channel's.
const SEND_BOUND: f64 = 8.0;

fn field(row: &Row, name: &str) -> Option<f64> {
    row.result.as_ref().ok()?[name].as_f64()
}

fn find<'a>(rows: &'a [Row], who: &str, consumers: usize, mode: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.who == who && r.consumers == consumers && r.mode == mode && r.result.is_ok())
}

/// `row`'s `name` over `other`'s.
fn over(row: &Row, other: Option<&Row>, name: &str) -> Option<f64> {
    Some(field(row, name)? / field(other?, name)?)
}

/// What the consumers got: `8/8 all` where every consumer received and checked every message
/// the producer sent, else how many did and the errors.
fn received(row: &Row) -> String {
    let Ok(v) = &row.result else { return "-".into() };
    let got = v["consumer_results"].as_array().cloned().unwrap_or_default();
    let errors: u64 = got.iter().filter_map(|c| c["errors"].as_u64()).sum();
    let whole = got.iter().filter(|c| c["received"] == v["sent"] && c["errors"] == 0).count();
    if v["all_received"] == true {
        format!("{whole}/{} all", row.consumers)
    } else {
        format!("{whole}/{} all, {errors} errors", row.consumers)
    }
}

/// Consumers every one of whose messages was flagged LF_MESSAGE_ZERO_COPY (lava-flow only).
fn zero_copy(row: &Row) -> String {
    let Ok(v) = &row.result else { return "-".into() };
    if !row.who.starts_with("lava-flow") {
        return "n/a".into();
    }
    let got = v["consumer_results"].as_array().cloned().unwrap_or_default();
    let all = got.iter().filter(|c| c["zero_copy"] == c["received"] && c["received"].as_u64() > Some(0)).count();
    format!("{all}/{}", row.consumers)
}

fn config_lines(o: &FanOutOptions, machine: &Machine, peers: &FanOutPeers) -> Vec<String> {
    let cfg = config(lf_channel_kind::LF_CHANNEL_FAN_OUT, o.c_wait());
    let wait = match cfg.wait_strategy {
        1 => "busy-poll".to_owned(),
        2 => format!("spin-then-block, {} ns spin", cfg.spin_ns),
        3 => "block".to_owned(),
        other => format!("wait strategy {other}"),
    };
    let wait = if o.wait.is_some() { format!("{wait} (--wait: not the default)") } else { wait };
    let mut l = vec![
        "lf-bench --fan-out: one producer to consumers in processes of their own, through lava-flow's C API, beside iceoryx2, all in one run".to_owned(),
    ];
    l.extend(machine.lines());
    l.push(format!("Cores: {}", layout(o.pin, cores_allowed(), &o.consumers, ("producer", "consumer"), consumer_core)));
    l.push(format!(
        "C API channels: lf_channel_config_init (capacity {} per consumer, pool {}, wait {wait}, max_peers {}) with kind LF_CHANNEL_FAN_OUT (LF_CHANNEL_PAIR for the pair rows) and a 30 s rendezvous timeout",
        cfg.capacity,
        bytes(cfg.pool_size as usize),
        cfg.max_peers
    ));
    l.push(format!(
        "By reference, {}: one lf_alloc'ed CPU buffer, rewritten in full before each message (private bytes, the counter at both ends: Write), lf_send_buffer (Send), then lf_wait_completed of that message, which returns once every consumer released it (Cycle = send + wait), before the next rewrite; one buffer in memory for all consumers",
        bytes(o.size)
    ));
    l.push("Consumers: lf_recv, read every byte (a sum over the payload), check the counter at both ends and the sum (in order, whole, once), lf_release before the next; each notes whether the message had LF_MESSAGE_ZERO_COPY".to_owned());
    if o.small != 0 {
        l.push(format!(
            "Copies, {}: lf_send of the application's private bytes (copied into every consumer's ring), as fast as the consumers take them; the producer's time per message over blocks of {BLOCK} sends",
            bytes(o.small)
        ));
    }
    l.push(format!(
        "Protocol: all consumers attach (the producer greets them with 8-byte messages until lf_channel_peers lists them all); a {:.1} s warm-up, then a {:.1} s timed window, every message timed; then the producer ends and each consumer reports what it got",
        o.warm.as_secs_f64(),
        o.window.as_secs_f64()
    ));
    l.push("No floor: the pair channel in the same run is the fan-out's reference".to_owned());
    let p = peers.describe();
    if p["found"] == true {
        let version = p["version"].as_str().unwrap_or("version unknown");
        l.push(format!("Peer iceoryx2: {version} ({})", p["path"].as_str().unwrap_or_default()));
    } else {
        l.push(format!("Peer iceoryx2: skipped: {}", p["why"].as_str().unwrap_or_default()));
    }
    l.push("iceoryx2: one publisher, N subscribers on one publish-subscribe service (buffer 2, no overflow); per message the publisher loans a slice and writes the payload into it (Write includes the loan), send() (Send), then waits until every subscriber counted its release in a shared word (Cycle): iceoryx2 has no completion wait of its own".to_owned());
    l
}

fn ref_table(rows: &[Row]) -> Table {
    let mut t = Table::new(&[
        "Consumers",
        "<Who",
        "Send p50 (us)",
        "p99 (us)",
        "x pair",
        "x iceoryx2",
        "Cycle p50 (us)",
        "p99 (us)",
        "x pair",
        "x iceoryx2",
        "Write p50 (us)",
        "Msgs/s",
        "<Received",
        "<Zero-copy",
        "<Note",
    ]);
    let pair = find(rows, "lava-flow pair", 1, "ref");
    for r in rows.iter().filter(|r| r.mode == "ref") {
        let lf = r.who == "lava-flow fan-out";
        let ice = find(rows, "iceoryx2", r.consumers, "ref");
        let note = match &r.result {
            Err(e) => format!("failed: {e}"),
            Ok(v) if r.who.starts_with("lava-flow") => {
                format!("lf_channel_peers: {} alive", v["peers_alive"].as_u64().unwrap_or(0))
            }
            Ok(_) => String::new(),
        };
        let cell = |v: Option<f64>, on: bool| if on { ratio(v) } else { String::new() };
        t.row(vec![
            r.consumers.to_string(),
            r.who.clone(),
            us(field(r, "send_p50_ns")),
            us(field(r, "send_p99_ns")),
            cell(over(r, pair, "send_p50_ns"), lf),
            cell(over(r, ice, "send_p50_ns"), lf),
            us(field(r, "cycle_p50_ns")),
            us(field(r, "cycle_p99_ns")),
            cell(over(r, pair, "cycle_p50_ns"), lf),
            cell(over(r, ice, "cycle_p50_ns"), lf),
            us(field(r, "write_p50_ns")),
            field(r, "msgs_per_s").map_or("-".into(), |m| format!("{m:.0}")),
            received(r),
            zero_copy(r),
            note,
        ]);
    }
    t
}

fn copy_table(rows: &[Row]) -> Table {
    let mut t = Table::new(&[
        "Consumers",
        "<Who",
        "Per msg p50 (ns)",
        "p99 (ns)",
        "x pair",
        "Msgs/s (M)",
        "<Received",
        "<Note",
    ]);
    let pair = find(rows, "lava-flow pair", 1, "copy");
    for r in rows.iter().filter(|r| r.mode == "copy") {
        let lf = r.who == "lava-flow fan-out";
        t.row(vec![
            r.consumers.to_string(),
            r.who.clone(),
            ns(field(r, "send_p50_ns")),
            ns(field(r, "send_p99_ns")),
            if lf { ratio(over(r, pair, "send_p50_ns")) } else { String::new() },
            field(r, "msgs_per_s").map_or("-".into(), |m| format!("{:.3}", m / 1e6)),
            received(r),
            r.result.as_ref().err().map(|e| format!("failed: {e}")).unwrap_or_default(),
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

/// The send-cost target at the most consumers.
fn target(rows: &[Row], o: &FanOutOptions) -> Value {
    let most = o.consumers.iter().copied().max().unwrap_or(1);
    let row = find(rows, "lava-flow fan-out", most, "ref");
    let value = row.and_then(|r| over(r, find(rows, "lava-flow pair", 1, "ref"), "send_p50_ns"));
    let cycle = row.and_then(|r| over(r, find(rows, "lava-flow pair", 1, "ref"), "cycle_p50_ns"));
    json!({
        "name": format!("fan-out 1 to {most}, {} by reference: producer's send p50 <= {SEND_BOUND}x the pair's", bytes(o.size)),
        "value": value,
        "target": SEND_BOUND,
        "pass": value.map(|v| v <= SEND_BOUND),
        "detail": format!("cycle (send + completion wait) {} x the pair's", ratio(cycle)),
    })
}

fn row_json(r: &Row) -> Value {
    json!({
        "who": r.who,
        "consumers": r.consumers,
        "mode": r.mode,
        "result": r.result.as_ref().ok(),
        "error": r.result.as_ref().err(),
    })
}

pub fn print(o: &FanOutOptions, machine: &Machine, peers: &FanOutPeers, rows: &[Row]) {
    let lines = config_lines(o, machine, peers);
    let target = target(rows, o);
    let doc = json!({
        "config": {
            "machine": machine.to_json(),
            "cores_allowed": cores_allowed(),
            "pinned": o.pin,
            "size": o.size,
            "small_size": o.small,
            "wait_strategy": config(lf_channel_kind::LF_CHANNEL_FAN_OUT, o.c_wait()).wait_strategy,
            "wait_default": o.wait.is_none(),
            "consumers": o.consumers,
            "warm_s": o.warm.as_secs_f64(),
            "window_s": o.window.as_secs_f64(),
            "block": BLOCK,
            "peers": [peers.describe()],
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
    comment(&format!(
        "By reference, {}: the producer's time per message in the send call and in the cycle (send + wait until every consumer released it), p50 and p99 over the window; x pair, x iceoryx2 = p50 / theirs (lower is better); Received: consumers that got every message, checked; Zero-copy: consumers whose every message had LF_MESSAGE_ZERO_COPY",
        bytes(o.size)
    ));
    ref_table(rows).print();
    if o.small != 0 {
        comment("");
        comment(&format!(
            "Copies at saturation, {}: the producer's time per message (p50, p99 over blocks of {BLOCK} sends); x pair = p50 / the pair's (lower is better)",
            bytes(o.small)
        ));
        copy_table(rows).print();
    }
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
        format!("{SEND_BOUND:.2}"),
        verdict.to_owned(),
        target["detail"].as_str().unwrap_or_default().to_owned(),
    ]);
    t.print();
}
