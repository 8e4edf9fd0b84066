//! The channel's ready semaphore as the routes of one end share it: the GPU route owns it, and
//! the others' messages name values on it too.

/// The channel's ready semaphore as one route hands it to the others of its end: the ready
/// values of every route's messages count on it. lava-flow's GPU route (vulkan_ipc) owns it, a
/// Vulkan timeline semaphore shared with the peer; the CUDA route's messages name values on
/// it too, which CUDA work signals and waits for through `cuImportExternalSemaphore`. Only a
/// CUDA device that is the Vulkan device the semaphore belongs to (the same UUID) can do that.
#[derive(Clone)]
pub struct ReadyShare {
    /// The Vulkan `deviceUUID` of the GPU whose semaphore it is.
    pub(crate) device_uuid: [u8; 16],
    /// The last ready value any route of the producer sent: one timeline, so values grow
    /// across routes.
    pub(crate) last: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The consumer's import of it, which Vulkan views of a message wait on.
    #[cfg(feature = "vulkan")]
    pub(crate) semaphore: Option<std::sync::Arc<crate::memory::gpu::TimelineSemaphore>>,
}

/// Why a producer shares no ready semaphore where no route has a say in it.
pub(crate) const NO_SHARED_READY: &str =
    "the channel has no GPU route (vulkan_ipc) between the two processes to share one";

/// The channel's ready semaphore as a route shares it with the others, or why there is none.
pub type SharedReady = std::result::Result<ReadyShare, String>;

/// The ready semaphore a route shares with the peer, or why it shares none (`None`: the route
/// has no say in it).
pub type ReadyOffer = Option<SharedReady>;
