//! The raw MPI calls: joining (or starting) the application's MPI, the private communicator,
//! the collectives of discovery, and finalizing when lava-flow started MPI.
//!
//! Every MPI call is here, each in a small `unsafe` block. The private communicator has
//! `MPI_ERRORS_RETURN`, so a failure on it becomes an `Error`, never an abort; calls on the
//! application's communicator (only `MPI_Comm_dup`) keep the application's error handler.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use mpi_sys as ffi;
use parking_lot::Mutex;

use super::{rank_list, ThreadLevel};
use crate::error::{Error, Result};

/// What lava-flow did to the process's MPI, shared by every world in the process.
struct Lifecycle {
    /// Worlds alive now.
    live_worlds: usize,
    /// lava-flow called `MPI_Init_thread` (the application had not initialised MPI).
    initialised_by_lava_flow: bool,
}

static LIFECYCLE: Mutex<Lifecycle> = Mutex::new(Lifecycle { live_worlds: 0, initialised_by_lava_flow: false });

/// lava-flow's own duplicate of the application's communicator. Dropping it frees the
/// duplicate and, when lava-flow initialised MPI and this was its last communicator,
/// finalizes MPI.
pub(crate) struct PrivateComm {
    comm: ffi::MPI_Comm,
    /// This is a world's communicator: dropping it ends the world (see [`leave`]).
    is_world: bool,
}

// SAFETY: an MPI_Comm is a handle (a pointer into the MPI library, or an integer), not
// memory lava-flow owns; MPI decides which threads may call it (the thread level, which the
// world reports and the API documents), and lava-flow itself only frees it, once, in Drop.
unsafe impl Send for PrivateComm {}
// SAFETY: as above; shared references never call MPI.
unsafe impl Sync for PrivateComm {}

/// What joining found out, besides the communicator.
pub(crate) struct Joined {
    pub comm: PrivateComm,
    pub rank: u32,
    pub size: u32,
    pub thread_level: ThreadLevel,
    pub tag_upper_bound: i32,
    pub initialised_by_lava_flow: bool,
    /// The communicator duplicated is `MPI_COMM_WORLD` (named so, or by its Fortran handle).
    pub over_world: bool,
}

/// Which communicator to duplicate: `None` is `MPI_COMM_WORLD`, `Some` a Fortran handle from
/// `MPI_Comm_c2f`.
pub(crate) fn join(fortran_comm: Option<i64>) -> Result<Joined> {
    let mut lifecycle = LIFECYCLE.lock();
    if finalized()? {
        return Err(Error::InvalidState(
            "MPI has already been finalized in this process (by the application, or by lava-flow when its last \
             MPI handle was freed), and MPI cannot be initialised twice: keep one lava-flow MPI handle for the \
             life of the program, or initialise and finalize MPI in the application"
                .into(),
        ));
    }
    let started_here = !initialized()?;
    if started_here {
        let mut provided: c_int = 0;
        // SAFETY: NULL argc/argv are allowed since MPI-2; `provided` is a valid out-pointer.
        let rc = unsafe {
            ffi::MPI_Init_thread(ptr::null_mut(), ptr::null_mut(), ffi::RSMPI_THREAD_MULTIPLE, &mut provided)
        };
        check(
            rc,
            "MPI_Init_thread (lava-flow initialises MPI because the application has not)",
            "launch the program with mpirun/srun, or initialise MPI in the application before joining",
        )?;
        lifecycle.initialised_by_lava_flow = true;
    }
    match join_initialised(fortran_comm, lifecycle.initialised_by_lava_flow) {
        Ok(mut joined) => {
            THREADS_ALLOWED.store(joined.thread_level >= ThreadLevel::Serialized, Ordering::Relaxed);
            SERIALIZE.store(joined.thread_level < ThreadLevel::Multiple, Ordering::Relaxed);
            lifecycle.live_worlds += 1;
            joined.comm.is_world = true;
            Ok(joined)
        }
        Err(error) => {
            // A failed join leaves no world behind: MPI ends as after freeing the last one.
            finish(&mut lifecycle);
            Err(error)
        }
    }
}

/// Whether the Fortran handle `handle` names `MPI_COMM_WORLD`. Only while MPI is initialised
/// and not finalized (a world of lava-flow's is alive).
pub(crate) fn names_comm_world(handle: i64) -> bool {
    let Ok(handle) = ffi::RSMPI_Fint::try_from(handle) else {
        return false;
    };
    // SAFETY: MPI is initialised (the caller holds a live world); f2c takes any integer, and
    // COMM_WORLD is an extern static that rsmpi's C shim initialises.
    unsafe { ffi::RSMPI_Comm_f2c(handle) == ffi::RSMPI_COMM_WORLD }
}

fn join_initialised(fortran_comm: Option<i64>, initialised_by_lava_flow: bool) -> Result<Joined> {
    let thread_level = query_thread_level()?;
    let app_comm = match fortran_comm {
        // SAFETY: reading an extern static that rsmpi's C shim initialises to MPI_COMM_WORLD.
        None => unsafe { ffi::RSMPI_COMM_WORLD },
        Some(handle) => {
            let handle = ffi::RSMPI_Fint::try_from(handle).map_err(|_| {
                Error::invalid(format!(
                    "communicator {handle} is not an MPI_Fint (a C int); pass MPI_Comm_c2f(comm), or LF_MPI_COMM_WORLD"
                ))
            })?;
            // SAFETY: MPI is initialised; f2c takes any integer and returns a handle (a null or
            // MPI_COMM_NULL one for integers that name no communicator, checked below).
            unsafe { ffi::RSMPI_Comm_f2c(handle) }
        }
    };
    // SAFETY: reading extern statics initialised by rsmpi's C shim; an all-zero MPI_Comm (a
    // null pointer in Open MPI, the invalid handle 0 in MPICH) names no communicator.
    let (null_comm, zeroed) = unsafe { (ffi::RSMPI_COMM_NULL, std::mem::zeroed::<ffi::MPI_Comm>()) };
    if app_comm == null_comm || app_comm == zeroed {
        return Err(Error::invalid(format!(
            "communicator {} is MPI_COMM_NULL or names no live communicator; pass MPI_Comm_c2f(comm) of a live \
             communicator, or LF_MPI_COMM_WORLD",
            fortran_comm.unwrap_or_default()
        )));
    }

    // SAFETY: reading an extern static that rsmpi's C shim initialises to MPI_COMM_WORLD.
    let over_world = app_comm == unsafe { ffi::RSMPI_COMM_WORLD };
    let mut comm = PrivateComm { comm: null_comm, is_world: false };
    // SAFETY: `app_comm` is a live communicator (checked above as far as MPI lets one check);
    // the duplicate is written to valid storage. Errors follow the application's handler.
    let rc = unsafe { ffi::MPI_Comm_dup(app_comm, &mut comm.comm) };
    check(rc, "MPI_Comm_dup of the application's communicator", "pass a live communicator")?;
    // From here on `comm` frees the duplicate if anything fails.
    // SAFETY: the private communicator is live; ERRORS_RETURN is a predefined handler.
    let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm.comm, ffi::RSMPI_ERRORS_RETURN) };
    check(rc, "MPI_Comm_set_errhandler(MPI_ERRORS_RETURN) on lava-flow's communicator", "")?;

    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: live communicator, valid out-pointers.
    check(unsafe { ffi::MPI_Comm_rank(comm.comm, &mut rank) }, "MPI_Comm_rank", "")?;
    // SAFETY: as above.
    check(unsafe { ffi::MPI_Comm_size(comm.comm, &mut size) }, "MPI_Comm_size", "")?;

    let mut tag_ub: *mut c_int = ptr::null_mut();
    let mut found: c_int = 0;
    // SAFETY: for MPI_TAG_UB, MPI writes a pointer to an int it owns into `tag_ub` (passed
    // as the address of a pointer, as the standard specifies) and sets `found`.
    let rc = unsafe {
        ffi::MPI_Comm_get_attr(
            comm.comm,
            ffi::MPI_TAG_UB as c_int,
            (&mut tag_ub as *mut *mut c_int).cast::<c_void>(),
            &mut found,
        )
    };
    check(rc, "MPI_Comm_get_attr(MPI_TAG_UB)", "")?;
    let tag_upper_bound = if found != 0 && !tag_ub.is_null() {
        // SAFETY: MPI set `found` and pointed `tag_ub` at its attribute value, which lives as
        // long as MPI does.
        unsafe { *tag_ub }
    } else {
        // The standard guarantees at least this much.
        32767
    };

    Ok(Joined {
        rank: u32::try_from(rank).map_err(|_| Error::Corrupt(format!("MPI_Comm_rank gave {rank}")))?,
        size: u32::try_from(size).map_err(|_| Error::Corrupt(format!("MPI_Comm_size gave {size}")))?,
        comm,
        thread_level,
        tag_upper_bound,
        initialised_by_lava_flow,
        over_world,
    })
}

impl PrivateComm {
    /// The lowest rank among the processes that `MPI_COMM_TYPE_SHARED` puts with this one:
    /// the same number for all processes that MPI says can share memory.
    pub fn shared_memory_group(&self, my_rank: u32) -> Result<u32> {
        // SAFETY: reading extern statics initialised by rsmpi's C shim.
        let (shared, info_null, mut node) =
            unsafe { (ffi::RSMPI_COMM_TYPE_SHARED, ffi::RSMPI_INFO_NULL, ffi::RSMPI_COMM_NULL) };
        // SAFETY: live communicator; `node` is valid storage for the new one.
        let rc = unsafe { ffi::MPI_Comm_split_type(self.comm, shared, my_rank as c_int, info_null, &mut node) };
        check(rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", "")?;
        let node = PrivateComm { comm: node, is_world: false };
        let mine = my_rank as c_int;
        let mut lowest: c_int = 0;
        // SAFETY: one int in, one int out, on a live communicator; MIN is a predefined op.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                (&mine as *const c_int).cast(),
                (&mut lowest as *mut c_int).cast(),
                1,
                ffi::RSMPI_INT32_T,
                ffi::RSMPI_MIN,
                node.comm,
            )
        };
        check(rc, "MPI_Allreduce over the shared-memory communicator", "")?;
        u32::try_from(lowest).map_err(|_| Error::Corrupt(format!("MPI_Allreduce(MIN) of ranks gave {lowest}")))
    }

    /// Every process's bytes, in rank order: `MPI_Allgather` of the lengths, then
    /// `MPI_Allgatherv` of the bytes. A process that has nothing to send (`None`: it failed
    /// to describe itself) sends length 0 and every process returns an error naming it, so
    /// that all leave the collective together. No length above `max_len` is accepted.
    pub fn all_gather(&self, mine: Option<&[u8]>, size: u32, max_len: usize) -> Result<Vec<Vec<u8>>> {
        let size = size as usize;
        let my_len = mine.map_or(0, |m| m.len());
        assert!(my_len <= max_len && max_len <= i32::MAX as usize, "callers bound their records");
        let my_len = my_len as c_int;
        let mut lengths: Vec<c_int> = vec![0; size];
        // SAFETY: one int sent; `lengths` has room for one int from each of the `size` ranks.
        let rc = unsafe {
            ffi::MPI_Allgather(
                (&my_len as *const c_int).cast(),
                1,
                ffi::RSMPI_INT32_T,
                lengths.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_INT32_T,
                self.comm,
            )
        };
        check(rc, "MPI_Allgather of the discovery record lengths", "")?;

        let failed: Vec<usize> = (0..size).filter(|&r| lengths[r] == 0).collect();
        if !failed.is_empty() {
            return Err(Error::InvalidState(format!(
                "discovery failed because MPI rank(s) {} could not describe themselves; their own error says why",
                rank_list(&failed)
            )));
        }
        if let Some(bad) = (0..size).find(|&r| lengths[r] < 0 || lengths[r] as usize > max_len) {
            return Err(Error::Corrupt(format!(
                "MPI rank {bad} announced a discovery record of {} bytes; the limit is {max_len}: is every process \
                 running the same lava-flow version?",
                lengths[bad]
            )));
        }
        // Bounded: at most `size` × `max_len` bytes, with offsets that fit in an int.
        let mut displacements = Vec::with_capacity(size);
        let mut total: usize = 0;
        for &len in &lengths {
            displacements.push(
                c_int::try_from(total).map_err(|_| {
                    Error::Unsupported(format!("the discovery records of {size} processes exceed 2 GiB"))
                })?,
            );
            total += len as usize;
        }
        let mut all = vec![0u8; total];
        let mine = mine.expect("a process with nothing to send returned above");
        // SAFETY: `mine` holds `my_len` bytes; `all` holds the sum of `lengths`, and each
        // rank's bytes land at its displacement, inside `all`.
        let rc = unsafe {
            ffi::MPI_Allgatherv(
                mine.as_ptr().cast(),
                my_len,
                ffi::RSMPI_UINT8_T,
                all.as_mut_ptr().cast(),
                lengths.as_ptr(),
                displacements.as_ptr(),
                ffi::RSMPI_UINT8_T,
                self.comm,
            )
        };
        check(rc, "MPI_Allgatherv of the discovery records", "")?;
        Ok((0..size)
            .map(|r| {
                let start = displacements[r] as usize;
                all[start..start + lengths[r] as usize].to_vec()
            })
            .collect())
    }

    /// The MPI handle, for lava-flow's MPI transport.
    #[allow(dead_code)]
    pub(crate) fn raw(&self) -> ffi::MPI_Comm {
        self.comm
    }
}

impl Drop for PrivateComm {
    fn drop(&mut self) {
        // SAFETY: reading an extern static initialised by rsmpi's C shim.
        let null_comm = unsafe { ffi::RSMPI_COMM_NULL };
        // After MPI_Finalize no MPI call is allowed; MPI has released the communicator then.
        if self.comm != null_comm && !finalized().unwrap_or(true) {
            // SAFETY: the communicator is one lava-flow created and has not freed; freeing sets
            // the handle to MPI_COMM_NULL. A failure leaves nothing to do.
            unsafe { ffi::MPI_Comm_free(&mut self.comm) };
        }
        if self.is_world {
            leave();
        }
    }
}

/// A world's end, after its communicator is freed.
fn leave() {
    let mut lifecycle = LIFECYCLE.lock();
    lifecycle.live_worlds = lifecycle.live_worlds.saturating_sub(1);
    if lifecycle.live_worlds == 0 {
        // No MPI call after this: the application may finalize MPI now.
        Progress::stop();
    }
    finish(&mut lifecycle);
}

/// Finalizes MPI when lava-flow started it and no world is left.
fn finish(lifecycle: &mut Lifecycle) {
    if lifecycle.live_worlds == 0 && lifecycle.initialised_by_lava_flow && !finalized().unwrap_or(true) {
        // SAFETY: MPI is initialised (by lava-flow) and not finalized; lava-flow holds no
        // communicator any more. Collective: every process does this when it frees its last
        // handle.
        unsafe { ffi::MPI_Finalize() };
    }
}

fn initialized() -> Result<bool> {
    let mut flag: c_int = 0;
    // SAFETY: may be called at any time, before MPI_Init and after MPI_Finalize.
    check(unsafe { ffi::MPI_Initialized(&mut flag) }, "MPI_Initialized", "")?;
    Ok(flag != 0)
}

pub(crate) fn finalized() -> Result<bool> {
    let mut flag: c_int = 0;
    // SAFETY: may be called at any time, before MPI_Init and after MPI_Finalize.
    check(unsafe { ffi::MPI_Finalized(&mut flag) }, "MPI_Finalized", "")?;
    Ok(flag != 0)
}

fn query_thread_level() -> Result<ThreadLevel> {
    let mut provided: c_int = 0;
    // SAFETY: MPI is initialised; valid out-pointer.
    check(unsafe { ffi::MPI_Query_thread(&mut provided) }, "MPI_Query_thread", "")?;
    // SAFETY: reading extern statics initialised by rsmpi's C shim.
    let levels = unsafe {
        [
            (ffi::RSMPI_THREAD_SINGLE, ThreadLevel::Single),
            (ffi::RSMPI_THREAD_FUNNELED, ThreadLevel::Funneled),
            (ffi::RSMPI_THREAD_SERIALIZED, ThreadLevel::Serialized),
            (ffi::RSMPI_THREAD_MULTIPLE, ThreadLevel::Multiple),
        ]
    };
    levels
        .iter()
        .find(|(value, _)| *value == provided)
        .map(|&(_, level)| level)
        .ok_or_else(|| Error::Corrupt(format!("MPI_Query_thread gave {provided}, which is no MPI thread level")))
}

/// Turns an MPI return code into an error saying which call failed, MPI's own words, and
/// what to do.
fn check(rc: c_int, call: &str, hint: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING bytes and more, as the call requires;
    // MPI_Error_string may be called for any code.
    let described =
        unsafe { ffi::MPI_Error_string(rc, text.as_mut_ptr().cast(), &mut len) } == ffi::MPI_SUCCESS as c_int;
    let what = if described {
        String::from_utf8_lossy(&text[..(len.max(0) as usize).min(text.len())]).into_owned()
    } else {
        format!("MPI error code {rc}")
    };
    let hint = if hint.is_empty() { String::new() } else { format!("; {hint}") };
    Err(Error::Io { context: format!("{call} failed"), source: std::io::Error::other(format!("{what}{hint}")) })
}

/// Serialises lava-flow's MPI calls where MPI's thread level is SERIALIZED: with it,
/// channels in several threads (and the progress thread) need no more than that. Under
/// MULTIPLE, MPI serialises what it must itself.
static CALLS: Mutex<()> = Mutex::new(());
static SERIALIZE: AtomicBool = AtomicBool::new(true);

/// Counts lava-flow's MPI calls (approximately: only whether it moved matters), so that the
/// progress thread stays out of the way while they come.
static CALL_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Takes the call lock (where one is needed) for one of lava-flow's MPI calls.
fn calls() -> Option<parking_lot::MutexGuard<'static, ()>> {
    // A plain increment, no read-modify-write: two threads that race still move it.
    CALL_COUNT.store(CALL_COUNT.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    SERIALIZE.load(Ordering::Relaxed).then(|| CALLS.lock())
}

/// Whether MPI's thread level lets lava-flow call MPI from a thread of its own.
static THREADS_ALLOWED: AtomicBool = AtomicBool::new(false);
/// Transfers lava-flow has started and not seen complete: sends, and receives of data that
/// is on its way (not the receives posted ahead for messages that may come), of more than
/// [`SMALL`] bytes.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Sends up to this long go eagerly (MPI copies them out at once, or the receiver takes them
/// without the sender's help): they need no progress thread.
const SMALL: usize = 4096;
/// The progress thread runs (or could not be started): no need to look again.
static PROGRESS_STARTED: AtomicBool = AtomicBool::new(false);

/// MPI moves a message only while the processes at both ends call into it. A channel's end
/// that waits for something else (another channel's shared memory, the application's own
/// work) would stall its peer's large transfers, which need several steps of both; so a
/// thread of lava-flow's enters MPI's progress engine (a probe on MPI_COMM_SELF) when
/// lava-flow's own calls have been quiet since its last look. It looks every 20 µs while a
/// transfer of more than a few KiB is pending, every 2 ms otherwise (small sends need no help;
/// receives posted ahead wait for messages that may never come), so that it seldom takes the
/// core from a thread that busy-polls small messages. It also does the channels' duties
/// ([`Duty`]) about every [`DUTY_PERIOD`], quiet or not. It exists where MPI's thread level is
/// SERIALIZED or MULTIPLE, and stops when the last world is freed.
struct Progress {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

static PROGRESS: Mutex<Option<Progress>> = Mutex::new(None);

impl Progress {
    /// Starts the thread if MPI's thread level allows it and it has not started yet.
    fn ensure() {
        if PROGRESS_STARTED.load(Ordering::Relaxed) || !THREADS_ALLOWED.load(Ordering::Relaxed) {
            return;
        }
        let mut progress = PROGRESS.lock();
        if progress.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let spawned = std::thread::Builder::new().name("lava-flow-mpi-progress".into()).spawn(move || {
            let mut seen = usize::MAX;
            let mut duties_done = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                if HAS_DUTIES.load(Ordering::Relaxed) && duties_done.elapsed() >= DUTY_PERIOD {
                    duties_done = Instant::now();
                    run_duties();
                    // Their MPI calls are the thread's own: only the channels' should count.
                    seen = CALL_COUNT.load(Ordering::Relaxed);
                }
                let transfers = PENDING.load(Ordering::Relaxed) != 0;
                let now = CALL_COUNT.load(Ordering::Relaxed);
                let quiet = now == seen;
                seen = now;
                if quiet {
                    let _calls = calls();
                    let mut found: c_int = 0;
                    // SAFETY: MPI is initialised and not finalized (the thread stops before the
                    // last world goes); COMM_SELF is predefined; the status is ignored.
                    unsafe {
                        ffi::MPI_Iprobe(
                            ffi::RSMPI_ANY_SOURCE,
                            ffi::RSMPI_ANY_TAG,
                            ffi::RSMPI_COMM_SELF,
                            &mut found,
                            ffi::RSMPI_STATUS_IGNORE,
                        );
                    }
                    // The probe is a call too: only the channels' calls should move the count.
                    seen = CALL_COUNT.load(Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_micros(if transfers { 20 } else { 2000 }));
            }
        });
        // Without the thread, progress still happens inside the channels' calls.
        match spawned {
            Ok(thread) => *progress = Some(Progress { stop, thread }),
            Err(e) => log::warn!(
                "lava-flow's MPI progress thread could not start ({e}): large transfers over MPI move only while \
                 this process calls lava-flow; check the limit on threads"
            ),
        }
        PROGRESS_STARTED.store(true, Ordering::Relaxed);
    }

    fn stop() {
        if let Some(p) = PROGRESS.lock().take() {
            p.stop.store(true, Ordering::Relaxed);
            let _ = p.thread.join();
        }
        PROGRESS_STARTED.store(false, Ordering::Relaxed);
    }
}

/// Work a channel leaves to lava-flow's progress thread: what its peer waits for and must get
/// even while the application makes no lava-flow call (an MPI consumer's credits for the
/// messages it released).
pub(crate) trait Duty: Send + Sync {
    /// Called from the progress thread about every [`DUTY_PERIOD`]. It must not block: a duty
    /// whose state is locked skips the turn.
    fn tick(&self);
}

/// How often the progress thread does the channels' duties.
const DUTY_PERIOD: Duration = Duration::from_millis(1);

/// The duties of live channels, with their registrations' ids.
static DUTIES: Mutex<Vec<(u64, Weak<dyn Duty>)>> = Mutex::new(Vec::new());
/// `DUTIES` is not empty: the progress thread looks at the list only then.
static HAS_DUTIES: AtomicBool = AtomicBool::new(false);
static NEXT_DUTY: AtomicU64 = AtomicU64::new(1);

/// A duty's registration. Dropping it removes the duty; once that has returned, the progress
/// thread neither runs it nor holds a reference to it (so the thread never drops a channel's
/// last reference, which could end the world and with it the thread itself).
pub(crate) struct DutyRegistration(u64);

/// Has the progress thread do `duty` until the registration is dropped (nothing where MPI's
/// thread level allows no thread of lava-flow's).
pub(crate) fn register_duty(duty: Weak<dyn Duty>) -> DutyRegistration {
    let id = NEXT_DUTY.fetch_add(1, Ordering::Relaxed);
    let mut duties = DUTIES.lock();
    duties.push((id, duty));
    HAS_DUTIES.store(true, Ordering::Relaxed);
    drop(duties);
    Progress::ensure();
    DutyRegistration(id)
}

impl Drop for DutyRegistration {
    fn drop(&mut self) {
        // Waits for a turn of the duties in progress: the list is locked while they run.
        let mut duties = DUTIES.lock();
        duties.retain(|(id, _)| *id != self.0);
        HAS_DUTIES.store(!duties.is_empty(), Ordering::Relaxed);
    }
}

/// One turn of the duties, with the list locked: a duty's registration cannot be dropped
/// meanwhile, so every reference taken here is dropped while the channel holds one too.
fn run_duties() {
    let duties = DUTIES.lock();
    for (_, duty) in duties.iter() {
        if let Some(duty) = duty.upgrade() {
            duty.tick();
        }
    }
}

/// A nonblocking operation in flight. Its buffer must stay valid and untouched until
/// [`PrivateComm::test`] says it is complete; dropping an incomplete request is a bug
/// (callers complete, cancel, or deliberately leak).
pub(crate) struct Request {
    raw: ffi::MPI_Request,
    /// Counted in `PENDING` (a transfer under way, not a receive posted ahead).
    transfer: bool,
}

// SAFETY: an MPI_Request is a handle; lava-flow calls MPI on it from one thread at a time
// (the request's owner), under the call lock where MPI's thread level asks for it.
unsafe impl Send for Request {}

impl Request {
    fn new(raw: ffi::MPI_Request, transfer: bool) -> Request {
        if transfer {
            PENDING.fetch_add(1, Ordering::Relaxed);
        }
        Progress::ensure();
        Request { raw, transfer }
    }

    /// The request is complete (or freed): it no longer counts.
    fn finished(&mut self) {
        if std::mem::take(&mut self.transfer) {
            PENDING.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl PrivateComm {
    /// Starts sending `len` bytes at `buf` to `dest` with `tag`.
    ///
    /// # Safety
    /// `buf` stays valid for `len` bytes, unwritten, until the request is complete.
    pub(crate) unsafe fn isend(&self, buf: *const u8, len: usize, dest: u32, tag: i32) -> Result<Request> {
        let count =
            c_int::try_from(len).map_err(|_| Error::invalid(format!("an MPI message of {len} bytes exceeds 2 GiB")))?;
        let _calls = calls();
        // SAFETY: reading an extern static; the caller keeps the buffer valid as required.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = unsafe {
            ffi::MPI_Isend(buf.cast(), count, ffi::RSMPI_UINT8_T, dest as c_int, tag, self.comm, &mut request)
        };
        check(rc, "MPI_Isend", "")?;
        Ok(Request::new(request, len > SMALL))
    }

    /// Starts receiving up to `len` bytes from `source` with `tag` into `buf`: data that is
    /// on its way.
    ///
    /// # Safety
    /// `buf` stays valid for `len` bytes, and is not read or written, until the request is
    /// complete (or cancelled and completed).
    pub(crate) unsafe fn irecv(&self, buf: *mut u8, len: usize, source: u32, tag: i32) -> Result<Request> {
        // SAFETY: the caller's contract.
        unsafe { self.irecv_as(buf, len, source, tag, len > SMALL) }
    }

    /// [`irecv`](Self::irecv) of a message that may come (a receive posted ahead): the
    /// progress thread looks after it less often.
    ///
    /// # Safety
    /// As for `irecv`.
    pub(crate) unsafe fn irecv_ahead(&self, buf: *mut u8, len: usize, source: u32, tag: i32) -> Result<Request> {
        // SAFETY: the caller's contract.
        unsafe { self.irecv_as(buf, len, source, tag, false) }
    }

    /// # Safety
    /// As for `irecv`.
    unsafe fn irecv_as(&self, buf: *mut u8, len: usize, source: u32, tag: i32, transfer: bool) -> Result<Request> {
        let count =
            c_int::try_from(len).map_err(|_| Error::invalid(format!("an MPI message of {len} bytes exceeds 2 GiB")))?;
        let _calls = calls();
        // SAFETY: as for isend.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        let rc = unsafe {
            ffi::MPI_Irecv(buf.cast(), count, ffi::RSMPI_UINT8_T, source as c_int, tag, self.comm, &mut request)
        };
        check(rc, "MPI_Irecv", "")?;
        Ok(Request::new(request, transfer))
    }

    /// Whether `request` is complete (then its buffer is free again).
    pub(crate) fn test(&self, request: &mut Request) -> Result<bool> {
        let _calls = calls();
        let mut done: c_int = 0;
        // SAFETY: a live request (or REQUEST_NULL once complete, for which MPI_Test is true);
        // the status is ignored.
        let rc = unsafe { ffi::MPI_Test(&mut request.raw, &mut done, ffi::RSMPI_STATUS_IGNORE) };
        check(rc, "MPI_Test", "")?;
        if done != 0 {
            request.finished();
        }
        Ok(done != 0)
    }

    /// For a receive: `Some(bytes received)` once it is complete.
    pub(crate) fn test_received(&self, request: &mut Request) -> Result<Option<usize>> {
        let _calls = calls();
        let mut done: c_int = 0;
        // SAFETY: MPI_Status is plain data that MPI fills in; a live request.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::MPI_Test(&mut request.raw, &mut done, &mut status) };
        check(rc, "MPI_Test", "")?;
        if done == 0 {
            return Ok(None);
        }
        request.finished();
        let mut count: c_int = 0;
        // SAFETY: the status of a completed receive.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        check(rc, "MPI_Get_count", "")?;
        usize::try_from(count).map(Some).map_err(|_| Error::Corrupt(format!("MPI_Get_count gave {count}")))
    }

    /// Waits inside MPI until a receive is complete: `bytes received`. For a wait that
    /// would otherwise poll `test_received` without end; it holds no lock of lava-flow's,
    /// so only where MPI's thread level is MULTIPLE.
    pub(crate) fn wait_received(&self, request: &mut Request) -> Result<usize> {
        debug_assert!(!SERIALIZE.load(Ordering::Relaxed), "only under MPI_THREAD_MULTIPLE");
        CALL_COUNT.store(CALL_COUNT.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        // SAFETY: MPI_Status is plain data that MPI fills in; a live request.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::MPI_Wait(&mut request.raw, &mut status) };
        check(rc, "MPI_Wait", "")?;
        request.finished();
        let mut count: c_int = 0;
        // SAFETY: the status of a completed receive.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        check(rc, "MPI_Get_count", "")?;
        usize::try_from(count).map_err(|_| Error::Corrupt(format!("MPI_Get_count gave {count}")))
    }

    /// Cancels a receive that may have matched a message already: `Some(bytes received)` when
    /// it had (the message is in its buffer), `None` when it was cancelled. Either way the
    /// buffer is free again.
    pub(crate) fn cancel_or_receive(&self, mut request: Request) -> Result<Option<usize>> {
        let _calls = calls();
        // SAFETY: a live receive request; MPI_Wait after MPI_Cancel completes it either way,
        // and the status says which happened.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::MPI_Cancel(&mut request.raw) };
        check(rc, "MPI_Cancel", "")?;
        let rc = unsafe { ffi::MPI_Wait(&mut request.raw, &mut status) };
        request.finished();
        check(rc, "MPI_Wait of a cancelled receive", "")?;
        let mut cancelled: c_int = 0;
        // SAFETY: the status of a completed request.
        check(unsafe { ffi::MPI_Test_cancelled(&status, &mut cancelled) }, "MPI_Test_cancelled", "")?;
        if cancelled != 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: the status of a completed receive.
        check(unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) }, "MPI_Get_count", "")?;
        usize::try_from(count).map(Some).map_err(|_| Error::Corrupt(format!("MPI_Get_count gave {count}")))
    }

    /// Cancels a receive and completes it; its buffer is free again when this returns Ok.
    pub(crate) fn cancel_recv(&self, mut request: Request) -> Result<()> {
        let _calls = calls();
        // SAFETY: a live receive request; MPI_Wait after MPI_Cancel completes it either way.
        let rc = unsafe { ffi::MPI_Cancel(&mut request.raw) };
        check(rc, "MPI_Cancel", "")?;
        let rc = unsafe { ffi::MPI_Wait(&mut request.raw, ffi::RSMPI_STATUS_IGNORE) };
        request.finished();
        check(rc, "MPI_Wait of a cancelled receive", "")
    }

    /// Lets MPI finish a send on its own; its buffer must then stay valid forever (callers
    /// leak it): for sends to a peer that will never receive them.
    pub(crate) fn abandon(&self, mut request: Request) {
        let _calls = calls();
        // SAFETY: a live request; MPI frees it when it completes, if ever.
        unsafe { ffi::MPI_Request_free(&mut request.raw) };
        request.finished();
    }

    /// The length of the next message from `source` with `tag`, if one has arrived.
    pub(crate) fn iprobe(&self, source: u32, tag: i32) -> Result<Option<usize>> {
        let _calls = calls();
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is plain data that MPI fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::MPI_Iprobe(source as c_int, tag, self.comm, &mut flag, &mut status) };
        check(rc, "MPI_Iprobe", "")?;
        if flag == 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: the status of a matched probe.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        check(rc, "MPI_Get_count", "")?;
        usize::try_from(count).map(Some).map_err(|_| Error::Corrupt(format!("MPI_Get_count gave {count}")))
    }

    /// The source and length of the next message with `tag` from any process, if one has
    /// arrived.
    pub(crate) fn iprobe_any(&self, tag: i32) -> Result<Option<(u32, usize)>> {
        let _calls = calls();
        let mut flag: c_int = 0;
        // SAFETY: MPI_Status is plain data that MPI fills in.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let rc = unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, tag, self.comm, &mut flag, &mut status) };
        check(rc, "MPI_Iprobe", "")?;
        if flag == 0 {
            return Ok(None);
        }
        let mut count: c_int = 0;
        // SAFETY: the status of a matched probe.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        check(rc, "MPI_Get_count", "")?;
        let source = u32::try_from(status.MPI_SOURCE)
            .map_err(|_| Error::Corrupt(format!("MPI_Iprobe gave source {}", status.MPI_SOURCE)))?;
        let len = usize::try_from(count).map_err(|_| Error::Corrupt(format!("MPI_Get_count gave {count}")))?;
        Ok(Some((source, len)))
    }

    /// Receives the message a probe found (`len` bytes, as it said) into `buf`.
    ///
    /// # Safety
    /// `buf` is valid for `len` writable bytes.
    pub(crate) unsafe fn recv_probed(&self, buf: *mut u8, len: usize, source: u32, tag: i32) -> Result<()> {
        let count =
            c_int::try_from(len).map_err(|_| Error::invalid(format!("an MPI message of {len} bytes exceeds 2 GiB")))?;
        let _calls = calls();
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.cast(),
                count,
                ffi::RSMPI_UINT8_T,
                source as c_int,
                tag,
                self.comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        check(rc, "MPI_Recv", "")
    }
}
