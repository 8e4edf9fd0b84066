//! `lf_channel_peers`: the processes at the other end of a channel, slot by slot (`lf_peer`).

use std::ffi::c_char;

use super::abi::{c_enum, CEnum};
use super::channel::{lf_channel, lock};
use super::raw;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure};
use lava_flow::channels::{Channel, Peer, PeerState};

/// The most producers a fan-in takes, or consumers a fan-out (`lf_channel_config.max_peers`).
// A literal, so that cbindgen writes it into the header (it cannot follow the core's constant);
// the assertion keeps the two the same.
pub const LF_MAX_PEERS: u32 = 64;
const _: () = assert!(LF_MAX_PEERS == lava_flow::channels::MAX_PEERS, "LF_MAX_PEERS must be the core's MAX_PEERS");
/// The size of `lf_peer.host` and `lf_peer.route`'s buffers, NUL included.
pub const LF_PEER_HOST_SIZE: u32 = 256;
pub const LF_PEER_ROUTE_SIZE: u32 = 16;

/// Whether a slot has a process (`lf_peer.state`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_peer_state {
    /// Nobody holds the slot: a new peer may take it.
    LF_PEER_FREE = 0,
    /// The peer is attached.
    LF_PEER_ALIVE = 1,
    /// The peer closed its end or died; its last messages may still wait (the slot is free
    /// once its LF_ERR_PEER_GONE has been returned).
    LF_PEER_GONE = 2,
}
c_enum!(lf_peer_state: LF_PEER_FREE, LF_PEER_ALIVE, LF_PEER_GONE);

/// One slot at the other end of a channel (`lf_channel_peers`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lf_peer {
    /// 0 to `max_peers - 1` for a fan-in's producers (as `lf_message.producer` names them) and
    /// a fan-out's consumers; 0 for a pair channel's peer. A fan-out's consumer lists its
    /// producer under the consumer's own slot.
    pub slot: u32,
    pub state: raw::lf_peer_state,
    /// The peer's process id on its host; 0 for a free slot or a peer on another host.
    pub pid: u32,
    /// The peer's MPI rank where MPI reaches it, else -1.
    pub rank: i32,
    /// The peer's host, NUL-terminated (empty for a free slot).
    pub host: [c_char; LF_PEER_HOST_SIZE as usize],
    /// The transport its messages take (`"shm"`, `"mpi"`), NUL-terminated; empty for a free
    /// slot.
    pub route: [c_char; LF_PEER_ROUTE_SIZE as usize],
}

/// `text` into a NUL-terminated buffer, cut to fit.
fn put_str<const N: usize>(text: &str, out: &mut [c_char; N]) {
    let bytes = &text.as_bytes()[..text.len().min(N - 1)];
    for (o, b) in out.iter_mut().zip(bytes.iter().chain(std::iter::once(&0))) {
        *o = *b as c_char;
    }
}

impl From<&Peer> for lf_peer {
    fn from(p: &Peer) -> Self {
        let state = match p.state {
            PeerState::Free => lf_peer_state::LF_PEER_FREE,
            PeerState::Alive => lf_peer_state::LF_PEER_ALIVE,
            PeerState::Gone => lf_peer_state::LF_PEER_GONE,
        };
        let mut peer = lf_peer {
            slot: p.slot,
            state: state.to_c(),
            pid: p.pid,
            rank: p.rank.unwrap_or(-1),
            host: [0; LF_PEER_HOST_SIZE as usize],
            route: [0; LF_PEER_ROUTE_SIZE as usize],
        };
        put_str(&p.host, &mut peer.host);
        put_str(p.route.unwrap_or_default(), &mut peer.route);
        peer
    }
}

/// Lists the processes at the other end, slot by slot: a consumer's producers (a pair
/// channel's one, or each of a fan-in's `max_peers` slots: free, alive, or gone with messages
/// still to read), a producer's consumers (each of a fan-out's `max_peers` slots, or a pair
/// channel's one, whose pid the producer does not know: 0). Writes up to `capacity` entries
/// to `peers` (which may be NULL when `capacity` is 0) and the number of slots to `*count`:
/// call with a `capacity` of `LF_MAX_PEERS`, or twice. `peer_size` must be `sizeof(lf_peer)`.
///
/// # Safety
/// `channel` a pointer from lava-flow or NULL; `peers` NULL or writable for `capacity`
/// entries; `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_channel_peers(
    channel: *const lf_channel,
    peers: *mut lf_peer,
    peer_size: usize,
    capacity: usize,
    count: *mut usize,
) -> lf_status {
    boundary("lf_channel_peers", || {
        let count = out_ptr(count, "count")?;
        if capacity > 0 && peers.is_null() {
            return Err(Failure::null("peers"));
        }
        if peer_size != std::mem::size_of::<lf_peer>() {
            return Err(Failure {
                status: lf_status::LF_ERR_INVALID_ARGUMENT,
                message: format!(
                    "peer_size is {peer_size}, and this library's lf_peer has {} bytes: pass sizeof(lf_peer) from \
                     the header of the library you link",
                    std::mem::size_of::<lf_peer>()
                ),
            });
        }
        let ch = handle_ref(channel, "channel")?;
        let guard = lock(ch)?;
        let list = match &*guard {
            Channel::Consumer(c) => c.peers(),
            Channel::Producer(p) => p.peers(),
        };
        for (i, peer) in list.iter().take(capacity).enumerate() {
            // SAFETY: the caller promises `capacity` writable entries; i < capacity.
            write_out(unsafe { peers.add(i) }, lf_peer::from(peer));
        }
        write_out(count, list.len());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_strings_are_cut_to_fit_and_terminated() {
        let peer = Peer { host: "h".repeat(300), route: Some("shm"), ..Peer::free(3) };
        let c = lf_peer::from(&peer);
        assert_eq!((c.slot, c.host[254], c.host[255], c.route[3]), (3, b'h' as c_char, 0, 0));
    }
}
