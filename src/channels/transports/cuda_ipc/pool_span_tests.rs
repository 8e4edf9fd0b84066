//! The route's handling of memory of CUDA memory pools and of spans of VMM pieces, against the
//! stand-ins of `tests` (these run without CUDA): what the consumer imports and frees when,
//! what a hostile producer's records get, and what the producer announces.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::receiver::Receiver;
use super::tests::{announce, forget, legacy, receiver, resolve, Counts, DEVICE};
use super::wire::{AllocationRecord, Announce, PieceRecord, PoolAnnounce, MAX_PIECES, MEMORY_POOL, MEMORY_VMM_SPAN};
use super::ROUTE_ID;
use crate::channels::transport::{Attachment, PeerHolds, RouteReceiver};
use crate::error::Error;

// ---- memory of CUDA memory pools ----

fn pool_allocation(buffer_id: u64, pool: u32) -> Announce {
    Announce { memory: MEMORY_POOL, pool, ..legacy(buffer_id) }
}

fn announce_pool(r: &mut Receiver, index: u32, pool: PoolAnnounce, fds: usize) -> crate::Result<()> {
    let bytes = AllocationRecord::Pool { index, pool }.encode();
    let handles = (0..fds).map(|_| std::fs::File::open("/dev/null").unwrap().into()).collect();
    r.attach(Attachment { route: ROUTE_ID, bytes, handles }, 0)
}

const POOL: PoolAnnounce = PoolAnnounce { device_uuid: DEVICE, exporter_pid: 42 };

fn counted(counts: &Counts) -> [usize; 4] {
    [&counts.pools, &counts.imports, &counts.frees, &counts.pools_closed].map(|c| c.load(Ordering::Relaxed))
}

/// A pool is imported once; each of its allocations is imported while a message into it is
/// held and freed when the last such message is released (before the release reaches the
/// producer, which may free the allocation then), and imported again for the next message.
#[test]
fn pool_memory_is_imported_while_a_message_holds_it_and_freed_with_the_last() {
    let (mut r, counts) = receiver(8);
    announce_pool(&mut r, 0, POOL, 1).unwrap();
    announce(&mut r, 0, 1, pool_allocation(2, 0), 0).unwrap();
    announce(&mut r, 1, 1, pool_allocation(3, 0), 0).unwrap();
    assert_eq!(counted(&counts), [0, 0, 0, 0], "nothing imported before a message");
    let first = resolve(&mut r, 0, 0, 1, 64, 100).unwrap().unwrap();
    assert_eq!(first.cuda_ptr(), Some((0x2000_0000 + 64, 1)), "on device 1: the UUID's ordinal here");
    let second = resolve(&mut r, 1, 0, 1, 0, 8).unwrap().unwrap();
    assert_eq!(counted(&counts), [1, 1, 0, 0], "one import while messages into it are held");
    drop(first);
    assert_eq!(counted(&counts), [1, 1, 0, 0], "message 1 still holds it");
    drop(second);
    assert_eq!(counted(&counts), [1, 1, 1, 0], "freed with the last message's release");
    let third = resolve(&mut r, 2, 0, 1, 0, 8).unwrap().unwrap();
    let other = resolve(&mut r, 3, 1, 1, 0, 8).unwrap().unwrap();
    assert_eq!(other.cuda_ptr(), Some((0x3000_0000, 1)), "the other allocation, of the same pool");
    assert_eq!(counted(&counts), [1, 3, 1, 0], "imported again; the pool once");
    drop((third, other));
    assert_eq!(counted(&counts), [1, 3, 3, 0]);
    // Forgotten (the application let go of both), then the pool: given back once nothing
    // announced from it is left.
    forget(&mut r, 0, 1, 4);
    forget(&mut r, 1, 1, 4);
    r.attach(Attachment::new(ROUTE_ID, AllocationRecord::ForgetPool { index: 0 }.encode()), 4).unwrap();
    assert_eq!(counted(&counts), [1, 3, 3, 1]);
    // The index may carry another pool now.
    announce_pool(&mut r, 0, POOL, 1).unwrap();
}

/// A producer gone while a message into pool memory is held: the import stays until the
/// message is released, then it is freed.
#[test]
fn a_gone_producer_s_pool_imports_are_freed_once_no_message_holds_them() {
    let (mut r, counts) = receiver(8);
    announce_pool(&mut r, 5, POOL, 1).unwrap();
    announce(&mut r, 0, 1, pool_allocation(2, 5), 0).unwrap();
    let held = resolve(&mut r, 0, 0, 1, 0, 8).unwrap().unwrap();
    let (_, kept) = r.end_session();
    assert_eq!(held.cuda_ptr().unwrap().0, 0x2000_0000, "still readable");
    assert_eq!(counted(&counts), [1, 1, 0, 0]);
    drop(held);
    assert_eq!(counted(&counts), [1, 1, 1, 0], "freed with the release");
    drop(kept);
    assert_eq!(counted(&counts), [1, 1, 1, 1]);
}

/// What a hostile producer could send of pools: each refused as corrupt, naming the problem.
#[test]
fn hostile_pool_records_are_corrupt() {
    use super::wire::MAX_POOLS;
    let (mut r, _) = receiver(8);
    let corrupt = |result: crate::Result<()>, words: &str| match result {
        Err(Error::Corrupt(m)) => assert!(m.contains(words), "{m} (expected {words:?})"),
        other => panic!("{other:?}, expected Corrupt naming {words:?}"),
    };
    corrupt(announce_pool(&mut r, MAX_POOLS, POOL, 1), "beyond the 64");
    corrupt(announce_pool(&mut r, 0, POOL, 0), "its one fd");
    corrupt(announce_pool(&mut r, 0, POOL, 2), "its one fd");
    corrupt(announce_pool(&mut r, 0, PoolAnnounce { device_uuid: [9; 16], ..POOL }, 1), "does not see");
    announce_pool(&mut r, 0, POOL, 1).unwrap();
    corrupt(announce_pool(&mut r, 0, POOL, 1), "twice");
    corrupt(announce(&mut r, 0, 1, pool_allocation(2, 1), 0), "never announced");
    corrupt(announce(&mut r, 0, 1, pool_allocation(2, MAX_POOLS), 0), "beyond the 64");
    corrupt(announce(&mut r, 0, 1, Announce { device_uuid: [1; 16], ..pool_allocation(2, 0) }, 0), "but the pool is");
    corrupt(announce(&mut r, 0, 1, Announce { exporter_pid: 7, ..pool_allocation(2, 0) }, 0), "but the pool is");
    corrupt(announce(&mut r, 0, 1, Announce { pool: 3, ..legacy(2) }, 0), "which is no pool's");
    let bytes = AllocationRecord::Announce { slot: 0, generation: 1, allocation: pool_allocation(2, 0) }.encode();
    let with_fd =
        Attachment { route: ROUTE_ID, bytes, handles: vec![std::fs::File::open("/dev/null").unwrap().into()] };
    assert!(matches!(r.attach(with_fd, 0), Err(Error::Corrupt(_))), "pool memory comes without an fd");
    let forget_unknown = AllocationRecord::ForgetPool { index: 9 }.encode();
    corrupt(r.attach(Attachment::new(ROUTE_ID, forget_unknown), 0), "never announced");
    let mut generation = AllocationRecord::ForgetPool { index: 0 }.encode();
    generation[8] = 1;
    corrupt(r.attach(Attachment::new(ROUTE_ID, generation), 0), "pools have none");
    // What was announced well still serves.
    announce(&mut r, 0, 1, pool_allocation(2, 0), 0).unwrap();
    assert!(resolve(&mut r, 0, 0, 1, 0, 8).unwrap().is_some());
}

/// The producer's half for pool memory: the pool announced once with its fd before the first
/// allocation of it, each allocation with its export data; memory re-allocated at the same
/// base (a caching allocator's reuse) keeps the pool known; the pool forgotten with the last
/// allocation of it that the consumer knows.
#[test]
fn the_sender_announces_a_pool_once_and_forgets_it_with_its_last_allocation() {
    use crate::channels::transport::{MemoryKind, Packed, Payload, PayloadMemory, RouteSender};
    use crate::memory::{CudaMemoryKind, CudaPointer};

    let context = crate::memory::Context::new(crate::memory::ContextConfig {
        gpu: crate::memory::GpuPolicy::Disabled,
        ..Default::default()
    })
    .unwrap();
    let holds = Arc::new(PeerHolds::default());
    let mut sender =
        super::Sender::new(vec![super::fake::UUID], true, None, Arc::clone(&holds), Arc::new(super::fake::Exporter));
    assert!(sender.route().reason.contains("memory of a CUDA memory pool"), "{}", sender.route().reason);
    // The stand-in names a pool by the allocation's 4 GiB region.
    let pointer = |base: u64, buffer_id| CudaPointer {
        kind: CudaMemoryKind::Pool,
        base,
        size: 1 << 20,
        buffer_id,
        device_ordinal: 0,
        context: 0,
    };
    let mut seq = 0;
    let mut send = |sender: &mut super::Sender, buffer: &crate::memory::Buffer, completed: u64| {
        let payload = Payload {
            memory: PayloadMemory::Buffer(buffer),
            kind: MemoryKind::Cuda,
            offset: 0,
            len: 64,
            ready_value: 0,
        };
        let mut out = Packed::default();
        sender.pack(&payload, completed, &mut out).unwrap();
        sender.sent(seq);
        seq += 1;
        let fds: Vec<usize> = out.attachments.iter().map(|a| a.handles.len()).collect();
        let records: Vec<AllocationRecord> =
            out.attachments.iter().map(|a| AllocationRecord::decode(&a.bytes, a.handles.len()).unwrap()).collect();
        (records, fds)
    };
    let a = context.register_cuda_for_tests(pointer(0x7000_0000_0000, 1)).unwrap();
    let (records, fds) = send(&mut sender, &a, 0);
    assert!(
        matches!(records[..], [
            AllocationRecord::Pool { index: 0, pool: PoolAnnounce { device_uuid: super::fake::UUID, .. } },
            AllocationRecord::Announce { slot: 0, allocation: Announce { memory: MEMORY_POOL, pool: 0, ipc_handle, .. }, .. }
        ] if ipc_handle[0] == 1),
        "{records:?}"
    );
    assert_eq!(fds, [1, 0], "the pool's fd, and none for its allocation");
    let b = context.register_cuda_for_tests(pointer(0x7000_1000_0000, 2)).unwrap();
    let (records, _) = send(&mut sender, &b, 0);
    assert!(matches!(records[..], [AllocationRecord::Announce { slot: 1, allocation: Announce { pool: 0, .. }, .. }]));
    // Another pool: another index.
    let c = context.register_cuda_for_tests(pointer(0x7100_0000_0000, 3)).unwrap();
    let (records, _) = send(&mut sender, &c, 0);
    assert!(matches!(records[..], [AllocationRecord::Pool { index: 1, .. }, AllocationRecord::Announce { .. }]));
    // Re-allocated at a's base: a forgotten, the new one announced, the pool kept.
    drop(a);
    let a2 = context.register_cuda_for_tests(pointer(0x7000_0000_0000, 4)).unwrap();
    let (records, _) = send(&mut sender, &a2, 0);
    assert!(
        matches!(
            records[..],
            [
                AllocationRecord::Forget { slot: 0, .. },
                AllocationRecord::Announce { allocation: Announce { pool: 0, buffer_id: 4, .. }, .. }
            ]
        ),
        "{records:?}"
    );
    // Every allocation of pool 0 let go of and released: the next sweep forgets them and the pool.
    drop((a2, b));
    let d = context.register_cuda_for_tests(pointer(0x7100_1000_0000, 5)).unwrap();
    let (records, _) = send(&mut sender, &d, 10);
    let forgot_pool = records.iter().filter(|r| matches!(r, AllocationRecord::ForgetPool { index: 0 })).count();
    assert_eq!(forgot_pool, 1, "{records:?}");
    assert!(!records.iter().any(|r| matches!(r, AllocationRecord::Pool { .. })), "pool 1 stays known: {records:?}");
    // A pool allocation of the forgotten pool announces the pool again (at its free index).
    let e = context.register_cuda_for_tests(pointer(0x7000_2000_0000, 6)).unwrap();
    let (records, _) = send(&mut sender, &e, 10);
    assert!(matches!(records[..], [AllocationRecord::Pool { index: 0, .. }, AllocationRecord::Announce { .. }]));
    drop((c, d, e));
    holds.consumer_died();
}

// ---- spans of VMM pieces ----

const PIECE: u64 = 2 << 20;

fn span(buffer_id: u64, pieces: u32) -> Announce {
    Announce { memory: MEMORY_VMM_SPAN, pieces, size: PIECE * u64::from(pieces), ..legacy(buffer_id) }
}

fn piece(r: &mut Receiver, slot: u32, generation: u32, index: u32, offset: u64, size: u64) -> crate::Result<()> {
    let piece = PieceRecord { index, offset, size, buffer_id: 100 + u64::from(index) };
    let bytes = AllocationRecord::Piece { slot, generation, piece }.encode();
    let handles = vec![std::fs::File::open("/dev/null").unwrap().into()];
    r.attach(Attachment { route: ROUTE_ID, bytes, handles }, 0)
}

/// A span's pieces, each with its fd, then the span: mapped as one range (each piece at its
/// offset), so that a message across a piece boundary is one CUDA pointer.
#[test]
fn a_span_of_pieces_is_opened_as_one_range() {
    let (mut r, counts) = receiver(8);
    for index in 0..3 {
        piece(&mut r, 2, 1, index, PIECE * u64::from(index), PIECE).unwrap();
    }
    announce(&mut r, 2, 1, span(4, 3), 0).unwrap();
    let across = resolve(&mut r, 0, 2, 1, PIECE - 64, 128).unwrap().unwrap();
    assert_eq!(across.cuda_ptr(), Some((0x4000_0000 + PIECE - 64, 0)));
    assert!(across.to_buffer().is_none(), "a span has no Vulkan view");
    assert_eq!(*counts.spans.lock(), [vec![(0, PIECE), (PIECE, PIECE), (2 * PIECE, PIECE)]]);
    let err = resolve(&mut r, 1, 2, 1, 3 * PIECE - 8, 16).err().expect("past the span");
    assert!(matches!(&err, Error::Corrupt(m) if m.contains("bytes at offset")), "{err}");
}

/// What a hostile producer could send of spans: each refused as corrupt, naming the problem.
#[test]
fn hostile_span_records_are_corrupt() {
    let corrupt = |result: crate::Result<()>, words: &str| match result {
        Err(Error::Corrupt(m)) => assert!(m.contains(words), "{m} (expected {words:?})"),
        other => panic!("{other:?}, expected Corrupt naming {words:?}"),
    };
    // A span without (enough) pieces.
    let (mut r, _) = receiver(8);
    corrupt(announce(&mut r, 0, 1, span(4, 2), 0), "after 0 pieces");
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    corrupt(announce(&mut r, 0, 1, span(4, 2), 0), "after 1 pieces");
    // A gap, pieces out of order, pieces of another slot, a size that is not the pieces'.
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    piece(&mut r, 0, 1, 1, PIECE + 4096, PIECE).unwrap();
    corrupt(announce(&mut r, 0, 1, span(4, 2), 0), "lies at offset");
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 1, 0, PIECE).unwrap();
    piece(&mut r, 0, 1, 0, PIECE, PIECE).unwrap();
    corrupt(announce(&mut r, 0, 1, span(4, 2), 0), "as piece 0");
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    piece(&mut r, 1, 1, 1, PIECE, PIECE).unwrap();
    corrupt(announce(&mut r, 0, 1, span(4, 2), 0), "slot 1");
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    piece(&mut r, 0, 1, 1, PIECE, PIECE).unwrap();
    corrupt(announce(&mut r, 0, 1, Announce { size: 3 * PIECE, ..span(4, 2) }, 0), "whose pieces hold");
    // Pieces followed by anything but their span.
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    corrupt(announce(&mut r, 1, 1, legacy(5), 0), "without the span");
    // More pieces than a span has.
    let (mut r, _) = receiver(8);
    for index in 0..MAX_PIECES {
        piece(&mut r, 0, 1, index, PIECE * u64::from(index), PIECE).unwrap();
    }
    corrupt(piece(&mut r, 0, 1, 0, 0, PIECE), "more than 256");
    // Records announced well still serve.
    let (mut r, _) = receiver(8);
    piece(&mut r, 0, 1, 0, 0, PIECE).unwrap();
    piece(&mut r, 0, 1, 1, PIECE, PIECE).unwrap();
    announce(&mut r, 0, 1, span(4, 2), 0).unwrap();
    assert!(resolve(&mut r, 0, 0, 1, 0, 2 * PIECE).unwrap().is_some());
}

/// Exports spans as two pieces of fds of `/dev/null` (the rest as the stand-in does).
struct SpanExporter;

impl super::cuda::Exporter for SpanExporter {
    fn device_uuid(&self, _ordinal: i32) -> crate::Result<[u8; 16]> {
        Ok(DEVICE)
    }
    fn export_legacy(&self, pointer: &crate::memory::CudaPointer) -> crate::Result<[u8; 64]> {
        super::cuda::Exporter::export_legacy(&super::fake::Exporter, pointer)
    }
    fn export_vmm(
        &self,
        _pointer: &crate::memory::CudaPointer,
    ) -> crate::Result<(Box<dyn std::any::Any + Send + Sync>, std::os::fd::OwnedFd)> {
        Ok((Box::new(()), std::fs::File::open("/dev/null").unwrap().into()))
    }
    fn export_vmm_span(&self, pointer: &crate::memory::CudaPointer) -> crate::Result<Vec<super::cuda::SpanPiece>> {
        let half = pointer.size / 2;
        Ok([0, 1]
            .map(|i| {
                let piece =
                    crate::memory::cuda::Piece { offset: (i * half) as u64, size: half, buffer_id: 50 + i as u64 };
                let retained: Box<dyn std::any::Any + Send + Sync> = Box::new(());
                (piece, retained, std::fs::File::open("/dev/null").unwrap().into())
            })
            .into())
    }
    fn export_pool_pointer(&self, pointer: &crate::memory::CudaPointer) -> crate::Result<(u64, [u8; 64])> {
        super::cuda::Exporter::export_pool_pointer(&super::fake::Exporter, pointer)
    }
    fn export_pool(&self, pool: u64) -> crate::Result<std::os::fd::OwnedFd> {
        super::cuda::Exporter::export_pool(&super::fake::Exporter, pool)
    }
}

/// The producer's half for a span: each piece with its fd, then the span naming how many; the
/// consumer reads them back into one range, where a message across the boundary lies.
#[test]
fn the_sender_announces_a_span_piece_by_piece_and_the_consumer_maps_it_whole() {
    use crate::channels::transport::{MemoryKind, Packed, Payload, PayloadMemory, RouteSender};
    use crate::memory::{CudaMemoryKind, CudaPointer};

    let context = crate::memory::Context::new(crate::memory::ContextConfig {
        gpu: crate::memory::GpuPolicy::Disabled,
        ..Default::default()
    })
    .unwrap();
    let holds = Arc::new(PeerHolds::default());
    let mut sender = super::Sender::new(vec![DEVICE], true, None, Arc::clone(&holds), Arc::new(SpanExporter));
    let pointer = CudaPointer {
        kind: CudaMemoryKind::Vmm,
        base: 0x7000_0000_0000,
        size: 2 * PIECE as usize,
        buffer_id: 1 << 63 | 77,
        device_ordinal: 0,
        context: 0,
    };
    let buffer = context.register_cuda_for_tests(pointer).unwrap();
    let payload = Payload {
        memory: PayloadMemory::Buffer(&buffer),
        kind: MemoryKind::Cuda,
        offset: PIECE as usize - 16,
        len: 32,
        ready_value: 0,
    };
    let mut out = Packed::default();
    sender.pack(&payload, 0, &mut out).unwrap();
    sender.sent(0);
    let fds: Vec<usize> = out.attachments.iter().map(|a| a.handles.len()).collect();
    assert_eq!(fds, [1, 1, 0], "a fd per piece, none for the span");
    let records: Vec<AllocationRecord> =
        out.attachments.iter().map(|a| AllocationRecord::decode(&a.bytes, a.handles.len()).unwrap()).collect();
    assert!(
        matches!(
            records[..],
            [
                AllocationRecord::Piece { slot: 0, generation: 1, piece: PieceRecord { index: 0, offset: 0, .. } },
                AllocationRecord::Piece {
                    slot: 0,
                    generation: 1,
                    piece: PieceRecord { index: 1, offset: PIECE, size: PIECE, buffer_id: 51 }
                },
                AllocationRecord::Announce {
                    slot: 0,
                    generation: 1,
                    allocation: Announce { memory: MEMORY_VMM_SPAN, pieces: 2, .. }
                },
            ]
        ),
        "{records:?}"
    );
    let (mut r, counts) = receiver(8);
    for mut attachment in out.attachments.drain(..) {
        // As from another process (one's own memory is not opened).
        let record = AllocationRecord::decode(&attachment.bytes, attachment.handles.len()).unwrap();
        if let AllocationRecord::Announce { slot, generation, allocation } = record {
            let allocation = Announce { exporter_pid: 42, ..allocation };
            attachment.bytes = AllocationRecord::Announce { slot, generation, allocation }.encode();
        }
        r.attach(attachment, 0).unwrap();
    }
    let message = r.resolve(0, &out.descriptor[..out.descriptor_len]).unwrap().unwrap();
    assert_eq!(message.cuda_ptr().unwrap().0, 0x1000_0000 * 77 + PIECE - 16);
    assert_eq!(*counts.spans.lock(), [vec![(0, PIECE), (PIECE, PIECE)]]);
    drop(message);
    drop(buffer);
    holds.consumer_died();
}
