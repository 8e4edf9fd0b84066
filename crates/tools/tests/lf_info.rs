//! lf-info as a user runs it: the built binary (`CARGO_BIN_EXE_lf-info`), its text and its
//! JSON, checked against what the library itself says on this machine. A channel held by a
//! child process (this test binary, re-executed) is seen alive, then dead once the child is
//! killed with SIGKILL, then cleaned up; a fan-in held by three processes (a consumer and two
//! producers) is seen with each producer's slot, state and pid, one producer's death in its
//! slot, and is cleaned up once all are dead; a fan-out likewise, with each consumer's slot.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::ProcessLocation;
use serde_json::Value;

const CHILD_ENV: &str = "LF_INFO_TEST_CHILD";

/// lf-info with `args`, in an environment without the LF_* variables a caller may have set
/// (the test's own `env` on top), its runtime dir `dir` when given.
fn lf_info(args: &[&str], env: &[(&str, &str)], dir: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lf-info"));
    cmd.args(args);
    for var in lava_flow::env::VARS {
        cmd.env_remove(var.name);
    }
    cmd.env("XDG_RUNTIME_DIR", std::env::var_os("XDG_RUNTIME_DIR").unwrap_or_else(|| "/tmp".into()));
    if let Some(dir) = dir {
        cmd.env("LF_RUNTIME_DIR", dir);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running lf-info")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// Runs lf-info with `--json` and parses stdout as one JSON object; lf-info must succeed.
fn json(args: &[&str], env: &[(&str, &str)], dir: Option<&Path>) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = lf_info(&all, env, dir);
    let text = stdout(&out);
    assert!(out.status.success(), "lf-info {all:?} failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    let value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("lf-info {all:?} printed no JSON object ({e}):\n{text}"));
    assert!(value.is_object(), "{text}");
    value
}

/// The capability row `key` of a `--json` capability view.
fn row<'a>(view: &'a Value, key: &str) -> &'a Value {
    view["capabilities"]["rows"]
        .as_array()
        .expect("capability rows")
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key} in {view:#}"))
}

/// Whether the library opens a Vulkan device here, and its name or why not.
fn library_gpu() -> Result<String, String> {
    let context = Context::new(ContextConfig::default()).map_err(|e| e.to_string())?;
    if let Some(why) = context.gpu_unavailable_reason() {
        return Err(why.to_owned());
    }
    #[cfg(feature = "vulkan")]
    return Ok(context.device_info().expect("a device").name.clone());
    #[cfg(not(feature = "vulkan"))]
    unreachable!("no device without the vulkan feature")
}

/// A fresh runtime dir (0700) for one test.
fn test_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lf-info-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

#[test]
fn the_capability_table_agrees_with_the_library() {
    let view = json(&["--no-mpi"], &[], None);
    let rows = view["capabilities"]["rows"].as_array().unwrap();
    for r in rows {
        let status = r["status"].as_str().unwrap();
        assert!(["available", "unavailable", "not probed"].contains(&status), "{r}");
        assert!(!r["detail"].as_str().unwrap().is_empty(), "every row says what it found: {r}");
        if status == "unavailable" {
            assert!(!r["fix"].as_str().unwrap_or("").is_empty(), "an unavailable row says how to fix it: {r}");
        }
    }
    for key in [
        "cpu.standard",
        "cpu.numa",
        "cpu.hugepages_2m",
        "cpu.gpu_pinned",
        "gpu.vulkan",
        "memory.export_cpu",
        "memory.export_gpu",
        "gpu.semaphore_export",
        "gpu.cuda",
        "channel.shm",
        "channel.vulkan_ipc",
    ] {
        row(&view, key);
    }
    assert_eq!(row(&view, "cpu.standard")["status"], "available");
    assert_eq!(row(&view, "memory.export_cpu")["status"], "available");
    assert_eq!(row(&view, "channel.shm")["status"], "available", "{}", row(&view, "channel.shm"));
    assert_eq!(row(&view, "mpi")["status"], "not probed");
    let numa = row(&view, "cpu.numa")["detail"].as_str().unwrap();
    assert!(numa.contains("NUMA nodes with memory: 0"), "{numa}");

    let vulkan = row(&view, "gpu.vulkan");
    match library_gpu() {
        Ok(name) => {
            assert_eq!(vulkan["status"], "available", "the library opens {name}: {vulkan}");
            assert!(vulkan["detail"].as_str().unwrap().contains(&name), "{vulkan}");
            assert_eq!(row(&view, "memory.export_gpu")["status"], "available");
            assert_eq!(row(&view, "channel.vulkan_ipc")["status"], "available", "{}", row(&view, "channel.vulkan_ipc"));
        }
        Err(why) => {
            assert!(std::env::var("LF_REQUIRE_VULKAN").map_or(true, |v| v != "1"), "no Vulkan device: {why}");
            assert_eq!(vulkan["status"], "unavailable");
            assert!(vulkan["detail"].as_str().unwrap().contains(&why), "{vulkan} vs {why}");
        }
    }

    // The same as text: one line per row, the fix under unavailable ones.
    let out = lf_info(&["--no-mpi"], &[], None);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("CAPABILITY") && text.contains("CPU memory: standard"), "{text}");
    let unavailable = rows.iter().filter(|r| r["status"] == "unavailable").count();
    assert_eq!(text.matches("fix: ").count(), unavailable, "{text}");
    assert!(text.contains(&format!("{} of {} available", rows.len() - unavailable - 1, rows.len())), "{text}");
}

#[test]
fn a_device_that_does_not_exist_makes_the_vulkan_row_unavailable_with_a_reason() {
    let view = json(&["--no-mpi"], &[("LF_VULKAN_DEVICE", "99")], None);
    let vulkan = row(&view, "gpu.vulkan");
    assert_eq!(vulkan["status"], "unavailable", "{vulkan}");
    let detail = vulkan["detail"].as_str().unwrap();
    if library_gpu().is_ok() {
        // A device exists, just not number 99: the reason names the variable and the devices.
        assert!(detail.contains("LF_VULKAN_DEVICE=\"99\" names no device") && detail.contains("0: "), "{detail}");
        assert!(vulkan["fix"].as_str().unwrap().contains("LF_VULKAN_DEVICE"), "{vulkan}");
        assert_eq!(row(&view, "channel.vulkan_ipc")["status"], "unavailable");
    }
    // The CPU rows do not depend on the GPU.
    assert_eq!(row(&view, "cpu.standard")["status"], "available");
    assert_eq!(row(&view, "channel.shm")["status"], "available");
}

#[test]
fn config_says_where_each_value_comes_from() {
    let env = [("LF_TRANSPORTS", "shm"), ("LF_HOST_ID", "lf-info-test-host")];
    let view = json(&["-c"], &env, None);
    let vars = view["config"]["variables"].as_array().unwrap();
    let var =
        |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("{name} missing: {view:#}"));
    assert_eq!(vars.len(), lava_flow::env::VARS.len());
    assert_eq!(
        (&var("LF_TRANSPORTS")["value"], &var("LF_TRANSPORTS")["source"]),
        (&"shm".into(), &"environment".into())
    );
    assert_eq!(var("LF_HOST_ID")["resolved"], "lf-info-test-host");
    assert_eq!((&var("LF_GPU_COPY")["value"], &var("LF_GPU_COPY")["source"]), (&"auto".into(), &"default".into()));
    assert_eq!((&var("LF_LOG_LEVEL")["value"], &var("LF_LOG_LEVEL")["source"]), (&"warn".into(), &"default".into()));
    assert!(var("LF_RUNTIME_DIR")["resolved"].as_str().is_some_and(|d| d.starts_with('/')));

    let out = lf_info(&["-c"], &env, None);
    assert!(out.status.success());
    let text = stdout(&out);
    let line = text.lines().find(|l| l.trim_start().starts_with("LF_TRANSPORTS")).expect("an LF_TRANSPORTS line");
    assert!(line.contains("shm") && line.contains("[environment"), "{line}");
    let line = text.lines().find(|l| l.trim_start().starts_with("LF_GPU_COPY")).expect("an LF_GPU_COPY line");
    assert!(line.contains("auto") && line.contains("[default]"), "{line}");
}

/// The library's MPI, and how the build decided it: from CMake, the LAVA_FLOW_MPI choice it
/// passed to cargo (which this test sees too); from cargo, the feature.
#[test]
fn says_whether_mpi_is_built_in_and_how_that_was_decided() {
    let view = json(&["-c"], &[], None);
    let mpi = &view["lava_flow"]["mpi"];
    assert_eq!(mpi["built"], cfg!(feature = "mpi"), "{view:#}");
    let how = mpi["how"].as_str().expect("lava_flow.mpi.how");
    match option_env!("LAVA_FLOW_MPI_CHOICE") {
        Some(choice) if !choice.is_empty() => assert_eq!(how, choice),
        _ if cfg!(feature = "mpi") => assert_eq!(how, "cargo feature `mpi`"),
        _ => assert!(how.contains("cargo build --features mpi") && how.contains("-DLAVA_FLOW_MPI=ON"), "{how}"),
    }
    let out = lf_info(&["-c"], &[], None);
    assert!(out.status.success());
    let text = stdout(&out);
    let line = text.lines().find(|l| l.starts_with("mpi: ")).unwrap_or_else(|| panic!("no 'mpi:' line:\n{text}"));
    let state = if cfg!(feature = "mpi") { "built in" } else { "not built" };
    assert_eq!(line, format!("mpi: {state} ({how})"));
}

#[test]
fn every_view_prints_one_json_object() {
    let dir = test_dir("json");
    let host = ProcessLocation::from_hostname().unwrap().hostname;
    let view = json(&["-d", "-c", "-p", &host, "--channels"], &[], Some(&dir));
    assert_eq!(view["lava_flow"]["version"], env!("CARGO_PKG_VERSION"));
    for key in ["devices", "config", "peer", "channels"] {
        assert!(view.get(key).is_some(), "{key} missing: {view:#}");
    }
    assert!(view.get("capabilities").is_none(), "the capability table is the view when no other is asked for");
    match library_gpu() {
        Ok(name) => {
            let devices = view["devices"]["devices"].as_array().unwrap();
            let device =
                devices.iter().find(|d| d["name"] == name.as_str()).unwrap_or_else(|| panic!("{name}: {view:#}"));
            assert_eq!(device["default"], true);
            assert!(device["device_uuid"].as_str().is_some() && device["driver_uuid"].as_str().is_some(), "{device}");
            assert!(device["memory_types"].as_array().is_some_and(|t| !t.is_empty()), "{device}");
            assert!(device["external_memory"]["opaque_fd"]["exportable"].is_boolean(), "{device}");
            assert!(device["semaphore_sharing"]["works"].is_boolean(), "{device}");
        }
        Err(_) => assert!(view["devices"]["error"].is_string() || view["devices"]["devices"].as_array().is_some()),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_peer_s_route_says_its_scope_and_why() {
    let host = ProcessLocation::from_hostname().unwrap().hostname;
    let view = json(&["-p", &host], &[], None);
    let peer = &view["peer"];
    assert_eq!(peer["scope"], "local", "{peer:#}");
    assert!(peer["scope_reason"].as_str().unwrap().contains(&format!("same host ({host})")), "{peer:#}");
    assert_eq!(peer["routes"][0]["transport"], "shm", "{peer:#}");
    assert!(peer["error"].is_null(), "{peer:#}");

    // Another host identity: remote, and no transport to it without MPI discovery.
    let view = json(&["-p", "elsewhere,host-id=another-box"], &[], None);
    let peer = &view["peer"];
    assert_eq!(peer["scope"], "remote", "{peer:#}");
    assert!(peer["routes"].as_array().unwrap().is_empty());
    assert!(peer["error"].as_str().unwrap().contains("no remote transport can reach the peer"), "{peer:#}");

    // LF_TRANSPORTS restricts the routes, and the report says so.
    let view = json(&["-p", &host], &[("LF_TRANSPORTS", "shm")], None);
    let reason = view["peer"]["routes"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("allowed by LF_TRANSPORTS=shm"), "{reason}");
    assert_eq!(view["peer"]["routes"][1]["transport"], "shm", "GPU buffers staged: {:#}", view["peer"]);

    // A process of a config file.
    let dir = test_dir("peer");
    let config = dir.join("processes.json");
    std::fs::write(&config, format!(r#"{{ "processes": [ {{ "name": "trainer", "hostname": "{host}" }} ] }}"#))
        .unwrap();
    let view = json(&["-p", &format!("{}:trainer", config.display())], &[], None);
    assert_eq!(view["peer"]["scope"], "local", "{view:#}");
    assert!(view["peer"]["peer_from"].as_str().unwrap().contains("trainer"));

    // A location that is none: exit status 1, the reason on stderr.
    for bad in ["bad/host", &format!("{}:nobody", config.display())] {
        let out = lf_info(&["-p", bad], &[], None);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("lf-info: peer"), "{bad}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process killed with SIGKILL when dropped, so that a failing test leaves none behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The channel a child holds: its name, and the state of the channel in `view`.
fn held<'a>(view: &'a Value, name: &str) -> Option<&'a Value> {
    view["channels"]["channels"].as_array().unwrap().iter().find(|c| c["name"] == name)
}

#[test]
fn channels_are_seen_alive_then_dead_after_sigkill_then_cleaned_up() {
    const TEST: &str = "channels_are_seen_alive_then_dead_after_sigkill_then_cleaned_up";
    if std::env::var_os(CHILD_ENV).is_some() {
        // The child: both ends of channel "held" in two threads, then wait to be killed.
        let context = Context::new({
            let mut c = ContextConfig::default();
            c.gpu = GpuPolicy::Disabled;
            c
        })
        .unwrap();
        let here = ProcessLocation::from_hostname().unwrap();
        let config = ChannelConfig {
            pool_size: 64 << 10,
            rendezvous_timeout: Some(Duration::from_secs(20)),
            ..ChannelConfig::default()
        };
        let (context2, here2, config2) = (context.clone(), here.clone(), config.clone());
        let consumer =
            std::thread::spawn(move || Consumer::create(&context2, "held", &here2, &here2, &config2).unwrap());
        let mut producer = Producer::create(&context, "held", &here, &here, &config).unwrap();
        let mut consumer = consumer.join().unwrap();
        producer.send(b"hello").unwrap();
        assert_eq!(consumer.recv_timeout(Duration::from_secs(10)).unwrap().as_slice(), b"hello");
        println!("@@ ready");
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let dir = test_dir("held");
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env("LF_RUNTIME_DIR", &dir)
            .env_remove("LF_TRANSPORTS")
            .stdout(Stdio::piped())
            .spawn()
            .expect("re-executing the test binary"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("the child ended before it held the channel").unwrap();
        if line.contains("@@ ready") {
            break;
        }
    }
    let pid = child.0.id();

    let view = json(&["--channels"], &[], Some(&dir));
    assert_eq!(view["channels"]["runtime_dir"], dir.display().to_string());
    let channel = held(&view, "held").unwrap_or_else(|| panic!("the child's channel is not listed: {view:#}"));
    assert_eq!(channel["alive"], true, "{channel}");
    assert_eq!(channel["producer"], format!("live (pid {pid})"));
    assert_eq!(channel["consumer"], format!("live (pid {pid})"));
    assert_eq!(channel["socket"], true);
    // Cleaning up leaves a live channel alone.
    let view = json(&["--cleanup"], &[], Some(&dir));
    assert_eq!(view["channels"]["removed"].as_array().unwrap().len(), 0, "{view:#}");
    assert_eq!(held(&view, "held").unwrap()["alive"], true);

    // SAFETY: kill with the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    child.0.wait().unwrap();
    let view = json(&["--channels"], &[], Some(&dir));
    let channel = held(&view, "held").unwrap_or_else(|| panic!("the dead channel's files are gone already: {view:#}"));
    assert_eq!(channel["alive"], false, "{channel}");
    assert_eq!((&channel["producer"], &channel["consumer"]), (&"over".into(), &"over".into()), "{channel}");
    let out = lf_info(&["--channels"], &[], Some(&dir));
    let text = stdout(&out);
    let line = text.lines().find(|l| l.trim_start().starts_with("held ")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("dead"), "{line}");
    assert!(text.contains("`lf-info --cleanup` removes their files"), "{text}");

    let view = json(&["--cleanup"], &[], Some(&dir));
    let removed: Vec<&str> =
        view["channels"]["removed"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    for file in ["held.sock", "held.producer.lock", "held.consumer.lock"] {
        assert!(removed.iter().any(|p| p.ends_with(file)), "{file} not removed: {removed:?}");
    }
    assert!(held(&view, "held").is_none(), "{view:#}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left in the runtime dir: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child running `role` of test `test` (this test binary, re-executed with [`CHILD_ENV`]
/// set to the role), its runtime dir `dir`; returns once it printed `@@ ready`.
fn ready_child(test: &str, role: &str, dir: &Path) -> Killed {
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .env("LF_RUNTIME_DIR", dir)
            .env_remove("LF_TRANSPORTS")
            .stdout(Stdio::piped())
            .spawn()
            .expect("re-executing the test binary"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Read on a thread of its own, so that a child that hangs fails the test instead of
    // blocking it; the thread then keeps draining the pipe.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent && line.contains("@@ ready") {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the {role} child did not get ready within 60 s (or ended before)"));
    child
}

/// The fan-in child's side: a consumer that receives one message from each of two producers,
/// or a producer that sends one; then it holds its end until it is killed.
fn fan_in_child(role: &str) -> ! {
    let context = Context::new({
        let mut c = ContextConfig::default();
        c.gpu = GpuPolicy::Disabled;
        c
    })
    .unwrap();
    let here = ProcessLocation::from_hostname().unwrap();
    let config = ChannelConfig {
        kind: ChannelKind::FanIn,
        pool_size: 64 << 10,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    // Both ends are held, never dropped: the process is killed with them.
    let _end: Box<dyn std::any::Any> = if role == "fan-in-consumer" {
        let mut consumer = Consumer::create(&context, "gather", &here, &here, &config).unwrap();
        let mut from = Vec::new();
        for _ in 0..2 {
            // Receiving also takes up the producers that attach meanwhile.
            let message = consumer.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(message.as_slice(), b"hello");
            from.push(message.producer());
        }
        from.sort_unstable();
        assert_eq!(from, [0, 1], "one message from each slot");
        Box::new(consumer)
    } else {
        let mut producer = Producer::create(&context, "gather", &here, &here, &config).unwrap();
        producer.send(b"hello").unwrap();
        Box::new(producer)
    };
    println!("@@ ready");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The text line of lf-info's channel table that starts with `start`.
fn text_line<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines().find(|l| l.trim_start().starts_with(start)).unwrap_or_else(|| panic!("no line {start:?} in:\n{text}"))
}

#[test]
fn a_fan_in_lists_each_producer_s_slot_and_pid_and_is_cleaned_up_once_dead() {
    const TEST: &str = "a_fan_in_lists_each_producer_s_slot_and_pid_and_is_cleaned_up_once_dead";
    if let Some(role) = std::env::var_os(CHILD_ENV) {
        fan_in_child(role.to_str().unwrap());
    }
    let dir = test_dir("fan-in");
    // Created in this order, the first producer takes slot 0 (the lowest free one) before the
    // second starts; the consumer is ready once it has a message from each.
    let consumer = std::thread::scope(|s| {
        let consumer = s.spawn(|| ready_child(TEST, "fan-in-consumer", &dir));
        let first = ready_child(TEST, "fan-in-producer", &dir);
        let second = ready_child(TEST, "fan-in-producer", &dir);
        (consumer.join().unwrap(), first, second)
    });
    let (mut consumer, mut first, mut second) = consumer;
    let pids = [first.0.id(), second.0.id()];
    let consumer_pid = consumer.0.id();

    let view = json(&["--channels"], &[], Some(&dir));
    let channel = held(&view, "gather").unwrap_or_else(|| panic!("the fan-in is not listed: {view:#}"));
    assert_eq!((&channel["kind"], &channel["alive"]), (&"fan-in".into(), &true.into()), "{channel:#}");
    assert_eq!(channel["consumer"], format!("live (pid {consumer_pid})"));
    assert_eq!(channel["consumer_end"]["pid"], consumer_pid, "{channel:#}");
    assert_eq!(channel["producers_live"], 2, "{channel:#}");
    let producers = channel["producers"].as_array().unwrap();
    assert_eq!(producers.len(), 2, "{channel:#}");
    for (slot, pid) in pids.iter().enumerate() {
        let p = &producers[slot];
        assert_eq!((&p["slot"], &p["state"], &p["pid"]), (&slot.into(), &"live".into(), &(*pid).into()), "{p}");
    }
    let text = stdout(&lf_info(&["--channels"], &[], Some(&dir)));
    let line = text_line(&text, "gather ");
    assert!(line.contains("fan-in") && line.contains("alive") && line.contains("2 of 2 slots live"), "{line}");
    for (slot, pid) in pids.iter().enumerate() {
        assert!(text.contains(&format!("slot {slot}: live (pid {pid})")), "{text}");
    }

    // The second producer dies: its slot is over, the channel lives on, and cleaning up leaves
    // a live channel alone (its consumer removes that lock once it reports the end).
    // SAFETY: kill with the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) }, 0);
    second.0.wait().unwrap();
    let view = json(&["--cleanup"], &[], Some(&dir));
    assert_eq!(view["channels"]["removed"].as_array().unwrap().len(), 0, "{view:#}");
    let channel = held(&view, "gather").unwrap();
    assert_eq!((&channel["alive"], &channel["producers_live"]), (&true.into(), &1.into()), "{channel:#}");
    assert_eq!(channel["producers"][0]["pid"], pids[0], "{channel:#}");
    assert_eq!(channel["producers"][1]["state"], "over", "{channel:#}");
    let text = stdout(&lf_info(&["--channels"], &[], Some(&dir)));
    assert!(text.contains("slot 1: over") && text.contains("1 of 2 slots live"), "{text}");
    assert!(text.contains("over slots are its own to clean up"), "{text}");

    // All dead: the whole fan-in's files go, each slot's lock with them.
    for child in [&mut consumer, &mut first] {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGKILL) }, 0);
        child.0.wait().unwrap();
    }
    let view = json(&["--channels"], &[], Some(&dir));
    let channel = held(&view, "gather").unwrap();
    assert_eq!((&channel["alive"], &channel["producers_live"]), (&false.into(), &0.into()), "{channel:#}");
    assert_eq!(channel["consumer"], "over");
    let view = json(&["--cleanup"], &[], Some(&dir));
    let removed: Vec<&str> =
        view["channels"]["removed"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    for file in ["gather.sock", "gather.consumer.lock", "gather.producer.0.lock", "gather.producer.1.lock"] {
        assert!(removed.iter().any(|p| p.ends_with(file)), "{file} not removed: {removed:?}");
    }
    assert!(held(&view, "gather").is_none(), "{view:#}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left in the runtime dir: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fan-out child's side: a producer that sends until two consumers are attached (then once
/// more, so that each has a message), or a consumer that receives one; then it holds its end
/// until it is killed.
fn fan_out_child(role: &str) -> ! {
    let context = Context::new({
        let mut c = ContextConfig::default();
        c.gpu = GpuPolicy::Disabled;
        c
    })
    .unwrap();
    let here = ProcessLocation::from_hostname().unwrap();
    let config = ChannelConfig {
        kind: ChannelKind::FanOut,
        capacity: 4096,
        pool_size: 64 << 10,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    // Both ends are held, never dropped: the process is killed with them.
    let _end: Box<dyn std::any::Any> = if role == "fan-out-producer" {
        let mut producer = Producer::create(&context, "scatter", &here, &here, &config).unwrap();
        let start = std::time::Instant::now();
        while producer.peers().iter().filter(|p| p.state == PeerState::Alive).count() < 2 {
            assert!(start.elapsed() < Duration::from_secs(30), "the second consumer never attached");
            producer.send(b"hello").unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        producer.send(b"hello").unwrap();
        Box::new(producer)
    } else {
        let mut consumer = Consumer::create(&context, "scatter", &here, &here, &config).unwrap();
        assert_eq!(consumer.recv_timeout(Duration::from_secs(30)).unwrap().as_slice(), b"hello");
        Box::new(consumer)
    };
    println!("@@ ready");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_fan_out_lists_each_consumer_s_slot_and_pid_and_is_cleaned_up_once_dead() {
    const TEST: &str = "a_fan_out_lists_each_consumer_s_slot_and_pid_and_is_cleaned_up_once_dead";
    if let Some(role) = std::env::var_os(CHILD_ENV) {
        fan_out_child(role.to_str().unwrap());
    }
    let dir = test_dir("fan-out");
    // The first consumer takes slot 0 (the lowest free one) before the second starts; the
    // producer is ready once both are attached and have a message.
    let (mut producer, mut first, mut second) = std::thread::scope(|s| {
        let producer = s.spawn(|| ready_child(TEST, "fan-out-producer", &dir));
        let first = ready_child(TEST, "fan-out-consumer", &dir);
        let second = ready_child(TEST, "fan-out-consumer", &dir);
        (producer.join().unwrap(), first, second)
    });
    let pids = [first.0.id(), second.0.id()];
    let producer_pid = producer.0.id();

    let view = json(&["--channels"], &[], Some(&dir));
    let channel = held(&view, "scatter").unwrap_or_else(|| panic!("the fan-out is not listed: {view:#}"));
    assert_eq!((&channel["kind"], &channel["alive"]), (&"fan-out".into(), &true.into()), "{channel:#}");
    assert_eq!(channel["producer"], format!("live (pid {producer_pid})"), "{channel:#}");
    assert_eq!(channel["consumer"], "2 of 2 slots live", "{channel:#}");
    let consumers = channel["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 2, "{channel:#}");
    for (slot, pid) in pids.iter().enumerate() {
        let c = &consumers[slot];
        assert_eq!((&c["slot"], &c["state"], &c["pid"]), (&slot.into(), &"live".into(), &(*pid).into()), "{c}");
    }
    let text = stdout(&lf_info(&["--channels"], &[], Some(&dir)));
    let line = text_line(&text, "scatter ");
    assert!(line.contains("fan-out") && line.contains("alive") && line.contains("2 of 2 slots live"), "{line}");
    for (slot, pid) in pids.iter().enumerate() {
        assert!(text.contains(&format!("slot {slot}: live (pid {pid})")), "{text}");
    }

    // The second consumer dies: its slot is over (the idle producer drops it at its next send),
    // the channel lives on, and cleaning up leaves it alone.
    // SAFETY: kill with the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) }, 0);
    second.0.wait().unwrap();
    let view = json(&["--cleanup"], &[], Some(&dir));
    assert_eq!(view["channels"]["removed"].as_array().unwrap().len(), 0, "{view:#}");
    let channel = held(&view, "scatter").unwrap();
    assert_eq!((&channel["alive"], &channel["consumers"][1]["state"]), (&true.into(), &"over".into()), "{channel:#}");
    let text = stdout(&lf_info(&["--channels"], &[], Some(&dir)));
    assert!(text.contains("slot 1: over") && text.contains("1 of 2 slots live"), "{text}");

    // All dead: the whole fan-out's files go, each slot's lock with them.
    for child in [&mut producer, &mut first] {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGKILL) }, 0);
        child.0.wait().unwrap();
    }
    let view = json(&["--cleanup"], &[], Some(&dir));
    let removed: Vec<&str> =
        view["channels"]["removed"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    for file in ["scatter.sock", "scatter.producer.lock", "scatter.consumer.0.lock", "scatter.consumer.1.lock"] {
        assert!(removed.iter().any(|p| p.ends_with(file)), "{file} not removed: {removed:?}");
    }
    assert!(held(&view, "scatter").is_none(), "{view:#}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left in the runtime dir: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
