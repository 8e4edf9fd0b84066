//! iceoryx2-pingpong: iceoryx2 0.10 between two processes, the peer lf-bench compares
//! lava-flow's channels with (lf-bench finds and runs this program; it also runs alone).
//!
//! ```text
//! iceoryx2-pingpong [--sizes 8,64,1K,64M] [--iters N] [--touch] [--cores 0,1]
//! ```
//!
//! The process forks before it creates any iceoryx2 node; the parent (ping) and the child
//! (pong) are pinned to the two cores given. Per size, ping creates two publish-subscribe
//! services of `[u8]` (`a2b`, `b2a`, names unique to the run), pong opens them, and each
//! process publishes on one and subscribes to the other, as iceoryx2's own
//! `benchmarks/publish-subscribe` does: `loan_slice_uninit`, `send`, and a busy-polled
//! `receive`. Unlike that benchmark (which loans its next sample before it waits for the
//! answer), a sample is loaned when it is sent, as lf-bench's lava-flow rows loan theirs.
//!
//! Plain mode touches no payload byte. `--touch`: the sender copies the payload into the
//! loan from a private buffer (`copy_from_slice`), the receiver reads every byte (summing
//! 8-byte words), as lf-bench's touch rows do.
//!
//! Right before and right after each size's timed round trips, the two processes probe the
//! spinning floor (a counter bounced on one shared cache line, as lf-bench probes it), so that
//! lf-bench can tell whether the machine's cross-core latency moved while this program ran.
//!
//! Output: one JSON object per line and size, half round trips in ns:
//! `{"peer":"iceoryx2","size":64,"touch":false,"iters":5000,"p50_ns":..,"p99_ns":..,"p999_ns":..,
//! "spin_before_p50_ns":..,"spin_after_p50_ns":..}`.

#[path = "../../../crates/tools/src/bin/lf-bench/pingpong.rs"]
mod pingpong;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;
use iceoryx2::service::port_factory::publish_subscribe::PortFactory;
use pingpong::{in_turn, parse_size, ping_pong, pin_to, read_all, shared_map, word_at, Percentiles, SpinLine};

type Error = Box<dyn std::error::Error>;
type Service = PortFactory<ipc::Service, [u8], ()>;

struct Args {
    sizes: Vec<usize>,
    /// Timed round trips per size; `None`: [`default_iters`].
    iters: Option<usize>,
    touch: bool,
    cores: (usize, usize),
}

fn die(msg: &str) -> ! {
    eprintln!("iceoryx2-pingpong: {msg}");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args { sizes: vec![8, 64, 1 << 10, 64 << 10, 1 << 20], iters: None, touch: false, cores: (0, 1) };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| die(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--sizes" => a.sizes = value().split(',').map(|s| parse_size(s).unwrap_or_else(|e| die(&e))).collect(),
            "--iters" => a.iters = Some(value().parse().unwrap_or_else(|_| die("bad --iters"))),
            "--touch" => a.touch = true,
            "--cores" => {
                let v = value();
                let cores: Vec<usize> = v.split(',').filter_map(|c| c.parse().ok()).collect();
                let [x, y] = cores[..] else { die(&format!("bad --cores {v:?}; give two, like 0,1")) };
                a.cores = (x, y);
            }
            "-h" | "--help" => {
                println!("usage: iceoryx2-pingpong [--sizes 8,64,1K,64M] [--iters N] [--touch] [--cores 0,1]");
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other}")),
        }
    }
    a
}

/// Round trips for a size when `--iters` is not given: fewer for large touched payloads.
fn default_iters(size: usize, touch: bool) -> usize {
    if touch {
        ((1usize << 30) / size.max(1)).clamp(10, 10_000)
    } else {
        10_000
    }
}

/// A two-party barrier on a word of memory shared across the fork: each party adds one and
/// spins until both have, `round` counting the barriers passed so far.
struct Barrier {
    word: &'static AtomicU64,
    round: u64,
}

impl Barrier {
    /// Call before the fork.
    fn new() -> Barrier {
        // SAFETY: offset 0 of a fresh shared page, used only through this atomic.
        Barrier { word: unsafe { word_at(shared_map(4096, "the barrier word"), 0) }, round: 0 }
    }

    fn wait(&mut self) {
        self.round += 1;
        self.word.fetch_add(1, Ordering::AcqRel);
        while self.word.load(Ordering::Acquire) < 2 * self.round {
            std::hint::spin_loop();
        }
    }
}

/// The service settings both processes use: one publisher and one subscriber, no history,
/// a one-sample subscriber buffer, payloads cache-line aligned.
fn service(node: &Node<ipc::Service>, name: &str, create: bool) -> Result<Service, Error> {
    let builder = node
        .service_builder(&ServiceName::new(name)?)
        .publish_subscribe::<[u8]>()
        .payload_alignment(Alignment::new(64).expect("64 is a power of two"))
        .max_publishers(1)
        .max_subscribers(1)
        .max_nodes(2)
        .history_size(0)
        .subscriber_max_buffer_size(1)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(true);
    Ok(if create { builder.create()? } else { builder.open()? })
}

/// One process's ports for one size: it publishes on `out` and subscribes to `inp`.
struct Ports {
    publisher: Publisher<ipc::Service, [u8], ()>,
    subscriber: Subscriber<ipc::Service, [u8], ()>,
}

impl Ports {
    /// The publisher's data segment is sized for `size`-byte slices from the start (no
    /// reallocation while timed).
    fn new(out: &Service, inp: &Service, size: usize) -> Result<Ports, Error> {
        let publisher = out
            .publisher_builder()
            .initial_max_slice_len(size)
            .allocation_strategy(AllocationStrategy::Static)
            .max_loaned_samples(1)
            .create()?;
        let subscriber = inp.subscriber_builder().buffer_size(1).create()?;
        Ok(Ports { publisher, subscriber })
    }

    /// Loans a sample, fills it from `private` when touching, sends it.
    fn send(&self, size: usize, private: Option<&[u8]>) {
        let loan = self.publisher.loan_slice_uninit(size).unwrap_or_else(|e| die(&format!("loan: {e:?}")));
        let sample = match private {
            Some(bytes) => loan.write_from_slice(&bytes[..size]),
            // SAFETY: the payload is shared memory the OS handed out zeroed and earlier
            // samples wrote; plain mode reads none of it (iceoryx2's benchmark does the same).
            None => unsafe { loan.assume_init() },
        };
        sample.send().unwrap_or_else(|e| die(&format!("send: {e:?}")));
    }

    /// Busy-polls for the next sample, reads every byte of it when touching, releases it.
    fn recv(&self, touch: bool) {
        loop {
            match self.subscriber.receive() {
                Ok(Some(sample)) => {
                    if touch {
                        read_all(sample.payload());
                    } else {
                        std::hint::black_box(sample.payload().len());
                    }
                    return;
                }
                Ok(None) => std::hint::spin_loop(),
                Err(e) => die(&format!("receive: {e:?}")),
            }
        }
    }
}

/// The ping-pong of one size on one side; ping gets the half round trips.
fn pingpong(ports: &Ports, ping: bool, size: usize, iters: usize, private: Option<&[u8]>) -> Option<Percentiles> {
    let touch = private.is_some();
    ping_pong(ping, iters, || in_turn(ping, || ports.send(size, private), || ports.recv(touch)))
}

/// Round trips of each spinning-floor probe.
const PROBE_ITERS: usize = 5_000;

fn run(a: &Args, ping: bool, base: &str, barrier: &mut Barrier, spin: &mut SpinLine) -> Result<(), Error> {
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let max = a.sizes.iter().copied().max().unwrap_or(8);
    let private: Option<Vec<u8>> = a.touch.then(|| (0..max).map(|i| (i * 31 + 7) as u8).collect());
    for &size in &a.sizes {
        let (a2b, b2a) = (format!("{base}/{size}/a2b"), format!("{base}/{size}/b2a"));
        // Ping creates, pong opens once they exist: no race between two creators.
        let services = if ping { Some((service(&node, &a2b, true)?, service(&node, &b2a, true)?)) } else { None };
        barrier.wait();
        let (a2b, b2a) = match services {
            Some(s) => s,
            None => (service(&node, &a2b, false)?, service(&node, &b2a, false)?),
        };
        let ports = if ping { Ports::new(&a2b, &b2a, size)? } else { Ports::new(&b2a, &a2b, size)? };
        // Both processes' ports exist before the first sample is sent.
        barrier.wait();
        let iters = a.iters.unwrap_or_else(|| default_iters(size, a.touch));
        let before = spin.probe(ping, PROBE_ITERS);
        let result = pingpong(&ports, ping, size, iters, private.as_deref());
        let after = spin.probe(ping, PROBE_ITERS);
        // Neither drops its ports while the other may still read from them.
        barrier.wait();
        if let (Some(p), Some(before), Some(after)) = (result, before, after) {
            println!(
                "{{\"peer\":\"iceoryx2\",\"size\":{size},\"touch\":{},\"iters\":{iters},\"p50_ns\":{:.1},\"p99_ns\":{:.1},\"p999_ns\":{:.1},\"spin_before_p50_ns\":{:.1},\"spin_after_p50_ns\":{:.1}}}",
                a.touch, p.p50, p.p99, p.p999, before.p50, after.p50
            );
        }
    }
    Ok(())
}

fn main() {
    let a = args();
    set_log_level(LogLevel::Error);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let base = format!("lf-bench-peers/{}-{stamp}", std::process::id());
    let mut barrier = Barrier::new();
    let mut spin = SpinLine::map();
    // Fork before any iceoryx2 node exists: each process makes its own.
    // SAFETY: no threads exist yet; both processes go on with their own copy of this state.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die(&format!("fork: {}", std::io::Error::last_os_error()));
    }
    let ping = child > 0;
    if !ping {
        // SAFETY: prctl with integer arguments: the child dies with its parent.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    pin_to(if ping { a.cores.0 } else { a.cores.1 });
    let result = run(&a, ping, &base, &mut barrier, &mut spin);
    if let Err(e) = &result {
        eprintln!("iceoryx2-pingpong ({}): {e}", if ping { "ping" } else { "pong" });
    }
    if !ping {
        std::process::exit(i32::from(result.is_err()));
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    std::process::exit(if result.is_ok() && child_ok { 0 } else { 1 });
}
