//! The Vulkan IPC route: GPU buffers between two processes of one host, by reference.
//!
//! The carrier (shared memory) keeps every message's place in the channel's one order; this
//! route only turns a GPU buffer region into a 32-byte descriptor and back:
//!
//! 1. Rendezvous: the producer offers its device's identity (deviceUUID, driverUUID) and, where
//!    the driver can share them, a timeline semaphore exported as an opaque fd (on Windows an
//!    opaque NT handle: the *ready* semaphore); the consumer answers with its own device's
//!    identity. Same device: buffers go by reference. Another GPU, or no GPU at the consumer:
//!    the producer stages them through host memory, and the channel's report says why (a
//!    strict channel fails instead).
//! 2. The first message into an arena passes the arena once (its memory exported as an
//!    opaque fd, or NT handle) as an attachment, ahead of the message; the consumer imports it
//!    once on its own device and caches it by (slot, generation). A slot is reused for another
//!    arena only after the producer said the old one died (freed), with the next generation.
//! 3. A message carries (slot, generation, offset, length, ready value). The consumer checks
//!    every field and hands out a view of the imported arena: no Vulkan call per message.
//! 4. Synchronisation: with a shared semaphore, a message may name the value at which its
//!    bytes are in place (the producer's own GPU work signals it); the consumer's GPU work
//!    waits for it on the GPU. Without one (Mesa's lavapipe cannot export semaphores), the
//!    bytes must be in place when sent (lava-flow's own writes and copies are), which the
//!    report calls host-side synchronisation. Completion is the carrier's: the consumer's
//!    release is what the producer waits for before reusing the memory.
//! 5. Lifetime: the producer keeps each arena alive until the consumer released every message
//!    into it, in the carrier's holds for the consumer (`PeerHolds`), which the carrier lets go
//!    of when the consumer dies: a dead consumer's messages are never released, and its
//!    imports died with it, so the memory goes back then rather than with the channel.

mod receiver;
mod sender;
mod wire;

pub(crate) use receiver::Receiver;
pub(crate) use sender::{Offer, Sender};

use crate::channels::transport::{PayloadClass, Route, TransportId};
use crate::memory::gpu::{format_uuid, probe_semaphore_sharing};
use crate::memory::Context;

/// This route's id in rendezvous sections, attachments and routed messages.
pub(crate) const ROUTE_ID: u32 = 2;

pub(crate) const ID: TransportId = super::VULKAN_IPC;

/// The route GPU buffers would take from `context`'s device, as far as this side can tell
/// before meeting the peer: by reference where the peer opens the same GPU and driver (else
/// staged through `carrier`), synchronised on the GPU where this device can share timeline
/// semaphores (probed as the producer's offer probes it), on the host otherwise. `None`
/// without a device.
pub(crate) fn preview(context: &Context, carrier: TransportId) -> Option<Route> {
    let device = context.gpu_device()?;
    let info = device.info();
    let sync = match probe_semaphore_sharing(device) {
        Ok(()) => "GPU-side synchronisation through a shared timeline semaphore where the peer's device can import it"
            .to_owned(),
        Err(why) => format!("host-side synchronisation (buffers are complete when sent), because {why}"),
    };
    Some(Route {
        class: PayloadClass::Gpu,
        kind: ID,
        reason: format!(
            "GPU buffers: vulkan_ipc, by reference if the peer opens the same GPU and driver ({}, deviceUUID {}, driverUUID {}), \
             else staged through {carrier} (copied to host memory); {sync}",
            info.name,
            format_uuid(&info.device_uuid),
            format_uuid(&info.driver_uuid)
        ),
    })
}
