//! Lifetime-free access to channel ends, for language bindings (lava-flow's C API among them)
//! that hold loans and messages as plain values across calls instead of Rust borrows.
//!
//! Rust code uses the typed methods of [`Producer`] and [`Consumer`] ([`Producer::loan`]'s
//! [`Loan`](super::Loan), [`Consumer::recv`]'s [`Message`](super::Message)), which keep these
//! contracts by construction. Here, what hands a value back to the channel trusts that it is
//! the one the channel gave out, so those functions are `unsafe`: their `# Safety` sections
//! say what the binding must keep.

use std::time::Duration;

use super::transport::{RawLoan, RawView, RoutedPayload};
use super::{Consumer, Producer};
use crate::error::Result;
use crate::memory::Buffer;

/// [`Producer::send`], waiting for room up to `timeout` (`None`: forever; zero: not at all).
#[inline]
pub fn send(producer: &mut Producer, data: &[u8], timeout: Option<Duration>) -> Result<u64> {
    producer.send_within(data, timeout)
}

/// [`Producer::send_buffer_after`] (or [`Producer::send_buffer`] with `ready_value` 0), waiting
/// for room up to `timeout`.
#[inline]
pub fn send_buffer(
    producer: &mut Producer,
    buffer: &Buffer,
    offset: usize,
    len: usize,
    ready_value: u64,
    timeout: Option<Duration>,
) -> Result<u64> {
    producer.send_buffer_within(buffer, offset, len, ready_value, timeout)
}

/// Lends room for a message of `len` bytes, waiting for it up to `timeout`: `len` writable
/// bytes at `loan.ptr` until [`publish`] or [`cancel`] hands the loan back. A producer has one
/// loan out at a time.
#[inline]
pub fn loan(producer: &mut Producer, len: usize, timeout: Option<Duration>) -> Result<RawLoan> {
    producer.loan_raw(len, timeout)
}

/// Publishes the first `len` bytes of `loan` as the next message; returns its sequence number.
///
/// # Safety
/// `loan` is `producer`'s outstanding loan, as [`loan`] returned it (the binding may rebuild
/// it from its fields), not published or cancelled yet, and nothing writes its bytes any more.
#[inline]
pub unsafe fn publish(producer: &mut Producer, loan: RawLoan, len: usize) -> Result<u64> {
    // SAFETY: this function's contract is publish_raw's.
    unsafe { producer.publish_raw(loan, len) }
}

/// Gives `loan` back unpublished.
///
/// # Safety
/// As [`publish`].
pub unsafe fn cancel(producer: &mut Producer, loan: RawLoan) {
    // SAFETY: this function's contract is cancel_raw's.
    unsafe { producer.cancel_raw(loan) }
}

/// The next message as a view, waiting up to `timeout` (`None`: forever): `view.len` readable
/// bytes at `view.ptr` until [`release`]. A GPU message's view holds its route's descriptor:
/// [`resolve`] it.
#[inline]
pub fn recv(consumer: &mut Consumer, timeout: Option<Duration>) -> Result<RawView> {
    consumer.recv_raw_within(timeout)
}

/// The next message as a view if one waits, else `WouldBlock` (or `PeerGone`).
#[inline]
pub fn try_recv(consumer: &mut Consumer) -> Result<RawView> {
    consumer.try_recv_raw()
}

/// The payload a routed view (`view.route()` is `Some`) names: a GPU buffer's memory. On an
/// error the view has been released.
///
/// # Safety
/// `view` was received from `consumer` and is not released yet, and the payload is dropped
/// before the view is released.
pub unsafe fn resolve(consumer: &mut Consumer, view: &RawView) -> Result<RoutedPayload> {
    // SAFETY: this function's contract is resolve's.
    unsafe { consumer.resolve(view) }
}

/// Releases a view: the producer may reuse its space (and sees the message complete once
/// every message before it is released too).
///
/// # Safety
/// `view` was received from `consumer` and is not released yet, and nothing reads its bytes
/// or uses a payload resolved from it any more.
#[inline]
pub unsafe fn release(consumer: &mut Consumer, view: &RawView) -> Result<()> {
    // SAFETY: this function's contract is release_raw's.
    unsafe { consumer.release_raw(view) }
}
