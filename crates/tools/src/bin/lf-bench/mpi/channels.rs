//! The lava-flow half: two channels between the ranks, the same ping-pong and windowed
//! bandwidth as the raw half, and the row of GPU buffers over a channel.

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, MemoryLocation};
use lava_flow::mpi::MpiWorld;

use super::die;
use super::options::Options;
use super::raw::{raw_bandwidth, Comm, RawBuffers};
use crate::oneway::{one_way, Stream};
use crate::pingpong::{percentiles, read_all, Percentiles};

pub(super) struct Ends {
    pub(super) tx: Producer,
    pub(super) rx: Consumer,
}

/// Rank 0 produces on `<tag>-a2b` and consumes `<tag>-b2a`, rank 1 the reverse; each creates its
/// producer first.
pub(super) fn open(
    context: &Context,
    world: &MpiWorld,
    tag: &str,
    ping: bool,
    config: &ChannelConfig,
) -> Result<Ends, String> {
    let other = if ping { 1 } else { 0 };
    let mine = world.me().location().clone();
    let peer = world.peer(other).map_err(|e| e.to_string())?.location().clone();
    let (a2b, b2a) = (format!("{tag}-a2b"), format!("{tag}-b2a"));
    let producer =
        |name: &str| Producer::create(context, name, &mine, &peer, config).map_err(|e| format!("producer {name}: {e}"));
    let consumer =
        |name: &str| Consumer::create(context, name, &mine, &peer, config).map_err(|e| format!("consumer {name}: {e}"));
    if ping {
        let tx = producer(&a2b)?;
        let rx = consumer(&b2a)?;
        Ok(Ends { tx, rx })
    } else {
        let rx = consumer(&a2b)?;
        let tx = producer(&b2a)?;
        Ok(Ends { tx, rx })
    }
}

/// Dies on a channel failure in the middle of a measurement: the peer would wait forever.
fn lf<T>(r: lava_flow::Result<T>, what: &str) -> T {
    r.unwrap_or_else(|e| die(&format!("lava-flow {what} failed: {e}")))
}

fn lf_send(ends: &mut Ends, size: usize, v: u8, touch: bool) {
    let mut loan = lf(ends.tx.loan(size, None), "loan");
    if touch {
        loan.as_mut_slice().fill(v);
    }
    lf(loan.publish(), "publish");
}

fn lf_recv(ends: &mut Ends, touch: bool) {
    let m = lf(ends.rx.recv(), "recv");
    if touch {
        read_all(&m);
    } else {
        std::hint::black_box(m.len());
    }
}

pub(super) fn lf_latency(ends: &mut Ends, ping: bool, size: usize, iters: usize, touch: bool) -> Option<Percentiles> {
    let warm = (iters / 10).max(1);
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..warm + iters {
        let v = i as u8;
        if ping {
            let t = Instant::now();
            lf_send(ends, size, v, touch);
            lf_recv(ends, touch);
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            lf_recv(ends, touch);
            lf_send(ends, size, v, touch);
        }
    }
    ping.then(|| percentiles(rtts))
}

pub(super) fn lf_bandwidth(
    ends: &mut Ends,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    touch: bool,
) -> Option<f64> {
    windowed(ends, ping, size, window, iters, touch, |e, w| lf_send(e, size, w as u8, touch))
}

/// One direction: the ping side sends `window` messages with `send`, the pong side receives
/// them and answers with a small ack; B/s on the ping side, after one round of warm-up.
fn windowed(
    ends: &mut Ends,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    touch: bool,
    send: impl FnMut(&mut Ends, usize),
) -> Option<f64> {
    one_way(&mut EndsStream { ends, touch, send }, ping, size, window, iters)
}

/// A stream through `ends` whose messages `send` makes; the ack is a 4-byte send.
struct EndsStream<'a, F> {
    ends: &'a mut Ends,
    touch: bool,
    send: F,
}

impl<F: FnMut(&mut Ends, usize)> Stream for EndsStream<'_, F> {
    fn send(&mut self, w: usize) {
        (self.send)(self.ends, w);
    }

    fn wait_ack(&mut self) {
        lf_recv(self.ends, false);
    }

    fn recv(&mut self) {
        lf_recv(self.ends, self.touch);
    }

    fn ack(&mut self) {
        lf(self.ends.tx.send(&[0u8; 4]), "send of the ack");
    }
}

/// GPU buffers over the channel (staged through host memory: the consumer gets host bytes and
/// reads them): the one-way rate of 64 MiB messages, window 2, against the slower of its two
/// halves measured alone in the same job: the producer's GPU-to-host copy, and raw MPI at that
/// size. Both ranks must agree to run it; `None` where either has no GPU (rates in B/s).
pub(super) fn gpu_row(
    world: &MpiWorld,
    comm: &Comm,
    tag: &str,
    ping: bool,
    bufs: &mut RawBuffers,
    o: &Options,
) -> Option<(f64, f64, f64)> {
    const SIZE: usize = 64 << 20;
    const WINDOW: usize = 2;
    let iters = if o.quick { 2 } else { 6 };
    let context = Context::new(ContextConfig::default()).ok().filter(|c| c.gpu_unavailable_reason().is_none());
    if comm.all_gather_flag(context.is_none()).contains(&true) {
        return None;
    }
    let context = context.expect("checked on both ranks");
    let config = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        pool_size: SIZE * (WINDOW + 1),
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    };
    let mut ends = open(&context, world, &format!("{tag}-gpu"), ping, &config).unwrap_or_else(|e| die(&e));
    let gpu = lf(context.allocate(SIZE, MemoryLocation::GpuDeviceLocal), "GPU allocation");
    let mut host = vec![0u8; SIZE];
    let mut d2h = 0f64;
    if ping {
        host.fill(3);
        lf(gpu.write_at(0, &host), "GPU write");
        for _ in 0..3 {
            let t = Instant::now();
            lf(gpu.read_at(0, &mut host), "GPU read");
            d2h = d2h.max(SIZE as f64 / t.elapsed().as_secs_f64());
        }
    }
    comm.barrier();
    let raw = raw_bandwidth(comm, bufs, ping, SIZE, WINDOW, iters, o.touch);
    comm.barrier();
    let rate = windowed(&mut ends, ping, SIZE, WINDOW, iters, o.touch, |e, _| {
        lf(e.tx.send_buffer(&gpu, 0, SIZE), "send of a GPU buffer");
    });
    comm.barrier();
    rate.map(|rate| (rate, d2h, raw.unwrap_or(f64::NAN)))
}
