//! A `kvtier.Lookup`'s handle: what it holds (the lookup, the table it
//! left, its answers), how it is built over a prober, and how it is dropped.

use kvtier::Verdict;
use kvtier::lookup::{LookupError, LookupTable, TokioConfig};
use pyo3::prelude::*;

use crate::errors::{ShutdownError, lookup_error};
use crate::live::live;
use crate::probers::{AnyLookup, BackendSlot, Key, native_lookup};
use crate::request::request_id;
use crate::slot::Owned;

/// Async secondary-tier lookup for a scheduler thread.
///
/// Every step, call `lookup(key, req_id)` (or `lookup_many`) for the
/// blocks a waiting request could load: `True` (hit: load it), `False`
/// (miss: compute it) or `None` (retry next step). End the step with
/// `flush()`; `mark_miss(keys)` after a failed load; `cleanup(req_id)` when
/// a request finishes. None of these waits for the tier. Build one with
/// `Lookup.vllm_fs`, `Lookup.fs`, `Lookup.s3`, `Lookup.object_dir` (native
/// probers that never take the GIL) or `Lookup.python` (a Python backend).
///
/// A lookup belongs to one scheduler thread; `shutdown()` (or leaving its
/// `with` block) stops the prober.
#[pyclass(module = "kvtier._native", name = "Lookup", weakref)]
pub(crate) struct PyLookup {
    pub(super) inner: Owned<AnyLookup>,
    /// The table the prober left at `shutdown`, for the read-only views.
    pub(super) stopped: Option<LookupTable<Key, String>>,
    /// What `lookup` returns for a hit, a miss and a key not known yet:
    /// `True`, `False`, `None`, or the objects `set_verdicts` gave (vLLM's
    /// `LookupResult` members), so no Python code runs to translate them.
    pub(super) answers: [Py<PyAny>; 3],
    /// The last request id object seen and its Rust copy: a scheduler asks
    /// for one request's keys in a row with the same `str` object.
    pub(super) last_request: Option<(Py<PyAny>, String)>,
    /// Reused for every key: a lookup allocates only a hit's ticket.
    pub(super) key: Key,
    /// Reused by `lookup_many`.
    pub(super) keys: Vec<Key>,
    pub(super) verdicts: Vec<Verdict<Key>>,
    /// What the lookup was built over, for `repr`.
    pub(super) describe: String,
    /// A Python backend's callable (see [`PythonBackend`]): the one strong
    /// reference to it, shown to the garbage collector.
    pub(super) backend: Option<Py<BackendSlot>>,
}

impl PyLookup {
    pub(super) fn over(
        describe: String,
        backend: Option<Py<BackendSlot>>,
        make: impl FnOnce() -> Result<AnyLookup, LookupError>,
    ) -> PyResult<Py<Self>> {
        let inner = make().map_err(lookup_error)?;
        Python::attach(|py| {
            let answers = [
                true.into_pyobject(py)?.to_owned().into_any().unbind(),
                false.into_pyobject(py)?.to_owned().into_any().unbind(),
                py.None(),
            ];
            let lookup = Self {
                inner: Owned::new("Lookup", "the lookup was shut down", inner),
                stopped: None,
                answers,
                last_request: None,
                key: Vec::new(),
                keys: Vec::new(),
                verdicts: Vec::new(),
                describe,
                backend,
            };
            let lookup = Py::new(py, lookup)?;
            live(py)?.call_method1("add", (&lookup,))?;
            Ok(lookup)
        })
    }

    pub(super) fn native<B>(describe: String, backend: B, config: TokioConfig) -> PyResult<Py<Self>>
    where
        B: kvtier::lookup::AsyncBackend<Key, String>,
    {
        Self::over(describe, None, || native_lookup(backend, config))
    }

    pub(super) fn open(&mut self, call: &str) -> PyResult<&mut AnyLookup> {
        self.inner.get(call)
    }

    /// The table, while running or as `shutdown` left it (none while a
    /// call that waits has the lookup).
    pub(crate) fn table(&self) -> Option<&LookupTable<Key, String>> {
        match self.inner.ready() {
            Some(lookup) => Some(lookup.table()),
            None => self.stopped.as_ref(),
        }
    }

    /// Whether the lookup was shut down.
    pub(crate) fn table_is_final(&self) -> bool {
        self.inner.is_closed()
    }

    /// Whether answers were published that no call has applied yet.
    pub(crate) fn has_published(&self) -> bool {
        self.inner.ready().is_some_and(AnyLookup::has_published)
    }
}

/// A read-only view of a `Lookup`'s table (after `shutdown`, of the table
/// it left): the handle is the lookup's; its views are `inspect.rs`'s.
#[pyclass(module = "kvtier._native", name = "LookupInspector", frozen)]
pub(crate) struct LookupInspector {
    pub(crate) lookup: Py<PyLookup>,
}

impl PyLookup {
    /// Makes `last_request` hold `request`'s id, converting it only when
    /// the request object changed.
    pub(super) fn remember_request(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Some((object, _)) = &self.last_request
            // guard: P5-request-cache-checks-the-object
            && object.as_ptr() == request.as_ptr()
        {
            return Ok(());
        }
        let id = request_id(request)?;
        self.last_request = Some((request.clone().unbind(), id));
        Ok(())
    }
}

pub(super) fn closed() -> PyErr {
    ShutdownError::new_err("the lookup was shut down")
}

impl Drop for PyLookup {
    /// A lookup dropped without `shutdown()` stops its prober with the GIL
    /// released, so a Python backend's last call can finish.
    fn drop(&mut self) {
        stop_quietly(self.inner.take_to_drop());
    }
}

/// Drops a lookup with the GIL released, so a Python backend's last call can
/// finish. Without the interpreter (it is shutting down) it is dropped as
/// it is: a Python backend's worker cannot attach then either, so it never
/// waits for the GIL.
pub(super) fn stop_quietly(mut lookup: Option<AnyLookup>) {
    if lookup.is_some() {
        let _ = Python::try_attach(|py| py.detach(|| drop(lookup.take())));
        drop(lookup);
    }
}
