//! The raw MPI half (the OSU pattern through `mpi_sys`), and the communicator both halves use
//! to agree and meet.

use std::ffi::{c_int, c_void};
use std::time::Instant;

use mpi_sys as ffi;

use super::check;
use crate::pingpong::{percentiles, read_all, Percentiles};

pub(super) const TAG_LATENCY: c_int = 1;
pub(super) const TAG_BANDWIDTH: c_int = 2;
pub(super) const TAG_ACK: c_int = 3;

/// A duplicate of `MPI_COMM_WORLD` with `MPI_ERRORS_RETURN`, so that every failure comes back
/// as a return code (checked) instead of the world's default abort.
pub(super) struct Comm {
    comm: ffi::MPI_Comm,
    peer: c_int,
}

impl Comm {
    pub(super) fn dup_world(peer: c_int) -> Comm {
        // SAFETY: reading extern statics that rsmpi's C shim initialises.
        let (world, mut comm) = unsafe { (ffi::RSMPI_COMM_WORLD, ffi::RSMPI_COMM_NULL) };
        // SAFETY: MPI is initialised (by the join); `comm` is valid storage for the handle.
        check(unsafe { ffi::MPI_Comm_dup(world, &mut comm) }, "MPI_Comm_dup(MPI_COMM_WORLD)");
        // SAFETY: a live communicator; ERRORS_RETURN is a predefined handler.
        check(unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler");
        Comm { comm, peer }
    }

    fn send(&self, buf: &[u8], tag: c_int) {
        // SAFETY: `buf` holds `buf.len()` bytes (checked to fit an int by the options).
        let rc = unsafe {
            ffi::MPI_Send(buf.as_ptr().cast(), buf.len() as c_int, ffi::RSMPI_UINT8_T, self.peer, tag, self.comm)
        };
        check(rc, "MPI_Send");
    }

    fn recv(&self, buf: &mut [u8], tag: c_int) {
        // SAFETY: `buf` has room for `buf.len()` bytes; the status is ignored.
        let rc = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                buf.len() as c_int,
                ffi::RSMPI_UINT8_T,
                self.peer,
                tag,
                self.comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        check(rc, "MPI_Recv");
    }

    /// # Safety
    /// `buf` must stay alive and unwritten until the request completes.
    unsafe fn isend(&self, buf: &[u8], tag: c_int) -> ffi::MPI_Request {
        let mut request = ffi::RSMPI_REQUEST_NULL;
        let rc = ffi::MPI_Isend(
            buf.as_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            self.peer,
            tag,
            self.comm,
            &mut request,
        );
        check(rc, "MPI_Isend");
        request
    }

    /// # Safety
    /// `buf` must stay alive and untouched until the request completes.
    unsafe fn irecv(&self, buf: &mut [u8], tag: c_int) -> ffi::MPI_Request {
        let mut request = ffi::RSMPI_REQUEST_NULL;
        let rc = ffi::MPI_Irecv(
            buf.as_mut_ptr().cast(),
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            self.peer,
            tag,
            self.comm,
            &mut request,
        );
        check(rc, "MPI_Irecv");
        request
    }

    fn wait(&self, request: &mut ffi::MPI_Request) {
        // SAFETY: a request from isend/irecv (or the null request); the status is ignored.
        check(unsafe { ffi::MPI_Wait(request, ffi::RSMPI_STATUS_IGNORE) }, "MPI_Wait");
    }

    fn wait_all(&self, requests: &mut [ffi::MPI_Request]) {
        // SAFETY: requests from isend/irecv; the statuses are ignored.
        let rc =
            unsafe { ffi::MPI_Waitall(requests.len() as c_int, requests.as_mut_ptr(), ffi::RSMPI_STATUSES_IGNORE) };
        check(rc, "MPI_Waitall");
    }

    pub(super) fn barrier(&self) {
        // SAFETY: a live communicator.
        check(unsafe { ffi::MPI_Barrier(self.comm) }, "MPI_Barrier");
    }

    /// Rank 0's value, on every rank.
    pub(super) fn broadcast_u64(&self, value: u64) -> u64 {
        let mut v = value;
        // SAFETY: one 8-byte value in place.
        let rc = unsafe { ffi::MPI_Bcast((&mut v as *mut u64).cast::<c_void>(), 1, ffi::RSMPI_UINT64_T, 0, self.comm) };
        check(rc, "MPI_Bcast");
        v
    }

    pub(super) fn send_text(&self, text: &str, tag: c_int) {
        self.send(&(text.len() as u64).to_le_bytes(), tag);
        self.send(text.as_bytes(), tag);
    }

    pub(super) fn recv_text(&self, tag: c_int) -> String {
        let mut len = [0u8; 8];
        self.recv(&mut len, tag);
        let len = usize::try_from(u64::from_le_bytes(len)).unwrap_or(0).min(1 << 20);
        let mut text = vec![0u8; len];
        self.recv(&mut text, tag);
        String::from_utf8_lossy(&text).into_owned()
    }

    /// Every rank's flag, in rank order.
    pub(super) fn all_gather_flag(&self, flag: bool) -> Vec<bool> {
        let mine: i32 = flag.into();
        let mut all = vec![0i32; 2];
        // SAFETY: one int sent; room for one int from each of the two ranks.
        let rc = unsafe {
            ffi::MPI_Allgather(
                (&mine as *const i32).cast(),
                1,
                ffi::RSMPI_INT32_T,
                all.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_INT32_T,
                self.comm,
            )
        };
        check(rc, "MPI_Allgather");
        all.into_iter().map(|f| f != 0).collect()
    }

    pub(super) fn free(mut self) {
        // SAFETY: a communicator this code duplicated and has not freed.
        check(unsafe { ffi::MPI_Comm_free(&mut self.comm) }, "MPI_Comm_free");
    }
}

/// What MPI says it is (its first line).
pub(super) fn mpi_library_version() -> String {
    // SAFETY: reading an extern static initialised by rsmpi's C shim.
    let max = unsafe { ffi::RSMPI_MAX_LIBRARY_VERSION_STRING }.max(1) as usize;
    let mut text = vec![0u8; max + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING bytes, as the call requires.
    check(unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr().cast(), &mut len) }, "MPI_Get_library_version");
    let text = String::from_utf8_lossy(&text[..(len.max(0) as usize).min(text.len())]).into_owned();
    text.lines().next().unwrap_or("").trim_end_matches(['\0', ',']).trim().to_owned()
}

/// Memory for the raw halves, grown as sizes grow and reused across rounds.
pub(super) struct RawBuffers {
    pub(super) bytes: Vec<u8>,
}

impl RawBuffers {
    fn get(&mut self, len: usize) -> &mut [u8] {
        if self.bytes.len() < len {
            self.bytes = vec![0u8; len];
        }
        &mut self.bytes[..len]
    }
}

pub(super) fn raw_latency(
    comm: &Comm,
    bufs: &mut RawBuffers,
    ping: bool,
    size: usize,
    iters: usize,
    touch: bool,
) -> Option<Percentiles> {
    let buf = bufs.get(size);
    let warm = (iters / 10).max(1);
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..warm + iters {
        let v = i as u8;
        if ping {
            let t = Instant::now();
            if touch {
                buf.fill(v);
            }
            comm.send(buf, TAG_LATENCY);
            comm.recv(buf, TAG_LATENCY);
            if touch {
                read_all(buf);
            }
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            comm.recv(buf, TAG_LATENCY);
            if touch {
                read_all(buf);
                buf.fill(v);
            }
            comm.send(buf, TAG_LATENCY);
        }
    }
    ping.then(|| percentiles(rtts))
}

/// Bytes per second, one direction: `window` messages in flight per iteration, then an ack.
pub(super) fn raw_bandwidth(
    comm: &Comm,
    bufs: &mut RawBuffers,
    ping: bool,
    size: usize,
    window: usize,
    iters: usize,
    touch: bool,
) -> Option<f64> {
    let area = bufs.get(size * window);
    // SAFETY: reading an extern static initialised by rsmpi's C shim.
    let mut requests = vec![unsafe { ffi::RSMPI_REQUEST_NULL }; window];
    let mut ack = [0u8; 4];
    let mut start = Instant::now();
    // The first iteration is a warm-up (it also faults the buffers in).
    for it in 0..iters + 1 {
        if it == 1 {
            start = Instant::now();
        }
        if ping {
            for (w, chunk) in area.chunks_mut(size).enumerate() {
                if touch {
                    chunk.fill(w as u8);
                }
                // SAFETY: each chunk is sent once per window and not written again until the
                // wait below completes its request.
                requests[w] = unsafe { comm.isend(chunk, TAG_BANDWIDTH) };
            }
            comm.wait_all(&mut requests);
            comm.recv(&mut ack, TAG_ACK);
        } else {
            for (w, chunk) in area.chunks_mut(size).enumerate() {
                // SAFETY: each chunk receives one message per window and is read only after
                // its request completes below.
                requests[w] = unsafe { comm.irecv(chunk, TAG_BANDWIDTH) };
            }
            if touch {
                // In order, reading each message as it completes, as the channel's receiver does.
                for (w, chunk) in area.chunks(size).enumerate() {
                    comm.wait(&mut requests[w]);
                    read_all(chunk);
                }
            } else {
                comm.wait_all(&mut requests);
            }
            comm.send(&ack, TAG_ACK);
        }
    }
    ping.then(|| (iters * window * size) as f64 / start.elapsed().as_secs_f64())
}
