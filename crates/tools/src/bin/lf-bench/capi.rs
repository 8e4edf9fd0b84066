//! The headline rows: lava-flow through its C API (`lf_*`, called from Rust as a C program
//! calls them), with the channel configuration a C program gets from
//! `lf_channel_config_init`, changing only what a C user sets: the wait strategy and the
//! rendezvous timeout. Where a message is larger than the default pool (16 MiB, also the
//! largest message a channel carries), the pool is raised to the message's size, and the row
//! says so.
//!
//! Three ways to send, each measured as a ping-pong (half round trip) between two processes:
//! - copy: `lf_send` of the application's private bytes (ordinary heap memory, so the
//!   library copies them into its shared pool);
//! - loan: `lf_loan`, the payload written in place, `lf_publish`;
//! - buffer send: `lf_send_buffer` of an `lf_alloc`ed buffer (by reference), and before the
//!   buffer is written again, `lf_wait_completed` of its previous message: the wait is inside
//!   the timed round trip, as an application that reuses its buffer must pay it.
//!
//! The receiver does `lf_recv` and `lf_release`. Touched (the realistic case): the sender
//! copies the payload from a private buffer (`lf_send` does that itself; for loans and
//! buffers the benchmark copies), the receiver reads every byte before it releases the
//! message. Untouched: the receiver only looks at the length (the copy send still copies).

use std::ffi::{CStr, CString};

use lava_flow_c_api::alloc::lf_alloc;
use lava_flow_c_api::buffer::{lf_buffer, lf_buffer_ptr, lf_free, lf_memory_kind};
use lava_flow_c_api::channel::*;
use lava_flow_c_api::channel_config::*;
use lava_flow_c_api::context::lf_gpu_policy;
use lava_flow_c_api::context::{
    lf_context, lf_context_config, lf_context_config_init, lf_context_create, lf_context_free, lf_hugepage_policy,
};
use lava_flow_c_api::location::{lf_location, lf_location_detect, lf_location_free, lf_location_node_id, LF_UNSET};
use lava_flow_c_api::receive::*;
use lava_flow_c_api::send::*;
use lava_flow_c_api::status::{lf_last_error_message, lf_status};

use crate::options::human;
use crate::pingpong::{in_turn, ping_pong, read_all, Percentiles};

/// How the sender hands a message to the C API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Send {
    Copy,
    Loan,
    Buffer,
}

impl Send {
    pub const ALL: [Send; 3] = [Send::Copy, Send::Loan, Send::Buffer];

    pub fn name(self) -> &'static str {
        match self {
            Send::Copy => "copy",
            Send::Loan => "loan",
            Send::Buffer => "buffer send",
        }
    }
}

/// Panics with the library's own message unless `status` is LF_OK: a benchmark that cannot
/// do what it measures stops.
pub fn check(status: lf_status, call: &str) {
    if status != lf_status::LF_OK {
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        let message = unsafe { CStr::from_ptr(lf_last_error_message()) };
        panic!("{call}: {status:?}: {}", message.to_string_lossy());
    }
}

/// The default channel configuration, as `lf_channel_config_init` gives it.
pub fn default_config() -> lf_channel_config {
    // SAFETY: a writable config for the call to fill.
    unsafe {
        let mut cfg: lf_channel_config = std::mem::zeroed();
        check(lf_channel_config_init(&mut cfg, std::mem::size_of_val(&cfg)), "lf_channel_config_init");
        cfg
    }
}

/// The largest message of a channel with the default configuration (its pool size).
pub fn default_pool() -> usize {
    default_config().pool_size as usize
}

/// This process's C API state: its memory context (GPU off: the rows are about channels) and
/// location, and the prefix of its channels' names.
pub struct CApi {
    context: *mut lf_context,
    here: *mut lf_location,
    tag: String,
    opened: usize,
}

impl CApi {
    pub fn new(tag: &str) -> CApi {
        let (mut context, mut here) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a zeroed context config, then filled by its init function; both out pointers
        // are writable; the handles are freed in Drop.
        unsafe {
            let mut config: lf_context_config = std::mem::zeroed();
            check(lf_context_config_init(&mut config, std::mem::size_of_val(&config)), "lf_context_config_init");
            config.gpu_policy = lf_gpu_policy::LF_GPU_DISABLED as u32;
            check(lf_context_create(&config, &mut context), "lf_context_create");
            check(lf_location_detect(&mut here), "lf_location_detect");
        }
        CApi { context, here, tag: tag.to_owned(), opened: 0 }
    }

    /// A new pair of channels between the two processes, created in the same order on both
    /// (so both must call this at the same point): ping produces on `<tag>-cN-a2b` and
    /// consumes `<tag>-cN-b2a`, pong the reverse. The default configuration with `wait` and a
    /// 30 s rendezvous timeout, and a pool of `largest` bytes where the default one is smaller.
    pub fn open(&mut self, ping: bool, wait: lf_wait_strategy, largest: usize) -> Ends {
        self.opened += 1;
        let name = |dir: &str| CString::new(format!("{}-c{}-{dir}", self.tag, self.opened)).expect("no NUL in names");
        let (a2b, b2a) = (name("a2b"), name("b2a"));
        let (mut tx, mut rx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: C API calls with live handles, NUL-terminated names, a filled config and
        // writable out pointers; every status is checked. The channels are freed in Ends' Drop.
        unsafe {
            let mut cfg: lf_channel_config = std::mem::zeroed();
            check(lf_channel_config_init(&mut cfg, std::mem::size_of_val(&cfg)), "lf_channel_config_init");
            cfg.wait_strategy = wait as u32;
            cfg.rendezvous_timeout_ns = 30_000_000_000;
            let pool_raised = (largest as u64 > cfg.pool_size).then_some(largest as u64);
            cfg.pool_size = pool_raised.unwrap_or(cfg.pool_size);
            let (here, ctx) = (self.here, self.context);
            let create = |name: &CString, role: lf_role, out: &mut *mut lf_channel| {
                check(lf_channel_create(ctx, name.as_ptr(), role as u32, here, here, &cfg, out), "lf_channel_create");
            };
            if ping {
                create(&a2b, lf_role::LF_ROLE_PRODUCER, &mut tx);
                create(&b2a, lf_role::LF_ROLE_CONSUMER, &mut rx);
            } else {
                create(&a2b, lf_role::LF_ROLE_CONSUMER, &mut rx);
                create(&b2a, lf_role::LF_ROLE_PRODUCER, &mut tx);
            }
            Ends { tx, rx, pool_raised }
        }
    }

    /// One end (`role`) of channel `name` (a name of its own, not prefixed) with `cfg`: the
    /// fan-in rows' ends, one per process. Free it with `lf_channel_free`.
    pub fn channel(&self, name: &str, role: lf_role, cfg: &lf_channel_config) -> *mut lf_channel {
        let name = CString::new(name).expect("no NUL in names");
        let mut out = std::ptr::null_mut();
        // SAFETY: live context and location handles, a NUL-terminated name, a filled config
        // and a writable out pointer; checked.
        unsafe {
            check(
                lf_channel_create(self.context, name.as_ptr(), role as u32, self.here, self.here, cfg, &mut out),
                "lf_channel_create",
            );
        }
        out
    }

    /// A CPU buffer of `size` bytes from `lf_alloc`, and its address.
    pub fn alloc(&self, size: usize) -> (*mut lf_buffer, *mut u8) {
        let (mut buffer, mut ptr) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a live context and writable out pointers; checked.
        unsafe {
            check(
                lf_alloc(
                    self.context,
                    size,
                    lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32,
                    LF_UNSET,
                    lf_hugepage_policy::LF_HUGEPAGE_DEFAULT as u32,
                    &mut buffer,
                ),
                "lf_alloc",
            );
            check(lf_buffer_ptr(buffer, &mut ptr), "lf_buffer_ptr");
        }
        (buffer, ptr.cast())
    }

    /// ns per call of the cheapest C API function (`lf_location_node_id`): the handle check
    /// and the panic boundary every call pays, timed in this process alone.
    pub fn call_cost(&self) -> f64 {
        let calls = 1_000_000;
        let mut node = 0i64;
        let t = std::time::Instant::now();
        for _ in 0..calls {
            // SAFETY: a live location handle and a writable out value.
            unsafe { lf_location_node_id(std::hint::black_box(self.here), &mut node) };
        }
        t.elapsed().as_nanos() as f64 / calls as f64
    }
}

impl Drop for CApi {
    fn drop(&mut self) {
        // SAFETY: handles created in `new`, freed once; channels keep what they need of the
        // context.
        unsafe {
            lf_location_free(self.here);
            lf_context_free(self.context);
        }
    }
}

/// This process's ends of a pair of channels: it sends on `tx` and receives on `rx`.
pub struct Ends {
    tx: *mut lf_channel,
    rx: *mut lf_channel,
    /// The pool size set instead of the default's, where a message needed more.
    pub pool_raised: Option<u64>,
}

impl Drop for Ends {
    fn drop(&mut self) {
        // SAFETY: channels created in `CApi::open`, freed once, with no view still held.
        unsafe {
            lf_channel_free(self.tx);
            lf_channel_free(self.rx);
        }
    }
}

impl Ends {
    /// A note for the row when the pool is not the default one.
    pub fn note(&self) -> Option<String> {
        self.pool_raised
            .map(|p| format!("pool_size raised to {} (the default pool is the largest message)", human(p as usize)))
    }

    /// Receives the next message, reads every byte of it when `touch`, releases it.
    fn recv(&self, touch: bool) {
        // SAFETY: a live consumer end and a writable message; the view's `len` bytes at `data`
        // are readable until lf_release, which gets the same message back.
        unsafe {
            let mut msg: lf_message = std::mem::zeroed();
            check(lf_recv(self.rx, -1, &mut msg), "lf_recv");
            if touch {
                read_all(std::slice::from_raw_parts(msg.data.cast::<u8>(), msg.len));
            } else {
                std::hint::black_box(msg.len);
            }
            check(lf_release(self.rx, &msg), "lf_release");
        }
    }
}

/// One side's sender for one case: what it sends from, and the buffer send's state.
struct Sender<'a> {
    ends: &'a Ends,
    how: Send,
    size: usize,
    /// The application's private bytes (at least `size`).
    private: &'a [u8],
    touch: bool,
    /// For buffer sends: the `lf_alloc`ed buffer, its address, and the sequence number of
    /// its message in flight.
    buffer: Option<(*mut lf_buffer, *mut u8)>,
    in_flight: Option<u64>,
}

impl Sender<'_> {
    fn send(&mut self) {
        let (tx, size) = (self.ends.tx, self.size);
        // SAFETY: a live producer end; `private` holds at least `size` bytes; a loan's `data`
        // holds `len >= size` writable bytes until lf_publish; the buffer holds `size` bytes and
        // is rewritten only after lf_wait_completed of its previous message.
        unsafe {
            match self.how {
                Send::Copy => {
                    check(lf_send(tx, self.private.as_ptr().cast(), size, -1, std::ptr::null_mut()), "lf_send")
                }
                Send::Loan => {
                    let mut loan: lf_loan_region = std::mem::zeroed();
                    check(lf_loan(tx, size, -1, &mut loan), "lf_loan");
                    if self.touch {
                        std::ptr::copy_nonoverlapping(self.private.as_ptr(), loan.data.cast::<u8>(), size);
                    }
                    check(lf_publish(tx, &loan, size, std::ptr::null_mut()), "lf_publish");
                }
                Send::Buffer => {
                    let (buffer, ptr) = self.buffer.expect("a buffer for buffer sends");
                    if let Some(seq) = self.in_flight.take() {
                        check(lf_wait_completed(tx, seq, -1), "lf_wait_completed");
                    }
                    if self.touch {
                        std::ptr::copy_nonoverlapping(self.private.as_ptr(), ptr, size);
                    }
                    let mut seq = 0u64;
                    check(lf_send_buffer(tx, buffer, 0, size, -1, &mut seq), "lf_send_buffer");
                    self.in_flight = Some(seq);
                }
            }
        }
    }

    /// Waits until the last buffer send is complete (before its buffer is freed).
    fn finish(&mut self) {
        if let Some(seq) = self.in_flight.take() {
            // SAFETY: a live producer end.
            check(unsafe { lf_wait_completed(self.ends.tx, seq, -1) }, "lf_wait_completed");
        }
        if let Some((buffer, _)) = self.buffer.take() {
            // SAFETY: a buffer from lf_alloc whose messages are all complete, freed once.
            unsafe { lf_free(buffer) };
        }
    }
}

/// The messages of one headline case: their size, whether they are touched, and how many
/// timed round trips they get.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub size: usize,
    pub touch: bool,
    pub iters: usize,
}

/// The ping-pong of one case, sent `how`, over `ends`; ping gets the half round trips.
pub fn latency(capi: &CApi, ends: &Ends, ping: bool, how: Send, case: Case, private: &[u8]) -> Option<Percentiles> {
    let buffer = (how == Send::Buffer).then(|| capi.alloc(case.size));
    let mut sender = Sender { ends, how, size: case.size, private, touch: case.touch, buffer, in_flight: None };
    let result = ping_pong(ping, case.iters, || in_turn(ping, || sender.send(), || ends.recv(case.touch)));
    sender.finish();
    result
}
