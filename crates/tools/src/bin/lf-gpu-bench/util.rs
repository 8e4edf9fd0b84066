//! Statistics, formatting, the machine's description and the child processes the bench runs
//! (itself, with `--child ...`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p` quantile (0..=1) of `values`, nearest rank (NaN when empty).
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// GB/s (10^9 bytes per second) of `bytes` moved in `seconds`.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

pub fn size_name(bytes: u64) -> String {
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// Seconds taken by `f`, host wall clock.
pub fn timed<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<(f64, T), E> {
    let start = Instant::now();
    let value = f()?;
    Ok((start.elapsed().as_secs_f64(), value))
}

pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{text:?} is not an even number of hex digits"));
    }
    Ok((0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits")).collect())
}

/// A JSON number, or null for NaN and infinities (which JSON cannot hold).
pub fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// A measurement or why there is none, as JSON: the number, or `{"unavailable": why}`.
pub fn num_or(x: &Result<f64, String>) -> Value {
    match x {
        Ok(v) => num(*v),
        Err(why) => json!({ "unavailable": why }),
    }
}

/// `e` for the text report: a missing CUDA is said once at the top, not on every row.
pub fn brief(e: &str) -> &str {
    if e.starts_with("CUDA unavailable") {
        "CUDA unavailable"
    } else {
        e
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The host: name, CPU model and count, kernel.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|text| {
        text.lines()
            .find(|l| l.starts_with("model name") || l.starts_with("Model"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    json!({
        "hostname": read_trimmed("/proc/sys/kernel/hostname"),
        "cpu_model": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).ok(),
    })
}

/// How long a child may run before it is killed (a hung driver must not hang the bench).
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs this executable with `--child` and `args`, and parses the one JSON object it prints
/// on stdout. A child that fails says why in a JSON `error` field or on stderr; either
/// becomes the error here.
pub fn run_child(args: &[String]) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable to run a child: {e}"))?;
    let mut child = Command::new(&exe)
        .arg("--child")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let mut out_pipe = child.stdout.take().expect("piped");
    let mut err_pipe = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("the child `{}` ran past {CHILD_TIMEOUT:?} and was killed", args.join(" ")));
            }
            Err(e) => break Err(format!("waiting for the child: {e}")),
        }
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let status = status?;
    let parsed: Option<Value> = stdout.lines().rev().find_map(|l| serde_json::from_str(l).ok());
    if let Some(error) = parsed.as_ref().and_then(|v| v.get("error")).and_then(Value::as_str) {
        return Err(error.to_string());
    }
    match parsed {
        Some(value) if status.success() => Ok(value),
        _ => {
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(format!("the child `{}` failed ({status}): {}", args.join(" "), tail.join(" / ")))
        }
    }
}

/// The child's side: prints `value` as one line on stdout.
pub fn child_reply(value: &Value) {
    println!("{}", serde_json::to_string(value).expect("JSON values serialise"));
}

/// How many times each case's block of reps comes round.
pub const ROUNDS: usize = 2;

/// The reps of one case's block in round `round` (of [`ROUNDS`]), out of `reps` in all, as
/// (rep number, untimed). Cases take turns in blocks, not rep by rep: CUDA's and Vulkan's
/// contexts take turns on the GPU, and the first call after a switch pays hundreds of
/// microseconds for it, so each block starts with an untimed call.
pub fn block(reps: usize, round: usize) -> impl Iterator<Item = (usize, bool)> {
    let per_round = reps.div_ceil(ROUNDS);
    let start = (per_round * round).min(reps);
    let n = per_round.min(reps - start);
    std::iter::once((start, true)).chain((start..start + n).map(|rep| (rep, false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert!(from_hex("abc").is_err());
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.99), 5.0);
    }
}
