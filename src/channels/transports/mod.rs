//! The transports lava-flow builds, and the choice among them. The channel core (`Producer`,
//! `Consumer`) sees the traits of `channels::transport` and the handles of `dispatch`, which
//! call the built-in transports statically so that their hot paths inline.
//!
//! | transport    | role     | serves                                  | scope            |
//! |--------------|----------|-----------------------------------------|------------------|
//! | `shm`        | carrier  | every message's order; CPU payloads     | local            |
//! | `vulkan_ipc` | route    | GPU buffers by reference                | local            |
//! | `cuda_ipc`   | route    | CUDA memory by reference                | local            |
//! | `mpi`        | carrier  | every message's order; CPU payloads     | remote           |
//!
//! A fan-in's consumer listens on several carriers at once (`Plan::listeners`): shared memory
//! for producers of its host, MPI for the others; each producer takes the carrier of its own
//! scope, as a pair's does.
//! | `loopback`   | carrier  | every message's order; every payload    | one process      |
//!
//! - `recommended`: which transports are built, what each can serve, and the plan of a
//!   channel (its carrier and routes) from the scope and what the channel allows.
//! - `connect`: the rendezvous of each end as planned, and the report of what came of it.
//! - `dispatch`: the core's handles on the built transports.
//!
//! Adding a transport: a module here that implements the carrier traits
//! ([`ProducerTransport`](crate::channels::transport::ProducerTransport),
//! [`ConsumerTransport`](crate::channels::transport::ConsumerTransport)) or the route traits
//! ([`RouteSender`](crate::channels::transport::RouteSender),
//! [`RouteReceiver`](crate::channels::transport::RouteReceiver)), passing the contract tests
//! (`tests/contract`), a variant in `dispatch`'s enums, and its case in `recommended` and
//! `connect`. Nothing in the channel core changes. A remote carrier brings its own rendezvous
//! (the peer's address comes from its location) and has no descriptors to pass: GPU buffers to
//! a remote peer are staged through host memory by the core, as to a local peer on another GPU.

mod connect;
pub(crate) mod cuda_ipc;
mod dispatch;
pub(crate) mod loopback;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
mod recommended;
pub(crate) mod shm;
#[cfg(feature = "vulkan")]
pub(crate) mod vulkan_ipc;

pub(crate) use connect::{
    connect_producer, listen_consumer, listen_fan_out, preview, Arrival, ConsumerParts, FanOutListeners, FanOutParts,
    ReceiverFactory,
};
pub(crate) use dispatch::{AnyConsumer, AnyProducer, AnyRouteReceiver, AnyRouteSender, AnySession, MessageReleaser};
pub(crate) use recommended::{allowed_transports, plan, rendezvous_hint, resolve_locations, Plan};
pub use recommended::{TransportKind, TRANSPORTS_ENV};
// What tools need to see same-host channels from outside (lf-info --channels): the runtime
// directory, the channels in it, whether each end is alive, and the removal of what dead ones
// left.
pub use shm::rendezvous::{
    channels_in_runtime_dir, end_state, remove_leftovers, runtime_dir, runtime_dir_path, ChannelFiles, End, EndState,
    RUNTIME_DIR_ENV,
};

use super::transport::TransportId;

/// The names of the transports a build may leave out (the others declare theirs).
pub(crate) const VULKAN_IPC: TransportId = TransportId::new("vulkan_ipc");
pub(crate) const MPI: TransportId = TransportId::new("mpi");
pub(crate) const CUDA_IPC: TransportId = TransportId::new("cuda_ipc");

/// The shortest send that goes by reference by itself when its bytes lie in a lava-flow
/// buffer; shorter ones are copied into their ring slot, which costs less than mapping
/// anything.
pub const AUTO_ZERO_COPY_MIN: usize = shm::SHM_INLINE_MAX + 1;
