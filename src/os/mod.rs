//! The platform layer: one interface to the operating system's facilities every layer uses,
//! one implementation per OS. The rest of the crate names only the items re-exported here,
//! never an implementation, and does no `cfg(target_os)` of its own on these concepts. Nothing
//! here knows about lava-flow's own concepts.
//!
//! Layout: `unix/` holds what Linux and macOS share (descriptor passing over Unix stream
//! sockets, `mmap` mappings, `poll`, socket-pair notifications, `flock` lock files, the
//! watcher's thread); `linux/` and `macos/` what differs; the selector below picks one.
//! Platform-neutral helpers ([`parallel_copy`], [`prefetch_for_write`]) live at this level.
//!
//! The concepts, and what each platform gives for them:
//!
//! - **handle** ([`OwnedHandle`], [`BorrowedHandle`], [`AsHandle`], [`RawHandle`], and
//!   [`borrow`] for the traits' differently named methods): the OS's reference to a kernel
//!   object; a file descriptor on Linux and macOS, a `HANDLE` on Windows.
//! - **facts** ([`facts`]): what a handle received from a peer is (kind, size, identity), and
//!   locking memory, the locked-memory limit, whether a range is mapped (`fstat`, `mlock`,
//!   `mincore` on Unix; `VirtualLock`, `VirtualQuery` on Windows).
//! - **shared memory** ([`shm`]): `create`, `size_of`, `fix_size`, `size_is_fixed` (no one
//!   can shrink it: reading below its size never faults), `read_only`, and for checking what
//!   a peer passed `is_shm`, `has_name_prefix`, `page_size_of`. Linux: a memfd; its size is
//!   fixed by seals (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`); `read_only` seals it with
//!   `F_SEAL_FUTURE_WRITE` (Linux 5.1), after which only mappings made before can write. macOS: `shm_open` of a unique name, unlinked at once;
//!   a shared-memory object's size cannot change after its first `ftruncate`, so `fix_size`
//!   has nothing to do; `read_only` is `Unsupported` (a read-only handle of an unlinked object
//!   cannot be opened), and no huge pages; a peer's object is recognised by
//!   `proc_pidfdinfo(PROC_PIDFDPSHMINFO)` and has no name left to check.
//! - **mapping** ([`Mapping`], [`page_size`], [`map_granularity`]): `mmap` on both; the
//!   populate advice (`MADV_POPULATE_WRITE`/`_READ`) is Linux's, macOS reports it not done.
//! - **wait on a word** ([`wait`]): sleep while a 32-bit word in shared memory holds a value,
//!   woken by another process. Linux: a futex. macOS: `os_sync_wait_on_address` with
//!   `OS_SYNC_WAIT_ON_ADDRESS_SHARED` (macOS 14.4, looked up at run time); before that a
//!   bounded spin, then sleeps of growing length up to 1 ms that re-check the word (a wake is
//!   then a no-op, and a waiter notices a change up to 1 ms late).
//! - **event** ([`event`]): one handle that a thread of this process signals and an event loop
//!   waits on (readable). Linux: an eventfd. macOS: a kqueue with an `EVFILT_USER` event.
//! - **notification** ([`notify`]): a socket pair between processes; the waited end is
//!   pollable, the notifier's close is seen by `drain_peer`. The same on both.
//! - **readiness set** ([`poller`]): a set of handles that is itself a handle, readable while
//!   one of them is ready. Linux: epoll. macOS: kqueue.
//! - **stream** ([`stream`]): a connected Unix stream socket carrying bytes and handles
//!   (`SCM_RIGHTS`); [`stream::peer`] tells the peer's pid and whether it runs as this user
//!   (Linux `SO_PEERCRED`; macOS `LOCAL_PEERPID` and `getpeereid`); a [`stream::Listener`]
//!   bound at a path (mode 0600) and [`stream::connect`] to it.
//! - **process** ([`process`]): a handle of a peer process that becomes readable when it
//!   exits. Linux: a pidfd (5.3). macOS: a kqueue with `EVFILT_PROC`/`NOTE_EXIT`.
//! - **watcher** ([`watcher`]): one thread that calls back once when a watched handle reports
//!   (built on the readiness set).
//! - **lock file** ([`lock`]): `LockFile::try_take(path)`, an exclusive `flock` that the OS
//!   releases when its holder dies; a file its last holder replaced is taken again.
//! - **user** ([`user`]): the user id for same-user checks, and the default runtime directory
//!   (`$XDG_RUNTIME_DIR/lava-flow`, else `/tmp/lava-flow-$UID`).
//! - **memory barrier across processes** ([`membarrier`]): Linux `membarrier(2)`; macOS has
//!   none, so senders fence every message there.
//! - **system** ([`system`]): memory totals, the current NUMA node, random bytes, NUMA
//!   binding, transparent huge pages, and whether GPU memory can be shared between processes.
//!   NUMA, huge pages and GPU memory sharing are Linux-only; macOS reports them unsupported
//!   and uses `sysctl hw.memsize` and `getentropy`.
//!
//! Windows (`windows/`, its module doc says how each concept is built there): sections and
//! views (offsets and pair parts multiples of 64 KiB, [`map_granularity`]), named-pipe streams
//! passing handles by `DuplicateHandle`, manual-reset events for events and notifications,
//! process handles, `LockFileEx`, `%LOCALAPPDATA%\lava-flow` and the user's SID, a spinning and
//! sleeping wait (no cross-process wait on an address exists), [`facts`] from the section
//! query. It has no readiness set that is itself a handle (its `poller::Poller::new` answers
//! `Unsupported`; `poll` is not built there) and no barrier that reaches other processes
//! (`FlushProcessWriteBuffers` orders this process only). NUMA binding and huge pages are
//! `Unsupported` there. Memory and channels are built on Windows (without the `vulkan`
//! feature so far).
//!
//! - **waits over a few handles** ([`ready`]): `wait_readable` over a list with a timeout
//!   (Unix `poll`; Windows `WaitForMultipleObjects`), and `wait_listener` for a listener or a
//!   stop event (Windows looks for a client every 10 ms: a named pipe's listener is no handle
//!   a wait can take without accepting).

mod handle_facts;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "macos")]
mod macos;
pub(crate) mod parallel_copy;
#[cfg(unix)]
mod unix;
#[cfg(windows)]
mod windows;

// The selector: the one place that names an implementation.
#[cfg(target_os = "linux")]
use linux as platform;
#[cfg(target_os = "macos")]
use macos as platform;
#[cfg(windows)]
use windows as platform;

#[cfg(any(target_os = "linux", target_os = "macos"))]
pub use platform::{event, membarrier, poller, process, shm, system, wait};
// The names the Windows side shares; Unix callers still spell them as `std::os::fd` does.
#[cfg(windows)]
#[allow(unused_imports)]
pub use platform::{
    event, facts, lock,
    mapping::{map_granularity, page_size, Mapping},
    membarrier, notify, poller, process, ready, shm, stream, system, user, wait, watcher,
};
#[cfg(unix)]
#[allow(unused_imports)]
pub use std::os::fd::{AsFd as AsHandle, BorrowedFd as BorrowedHandle, OwnedFd as OwnedHandle, RawFd as RawHandle};
#[cfg(windows)]
#[allow(unused_imports)]
pub use std::os::windows::io::{AsHandle, BorrowedHandle, OwnedHandle, RawHandle};
// Tests elsewhere in the crate run roles in child processes as the Windows layer's do.
#[cfg(all(windows, test))]
pub(crate) use platform::test_child;
#[cfg(any(target_os = "linux", target_os = "macos"))]
#[allow(unused_imports)]
pub use unix::mapping::{map_granularity, page_size, Mapping};
#[cfg(any(target_os = "linux", target_os = "macos"))]
pub use unix::{facts, lock, notify, ready, stream, user, watcher};

/// Borrows any handle (`as_fd` on Unix, `as_handle` on Windows: the traits' methods are named
/// apart, the callers name this one).
#[cfg(unix)]
#[inline]
pub fn borrow<H: AsHandle + ?Sized>(handle: &H) -> BorrowedHandle<'_> {
    handle.as_fd()
}

/// Borrows any handle (`as_fd` on Unix, `as_handle` on Windows: the traits' methods are named
/// apart, the callers name this one).
#[cfg(windows)]
#[inline]
pub fn borrow<H: AsHandle + ?Sized>(handle: &H) -> BorrowedHandle<'_> {
    handle.as_handle()
}

/// A handle's raw value, for messages (a descriptor's number; a `HANDLE`'s address).
#[cfg(unix)]
pub fn raw<H: AsHandle + ?Sized>(handle: &H) -> RawHandle {
    std::os::fd::AsRawFd::as_raw_fd(&handle.as_fd())
}

/// A handle's raw value, for messages (a descriptor's number; a `HANDLE`'s address).
#[cfg(windows)]
pub fn raw<H: AsHandle + ?Sized>(handle: &H) -> RawHandle {
    std::os::windows::io::AsRawHandle::as_raw_handle(&handle.as_handle())
}

/// A handle as a C driver API takes it by value where it shares memory (CUDA's shareable
/// handles): a descriptor's number widened to a pointer; a `HANDLE` as it is.
#[cfg(unix)]
pub fn driver_value<H: AsHandle + ?Sized>(handle: &H) -> *mut std::ffi::c_void {
    raw(handle) as isize as *mut std::ffi::c_void
}

/// A handle as a C driver API takes it by value where it shares memory (CUDA's shareable
/// handles): a descriptor's number widened to a pointer; a `HANDLE` as it is.
#[cfg(windows)]
pub fn driver_value<H: AsHandle + ?Sized>(handle: &H) -> *mut std::ffi::c_void {
    raw(handle)
}

/// Owns the handle a driver API made and returned as a C `int` (a descriptor on Unix).
///
/// # Safety
/// `value` is a handle the driver made for this caller, owned by nothing else.
#[cfg(unix)]
pub unsafe fn own_driver_value(value: std::ffi::c_int) -> OwnedHandle {
    // SAFETY: the caller's promise.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(value) }
}

/// Owns the handle a driver API made and returned as a C `int` (a descriptor on Unix).
///
/// # Safety
/// `value` is a handle the driver made for this caller, owned by nothing else.
#[cfg(windows)]
pub unsafe fn own_driver_value(value: std::ffi::c_int) -> OwnedHandle {
    // SAFETY: the caller's promise.
    unsafe { std::os::windows::io::FromRawHandle::from_raw_handle(value as isize as RawHandle) }
}

/// Gives `handle` to a driver that has taken it over (it closes it): nothing here closes it.
pub fn give_to_driver(handle: OwnedHandle) {
    #[cfg(unix)]
    let _ = std::os::fd::IntoRawFd::into_raw_fd(handle);
    #[cfg(windows)]
    let _ = std::os::windows::io::IntoRawHandle::into_raw_handle(handle);
}

/// How [`shm::create`] makes a shared-memory object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmOptions {
    /// Back the object with huge pages of this size (bytes, a power of two), or `None` for
    /// ordinary pages.
    pub huge_page_size: Option<usize>,
    /// Allow [`shm::fix_size`] and [`shm::read_only`] later.
    pub sealable: bool,
}

/// A timeout as the kernel takes it; one beyond `i64::MAX` seconds waits as long.
#[cfg(unix)]
pub(crate) fn timespec(timeout: std::time::Duration) -> rustix::event::Timespec {
    rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec { tv_sec: i64::MAX, tv_nsec: 0 })
}

/// Asks the CPU for the cache line at `ptr` in a state it can write (`prefetchw`), without
/// waiting for it: a hint. x86-64 processors that predate the instruction run it as a no-op.
#[inline(always)]
pub(crate) fn prefetch_for_write(ptr: *const u8) {
    // (`_mm_prefetch` with `_MM_HINT_ET0` compiles to a read prefetch for baseline x86-64.)
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads and writes nothing, never faults whatever the address, and
    // touches no register but the one it is given.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
