//! The headline: lava-flow's C API (copy, loan, buffer send; see `capi.rs`) and its peers
//! (iceoryx2, Open MPI; see `peers.rs`), each case held against a floor probed right before
//! and right after it, in the same run.
//!
//! Cases go size by size: first the small sizes untouched (against the spinning floor), then
//! every size from 64 B touched (against the copy-and-read floor of that size). For each size:
//! the C API's copy, loan and buffer send, then iceoryx2, then Open MPI, each bracketed by its
//! own probes: of its floor right before and after it, and around those, of the spinning
//! level. A peer's timed loop starts up to a second after lf-bench's probes (the processes
//! must start), so the peers also probe the spinning level inside their own processes right
//! around their timed loops; a row whose level moved is flagged. Last, the blocking 8 B
//! wake-up (a loan, `LF_WAIT_BLOCK`) against the eventfd floor.

use lava_flow_c_api::channel_config::lf_wait_strategy::{LF_WAIT_BLOCK, LF_WAIT_BUSY_POLL};

use crate::capi::{self, CApi, Case, Send};
use crate::options::Options;
use crate::peers::{Peer, Peers};
use crate::pingpong::Percentiles;
use crate::Side;

/// A floor whose probes bracket a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// Two processes spinning on one cache line.
    Spin,
    /// The raw copy-and-read ping-pong of the case's size.
    Touch,
    /// An eventfd ping-pong.
    EventFd,
}

impl Floor {
    pub fn name(self) -> &'static str {
        match self {
            Floor::Spin => "spinning",
            Floor::Touch => "copy-and-read",
            Floor::EventFd => "eventfd",
        }
    }
}

/// Who a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// lava-flow's C API, sending one way.
    LavaFlow(Send),
    Peer(Peer),
}

impl Who {
    pub fn name(self) -> String {
        match self {
            Who::LavaFlow(how) => format!("C API {}", how.name()),
            Who::Peer(peer) => peer.name().to_owned(),
        }
    }
}

/// A floor before and after a case moved when they differ by more than this fraction.
pub const FLOOR_MOVED: f64 = 0.20;

/// Whether the largest of `p50s` exceeds the smallest by more than [`FLOOR_MOVED`].
fn moved(p50s: &[f64]) -> bool {
    let lo = p50s.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = p50s.iter().copied().fold(0.0, f64::max);
    hi > lo * (1.0 + FLOOR_MOVED)
}

/// What a case measured: its half round trips and, for a peer, the spinning floor's p50 that
/// its own two processes probed right before and right after its timed loop.
pub struct Measured {
    pub lat: Percentiles,
    pub own_spin: Option<(f64, f64)>,
}

/// One headline case (ping's side).
#[derive(Clone, Debug)]
pub struct Row {
    pub who: Who,
    /// "busy-poll" or "block".
    pub wait: &'static str,
    pub size: usize,
    pub touch: bool,
    pub iters: usize,
    /// The half round trips, or why the case has none (a peer that failed).
    pub lat: Result<Percentiles, String>,
    pub floor: Floor,
    pub before: Percentiles,
    pub after: Percentiles,
    /// The spinning floor's p50 right before and right after the case (around the probes of
    /// `floor`): the machine's level, for every row alike.
    pub spin: (f64, f64),
    /// A peer's own probes of the spinning floor around its timed loop (the probes above are
    /// taken before it starts and after it exits).
    pub own_spin: Option<(f64, f64)>,
    /// Anything the row must say (a pool raised above the default).
    pub note: Option<String>,
}

impl Row {
    /// The floor's p50 the ratio is taken against: the mean of the probes before and after.
    pub fn floor_p50(&self) -> f64 {
        (self.before.p50 + self.after.p50) / 2.0
    }

    /// The smaller of the two probes' p50.
    pub fn floor_p50_min(&self) -> f64 {
        self.before.p50.min(self.after.p50)
    }

    /// Whether the floor moved by more than [`FLOOR_MOVED`] across the case.
    pub fn floor_moved(&self) -> bool {
        moved(&[self.before.p50, self.after.p50])
    }

    /// Whether the spinning level moved by more than [`FLOOR_MOVED`] across the case, as
    /// lf-bench's probes and a peer's own see it.
    pub fn level_moved(&self) -> bool {
        let (own_before, own_after) = self.own_spin.unwrap_or(self.spin);
        moved(&[self.spin.0, self.spin.1, own_before, own_after])
    }

    /// The larger of the two probes' p99.9 / p50: what the floor's own tail allows.
    pub fn floor_tail(&self) -> f64 {
        (self.before.p999 / self.before.p50).max(self.after.p999 / self.after.p50)
    }

    /// p50 / the floor's p50 (mean of before and after).
    pub fn ratio(&self) -> Option<f64> {
        self.lat.as_ref().ok().map(|l| l.p50 / self.floor_p50())
    }
}

/// The headline's results (ping's side).
pub struct Headline {
    pub rows: Vec<Row>,
    /// The default channel configuration's pool (the largest message it carries).
    pub default_pool: usize,
    /// ns per C API call of the cheapest kind (handle check and panic boundary).
    pub call_ns: f64,
    /// The peers not run, and why.
    pub skipped: Vec<(Peer, String)>,
}

/// A case and its probes; ping gets them, pong `None`.
struct Bracketed {
    before: Percentiles,
    measured: Result<Measured, String>,
    after: Percentiles,
    spin: (f64, f64),
}

/// One probe of `floor` for `case`, in both processes.
fn probe(o: &Options, side: &mut Side, floor: Floor, case: Case) -> Option<Percentiles> {
    let n = o.probe_iterations(case.iters);
    match floor {
        Floor::Spin => side.spin.probe(side.ping, n),
        Floor::Touch => side.touch.probe(side.ping, case.size, n, &side.private),
        Floor::EventFd => side.efd.probe(side.ping, n),
    }
}

/// Probes the spinning level and `floor`, runs the case (`run`), probes `floor` and the
/// spinning level again.
fn bracket(
    o: &Options,
    side: &mut Side,
    floor: Floor,
    case: Case,
    run: impl FnOnce(&mut Side) -> Option<Result<Measured, String>>,
) -> Option<Bracketed> {
    let spin_before = probe(o, side, Floor::Spin, case);
    let before = probe(o, side, floor, case);
    let measured = run(side);
    let after = probe(o, side, floor, case);
    let spin_after = probe(o, side, Floor::Spin, case);
    Some(Bracketed { before: before?, measured: measured?, after: after?, spin: (spin_before?.p50, spin_after?.p50) })
}

/// A C API case as measured: no probes of its own.
fn capi_measured(lat: Option<Percentiles>) -> Option<Result<Measured, String>> {
    lat.map(|lat| Ok(Measured { lat, own_spin: None }))
}

/// The sizes of the headline in order, with whether they are touched.
fn groups(o: &Options) -> Vec<(usize, bool)> {
    o.small_sizes().map(|s| (s, false)).chain(o.touch_sizes().map(|s| (s, true))).collect()
}

/// Runs the headline in both processes; ping gets the results.
pub fn run(o: &Options, side: &mut Side, peers: &Peers, tag: &str) -> Option<Headline> {
    let ping = side.ping;
    let mut capi = CApi::new(tag);
    let default_pool = capi::default_pool();
    let busy = capi.open(ping, LF_WAIT_BUSY_POLL, 0);
    let mut rows = Vec::new();
    let mut push = |row: Option<Row>| rows.extend(row);
    for (size, touch) in groups(o) {
        let floor = if touch { Floor::Touch } else { Floor::Spin };
        let iters = o.iterations(size, false, touch);
        // Messages larger than the default pool need a channel with a larger one.
        let raised = (size > default_pool).then(|| capi.open(ping, LF_WAIT_BUSY_POLL, size));
        let ends = raised.as_ref().unwrap_or(&busy);
        let case = Case { size, touch, iters };
        for how in Send::ALL {
            let b = bracket(o, side, floor, case, |side| {
                capi_measured(capi::latency(&capi, ends, side.ping, how, case, &side.private))
            });
            push(b.map(|b| row(Who::LavaFlow(how), "busy-poll", case, floor, b, ends.note())));
        }
        for peer in Peer::ALL.into_iter().filter(|&p| peers.program(p).is_ok()) {
            let b = bracket(o, side, floor, case, |side| {
                side.efd.pause_pong(side.ping, || peers.run(peer, size, touch, iters))
            });
            push(b.map(|b| row(Who::Peer(peer), "busy-poll", case, floor, b, None)));
        }
    }
    let block = capi.open(ping, LF_WAIT_BLOCK, 0);
    let case = Case { size: 8, touch: false, iters: o.iterations(8, true, false) };
    let b = bracket(o, side, Floor::EventFd, case, |side| {
        capi_measured(capi::latency(&capi, &block, side.ping, Send::Loan, case, &side.private))
    });
    push(b.map(|b| row(Who::LavaFlow(Send::Loan), "block", case, Floor::EventFd, b, None)));
    let skipped = Peer::ALL.into_iter().filter_map(|p| peers.program(p).err().map(|why| (p, why.to_owned()))).collect();
    ping.then(|| Headline { rows, default_pool, call_ns: capi.call_cost(), skipped })
}

fn row(who: Who, wait: &'static str, case: Case, floor: Floor, b: Bracketed, note: Option<String>) -> Row {
    let (lat, own_spin) = match b.measured {
        Ok(m) => (Ok(m.lat), m.own_spin),
        Err(e) => (Err(e), None),
    };
    Row {
        who,
        wait,
        size: case.size,
        touch: case.touch,
        iters: case.iters,
        lat,
        floor,
        before: b.before,
        after: b.after,
        spin: b.spin,
        own_spin,
        note,
    }
}
