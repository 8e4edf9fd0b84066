//! `Loan`: room lent in the channel's shared memory for the next message, written in place
//! and then published or cancelled.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::handle::{Deferred, LoanRegion};
use super::Channel;
use crate::error::invalid_state;
use crate::ffi;
use crate::native::{lib, Ptr};
use crate::pybuf;

pub(super) struct LoanState {
    pub(super) finished: bool,
    pub(super) exports: usize,
    /// Still counted in the channel's `outstanding`.
    pub(super) counted: bool,
}

/// Room lent by `Channel.loan`: a writable buffer over the channel's shared memory. Write the
/// message into it, then `publish(n)`; `cancel()` gives it back. After either, new views of it
/// raise InvalidStateError.
#[pyclass(frozen, module = "lava_flow")]
pub struct Loan {
    pub(super) channel: Py<Channel>,
    pub(super) region: LoanRegion,
    pub(super) state: Mutex<LoanState>,
}

impl Loan {
    fn lock(&self) -> MutexGuard<'_, LoanState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the loan finished; `f` publishes or cancels it under the channel's lock.
    fn finish<R: Default>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Ptr<ffi::lf_channel>) -> (ffi::lf_status, R),
    ) -> PyResult<R> {
        {
            let mut s = self.lock();
            if s.finished {
                return Err(invalid_state("this loan was published or cancelled already"));
            }
            s.finished = true;
        }
        let mut out = R::default();
        let r = self.channel.get().finish_loan(py, |ch| {
            let (s, v) = f(ch);
            out = v;
            s
        });
        self.uncount();
        r.map(|_| out)
    }

    /// Leaves the channel's count once finished with no view left.
    fn uncount(&self) {
        let uncount = {
            let mut s = self.lock();
            let u = s.finished && s.exports == 0 && s.counted;
            s.counted &= !u;
            u
        };
        if uncount {
            let ch = self.channel.get();
            ch.outstanding.fetch_sub(1, Ordering::AcqRel);
            if let Ok(mut core) = ch.core.try_lock() {
                ch.free_if_done(&mut core);
            }
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let (finished, counted) = (s.finished, s.counted);
        s.finished = true;
        s.counted = false;
        let ch = self.channel.get();
        if !finished {
            // Counted while not finished: the count goes when the loan is given back.
            ch.run_or_defer(Deferred::CancelLoan(self.region));
        } else if counted {
            ch.outstanding.fetch_sub(1, Ordering::AcqRel);
            if let Ok(mut core) = ch.core.try_lock() {
                ch.free_if_done(&mut core);
            }
        }
    }
}

#[pymethods]
impl Loan {
    fn __len__(&self) -> usize {
        self.region.0.len
    }

    /// The address of the loaned memory.
    #[getter]
    fn address(&self) -> usize {
        self.region.0.data as usize
    }

    /// Publishes the first `size` bytes (default: all) as the next message; returns its
    /// sequence number.
    #[pyo3(signature = (size = None))]
    fn publish(&self, py: Python<'_>, size: Option<usize>) -> PyResult<u64> {
        let n = size.unwrap_or(self.region.0.len);
        let region = self.region;
        self.finish(py, |ch| {
            let mut seq = 0u64;
            // SAFETY: live channel, the loan it lent.
            let s = unsafe { lib().lf_publish(ch.0, &region.0, n, &mut seq) };
            (s, seq)
        })
    }

    /// Gives the loan back unpublished.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let region = self.region;
        // SAFETY: live channel, the loan it lent.
        self.finish(py, |ch| (unsafe { lib().lf_loan_cancel(ch.0, &region.0) }, ()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        if !self.lock().finished {
            self.cancel(py)?;
        }
        Ok(())
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        {
            let mut s = this.lock();
            if s.finished {
                return Err(invalid_state("this loan was published or cancelled: write into a new loan"));
            }
            s.exports += 1;
        }
        let r = &this.region.0;
        // SAFETY: the loaned memory stays mapped while the channel lives (the Loan holds it).
        let res = unsafe { pybuf::fill(slf.as_ptr(), view, flags, r.data.cast(), r.len, false) };
        if res.is_err() {
            this.lock().exports -= 1;
        }
        res
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.lock().exports -= 1;
        self.uncount();
    }
}
