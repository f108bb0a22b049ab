//! Where a Python object keeps its native object: [`Owned`]. It answers the
//! two ways a call can find that object unusable, with a kvtier error that
//! says why, instead of PyO3's `RuntimeError: Already borrowed` or a hang:
//!
//! - **Another call is in progress.** A call that waits with the GIL
//!   released (`wait_idle`, `shutdown`, `drain`, a save tracker's fence)
//!   takes the object out for the wait ([`lend`]) and leaves the call's name
//!   behind; any call on the same object meanwhile, from another thread or
//!   from a callback inside the wait, gets [`BusyError`] naming it.
//! - **The process forked.** Threads are not copied by `fork()`: an object
//!   made before it has, in the child, threads that do not exist, so a wait
//!   would hang and a stop would panic. `os.register_at_fork` counts forks
//!   in the child ([`forked`]); every call on an object made before the last
//!   fork raises [`ForkError`], and dropping it there lets its native
//!   object go without stopping (joining) threads that are not there.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::{PyClass, pyclass::boolean_struct::False};

use crate::errors::{BusyError, ForkError, ShutdownError};

/// Forks this process is a child of, as far as Python's `os.fork` knows.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Called in the child after every `os.fork()`.
#[pyfunction]
fn _forked() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

enum State<T> {
    Ready(T),
    /// Taken out by the named call, which waits with the GIL released.
    Lent(&'static str),
    /// Shut down: the native object is gone.
    Closed,
}

/// A native object owned by a Python object (see the module docs).
pub(crate) struct Owned<T> {
    state: State<T>,
    /// The fork count when it was made; `None` for an object without
    /// threads, which works in a child as in its parent.
    born: Option<u64>,
    /// `Lookup`, `VllmTransfers`, ...: for messages.
    class: &'static str,
    /// What a call on it after `close` says.
    closed: &'static str,
}

impl<T> Owned<T> {
    pub(crate) fn new(class: &'static str, closed: &'static str, value: T) -> Self {
        Self {
            state: State::Ready(value),
            born: Some(FORKS.load(Ordering::SeqCst)),
            class,
            closed,
        }
    }

    /// For a native object that starts no thread: usable after a fork.
    pub(crate) fn without_threads(mut self) -> Self {
        self.born = None;
        self
    }

    /// Whether the process forked since the object was made.
    pub(crate) fn is_forked(&self) -> bool {
        self.born
            .is_some_and(|born| FORKS.load(Ordering::SeqCst) != born)
    }

    fn usable(&self, call: &str) -> PyResult<()> {
        // guard: P8-fork-detected
        if self.is_forked() {
            return Err(ForkError::new_err(format!(
                "{}.{call}: this {} was made before os.fork(); its threads are in the \
                 parent process. Make a new one in this process",
                self.class, self.class
            )));
        }
        // guard: P9-busy-names-the-call
        if let State::Lent(busy) = self.state {
            return Err(busy_error(self.class, call, busy));
        }
        Ok(())
    }

    /// The native object, for `call`.
    pub(crate) fn get(&mut self, call: &str) -> PyResult<&mut T> {
        self.usable(call)?;
        match &mut self.state {
            State::Ready(value) => Ok(value),
            _ => Err(ShutdownError::new_err(self.closed)),
        }
    }

    /// The native object, for a read-only `call`.
    pub(crate) fn get_ref(&self, call: &str) -> PyResult<&T> {
        self.usable(call)?;
        match &self.state {
            State::Ready(value) => Ok(value),
            _ => Err(ShutdownError::new_err(self.closed)),
        }
    }

    /// The native object if it is here (not lent, closed or forked).
    pub(crate) fn ready(&self) -> Option<&T> {
        match &self.state {
            State::Ready(value) if !self.is_forked() => Some(value),
            _ => None,
        }
    }

    /// Whether the object was closed.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Takes the native object out for `call`, leaving its name.
    pub(crate) fn take(&mut self, call: &'static str) -> PyResult<T> {
        self.usable(call)?;
        match std::mem::replace(&mut self.state, State::Lent(call)) {
            State::Ready(value) => Ok(value),
            other => {
                self.state = other;
                Err(ShutdownError::new_err(self.closed))
            }
        }
    }

    /// Puts back what [`take`](Self::take) took.
    pub(crate) fn put(&mut self, value: T) {
        self.state = State::Ready(value);
    }

    /// Marks the object shut down (after a `take` whose call consumed it).
    pub(crate) fn close(&mut self) {
        self.state = State::Closed;
    }

    /// Takes the native object to drop it: `None` if it is not here, and
    /// `None` after a fork too, the object then being let go without
    /// running its drop (which would join threads the child does not have).
    pub(crate) fn take_to_drop(&mut self) -> Option<T> {
        let value = match std::mem::replace(&mut self.state, State::Closed) {
            State::Ready(value) => value,
            _ => return None,
        };
        // guard: P8-no-join-after-fork
        if self.is_forked() {
            std::mem::forget(value);
            return None;
        }
        Some(value)
    }
}

fn busy_error(class: &str, call: &str, busy: &str) -> PyErr {
    BusyError::new_err(format!(
        "{class}.{call}: {class}.{busy}() is in progress on this object (on another \
         thread, or this call was made from inside it); call again once it returned"
    ))
}

/// Runs `body` on the native object of `slf` (reached by `owned`) taken out
/// of it for `call`: the GIL can be released inside, and calls on the same
/// object meanwhile get [`BusyError`] instead of PyO3's borrow error. The
/// object is put back afterwards, even if `body` panicked.
pub(crate) fn lend<C, T, R>(
    slf: &Bound<'_, C>,
    call: &'static str,
    owned: impl Fn(&mut C) -> &mut Owned<T>,
    body: impl FnOnce(&mut T) -> R,
) -> PyResult<R>
where
    C: PyClass<Frozen = False>,
{
    let mut value = {
        let mut this = borrow(slf, call)?;
        owned(&mut this).take(call)?
    };
    let result = catch_unwind(AssertUnwindSafe(|| body(&mut value)));
    // Nothing else borrows the object across a wait: every other call
    // either returns with the GIL held or lends it too (and was refused).
    if let Ok(mut this) = slf.try_borrow_mut() {
        owned(&mut this).put(value);
    }
    match result {
        Ok(value) => Ok(value),
        Err(payload) => resume_unwind(payload),
    }
}

/// A mutable borrow of `slf` for `call`; a borrow held elsewhere (a call
/// that runs Python code, re-entered from that code) is a [`BusyError`].
pub(crate) fn borrow<'py, C>(slf: &Bound<'py, C>, call: &str) -> PyResult<PyRefMut<'py, C>>
where
    C: PyClass<Frozen = False>,
{
    slf.try_borrow_mut().map_err(|_| {
        let class = slf
            .as_any()
            .get_type()
            .name()
            .map_or_else(|_| "object".to_owned(), |name| name.to_string());
        BusyError::new_err(format!(
            "{class}.{call}: another call on this object is in progress, and this one was \
             made from inside it (from Python code it runs)"
        ))
    })
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let forked = wrap_pyfunction!(_forked, module)?;
    module.add_function(forked.clone())?;
    let os = module.py().import("os")?;
    let kwargs = pyo3::types::PyDict::new(module.py());
    kwargs.set_item("after_in_child", forked)?;
    os.getattr("register_at_fork")?.call((), Some(&kwargs))?;
    Ok(())
}
