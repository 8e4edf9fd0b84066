//! A handle shared by Python objects and the views they export: closing it (free, release,
//! close) while views or calls are in flight defers the C call to the last of them, so that
//! no view ever points at released memory and no call runs on a freed handle.
use std::sync::Mutex;

use pyo3::PyResult;

use crate::error::invalid_state;
use crate::native::Ptr;

pub struct Shared<T> {
    state: Mutex<State<T>>,
}

struct State<T> {
    ptr: Ptr<T>,
    closed: bool,
    users: usize,
}

impl<T> Shared<T> {
    pub fn new(ptr: *mut T) -> Self {
        Shared { state: Mutex::new(State { ptr: Ptr(ptr), closed: false, users: 0 }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a user (a call or an exported view) of the open handle; `what` names the object
    /// in the error when it is closed.
    pub fn acquire(&self, what: &str) -> PyResult<Ptr<T>> {
        let mut s = self.lock();
        if s.closed {
            return Err(invalid_state(&format!("{what} has been released: it cannot be used any more")));
        }
        s.users += 1;
        Ok(s.ptr)
    }

    /// Ends a use; returns the handle to release when it was the last use of a closed handle.
    #[must_use]
    pub fn release(&self) -> Option<Ptr<T>> {
        let mut s = self.lock();
        s.users -= 1;
        Self::take_if_done(&mut s)
    }

    /// Closes the handle; returns it to release at once when nothing uses it (else the last
    /// user's `release` returns it). `None` also when it was closed already.
    #[must_use]
    pub fn close(&self) -> Option<Ptr<T>> {
        let mut s = self.lock();
        s.closed = true;
        Self::take_if_done(&mut s)
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The handle without counting a use (for `.handle` and reports), None when closed.
    pub fn peek(&self) -> Option<Ptr<T>> {
        let s = self.lock();
        (!s.closed).then_some(s.ptr)
    }

    fn take_if_done(s: &mut State<T>) -> Option<Ptr<T>> {
        if s.closed && s.users == 0 && !s.ptr.0.is_null() {
            let p = s.ptr;
            s.ptr = Ptr(std::ptr::null_mut());
            Some(p)
        } else {
            None
        }
    }
}
