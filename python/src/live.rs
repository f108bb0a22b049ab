//! The lookups not yet collected, for the exit hook to stop.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// The lookups not yet collected: `shutdown_all` stops them at exit.
static LIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

pub(crate) fn live(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    let set = LIVE.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("weakref")?.getattr("WeakSet")?.call0()?.unbind())
    })?;
    Ok(set.bind(py))
}
