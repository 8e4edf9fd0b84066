//! The GPU messages a consumer handed to C and C has not released: one table, keyed by the
//! message, of what each keeps alive until `lf_release` (or `lf_channel_free`).
//!
//! A GPU message holds three things: the carrier's view, the route's payload, and, once C
//! asks for it (`lf_message_buffer`), the `lf_buffer` made over the payload. They go in that
//! order's reverse: the buffer (C's handle dies), the payload (which tells the route, and
//! through the released semaphore the producer's GPU work, that the consumer let go of the
//! memory), then the view (the producer may reuse the memory).

use std::collections::HashMap;

use parking_lot::Mutex;

use super::buffer::{lf_buffer, release_borrowed};
use super::status::lf_status;
use super::{Failure, FfiResult};
use lava_flow::channels::transport::{RawView, RoutedPayload};

/// What a GPU message handed to C keeps alive until its release.
struct Held {
    view: RawView,
    /// Kept after a buffer is made over it: dropping it tells the producer the memory is free.
    payload: RoutedPayload,
    /// The buffer lent to C over the payload, made when first asked for.
    buffer: Option<*mut lf_buffer>,
}

// SAFETY: `buffer` is a token into the handle table (see handle.rs), not a pointer that is
// dereferenced, and may be freed from any thread; the view's pointer is into the carrier's
// mapping, which stays until the view is released, from whichever thread releases it.
unsafe impl Send for Held {}

impl Held {
    /// Lets go of the buffer, then the payload, and hands back the view for the carrier to
    /// release last, with the outcome of freeing the buffer.
    fn let_go(self) -> (RawView, FfiResult) {
        let Held { view, payload, buffer } = self;
        let freed = buffer.map_or(Ok(()), release_borrowed);
        drop(payload);
        (view, freed)
    }
}

/// GPU messages handed to C and not released, by (session, sequence) as `lf_message`
/// carries them.
#[derive(Default)]
pub(crate) struct GpuMessages(Mutex<HashMap<(u64, u64), Held>>);

impl GpuMessages {
    /// Keeps a received GPU message's view and payload until its release.
    pub(crate) fn hold(&self, view: RawView, payload: RoutedPayload) {
        self.0.lock().insert((view.session, view.token), Held { view, payload, buffer: None });
    }

    /// The buffer lent to C over a held message's payload: made on the first call, the same
    /// handle on every later one. `None` where the message is not held.
    pub(crate) fn buffer(&self, session: u64, sequence: u64) -> Option<FfiResult<*mut lf_buffer>> {
        let mut held = self.0.lock();
        let entry = held.get_mut(&(session, sequence))?;
        if let Some(handle) = entry.buffer {
            return Some(Ok(handle));
        }
        let Some(buffer) = entry.payload.to_buffer() else {
            if entry.payload.cuda_ptr().is_some() {
                return Some(Err(Failure {
                    status: lf_status::LF_ERR_UNSUPPORTED,
                    message: format!(
                        "message {sequence} is CUDA memory of the producer's that this process's Vulkan device does not \
                         import (cudaMalloc or pool memory, a VMM piece of another GPU, a span of several VMM pieces \
                         (Vulkan imports one fd per memory), or no Vulkan device here); lf_message_cuda_ptr gives its \
                         CUDA address"
                    ),
                }));
            }
            return Some(Err(Failure {
                status: lf_status::LF_ERR_UNSUPPORTED,
                message: format!(
                    "message {sequence} carries GPU memory that a lava-flow buffer cannot wrap; read it through its data pointer"
                ),
            }));
        };
        Some(lf_buffer::into_borrowed_handle(buffer).map(|handle| *entry.buffer.insert(handle)))
    }

    /// A held message's CUDA address and device (`Some(None)` for memory that is not CUDA
    /// memory); `None` where the message is not held.
    pub(crate) fn cuda_ptr(&self, session: u64, sequence: u64) -> Option<Option<(u64, i32)>> {
        self.0.lock().get(&(session, sequence)).map(|held| held.payload.cuda_ptr())
    }

    /// Lets go of a message's buffer and payload, and hands back its view for the carrier to
    /// release last, with the outcome of freeing the buffer. `None` where the message is not
    /// held (released already, or not received from this channel).
    pub(crate) fn release(&self, session: u64, sequence: u64) -> Option<(RawView, FfiResult)> {
        let held = self.0.lock().remove(&(session, sequence))?;
        Some(held.let_go())
    }

    /// As [`release`](Self::release), the producer's released semaphore left to the caller to
    /// signal on its GPU (`RoutedPayload::released_by_caller`): also the value to signal.
    /// `Some(Err)` where the message's route has no released semaphore (the message stays held).
    pub(crate) fn release_by_caller(
        &self,
        session: u64,
        sequence: u64,
    ) -> Option<Result<(RawView, FfiResult, u64), String>> {
        let mut held = self.0.lock();
        let value = match held.get(&(session, sequence))?.payload.released_by_caller() {
            Ok(v) => v,
            Err(why) => return Some(Err(why)),
        };
        let entry = held.remove(&(session, sequence)).expect("found above");
        drop(held);
        let (view, freed) = entry.let_go();
        Some(Ok((view, freed, value)))
    }

    /// Lets go of every message still held, as [`release`](Self::release) does, handing each
    /// view to `release_view`: the channel is closing.
    pub(crate) fn release_all(&mut self, mut release_view: impl FnMut(&RawView)) {
        for (_, held) in self.0.get_mut().drain() {
            let (view, _) = held.let_go();
            release_view(&view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle_ref;
    use crate::status::lf_status;
    use lava_flow::channels::transport::RoutedMemory;
    use lava_flow::memory::{Buffer, Context, ContextConfig, GpuPolicy, MemoryLocation};

    /// A route's memory that records what the consumer let go of, and whether the buffer
    /// lent over that message was already gone then.
    struct Recorder {
        context: Context,
        /// The buffer handle lent for each sequence, as the test learns it.
        lent: Mutex<HashMap<u64, usize>>,
        /// (sequence, whether its lent buffer was still live) per `released` call.
        released: Mutex<Vec<(u64, bool)>>,
    }

    impl RoutedMemory for Recorder {
        fn host_base(&self) -> *mut u8 {
            std::ptr::null_mut()
        }
        fn view(&self, _offset: u64, len: usize, _ready_value: u64) -> Option<Buffer> {
            Some(self.context.allocate(len, MemoryLocation::CpuStandard).unwrap())
        }
        fn released(&self, seq: u64) {
            let buffer_live = self
                .lent
                .lock()
                .get(&seq)
                .is_some_and(|&handle| handle_ref(handle as *const lf_buffer, "buffer").is_ok());
            self.released.lock().push((seq, buffer_live));
        }
    }

    fn view(session: u64, seq: u64) -> RawView {
        RawView { ptr: std::ptr::null(), len: 4096, token: seq, session, flags: 0 }
    }

    /// The buffer lent over held message `seq` of session 7.
    fn lent(messages: &GpuMessages, seq: u64) -> *mut lf_buffer {
        match messages.buffer(7, seq) {
            Some(Ok(handle)) => handle,
            Some(Err(failure)) => panic!("{}", failure.message),
            None => panic!("message {seq} is not held"),
        }
    }

    /// The payload stays until the release, also after a buffer was lent over it (its drop
    /// tells the producer's GPU work the memory is free); the buffer goes before it; a second
    /// release finds nothing; the channel's close lets go of the rest.
    #[test]
    fn a_gpu_message_keeps_its_payload_and_buffer_until_its_release() {
        let mut config = ContextConfig::default();
        config.gpu = GpuPolicy::Disabled;
        let context = Context::new(config).unwrap();
        let memory = Recorder { context, lent: Mutex::default(), released: Mutex::default() };
        let mut messages = GpuMessages::default();
        for seq in 0..3 {
            // SAFETY: `memory` outlives every payload: the table is emptied below, before it goes.
            let payload = unsafe { RoutedPayload::new(&memory, 0, 4096, 0, seq) };
            messages.hold(view(7, seq), payload);
        }
        let handle = lent(&messages, 0);
        memory.lent.lock().insert(0, handle as usize);
        assert_eq!(lent(&messages, 0), handle, "the same handle when asked twice");
        assert!(messages.buffer(8, 0).is_none(), "another session's message is not held");
        assert!(memory.released.lock().is_empty(), "let go of while C holds message 0's buffer");

        let (released_view, freed) = messages.release(7, 0).expect("held");
        assert!(freed.is_ok());
        assert_eq!((released_view.session, released_view.token), (7, 0));
        assert_eq!(*memory.released.lock(), [(0, false)], "the payload goes at the release, after its buffer");
        let stale = handle_ref(handle as *const lf_buffer, "buffer").err().expect("the buffer is freed");
        assert_eq!(stale.status, lf_status::LF_ERR_BAD_HANDLE);
        assert!(messages.release(7, 0).is_none(), "released twice");
        assert!(messages.buffer(7, 0).is_none(), "a buffer for a released message");

        let handle = lent(&messages, 2);
        memory.lent.lock().insert(2, handle as usize);
        let mut closed = Vec::new();
        messages.release_all(|view| closed.push(view.token));
        closed.sort_unstable();
        assert_eq!(closed, [1, 2]);
        let mut released = memory.released.lock().clone();
        released.sort_unstable();
        assert_eq!(released, [(0, false), (1, false), (2, false)]);
        assert!(handle_ref(handle as *const lf_buffer, "buffer").is_err(), "message 2's buffer is freed at the close");
    }
}
