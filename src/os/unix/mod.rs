//! What Linux and macOS share: descriptor passing over Unix stream sockets, `mmap` mappings,
//! `poll`, socket-pair notifications, `flock` lock files, the user id, and the watcher's
//! thread (over the platform's readiness set).

pub mod facts;
pub mod lock;
pub mod mapping;
pub mod notify;
pub mod poll;
pub mod ready;
pub mod stream;
pub mod user;
pub mod watcher;
