//! The headline's report: a table per size (floor, lava-flow's C API rows, iceoryx2, Open
//! MPI, the ratios), the targets with ok / MISSED, and the same as JSON.
//!
//! Every ratio to a floor is the case's p50 over the mean of the floor's p50 right before and
//! right after the case; the JSON also gives it over the smaller of the two. A row is flagged
//! where its floor moved by more than 20 % across it ("moved"), or where the spinning level
//! did (lf-bench's probes around the case, and a peer's own around its timed loop: "level").

use serde_json::{json, Value};

use crate::capi::Send;
use crate::headline::{Headline, Row, Who, FLOOR_MOVED};
use crate::options::{human, SMALL_MAX};
use crate::peers::Peer;
use crate::pingpong::Percentiles;

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

/// `64 B`, `1 KiB`, `64 MiB`.
fn bytes(size: usize) -> String {
    let h = human(size);
    match h.strip_suffix('K').or_else(|| h.strip_suffix('M')) {
        Some(n) => format!("{n} {}iB", &h[h.len() - 1..]),
        None => format!("{h} B"),
    }
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
    t.push(single("blocking 8 B wake-up p50 <= 1.3x eventfd floor".to_owned(), 1.3, block));
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

fn fmt_ns(v: f64) -> String {
    match v {
        v if v.is_nan() => "-".to_owned(),
        v if v >= 100_000.0 => format!("{:.0}us", v / 1000.0),
        v if v >= 10_000.0 => format!("{:.1}us", v / 1000.0),
        v => format!("{v:.0}"),
    }
}

fn fmt_ratio(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.2}"))
}

fn print_row(h: &Headline, r: &Row) {
    let floor = format!("{} / {}", fmt_ns(r.before.p50), fmt_ns(r.after.p50));
    let moved = match (r.floor_moved(), r.level_moved()) {
        (true, _) => " moved",
        (false, true) => " level",
        _ => "",
    };
    let vs = |peer| match r.who {
        Who::LavaFlow(_) => fmt_ratio(ratio_to_peer(h, r, peer)),
        Who::Peer(_) => String::new(),
    };
    match &r.lat {
        Ok(l) => println!(
            "  {:<19} {:>8} {:>8} {:>8} {:>17}{:<6} {:>7} {:>9} {:>9} {:>7}",
            r.who.name(),
            fmt_ns(l.p50),
            fmt_ns(l.p99),
            fmt_ns(l.p999),
            floor,
            moved,
            fmt_ratio(r.ratio()),
            vs(Peer::Iceoryx2),
            vs(Peer::OpenMpi),
            r.iters
        ),
        Err(e) => println!("  {:<19} failed: {e}", r.who.name()),
    }
}

fn print_group(h: &Headline, size: usize, touch: bool) {
    let rows: Vec<&Row> =
        h.rows.iter().filter(|r| r.size == size && r.touch == touch && r.wait == "busy-poll").collect();
    let Some(first) = rows.first() else { return };
    let what = if touch { "touched (copied from a private buffer, every byte read)" } else { "untouched" };
    println!("{}, {what}; floor: {}", bytes(size), first.floor.name());
    println!(
        "  {:<19} {:>8} {:>8} {:>8} {:>17}{:<6} {:>7} {:>9} {:>9} {:>7}",
        "", "p50", "p99", "p99.9", "floor before/after", "", "x floor", "x iceoryx2", "x Open MPI", "iters"
    );
    for r in &rows {
        print_row(h, r);
    }
    for note in rows.iter().filter_map(|r| r.note.as_ref().map(|n| (r.who.name(), n))) {
        println!("  ({}: {})", note.0, note.1);
    }
    println!();
}

pub fn print_text(h: &Headline, pinned: bool) {
    println!(
        "lf-bench: lava-flow's C API beside iceoryx2 and Open MPI{}",
        if pinned { ", two processes on cores 0 and 1" } else { "" }
    );
    println!(
        "channels: lf_channel_config_init (pool {}) with LF_WAIT_BUSY_POLL and a 30 s rendezvous timeout",
        bytes(h.default_pool)
    );
    println!("half round trips in ns (us where marked); each case between two probes of its floor; x floor = p50 / mean of the probes' p50");
    for (peer, why) in &h.skipped {
        println!("{} skipped: {why}", peer.name());
    }
    println!();
    let mut seen = Vec::new();
    for r in h.rows.iter().filter(|r| r.wait == "busy-poll") {
        if !seen.contains(&(r.size, r.touch)) {
            seen.push((r.size, r.touch));
            print_group(h, r.size, r.touch);
        }
    }
    for r in h.rows.iter().filter(|r| r.wait == "block") {
        println!("blocking wake-up, 8 B (C API loan, LF_WAIT_BLOCK); floor: eventfd");
        print_row(h, r);
        println!();
    }
    print_moved(h);
    println!("C API: handle check + panic boundary {:.1} ns per call", h.call_ns);
    println!();
    println!("targets");
    for t in targets(h) {
        println!(
            "  {:<72} {:>7}  target {:>4.2}  {:<6} {}",
            t.name,
            fmt_ratio(t.value),
            t.bound,
            t.verdict(),
            t.detail
        );
    }
}

/// The rows whose floor, or spinning level, moved by more than [`FLOOR_MOVED`] across them.
fn print_moved(h: &Headline) {
    let floor: Vec<String> =
        h.rows.iter().filter(|r| r.floor_moved()).map(|r| format!("{} {}", r.who.name(), size_label(r))).collect();
    if !floor.is_empty() {
        println!("floor moved by more than {:.0} % across (\"moved\"): {}", FLOOR_MOVED * 100.0, floor.join(", "));
    }
    let level: Vec<String> = h
        .rows
        .iter()
        .filter(|r| r.level_moved())
        .map(|r| {
            let own = r.own_spin.map_or(String::new(), |(b, a)| format!(", its own {b:.0} / {a:.0}"));
            format!("{} {} ({:.0} / {:.0}{own})", r.who.name(), size_label(r), r.spin.0, r.spin.1)
        })
        .collect();
    if !level.is_empty() {
        println!(
            "spinning level (ns, before / after; a peer's own probes around its timed loop) moved by more than {:.0} % across (\"level\" where the floor did not): {}",
            FLOOR_MOVED * 100.0,
            level.join(", ")
        );
    }
    if !floor.is_empty() || !level.is_empty() {
        println!();
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
