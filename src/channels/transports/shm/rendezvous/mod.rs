//! Meeting by name on one host: the consumer listens on a Unix socket
//! `<runtime dir>/<name>.sock`, the producer connects (retrying until the consumer is there, so
//! either may start first), each checks the other's uid with `SO_PEERCRED`, and the producer
//! sends a hello: the channel's name and one [`Attachment`](crate::channels::transport::Attachment)
//! per route it offers (the carrier's: shared memory and its notification socket; a GPU
//! route's: device identity and semaphore), descriptors attached with `SCM_RIGHTS`. The
//! consumer answers with its own sections or a refusal.
//!
//! The runtime dir is `$LF_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/lava-flow`, else
//! `/tmp/lava-flow-$UID`; it is created 0700 and refused unless it is a real directory owned
//! by this user and closed to others. Sockets are 0600. Shared memory is a memfd, so a crash
//! leaves nothing in `/dev/shm`.
//!
//! Each end of a channel holds a lock file, `<name>.producer.lock` or `<name>.consumer.lock`
//! ([`EndLock`], `flock`), for as long as it lives: a second producer or consumer of a live
//! channel finds it held and is refused at once. A fan-in's producers hold
//! `<name>.producer.<slot>.lock` instead, each the lowest slot it finds free, which it names in
//! its hello; the consumer refuses a slot past its `max_peers` (the channel is full). The kernel releases a lock when its holder
//! dies, so whether an end is over never depends on timing or on anything a peer wrote: a
//! lock that can be taken belongs to nobody. The consumer's socket and its lock file are
//! removed by the consumer when it closes, else by whoever next takes its lock (a surviving
//! producer at its close, a new consumer); likewise a dead producer's lock file.
//!
//! After the handshake the socket stays open: it and a pidfd of the peer are how each side
//! learns that the other has gone (the process's watcher reports either the moment it comes,
//! see [`PeerWatch::arm`]), and the carrier may send records of its own over it (the
//! shared-memory transport passes arena descriptors this way).
//!
//! The files, each using only those before it: `runtime_dir` (where the directory is, its
//! checks, socket paths), `peer_watch` (learning that the peer has gone), `end_lock` (the
//! ends' lock files, what they say of an end, the cleanup after a peer), `channel_files`
//! (the channels in the directory as tools see them, and the removal of leftovers), `socket`
//! (listening, connecting, the peer's credentials), `hello` (the hello and answer records).

mod channel_files;
mod end_lock;
mod hello;
mod peer_watch;
mod runtime_dir;
mod socket;

pub use channel_files::{channels_in_runtime_dir, remove_leftovers, ChannelFiles};
pub use end_lock::{clean_after_peer, end_state, holder, lock_file_id, End, EndLock, EndState, FileId};
pub use hello::{decode_hello, recv_ack, refusal_in, send_ack, send_hello, ACK_OK, ACK_REFUSED, MAX_HELLO_LEN};
pub use peer_watch::PeerWatch;
pub use runtime_dir::{runtime_dir, runtime_dir_path, RUNTIME_DIR_ENV};
pub use socket::{connect, remaining, Listener};
