//! What Python calls on a `kvtier.Lookup`: the scheduler's async lookup, with `bytes` keys and
//! `str` request ids, over a native prober (kvtier's fs tier, vLLM's fs
//! layout, an object store) or a Python backend.

use std::time::Duration;

use kvtier::lookup::{LookupLimits, LookupStats, LookupTable};
use kvtier::tier::{S3Options, VllmFsLayout, VllmObjectLayout};
use kvtier::{FsTier, ObjectTier, Verdict};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};

use super::handle::{LookupInspector, PyLookup, closed, stop_quietly};
use crate::args::Unset;
use crate::errors::{ShutdownError, config, guard, lookup_error, seconds, tier_error};
use crate::live::live;
use crate::probers::{Key, native_config, python_backend, python_lookup};
use crate::request::request_id;
use crate::slot::{borrow, lend};

/// How long a `wait_idle` waits between two looks at pending signals: a
/// Ctrl-C during the wait is raised within about this.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// A Python backend's default shutdown grace (seconds): how long shutdown,
/// a drop or the exit hook waits for a call in progress before leaving the
/// worker behind.
const PYTHON_SHUTDOWN_GRACE: f64 = 2.0;

/// Which of a lookup's three answers a verdict is (see [`PyLookup::answers`]).
fn answer(verdict: &Verdict<Key>) -> usize {
    match verdict {
        Verdict::Hit(_) => 0,
        Verdict::Miss => 1,
        Verdict::Pending => 2,
    }
}

/// The counters of a [`LookupStats`] as a `dict` of ints.
fn stats_dict<'py>(py: Python<'py>, stats: &LookupStats) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in stats.counters() {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

fn bytes_keys(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Key>> {
    keys.try_iter()?
        .map(|key| Ok(key?.cast::<PyBytes>()?.as_bytes().to_vec()))
        .collect()
}

#[pymethods]
impl PyLookup {
    /// Probes the blocks vLLM's own fs tier wrote below `rank_dir`
    /// (`<root>/<model>_<cfghash>_r<rank>`, see `kvtier.vllm.rank_dir`):
    /// a key (block hash + 4-byte big-endian group index) is a hit when
    /// `<hex[:3]>/<hex[3:5]>_g<group>/<hex>.bin` is a file. Native: the
    /// probes run on threads that never take the GIL, `concurrency` groups at
    /// once (default 4), each within `group_timeout` seconds (default 2;
    /// `None`: no timeout); `shutdown_grace` (default 1 s) and `threads`
    /// (default 2) complete the settings every native prober takes.
    #[staticmethod]
    #[pyo3(signature = (rank_dir, **settings))]
    fn vllm_fs(
        rank_dir: std::path::PathBuf,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let layout = VllmFsLayout::new(rank_dir).map_err(tier_error)?;
            let describe = format!("vllm_fs({:?})", layout.rank_dir());
            Self::native(describe, layout, native_config(settings)?)
        })
    }

    /// Probes the blocks of vLLM's layout below `rank_prefix` of the
    /// bucket `target` names (an `ObjectTarget` from `check_settings`):
    /// `<rank_prefix>/<hex[:3]>/<hex[3:5]>_g<group>/<hex>.bin`, one HEAD
    /// per key, a group's keys concurrently. Native, like `vllm_fs`. With
    /// `transfers` budgeted by the fleet's books (`index`), the books
    /// answer instead: one round trip per group. A process without
    /// transfers (the KV connector's scheduler) gives `index` (with
    /// `capacity_bytes`, and `index_lease`) to ask the books over a
    /// connection of the lookup's own.
    #[staticmethod]
    #[pyo3(signature = (
        target, rank_prefix, *, transfers = None, index = None, index_lease = None,
        capacity_bytes = None, **settings
    ))]
    fn vllm_objects(
        target: &Bound<'_, crate::objects::PyObjectTarget>,
        rank_prefix: &str,
        transfers: Option<&Bound<'_, crate::transfers::PyVllmTransfers>>,
        index: Option<&Bound<'_, PyAny>>,
        index_lease: Option<&Bound<'_, PyAny>>,
        capacity_bytes: Option<&Bound<'_, PyAny>>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let settings = native_config(settings)?;
            let layout = VllmObjectLayout::s3(target.get().inner.options(), rank_prefix)
                .map_err(tier_error)?;
            let layout = super::books::answered_by_books(
                target.py(),
                layout,
                transfers,
                (index, index_lease),
                capacity_bytes,
            )?;
            let describe = format!(
                "vllm_objects({:?}, {rank_prefix:?}{})",
                target.get().inner.options().get_bucket(),
                if layout.answers_from_books() {
                    ", books"
                } else {
                    ""
                }
            );
            Self::native(describe, layout, settings)
        })
    }

    /// Probes kvtier's own fs tier (`FsTier`): namespace `namespace` below
    /// the existing directory `root`, blocks in kvtier's checked format.
    /// Native, like `vllm_fs`.
    #[staticmethod]
    #[pyo3(signature = (root, namespace, **settings))]
    fn fs(
        root: std::path::PathBuf,
        namespace: &str,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let tier = FsTier::open(&root, namespace).map_err(tier_error)?;
            Self::native(
                format!("fs({root:?}, {namespace:?})"),
                tier,
                native_config(settings)?,
            )
        })
    }

    /// Probes an S3 or S3-compatible object store named by
    /// `s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]` (kvtier's object
    /// tier: one HEAD per key). Credentials come from the arguments or the
    /// `AWS_*` environment; the instance-metadata service is never asked.
    /// Native, like `vllm_fs`.
    #[staticmethod]
    #[pyo3(signature = (url, *, access_key_id = None, secret_access_key = None, region = None, **settings))]
    fn s3(
        url: &str,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        region: Option<String>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let (mut options, namespace) = S3Options::from_url(url).map_err(tier_error)?;
            match (access_key_id, secret_access_key) {
                (Some(id), Some(secret)) => options = options.credentials(id, secret),
                (None, None) => {}
                _ => {
                    return Err(config(
                        "give both access_key_id and secret_access_key, or neither",
                    ));
                }
            }
            if let Some(region) = region {
                options = options.region(region);
            }
            let settings = native_config(settings)?;
            let tier = ObjectTier::s3(&options, &namespace).map_err(tier_error)?;
            let describe = format!("s3({:?}, {namespace:?})", options.get_bucket());
            Self::native(describe, tier, settings)
        })
    }

    /// Probes kvtier's object tier over a local directory (the `object_store`
    /// crate's file backend): the object layout without a server. Native,
    /// like `vllm_fs`.
    #[staticmethod]
    #[pyo3(signature = (root, namespace, **settings))]
    fn object_dir(
        root: std::path::PathBuf,
        namespace: &str,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let tier = ObjectTier::local(&root, namespace).map_err(tier_error)?;
            let describe = format!("object_dir({root:?}, {namespace:?})");
            Self::native(describe, tier, native_config(settings)?)
        })
    }

    /// Probes with a Python backend: an object with a
    /// `batch_lookup(keys: list[bytes], req_id: str) -> Iterable[bool]`
    /// method, or such a callable. It runs on a worker thread (named
    /// `name`), one request group at a time, taking the GIL for each call.
    /// An exception, a short or a long answer makes the group's unanswered
    /// keys misses (counted in `stats()`); nothing is left pending.
    ///
    /// `shutdown_grace` (seconds, default 2): how long `shutdown()`, a drop
    /// or the exit hook waits for a call in progress; past it the worker is
    /// left behind (it exits once its call returns) and `shutdown()` raises
    /// `ShutdownError`, so a backend stuck for good never hangs the process.
    /// `None`: wait as long as it takes.
    #[staticmethod]
    #[pyo3(signature = (backend, *, name = "kvtier-lookup", shutdown_grace = Some(PYTHON_SHUTDOWN_GRACE)))]
    fn python(
        backend: &Bound<'_, PyAny>,
        name: &str,
        shutdown_grace: Option<f64>,
    ) -> PyResult<Py<Self>> {
        guard(|| {
            let grace = shutdown_grace
                .map(|grace| seconds("shutdown_grace", grace))
                .transpose()?;
            let (slot, backend) = python_backend(backend)?;
            Self::over(format!("python({name:?})"), Some(slot.unbind()), || {
                python_lookup(backend, name, grace)
            })
        })
    }

    /// What the tier knows about `key` (`bytes`), recording that
    /// `request` asked (a `str` id, or an object with a `req_id`): `True`
    /// (hit: load the block), `False` (miss: compute it) or `None` (not
    /// known yet: ask again next step). A new key is probed after the next
    /// `flush()`; a key is probed once however many requests ask.
    fn lookup(&mut self, key: &[u8], request: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        guard(|| {
            self.remember_request(request)?;
            let Self {
                inner,
                last_request,
                key: buffer,
                answers,
                ..
            } = self;
            let lookup = inner.get("lookup")?;
            let Some((_, id)) = last_request.as_ref() else {
                return Err(closed());
            };
            buffer.clear();
            buffer.extend_from_slice(key);
            let verdict = lookup.lookup(buffer, id);
            Ok(answers[answer(&verdict)].clone_ref(request.py()))
        })
    }

    /// Makes `lookup` and `lookup_many` answer `hit`, `miss` and `retry`
    /// (instead of `True`, `False`, `None`): vLLM's `LookupResult.HIT`,
    /// `MISS` and `RETRY`, so a tier can hand its scheduler this lookup's
    /// `lookup` method as it is.
    fn set_verdicts(&mut self, hit: Py<PyAny>, miss: Py<PyAny>, retry: Py<PyAny>) {
        self.answers = [hit, miss, retry];
    }

    /// A read-only view of the table for tools and compatibility layers
    /// (see `kvtier.vllm`): key states, requests, the batch to flush.
    fn inspect(slf: Py<Self>) -> LookupInspector {
        LookupInspector { lookup: slf }
    }

    /// A request's keys in one call: `(verdicts, leading_hits)`, the list
    /// of `lookup` answers (`True`/`False`/`None`) and how many of the
    /// leading keys are hits (the blocks the request can load before the
    /// first it must compute or wait for). One FFI crossing per request per
    /// step instead of one per key.
    fn lookup_many<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        guard(|| {
            self.remember_request(request)?;
            let Self {
                inner,
                last_request,
                keys: buffers,
                verdicts,
                ..
            } = self;
            let lookup = inner.get("lookup_many")?;
            let Some((_, id)) = last_request.as_ref() else {
                return Err(closed());
            };
            let mut count = 0;
            for key in keys.try_iter()? {
                let key = key?;
                let bytes = key.cast::<PyBytes>()?.as_bytes();
                match buffers.get_mut(count) {
                    Some(buffer) => {
                        buffer.clear();
                        buffer.extend_from_slice(bytes);
                    }
                    None => buffers.push(bytes.to_vec()),
                }
                count += 1;
            }
            let leading = lookup.lookup_all(&buffers[..count], id, verdicts);
            let answers = &self.answers;
            let list = PyList::new(py, verdicts.iter().map(|v| answers[answer(v)].bind(py)))?;
            (list, leading).into_pyobject(py)
        })
    }

    /// Ends the step: hands the keys looked up for the first time to the
    /// prober; returns how many. Never waits for the tier. Raises
    /// `WorkerLostError` if the prober's worker is gone (those keys are
    /// misses).
    fn flush(&mut self) -> PyResult<usize> {
        guard(|| self.open("flush")?.flush().map_err(lookup_error))
    }

    /// Starts (or stops) timing each lookup group from the flush that
    /// submitted it to the call that applied its answers (for a metrics
    /// exporter; off by default).
    fn time_verdicts(&mut self, on: bool) -> PyResult<()> {
        guard(|| {
            self.open("time_verdicts")?.time_verdicts(on);
            Ok(())
        })
    }

    /// `(seconds, dropped)`: how long each group applied since the last
    /// call waited for its verdict (empty unless `time_verdicts(True)`),
    /// and how many more were not kept.
    fn take_verdict_times(&mut self) -> PyResult<(Vec<f64>, u64)> {
        guard(|| Ok(self.open("take_verdict_times")?.take_verdict_times()))
    }

    /// Applies the answers published so far; returns how many groups. Every
    /// other call does this first, so a scheduler never needs it.
    fn drain(&mut self) -> PyResult<usize> {
        guard(|| Ok(self.open("drain")?.drain()))
    }

    /// Blocks, with the GIL released, until the prober answered every group
    /// it was given, then applies the answers; returns how many groups. For
    /// tests and orderly pauses, not for the scheduler's step. Called from
    /// inside a Python backend's call it raises `KvtierError` (a thread
    /// prober's worker would wait for itself). A Ctrl-C while it waits is
    /// raised (`KeyboardInterrupt`) within about 50 ms; another call on the
    /// lookup meanwhile raises `BusyError`.
    fn wait_idle(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        guard(|| {
            loop {
                let waited = lend(
                    slf,
                    "wait_idle",
                    |this| &mut this.inner,
                    // guard: P2-wait-idle-lets-go-of-the-gil
                    |lookup| py.detach(|| lookup.wait_idle_for(SIGNAL_SLICE)),
                )?;
                if let Some(groups) = waited.map_err(lookup_error)? {
                    return Ok(groups);
                }
                // guard: P10-waits-answer-signals
                py.check_signals()?;
            }
        })
    }

    /// Turns the resolved hits of `keys` (an iterable of `bytes`) into misses
    /// after their load failed, without a re-probe; returns how many
    /// changed. A key whose lookup is pending or in flight (it was cleaned up
    /// and looked up again since the hit) is not touched.
    fn mark_miss(&mut self, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let keys = bytes_keys(keys)?;
            Ok(self.open("mark_miss")?.mark_miss_keys(&keys))
        })
    }

    /// Tells the lookups that the tier now holds (`present=True`) or no
    /// longer holds the blocks of `keys` (an iterable of `bytes`): a store
    /// of them completed, or an eviction removed them. Returns how many key
    /// states changed. A probe in flight for one of them is superseded: its
    /// answer, whenever it arrives, is dropped as stale. Feed changes in the
    /// order they happened.
    fn settle(&mut self, keys: &Bound<'_, PyAny>, present: bool) -> PyResult<usize> {
        guard(|| {
            let keys = bytes_keys(keys)?;
            Ok(self.open("settle")?.settle(&keys, present))
        })
    }

    /// Forgets `request` (a `str` id or an object with `req_id`): keys no
    /// other request asked for are dropped; a probe in flight is kept for
    /// the next request that asks. An unknown id is a no-op.
    fn cleanup(&mut self, request: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let id = request_id(request)?;
            self.open("cleanup")?.cleanup(&id);
            Ok(())
        })
    }

    /// Bounds how long a key may stay pending and how much may be
    /// outstanding; arguments left out keep their current value.
    /// `pending_steps`/`pending_time` (seconds): a key unanswered past the
    /// budget is a miss (`None` turns a budget off); `max_outstanding_keys`,
    /// `max_outstanding_groups`: a new key beyond them is a miss at once;
    /// `skip_unwanted`: groups nobody waits for any more are not probed.
    #[pyo3(signature = (*, pending_steps = Unset::default(), pending_time = Unset::default(), max_outstanding_keys = None, max_outstanding_groups = None, skip_unwanted = None))]
    fn set_limits(
        &mut self,
        pending_steps: Unset<Option<u64>>,
        pending_time: Unset<Option<f64>>,
        max_outstanding_keys: Option<usize>,
        max_outstanding_groups: Option<usize>,
        skip_unwanted: Option<bool>,
    ) -> PyResult<()> {
        guard(|| {
            let lookup = self.open("set_limits")?;
            let mut limits: LookupLimits = lookup.table().limits().clone();
            if let Unset(Some(steps)) = pending_steps {
                limits = limits.pending_steps(steps);
            }
            if let Unset(Some(time)) = pending_time {
                let time = time.map(|time| seconds("pending_time", time)).transpose()?;
                limits = limits.pending_time(time);
            }
            if let Some(keys) = max_outstanding_keys {
                limits = limits.max_outstanding_keys(keys);
            }
            if let Some(groups) = max_outstanding_groups {
                limits = limits.max_outstanding_groups(groups);
            }
            if let Some(skip) = skip_unwanted {
                limits = limits.skip_unwanted(skip);
            }
            lookup.set_limits(limits).map_err(lookup_error)
        })
    }

    /// The counters so far, as a `dict` of ints (`lookups`, `hits`,
    /// `misses`, `pending`, `keys_submitted`, `backend_errors`, ...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| stats_dict(py, &self.inner.get_ref("stats")?.stats()))
    }

    /// Keys the table holds.
    fn __len__(&self) -> PyResult<usize> {
        guard(|| Ok(self.table().map_or(0, LookupTable::len)))
    }

    /// Live requests the table holds.
    #[getter]
    fn request_count(&self) -> usize {
        self.table().map_or(0, LookupTable::request_count)
    }

    /// Whether `shutdown()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Stops the prober (with the GIL released, so a Python backend can
    /// finish its call), applies its last answers and returns the final
    /// counters. A second call returns `None`. Raises `ShutdownError` when
    /// a native prober gave up on groups whose calls ignored cancellation,
    /// or a Python backend's call outlasted `shutdown_grace`. Bounded: a
    /// Ctrl-C meanwhile is raised once it returns.
    fn shutdown<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let py = slf.py();
        guard(|| {
            let lookup = {
                let mut this = borrow(slf, "shutdown")?;
                if this.inner.is_closed() {
                    return Ok(None);
                }
                this.inner.take("shutdown")?
            };
            // guard: P2-shutdown-lets-go-of-the-gil
            let stopped = py.detach(move || lookup.shutdown());
            let mut this = borrow(slf, "shutdown")?;
            this.inner.close();
            let (table, error) = match stopped {
                Ok(table) => (table, None),
                Err(error) => {
                    let (error, table) = error.into_parts();
                    (table, Some(error))
                }
            };
            let stats = stats_dict(py, &table.stats())?;
            this.stopped = Some(table);
            drop(this);
            // A Ctrl-C while it waited is raised now, not at the caller's
            // next bytecode that happens to look.
            // guard: P10-shutdown-answers-signals
            py.check_signals()?;
            match error {
                None => Ok(Some(stats)),
                Some(error) => Err(ShutdownError::new_err(error.to_string())),
            }
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // guard: P3-backend-shown-to-the-gc
        if let Some(backend) = &self.backend {
            visit.call(backend)?;
        }
        if let Some((request, _)) = &self.last_request {
            visit.call(request)?;
        }
        for answer in &self.answers {
            visit.call(answer)?;
        }
        Ok(())
    }

    /// Breaks a cycle: drops the backend, and stops the prober.
    fn __clear__(&mut self) {
        self.last_request = None;
        self.backend = None;
        self.answers = Python::attach(|py| [py.None(), py.None(), py.None()]);
        stop_quietly(self.inner.take_to_drop());
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(slf: &Bound<'_, Self>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        Self::shutdown(slf)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.inner.ready() {
            Some(lookup) => format!(
                "Lookup.{} ({} keys, {} requests)",
                self.describe,
                lookup.table().len(),
                lookup.table().request_count()
            ),
            None if self.inner.is_closed() => format!("Lookup.{} (shut down)", self.describe),
            None => format!("Lookup.{} (busy, or made before a fork)", self.describe),
        }
    }
}

/// Shuts down every lookup still running. Registered with `atexit`, so
/// probers stop while threads can still take the GIL (a Python backend's
/// worker finishes its call), not during the interpreter's finalisation.
#[pyfunction]
fn shutdown_all(py: Python<'_>) -> PyResult<usize> {
    let lookups: Vec<Bound<'_, PyAny>> = live(py)?.try_iter()?.collect::<PyResult<_>>()?;
    let mut stopped = 0;
    for lookup in lookups {
        let Ok(lookup) = lookup.cast_into::<PyLookup>() else {
            continue;
        };
        // Shut down, in use by a call on another thread, or made before a
        // fork (its threads are not in this process): nothing to stop here.
        let running = lookup
            .try_borrow()
            .is_ok_and(|this| this.inner.ready().is_some());
        if running {
            // An error here has nobody to report to at exit; the prober is
            // stopped all the same (a Python backend's within its grace).
            let _ = PyLookup::shutdown(&lookup);
            stopped += 1;
        }
    }
    Ok(stopped)
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyLookup>()?;
    let shutdown = wrap_pyfunction!(shutdown_all, module)?;
    module.add_function(shutdown.clone())?;
    module
        .py()
        .import("atexit")?
        .call_method1("register", (shutdown,))?;
    Ok(())
}
