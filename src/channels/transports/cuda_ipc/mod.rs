//! The CUDA IPC route: CUDA memory the application allocated (a framework's tensor) between
//! two processes of one host, by reference.
//!
//! The carrier keeps every message's place in the channel's one order; this route turns a
//! region of a registered CUDA allocation into a 32-byte descriptor and back:
//!
//! 1. Rendezvous: a producer whose process had loaded the CUDA driver when it created the
//!    channel offers the route for CUDA memory (one that never used CUDA is not made to
//!    initialise it: it has no CUDA memory); the consumer answers with the UUIDs of the CUDA devices it opens memory
//!    on where its process has loaded the driver too, or why it cannot (CUDA not loaded, no
//!    driver, `LF_DISABLE_CUDA=1`, no device). Declined, CUDA memory
//!    is refused at send, saying why: it is never copied behind the application's back.
//! 2. The first message into an allocation announces it once per channel, as an attachment
//!    before the message, keyed by (base, `BUFFER_ID`): `cudaMalloc` memory as a legacy CUDA
//!    IPC handle of its base; a CUDA VMM piece as an fd of its allocation handle
//!    (`cuMemRetainAllocationHandle`, `cuMemExportToShareableHandle`) passed with
//!    `SCM_RIGHTS`; a span of VMM pieces mapped back to back (registered so where a tensor
//!    crosses a piece boundary: see `memory::cuda`) as one attachment per piece (its fd, its
//!    offset in the span, its size and `BUFFER_ID`) right before the span's, which names how
//!    many pieces it has (a piece's fd goes with each span announced that holds it); memory of a CUDA memory pool that exports POSIX fds as its
//!    `cuMemPoolExportPointer` data and the index of its pool, which is announced once per
//!    channel before its first allocation (an fd of `cuMemPoolExportToShareableHandle`, with
//!    `SCM_RIGHTS`, and the UUID of its device) and forgotten with the last of its allocations
//!    the consumer knows. Memory re-allocated at the same base has a new `BUFFER_ID`: the old slot is
//!    forgotten and the new allocation announced, so a stale import never serves it.
//! 3. A message carries (slot, generation, offset, length, ready value). The consumer checks every field and
//!    opens the allocation once (`cuIpcOpenMemHandle` with lazy peer access, or
//!    import + reserve + map + set access) in the primary context of the device whose UUID
//!    the announcement names; a message's payload is the CUDA address there. A span is mapped
//!    into one reserved range, each piece at its offset (`cuMemMap`, `cuMemSetAccess` per
//!    piece), so that the message's pointer covers every byte; it has no Vulkan view (Vulkan
//!    imports one fd per `VkDeviceMemory`, and a buffer is bound to one memory: such a
//!    message's `buffer()` is `None`, its CUDA pointer the way to it). A span's key is (base,
//!    span id), the id mixing every piece's `BUFFER_ID`: a piece re-created at its address
//!    makes the span new, announced anew. A pool is imported
//!    once (`cuMemPoolImportFromShareableHandle`), its allocations otherwise (below).
//! 4. Lifetimes: the producer keeps each allocation's registration (and a VMM piece's retained
//!    handle, which keeps its memory alive whatever the application frees) in the carrier's
//!    holds until the consumer released every message into it, or died. `cudaMalloc` memory
//!    cannot be kept so: the application must not free it before the message is complete.
//!    Nor can pool memory, and CUDA requires every import of a pool allocation to be freed
//!    before the exporter frees it: so the consumer imports a pool allocation
//!    (`cuMemPoolImportPointer`) when a message into it arrives while none is held, and frees
//!    the import (`cuMemFreeAsync` on a stream of its own, synchronised) when it lets go of the
//!    last message it holds into it, before that release reaches the producer. It is not
//!    cached beyond held messages: a consumer that holds one message at a time pays an import
//!    and a free per message (not measured yet; the pool itself is imported once per channel).
//!    The consumer closes an import when the producer forgets it, when more are open than its
//!    bound (least recently used first, never one a held message points into; a later message
//!    opens it again), or, once no message holds it, after the producer has gone.
//! 5. Synchronisation. A message without a ready value is complete when sent (the application
//!    synchronised the work that writes it). A stream-ordered send names a ready value on the
//!    channel's ready semaphore, which this route does not make but shares with the GPU route
//!    (vulkan_ipc): the Vulkan timeline semaphore the producer's context exports and the
//!    consumer's imports, which CUDA imports as well (`cuImportExternalSemaphore`). The
//!    producer's stream signals the value after the work that writes the memory; the
//!    consumer's stream waits for it before its own work. So the rule: a ready value needs a
//!    Vulkan device in both processes' contexts, on the same GPU, sharing timeline semaphores
//!    (the GPU route synchronises on the GPU), and CUDA memory of that very GPU (CUDA signals
//!    and waits for a semaphore only on its device). Elsewhere a ready value is refused
//!    (`Unsupported`, naming why; the way out is to synchronise and send without one). Values
//!    grow across both routes' messages: one timeline. The consumer checks that a message's
//!    value names a semaphore it was given, of the memory's GPU, and never goes backwards.
//!
//! The route also carries lava-flow's own GPU buffers to a consumer on another GPU of the host
//! (see `arena`): vulkan_ipc takes them where both ends use the same GPU, this route where the
//! consumer opens CUDA memory of the producer's GPU and the GPU it uses reaches it in place,
//! else they are staged. The producer offers them without using CUDA (it exports Vulkan
//! fds), so that a process that never loaded CUDA offers this route too: for GPU buffers
//! alone, saying it sends no CUDA memory.

mod arena;
mod cuda;
#[cfg(any(test, feature = "test-hooks"))]
mod fake;
mod pool;
mod receiver;
mod sender;
mod wire;

// CUDA's shareable handles are descriptors in these tests (Unix's).
#[cfg(all(unix, test))]
mod arena_tests;
#[cfg(all(unix, test))]
mod pool_span_tests;
#[cfg(all(unix, test))]
mod tests;

use std::sync::Arc;

pub(crate) use receiver::Receiver;
pub(crate) use sender::{Offer, Sender};

use crate::channels::transport::{PayloadClass, Route, TransportId};
use crate::memory::{BufferId, CudaMemoryKind};

/// This route's id in rendezvous sections, attachments and routed messages.
pub(crate) const ROUTE_ID: u32 = 3;

pub(crate) const ID: TransportId = super::CUDA_IPC;

/// A consumer's receiver for a process whose memory context is `context`, importing VMM pieces
/// into its Vulkan device too where that is the CUDA device that holds them, and taking the
/// GPU buffers of the devices its Vulkan device and `current` (the CUDA device current on the
/// thread that made the channel: [`current_device`]) reach in place. Every receiver of one
/// consumer is made with the same `current`, so that each keeps to the answer all producers
/// were given.
#[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
pub(crate) fn receiver_for(context: &crate::memory::Context, current: Option<i32>) -> Receiver {
    let receiver = receiver().with_current(current);
    #[cfg(feature = "vulkan")]
    let receiver = receiver.with_vulkan(context.gpu_device());
    receiver
}

/// A consumer's receiver, opening memory through the CUDA driver where this process has
/// loaded it (a consumer that cannot open CUDA memory answers why).
pub(crate) fn receiver() -> Receiver {
    #[cfg(feature = "test-hooks")]
    if fake() {
        return Receiver::new(Arc::new(fake::Opener), Ok(vec![fake::UUID]), receiver::OPEN_BOUND);
    }
    Receiver::new(Arc::new(cuda::DriverOpener::default()), cuda::devices(), receiver::OPEN_BOUND)
}

/// This process's ordinal of the CUDA device whose context is current on this thread, where
/// the process has loaded CUDA and made one current (asking loads nothing and makes nothing).
pub(crate) fn current_device() -> Option<i32> {
    if fake() {
        return None;
    }
    cuda::current_device()
}

/// What the producer's sender exports with.
fn exporter() -> Arc<dyn cuda::Exporter> {
    #[cfg(feature = "test-hooks")]
    if fake() {
        return Arc::new(fake::Exporter);
    }
    Arc::new(cuda::DriverExporter)
}

/// The environment variable that, set to 1 in a build with the `test-hooks` feature, makes
/// both halves of the route run without CUDA (a stand-in for the driver that opens nothing):
/// for tests of the route's negotiation and of hostile peers on machines without CUDA.
#[cfg(feature = "test-hooks")]
pub const FAKE_CUDA_ENV: &str = "LF_TEST_FAKE_CUDA_IPC";

/// Whether the route runs on the test hooks' stand-in for the driver.
fn fake() -> bool {
    #[cfg(feature = "test-hooks")]
    {
        std::env::var(FAKE_CUDA_ENV).is_ok_and(|v| v == "1")
    }
    #[cfg(not(feature = "test-hooks"))]
    false
}

/// The answer of a consumer that serves no CUDA route, saying why.
pub(crate) fn decline(why: &str) -> crate::channels::transport::Attachment {
    crate::channels::transport::Attachment::new(
        ROUTE_ID,
        wire::Section { declined: why.to_owned(), ..wire::Section::default() }.encode(),
    )
}

/// A device UUID as NVIDIA's tools print it (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
fn format_uuid(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

fn format_uuids(devices: &[[u8; 16]]) -> String {
    match devices {
        [] => "no CUDA device".into(),
        _ => {
            let list: Vec<String> = devices.iter().map(format_uuid).collect();
            format!("CUDA device{} {}", if list.len() > 1 { "s" } else { "" }, list.join(", "))
        }
    }
}

/// Why CUDA memory of `kind` (in buffer `id`) cannot go to another process, and the ways out.
pub(crate) fn refusal(kind: CudaMemoryKind, id: BufferId) -> String {
    let way_out = "allocate it with lava-flow (lf_alloc with LF_MEMORY_GPU_DEVICE_LOCAL, which CUDA imports), or copy \
                   it into a lava-flow buffer or into cudaMalloc memory (cudaMemcpy) and send that";
    match kind {
        CudaMemoryKind::Managed => format!(
            "buffer {id} is CUDA managed memory (cudaMallocManaged), which no other process can open: {way_out}"
        ),
        CudaMemoryKind::Other => format!(
            "buffer {id} is CUDA memory without a handle another process can open (memory of a pool without IPC, such \
             as the device's default pool, or cuMemCreate without POSIX fd handles): create the pool with POSIX fd \
             handle types (cuMemPoolCreate or cudaMemPoolCreate with handleTypes = \
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, and allocate from it with cudaMallocFromPoolAsync), with PyTorch \
             set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, allocate VMM memory with \
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, or {way_out}"
        ),
        CudaMemoryKind::Legacy | CudaMemoryKind::Vmm | CudaMemoryKind::Pool => {
            format!("buffer {id} is {kind}, which the cuda_ipc route sends by reference")
        }
    }
}

/// The report line CUDA memory would have before meeting the peer, where this process has
/// CUDA (a process without the driver loaded has no CUDA memory, and no line).
pub(crate) fn preview(carrier: TransportId) -> Option<Route> {
    if !lava_flow_cuda::is_loaded() {
        return None;
    }
    let reason = match Offer::cuda_memory() {
        Ok(_) => "CUDA memory: cuda_ipc, by reference where the consumer opens CUDA memory on the same devices \
                  (cudaMalloc memory as legacy CUDA IPC handles, VMM pieces as fds, memory of a pool that exports \
                  fds as the pool's fd and the allocation's export data), else refused at send"
            .to_owned(),
        Err(why) => format!("CUDA memory: refused at send (no copy is made): {why}"),
    };
    let kind = if reason.contains("cuda_ipc") { ID } else { carrier };
    Some(Route { class: PayloadClass::Cuda, kind, reason })
}
