//! The sending end of a channel.

use crate::os::OwnedHandle;
use std::sync::Arc;
use std::time::Duration;

use super::fan_out::FanOut;
use super::peers::{ChannelKind, Peer, PeerState};
use super::routes::SenderTable;
use super::transport::{
    MemoryKind, Packed, Payload, PayloadClass, PayloadMemory, ProducerTransport, RawLoan, Route, RouteSender,
    SharedRegion, TransportInfo,
};
use super::transports::{self, AnyProducer, AnyRouteSender};
use super::{
    deadline_after, log_closed, log_created, log_creating, log_failed, plan_routes, validate_channel_name,
    ChannelConfig, Role, AUTO_ZERO_COPY_MIN,
};
use crate::error::{Error, Result};
use crate::memory::buffer::SharedBytes;
use crate::memory::registry::{Registry, SharedMemory};
use crate::memory::{Buffer, Context};
use crate::types::ProcessLocation;

/// The sending end of a channel. Not shareable between threads (`&mut self` everywhere), but
/// it may move to another thread.
pub struct Producer {
    /// The consumer's end. A fan-out's are in `fan_out`, and this one is an end connected
    /// nowhere, which refuses every send: the inlined first tries of a send or loan find no
    /// room there and the full paths, out of line, serve the fan-out.
    transport: AnyProducer,
    /// A fan-out's consumers, one end per slot.
    fan_out: Option<Box<FanOut>>,
    /// The routes of payloads the carrier cannot hold (GPU memory), chosen per message by the
    /// kind of its memory; a kind no route serves is staged through the carrier.
    routes: SenderTable<AnyRouteSender>,
    /// Every routed message is packed here (see [`Packed`]).
    packed: Packed,
    info: TransportInfo,
    name: String,
    context: Context,
    /// The context's registry, asked by every copy send whether the bytes lie in a lava-flow
    /// buffer (then they go by reference); `None` when `ChannelConfig::auto_zero_copy` is off.
    registry: Option<Arc<Registry>>,
    /// `seq + 1` of recent messages copied from a buffer at send, by `seq % COPIED_AT_SEND`:
    /// complete for [`wait_completed`](Self::wait_completed) without waiting for the consumer.
    copied_at_send: [u64; COPIED_AT_SEND],
    /// This process's host, which same-host consumers share.
    host: String,
}

/// How many recent copied buffer sends the producer remembers as complete; an older one is
/// waited for as any message (its release comes soon after).
const COPIED_AT_SEND: usize = 64;

/// The report's line for CUDA memory on a channel to another host.
const CUDA_OVER_MPI: &str = "CUDA memory: staged through host memory over mpi (no process on another host opens \
                             it: each message is copied from the device into the carrier as it goes, any kind of \
                             CUDA memory, the work that writes it done first)";

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("name", &self.name).field("transport", &self.info).finish()
    }
}

impl Producer {
    /// Creates the producing end of channel `name` and waits for the consumer (up to
    /// `config.rendezvous_timeout`; the consumer may start before or after). `context` is
    /// the process's memory context: bytes sent from its buffers go by reference.
    pub fn create(
        context: &Context,
        name: &str,
        my_location: &ProcessLocation,
        peer_location: &ProcessLocation,
        config: &ChannelConfig,
    ) -> Result<Producer> {
        crate::logging::init();
        validate_channel_name(name)?;
        config.validate()?;
        let plan = plan_routes(my_location, peer_location, config, context)?;
        log_creating(name, Role::Producer, plan.carrier.id(), config.rendezvous_timeout);
        if config.kind == ChannelKind::FanOut {
            return Self::create_fan_out(context, name, my_location, &plan, config);
        }
        let parts = transports::connect_producer(name, &plan, config, context).inspect_err(|e| {
            log_failed(name, Role::Producer, |peer| transports::rendezvous_hint(plan.carrier, peer), e)
        })?;
        let mut producer = Producer::from_parts(name, context, config, parts.carrier, parts.routes, parts.info);
        log_created(name, Role::Producer, &producer.info);
        producer.host.clone_from(&my_location.hostname);
        Ok(producer)
    }

    /// A fan-out's producer: listens for its consumers and waits for the first.
    fn create_fan_out(
        context: &Context,
        name: &str,
        my_location: &ProcessLocation,
        plan: &transports::Plan,
        config: &ChannelConfig,
    ) -> Result<Producer> {
        let fan_out = transports::listen_fan_out(name, plan, config, context)
            .and_then(|parts| FanOut::new(name, config, parts))
            .inspect_err(|e| {
                log_failed(name, Role::Producer, |peer| transports::rendezvous_hint(plan.carrier, peer), e)
            })?;
        log_created(name, Role::Producer, fan_out.info());
        let placeholder = AnyProducer::ended(name, fan_out.info().clone());
        let info = fan_out.info().clone();
        let mut producer = Producer::from_parts(name, context, config, placeholder, Vec::new(), info);
        producer.fan_out = Some(Box::new(fan_out));
        producer.host.clone_from(&my_location.hostname);
        Ok(producer)
    }

    /// A producer over `carrier` and `routes`, connected already.
    pub(crate) fn from_parts(
        name: &str,
        context: &Context,
        config: &ChannelConfig,
        carrier: AnyProducer,
        routes: Vec<AnyRouteSender>,
        info: TransportInfo,
    ) -> Producer {
        let registry = config.auto_zero_copy.then(|| Arc::clone(context.registry()));
        let routes = SenderTable::new(routes);
        let mut info = info;
        routes.report_into(&mut info);
        if info.kind == transports::MPI && !info.routes.iter().any(|r| r.class == PayloadClass::Cuda) {
            info.set_route(Route { class: PayloadClass::Cuda, kind: transports::MPI, reason: CUDA_OVER_MPI.into() });
        }
        Producer {
            transport: carrier,
            fan_out: None,
            routes,
            packed: Packed::default(),
            info,
            name: name.to_owned(),
            context: context.clone(),
            registry,
            copied_at_send: [0; COPIED_AT_SEND],
            host: String::new(),
        }
    }

    /// Adds `route` after the routes the channel has (the core's tests bring routes of their
    /// own).
    #[cfg(test)]
    pub(crate) fn add_route(&mut self, route: AnyRouteSender) {
        self.routes.push(route);
    }

    /// The carrier, for the core's tests that send what a well-behaved producer would not.
    #[cfg(test)]
    pub(crate) fn carrier(&mut self) -> &mut AnyProducer {
        &mut self.transport
    }

    /// The memory context the channel was created with.
    pub fn context(&self) -> &Context {
        &self.context
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The transports (every route) and why they were chosen.
    pub fn transport(&self) -> &TransportInfo {
        match &self.fan_out {
            Some(fan_out) => fan_out.info(),
            None => &self.info,
        }
    }

    /// The consumers, slot by slot: each of a fan-out's `max_peers` slots (free, or alive), or
    /// a pair channel's one consumer (its pid 0: the carrier does not say).
    pub fn peers(&self) -> Vec<Peer> {
        let mut peers = match &self.fan_out {
            Some(fan_out) => fan_out.peers(),
            None => vec![Peer { state: PeerState::Alive, route: Some(self.info.kind.name()), ..Peer::free(0) }],
        };
        for peer in peers.iter_mut().filter(|p| p.host.is_empty() && p.route.is_some()) {
            peer.host.clone_from(&self.host);
        }
        peers
    }

    /// The largest message this channel carries.
    pub fn max_message_len(&self) -> usize {
        match &self.fan_out {
            Some(fan_out) => fan_out.max_message_len(),
            None => self.transport.max_message_len(),
        }
    }

    /// Sends `data`, waiting for room as long as needed. Returns the message's sequence
    /// number (0, 1, 2, ...).
    ///
    /// Bytes lying inside one lava-flow buffer of the channel's context (allocated or
    /// imported CPU memory, or the host mapping of an allocated GPU buffer where the channel
    /// sends GPU buffers by reference) and longer than [`AUTO_ZERO_COPY_MIN`] go by reference, as
    /// [`send_buffer`](Self::send_buffer) would send them: the consumer reads them where they
    /// lie, so do not write them until the message is complete
    /// ([`wait_completed`](Self::wait_completed)). Any other bytes are copied into the
    /// channel's pool, and may be reused at once; so are all bytes when the channel was created
    /// with [`ChannelConfig::auto_zero_copy`] off.
    #[inline]
    pub fn send(&mut self, data: &[u8]) -> Result<u64> {
        self.send_within(data, None)
    }

    /// As [`send`](Self::send), giving up with `Timeout` after `timeout`.
    pub fn send_timeout(&mut self, data: &[u8], timeout: Duration) -> Result<u64> {
        self.send_within(data, Some(timeout))
    }

    /// As [`send`](Self::send), but `WouldBlock` at once when the channel is full.
    #[inline]
    pub fn try_send(&mut self, data: &[u8]) -> Result<u64> {
        self.send_within(data, Some(Duration::ZERO))
    }

    /// [`send`](Self::send) waiting for room up to `timeout` (`None`: forever; zero: not at
    /// all). The clock is read only when there is no room at once, so that a timeout costs
    /// nothing when it is not reached.
    #[inline]
    pub(crate) fn send_within(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<u64> {
        // Too short to go by reference: copied into the room there is now, if there is.
        if data.len() < AUTO_ZERO_COPY_MIN {
            if let Some(seq) = self.transport.send_fast(data) {
                return Ok(seq);
            }
        }
        self.send_within_slow(data, timeout)
    }

    /// [`send_within`](Self::send_within) of anything but a short message that fits now.
    #[inline(never)]
    fn send_within_slow(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<u64> {
        if let Some((memory, offset)) = self.shareable(data) {
            match self.send_shared(memory, offset, data.len(), timeout) {
                Err(Error::Unsupported(_)) => {}
                other => return other,
            }
        }
        if let Some(seq) = self.transport.send_fast(data) {
            return Ok(seq);
        }
        // (The fast loan would fail as the fast send did.)
        let loan = self.loan_slow(data.len(), timeout)?;
        self.fill_and_publish(loan, data)
    }

    /// The memory `data` lies in, when it can go by reference.
    #[inline]
    fn shareable(&self, data: &[u8]) -> Option<(SharedMemory, usize)> {
        if data.len() < AUTO_ZERO_COPY_MIN {
            return None;
        }
        self.registry.as_ref()?.find_shareable(data.as_ptr() as usize, data.len())
    }

    /// Sends `len` bytes at `offset` of `memory` by reference: a memory file through the
    /// carrier, a GPU buffer's mapping through the route for its memory (`Unsupported` where
    /// the channel has none: the caller copies instead).
    #[inline(never)]
    fn send_shared(
        &mut self,
        memory: SharedMemory,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        match memory.bytes(offset, len)? {
            SharedBytes::File(arena, offset) => self.send_region_within(&arena, offset, len, timeout),
            SharedBytes::Gpu(view) => {
                let routed = match self.fan_out.as_deref_mut() {
                    Some(fan_out) => fan_out.serves(MemoryKind::Vulkan),
                    None => self.routes.get(MemoryKind::Vulkan).is_some(),
                };
                if !routed {
                    return Err(Error::Unsupported("GPU buffers are staged on this channel".into()));
                }
                self.send_gpu(&view, 0, len, 0, timeout)
            }
        }
    }

    /// Sends `len` bytes at `offset` of `region` by reference, waiting for room up to
    /// `timeout` (zero: not at all).
    fn send_region_within(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.send_region(region, offset, len, timeout);
        }
        match timeout {
            Some(Duration::ZERO) => self.transport.try_send_region(region, offset, len),
            _ => self.transport.send_region(region, offset, len, deadline_after(timeout)),
        }
    }

    #[inline]
    fn fill_and_publish(&mut self, loan: RawLoan, data: &[u8]) -> Result<u64> {
        // SAFETY: the loan is `data.len()` writable bytes of the channel's region that nothing
        // else writes (or reads) until it is published; `data` is a separate Rust slice.
        unsafe { crate::os::parallel_copy::copy_message(data.as_ptr(), loan.ptr, data.len()) };
        // SAFETY: the loan is the outstanding one, lent by loan_raw or loan_slow.
        unsafe { self.publish_raw(loan, data.len()) }
    }

    /// Lends `len` bytes of the channel's shared memory to write a message in place, waiting
    /// for room up to `timeout` (`None`: forever). Publish it with [`Loan::publish`]; dropping
    /// it unpublished gives the room back.
    #[inline]
    pub fn loan(&mut self, len: usize, timeout: Option<Duration>) -> Result<Loan<'_>> {
        let raw = self.loan_raw(len, timeout)?;
        Ok(Loan { producer: self, raw: Some(raw) })
    }

    /// As [`loan`](Self::loan), but `WouldBlock` at once when the channel is full.
    #[inline]
    pub fn try_loan(&mut self, len: usize) -> Result<Loan<'_>> {
        let raw = self.loan_raw(len, Some(Duration::ZERO))?;
        Ok(Loan { producer: self, raw: Some(raw) })
    }

    /// A loan: the transport's inlined fast path first, then the full one.
    #[inline]
    pub(crate) fn loan_raw(&mut self, len: usize, timeout: Option<Duration>) -> Result<RawLoan> {
        match self.transport.loan_fast(len) {
            Some(raw) => Ok(raw),
            None => self.loan_slow(len, timeout),
        }
    }

    #[inline(never)]
    fn loan_slow(&mut self, len: usize, timeout: Option<Duration>) -> Result<RawLoan> {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.loan(len, timeout);
        }
        match timeout {
            Some(Duration::ZERO) => self.transport.try_loan(len),
            _ => self.transport.loan(len, deadline_after(timeout)),
        }
    }

    /// Publishes `len` bytes of `loan` as the next message.
    ///
    /// # Safety
    /// `loan` is this producer's outstanding loan ([`loan_raw`](Self::loan_raw)), not
    /// published or cancelled yet.
    #[inline]
    pub(crate) unsafe fn publish_raw(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        let fan_out = &mut self.fan_out;
        // SAFETY: this function's contract: the loan is the carrier's, or, on a fan-out (whose
        // carrier is connected nowhere), the fan-out's.
        unsafe {
            self.transport.publish_else(loan, len, |carrier, loan, len| match fan_out.as_deref_mut() {
                Some(fan_out) => fan_out.publish(loan, len),
                None => carrier.publish(loan, len),
            })
        }
    }

    /// Gives `loan` back unpublished.
    ///
    /// # Safety
    /// As [`publish_raw`](Self::publish_raw).
    pub(crate) unsafe fn cancel_raw(&mut self, loan: RawLoan) {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.cancel(&loan);
        }
        // SAFETY: this function's contract.
        unsafe { self.transport.cancel(loan) }
    }

    /// How many messages the consumer has released: every sequence number below the result
    /// is done, and its memory reusable. On a fan-out, released by every consumer that got
    /// them.
    pub fn completed(&mut self) -> Result<u64> {
        match self.fan_out.as_deref_mut() {
            Some(fan_out) => fan_out.completed(),
            None => self.transport.completed(),
        }
    }

    /// Waits until message `seq` has been released by the consumer (a short buffer send, copied
    /// at send, is complete at once).
    #[inline]
    pub fn wait_completed(&mut self, seq: u64, timeout: Option<Duration>) -> Result<()> {
        // Without a look at the consumer's side: complete by the last look, or copied at send.
        // (`seq` u64::MAX was never sent: its `seq + 1` would wrap to the table's empty 0.)
        if seq < self.transport.completed_hint()
            || self.copied_at_send[(seq % COPIED_AT_SEND as u64) as usize] == seq.wrapping_add(1) && seq != u64::MAX
        {
            return Ok(());
        }
        self.wait_completed_slow(seq, timeout)
    }

    /// [`wait_completed`](Self::wait_completed) of a message not known to be complete.
    #[inline(never)]
    fn wait_completed_slow(&mut self, seq: u64, timeout: Option<Duration>) -> Result<()> {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.wait_completed(seq, deadline_after(timeout));
        }
        // One look at the consumer's side before the clock is read for a wait.
        if matches!(self.transport.completed(), Ok(done) if seq < done) {
            return Ok(());
        }
        self.transport.wait_completed(seq, deadline_after(timeout))
    }

    /// Sends `len` bytes at `offset` of `buffer` by reference, waiting for room as long as
    /// needed: the consumer reads the bytes where they lie, so later writes to them are
    /// visible to it. Do not write (or free) the range until the message is complete
    /// ([`completed`](Self::completed), [`wait_completed`](Self::wait_completed)); the channel
    /// keeps the memory itself alive until then.
    ///
    /// CPU buffers lava-flow allocated or imported go through the carrier: the consumer maps
    /// the buffer's arena once per channel. GPU buffers go through the channel's GPU route
    /// (see [`transport`](Self::transport)): by reference where the consumer shares the GPU
    /// (its arena is exported once per channel and imported once by the consumer), else
    /// staged through host memory, as the channel's report says. Registered user memory is
    /// `Unsupported`.
    ///
    /// A CPU range shorter than [`AUTO_ZERO_COPY_MIN`] is copied into the message instead,
    /// which costs less than a reference: such a message is complete as soon as this returns.
    pub fn send_buffer(&mut self, buffer: &Buffer, offset: usize, len: usize) -> Result<u64> {
        self.send_buffer_within(buffer, offset, len, 0, None)
    }

    /// As [`send_buffer`](Self::send_buffer), giving up with `Timeout` after `timeout`.
    pub fn send_buffer_timeout(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<u64> {
        self.send_buffer_within(buffer, offset, len, 0, Some(timeout))
    }

    /// As [`send_buffer`](Self::send_buffer), but `WouldBlock` at once when the channel is full.
    pub fn try_send_buffer(&mut self, buffer: &Buffer, offset: usize, len: usize) -> Result<u64> {
        self.send_buffer_within(buffer, offset, len, 0, Some(Duration::ZERO))
    }

    /// Sends a GPU buffer, or registered CUDA memory, whose contents the producer's own GPU
    /// work is still writing: they are in place once the channel's ready semaphore
    /// ([`ready_semaphore`](Self::ready_semaphore)) reaches `ready_value`, which that work
    /// signals (for example `cudaSignalExternalSemaphoresAsync`). The consumer's GPU work on the
    /// buffer waits for it on the GPU. Values must grow from message to message, across GPU
    /// buffers and CUDA memory (one semaphore). `Unsupported` where the channel's GPU route
    /// synchronises on the host; for CUDA memory also where the channel has no GPU route
    /// sharing a semaphore (both contexts need a Vulkan device on the same GPU) or the memory
    /// is of another GPU than the semaphore's: synchronise and send it without a ready value.
    pub fn send_buffer_after(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if ready_value == 0 {
            return Err(Error::invalid("ready value 0 means ready now: use send_buffer"));
        }
        self.send_buffer_within(buffer, offset, len, ready_value, timeout)
    }

    /// A new descriptor of the channel's ready semaphore (a Vulkan timeline semaphore exported
    /// as an opaque fd), for the producer's GPU work to signal; `Unsupported` where GPU
    /// buffers are synchronised on the host or staged.
    pub fn ready_semaphore(&self) -> Result<OwnedHandle> {
        if let Some(fan_out) = &self.fan_out {
            return fan_out.ready_semaphore();
        }
        match self.routes.get(MemoryKind::Vulkan) {
            Some(gpu) => gpu.ready_semaphore(),
            None => Err(Error::Unsupported(format!(
                "channel {:?} has no GPU route with a shared semaphore: {}",
                self.name, self.info.reason
            ))),
        }
    }

    /// A new descriptor of the channel's released semaphore (a Vulkan timeline semaphore
    /// exported as an opaque fd), which the consumer signals to `seq + 1` once it let go of
    /// GPU message `seq` and every GPU message before it: the producer's GPU work waits for
    /// that value before rewriting the buffer (`cudaWaitExternalSemaphoresAsync`), where
    /// [`wait_completed`](Self::wait_completed) would wait on the host. Needs
    /// [`ChannelConfig::released_semaphore`]; `Unsupported`, saying why, where the channel has
    /// none.
    pub fn released_semaphore(&self) -> Result<OwnedHandle> {
        if self.fan_out.is_some() {
            return Err(Error::Unsupported(format!(
                "fan-out channel {:?} has no released semaphore: each consumer releases a GPU message on its own, \
                 and wait_completed waits for all of them",
                self.name
            )));
        }
        match self.routes.get(MemoryKind::Vulkan) {
            Some(gpu) => gpu.released_semaphore(),
            None => Err(Error::Unsupported(format!(
                "channel {:?} has no GPU route with shared semaphores: {}",
                self.name, self.info.reason
            ))),
        }
    }

    /// A buffer send waiting for room up to `timeout` (`None`: forever; zero: not at all),
    /// reading the clock only when there is no room at once.
    pub(crate) fn send_buffer_within(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if len == 0 {
            return Err(Error::invalid("a message needs at least one byte"));
        }
        buffer.check_range(offset, len)?;
        if buffer.location().is_device() {
            return self.send_device(buffer, offset, len, ready_value, timeout);
        }
        if ready_value != 0 {
            return Err(Error::invalid(format!(
                "buffer {} is CPU memory: a ready value is for GPU buffers",
                buffer.id()
            )));
        }
        if len < AUTO_ZERO_COPY_MIN && !buffer.is_registered() {
            return self.send_small_buffer(buffer, offset, len, timeout);
        }
        let (arena, start) = buffer.shared_arena()?;
        match self.transport.try_send_region(&arena, start + offset, len) {
            Ok(seq) => Ok(seq),
            Err(refused) => self.send_region_refused(&arena, start + offset, len, timeout, refused),
        }
    }

    /// A buffer send that found no room at once (`WouldBlock`: waited for up to `timeout`),
    /// or that the carrier refused: a fan-out's (whose carrier is connected nowhere), or a bad
    /// one.
    #[inline(never)]
    fn send_region_refused(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
        refused: Error,
    ) -> Result<u64> {
        match refused {
            _ if self.fan_out.is_some() => self.send_region_within(region, offset, len, timeout),
            Error::WouldBlock(_) if timeout != Some(Duration::ZERO) => {
                self.transport.send_region(region, offset, len, deadline_after(timeout))
            }
            refused => Err(refused),
        }
    }

    /// A buffer send of a few bytes: cheaper copied into the message than sent by reference
    /// (no arena to map, no cache line of the buffer to fetch across cores), and complete for
    /// the sender at once: the buffer may be rewritten as soon as this returns.
    fn send_small_buffer(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        // SAFETY: a CPU buffer's memory is mapped in this process for its whole length, and
        // `check_range` showed that `len` bytes at `offset` lie inside it.
        let bytes = unsafe { std::slice::from_raw_parts(buffer.as_ptr().add(offset), len) };
        let seq = match self.transport.send_fast(bytes) {
            Some(seq) => seq,
            // (The fast loan would fail as the fast send did.)
            None => {
                let loan = self.loan_slow(len, timeout)?;
                self.fill_and_publish(loan, bytes)?
            }
        };
        self.copied_at_send[(seq % COPIED_AT_SEND as u64) as usize] = seq + 1;
        Ok(seq)
    }

    /// Device memory: lava-flow's GPU buffers through [`send_gpu`](Self::send_gpu); CUDA
    /// memory of the application's through the route for it, or refused without touching its
    /// bytes (the host cannot read them, and no copy is made behind the application's back).
    fn send_device(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if let Some(pointer) = buffer.cuda() {
            return self.send_cuda(buffer, pointer, offset, len, ready_value, timeout);
        }
        self.send_gpu(buffer, offset, len, ready_value, timeout)
    }

    /// CUDA memory the application allocated: by reference through the CUDA route, where the
    /// consumer accepted it and the memory's kind can go to another process.
    fn send_cuda(
        &mut self,
        buffer: &Buffer,
        pointer: crate::memory::CudaPointer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        use crate::memory::CudaMemoryKind;
        if self.fan_out.is_none() && self.routes.get(MemoryKind::Cuda).is_none() && self.info.kind == transports::MPI {
            return self.send_cuda_staged(pointer, offset, len, ready_value, timeout);
        }
        if !matches!(pointer.kind, CudaMemoryKind::Legacy | CudaMemoryKind::Vmm | CudaMemoryKind::Pool) {
            return Err(Error::Unsupported(crate::channels::transports::cuda_ipc::refusal(pointer.kind, buffer.id())));
        }
        let routed = match &self.fan_out {
            Some(_) => true,
            None => self.routes.get(MemoryKind::Cuda).is_some(),
        };
        if !routed {
            let why = match self.info.routes.iter().find(|r| r.class == crate::channels::PayloadClass::Cuda) {
                Some(route) => route.reason.clone(),
                None => match crate::channels::transports::cuda_ipc::Offer::cuda_memory() {
                    Err(why) => why,
                    Ok(_) => format!(
                        "the channel has no CUDA route: its consumer is a thread of this process \
                         (loopback: hand it the pointer itself), cuda_ipc is not among the transports it allows \
                         (LF_TRANSPORTS, or the channel's transports), or this process first used CUDA after it created \
                         the channel (create the channel after that) ({})",
                        self.info.reason
                    ),
                },
            };
            return Err(Error::Unsupported(format!(
                "channel {:?} cannot send buffer {} ({} of CUDA device {}) by reference, and copies none: {why}",
                self.name,
                buffer.id(),
                pointer.kind,
                pointer.device_ordinal
            )));
        }
        let payload =
            Payload { memory: PayloadMemory::Buffer(buffer), kind: MemoryKind::Cuda, offset, len, ready_value };
        self.send_payload(&payload, timeout)
    }

    /// CUDA memory to a consumer on another host (the MPI carrier), which no process there
    /// can open: its bytes copied from the device into the message as it goes, piece by piece
    /// where the carrier sends a large message in pieces. Any kind of CUDA memory: the copy
    /// reads it in this process. The work that writes it must be done, as for any send of CUDA
    /// memory (the copy waits for the legacy default stream only).
    fn send_cuda_staged(
        &mut self,
        pointer: crate::memory::CudaPointer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if ready_value != 0 {
            return Err(Error::Unsupported(format!(
                "channel {:?} copies CUDA memory through host memory to its consumer on another host, so it cannot \
                 wait for a ready value: synchronise the work that writes it (cudaStreamSynchronize) and send it \
                 without one (lf_send_buffer)",
                self.name
            )));
        }
        self.stage(len, timeout, &mut |start, piece| crate::memory::cuda::copy_to_host(&pointer, offset + start, piece))
    }

    /// A GPU buffer of lava-flow's: by reference through the route for its memory, or staged
    /// through the carrier.
    fn send_gpu(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        ready_value: u64,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let payload =
            Payload { memory: PayloadMemory::Buffer(buffer), kind: MemoryKind::Vulkan, offset, len, ready_value };
        self.send_payload(&payload, timeout)
    }

    /// Sends `payload` through the route its memory's kind calls for, or, where no route serves
    /// it, staged through the carrier (bytes of a lava-flow buffer only: other memory needs
    /// its route).
    pub(crate) fn send_payload(&mut self, payload: &Payload<'_>, timeout: Option<Duration>) -> Result<u64> {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.send_payload(payload, timeout);
        }
        let Some(route) = self.routes.for_kind(payload.kind) else {
            return self.send_staged(payload, timeout);
        };
        let packed = &mut self.packed;
        route.pack(payload, self.transport.completed_hint(), packed)?;
        let descriptor = &packed.descriptor[..packed.descriptor_len];
        // Attachments that did not go out stay in `packed` for the next message.
        let seq = self.transport.send_routed(
            route.route_id(),
            descriptor,
            &mut packed.attachments,
            deadline_after(timeout),
        )?;
        route.sent(seq);
        Ok(seq)
    }

    /// Copies a payload's bytes into the channel (the consumer gets host memory).
    fn send_staged(&mut self, payload: &Payload<'_>, timeout: Option<Duration>) -> Result<u64> {
        let PayloadMemory::Buffer(buffer) = payload.memory else {
            return Err(Error::Unsupported(format!(
                "channel {:?} has no route for {}, and only lava-flow buffers can be staged: {}",
                self.name, payload.kind, self.info.reason
            )));
        };
        if payload.ready_value != 0 {
            return Err(Error::Unsupported(format!(
                "channel {:?} stages GPU buffers through host memory, so it cannot wait for a ready value: {}",
                self.name, self.info.reason
            )));
        }
        let offset = payload.offset;
        self.stage(payload.len, timeout, &mut |start, piece| buffer.read_at(offset + start, piece))
    }

    /// Sends a message of `len` bytes that `fill` copies in, piece by piece where the carrier
    /// sends a large message in pieces (`fill(start, piece)`): a staged payload.
    fn stage(
        &mut self,
        len: usize,
        timeout: Option<Duration>,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64> {
        let loan = self.loan_raw(len, timeout)?;
        // SAFETY: the loan was just lent by loan_raw and is outstanding.
        unsafe { self.transport.publish_filled(loan, len, fill) }
    }

    /// Sends bytes that already lie in memory the peer can map, without copying them.
    pub fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        if let Some(fan_out) = self.fan_out.as_deref_mut() {
            return fan_out.send_region(region, offset, len, timeout);
        }
        self.transport.send_region(region, offset, len, deadline_after(timeout))
    }

    /// How many arenas (memory files) this producer has passed to its consumer: each goes
    /// once per channel, however many messages point into it.
    pub fn arenas_sent(&self) -> u64 {
        match &self.fan_out {
            Some(fan_out) => fan_out.arenas_sent(),
            None => self.transport.arenas_sent(),
        }
    }

    /// Sends a malformed message (over MPI), for tests that play a hostile peer: 0, a chunked
    /// message cut short; 1, a sequence number out of order; 2, more bytes than the header
    /// says; 3, a report request for a message never sent. Only with the `test-hooks` feature,
    /// which the tests turn on.
    #[cfg(feature = "test-hooks")]
    pub fn send_malformed_for_tests(&mut self, how: u32) -> Result<()> {
        self.transport.send_malformed(how)
    }
}

/// Room lent by a [`Producer`] to write one message in place.
pub struct Loan<'a> {
    producer: &'a mut Producer,
    raw: Option<RawLoan>,
}

impl Loan<'_> {
    #[inline]
    pub fn len(&self) -> usize {
        self.raw.as_ref().map_or(0, |r| r.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lent bytes. Their previous contents are unspecified (an earlier message's).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let raw = self.raw.as_ref().expect("loan is live until consumed");
        // SAFETY: raw.len bytes at raw.ptr belong to this loan alone until published; the
        // region stays mapped while the producer (borrowed by this loan) lives.
        unsafe { std::slice::from_raw_parts_mut(raw.ptr, raw.len) }
    }

    /// Publishes the whole loan as the next message; returns its sequence number.
    #[inline]
    pub fn publish(self) -> Result<u64> {
        let len = self.len();
        self.publish_len(len)
    }

    /// Publishes the first `len` bytes (1..=loan length).
    #[inline]
    pub fn publish_len(mut self, len: usize) -> Result<u64> {
        let raw = self.raw.take().expect("loan is live until consumed");
        // SAFETY: `raw` is the producer's outstanding loan: lent to this Loan and taken out
        // of it here, once.
        unsafe { self.producer.publish_raw(raw, len) }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        log_closed(&self.name, Role::Producer);
    }
}

impl Drop for Loan<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            // SAFETY: as in publish_len: the loan is outstanding and taken out of the Loan once.
            unsafe { self.producer.cancel_raw(raw) };
        }
    }
}
