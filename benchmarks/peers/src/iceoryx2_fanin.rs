//! iceoryx2-fanin: iceoryx2 0.10 with N publishers on one publish-subscribe service and one
//! subscriber, each in a process of its own: the peer of lf-bench's fan-in rows (lf-bench finds
//! and runs this program; it also runs alone), with their protocol and core layout
//! (`gather.rs`, included from lf-bench).
//!
//! ```text
//! iceoryx2-fanin [--producers 8] [--size 64] [--warm S] [--window S] [--no-pin]
//! ```
//!
//! The process forks its publishers before any iceoryx2 node exists. The subscriber's process
//! creates the service of `[u8]` (N publishers, one subscriber, a subscriber buffer of 256
//! samples per publisher like a lava-flow fan-in's 256 slots per producer, no safe overflow,
//! and publishers that retry until delivered: no sample is lost, a publisher waits for room as
//! a channel's producer does), then the publishers open it. A publisher loans a slice, writes
//! its counter, its index and private bytes into it in place, and sends it; the subscriber
//! busy-polls `receive`, reads every byte, checks each publisher's counter (by the index in
//! the payload) and drops the sample before the next.
//!
//! Output: the tally as one JSON object on one line (`gather::Tally::json`, `who` "iceoryx2").

#[path = "../../../crates/tools/src/bin/lf-bench/fanin/gather.rs"]
mod gather;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gather::{cores_allowed, payload_index, producer_core, write_payload, Control, Tally, MIN_SIZE};
use iceoryx2::prelude::*;

type Error = Box<dyn std::error::Error>;

struct Args {
    producers: usize,
    size: usize,
    warm: Duration,
    window: Duration,
    pin: bool,
}

fn die(msg: &str) -> ! {
    eprintln!("iceoryx2-fanin: {msg}");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        producers: 8,
        size: 64,
        warm: Duration::from_millis(300),
        window: Duration::from_secs(2),
        pin: true,
    };
    let mut it = std::env::args().skip(1);
    let secs = |v: String| Duration::from_secs_f64(v.parse().unwrap_or_else(|_| die(&format!("bad seconds {v:?}"))));
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| die(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--producers" => a.producers = value().parse().unwrap_or_else(|_| die("bad --producers")),
            "--size" => a.size = value().parse().unwrap_or_else(|_| die("bad --size")),
            "--warm" => a.warm = secs(value()),
            "--window" => a.window = secs(value()),
            "--no-pin" => a.pin = false,
            "-h" | "--help" => {
                println!("usage: iceoryx2-fanin [--producers 8] [--size 64] [--warm S] [--window S] [--no-pin]");
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other}")),
        }
    }
    if a.producers == 0 || a.size < MIN_SIZE {
        die(&format!("needs at least one producer and --size >= {MIN_SIZE}"));
    }
    a
}

/// The service, created by the subscriber's process and opened by the publishers'.
fn service(
    node: &Node<ipc::Service>,
    name: &str,
    producers: usize,
    create: bool,
) -> Result<iceoryx2::service::port_factory::publish_subscribe::PortFactory<ipc::Service, [u8], ()>, Error> {
    let builder = node
        .service_builder(&ServiceName::new(name)?)
        .publish_subscribe::<[u8]>()
        .payload_alignment(Alignment::new(64).expect("64 is a power of two"))
        .max_publishers(producers)
        .max_subscribers(1)
        .max_nodes(producers + 1)
        .history_size(0)
        .subscriber_max_buffer_size(256)
        .subscriber_max_borrowed_samples(1)
        .enable_safe_overflow(false);
    Ok(if create { builder.create()? } else { builder.open()? })
}

fn publisher(a: &Args, control: &Control, name: &str, index: u64) -> Result<(), Error> {
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while control.listening().load(Ordering::Acquire) == 0 {
        if Instant::now() > deadline {
            return Err("the subscriber did not create the service within 60 s".into());
        }
        std::thread::yield_now();
    }
    let service = service(&node, name, a.producers, false)?;
    let publisher = service
        .publisher_builder()
        .initial_max_slice_len(a.size)
        .allocation_strategy(AllocationStrategy::Static)
        .max_loaned_samples(1)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()?;
    let private: Vec<u8> = (0..a.size).map(|i| (i * 31 + 7) as u8).collect();
    control.attach_and_wait();
    let mut counter = 0u64;
    while !control.stopped() {
        let mut loan = publisher.loan_slice_uninit(a.size)?;
        let payload = loan.payload_mut();
        // SAFETY: `size` bytes of the loan's payload, written in full here before they are
        // read (MaybeUninit<u8> has u8's layout).
        let bytes = unsafe { std::slice::from_raw_parts_mut(payload.as_mut_ptr().cast::<u8>(), payload.len()) };
        write_payload(bytes, counter, index, &private);
        // SAFETY: every byte was written just above.
        unsafe { loan.assume_init() }.send()?;
        counter += 1;
    }
    Ok(())
}

fn subscriber(a: &Args, control: &Control, name: &str) -> Result<String, Error> {
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let service = service(&node, name, a.producers, true)?;
    let subscriber = service.subscriber_builder().buffer_size(256).create()?;
    control.listening().store(1, Ordering::Release);
    let deadline = Instant::now() + Duration::from_secs(60);
    while control.ready().load(Ordering::SeqCst) < a.producers as u64 {
        if Instant::now() > deadline {
            return Err(format!("fewer than {} publishers attached within 60 s", a.producers).into());
        }
        std::thread::yield_now();
    }
    let mut tally = Tally::new(a.producers, a.warm, a.window);
    control.go().store(1, Ordering::Release);
    tally.start();
    loop {
        match subscriber.receive()? {
            Some(sample) => {
                let payload = sample.payload();
                if !tally.take(payload_index(payload) as usize, payload) {
                    break;
                }
            }
            None => std::hint::spin_loop(),
        }
    }
    control.stop().store(1, Ordering::Release);
    // Drained until the publishers have ended, so that none waits on a full buffer.
    let mut alive = a.producers;
    while alive > 0 {
        while subscriber.receive()?.is_some() {}
        // SAFETY: waitpid on any child, without blocking.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid > 0 {
            alive -= 1;
        } else if pid < 0 {
            break;
        }
    }
    Ok(tally.json("iceoryx2", a.size))
}

fn main() {
    let a = args();
    set_log_level(LogLevel::Error);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let name = format!("lf-bench-peers/fanin-{}-{stamp}", std::process::id());
    let control = Control::map();
    let cores = cores_allowed();
    let pin = a.pin && cores >= 2;
    for i in 0..a.producers {
        // SAFETY: no threads exist yet; the child runs its publisher and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            die(&format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: prctl with integer arguments: the child dies with its parent.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            if pin {
                pin_to(producer_core(i, cores));
            }
            let result = publisher(&a, &control, &name, i as u64);
            if let Err(e) = &result {
                eprintln!("iceoryx2-fanin (publisher {i}): {e}");
            }
            std::process::exit(i32::from(result.is_err()));
        }
    }
    if pin {
        pin_to(0);
    }
    match subscriber(&a, &control, &name) {
        Ok(line) => println!("{line}"),
        Err(e) => die(&format!("subscriber: {e}")),
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
