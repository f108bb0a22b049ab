//! The exceptions kvtier raises in Python, and the guard that keeps a Rust
//! panic from ever reaching Python as anything but one of them.

use std::panic::{AssertUnwindSafe, catch_unwind};

use kvtier::TierError as CoreTierError;
use kvtier::lookup::LookupError;
use kvtier::save::StepError as CoreStepError;
use kvtier::save::wire::WireError as CoreWireError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    kvtier,
    KvtierError,
    PyException,
    "The base of every exception kvtier raises."
);
create_exception!(
    kvtier,
    ConfigError,
    KvtierError,
    "A setting or argument is out of range; the message says which and why."
);
create_exception!(
    kvtier,
    WorkerLostError,
    KvtierError,
    "The prober's worker is gone. The keys it was given are misses."
);
create_exception!(
    kvtier,
    ShutdownError,
    KvtierError,
    "The lookup was shut down, or shutting down gave up on stuck groups."
);
create_exception!(
    kvtier,
    TierError,
    KvtierError,
    "A tier could not be opened or used (a missing root, a bad namespace, an I/O error)."
);
create_exception!(
    kvtier,
    WireError,
    KvtierError,
    "Bytes that are not an encoded step or report of this version."
);
create_exception!(
    kvtier,
    StepError,
    KvtierError,
    "A step out of sequence: a step was lost or repeated. Nothing was taken."
);
create_exception!(
    kvtier,
    ReportError,
    KvtierError,
    "A worker report out of sequence or from a worker that does not exist. Nothing was taken."
);
create_exception!(
    kvtier,
    BusyError,
    KvtierError,
    "Another call on this object is in progress (on another thread, or the call was made from inside it); the message names it."
);
create_exception!(
    kvtier,
    ForkError,
    KvtierError,
    "The object was made before os.fork() and its threads are in the parent: make a new one in this process."
);
create_exception!(
    kvtier,
    InternalError,
    KvtierError,
    "A bug in kvtier: a Rust panic, caught at the boundary. Please report it."
);

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("KvtierError", py.get_type::<KvtierError>())?;
    module.add("ConfigError", py.get_type::<ConfigError>())?;
    module.add("WorkerLostError", py.get_type::<WorkerLostError>())?;
    module.add("ShutdownError", py.get_type::<ShutdownError>())?;
    module.add("TierError", py.get_type::<TierError>())?;
    module.add("WireError", py.get_type::<WireError>())?;
    module.add("StepError", py.get_type::<StepError>())?;
    module.add("ReportError", py.get_type::<ReportError>())?;
    module.add("BusyError", py.get_type::<BusyError>())?;
    module.add("ForkError", py.get_type::<ForkError>())?;
    module.add("InternalError", py.get_type::<InternalError>())?;
    module.add_function(wrap_pyfunction!(_panic_for_test, module)?)?;
    Ok(())
}

/// Runs `body`, turning a Rust panic into [`InternalError`]: no panic
/// unwinds into Python, and none surfaces as PyO3's `PanicException`
/// (a `BaseException` that `except Exception` would not catch).
#[inline(always)]
pub(crate) fn guard<T>(body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // guard: P4-panics-become-kvtier-errors
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => Err(InternalError::new_err(panic_message(payload.as_ref()))),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned());
    format!("kvtier panicked: {message}")
}

/// Panics inside the guard: the test of the guard itself.
#[pyfunction]
#[doc(hidden)]
fn _panic_for_test(message: &str) -> PyResult<()> {
    guard(|| panic!("{message}"))
}

pub(crate) fn lookup_error(error: LookupError) -> PyErr {
    let message = error.to_string();
    match error {
        LookupError::Config(_) => ConfigError::new_err(message),
        LookupError::WorkerLost(_) | LookupError::Spawn(_) => WorkerLostError::new_err(message),
        LookupError::Stuck { .. } => ShutdownError::new_err(message),
        _ => KvtierError::new_err(message),
    }
}

pub(crate) fn tier_error(error: CoreTierError) -> PyErr {
    match error {
        CoreTierError::Config(_) | CoreTierError::Namespace(_) => {
            ConfigError::new_err(error.to_string())
        }
        _ => TierError::new_err(error.to_string()),
    }
}

pub(crate) fn wire_error(error: CoreWireError) -> PyErr {
    WireError::new_err(error.to_string())
}

pub(crate) fn step_error(error: CoreStepError) -> PyErr {
    StepError::new_err(error.to_string())
}

/// A duration option `name` given in seconds: `kvtier::settings::seconds`'
/// rule (a finite number from 0 to a day); the error names `name`.
pub(crate) fn seconds(name: &str, value: f64) -> PyResult<std::time::Duration> {
    kvtier::settings::seconds(name, value).map_err(|error| config(error.to_string()))
}

pub(crate) fn config(message: impl Into<String>) -> PyErr {
    ConfigError::new_err(message.into())
}
