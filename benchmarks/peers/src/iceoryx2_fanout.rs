//! iceoryx2-fanout: iceoryx2 0.10 with one publisher and N subscribers on one
//! publish-subscribe service, each in a process of its own: the peer of lf-bench's fan-out rows
//! (lf-bench finds and runs this program; it also runs alone), with their protocol and core
//! layout (`scatter.rs`, included from lf-bench).
//!
//! ```text
//! iceoryx2-fanout [--consumers 8] [--size 1048576] [--warm S] [--window S] [--no-pin]
//! ```
//!
//! The process forks its subscribers before any iceoryx2 node exists. The publisher's process
//! creates the service of `[u8]` (one publisher, N subscribers, a subscriber buffer of 2
//! samples, no safe overflow, a publisher that retries until delivered: no sample is lost),
//! then the subscribers open it. Per message the publisher loans a slice, writes the whole
//! payload into it (`scatter::write_payload`), sends it (timed: Send), then waits until every
//! subscriber has released it (Cycle): iceoryx2 has no completion wait of its own, so each
//! subscriber adds one to a shared word after it drops the sample, and the publisher spins on
//! that word, as lava-flow's `lf_wait_completed` spins before it blocks. A subscriber polls
//! `receive` (yielding its core between polls that find nothing: subscribers may share a
//! core), reads every byte, checks the message (`scatter::Check`), drops it.
//!
//! Output: the publisher's line (`scatter::Samples::json`, `who` "iceoryx2") and each
//! subscriber's (`scatter::Check::json`), one JSON object per line.

#[path = "../../../crates/tools/src/bin/lf-bench/fanout/scatter.rs"]
mod scatter;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use iceoryx2::prelude::*;
use scatter::{
    consumer_core, cores_allowed, print_line, private_bytes, write_payload, Check, Control, Samples, MIN_SIZE,
};

type Error = Box<dyn std::error::Error>;

/// Samples a subscriber holds queued: the publisher has at most one in flight.
const BUFFER: usize = 2;

struct Args {
    consumers: usize,
    size: usize,
    warm: Duration,
    window: Duration,
    pin: bool,
}

fn die(msg: &str) -> ! {
    eprintln!("iceoryx2-fanout: {msg}");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        consumers: 8,
        size: 1 << 20,
        warm: Duration::from_millis(300),
        window: Duration::from_secs(2),
        pin: true,
    };
    let mut it = std::env::args().skip(1);
    let secs = |v: String| Duration::from_secs_f64(v.parse().unwrap_or_else(|_| die(&format!("bad seconds {v:?}"))));
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| die(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--consumers" => a.consumers = value().parse().unwrap_or_else(|_| die("bad --consumers")),
            "--size" => a.size = value().parse().unwrap_or_else(|_| die("bad --size: give bytes, like 1048576")),
            "--warm" => a.warm = secs(value()),
            "--window" => a.window = secs(value()),
            "--no-pin" => a.pin = false,
            "-h" | "--help" => {
                println!("usage: iceoryx2-fanout [--consumers 8] [--size 1048576] [--warm S] [--window S] [--no-pin]");
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other}")),
        }
    }
    if a.consumers == 0 || a.size < MIN_SIZE || !a.size.is_multiple_of(8) {
        die(&format!("needs at least one consumer and a --size of at least {MIN_SIZE} bytes, a multiple of 8"));
    }
    a
}

/// The service, created by the publisher's process and opened by the subscribers'.
fn service(
    node: &Node<ipc::Service>,
    name: &str,
    consumers: usize,
    create: bool,
) -> Result<iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, [u8], ()>, Error> {
    let builder = node
        .service_builder(&ServiceName::new(name)?)
        .publish_subscribe::<[u8]>()
        .payload_alignment(Alignment::new(64).expect("64 is a power of two"))
        .max_publishers(1)
        .max_subscribers(consumers)
        .max_nodes(consumers + 1)
        .history_size(0)
        .subscriber_max_buffer_size(BUFFER)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false);
    Ok(if create { builder.create()? } else { builder.open()? })
}

fn subscriber(a: &Args, control: &Control, name: &str, index: usize) -> Result<String, Error> {
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while control.listening().load(Ordering::Acquire) == 0 {
        if Instant::now() > deadline {
            return Err("the publisher did not create the service within 60 s".into());
        }
        std::thread::yield_now();
    }
    let service = service(&node, name, a.consumers, false)?;
    let subscriber = service.subscriber_builder().buffer_size(BUFFER).create()?;
    control.ready().fetch_add(1, Ordering::SeqCst);
    let mut check = Check::new(a.size);
    loop {
        match subscriber.receive()? {
            Some(sample) => {
                check.take(sample.payload(), false);
                drop(sample);
                control.released().fetch_add(1, Ordering::Release);
            }
            // The publisher stops after its last message was released by everyone.
            None if control.stop().load(Ordering::Acquire) != 0 => break,
            // Subscribers may share a core: each poll that finds nothing yields it.
            None => std::thread::yield_now(),
        }
    }
    Ok(check.json(index))
}

fn publisher(a: &Args, control: &Control, name: &str) -> Result<String, Error> {
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let service = service(&node, name, a.consumers, true)?;
    let publisher = service
        .publisher_builder()
        .initial_max_slice_len(a.size)
        .allocation_strategy(AllocationStrategy::Static)
        .max_loaned_samples(1)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()?;
    control.listening().store(1, Ordering::Release);
    let deadline = Instant::now() + Duration::from_secs(60);
    while control.ready().load(Ordering::SeqCst) < a.consumers as u64 {
        if Instant::now() > deadline {
            return Err(format!("fewer than {} subscribers attached within 60 s", a.consumers).into());
        }
        std::thread::yield_now();
    }
    let private = private_bytes(a.size);
    let mut samples = Samples::default();
    let mut loans = Vec::new();
    let started = Instant::now();
    let mut window_start = None;
    let mut counter = 0u64;
    loop {
        let t = Instant::now();
        if window_start.is_none() && t - started >= a.warm {
            window_start = Some(t);
        }
        if window_start.is_some_and(|w| t - w >= a.window) {
            break;
        }
        let mut loan = publisher.loan_slice_uninit(a.size)?;
        let loaned = Instant::now();
        let payload = loan.payload_mut();
        // SAFETY: `size` bytes of the loan's payload, written in full here before they are
        // read (MaybeUninit<u8> has u8's layout).
        let bytes = unsafe { std::slice::from_raw_parts_mut(payload.as_mut_ptr().cast::<u8>(), payload.len()) };
        write_payload(bytes, counter, &private);
        // SAFETY: every byte was written just above.
        let sample = unsafe { loan.assume_init() };
        let t0 = Instant::now();
        sample.send()?;
        let t1 = Instant::now();
        let all = (counter + 1) * a.consumers as u64;
        while control.released().load(Ordering::Acquire) < all {
            std::hint::spin_loop();
        }
        let t2 = Instant::now();
        if window_start.is_some() {
            samples.write.push((t0 - t).as_nanos() as u64);
            loans.push((loaned - t).as_nanos() as u64);
            samples.send.push((t1 - t0).as_nanos() as u64);
            samples.cycle.push((t2 - t0).as_nanos() as u64);
        }
        counter += 1;
    }
    samples.sent = counter;
    samples.window_s = window_start.map_or(0.0, |w| (Instant::now() - w).as_secs_f64());
    control.stop().store(1, Ordering::Release);
    loans.sort_unstable();
    let loan_p50 = loans.get(loans.len() / 2).map_or("null".to_owned(), u64::to_string);
    let extra = format!("\"loan_p50_ns\":{loan_p50}");
    Ok(samples.json("iceoryx2", a.consumers, a.size, "ref", &extra))
}

fn main() {
    let a = args();
    set_log_level(LogLevel::Error);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("lf-bench-peers/fanout-{}-{stamp}", std::process::id());
    let control = Control::map();
    let cores = cores_allowed();
    let pin = a.pin && cores >= 2;
    let mut children = Vec::new();
    for i in 0..a.consumers {
        // SAFETY: no threads exist yet; the child runs its subscriber and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            die(&format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: prctl with integer arguments: the child dies with its parent.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if pin {
                pin_to(consumer_core(i, cores));
            }
            match subscriber(&a, &control, &name, i) {
                Ok(line) => print_line(&line),
                Err(e) => {
                    eprintln!("iceoryx2-fanout (subscriber {i}): {e}");
                    std::process::exit(1);
                }
            }
            std::process::exit(0);
        }
        children.push(pid);
    }
    if pin {
        pin_to(0);
    }
    let result = publisher(&a, &control, &name);
    // Also after a failure, so that no subscriber waits for messages that never come.
    control.stop().store(1, Ordering::Release);
    let mut failed = 0;
    for pid in children {
        let mut status = 0;
        // SAFETY: waiting for a child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        failed += usize::from(!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0));
    }
    match result {
        Ok(line) => print_line(&line),
        Err(e) => die(&format!("publisher: {e}")),
    }
    if failed > 0 {
        die(&format!("{failed} subscribers failed"));
    }
}

/// Pins the calling process to one core.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("could not pin to core {cpu}: {}", std::io::Error::last_os_error());
        }
    }
}
