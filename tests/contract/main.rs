//! The carrier contract (`cases.rs`), run against each carrier of one host: loopback (both
//! halves threads of this process) and shm (each half a process of its own, re-executing this
//! test binary), each with vulkan_ipc as the route of GPU buffers where a Vulkan device is (on
//! lavapipe in CI). The mpi carrier runs the same cases between two MPI ranks
//! (`tests/mpi_channels.rs`).

mod cases;
#[path = "../common/child.rs"]
mod child;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cases::{Carrier, Case, Sync};
use child::Spawn;
use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, Producer, TransportKind};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::ProcessLocation;

fn here() -> ProcessLocation {
    ProcessLocation::from_hostname().unwrap()
}

/// A context for `case`: with this process's GPU where it needs one (`None`: there is none,
/// and the case is skipped, or fails under `LF_REQUIRE_VULKAN`), else CPU only.
fn context_for(case: &Case) -> Option<Context> {
    let mut config = ContextConfig::default();
    if !case.needs_gpu() {
        config.gpu = GpuPolicy::Disabled;
    }
    let context = Context::new(config).expect("memory context");
    if case.needs_gpu() {
        if let Some(why) = context.gpu_unavailable_reason() {
            assert!(
                std::env::var("LF_REQUIRE_VULKAN").is_err(),
                "LF_REQUIRE_VULKAN is set but there is no Vulkan device: {why}"
            );
            eprintln!("{}: skipped: no Vulkan device ({why})", case.name);
            return None;
        }
    }
    Some(context)
}

/// `case`'s config with the transports restricted to `kind` (and the GPU route), of the
/// carrier's channel kind.
fn config_for(case: &Case, carrier: Carrier, kind: TransportKind) -> ChannelConfig {
    let shape = match (carrier.fan_in, carrier.fan_out) {
        (true, _) => ChannelKind::FanIn,
        (_, true) => ChannelKind::FanOut,
        _ => ChannelKind::Pair,
    };
    ChannelConfig { transports: Some(vec![kind, TransportKind::VulkanIpc]), kind: shape, ..(case.config)() }
}

/// The channel of `case` over `carrier` (`kind` its transport): distinct per carrier, so that
/// the loopback carriers' tests, threads of one process, never meet each other's ends.
fn channel_name(carrier: Carrier, kind: TransportKind, case: &Case) -> String {
    format!("contract-{kind}-{}-{}", carrier.name.replace(' ', "-"), case.name)
}

/// Runs one half of `case` over `carrier` in this process or thread.
fn run_half(carrier: Carrier, kind: TransportKind, case: &Case, producer: bool, sync_dir: &Path, context: &Context) {
    let name = channel_name(carrier, kind, case);
    let config = config_for(case, carrier, kind);
    let sync = Sync::new(sync_dir.to_owned(), case.name, producer, carrier);
    if producer {
        let open = || Producer::create(context, &name, &here(), &here(), &config).unwrap();
        (case.producer)(open(), &sync, &open);
    } else {
        let consumer = Consumer::create(context, &name, &here(), &here(), &config).unwrap();
        (case.consumer)(consumer, &sync);
    }
}

fn scratch(prefix: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .unwrap()
        .keep()
}

/// The contract over loopback: both halves threads of this process.
#[test]
fn loopback_keeps_the_contract() {
    loopback_contract(Carrier {
        name: "loopback",
        reattach: true,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: false,
        fan_out: false,
    });
}

/// The contract over a loopback fan-in with one producer at a time (see the shm fan-in's).
#[test]
fn loopback_fan_in_keeps_the_contract() {
    loopback_contract(Carrier {
        name: "loopback fan-in",
        reattach: true,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: true,
        fan_out: false,
    });
}

/// The contract over a loopback fan-out with one consumer (see the shm fan-out's): GPU
/// buffers go by reference, through the consumer's own route.
#[test]
fn loopback_fan_out_keeps_the_contract() {
    loopback_contract(Carrier {
        name: "loopback fan-out",
        reattach: false,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: false,
        fan_out: true,
    });
}

fn loopback_contract(carrier: Carrier) {
    for case in cases::cases().iter().filter(|c| (c.runs_on)(&carrier)) {
        let Some(context) = context_for(case) else { continue };
        let dir = scratch("lf-contract-loopback-");
        std::thread::scope(|s| {
            let consumer = s.spawn(|| run_half(carrier, TransportKind::Loopback, case, false, &dir, &context));
            run_half(carrier, TransportKind::Loopback, case, true, &dir, &context);
            consumer.join().unwrap_or_else(|_| panic!("{}, {}: the consumer's half failed", carrier.name, case.name));
        });
        std::fs::remove_dir_all(&dir).unwrap();
        println!("{}: {} kept", carrier.name, case.name);
    }
}

/// The contract over shm: each half a process of its own.
#[test]
fn shm_keeps_the_contract() {
    let carrier = Carrier {
        name: "shm",
        reattach: true,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: false,
        fan_out: false,
    };
    shm_contract("shm_keeps_the_contract", carrier);
}

/// The contract over a shm fan-in with one producer at a time: what a pair promises, but for
/// the end of a producer, which is reported once. GPU buffers go by reference, through the
/// producer's own route receivers.
#[test]
fn shm_fan_in_keeps_the_contract() {
    let carrier = Carrier {
        name: "shm fan-in",
        reattach: true,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: true,
        fan_out: false,
    };
    shm_contract("shm_fan_in_keeps_the_contract", carrier);
}

/// The contract over a shm fan-out with one consumer: what a pair promises, but that a new
/// producer cannot take up a consumer whose producer has gone (the consumer joined that
/// producer), and that a consumer's close does not end the producer's sends. GPU buffers go
/// by reference, through the consumer's own route.
#[test]
fn shm_fan_out_keeps_the_contract() {
    let carrier = Carrier {
        name: "shm fan-out",
        reattach: false,
        gpu_route: true,
        fd_wakes_for_control: false,
        fan_in: false,
        fan_out: true,
    };
    shm_contract("shm_fan_out_keeps_the_contract", carrier);
}

fn shm_contract(test: &'static str, carrier: Carrier) {
    let cases = cases::cases();
    if let Some(role) = child::role_in(test) {
        let case_name = std::env::var("LF_CONTRACT_CASE").unwrap();
        let case = cases.iter().find(|c| c.name == case_name).unwrap();
        let context = context_for(case).expect("the orchestrator checked for a GPU");
        let dir = PathBuf::from(std::env::var("LF_CONTRACT_DIR").unwrap());
        run_half(carrier, TransportKind::Shm, case, role == "producer", &dir, &context);
        return;
    }
    for case in cases.iter().filter(|c| (c.runs_on)(&carrier)) {
        if context_for(case).is_none() {
            continue;
        }
        let dir = scratch("lf-contract-shm-");
        let runtime = dir.join("runtime");
        std::fs::create_dir(&runtime).unwrap();
        std::fs::set_permissions(&runtime, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let envs = [
            ("LF_RUNTIME_DIR", runtime.display().to_string()),
            ("LF_CONTRACT_DIR", dir.display().to_string()),
            ("LF_CONTRACT_CASE", case.name.to_owned()),
        ];
        let start = |role| Spawn { test, role, envs: &envs, socket: false, capture_stderr: false }.start().0;
        let (mut consumer, mut producer) = (start("consumer"), start("producer"));
        for (child, role) in [(&mut producer, "producer"), (&mut consumer, "consumer")] {
            let status = child::wait_timeout(child, Duration::from_secs(120)).unwrap_or_else(|| {
                let _ = child.kill();
                panic!("{}, {}: the {role}'s half did not finish in 120 s", carrier.name, case.name)
            });
            assert!(status.success(), "{}, {}: the {role}'s half failed: {status}", carrier.name, case.name);
        }
        let left: Vec<_> = std::fs::read_dir(&runtime).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{}, {}: left in the runtime dir: {left:?}", carrier.name, case.name);
        std::fs::remove_dir_all(&dir).unwrap();
        println!("{}: {} kept", carrier.name, case.name);
    }
}
