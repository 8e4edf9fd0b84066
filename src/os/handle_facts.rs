//! What the platform layer's `facts` tells of a handle received from a peer: the same shape on
//! every platform, filled in by each one's `facts`.

/// What kind of object a handle refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    Socket,
    Pipe,
    Directory,
    CharDevice,
    BlockDevice,
    RegularFile,
    /// Anything else (a memfd, a shared-memory object or a section, an anonymous kernel
    /// object, an event, a process).
    Other,
}

/// The facts of one handle.
#[derive(Clone, Debug)]
pub struct HandleFacts {
    /// An identity equal for every handle of one object (device and inode), to recognise an
    /// object imported before. `None` where the platform gives none that a process can compare
    /// (a Windows section: the importer recognises an arena by what its exporter says of it).
    pub identity: Option<(u64, u64)>,
    /// Its size: `st_size`, or where its end is for files (dma-bufs) that report their size
    /// only to `lseek`; a section's size on Windows (0 for anything else there).
    pub size: u64,
    pub kind: HandleKind,
    /// A name for messages: on Linux its name in `/proc/self/fd` (`/memfd:...`,
    /// `anon_inode:...`, a path); elsewhere what the handle is; empty where nothing is known.
    pub target: String,
}
