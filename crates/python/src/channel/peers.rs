//! A consumer's producers (`Channel.peers()`, each a `Peer`), and the slot a fan-in's
//! PeerGoneError names.

use std::ffi::c_char;

use pyo3::prelude::*;

use super::Channel;
use crate::error::{check, PeerGoneError};
use crate::ffi;
use crate::native::lib;

/// One producer slot of a consumer: `slot`, `state` ("free", "alive", or "gone" with messages
/// still to read), `pid` (0 for a free slot or a peer on another host), `rank` (its MPI rank, or
/// None), `host` (empty for a free slot) and `route` (the transport its messages take, "shm" or
/// "mpi"; None for a free slot).
#[pyclass(frozen, get_all, module = "lava_flow")]
pub struct Peer {
    slot: u32,
    state: String,
    pid: u32,
    rank: Option<i32>,
    host: String,
    route: Option<String>,
}

#[pymethods]
impl Peer {
    fn __repr__(&self) -> String {
        let route = self.route.as_deref().map(|r| format!(" via {r}")).unwrap_or_default();
        let host = if self.host.is_empty() { String::new() } else { format!(" on {}", self.host) };
        format!("<lava_flow.Peer slot {} {}, pid {}{host}{route}>", self.slot, self.state, self.pid)
    }
}

/// A NUL-terminated string in a fixed C array (the whole array when it lacks the NUL).
fn fixed(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl From<&ffi::lf_peer> for Peer {
    fn from(p: &ffi::lf_peer) -> Self {
        let state = match p.state {
            ffi::LF_PEER_FREE => "free",
            ffi::LF_PEER_ALIVE => "alive",
            ffi::LF_PEER_GONE => "gone",
            _ => "unknown",
        };
        let route = fixed(&p.route);
        Peer {
            slot: p.slot,
            state: state.to_owned(),
            pid: p.pid,
            rank: (p.rank >= 0).then_some(p.rank),
            host: fixed(&p.host),
            route: (!route.is_empty()).then_some(route),
        }
    }
}

impl Channel {
    /// The consumer's producer slots (`lf_channel_peers`): how many there are, then each.
    pub(super) fn peer_list(&self, py: Python<'_>) -> PyResult<Vec<Peer>> {
        self.quick(py, |ch| {
            let size = std::mem::size_of::<ffi::lf_peer>();
            let mut count = 0usize;
            // SAFETY: live channel; no entries asked for, local out-parameter.
            check(unsafe { lib().lf_channel_peers(ch.0, std::ptr::null_mut(), size, 0, &mut count) })?;
            let mut peers = vec![ffi::lf_peer::default(); count];
            // SAFETY: live channel; `peers` is writable for `count` entries. The count cannot
            // change under the channel's lock, which this call holds.
            check(unsafe { lib().lf_channel_peers(ch.0, peers.as_mut_ptr(), size, count, &mut count) })?;
            Ok(peers.iter().take(count).map(Peer::from).collect())
        })
    }

    /// A fan-in consumer's PeerGoneError, given the slot whose producer ended (`gone`, from
    /// the receive's out-parameter) as its `producer`. Pairs keep the class's None.
    #[cold]
    pub(super) fn name_gone(&self, py: Python<'_>, err: PyErr, gone: Option<u32>) -> PyErr {
        if err.is_instance_of::<PeerGoneError>(py) {
            // A new producer in the slot brings its own ready semaphore.
            self.forget_producer(gone.filter(|_| self.kind == ffi::LF_CHANNEL_FAN_IN));
        }
        if let Some(slot) = gone.filter(|_| self.kind == ffi::LF_CHANNEL_FAN_IN) {
            if err.is_instance_of::<PeerGoneError>(py) {
                let _ = err.value_bound(py).setattr("producer", slot);
            }
        }
        err
    }
}
