//! lava-flow's fan-in rows through the C API, each end in a process of its own: the
//! consumer (`lf_recv`, every byte read, each producer's counter checked, `lf_release` before
//! the next receive) and its producers (`lf_loan`, the payload written in place, `lf_publish`),
//! with the channel configuration `lf_channel_config_init` gives, changing only the kind and a
//! 30 s rendezvous timeout. The pair channel is measured the same way, with one producer.

use std::time::{Duration, Instant};

use lava_flow_c_api::channel::{lf_channel, lf_channel_free};
use lava_flow_c_api::channel_config::{lf_channel_config, lf_channel_kind, lf_role};
use lava_flow_c_api::receive::{lf_message, lf_recv, lf_release, lf_try_recv};
use lava_flow_c_api::send::{lf_loan, lf_loan_region, lf_publish};
use lava_flow_c_api::status::lf_status;

use super::gather::{write_payload, Control, Tally};
use crate::capi::{check, default_config, CApi};

/// The configuration of every end of a row: the default one, of `kind`.
pub fn config(kind: lf_channel_kind) -> lf_channel_config {
    let mut cfg = default_config();
    cfg.kind = kind as u32;
    cfg.rendezvous_timeout_ns = 30_000_000_000;
    cfg
}

/// A channel end, freed when dropped.
struct End(*mut lf_channel);

impl Drop for End {
    fn drop(&mut self) {
        // SAFETY: a channel from `CApi::channel`, freed once, with no message or loan held.
        unsafe { lf_channel_free(self.0) };
    }
}

/// One producer's process: attaches as producer `index`, waits for the start, then sends
/// `size`-byte messages until the consumer stops it.
pub fn producer(control: &Control, name: &str, kind: lf_channel_kind, index: u64, size: usize) {
    let capi = CApi::new(name);
    let tx = End(capi.channel(name, lf_role::LF_ROLE_PRODUCER, &config(kind)));
    let private: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    control.attach_and_wait();
    let mut counter = 0u64;
    while !control.stopped() {
        // SAFETY: a live producer end and a writable loan; the loan's `data` holds at least
        // `size` writable bytes until lf_publish.
        unsafe {
            let mut loan: lf_loan_region = std::mem::zeroed();
            check(lf_loan(tx.0, size, -1, &mut loan), "lf_loan");
            write_payload(std::slice::from_raw_parts_mut(loan.data.cast::<u8>(), size), counter, index, &private);
            check(lf_publish(tx.0, &loan, size, std::ptr::null_mut()), "lf_publish");
        }
        counter += 1;
    }
}

/// The consumer's process: takes up `producers` producers, starts them, tallies a warm-up and
/// a timed window of messages, stops them and drains the channel until every producer's end
/// has been reported. Returns the tally as a JSON line.
pub fn consumer(
    control: &Control,
    name: &str,
    kind: lf_channel_kind,
    producers: usize,
    size: usize,
    warm: Duration,
    window: Duration,
) -> String {
    let capi = CApi::new(name);
    // Returns once the first producer has attached.
    let rx = End(capi.channel(name, lf_role::LF_ROLE_CONSUMER, &config(kind)));
    // SAFETY: lf_message is plain data; the C API fills it.
    let mut msg: lf_message = unsafe { std::mem::zeroed() };
    let deadline = Instant::now() + Duration::from_secs(60);
    // Receiving takes up the producers that attach; none sends before `go`.
    while control.ready().load(std::sync::atomic::Ordering::SeqCst) < producers as u64 {
        // SAFETY: a live consumer end and a writable message.
        match unsafe { lf_try_recv(rx.0, &mut msg) } {
            lf_status::LF_ERR_WOULD_BLOCK => std::thread::yield_now(),
            status => check(status, "lf_try_recv before the start (no message was due)"),
        }
        assert!(Instant::now() < deadline, "{name}: fewer than {producers} producers attached within 60 s");
    }
    let mut tally = Tally::new(producers, warm, window);
    control.go().store(1, std::sync::atomic::Ordering::Release);
    tally.start();
    loop {
        // SAFETY: a live consumer end and a writable message; its `len` bytes at `data` are
        // readable until lf_release, which gets the same message back.
        let more = unsafe {
            check(lf_recv(rx.0, -1, &mut msg), "lf_recv");
            let more = tally.take(msg.producer as usize, std::slice::from_raw_parts(msg.data.cast::<u8>(), msg.len));
            check(lf_release(rx.0, &msg), "lf_release");
            more
        };
        if !more {
            break;
        }
    }
    control.stop().store(1, std::sync::atomic::Ordering::Release);
    // Drained so that no producer stays blocked on a full ring; each one's end comes after its
    // last message.
    let mut gone = 0;
    while gone < producers {
        // SAFETY: as above.
        match unsafe { lf_try_recv(rx.0, &mut msg) } {
            // SAFETY: the message just received, given back once.
            lf_status::LF_OK => check(unsafe { lf_release(rx.0, &msg) }, "lf_release"),
            lf_status::LF_ERR_PEER_GONE => gone += 1,
            lf_status::LF_ERR_WOULD_BLOCK => std::hint::spin_loop(),
            status => check(status, "lf_try_recv while draining"),
        }
    }
    let who = if kind == lf_channel_kind::LF_CHANNEL_PAIR { "lava-flow pair" } else { "lava-flow fan-in" };
    tally.json(who, size)
}
