//! Spans of CUDA VMM pieces mapped back to back (PyTorch's expandable segments map 2 MiB or
//! 20 MiB pieces so), registered as one allocation where a tensor crosses a piece boundary.
//!
//! Why the pieces the tensor covers and not the whole contiguous mapping: an expandable
//! segment grows and shrinks piece by piece while the application runs, so its whole extent
//! is no allocation that lasts; and every piece a registration spans is held alive by the
//! producer while a message into the span is unreleased, which should be the pieces the
//! message reads, not all the segment's.
//!
//! A span's key: its base, its size and a span id, which mixes every piece's offset and
//! `BUFFER_ID` (with the top bit set, so that it never equals a single piece's id, which CUDA
//! counts up from 1). A piece re-created at its address has a new `BUFFER_ID`, so the span
//! that holds it gets a new id too: the registration and every channel's announcement of the
//! old span are stale, and never serve it.
//!
//! A range inside one piece still registers that piece alone. A piece and a span that holds
//! it overlap: registering one retires the other's registration (its buffers stay valid), and
//! a channel that sends into both in turn announces each anew (with each span, every piece's
//! fd goes again). Send from one registration where that matters.

use lava_flow_cuda::sys::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;

use super::{vmm_piece_at, CudaMemoryKind, CudaPointer};
use crate::error::{Error, Result};

/// The bit that marks a span id.
const SPAN_BIT: u64 = 1 << 63;

/// The most pieces one span holds: a bound on what one registration (and one announcement)
/// keeps alive and passes.
pub const MAX_PIECES: usize = 256;

/// One piece of a span: its place in the span, its size and `BUFFER_ID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) offset: u64,
    pub(crate) size: usize,
    pub(crate) buffer_id: u64,
}

/// The id of a span of `pieces` (one piece's own id where there is one).
pub(crate) fn span_id(pieces: &[Piece]) -> u64 {
    if let [one] = pieces {
        return one.buffer_id;
    }
    // FNV-1a over (offset, id) of each piece, then a final mix: ids are small counters.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for piece in pieces {
        for word in [piece.offset, piece.buffer_id] {
            for byte in word.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash | SPAN_BIT
}

/// Whether `pointer` is a span of several VMM pieces.
pub(crate) fn is_span(pointer: &CudaPointer) -> bool {
    pointer.kind == CudaMemoryKind::Vmm && pointer.buffer_id & SPAN_BIT != 0
}

/// The span of pieces holding `[addr, addr + len)`, where `piece` (the piece holding `addr`)
/// does not hold it all: the pieces after it, mapped back to back in the same contiguous
/// range, until the range is covered. Errors name what is not VMM memory of fd handles, or a
/// gap.
pub(crate) fn span_from(piece: CudaPointer, addr: u64, len: usize) -> Result<CudaPointer> {
    let driver = lava_flow_cuda::driver()?;
    let end = addr + len as u64;
    let [range] = driver.pointer_attributes(piece.base, [CU_POINTER_ATTRIBUTE_RANGE_START_ADDR])?;
    let mut pieces = vec![Piece { offset: 0, size: piece.size, buffer_id: piece.buffer_id }];
    let mut at = piece.base + piece.size as u64;
    while at < end {
        let next = vmm_piece_at(driver, at)?;
        let Some(next) = next.filter(|n| n.kind == CudaMemoryKind::Vmm && n.base == at) else {
            return Err(Error::invalid(format!(
                "[{addr:#x}, +{len}) runs from CUDA VMM memory into {at:#x}, which is not a VMM piece with POSIX fd \
                 handles mapped right after it; register the range of one allocation or of VMM pieces mapped back \
                 to back"
            )));
        };
        let [next_range] = driver.pointer_attributes(at, [CU_POINTER_ATTRIBUTE_RANGE_START_ADDR])?;
        if next_range != range || next.device_ordinal != piece.device_ordinal {
            return Err(Error::invalid(format!(
                "[{addr:#x}, +{len}) crosses from one CUDA mapping into another at {at:#x} (not one contiguous \
                 range of one device); register each part on its own"
            )));
        }
        pieces.push(Piece { offset: at - piece.base, size: next.size, buffer_id: next.buffer_id });
        if pieces.len() > MAX_PIECES {
            return Err(Error::invalid(format!(
                "[{addr:#x}, +{len}) spans more than {MAX_PIECES} CUDA VMM pieces; register (and send) it in parts"
            )));
        }
        at += next.size as u64;
    }
    Ok(CudaPointer { size: (at - piece.base) as usize, buffer_id: span_id(&pieces), ..piece })
}

/// The pieces of span `pointer` as they are mapped now, checked against the span's id: an
/// error where a piece was re-created or unmapped since the span was registered.
pub(crate) fn pieces_of(pointer: &CudaPointer) -> Result<Vec<Piece>> {
    let driver = lava_flow_cuda::driver()?;
    let end = pointer.base + pointer.size as u64;
    let mut pieces = Vec::new();
    let mut at = pointer.base;
    while at < end && pieces.len() <= MAX_PIECES {
        let Some(piece) = vmm_piece_at(driver, at)?.filter(|p| p.kind == CudaMemoryKind::Vmm && p.base == at) else {
            break;
        };
        pieces.push(Piece { offset: at - pointer.base, size: piece.size, buffer_id: piece.buffer_id });
        at += piece.size as u64;
    }
    if at != end || span_id(&pieces) != pointer.buffer_id {
        return Err(Error::InvalidState(format!(
            "the CUDA VMM pieces at [{:#x}, +{}) changed since they were registered (a piece was unmapped or \
             re-created): register the memory again",
            pointer.base, pointer.size
        )));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_id_changes_with_any_piece_and_is_never_a_piece_s_id() {
        let pieces =
            [Piece { offset: 0, size: 2 << 20, buffer_id: 5 }, Piece { offset: 2 << 20, size: 2 << 20, buffer_id: 6 }];
        let id = span_id(&pieces);
        assert_ne!(id & SPAN_BIT, 0);
        assert_eq!(span_id(&pieces[..1]), 5, "one piece keeps its own id");
        let recreated = [pieces[0], Piece { buffer_id: 9, ..pieces[1] }];
        assert_ne!(span_id(&recreated), id, "a re-created piece gives the span a new id");
        let swapped = [Piece { buffer_id: 6, ..pieces[0] }, Piece { buffer_id: 5, ..pieces[1] }];
        assert_ne!(span_id(&swapped), id);
        let pointer = CudaPointer {
            kind: CudaMemoryKind::Vmm,
            base: 0,
            size: 4 << 20,
            buffer_id: id,
            device_ordinal: 0,
            context: 0,
        };
        assert!(is_span(&pointer));
        assert!(!is_span(&CudaPointer { buffer_id: 5, ..pointer }));
    }
}
