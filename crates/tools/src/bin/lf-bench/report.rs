//! The headline's report: OSU-style tables (`# Size`, the sender, latency p50 / p99 / p99.9,
//! the ping-pong's bandwidth, the floor, the ratios to it and to the peers; the rows of a size
//! together, lava-flow's C API rows beside iceoryx2 and Open MPI), one for untouched and one
//! for touched messages, the blocking wake-up, the targets with ok / MISSED, and the same as
//! JSON.
//!
//! Every ratio to a floor is the case's p50 over the mean of the floor's p50 right before and
//! right after the case; the JSON also gives it over the smaller of the two. A row is flagged
//! where its floor moved by more than 20 % across it ("moved"), or where the spinning level
//! did (lf-bench's probes around the case, and a peer's own around its timed loop: "level").

use serde_json::{json, Value};

use crate::capi::Send;
use crate::headline::{Headline, Row, Who, FLOOR_MOVED};
use crate::options::{bytes, human, SMALL_MAX};
use crate::peers::Peer;
use crate::pingpong::Percentiles;
use crate::table::{comment, mb_s, pingpong_bytes_per_s, ratio, us, Table};

/// One target: its value (None: not measured), the bound, and whether it is met (None: not
/// judged), with what the reader needs to check it.
pub struct Target {
    pub name: String,
    pub value: Option<f64>,
    pub bound: f64,
    pub pass: Option<bool>,
    pub detail: String,
}

impl Target {
    fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "ok",
            Some(false) => "MISSED",
            None => "n/a",
        }
    }
}

fn is(row: &Row, who: Who, touch: bool) -> bool {
    row.who == who && row.touch == touch && row.wait == "busy-poll"
}

/// `peer`'s row of the same size and touch as `row`, to compare with (busy-poll rows: the
/// peers poll).
fn peer_row<'a>(h: &'a Headline, row: &Row, peer: Peer) -> Option<&'a Row> {
    if row.wait != "busy-poll" || row.who == Who::Peer(peer) {
        return None;
    }
    h.rows.iter().find(|r| is(r, Who::Peer(peer), row.touch) && r.size == row.size)
}

/// `row`'s p50 over `peer`'s at the same size and touch.
fn ratio_to_peer(h: &Headline, row: &Row, peer: Peer) -> Option<f64> {
    Some(row.lat.as_ref().ok()?.p50 / peer_row(h, row, peer)?.lat.as_ref().ok()?.p50)
}

/// `row`'s ratio to its floor over `peer`'s ratio to its own: the comparison with the
/// machine's moves between the two cases taken out.
fn ratio_to_peer_normalised(h: &Headline, row: &Row, peer: Peer) -> Option<f64> {
    Some(row.ratio()? / peer_row(h, row, peer)?.ratio()?)
}

/// `, floor moved` / `, level moved` where the row's floor or spinning level moved.
fn moved_mark(row: &Row) -> &'static str {
    if row.floor_moved() {
        ", floor moved"
    } else if row.level_moved() {
        ", level moved"
    } else {
        ""
    }
}

fn size_label(row: &Row) -> String {
    format!("{}{}", bytes(row.size), if row.touch { " touched" } else { "" })
}

/// A summary target over several rows: met where every judged row is within `bound`;
/// `value` is the worst.
fn summary(name: String, bound: f64, judged: Vec<(&Row, f64)>, unjudged: Vec<String>) -> Target {
    let worst = judged.iter().map(|(_, v)| *v).reduce(f64::max);
    let missed: Vec<String> = judged
        .iter()
        .filter(|(_, v)| *v > bound)
        .map(|(r, v)| format!("{} ({v:.3}x{})", size_label(r), moved_mark(r)))
        .collect();
    let mut detail = match judged.len() {
        0 => "no rows".to_owned(),
        n => format!("met at {} of {n}", n - missed.len()),
    };
    if !missed.is_empty() {
        detail.push_str(&format!("; missed at {}", missed.join(", ")));
    }
    if !unjudged.is_empty() {
        detail.push_str(&format!("; not judged: {}", unjudged.join(", ")));
    }
    Target { name, value: worst, bound, pass: worst.map(|w| w <= bound), detail }
}

/// A target on one row's ratio to its floor.
fn single(name: String, bound: f64, row: Option<&Row>) -> Target {
    let value = row.and_then(Row::ratio);
    let detail = row.map_or("not measured".to_owned(), |r| match &r.lat {
        Ok(l) => format!("{:.0} ns / {} floor {:.0} ns{}", l.p50, r.floor.name(), r.floor_p50(), moved_mark(r)),
        Err(e) => e.clone(),
    });
    Target { name, value, bound, pass: value.map(|v| v <= bound), detail }
}

/// The sizes of `rows` as `64..64M`, for a target's name.
fn span(rows: &[&Row]) -> String {
    match (rows.iter().map(|r| r.size).min(), rows.iter().map(|r| r.size).max()) {
        (Some(lo), Some(hi)) if lo == hi => human(lo),
        (Some(lo), Some(hi)) => format!("{}..{}", human(lo), human(hi)),
        _ => "no sizes".to_owned(),
    }
}

/// The requirement's targets, checked on the headline's rows.
pub fn targets(h: &Headline) -> Vec<Target> {
    let mut t = Vec::new();
    let lf =
        |how: Send, touch: bool| -> Vec<&Row> { h.rows.iter().filter(|r| is(r, Who::LavaFlow(how), touch)).collect() };
    for how in [Send::Copy, Send::Loan] {
        for row in lf(how, false).into_iter().filter(|r| r.size <= SMALL_MAX) {
            t.push(single(
                format!("small: C API {} {} B p50 <= 1.2x spinning floor", how.name(), row.size),
                1.2,
                Some(row),
            ));
        }
    }
    for how in Send::ALL {
        let rows = lf(how, true);
        let judged = rows.iter().filter_map(|r| Some((*r, r.ratio()?))).collect();
        t.push(summary(
            format!("touch: C API {} {} p50 <= 1.1x copy-and-read floor", how.name(), span(&rows)),
            1.1,
            judged,
            vec![],
        ));
    }
    for how in Send::ALL {
        let rows = lf(how, true);
        let judged: Vec<(&Row, f64)> =
            rows.iter().filter_map(|r| Some((*r, ratio_to_peer(h, r, Peer::Iceoryx2)?))).collect();
        let mut target =
            summary(format!("touch: C API {} {} p50 <= 1.0x iceoryx2", how.name(), span(&rows)), 1.0, judged, vec![]);
        let normalised = rows.iter().filter_map(|r| Some((*r, ratio_to_peer_normalised(h, r, Peer::Iceoryx2)?)));
        if let Some((r, v)) = normalised.max_by(|a, b| a.1.total_cmp(&b.1)) {
            target.detail.push_str(&format!(
                "; floor-normalised (x floor over iceoryx2's x floor) worst {v:.2}x at {}",
                size_label(r)
            ));
        }
        let peer_moved: Vec<String> = rows
            .iter()
            .filter_map(|r| peer_row(h, r, Peer::Iceoryx2))
            .filter(|p| !moved_mark(p).is_empty())
            .map(size_label)
            .collect();
        if !peer_moved.is_empty() {
            target.detail.push_str(&format!("; iceoryx2's floor or level moved at {}", peer_moved.join(", ")));
        }
        if let Some((_, why)) = h.skipped.iter().find(|(p, _)| *p == Peer::Iceoryx2) {
            target.detail = format!("iceoryx2 not run: {why}");
        }
        t.push(target);
    }
    let buffer8 = h.rows.iter().find(|r| is(r, Who::LavaFlow(Send::Buffer), false) && r.size == 8);
    t.push(single("buffer send + completion wait 8 B p50 <= 1.5x spinning floor".to_owned(), 1.5, buffer8));
    for how in Send::ALL {
        t.push(tail_target(h, how));
    }
    let block = h.rows.iter().find(|r| r.wait == "block");
    // At or below the eventfd ping-pong of the same moment: a futex wake-up should cost no more.
    t.push(single("blocking 8 B wake-up p50 <= 1.0x eventfd floor".to_owned(), 1.0, block));
    t
}

/// Timed round trips below which a row's p99.9 is hardly more than its maximum.
const TAIL_SAMPLES: usize = 1000;

/// p99.9 <= 3x p50 for one way of sending, on the rows with at least [`TAIL_SAMPLES`] round
/// trips whose floor's own p99.9 is within 3x its p50 (before and after); the others are
/// listed as not judged.
fn tail_target(h: &Headline, how: Send) -> Target {
    let rows: Vec<&Row> = h.rows.iter().filter(|r| r.who == Who::LavaFlow(how) && r.wait == "busy-poll").collect();
    let (mut judged, mut unjudged) = (Vec::new(), Vec::new());
    for r in rows {
        let Ok(l) = &r.lat else { continue };
        if r.iters < TAIL_SAMPLES {
            unjudged.push(format!("{} ({} samples)", size_label(r), r.iters));
        } else if r.floor_tail() > 3.0 {
            unjudged.push(format!("{} (floor's own {:.1}x)", size_label(r), r.floor_tail()));
        } else {
            judged.push((r, l.p999 / l.p50));
        }
    }
    summary(format!("tail: C API {} p99.9 <= 3x p50 where the floor's allows", how.name()), 3.0, judged, unjudged)
}

/// The table of the rows of `rows`: per row its percentiles, the ping-pong's bandwidth, the
/// floor, the ratios to the floor and to the peers of the same size.
fn table(h: &Headline, rows: &[&Row]) -> Table {
    let mut t = Table::new(&[
        "Size",
        "<Sender",
        "Latency p50 (us)",
        "p99 (us)",
        "p99.9 (us)",
        "Bandwidth (MB/s)",
        "Floor p50 (us)",
        "x floor",
        "x iceoryx2",
        "x Open MPI",
        "Iters",
        "<Note",
    ]);
    for r in rows {
        let vs = |peer| match r.who {
            Who::LavaFlow(_) => ratio(ratio_to_peer(h, r, peer)),
            Who::Peer(_) => String::new(),
        };
        let note = if r.floor_moved() {
            format!("floor moved: {} before, {} after", us(Some(r.before.p50)), us(Some(r.after.p50)))
        } else if r.level_moved() {
            let own = r.own_spin.map_or(String::new(), |(b, a)| format!(", its own {} / {}", us(Some(b)), us(Some(a))));
            format!("spinning level moved: {} / {}{own}", us(Some(r.spin.0)), us(Some(r.spin.1)))
        } else {
            String::new()
        };
        let lat = r.lat.as_ref().ok();
        t.row(vec![
            r.size.to_string(),
            r.who.name(),
            us(lat.map(|l| l.p50)),
            us(lat.map(|l| l.p99)),
            us(lat.map(|l| l.p999)),
            mb_s(lat.map(|l| pingpong_bytes_per_s(r.size, l.p50))),
            us(Some(r.floor_p50())),
            ratio(r.ratio()),
            vs(Peer::Iceoryx2),
            vs(Peer::OpenMpi),
            r.iters.to_string(),
            match &r.lat {
                Err(e) => format!("failed: {e}"),
                Ok(_) => note,
            },
        ]);
    }
    t
}

/// The notes of `rows` (a pool raised above the default) as comment lines.
fn notes(rows: &[&Row]) {
    for r in rows {
        if let Some(n) = &r.note {
            comment(&format!("{} at {}: {n}", r.who.name(), bytes(r.size)));
        }
    }
}

pub fn print_text(h: &Headline) {
    comment("C API headline: ping-pong between the two processes through lava-flow's C API, busy-poll, beside iceoryx2 and Open MPI doing the same");
    comment("Each case runs between two probes of its floor (right before and right after it): Floor p50 is their mean, x floor = p50 / Floor p50;");
    comment("x iceoryx2, x Open MPI = p50 / the peer's p50 at the same size; Bandwidth = size / p50 (one message each way per round trip).");
    for (peer, why) in &h.skipped {
        comment(&format!("{} skipped: {why}", peer.name()));
    }
    for touch in [false, true] {
        let rows: Vec<&Row> = h.rows.iter().filter(|r| r.wait == "busy-poll" && r.touch == touch).collect();
        if rows.is_empty() {
            continue;
        }
        comment("");
        if touch {
            comment("Touched messages (the sender copies the payload from a private buffer, the receiver reads every byte); floor: a raw copy-and-read ping-pong of the same size over plain shared memory");
        } else {
            comment("Untouched messages (the receiver looks only at the length); floor: two processes spinning on one cache line");
        }
        // A blank line between sizes: each size's rows compare at a glance.
        let lines = table(h, &rows).lines();
        println!("{}", lines[0]);
        for (i, line) in lines[1..].iter().enumerate() {
            if i > 0 && rows[i].size != rows[i - 1].size {
                println!();
            }
            println!("{line}");
        }
        notes(&rows);
    }
    let block: Vec<&Row> = h.rows.iter().filter(|r| r.wait == "block").collect();
    if !block.is_empty() {
        comment("");
        comment("Blocking wake-up (C API loan, LF_WAIT_BLOCK, untouched); floor: an eventfd ping-pong");
        table(h, &block).print();
    }
    comment("");
    print_moved(h);
    comment(&format!("C API: handle check + panic boundary {:.1} ns per call", h.call_ns));
    comment("");
    comment("Targets of the C API headline");
    let mut t = Table::new(&["Target", "Value", "Bound", "<Verdict", "<Detail"]);
    for target in targets(h) {
        t.row(vec![
            target.name.clone(),
            ratio(target.value),
            format!("{:.2}", target.bound),
            target.verdict().to_owned(),
            target.detail,
        ]);
    }
    t.print();
}

/// The rows whose floor, or spinning level, moved by more than [`FLOOR_MOVED`] across them.
fn print_moved(h: &Headline) {
    let floor: Vec<String> =
        h.rows.iter().filter(|r| r.floor_moved()).map(|r| format!("{} {}", r.who.name(), size_label(r))).collect();
    if !floor.is_empty() {
        comment(&format!("Floor moved by more than {:.0} % across: {}", FLOOR_MOVED * 100.0, floor.join(", ")));
    }
    let level: Vec<String> =
        h.rows.iter().filter(|r| r.level_moved()).map(|r| format!("{} {}", r.who.name(), size_label(r))).collect();
    if !level.is_empty() {
        comment(&format!(
            "Spinning level (probes around the case; a peer's own around its timed loop) moved by more than {:.0} % across: {}",
            FLOOR_MOVED * 100.0,
            level.join(", ")
        ));
    }
}

fn percentiles_json(p: &Percentiles) -> Value {
    json!({"p50_ns": p.p50, "p99_ns": p.p99, "p999_ns": p.p999})
}

fn row_json(h: &Headline, r: &Row) -> Value {
    let (api, send) = match r.who {
        Who::LavaFlow(how) => ("lava-flow C API", how.name()),
        Who::Peer(peer) => (peer.name(), "ping-pong"),
    };
    let lat = r.lat.as_ref().ok();
    json!({
        "who": api,
        "send": send,
        "wait": r.wait,
        "size": r.size,
        "touch": r.touch,
        "iters": r.iters,
        "latency": lat.map(percentiles_json),
        "error": r.lat.as_ref().err(),
        "floor": {
            "kind": r.floor.name(),
            "before": percentiles_json(&r.before),
            "after": percentiles_json(&r.after),
            "p50_mean_ns": r.floor_p50(),
            "p50_min_ns": r.floor_p50_min(),
            "moved": r.floor_moved(),
        },
        "spin_level": {
            "before_p50_ns": r.spin.0,
            "after_p50_ns": r.spin.1,
            "peer_own_before_p50_ns": r.own_spin.map(|s| s.0),
            "peer_own_after_p50_ns": r.own_spin.map(|s| s.1),
            "moved": r.level_moved(),
        },
        "ratio_to_floor_mean": r.ratio(),
        "ratio_to_floor_min": lat.map(|l| l.p50 / r.floor_p50_min()),
        "ratio_to_iceoryx2": ratio_to_peer(h, r, Peer::Iceoryx2),
        "ratio_to_openmpi": ratio_to_peer(h, r, Peer::OpenMpi),
        "ratio_to_iceoryx2_floor_normalised": ratio_to_peer_normalised(h, r, Peer::Iceoryx2),
        "ratio_to_openmpi_floor_normalised": ratio_to_peer_normalised(h, r, Peer::OpenMpi),
        "note": r.note,
    })
}

pub fn to_json(h: &Headline) -> Value {
    json!({
        "default_pool_bytes": h.default_pool,
        "capi_call_ns": h.call_ns,
        "floor_moved_threshold": FLOOR_MOVED,
        "skipped_peers": h.skipped.iter().map(|(p, why)| json!({"peer": p.name(), "why": why})).collect::<Vec<_>>(),
        "rows": h.rows.iter().map(|r| row_json(h, r)).collect::<Vec<_>>(),
        "targets": targets(h).into_iter().map(|t| json!({
            "name": t.name, "value": t.value, "target": t.bound, "pass": t.pass, "detail": t.detail,
        })).collect::<Vec<_>>(),
    })
}
