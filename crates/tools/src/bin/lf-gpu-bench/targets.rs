//! The targets: each PASS, FAIL or not measured (with the reason), from the sections' results.

use serde_json::{json, Value};

use crate::alloc::{AllocSummary, TrimSummary};
use crate::d2d::D2dSummary;
use crate::host::{Dir, HostRow, HostSummary};
use crate::import::ImportSummary;
use crate::util::{size_name, GIB, MIB};

pub enum Verdict {
    Pass,
    Fail,
    NotMeasured(String),
}

pub struct Target {
    pub name: String,
    pub verdict: Verdict,
    /// What was measured (empty when nothing was).
    pub measured: String,
}

/// What each section gave, or why it gave nothing.
pub struct Results {
    pub alloc: Result<AllocSummary, String>,
    pub d2d: Result<D2dSummary, String>,
    pub host: Result<HostSummary, String>,
    pub import: Result<ImportSummary, String>,
    pub trim: Result<TrimSummary, String>,
}

fn target(name: impl Into<String>, result: Result<(bool, String), String>) -> Target {
    match result {
        Ok((pass, measured)) => {
            Target { name: name.into(), verdict: if pass { Verdict::Pass } else { Verdict::Fail }, measured }
        }
        Err(why) => Target { name: name.into(), verdict: Verdict::NotMeasured(why), measured: String::new() },
    }
}

/// A section's error when `--only` left it out.
pub const SKIPPED: &str = "not run (--only)";

fn section<'a, T>(r: &'a Result<T, String>, name: &str) -> Result<&'a T, String> {
    r.as_ref().map_err(|e| match e.as_str() {
        SKIPPED => format!("the {name} section was not run (--only)"),
        e => format!("the {name} section failed: {e}"),
    })
}

/// The worst of `(what, ratio)` pairs against `limit`; an error in any pair, or no pair,
/// leaves the target unmeasured.
fn worst(pairs: Vec<(String, Result<f64, String>)>, limit: f64, none: &str) -> Result<(bool, String), String> {
    if pairs.is_empty() {
        return Err(none.to_string());
    }
    let mut values = Vec::new();
    for (what, r) in pairs {
        values.push((what.clone(), r.map_err(|e| format!("{what}: {e}"))?));
    }
    let (what, w) = values.iter().min_by(|a, b| a.1.total_cmp(&b.1)).expect("not empty").clone();
    let all: Vec<String> = values.iter().map(|(what, v)| format!("{what} {v:.2}x")).collect();
    Ok((w >= limit, format!("worst {w:.2}x at {what} ({})", all.join(", "))))
}

fn dir_name(dir: Dir) -> &'static str {
    match dir {
        Dir::H2D => "H2D",
        Dir::D2H => "D2H",
        Dir::Host => "host",
    }
}

/// `worst` of the host rows `pick` accepts, failed outright when every accepted row of a size
/// and direction moved wrong data (such a row never counts as the best path).
fn host_target(rows: &[HostRow], pick: impl Fn(&HostRow) -> bool, none: &str) -> Result<(bool, String), String> {
    let large = |r: &&HostRow| r.size >= 16 * MIB && pick(r);
    let mut sizes: Vec<u64> = rows.iter().filter(large).map(|r| r.size).collect();
    sizes.dedup();
    for size in sizes {
        for dir in [Dir::H2D, Dir::D2H] {
            let picked: Vec<&HostRow> = rows.iter().filter(large).filter(|r| r.size == size && r.dir == dir).collect();
            if !picked.is_empty() && picked.iter().all(|r| r.wrong.is_some()) {
                let seen: Vec<String> =
                    picked.iter().map(|r| format!("{}: {}", r.key, r.wrong.as_deref().unwrap_or(""))).collect();
                return Ok((
                    false,
                    format!("wrong data at {} {}: {}", size_name(size), dir_name(dir), seen.join("; ")),
                ));
            }
        }
    }
    let valid: Vec<HostRow> = rows.iter().filter(|r| r.wrong.is_none()).cloned().collect();
    worst(host_ratio(&valid, pick), 0.8, none)
}

/// Per size >= 16 MiB and direction, the ratio of the best row that `pick` accepts to CUDA's
/// pinned copy.
fn host_ratio(rows: &[HostRow], pick: impl Fn(&HostRow) -> bool) -> Vec<(String, Result<f64, String>)> {
    let mut out = Vec::new();
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.size).filter(|&s| s >= 16 * MIB).collect();
    sizes.dedup();
    for size in sizes {
        for dir in [Dir::H2D, Dir::D2H] {
            let candidates: Vec<&HostRow> = rows.iter().filter(|r| r.size == size && r.dir == dir && pick(r)).collect();
            let best = candidates
                .iter()
                .filter_map(|r| r.ratio_pinned.as_ref().ok().map(|v| (*v, r.key)))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let what = format!("{} {}", size_name(size), dir_name(dir));
            let value = match best {
                Some((v, key)) => Ok((v, key)),
                None => Err(candidates
                    .first()
                    .and_then(|r| r.ratio_pinned.as_ref().err().cloned())
                    .unwrap_or_else(|| "no lava-flow row".into())),
            };
            out.push((
                match &value {
                    Ok((_, key)) if candidates.len() > 1 => format!("{what} ({key})"),
                    _ => what,
                },
                value.map(|(v, _)| v),
            ));
        }
    }
    out
}

pub fn evaluate(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    t.push(target(
        "D2D copy >= 0.9x cuMemcpyDtoD at every size >= 1 MiB (lava-flow auto method)",
        section(&r.d2d, "device-to-device").and_then(|d| {
            if !d.auto_wrong.is_empty() {
                return Ok((false, format!("the copy gave wrong data at {}", d.auto_wrong.join("; "))));
            }
            let pairs = d.auto_ratio.iter().map(|(s, v)| (size_name(*s), v.clone())).collect();
            worst(pairs, 0.9, "no size was measured")
        }),
    ));
    let no_16 = "no host transfer of 16 MiB or more was measured (--max-size)";
    t.push(target(
        "host transfers to and from DEVICE_LOCAL >= 0.8x pinned cuMemcpy at >= 16 MiB, H2D and D2H (best lava-flow path)",
        section(&r.host, "host transfer").and_then(|h| host_target(&h.rows, |row| row.lava_flow && !row.host_visible, no_16)),
    ));
    t.push(target(
        "host transfers >= 0.8x pinned cuMemcpy at >= 16 MiB, H2D and D2H (auto path from pageable memory)",
        section(&r.host, "host transfer").and_then(|h| host_target(&h.rows, |row| row.auto_pageable, no_16)),
    ));
    t.push(target(
        "HOST_VISIBLE write and read >= 0.8x host memcpy at >= 16 MiB",
        section(&r.host, "host transfer").and_then(|h| {
            let large = || h.rows.iter().filter(|row| row.host_visible && row.size >= 16 * MIB);
            if let Some(row) = large().find(|row| row.wrong.is_some()) {
                let e = row.wrong.as_deref().unwrap_or("");
                return Ok((false, format!("{} at {}: {e}", row.key, size_name(row.size))));
            }
            let pairs = large()
                .map(|row| {
                    let what =
                        format!("{} {}", size_name(row.size), if row.dir == Dir::H2D { "write" } else { "read" });
                    (what, row.ratio_memcpy.clone().unwrap_or_else(|| Err("no ratio".into())))
                })
                .collect();
            worst(pairs, 0.8, no_16)
        }),
    ));
    let alloc = section(&r.alloc, "allocation");
    t.push(target(
        "first HOST_VISIBLE allocation in a process <= 1 ms",
        alloc.clone().and_then(|a| {
            let v = a.first_host_visible_us.clone()?;
            Ok((v <= 1000.0, format!("{v:.1} µs (p50 over fresh processes)")))
        }),
    ));
    t.push(target(
        "fresh exportable arena p50 <= 100 µs",
        alloc.clone().map(|a| (a.fresh_p50_us <= 100.0, format!("{:.1} µs", a.fresh_p50_us))),
    ));
    t.push(target(
        "pooled allocation p50 <= 1 µs",
        alloc.map(|a| {
            let worst = a.pooled_p50_us.iter().map(|(_, v)| *v).fold(0.0, f64::max);
            let all: Vec<String> = a.pooled_p50_us.iter().map(|(k, v)| format!("{k} {v:.2} µs")).collect();
            (worst <= 1.0, all.join(", "))
        }),
    ));
    for (size, limit_ms) in [(64 * MIB, 1.0), (GIB, 5.0)] {
        t.push(target(
            format!("first import of a {} arena in another process <= {limit_ms} ms", size_name(size)),
            section(&r.import, "import").and_then(|i| {
                let (_, v) = i
                    .lava_flow_ms
                    .iter()
                    .find(|(s, _)| *s == size)
                    .ok_or_else(|| format!("{} was not measured (--max-size)", size_name(size)))?;
                let v = v.clone()?;
                Ok((v <= limit_ms, format!("{v:.3} ms")))
            }),
        ));
    }
    t.push(target(
        "trim gives memory back",
        section(&r.trim, "memory given back").and_then(|m| Ok((m.given_back.clone()?, m.detail.clone()))),
    ));
    t
}

pub fn to_json(targets: &[Target]) -> Value {
    Value::Array(
        targets
            .iter()
            .map(|t| match &t.verdict {
                Verdict::Pass => json!({ "target": t.name, "verdict": "pass", "measured": t.measured }),
                Verdict::Fail => json!({ "target": t.name, "verdict": "fail", "measured": t.measured }),
                Verdict::NotMeasured(why) => json!({ "target": t.name, "verdict": "not measured", "reason": why }),
            })
            .collect(),
    )
}

/// A reason for the text report, with a missing CUDA said briefly (the top says why).
fn brief_in(why: &str) -> String {
    match why.find("CUDA unavailable") {
        Some(at) => format!("{}CUDA unavailable", &why[..at]),
        None => why.to_string(),
    }
}

pub fn lines(targets: &[Target]) -> Vec<String> {
    targets
        .iter()
        .map(|t| match &t.verdict {
            Verdict::Pass => format!("  PASS          {}: {}", t.name, t.measured),
            Verdict::Fail => format!("  FAIL          {}: {}", t.name, t.measured),
            Verdict::NotMeasured(why) => format!("  not measured  {}: {}", t.name, brief_in(why)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lava_flow::memory::gpu::GpuMemoryKind;

    fn row(size: u64, dir: Dir, key: &'static str, ratio: Result<f64, String>, wrong: Option<&str>) -> HostRow {
        HostRow {
            size,
            dir,
            key,
            lava_flow: true,
            auto_pageable: key == "auto",
            host_visible: key == "hv",
            wrong: wrong.map(str::to_string),
            ratio_pinned: ratio,
            ratio_memcpy: (key == "hv").then_some(Ok(0.9)),
        }
    }

    fn results(d2d: D2dSummary, host: Vec<HostRow>) -> Results {
        Results {
            alloc: Ok(AllocSummary {
                pooled_p50_us: vec![(GpuMemoryKind::DeviceLocal, 0.5), (GpuMemoryKind::HostVisible, 1.5)],
                fresh_p50_us: 50.0,
                first_host_visible_us: Err("the first-allocation child failed: boom".into()),
            }),
            d2d: Ok(d2d),
            host: Ok(HostSummary { rows: host }),
            import: Ok(ImportSummary { lava_flow_ms: vec![(64 * MIB, Ok(0.5))] }),
            trim: Err("no device".into()),
        }
    }

    fn verdicts(targets: &[Target]) -> Vec<&'static str> {
        targets
            .iter()
            .map(|t| match t.verdict {
                Verdict::Pass => "pass",
                Verdict::Fail => "fail",
                Verdict::NotMeasured(_) => "not measured",
            })
            .collect()
    }

    #[test]
    fn verdicts_follow_the_measurements() {
        let d2d = D2dSummary { auto_ratio: vec![(MIB, Ok(0.95)), (4 * MIB, Ok(0.91))], auto_wrong: vec![] };
        let host = vec![
            row(16 * MIB, Dir::H2D, "auto", Ok(0.5), None),
            row(16 * MIB, Dir::H2D, "pinned", Ok(0.85), None),
            row(16 * MIB, Dir::D2H, "auto", Ok(0.9), None),
            row(16 * MIB, Dir::D2H, "hv", Ok(0.2), None),
            row(MIB, Dir::H2D, "auto", Ok(0.1), None),
        ];
        let t = evaluate(&results(d2d, host));
        assert_eq!(
            verdicts(&t),
            [
                "pass",         // D2D: worst 0.91
                "pass",         // best path: 0.85 H2D, 0.9 D2H
                "fail",         // auto: 0.5 H2D
                "pass",         // HOST_VISIBLE vs memcpy: 0.9
                "not measured", // first HOST_VISIBLE: the child failed
                "pass",         // fresh 50 us
                "fail",         // pooled: HOST_VISIBLE 1.5 us
                "pass",         // import 64 MiB 0.5 ms
                "not measured", // 1 GiB not measured
                "not measured", // trim section failed
            ]
        );
    }

    #[test]
    fn wrong_data_fails_and_missing_cuda_is_not_measured() {
        let d2d = D2dSummary { auto_ratio: vec![(MIB, Ok(2.0))], auto_wrong: vec!["1 MiB: wrong data".into()] };
        let host = vec![
            row(16 * MIB, Dir::H2D, "auto", Ok(2.0), Some("wrong data: at byte 0")),
            row(16 * MIB, Dir::H2D, "pinned", Err("CUDA unavailable: no libcuda".into()), None),
            row(16 * MIB, Dir::D2H, "auto", Err("CUDA unavailable: no libcuda".into()), None),
        ];
        let t = evaluate(&results(d2d, host));
        let v = verdicts(&t);
        assert_eq!(v[0], "fail");
        assert_eq!(v[1], "not measured"); // the only valid H2D row has no CUDA baseline
        assert_eq!(v[2], "fail"); // the auto path moved wrong data
        match &t[1].verdict {
            Verdict::NotMeasured(why) => assert!(why.contains("CUDA unavailable"), "{why}"),
            _ => unreachable!(),
        }
    }
}
