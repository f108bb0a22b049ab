//! The probers a `kvtier.Lookup` opens: native ones over kvtier's tiers and
//! vLLM's layout (their settings from keyword arguments), and a Python
//! backend called on a worker thread.

use std::time::Duration;

use kvtier::Lookup;
use kvtier::lookup::{
    AsyncBackend, Backend, LookupError, Prober, Refused, Submission, ThreadProber, TokioConfig,
    TokioProber,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyWeakrefReference};
use pyo3::{PyTraverseError, PyVisit};

use crate::errors::lookup_error;
use crate::settings::{groups_of, seconds_of, threads_of};

/// A block key as vLLM names it: the block hash and the group index.
pub(crate) type Key = Vec<u8>;

/// Whichever prober a `Lookup` was built with.
pub(crate) struct AnyProber(Box<dyn Prober<Key, String> + Send + Sync>);

impl Prober<Key, String> for AnyProber {
    fn submit(&mut self, submission: Submission<Key, String>) -> Result<(), Refused<Key, String>> {
        self.0.submit(submission)
    }

    fn wait_idle(&mut self) -> Result<(), LookupError> {
        self.0.wait_idle()
    }

    fn wait_idle_for(&mut self, limit: Duration) -> Result<bool, LookupError> {
        self.0.wait_idle_for(limit)
    }

    fn shutdown(&mut self) -> Result<(), LookupError> {
        self.0.shutdown()
    }
}

pub(crate) type AnyLookup = Lookup<Key, String, AnyProber>;

/// A backend written in Python: `batch_lookup(keys, req_id)` (or a plain
/// callable) returning an iterable of booleans, called on the prober's
/// worker thread with the GIL taken for the call alone.
///
/// The worker reaches the callable through a weak reference to its
/// [`BackendSlot`], which the `Lookup` alone holds: every strong
/// reference to the callable is then one the garbage collector can see, so
/// a cycle through it (a backend method of an object that owns the lookup)
/// is collected like any Python cycle.
pub(crate) struct PythonBackend {
    slot: Py<PyWeakrefReference>,
}

/// Holds a Python backend's callable for its `Lookup`.
#[pyclass(module = "kvtier._native", frozen, weakref)]
pub(crate) struct BackendSlot {
    call: Py<PyAny>,
}

#[pymethods]
impl BackendSlot {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.call)
    }
}

impl Backend<Key, String> for PythonBackend {
    type Answers = Vec<bool>;
    type Error = String;

    fn batch_lookup(&mut self, keys: &[Key], request: &String) -> Result<Vec<bool>, String> {
        // Once the interpreter is shutting down no Python can run: the
        // group's keys are misses, and the worker never blocks on the GIL.
        Python::try_attach(|py| {
            let Some(slot) = self
                .slot
                .bind(py)
                .upgrade_as::<BackendSlot>()
                .ok()
                .flatten()
            else {
                return Err("the lookup that owned the Python backend was freed".to_owned());
            };
            let call = || -> PyResult<Vec<bool>> {
                // One answer past the keys is enough to see a surplus.
                let limit = keys.len() + 1;
                let keys = PyList::new(py, keys.iter().map(|key| PyBytes::new(py, key)))?;
                let answers = slot.get().call.bind(py).call1((keys, request.as_str()))?;
                let mut found = Vec::with_capacity(limit);
                // guard: P4-python-answers-bounded
                for answer in answers.try_iter()?.take(limit) {
                    found.push(strict_bool(&answer?)?);
                }
                Ok(found)
            };
            call().map_err(|error| format!("Python backend raised {error}"))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    }

    /// The call and the publication of its answers under one hold of the
    /// GIL (L17): a Python thread can only see what `batch_lookup` did (an
    /// event it set) once the worker lets go of the GIL, and by then the
    /// answers are published, so its next lookup has them. vLLM's tests wait
    /// on such an event and look up at once.
    fn around_group(&mut self, group: impl FnOnce(&mut Self)) {
        let mut group = Some(group);
        // guard: P6-publish-under-the-gil
        let attached = Python::try_attach(|_| {
            if let Some(group) = group.take() {
                group(self);
            }
        });
        // The interpreter is shutting down: no GIL to hold, and the call
        // makes the group's keys misses.
        if let (None, Some(group)) = (attached, group) {
            group(self);
        }
    }
}

/// A backend's answer as the contract has it: a `bool` or numpy's `bool_`.
/// Anything else (a string, bytes, a number, a dict's keys) makes the
/// group's answer faulty, so its keys miss, instead of being judged by
/// truthiness (`"False"` would be a hit).
fn strict_bool(answer: &Bound<'_, PyAny>) -> PyResult<bool> {
    // guard: P11-answers-are-bools
    if !is_bool(answer)? {
        return Err(PyTypeError::new_err(format!(
            "a backend answers each key with a bool, not {} ({:.40})",
            answer.get_type().name()?,
            answer.repr()?.to_string()
        )));
    }
    answer.is_truthy()
}

/// Whether `answer` is a `bool` or numpy's `bool_`.
fn is_bool(answer: &Bound<'_, PyAny>) -> PyResult<bool> {
    if answer.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(true);
    }
    let kind = answer.get_type();
    Ok(matches!(kind.name()?.to_str()?, "bool" | "bool_") && kind.module()?.to_str()? == "numpy")
}

/// The keyword arguments every native prober takes.
const NATIVE_SETTINGS: &str = "concurrency, group_timeout, shutdown_grace, threads";

/// Settings of a native prober from its keyword arguments: `concurrency`
/// (groups probed at once), `group_timeout` (seconds, or `None`),
/// `shutdown_grace` (seconds) and `threads` (runtime threads). The defaults
/// are `TokioConfig::default()`'s: 4 groups, 2 s, 1 s, 2 threads.
pub(crate) fn native_config(settings: Option<&Bound<'_, PyDict>>) -> PyResult<TokioConfig> {
    let mut config = TokioConfig::default();
    for (name, value) in settings.into_iter().flatten() {
        let name: String = name.extract()?;
        config = match name.as_str() {
            "concurrency" => config.max_concurrent_groups(groups_of("concurrency", &value)?),
            "group_timeout" if value.is_none() => config.group_timeout(None),
            "group_timeout" => config.group_timeout(Some(seconds_of("group_timeout", &value)?)),
            "shutdown_grace" => config.shutdown_grace(seconds_of("shutdown_grace", &value)?),
            "threads" => config.worker_threads(threads_of("threads", &value)?),
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument {other:?}: a native prober takes {NATIVE_SETTINGS}"
                )));
            }
        };
    }
    config.validate().map_err(lookup_error)?;
    Ok(config)
}

/// A lookup over a native backend, probed on a tokio runtime of its own.
pub(crate) fn native_lookup<B>(backend: B, config: TokioConfig) -> Result<AnyLookup, LookupError>
where
    B: AsyncBackend<Key, String>,
{
    Lookup::try_with_prober(|results| {
        TokioProber::spawn(backend, config, results).map(|p| AnyProber(Box::new(p)))
    })
}

/// A Python backend's slot (its one strong reference, for the lookup to
/// hold) and the backend the worker calls through a weak reference to it.
/// `backend` is an object with `batch_lookup(keys, req_id)`, or a callable.
pub(crate) fn python_backend<'py>(
    backend: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, BackendSlot>, PythonBackend)> {
    let call = match backend.getattr("batch_lookup") {
        Ok(method) => method,
        Err(_) if backend.is_callable() => backend.clone(),
        Err(_) => {
            return Err(PyTypeError::new_err(
                "a Python backend has a batch_lookup(keys, req_id) method or is callable",
            ));
        }
    };
    let slot = Bound::new(
        backend.py(),
        BackendSlot {
            call: call.unbind(),
        },
    )?;
    let weak = PythonBackend {
        slot: PyWeakrefReference::new(&slot)?.unbind(),
    };
    Ok((slot, weak))
}

/// A lookup over a Python backend, probed on a thread named `name`.
pub(crate) fn python_lookup(
    backend: PythonBackend,
    name: &str,
    grace: Option<Duration>,
) -> Result<AnyLookup, LookupError> {
    Lookup::try_with_prober(|results| {
        ThreadProber::spawn(backend, results, name)
            .map(|prober| AnyProber(Box::new(prober.with_shutdown_grace(grace))))
    })
}
