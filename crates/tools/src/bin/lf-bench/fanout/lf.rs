//! lava-flow's fan-out rows through the C API, each end in a process of its own, with the
//! configuration `lf_channel_config_init` gives, changing only the kind and a 30 s rendezvous
//! timeout (`fanin::lf::config`), and the wait strategy where `--wait` asks.
//!
//! The producer: by reference, one `lf_alloc`ed CPU buffer, rewritten in full before each
//! message (its counter at both ends), `lf_send_buffer`, then `lf_wait_completed` of that
//! message (every consumer released it) before the next rewrite; copies, `lf_send` of the
//! application's private bytes. The consumers: `lf_recv`, every byte read and checked
//! (`scatter::Check`), `lf_release` before the next, until the producer's end
//! (LF_ERR_PEER_GONE). The pair channel is measured the same way, with one consumer.

use std::time::{Duration, Instant};

use lava_flow_c_api::buffer::lf_free;
use lava_flow_c_api::channel::{lf_channel, lf_channel_free};
use lava_flow_c_api::channel_config::{lf_channel_config, lf_channel_kind, lf_role};
use lava_flow_c_api::peers::{lf_channel_peers, lf_peer, lf_peer_state, LF_MAX_PEERS};
use lava_flow_c_api::receive::{lf_message, lf_recv, lf_release, LF_MESSAGE_ZERO_COPY};
use lava_flow_c_api::send::{lf_send, lf_send_buffer, lf_try_send, lf_wait_completed};
use lava_flow_c_api::status::lf_status;

use super::scatter::{private_bytes, write_payload, Check, Control, Samples, BLOCK};
use crate::capi::{check, CApi};

/// The configuration of every end of a row: the default one, of `kind`, with `wait` where
/// given (an `lf_wait_strategy`).
pub fn config(kind: lf_channel_kind, wait: Option<u32>) -> lf_channel_config {
    let mut cfg = crate::fanin::lf::config(kind);
    if let Some(wait) = wait {
        cfg.wait_strategy = wait;
    }
    cfg
}

/// Whose row a configuration makes.
fn who(cfg: &lf_channel_config) -> &'static str {
    if cfg.kind == lf_channel_kind::LF_CHANNEL_PAIR as u32 {
        "lava-flow pair"
    } else {
        "lava-flow fan-out"
    }
}

/// The greeting the producer sends while it waits for its consumers to attach: shorter than
/// any measured message, which the consumers skip.
const GREETING: [u8; 8] = *b"fan-out!";

/// How a row's producer sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `lf_send_buffer` of one `lf_alloc`ed buffer, each message completed before the next.
    Reference,
    /// `lf_send` of private bytes, as fast as the consumers take them.
    Copy,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Reference => "ref",
            Mode::Copy => "copy",
        }
    }
}

/// A channel end, freed when dropped.
struct End(*mut lf_channel);

impl Drop for End {
    fn drop(&mut self) {
        // SAFETY: a channel from `CApi::channel`, freed once, with no message held.
        unsafe { lf_channel_free(self.0) };
    }
}

/// The producer's consumer slots, as `lf_channel_peers` lists them.
fn peers(tx: &End) -> Vec<lf_peer> {
    let mut list: Vec<lf_peer> = Vec::with_capacity(LF_MAX_PEERS as usize);
    let mut count = 0usize;
    // SAFETY: a live producer end; `list` has room for LF_MAX_PEERS entries, of which the
    // call writes `count` (at most the capacity) before they are read.
    unsafe {
        check(
            lf_channel_peers(
                tx.0,
                list.as_mut_ptr(),
                std::mem::size_of::<lf_peer>(),
                LF_MAX_PEERS as usize,
                &mut count,
            ),
            "lf_channel_peers",
        );
        list.set_len(count.min(LF_MAX_PEERS as usize));
    }
    list
}

fn alive(list: &[lf_peer]) -> Vec<u32> {
    list.iter().filter(|p| p.state == lf_peer_state::LF_PEER_ALIVE as u32).map(|p| p.pid).collect()
}

/// The producer's process: waits until `consumers` consumers are attached (greeting them so
/// that late ones are taken up), then sends for `warm` and a timed `window`, and returns its
/// samples as a JSON line (with the consumers `lf_channel_peers` listed).
#[allow(clippy::too_many_arguments)]
pub fn producer(
    control: &Control,
    name: &str,
    cfg: &lf_channel_config,
    consumers: usize,
    size: usize,
    mode: Mode,
    warm: Duration,
    window: Duration,
) -> String {
    let capi = CApi::new(name);
    // Returns once the first consumer has attached.
    let tx = End(capi.channel(name, lf_role::LF_ROLE_PRODUCER, cfg));
    let deadline = Instant::now() + Duration::from_secs(60);
    while alive(&peers(&tx)).len() < consumers
        || control.ready().load(std::sync::atomic::Ordering::SeqCst) < consumers as u64
    {
        // A consumer met is taken up at the next send; a full ring refuses (WOULD_BLOCK).
        // SAFETY: a live producer end and 8 readable bytes.
        match unsafe { lf_try_send(tx.0, GREETING.as_ptr().cast(), GREETING.len(), std::ptr::null_mut()) } {
            lf_status::LF_OK | lf_status::LF_ERR_WOULD_BLOCK => {}
            status => check(status, "lf_try_send of a greeting"),
        }
        assert!(Instant::now() < deadline, "{name}: fewer than {consumers} consumers attached within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let private = private_bytes(size);
    let mut samples = Samples::default();
    let (sent, window_s) = match mode {
        Mode::Reference => by_reference(&capi, &tx, size, &private, warm, window, &mut samples),
        Mode::Copy => copies(&tx, size, &private, warm, window, &mut samples),
    };
    (samples.sent, samples.window_s) = (sent, window_s);
    let listed = peers(&tx);
    let pids = alive(&listed);
    let pid_list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let extra = format!(
        "\"peer_slots\":{},\"peers_alive\":{},\"peer_pids\":[{}]",
        listed.len(),
        pids.len(),
        pid_list.join(",")
    );
    samples.json(who(cfg), consumers, size, mode.name(), &extra)
}

/// By reference: returns the messages sent and the window's length.
fn by_reference(
    capi: &CApi,
    tx: &End,
    size: usize,
    private: &[u8],
    warm: Duration,
    window: Duration,
    samples: &mut Samples,
) -> (u64, f64) {
    let (buffer, ptr) = capi.alloc(size);
    let started = Instant::now();
    let mut window_start = None;
    let mut counter = 0u64;
    loop {
        let t = Instant::now();
        if window_start.is_none() && t - started >= warm {
            window_start = Some(t);
        }
        if window_start.is_some_and(|w| t - w >= window) {
            break;
        }
        // SAFETY: the buffer holds `size` bytes at `ptr`, and no message of it is in flight:
        // the previous one was waited for below.
        write_payload(unsafe { std::slice::from_raw_parts_mut(ptr, size) }, counter, private);
        let t0 = Instant::now();
        let mut seq = 0u64;
        // SAFETY: a live producer end and a live buffer of `size` bytes, not written again
        // until lf_wait_completed of its message returns.
        unsafe { check(lf_send_buffer(tx.0, buffer, 0, size, -1, &mut seq), "lf_send_buffer") };
        let t1 = Instant::now();
        // SAFETY: a live producer end.
        check(unsafe { lf_wait_completed(tx.0, seq, -1) }, "lf_wait_completed");
        let t2 = Instant::now();
        if window_start.is_some() {
            samples.write.push((t0 - t).as_nanos() as u64);
            samples.send.push((t1 - t0).as_nanos() as u64);
            samples.cycle.push((t2 - t0).as_nanos() as u64);
        }
        counter += 1;
    }
    let window_s = window_start.map_or(0.0, |w| (Instant::now() - w).as_secs_f64());
    // SAFETY: a buffer from lf_alloc whose messages are all complete, freed once.
    unsafe { lf_free(buffer) };
    (counter, window_s)
}

/// Copies at saturation, timed per block of [`BLOCK`] sends: returns the messages sent and
/// the window's length.
fn copies(
    tx: &End,
    size: usize,
    private: &[u8],
    warm: Duration,
    window: Duration,
    samples: &mut Samples,
) -> (u64, f64) {
    let mut message = vec![0u8; size];
    let started = Instant::now();
    let mut block_start = started;
    let mut window_start = None;
    let mut counter = 0u64;
    loop {
        for _ in 0..BLOCK {
            write_payload(&mut message, counter, private);
            // SAFETY: a live producer end and `size` readable bytes.
            unsafe { check(lf_send(tx.0, message.as_ptr().cast(), size, -1, std::ptr::null_mut()), "lf_send") };
            counter += 1;
        }
        let now = Instant::now();
        match window_start {
            None if now - started >= warm => window_start = Some(now),
            None => {}
            Some(w) => {
                samples.send.push((now - block_start).as_nanos() as u64);
                if now - w >= window {
                    break;
                }
            }
        }
        block_start = now;
    }
    let window_s = window_start.map_or(0.0, |w| (block_start - w).as_secs_f64());
    (counter, window_s)
}

/// Consumer `index`'s process: attaches, says so, then receives and checks every message until
/// the producer's end. Returns its line (`Check::json`).
pub fn consumer(control: &Control, name: &str, cfg: &lf_channel_config, index: usize, size: usize) -> String {
    let capi = CApi::new(name);
    let rx = End(capi.channel(name, lf_role::LF_ROLE_CONSUMER, cfg));
    control.ready().fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut check_all = Check::new(size);
    let mut measured = false;
    // SAFETY: lf_message is plain data; the C API fills it.
    let mut msg: lf_message = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: a live consumer end and a writable message; its `len` bytes at `data` are
        // readable until lf_release, which gets the same message back.
        unsafe {
            match lf_recv(rx.0, -1, &mut msg) {
                lf_status::LF_ERR_PEER_GONE => break,
                status => check(status, "lf_recv"),
            }
            let payload = std::slice::from_raw_parts(msg.data.cast::<u8>(), msg.len);
            // Greetings come before the first measured message only.
            if measured || msg.len != GREETING.len() {
                measured = true;
                check_all.take(payload, msg.flags & LF_MESSAGE_ZERO_COPY != 0);
            }
            check(lf_release(rx.0, &msg), "lf_release");
        }
    }
    check_all.json(index)
}
