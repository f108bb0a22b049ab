//! Deferred save completion for Python connectors: the scheduler's
//! `SaveScheduler`, each worker's `SaveTracker` over Python store tasks,
//! the `ReportAggregator` that frees a request once every worker reported
//! it, and the wire form of steps and reports as `bytes`.

use kvtier::save::{
    CompletionMode, Interrupted, ReportAggregator, ReportError, SaveStats, SchedulerSaveStats,
    StepError as CoreStepError, TaskError, WorkerReport,
};
use kvtier::{SaveScheduler, SaveStep, SaveTracker, StoreTask};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::errors::{
    KvtierError, ReportError as PyReportError, config, guard, step_error, wire_error,
};
use crate::request::request_id;
use crate::slot::{Owned, lend};

/// A save a Python store runs: any object with a non-blocking `done()`
/// and a blocking `wait()` that returns once the save no longer reads the
/// blocks (raising if it failed).
///
/// An `Exception` from either is the task's own failure. Anything else
/// raised there (`KeyboardInterrupt`, `SystemExit`: a `BaseException`
/// that is no `Exception`) is not: it interrupts the call, which leaves the
/// task running and raises it (see [`Interrupted`]).
struct PythonTask(Py<PyAny>);

/// Whether `error` is not the task's own failure: a `BaseException` that
/// is not an `Exception`.
fn is_foreign(py: Python<'_>, error: &PyErr) -> bool {
    // guard: P12-foreign-exceptions-propagate
    !error.is_instance_of::<PyException>(py)
}

impl StoreTask for PythonTask {
    fn check(&self) -> bool {
        self.try_check().unwrap_or(true)
    }

    fn wait(self) -> Result<(), TaskError> {
        match self.try_wait() {
            Ok(ended) => ended,
            Err((_, cause)) => Err(TaskError::failed(cause.to_string())),
        }
    }

    fn try_check(&self) -> Result<bool, Interrupted> {
        // A `done()` that raises, or an interpreter shutting down, counts as
        // over: the tracker then calls `wait`, which reports how it ended,
        // instead of polling a task that can never answer.
        Python::try_attach(|py| match self.0.bind(py).call_method0("done") {
            Ok(done) => Ok(done.is_truthy().unwrap_or(true)),
            Err(error) if is_foreign(py, &error) => Err(Interrupted(Box::new(error))),
            Err(_) => Ok(true),
        })
        .unwrap_or(Ok(true))
    }

    fn try_wait(self) -> Result<Result<(), TaskError>, (Self, Interrupted)> {
        let waited = Python::try_attach(|py| match self.0.bind(py).call_method0("wait") {
            Ok(_) => Ok(Ok(())),
            Err(error) if is_foreign(py, &error) => Err(Interrupted(Box::new(error))),
            Err(error) => Ok(Err(TaskError::failed(format!(
                "the store task raised {error}"
            )))),
        });
        match waited {
            Some(Ok(ended)) => Ok(ended),
            Some(Err(cause)) => Err((self, cause)),
            None => Ok(Err(TaskError::failed(
                "the Python interpreter is shutting down; the task was not waited",
            ))),
        }
    }
}

/// Raises what interrupted the tracker's last call, if anything did: the
/// Python exception itself (`KeyboardInterrupt`, ...).
fn raise_interruption(tracker: &mut Tracker) -> PyResult<()> {
    match tracker.take_interruption() {
        None => Ok(()),
        Some(Interrupted(cause)) => Err(match cause.downcast::<PyErr>() {
            Ok(error) => *error,
            Err(cause) => crate::errors::KvtierError::new_err(cause.to_string()),
        }),
    }
}

type Tracker = SaveTracker<String, PythonTask>;

/// A list of `str` made straight from the ids, without a copy of them on
/// the Rust side first.
fn str_list<'py>(py: Python<'py>, ids: &[String]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, ids.iter().map(|id| PyString::new(py, id)))
}

fn ids(requests: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if requests.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(
            "expected an iterable of request ids, not a single str",
        ));
    }
    requests.try_iter()?.map(|id| request_id(&id?)).collect()
}

fn save_stats<'py>(py: Python<'py>, stats: &SaveStats) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in stats.counters() {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

fn scheduler_stats<'py>(
    py: Python<'py>,
    stats: &SchedulerSaveStats,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("steps", stats.steps)?;
    dict.set_item("recorded", stats.recorded)?;
    dict.set_item("delayed", stats.delayed)?;
    dict.set_item("freed_at_once", stats.freed_at_once)?;
    Ok(dict)
}

/// The scheduler's half: records which requests save blocks in each step
/// and answers, when one finishes, whether its free must wait for the
/// workers' reports (vLLM's `request_finished` → `delay_free`).
#[pyclass(module = "kvtier._native", name = "SaveScheduler")]
struct PySaveScheduler {
    inner: SaveScheduler<String>,
}

#[pymethods]
impl PySaveScheduler {
    #[new]
    fn new() -> Self {
        Self {
            inner: SaveScheduler::new(),
        }
    }

    /// Records a step: `saves` is an iterable of `(req_id, blocks)` pairs
    /// (or a dict); requests with at least one block to save delay their
    /// free. Returns the `SaveStep` every worker takes (encode it to ship
    /// it), carrying the preemptions and finishes since the last step.
    fn record_step(&mut self, saves: &Bound<'_, PyAny>) -> PyResult<PySaveStep> {
        guard(|| {
            let pairs = match saves.cast::<PyDict>() {
                Ok(dict) => dict.items().into_any(),
                Err(_) => saves.clone(),
            };
            let mut recorded = Vec::new();
            for pair in pairs.try_iter()? {
                let (id, blocks): (Bound<'_, PyAny>, usize) = pair?.extract()?;
                recorded.push((request_id(&id)?, blocks));
            }
            Ok(PySaveStep {
                inner: self.inner.record_step(recorded),
            })
        })
    }

    /// A request finished: `True` when its blocks must stay until every
    /// worker reported it (it saved in some step), else `False`. Answers
    /// `True` once per recorded request; the next step carries the finish.
    fn request_finished(&mut self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| Ok(self.inner.request_finished(&request_id(request)?)))
    }

    /// The next step tells the workers these requests were preempted, so
    /// each waits for their saves before their blocks are reused.
    fn preempt(&mut self, requests: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            self.inner.preempt(&ids(requests)?);
            Ok(())
        })
    }

    /// Whether `request` is recorded as saving.
    fn is_delayed(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| Ok(self.inner.is_delayed(&request_id(request)?)))
    }

    /// Requests recorded as saving.
    #[getter]
    fn delayed_count(&self) -> usize {
        self.inner.delayed_count()
    }

    /// The counters (`steps`, `recorded`, `delayed`, `freed_at_once`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        scheduler_stats(py, &self.inner.stats())
    }
}

/// One step's save metadata, as every worker takes it: the sequence
/// number, the requests saving, and those preempted or finished since the
/// previous step. `encode()` / `SaveStep.decode(data)` ship it as bytes.
#[pyclass(module = "kvtier._native", name = "SaveStep", frozen, eq)]
#[derive(PartialEq)]
struct PySaveStep {
    inner: SaveStep<String>,
}

#[pymethods]
impl PySaveStep {
    /// The step's sequence number (0 for the first).
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step()
    }

    /// The requests with blocks to save in this step.
    #[getter]
    fn requests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        str_list(py, self.inner.requests())
    }

    /// The requests preempted since the previous step.
    #[getter]
    fn preempted<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        str_list(py, self.inner.preempted())
    }

    /// The delayed requests that finished since the previous step.
    #[getter]
    fn finished<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        str_list(py, self.inner.finished())
    }

    /// Whether nothing saves and nobody was preempted or finished.
    fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The step in kvtier's versioned wire form.
    fn encode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| {
            let bytes = self.inner.encode().map_err(wire_error)?;
            Ok(PyBytes::new(py, &bytes))
        })
    }

    /// A step from its wire form; any other bytes raise `WireError`.
    #[staticmethod]
    fn decode(data: &[u8]) -> PyResult<Self> {
        guard(|| {
            Ok(Self {
                inner: SaveStep::decode(data).map_err(wire_error)?,
            })
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "SaveStep(step={}, requests={:?}, preempted={:?}, finished={:?})",
            self.inner.step(),
            self.inner.requests(),
            self.inner.preempted(),
            self.inner.finished()
        )
    }
}

/// One worker's (rank's) deferred save completion. Saves run on the
/// store; the tracker reports a finished request only once every task
/// reading its blocks is done, each request exactly once, and fences the
/// saves of preempted requests. A store task is any object with `done()`
/// (non-blocking) and `wait()` (blocks until the save no longer reads the
/// blocks; raises if it failed — the request is still reported).
///
/// Calls that may wait (`begin_step`, `get_finished`, `finish_step`,
/// `handle_preemptions`, `wait_all`) release the GIL while they wait.
#[pyclass(module = "kvtier._native", name = "SaveTracker")]
struct PySaveTracker {
    inner: Owned<Tracker>,
}

impl PySaveTracker {
    /// Runs `body` on the tracker lent for `call` (store tasks' Python runs
    /// inside, and the GIL is let go while they wait), then raises what
    /// interrupted it, if anything did.
    fn run<R: Send>(
        slf: &Bound<'_, Self>,
        call: &'static str,
        body: impl FnOnce(&mut Tracker) -> R + Send,
    ) -> PyResult<R> {
        let py = slf.py();
        lend(
            slf,
            call,
            |this| &mut this.inner,
            |tracker| {
                let result = py.detach(|| body(tracker));
                raise_interruption(tracker).map(|()| result)
            },
        )?
    }
}

#[pymethods]
impl PySaveTracker {
    /// `blocking=False` (the default): `get_finished` reports the finished
    /// requests whose saves are done and remembers the rest for a later
    /// call. `blocking=True`: it waits for their saves (vLLM's reference).
    #[new]
    #[pyo3(signature = (*, blocking = false))]
    fn new(blocking: bool) -> Self {
        let mode = if blocking {
            CompletionMode::Blocking
        } else {
            CompletionMode::NonBlocking
        };
        Self {
            inner: Owned::new(
                "SaveTracker",
                "the tracker is gone",
                SaveTracker::with_mode(mode),
            )
            .without_threads(),
        }
    }

    /// Takes the scheduler's step before the forward pass: waits for the
    /// saves of its preempted requests, then records its saving requests.
    /// Raises `StepError` for a step out of sequence (nothing taken). An
    /// exception from a task's `wait()` that is not an `Exception`
    /// (`KeyboardInterrupt`) is raised as it is: the fence did not pass, the
    /// step was not taken, and offering it again retries.
    fn begin_step(slf: &Bound<'_, Self>, step: &PySaveStep) -> PyResult<()> {
        guard(|| {
            let step = &step.inner;
            match Self::run(slf, "begin_step", |tracker| tracker.begin_step(step))? {
                Ok(()) => Ok(()),
                // Only without a cause on record (`run` raised it otherwise).
                Err(CoreStepError::Interrupted) => Err(KvtierError::new_err(
                    "the preemption fence was interrupted; the step was not taken",
                )),
                Err(error) => Err(step_error(error)),
            }
        })
    }

    /// The sequence number of the step due next.
    #[getter]
    fn next_step(&self) -> PyResult<u64> {
        Ok(self.inner.get_ref("next_step")?.next_step())
    }

    /// Takes a store task that reads the blocks of `requests`; never waits.
    /// Returns its task number.
    fn submit(&mut self, task: &Bound<'_, PyAny>, requests: &Bound<'_, PyAny>) -> PyResult<u64> {
        guard(|| {
            for method in ["done", "wait"] {
                if !task.getattr(method).is_ok_and(|m| m.is_callable()) {
                    return Err(PyTypeError::new_err(format!(
                        "a store task has done() and wait() methods; {} has no {method}()",
                        task.get_type().name()?
                    )));
                }
            }
            let requests = ids(requests)?;
            let id = self
                .inner
                .get("submit")?
                .submit(PythonTask(task.clone().unbind()), &requests);
            Ok(id.get())
        })
    }

    /// The store refused a save of `requests` (`error` says why): they are
    /// still reported when they finish.
    fn submit_failed(&mut self, requests: &Bound<'_, PyAny>, error: &str) -> PyResult<()> {
        guard(|| {
            let requests = ids(requests)?;
            self.inner
                .get("submit_failed")?
                .submit_failed(&requests, error);
            Ok(())
        })
    }

    /// Reaps the tasks that are done, without waiting; returns how many.
    fn poll(slf: &Bound<'_, Self>) -> PyResult<usize> {
        guard(|| Self::run(slf, "poll", |tracker| tracker.poll()))
    }

    /// vLLM's `get_finished(finished_req_ids)`: the requests whose saves are
    /// all done, each reported once, among those finished now or before.
    fn get_finished(slf: &Bound<'_, Self>, finished: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        guard(|| {
            let finished = ids(finished)?;
            Self::run(slf, "get_finished", |tracker| {
                tracker.get_finished(&finished)
            })
        })
    }

    /// Closes `step` on worker `rank`: `get_finished` of the step's finished
    /// requests, with this worker's counters, as a `WorkerReport` to send
    /// to the scheduler.
    fn finish_step(
        slf: &Bound<'_, Self>,
        rank: u32,
        step: &PySaveStep,
    ) -> PyResult<PyWorkerReport> {
        guard(|| {
            let step = &step.inner;
            let report = Self::run(slf, "finish_step", |tracker| {
                tracker.finish_step(rank, step)
            })?;
            Ok(PyWorkerReport { inner: report })
        })
    }

    /// The preemption fence alone: waits only for the tasks reading the
    /// blocks of `requests`; returns how many it waited. An interruption
    /// (see `begin_step`) is raised, and the fence did not pass.
    fn handle_preemptions(slf: &Bound<'_, Self>, requests: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let requests = ids(requests)?;
            Self::run(slf, "handle_preemptions", |tracker| {
                tracker.handle_preemptions(&requests)
            })
        })
    }

    /// Waits for every task (at shutdown); returns the finished requests it
    /// could now report.
    fn wait_all(slf: &Bound<'_, Self>) -> PyResult<Vec<String>> {
        guard(|| Self::run(slf, "wait_all", |tracker| tracker.wait_all()))
    }

    /// Whether `request` is tracked (recorded, not yet reported).
    fn is_tracked(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| {
            let id = request_id(request)?;
            Ok(self.inner.get_ref("is_tracked")?.is_tracked(&id))
        })
    }

    /// Tasks submitted and not yet reaped or waited.
    #[getter]
    fn running_tasks(&self) -> PyResult<usize> {
        Ok(self.inner.get_ref("running_tasks")?.running_tasks())
    }

    /// Requests tracked.
    #[getter]
    fn tracked_requests(&self) -> PyResult<usize> {
        Ok(self.inner.get_ref("tracked_requests")?.tracked_requests())
    }

    /// The counters, as a `dict` of ints.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        save_stats(py, &self.inner.get_ref("stats")?.stats())
    }
}

/// What one worker sends the scheduler after each step: the requests whose
/// saves on it are done, and its counters. `encode()` /
/// `WorkerReport.decode(data)` ship it as bytes.
#[pyclass(module = "kvtier._native", name = "WorkerReport", frozen, eq)]
#[derive(PartialEq)]
struct PyWorkerReport {
    inner: WorkerReport<String>,
}

#[pymethods]
impl PyWorkerReport {
    /// The worker's rank.
    #[getter]
    fn worker(&self) -> u32 {
        self.inner.worker
    }

    /// The step this report closes.
    #[getter]
    fn step(&self) -> u64 {
        self.inner.step
    }

    /// The requests whose saves on this worker are all done.
    #[getter]
    fn finished<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        str_list(py, &self.inner.finished)
    }

    /// The worker's counters after the step.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        save_stats(py, &self.inner.stats)
    }

    /// The report in kvtier's versioned wire form.
    fn encode<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        guard(|| {
            let bytes = self.inner.encode().map_err(wire_error)?;
            Ok(PyBytes::new(py, &bytes))
        })
    }

    /// A report from its wire form; any other bytes raise `WireError`.
    #[staticmethod]
    fn decode(data: &[u8]) -> PyResult<Self> {
        guard(|| {
            Ok(Self {
                inner: WorkerReport::decode(data).map_err(wire_error)?,
            })
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "WorkerReport(worker={}, step={}, finished={:?})",
            self.inner.worker, self.inner.step, self.inner.finished
        )
    }
}

/// The scheduler's count of worker reports: a delayed request is freed once
/// every worker reported it, each exactly once; reports must come one per
/// worker per step, in order.
#[pyclass(module = "kvtier._native", name = "ReportAggregator")]
struct PyReportAggregator {
    inner: ReportAggregator<String>,
}

fn report_error(error: ReportError<String>) -> PyErr {
    match error {
        ReportError::NoWorkers | ReportError::TooManyWorkers { .. } => config(error.to_string()),
        _ => PyReportError::new_err(error.to_string()),
    }
}

#[pymethods]
impl PyReportAggregator {
    /// An aggregator for `workers` workers (at least 1).
    #[new]
    fn new(workers: usize) -> PyResult<Self> {
        guard(|| {
            Ok(Self {
                inner: ReportAggregator::new(workers).map_err(report_error)?,
            })
        })
    }

    /// Expects a report of `request` from every worker (its free was
    /// delayed); `False` if it already was.
    fn expect(&mut self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| Ok(self.inner.expect(request_id(request)?)))
    }

    /// Takes one worker's report: returns `(free, refused)`, the requests
    /// every worker has now reported (free their blocks) and a message for
    /// each id refused (nobody waits for it, or a second report from this
    /// worker). Raises `ReportError` for a report out of sequence or from a
    /// worker that does not exist; then nothing was taken.
    fn accept(&mut self, report: &PyWorkerReport) -> PyResult<(Vec<String>, Vec<String>)> {
        guard(|| {
            let report = self
                .inner
                .accept(report.inner.clone())
                .map_err(report_error)?;
            let refused = report.refused.iter().map(ToString::to_string).collect();
            Ok((report.free, refused))
        })
    }

    /// Requests still waiting for some worker's report.
    #[getter]
    fn waiting(&self) -> usize {
        self.inner.waiting()
    }

    /// Whether `request` waits for reports.
    fn is_waiting(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        guard(|| Ok(self.inner.is_waiting(&request_id(request)?)))
    }
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PySaveScheduler>()?;
    module.add_class::<PySaveStep>()?;
    module.add_class::<PySaveTracker>()?;
    module.add_class::<PyWorkerReport>()?;
    module.add_class::<PyReportAggregator>()?;
    Ok(())
}
