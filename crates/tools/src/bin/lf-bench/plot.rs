//! `--plot DIR`: charts of a run (or of a saved JSON result, `--from-json FILE`), each as SVG
//! and PNG, log-log, lava-flow's rows, the floors and the peers on the same axes:
//!
//! - `latency`: the C API headline's p50 against the size (touched messages), lava-flow's
//!   three ways of sending, iceoryx2, Open MPI and the copy-and-read floor (the mean of the
//!   probes around the cases of each size);
//! - `bandwidth`: the same rows as size / p50 (a ping-pong moves one message each way);
//! - `latency-rust-api`: the Rust API rows per wait and payload, with the floors measured
//!   once (spinning, minimal ring, eventfd) as flat lines;
//! - `bandwidth-rust-api`: the Rust API's one-direction bandwidth per payload, with the
//!   memcpy and cross-core copy floors.
//!
//! A chart whose section did not run is not written. Everything is read from the JSON
//! document lf-bench prints, so that a live run and a saved one are charted alike. Text is
//! drawn with DejaVu Sans, embedded (`crates/tools/fonts`, its license beside it), so that
//! no font library of the system is needed.

use std::path::{Path, PathBuf};

use plotters::coord::combinators::BindKeyPoints;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 700;
const FONT: &[u8] = include_bytes!("../../../fonts/DejaVuSans.ttf");

/// lava-flow's series, the peers', the floors'.
const LAVA_FLOW: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
];
const PEERS: [RGBColor; 2] = [RGBColor(255, 127, 14), RGBColor(214, 39, 40)];
const FLOORS: [RGBColor; 3] = [RGBColor(0, 0, 0), RGBColor(127, 127, 127), RGBColor(188, 189, 34)];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    LavaFlow,
    Peer,
    Floor,
}

struct Series {
    name: String,
    kind: Kind,
    color: RGBColor,
    /// A floor's dashes: (dash, gap) in pixels, one pattern per floor of a chart.
    dash: (i32, i32),
    /// Line width in pixels.
    width: u32,
    /// (size in bytes, value), sorted by size.
    points: Vec<(f64, f64)>,
}

struct Chart {
    file: &'static str,
    title: String,
    y_desc: &'static str,
    series: Vec<Series>,
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite() && *x > 0.0)
}

fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// A value label without trailing zeros, thousands separated: 0.05, 1, 2.5, 20,000.
fn value_label(v: f64) -> String {
    if v >= 1000.0 {
        let digits = format!("{v:.0}");
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        return out;
    }
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// 1, 2, 5 times the powers of ten within `lo..=hi`.
fn decade_points(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut p = 10f64.powi(lo.log10().floor() as i32);
    while p <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = p * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        p *= 10.0;
    }
    out
}

fn add(series: &mut Vec<Series>, name: String, kind: Kind, mut points: Vec<(f64, f64)>) {
    if points.is_empty() {
        return;
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let same = series.iter().filter(|s| s.kind == kind).count();
    let color = match kind {
        Kind::LavaFlow => LAVA_FLOW[same % LAVA_FLOW.len()],
        Kind::Peer => PEERS[same % PEERS.len()],
        Kind::Floor => FLOORS[same % FLOORS.len()],
    };
    let dash = [(10, 5), (3, 4), (16, 6)][same % 3];
    let width = if kind == Kind::LavaFlow { 3 } else { 2 };
    series.push(Series { name, kind, color, dash, width, points });
}

/// The headline's two charts (latency and bandwidth of the touched rows; the untouched ones
/// where no size was touched).
fn headline_charts(h: &Value) -> Vec<Chart> {
    let rows: Vec<&Value> = h["rows"].as_array().map(|r| r.iter().collect()).unwrap_or_default();
    let busy: Vec<&Value> = rows.into_iter().filter(|r| r["wait"] == "busy-poll").collect();
    let touched = busy.iter().any(|r| r["touch"] == true);
    let rows: Vec<&Value> = busy.into_iter().filter(|r| r["touch"] == touched).collect();
    let mut senders: Vec<(String, String)> = Vec::new();
    for r in &rows {
        let key = (r["who"].as_str().unwrap_or("").to_owned(), r["send"].as_str().unwrap_or("").to_owned());
        if !senders.contains(&key) {
            senders.push(key);
        }
    }
    let mut latency = Vec::new();
    let mut bandwidth = Vec::new();
    for (who, send) in &senders {
        let mine: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r["who"] == who.as_str() && r["send"] == send.as_str())
            .filter_map(|r| Some((f(&r["size"])?, f(&r["latency"]["p50_ns"])?)))
            .collect();
        let (name, kind) = if who.starts_with("lava-flow") {
            (format!("lava-flow {send} (C API)"), Kind::LavaFlow)
        } else {
            (who.clone(), Kind::Peer)
        };
        add(&mut latency, name.clone(), kind, mine.iter().map(|&(s, ns)| (s, ns / 1e3)).collect());
        add(&mut bandwidth, name, kind, mine.iter().map(|&(s, ns)| (s, s / ns * 1e3)).collect());
    }
    // The floor of each size: the mean of the probes around all of its cases.
    let mut floor: Vec<(f64, f64)> = Vec::new();
    let mut sizes: Vec<f64> = rows.iter().filter_map(|r| f(&r["size"])).collect();
    sizes.dedup();
    for s in sizes {
        let probes: Vec<f64> =
            rows.iter().filter(|r| f(&r["size"]) == Some(s)).filter_map(|r| f(&r["floor"]["p50_mean_ns"])).collect();
        if !probes.is_empty() {
            floor.push((s, probes.iter().sum::<f64>() / probes.len() as f64));
        }
    }
    let floor_name = if touched { "floor: copy-and-read ping-pong" } else { "floor: spinning on one cache line" };
    add(&mut latency, floor_name.to_owned(), Kind::Floor, floor.iter().map(|&(s, ns)| (s, ns / 1e3)).collect());
    add(&mut bandwidth, floor_name.to_owned(), Kind::Floor, floor.iter().map(|&(s, ns)| (s, s / ns * 1e3)).collect());
    let what = if touched { "touched messages" } else { "untouched messages" };
    vec![
        Chart {
            file: "latency",
            title: format!("Latency: half round trip p50, {what}, two processes"),
            y_desc: "latency p50 (us)",
            series: latency,
        },
        Chart {
            file: "bandwidth",
            title: format!("Bandwidth of the ping-pong: size / p50, {what}"),
            y_desc: "bandwidth (MB/s)",
            series: bandwidth,
        },
    ]
}

/// The Rust API's two charts.
fn rust_api_charts(r: &Value) -> Vec<Chart> {
    let empty = Vec::new();
    let lat = r["latency"].as_array().unwrap_or(&empty);
    let mut groups: Vec<(String, String)> = Vec::new();
    for l in lat {
        let key = (l["mode"].as_str().unwrap_or("").to_owned(), l["payload"].as_str().unwrap_or("").to_owned());
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    let mut latency = Vec::new();
    for (mode, payload) in &groups {
        let points = lat
            .iter()
            .filter(|l| l["mode"] == mode.as_str() && l["payload"] == payload.as_str())
            .filter_map(|l| Some((f(&l["size"])?, f(&l["p50_ns"])? / 1e3)))
            .collect();
        let wait = if mode == "block" { "blocking" } else { "busy-poll" };
        add(&mut latency, format!("lava-flow {payload}, {wait}"), Kind::LavaFlow, points);
        // One colour per payload (the index of its first group); the blocking rows thin.
        if let Some(s) = latency.last_mut().filter(|s| s.name.ends_with(wait)) {
            let index = groups.iter().position(|(_, p)| p == payload).unwrap_or(0);
            s.color = LAVA_FLOW[index % LAVA_FLOW.len()];
            s.width = if mode == "block" { 1 } else { 3 };
        }
    }
    let sizes: Vec<f64> = lat.iter().filter_map(|l| f(&l["size"])).collect();
    let (lo, hi) = (sizes.iter().copied().fold(f64::MAX, f64::min), sizes.iter().copied().fold(0.0, f64::max));
    let mut floors =
        vec![("spin_cache_line", "floor: spinning on one cache line"), ("minimal_ring", "floor: minimal ring")];
    if groups.iter().any(|(m, _)| m == "block") {
        floors.push(("eventfd", "floor: eventfd ping-pong"));
    }
    for (key, name) in floors {
        if let (Some(p50), false) = (f(&r["floors"][key]["p50_ns"]), sizes.is_empty()) {
            add(&mut latency, name.to_owned(), Kind::Floor, vec![(lo, p50 / 1e3), (hi, p50 / 1e3)]);
        }
    }
    let bw = r["bandwidth"].as_array().unwrap_or(&empty);
    let mut payloads: Vec<String> = Vec::new();
    for b in bw {
        let p = b["payload"].as_str().unwrap_or("").to_owned();
        if !payloads.contains(&p) {
            payloads.push(p);
        }
    }
    let mut bandwidth = Vec::new();
    for p in &payloads {
        let points = bw
            .iter()
            .filter(|b| b["payload"] == p.as_str())
            .filter_map(|b| Some((f(&b["size"])?, f(&b["bytes_per_s"])? / 1e6)))
            .collect();
        let untouched = if p == "zero-copy" || p == "buffer" { " (untouched: size x message rate)" } else { "" };
        add(&mut bandwidth, format!("lava-flow {p}{untouched}"), Kind::LavaFlow, points);
    }
    for (key, name) in [("memcpy", "floor: memcpy, one thread"), ("cross_core_copy", "floor: cross-core copy")] {
        let points = r["floors"][key]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter_map(|b| Some((f(&b["size"])?, f(&b["bytes_per_s"])? / 1e6)))
            .collect();
        add(&mut bandwidth, name.to_owned(), Kind::Floor, points);
    }
    vec![
        Chart {
            file: "latency-rust-api",
            title: "Latency, Rust API: half round trip p50, two processes".to_owned(),
            y_desc: "latency p50 (us)",
            series: latency,
        },
        Chart {
            file: "bandwidth-rust-api",
            title: "Bandwidth, Rust API: one direction, busy-poll, windowed".to_owned(),
            y_desc: "bandwidth (MB/s)",
            series: bandwidth,
        },
    ]
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart, subtitle: &str) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let all: Vec<(f64, f64)> = c.series.iter().flat_map(|s| s.points.iter().copied()).collect();
    let (x_lo, x_hi) = all.iter().fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let (y_lo, y_hi) = all.iter().fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (x_lo, x_hi) = (x_lo / 1.4, x_hi * 1.4);
    let (y_lo, y_hi) = (y_lo / 1.6, y_hi * 1.6);
    let mut sizes: Vec<f64> = all.iter().map(|p| p.0).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    // Every size measured is a tick, unless they crowd: then every other one.
    while sizes.len() > 14 {
        sizes = sizes.into_iter().step_by(2).collect();
    }
    let root = root.titled(&c.title, ("sans-serif", 22)).map_err(e)?;
    let (top, plot) = root.split_vertically(24);
    top.draw_text(subtitle, &("sans-serif", 13).into_text_style(&top).color(&RGBColor(90, 90, 90)), (70, 4))
        .map_err(e)?;
    let x = (x_lo..x_hi).log_scale().with_key_points(sizes);
    let y = (y_lo..y_hi).log_scale().with_key_points(decade_points(y_lo, y_hi));
    let mut chart = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(40 + 9 * value_label(y_hi).len() as u32)
        .build_cartesian_2d(x, y)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(c.y_desc)
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| value_label(*v))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(e)?;
    for s in &c.series {
        let (color, width) = (s.color, s.width);
        let style = color.stroke_width(width);
        let legend = move |(x, y): (i32, i32)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(width));
        if s.kind == Kind::Floor {
            chart
                .draw_series(DashedLineSeries::new(s.points.iter().copied(), s.dash.0, s.dash.1, style))
                .map_err(e)?
                .label(s.name.as_str())
                .legend(legend);
        } else {
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(e)?
                .label(s.name.as_str())
                .legend(legend);
            let marker = if s.kind == Kind::Peer { 4 } else { width.min(3) };
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, marker, color.filled()))).map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(e)?;
    plot.present().map_err(e)
}

fn write_png(path: &Path, rgb: &[u8]) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| format!("writing {}: {e}", path.display()))?;
    writer.write_image_data(rgb).map_err(|e| format!("writing {}: {e}", path.display()))?;
    writer.finish().map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The subtitle: the run's machine and date, from the document.
fn subtitle(doc: &Value) -> String {
    let m = &doc["config"]["machine"];
    let mut parts = Vec::new();
    if let Some(cpu) = m["cpu"].as_str() {
        parts.push(format!("{cpu}, {} CPUs", m["cpus_online"]));
    }
    match (m["date_utc"].as_str(), doc["unix_time_s"].as_u64()) {
        (Some(date), _) => parts.push(date.to_owned()),
        // A result from before the configuration was recorded: its time stamp.
        (None, Some(t)) => parts.push(crate::machine::utc(t)),
        (None, None) => {}
    }
    if doc["config"]["pinned"] == true {
        parts.push("pinned to cores 0 and 1".to_owned());
    }
    if let Some(v) = m["lava_flow_version"].as_str() {
        parts.push(format!("lava-flow {v}"));
    }
    if parts.is_empty() {
        "lf-bench".to_owned()
    } else {
        format!("lf-bench; {}", parts.join("; "))
    }
}

/// Writes the charts of `doc` (lf-bench's JSON) into `dir` as SVG and PNG; returns the files
/// written.
pub fn write(doc: &Value, dir: &Path) -> Result<Vec<PathBuf>, String> {
    static FONT_ONCE: std::sync::Once = std::sync::Once::new();
    FONT_ONCE.call_once(|| {
        // The embedded font is a valid TrueType file: a failure here is a build defect.
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("the embedded font does not load");
        }
    });
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut charts = Vec::new();
    if doc["headline"].is_object() {
        charts.extend(headline_charts(&doc["headline"]));
    }
    if doc["rust_api"].is_object() {
        charts.extend(rust_api_charts(&doc["rust_api"]));
    }
    let sub = subtitle(doc);
    let mut written = Vec::new();
    for c in charts.iter().filter(|c| !c.series.is_empty()) {
        let svg_path = dir.join(format!("{}.svg", c.file));
        let mut svg = String::new();
        draw(SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area(), c, &sub)?;
        std::fs::write(&svg_path, svg).map_err(|e| format!("writing {}: {e}", svg_path.display()))?;
        written.push(svg_path);
        let png_path = dir.join(format!("{}.png", c.file));
        let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
        draw(BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT)).into_drawing_area(), c, &sub)?;
        write_png(&png_path, &rgb)?;
        written.push(png_path);
    }
    if written.is_empty() {
        return Err("nothing to chart: the result has no C API headline and no Rust API rows".to_owned());
    }
    Ok(written)
}

/// `--plot DIR --from-json FILE`: the charts of a saved result.
pub fn from_json(file: &Path, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not lf-bench's JSON (from --json or --json-out): {e}", file.display()))?;
    write(&doc, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(size_label(64.0), "64 B");
        assert_eq!(size_label(65536.0), "64 KiB");
        assert_eq!(size_label(16.0 * 1048576.0), "16 MiB");
        assert_eq!(value_label(0.05), "0.05");
        assert_eq!(value_label(2.0), "2");
        assert_eq!(value_label(2000.0), "2,000");
        assert_eq!(value_label(20_000_000.0), "20,000,000");
        assert_eq!(value_label(500.0), "500");
        assert_eq!(decade_points(0.04, 30.0), vec![0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0]);
    }
}
