//! lf-bench as a user runs it (the built binary, `CARGO_BIN_EXE_lf-bench`), in a small
//! configuration: its text report opens with the configuration and has OSU-style tables, its
//! `--json` is one JSON object carrying the same, and `--plot DIR` writes charts that are
//! valid PNG and SVG files, also from a saved result (`--from-json`). No figure is checked:
//! speed lives in the benchmarks, and this machine may be busy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The charts of a run with the C API headline and the Rust API rows.
const CHARTS: [&str; 4] = ["latency", "bandwidth", "latency-rust-api", "bandwidth-rust-api"];

/// A few sizes, few round trips, no peers: seconds, not minutes.
const SMALL: [&str; 12] = [
    "--quick",
    "--modes",
    "capi,busy",
    "--payloads",
    "zero-copy,touch",
    "--sizes",
    "8,64,4K",
    "--bw-sizes",
    "4K",
    "--iters",
    "200",
    "--no-peers",
];

/// One measuring lf-bench at a time: two would pin their busy-polling processes to the same
/// two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lf_bench(args: &[&str]) -> Output {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lf-bench"));
    cmd.args(args);
    for var in lava_flow::env::VARS {
        cmd.env_remove(var.name);
    }
    cmd.env("XDG_RUNTIME_DIR", std::env::var_os("XDG_RUNTIME_DIR").unwrap_or_else(|| "/tmp".into()));
    cmd.output().expect("running lf-bench")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

fn succeeded(out: &Output, what: &str) -> String {
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "lf-bench {what} failed ({}): {}\n{stdout}", out.status, text(&out.stderr));
    stdout
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lf-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A PNG file of the charts' size, decoded, with more than a background in it.
fn check_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} has no PNG signature", path.display());
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(info.width >= 640 && info.height >= 400, "{}: {}x{}", path.display(), info.width, info.height);
    let pixels = &pixels[..info.buffer_size()];
    let white = pixels.chunks(3).filter(|p| *p == [255, 255, 255]).count();
    let total = pixels.len() / 3;
    assert!(white < total && white > total / 2, "{}: {white} of {total} pixels white: no chart drawn", path.display());
}

/// An SVG file that parses as XML, with `<svg>` at its root and each of `labels` in its text.
fn check_svg(path: &Path, labels: &[&str]) {
    let svg = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg", "{}", path.display());
    let texts: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text()).collect();
    for label in labels {
        assert!(texts.iter().any(|t| t.contains(label)), "{}: no text {label:?} among {texts:?}", path.display());
    }
    let lines = doc.descendants().filter(|n| n.has_tag_name("polyline") || n.has_tag_name("path")).count();
    assert!(lines > 0, "{}: no line drawn", path.display());
}

/// Every chart of [`CHARTS`] in `dir`, valid; the latency chart names lava-flow's rows and
/// the floor.
fn check_charts(dir: &Path) {
    for chart in CHARTS {
        check_png(&dir.join(format!("{chart}.png")));
        let labels: &[&str] = match chart {
            "latency" | "bandwidth" => &["lava-flow copy (C API)", "lava-flow loan (C API)", "floor: copy-and-read"],
            "latency-rust-api" => &["lava-flow zero-copy, busy-poll", "floor: spinning"],
            _ => &["lava-flow touch", "floor: memcpy"],
        };
        check_svg(&dir.join(format!("{chart}.svg")), labels);
    }
}

#[test]
fn text_report_opens_with_the_configuration_and_plot_writes_charts() {
    let dir = scratch("plot");
    let charts = dir.join("charts");
    let json_out = dir.join("result.json");
    let mut args = SMALL.to_vec();
    let (charts_arg, json_arg) = (charts.to_str().expect("UTF-8 path"), json_out.to_str().expect("UTF-8 path"));
    args.extend(["--plot", charts_arg, "--json-out", json_arg]);
    let stdout = succeeded(&lf_bench(&args), "--plot");
    let lines: Vec<&str> = stdout.lines().collect();

    // The configuration first: comment lines up to the first empty one.
    assert!(lines[0].starts_with("# lf-bench"), "{stdout}");
    let config: Vec<&str> = lines.iter().take_while(|l| **l != "#").copied().collect();
    assert!(config.iter().all(|l| l.starts_with("# ")), "{stdout}");
    for key in [
        "# Date: ",
        "# lava-flow ",
        "# CPU: ",
        "kernel: ",
        "# Pinning: ",
        "# Modes: capi,busy",
        "# C API channels: lf_channel_config_init",
        "# Sizes (latency): 8,64,4K",
        "# Iterations: 200 ",
        "# Peer iceoryx2: skipped: --no-peers",
    ] {
        assert!(config.iter().any(|l| l.contains(key)), "no {key:?} in the configuration:\n{}", config.join("\n"));
    }

    // OSU-style tables: a `# Size` header with the columns, rows of numbers under it.
    let header = lines
        .iter()
        .position(|l| l.starts_with("# Size") && l.contains("Latency p50 (us)"))
        .unwrap_or_else(|| panic!("no latency table:\n{stdout}"));
    for column in ["Sender", "p99 (us)", "p99.9 (us)", "Bandwidth (MB/s)", "Floor p50 (us)", "x floor", "x iceoryx2"] {
        assert!(lines[header].contains(column), "no column {column:?}: {}", lines[header]);
    }
    let row: Vec<&str> = lines[header + 1].split_whitespace().collect();
    assert_eq!(&row[..4], ["8", "C", "API", "copy"], "{}", lines[header + 1]);
    for cell in &row[4..9] {
        cell.parse::<f64>().unwrap_or_else(|_| panic!("{cell:?} is no number: {}", lines[header + 1]));
    }
    assert!(
        lines.iter().any(|l| l.starts_with("# Size") && l.contains("Bandwidth (MB/s)") && l.contains("x memcpy")),
        "{stdout}"
    );
    // The targets keep their verdicts.
    assert!(lines.iter().any(|l| l.starts_with("# Target") && l.contains("Verdict")), "{stdout}");
    assert!(
        lines.iter().any(|l| l.starts_with("blocking 8 B wake-up") && (l.contains(" ok ") || l.contains(" MISSED "))),
        "{stdout}"
    );
    assert!(lines.last().is_some_and(|l| l.starts_with("# Charts: ")), "{stdout}");

    check_charts(&charts);

    // The JSON written beside the text carries the configuration and the rows.
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).expect("--json-out file")).expect("JSON");
    assert!(doc["config"]["machine"]["cpu"].is_string(), "{doc}");
    assert_eq!(doc["config"]["sizes"], serde_json::json!([8, 64, 4096]));
    assert!(doc["config"]["peers"].as_array().is_some_and(|p| p.len() == 2), "{doc}");
    assert!(doc["headline"]["rows"].as_array().is_some_and(|r| !r.is_empty()), "{doc}");
    assert!(doc["rust_api"]["bandwidth"].as_array().is_some_and(|r| !r.is_empty()), "{doc}");

    // The same charts from the saved result, without measuring.
    let again = dir.join("again");
    let out = lf_bench(&["--plot", again.to_str().expect("UTF-8 path"), "--from-json", json_arg]);
    let stdout = succeeded(&out, "--from-json");
    assert!(stdout.starts_with("# Charts: "), "{stdout}");
    check_charts(&again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_is_one_object_with_the_configuration() {
    let out = lf_bench(&["--json", "--modes", "capi", "--sizes", "8", "--iters", "100", "--no-peers"]);
    let stdout = succeeded(&out, "--json");
    let doc: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("--json printed no JSON object ({e}):\n{stdout}"));
    let config = &doc["config"];
    assert!(config["machine"]["kernel"].is_string() && config["machine"]["date_utc"].is_string(), "{config}");
    assert_eq!(config["modes"], serde_json::json!(["capi"]));
    assert!(config["text"].as_array().is_some_and(|t| !t.is_empty()), "{config}");
    let rows = doc["headline"]["rows"].as_array().expect("headline rows");
    assert!(rows.iter().any(|r| r["size"] == 8 && r["latency"]["p50_ns"].is_number()), "{doc}");
    assert!(doc["headline"]["targets"].as_array().is_some_and(|t| t.iter().all(|t| t["target"].is_number())), "{doc}");
    assert!(doc["rust_api"].is_null(), "{doc}");
}

#[test]
fn bad_plot_input_is_refused_with_a_message() {
    let dir = scratch("bad");
    let not_json = dir.join("not.json");
    std::fs::write(&not_json, "lf-bench: not a result\n").expect("write");
    let out = lf_bench(&[
        "--plot",
        dir.join("charts").to_str().expect("path"),
        "--from-json",
        not_json.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not.json") && stderr.contains("not lf-bench's JSON"), "{stderr}");

    let out = lf_bench(&["--from-json", not_json.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("give --plot DIR"), "{}", text(&out.stderr));

    // A result without any section to chart.
    let empty = dir.join("empty.json");
    std::fs::write(&empty, "{\"headline\": null, \"rust_api\": null}").expect("write");
    let out =
        lf_bench(&["--plot", dir.join("charts").to_str().expect("path"), "--from-json", empty.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("nothing to chart"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--fan-in` with three producer processes and the pair beside them: every row received
/// messages in its window, from every producer, each producer's in order and exactly once; the
/// text names the cores and how the producers share them. No figure is checked.
#[test]
fn fan_in_rows_receive_from_every_producer_in_order() {
    let args = ["--fan-in", "--quick", "--no-peers", "--producers", "1,3", "--warm", "0.05", "--window", "0.5"];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let doc: Value =
        serde_json::from_str(&succeeded(&lf_bench(&json_args), "--fan-in --json")).expect("one JSON object");
    let rows = doc["rows"].as_array().expect("rows");
    let shape: Vec<(&str, u64)> =
        rows.iter().map(|r| (r["who"].as_str().unwrap(), r["producers"].as_u64().unwrap())).collect();
    assert_eq!(shape, [("lava-flow pair", 1), ("lava-flow fan-in", 1), ("lava-flow fan-in", 3)], "{doc:#}");
    for row in rows {
        let tally = &row["tally"];
        assert!(row["error"].is_null(), "{row:#}");
        assert_eq!(tally["errors"], 0, "a message out of order, repeated or lost: {row:#}");
        let per: Vec<u64> = tally["per_producer"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(per.len() as u64, row["producers"].as_u64().unwrap(), "{row:#}");
        assert!(per.iter().all(|&n| n > 0), "a producer was never served in the window: {row:#}");
        assert_eq!(per.iter().sum::<u64>(), tally["messages"].as_u64().unwrap(), "{row:#}");
        assert!(tally["per_msg_p50_ns"].as_f64().is_some_and(|v| v > 0.0), "{row:#}");
    }
    let skipped = doc["config"]["peers"].as_array().unwrap();
    assert!(skipped.iter().all(|p| p["found"] == false && p["why"] == "--no-peers was given"), "{doc:#}");
    assert!(doc["targets"][0]["value"].is_f64(), "fairness at 3 producers: {doc:#}");

    let text = succeeded(&lf_bench(&args), "--fan-in");
    let cores = text.lines().find(|l| l.starts_with("# Cores: ")).unwrap_or_else(|| panic!("no cores line:\n{text}"));
    assert!(cores.contains("cores allowed"), "{cores}");
    assert!(text.contains("# Producers  Who") && text.contains("lava-flow fan-in"), "{text}");
    assert!(text.contains("Peer iceoryx2: skipped: --no-peers was given"), "{text}");
}

/// `--fan-out` with three consumer processes and the pair beside them, by reference and
/// copied: every consumer of every row received every message the producer sent, each in
/// order, whole and once; by reference every message reached the consumers as the producer's
/// own memory (LF_MESSAGE_ZERO_COPY) and the producer listed its consumers, copied none did;
/// the text names the cores and how the consumers share them. No figure is checked.
#[test]
fn fan_out_rows_reach_every_consumer_in_order() {
    let dir = scratch("fan-out");
    let json_out = dir.join("fan-out.json");
    let args = [
        "--fan-out",
        "--quick",
        "--no-peers",
        "--consumers",
        "1,3",
        "--size",
        "64K",
        "--warm",
        "0.05",
        "--window",
        "0.3",
        "--json-out",
        json_out.to_str().expect("UTF-8 path"),
    ];
    let text = succeeded(&lf_bench(&args), "--fan-out");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).expect("--json-out file")).expect("JSON");
    let rows = doc["rows"].as_array().expect("rows");
    let shape: Vec<(&str, u64, &str)> = rows
        .iter()
        .map(|r| (r["who"].as_str().unwrap(), r["consumers"].as_u64().unwrap(), r["mode"].as_str().unwrap()))
        .collect();
    let (pair, fan_out) = ("lava-flow pair", "lava-flow fan-out");
    assert_eq!(
        shape,
        [
            (pair, 1, "ref"),
            (fan_out, 1, "ref"),
            (fan_out, 3, "ref"),
            (pair, 1, "copy"),
            (fan_out, 1, "copy"),
            (fan_out, 3, "copy")
        ],
        "{doc:#}"
    );
    for row in rows {
        assert!(row["error"].is_null(), "{row:#}");
        let result = &row["result"];
        let consumers = row["consumers"].as_u64().unwrap();
        let sent = result["sent"].as_u64().unwrap();
        assert!(sent > 0 && result["send_p50_ns"].as_f64().is_some_and(|v| v > 0.0), "{row:#}");
        let got = result["consumer_results"].as_array().expect("consumer_results");
        let indices: Vec<u64> = got.iter().map(|c| c["consumer"].as_u64().unwrap()).collect();
        assert_eq!(indices, (0..consumers).collect::<Vec<_>>(), "a line from every consumer: {row:#}");
        for c in got {
            assert_eq!(c["received"].as_u64(), Some(sent), "a consumer missed messages: {row:#}");
            assert_eq!(c["errors"], 0, "a message out of order, repeated, lost or torn: {row:#}");
            let zero_copy = if row["mode"] == "ref" { sent } else { 0 };
            assert_eq!(c["zero_copy"].as_u64(), Some(zero_copy), "{row:#}");
        }
        assert_eq!(result["all_received"], true, "{row:#}");
        assert_eq!(result["peers_alive"].as_u64(), Some(consumers), "{row:#}");
        if row["who"] == fan_out {
            let pids: std::collections::BTreeSet<u64> =
                result["peer_pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect();
            assert!(pids.len() as u64 == consumers && !pids.contains(&0), "{row:#}");
        }
    }
    assert!(doc["config"]["peers"][0]["why"] == "--no-peers was given", "{doc:#}");
    assert!(doc["targets"][0]["value"].is_f64(), "send ratio at 3 consumers: {doc:#}");

    let cores = text.lines().find(|l| l.starts_with("# Cores: ")).unwrap_or_else(|| panic!("no cores line:\n{text}"));
    assert!(cores.contains("cores allowed") && cores.contains("consumer"), "{cores}");
    assert!(text.contains("# Consumers  Who") && text.contains("lava-flow fan-out"), "{text}");
    assert!(text.contains("Peer iceoryx2: skipped: --no-peers was given"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
