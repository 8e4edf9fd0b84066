use std::time::{Duration, Instant};
use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;
fn main() {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    let context = Context::new(config).unwrap();
    let here = ProcessLocation::from_hostname().unwrap();
    let cfg = ChannelConfig { wait: WaitStrategy::BusyPoll, rendezvous_timeout: Some(Duration::from_secs(60)), ..ChannelConfig::default() };
    let name = format!("probe{}", std::process::id());
    let (c2, n2, h2, cfg2) = (context.clone(), name.clone(), here.clone(), cfg.clone());
    let t = std::thread::spawn(move || Consumer::create(&c2, &n2, &h2, &h2, &cfg2).unwrap());
    let mut tx = Producer::create(&context, &name, &here, &here, &cfg).unwrap();
    let mut rx = t.join().unwrap();
    let buf = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    let small = [7u8; 64];
    let n = 2_000_000;
    let mode = std::env::args().nth(1).unwrap_or_default();
    for round in 0..3 {
        for gpu in [false, true] {
            if !mode.is_empty() && (mode == "gpu") != gpu { continue; }
            let t0 = Instant::now();
            for _ in 0..n {
                let seq = if gpu { tx.send_buffer(&buf, 0, 4096).unwrap() } else { tx.send(&small).unwrap() };
                let m = rx.recv().unwrap();
                std::hint::black_box(m.len());
                drop(m);
                tx.wait_completed(seq, None).unwrap();
            }
            println!("round {round} {}: {:.1} ns/msg", if gpu { "handoff" } else { "64B" }, t0.elapsed().as_nanos() as f64 / n as f64);
        }
    }
}
