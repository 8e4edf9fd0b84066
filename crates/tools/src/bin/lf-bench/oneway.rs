//! The one-way stream every bandwidth figure of lf-bench runs (`osu_bw`'s pattern): ping sends
//! a window of messages and waits for an acknowledgement; pong receives the window and
//! acknowledges it.

use std::time::Instant;

/// One side's operations of a one-way stream.
pub trait Stream {
    /// Ping: sends message `w` of the window.
    fn send(&mut self, w: usize);
    /// Ping: waits for the window's acknowledgement.
    fn wait_ack(&mut self);
    /// Pong: receives the next message.
    fn recv(&mut self);
    /// Pong: acknowledges the window.
    fn ack(&mut self);
}

/// Runs `iters` windows of `window` messages of `size` bytes after one untimed window; ping
/// gets the bytes per second.
pub fn one_way(stream: &mut impl Stream, ping: bool, size: usize, window: usize, iters: usize) -> Option<f64> {
    let mut start = Instant::now();
    for it in 0..iters + 1 {
        if it == 1 {
            start = Instant::now();
        }
        if ping {
            (0..window).for_each(|w| stream.send(w));
            stream.wait_ack();
        } else {
            (0..window).for_each(|_| stream.recv());
            stream.ack();
        }
    }
    ping.then(|| (iters * window * size) as f64 / start.elapsed().as_secs_f64())
}
