//! The tools' command lines as a user meets them (the built binaries): `--help` lists every
//! option with a description, hidden options stay hidden, a bad value or an unknown option is
//! refused naming it with exit status 2, and the value syntax (sizes, lists) is accepted where
//! the scripts use it. Nothing here measures: only lf-alloc-bench runs, with a few allocations.

use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    for var in lava_flow::env::VARS {
        cmd.env_remove(var.name);
    }
    cmd.env("XDG_RUNTIME_DIR", std::env::var_os("XDG_RUNTIME_DIR").unwrap_or_else(|| "/tmp".into()));
    cmd.output().unwrap_or_else(|e| panic!("running {exe}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// `-h` succeeds, and each of `options` has a line of its own with a description after it;
/// the help names no option outside `options` (and -h/--help), so a new option gets a test.
fn help_lists(exe: &str, mode: &[&str], options: &[&str]) {
    let mut args = mode.to_vec();
    args.push("-h");
    let out = run(exe, &args);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    let listed: Vec<(&str, &str)> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("--") || l.starts_with("-h, --help"))
        .map(|l| {
            let l = l.trim_start_matches("-h, ");
            let (flag, rest) = l.split_once(' ').unwrap_or((l, ""));
            (flag, rest.trim_start_matches(|c: char| c != ' ' && c != '\t').trim())
        })
        .collect();
    for (flag, description) in &listed {
        assert!(!description.is_empty(), "{args:?}: {flag} has no description:\n{help}");
    }
    let names: Vec<&str> = listed.iter().map(|(f, _)| *f).filter(|f| *f != "--help").collect();
    assert_eq!(names, options, "{args:?} lists other options than expected:\n{help}");
}

/// Refused with exit status 2, clap's `error:` and each of `words` on stderr.
fn refused(exe: &str, args: &[&str], words: &[&str]) {
    let out = run(exe, args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?} was not refused: {out:?}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    for word in words {
        assert!(stderr.contains(word), "{args:?}: {word:?} not in {stderr}");
    }
}

const LF_BENCH: &str = env!("CARGO_BIN_EXE_lf-bench");

#[test]
fn lf_bench_help_lists_every_option_of_every_benchmark() {
    #[rustfmt::skip]
    help_lists(LF_BENCH, &[], &[
        "--quick", "--json", "--json-out", "--plot", "--from-json", "--sizes", "--bw-sizes", "--iters",
        "--modes", "--payloads", "--window", "--no-pin", "--no-peers", "--iceoryx2", "--mpi-pingpong",
        "--gpu", "--fan-in", "--fan-out", "--mpi",
    ]);
    #[rustfmt::skip]
    help_lists(LF_BENCH, &["--fan-in"], &[
        "--fan-in", "--quick", "--json", "--json-out", "--size", "--producers", "--warm", "--window",
        "--no-pin", "--no-peers", "--iceoryx2-fanin", "--mpi-fanin", "--over",
    ]);
    #[rustfmt::skip]
    help_lists(LF_BENCH, &["--fan-out"], &[
        "--fan-out", "--quick", "--json", "--json-out", "--size", "--small-size", "--consumers", "--warm",
        "--window", "--no-pin", "--no-peers", "--iceoryx2-fanout", "--wait",
    ]);
    #[cfg(feature = "vulkan")]
    {
        help_lists(LF_BENCH, &["--gpu"], &["--gpu", "--quick", "--json"]);
        #[rustfmt::skip]
        help_lists(LF_BENCH, &["--fan-out", "--gpu"], &[
            "--fan-out", "--gpu", "--quick", "--json", "--json-out", "--sizes", "--consumers", "--iters",
            "--wait", "--no-pin",
        ]);
    }
    #[cfg(feature = "mpi")]
    #[rustfmt::skip]
    help_lists(LF_BENCH, &["--mpi"], &[
        "--mpi", "--quick", "--json", "--sizes", "--window", "--rounds", "--iters", "--untouched", "--no-gpu",
    ]);
}

#[test]
fn lf_bench_refuses_bad_values_naming_the_option() {
    refused(LF_BENCH, &["--sizes", "8,4X"], &["--sizes", "\"4X\" is not a size"]);
    refused(LF_BENCH, &["--sizes", "0"], &["--sizes", "at least 1 byte"]);
    refused(LF_BENCH, &["--iters", "many"], &["--iters", "many"]);
    refused(LF_BENCH, &["--modes", "capi,fast"], &["--modes", "fast", "capi, busy, block"]);
    refused(LF_BENCH, &["--payloads", "zero"], &["--payloads", "zero-copy"]);
    refused(LF_BENCH, &["--bogus"], &["--bogus"]);
    refused(LF_BENCH, &["--from-json", "saved.json"], &["give --plot DIR"]);
    refused(LF_BENCH, &["--fan-in", "--producers", "1,9"], &["--producers", "9 is out of range", "1 to 8"]);
    refused(LF_BENCH, &["--fan-in", "--warm", "0"], &["--warm", "give seconds"]);
    refused(LF_BENCH, &["--fan-in", "--size", "4"], &["--size 4 is out of range"]);
    refused(LF_BENCH, &["--fan-in", "--over", "tcp"], &["--over", "tcp", "mpi"]);
    refused(LF_BENCH, &["--fan-in", "--consumers", "2"], &["--consumers"]);
    refused(LF_BENCH, &["--fan-out", "--size", "100"], &["--size 100 is out of range", "multiple of 8"]);
    refused(LF_BENCH, &["--fan-out", "--consumers", "0"], &["--consumers", "out of range"]);
    refused(LF_BENCH, &["--fan-out", "--wait", "poll"], &["--wait", "busy, spin, block"]);
    #[cfg(feature = "vulkan")]
    refused(LF_BENCH, &["--fan-out", "--gpu", "--iters", "0"], &["--iters", "1 or more"]);
    #[cfg(feature = "vulkan")]
    refused(LF_BENCH, &["--gpu", "--sizes", "8"], &["--sizes"]);
}

#[test]
fn lf_alloc_bench_takes_its_options_and_refuses_bad_ones() {
    let exe = env!("CARGO_BIN_EXE_lf-alloc-bench");
    help_lists(exe, &[], &["--json", "--iterations"]);
    refused(exe, &["--iterations", "0"], &["--iterations", "1 or more"]);
    refused(exe, &["--iterations"], &["--iterations"]);
    refused(exe, &["--verbose"], &["--verbose"]);
    // A few allocations per row: the count given is the count used.
    let out = run(exe, &["--iterations", "10", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(doc["iterations"], 10, "{doc}");
    let malloc = doc["results"].as_array().expect("results").iter().filter(|r| r["strategy"] == "malloc").count();
    assert_eq!(malloc, 7, "a malloc row per size: {doc}");
}

#[cfg(feature = "vulkan")]
#[test]
fn lf_gpu_bench_help_hides_the_child_roles_and_refuses_bad_values() {
    let exe = env!("CARGO_BIN_EXE_lf-gpu-bench");
    help_lists(exe, &[], &["--json", "--quick", "--max-size", "--reps", "--only"]);
    let long = text(&run(exe, &["--help"]).stdout);
    for hidden in ["--child", "--uuid", "--lf-fd", "--driver-desc", "--cuda-ipc"] {
        assert!(!long.contains(hidden), "{hidden} is for the bench's own children: {long}");
    }
    refused(exe, &["--max-size", "1X"], &["--max-size", "\"1X\" is not a size"]);
    refused(exe, &["--max-size", "0"], &["--max-size", "at least 1 byte"]);
    refused(exe, &["--only", "d2d,gpu"], &["--only", "gpu", "alloc, d2d, submit, host, import, trim"]);
    refused(exe, &["--reps", "0"], &["--reps"]);
    refused(exe, &["--child", "teleport"], &["--child", "teleport"]);
    // A child's option without the child's role is a mistake, not a run.
    refused(exe, &["--uuid", "00"], &["--child"]);
    // A child that lacks what it needs says so in its JSON reply and fails.
    let out = run(exe, &["--child", "first-alloc"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stdout).contains("the child needs --uuid"), "{out:?}");
}
