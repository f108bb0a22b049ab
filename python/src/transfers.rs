//! `kvtier._native.VllmTransfers`: vLLM's tier stores and loads, run on
//! native I/O threads that never take the GIL, over the primary tier's
//! memory reached through the buffer protocol.

use std::path::PathBuf;
use std::time::Duration;

use kvtier::settings::BudgetConfig;
use kvtier::tier::{PrimaryRegion, TransferKind, VllmFsLayout, VllmObjectLayout, VllmTransfers};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::args::Unset;
use crate::capacity::{reconcile_dict, scan_dict, stats_dict};
use crate::settings::{Spelling, budget_of, capacity_of, index_of, thread_share_of};

/// Load and store threads when not given.
const DEFAULT_THREADS: usize = 16;
use crate::errors::{config, guard, seconds, tier_error};
use crate::slot::{Owned, lend};

/// The primary tier's memory as a [`PrimaryRegion`]: a writable,
/// C-contiguous buffer whose first dimension counts the blocks (vLLM's
/// `primary_kv_view`; a block is `strides[0]` bytes).
fn region_of(view: &Bound<'_, PyAny>) -> PyResult<PrimaryRegion> {
    let buffer = PyUntypedBuffer::get(view)?;
    if buffer.readonly() {
        return Err(config(
            "the primary tier's memory is read-only: loads write into it",
        ));
    }
    if !buffer.is_c_contiguous() || buffer.dimensions() == 0 {
        return Err(config(
            "the primary tier's memory must be a C-contiguous buffer of blocks",
        ));
    }
    let block_bytes = usize::try_from(buffer.strides()[0])
        .ok()
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| config("the primary tier's blocks (strides[0]) must be a positive size"))?;
    let base = buffer.buf_ptr().cast::<u8>();
    let len = buffer.len_bytes();
    // The buffer (which holds the exporter's memory in place: a view is
    // exported, so it can be neither resized nor freed) is kept by the
    // region and released with it, after the last transfer.
    #[allow(unsafe_code)]
    // SAFETY: a live buffer export of `len` bytes at `base`, kept alive by
    // the region (`keep_alive`), which drops it last; writable and
    // contiguous (checked above). vLLM pins a transfer's blocks until the
    // tier reports the job, so nothing else writes them meanwhile (the
    // contract of `from_raw_parts`).
    let region = unsafe { PrimaryRegion::from_raw_parts(base, len, block_bytes, Box::new(buffer)) };
    region.map_err(tier_error)
}

/// The load and store threads (each defaults to 16).
fn threads_of(
    load_threads: Option<&Bound<'_, PyAny>>,
    store_threads: Option<&Bound<'_, PyAny>>,
) -> PyResult<(usize, usize)> {
    let threads = |name, value: Option<&Bound<'_, PyAny>>| {
        value.map_or(Ok(DEFAULT_THREADS), |value| thread_share_of(name, value))
    };
    Ok((
        threads("load_threads", load_threads)?,
        threads("store_threads", store_threads)?,
    ))
}

fn job_id(id: &Bound<'_, PyAny>) -> PyResult<u64> {
    id.extract::<u64>()
        .map_err(|_| config(format!("a transfer job id is an int >= 0, not {id}")))
}

fn keys_of(keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    keys.try_iter()?
        .map(|key| Ok(key?.cast::<PyBytes>()?.as_bytes().to_vec()))
        .collect()
}

/// Primary block ids (vLLM's `chunk_ids`, a numpy array or any iterable of
/// ints). A negative id names no block: it becomes one past any region,
/// which fails the job.
fn blocks_of(ids: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    ids.try_iter()?
        .map(|id| Ok(usize::try_from(id?.extract::<i64>()?).unwrap_or(usize::MAX)))
        .collect()
}

fn key_list<'py>(py: Python<'py>, keys: &[Vec<u8>]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|key| PyBytes::new(py, key)))
}

/// vLLM's transfer jobs for one rank's directory of vLLM's fs layout: stores
/// copy blocks of the primary memory into `<rank_dir>/.../<hash>.bin`
/// files, loads copy them back, on `load_threads` + `store_threads` native
/// threads (each serving its own kind first). Submitting never waits;
/// `finished()` polls; every job is reported exactly once, after its I/O
/// no longer touches the memory.
#[pyclass(module = "kvtier._native", name = "VllmTransfers")]
pub(crate) struct PyVllmTransfers {
    inner: Owned<VllmTransfers>,
}

impl PyVllmTransfers {
    /// The fleet's books the transfers are budgeted by, for the lookups.
    pub(crate) fn fleet_budget(&self) -> PyResult<Option<kvtier::tier::fleet::FleetBudget>> {
        Ok(self.inner.get_ref("fleet_budget")?.fleet_budget())
    }

    /// The opened transfers, with their budget if one is set.
    fn budgeted(mut inner: VllmTransfers, budget: Option<BudgetConfig>) -> PyResult<Self> {
        if let Some(budget) = budget {
            inner.set_budget(budget).map_err(tier_error)?;
        }
        Ok(Self {
            inner: Owned::new("VllmTransfers", "the transfers were dropped", inner),
        })
    }

    fn submit(
        &mut self,
        kind: TransferKind,
        id: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        chunk_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let id = job_id(id)?;
        let keys = keys_of(keys)?;
        let blocks = blocks_of(chunk_ids)?;
        let call = match kind {
            TransferKind::Load => "submit_load",
            TransferKind::Store => "submit_store",
        };
        // The one refusal: a job id still in flight (an engine bug).
        self.inner
            .get(call)?
            .submit(kind, id, keys, &blocks)
            .map_err(|error| config(error.to_string()))
    }
}

#[pymethods]
impl PyVllmTransfers {
    #[new]
    #[pyo3(signature = (
        rank_dir, primary, *, load_threads = None, store_threads = None,
        capacity_bytes = None, eviction_policy = None, stale_temp_age = Unset::default(),
        rescan_interval = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank_dir: PathBuf,
        primary: &Bound<'_, PyAny>,
        load_threads: Option<&Bound<'_, PyAny>>,
        store_threads: Option<&Bound<'_, PyAny>>,
        capacity_bytes: Option<&Bound<'_, PyAny>>,
        eviction_policy: Option<&Bound<'_, PyAny>>,
        stale_temp_age: Unset<Option<Bound<'_, PyAny>>>,
        rescan_interval: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            // Settings first: a bad one starts no thread and scans nothing.
            let (load_threads, store_threads) = threads_of(load_threads, store_threads)?;
            let budget = budget_of(
                Spelling(None),
                capacity_bytes,
                eviction_policy,
                stale_temp_age.0.as_ref().map(Option::as_ref),
                rescan_interval,
            )?;
            let layout = VllmFsLayout::new(rank_dir).map_err(tier_error)?;
            let region = region_of(primary)?;
            let inner = VllmTransfers::new(layout, region, load_threads, store_threads)
                .map_err(tier_error)?;
            Self::budgeted(inner, budget)
        })
    }

    /// Transfers between `primary` and the blocks of vLLM's layout below
    /// `rank_prefix` of the bucket `target` names (an `ObjectTarget` from
    /// `check_settings`), on `load_threads` + `store_threads` native
    /// threads (default 16 each), one request in flight per thread. With
    /// `capacity_bytes`, a byte budget over the rank prefix (listed now;
    /// reconciled with a listing every `rescan_interval` seconds when set),
    /// as the constructor's over a directory.
    #[staticmethod]
    #[pyo3(signature = (
        target, rank_prefix, primary, *, load_threads = None, store_threads = None,
        capacity_bytes = None, eviction_policy = None, rescan_interval = None,
        index = None, index_lease = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn objects(
        target: &Bound<'_, crate::objects::PyObjectTarget>,
        rank_prefix: &str,
        primary: &Bound<'_, PyAny>,
        load_threads: Option<&Bound<'_, PyAny>>,
        store_threads: Option<&Bound<'_, PyAny>>,
        capacity_bytes: Option<&Bound<'_, PyAny>>,
        eviction_policy: Option<&Bound<'_, PyAny>>,
        rescan_interval: Option<&Bound<'_, PyAny>>,
        index: Option<&Bound<'_, PyAny>>,
        index_lease: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            let (load_threads, store_threads) = threads_of(load_threads, store_threads)?;
            let index = index_of(Spelling(None), index, index_lease)?;
            let budget = budget_of(
                Spelling(None),
                capacity_bytes,
                eviction_policy,
                None,
                rescan_interval,
            )?;
            let layout = VllmObjectLayout::s3(target.get().inner.options(), rank_prefix)
                .map_err(tier_error)?
                .with_max_in_flight(load_threads + store_threads)
                .map_err(tier_error)?;
            let region = region_of(primary)?;
            let mut inner = VllmTransfers::on_objects(layout, region, load_threads, store_threads)
                .map_err(tier_error)?;
            // The listing and the index's round trips run without the GIL:
            // other Python threads (an in-process test server, too) go on.
            let py = target.py();
            match (index, budget) {
                (None, None) => {}
                (None, Some(budget)) => {
                    py.detach(|| inner.set_budget(budget).map(drop))
                        .map_err(tier_error)?;
                }
                (Some(_), None) => {
                    return Err(config(
                        "index is set without capacity_bytes: the fleet's books bound a bucket prefix's bytes",
                    ));
                }
                (Some(index), Some(budget)) => {
                    py.detach(|| inner.set_fleet_budget(budget, index).map(drop))
                        .map_err(tier_error)?;
                }
            }
            Self::budgeted(inner, None)
        })
    }

    /// Starts a store: `keys[i]` is written from primary block
    /// `chunk_ids[i]` (skipped if its file is there already). Never waits.
    fn submit_store(
        &mut self,
        job_id: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        chunk_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| self.submit(TransferKind::Store, job_id, keys, chunk_ids))
    }

    /// Starts a load: `keys[i]` is read into primary block `chunk_ids[i]`,
    /// in order, stopping at the first that fails. Never waits.
    fn submit_load(
        &mut self,
        job_id: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        chunk_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| self.submit(TransferKind::Load, job_id, keys, chunk_ids))
    }

    /// Takes job `job_id` as failed without running it (the caller refused
    /// it, for `reason`): reported by the next `finished()` with nothing done.
    fn refuse(
        &mut self,
        job_id: &Bound<'_, PyAny>,
        keys: &Bound<'_, PyAny>,
        is_load: bool,
        reason: &str,
    ) -> PyResult<()> {
        guard(|| {
            let kind = if is_load {
                TransferKind::Load
            } else {
                TransferKind::Store
            };
            let id = self::job_id(job_id)?;
            self.inner
                .get("refuse")?
                .refuse(kind, id, keys_of(keys)?, reason)
                .map_err(|error| config(error.to_string()))
        })
    }

    /// The jobs that ended since the last call, each once, as
    /// `(job_id, is_load, success, keys, done, seconds)`: `done` keys (a
    /// prefix) were transferred; `seconds` of I/O. Never blocks.
    fn finished<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let finished = self.inner.get("finished")?.finished();
            let list = PyList::empty(py);
            for job in &finished {
                let row = (
                    job.id,
                    job.kind == TransferKind::Load,
                    job.succeeded(),
                    key_list(py, &job.keys)?,
                    job.done_keys().len(),
                    job.io_time.as_secs_f64(),
                );
                list.append(row.into_pyobject(py)?)?;
            }
            Ok(list)
        })
    }

    /// Starts (or stops) recording which blocks the transfers stored and
    /// which the byte budget deleted, for `take_changes()`. Off by default.
    fn record_changes(&mut self, on: bool) -> PyResult<()> {
        guard(|| {
            self.inner.get("record_changes")?.record_changes(on);
            Ok(())
        })
    }

    /// The changes since the last call, oldest first, as `(key, present)`:
    /// `True` for a block stored, `False` for one deleted (evicted, trimmed,
    /// or found missing or damaged). Feed them, in order, to the tier's
    /// `Lookup.settle`. Empty unless `record_changes(True)`.
    fn take_changes<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let changes = self.inner.get("take_changes")?.take_changes();
            PyList::new(
                py,
                changes
                    .iter()
                    .map(|(key, present)| (PyBytes::new(py, key), *present)),
            )
        })
    }

    /// Waits, with the GIL released, until no job's I/O touches the primary
    /// memory; their results come with the next `finished()`. Returns how
    /// many jobs it waited for.
    fn drain(slf: &Bound<'_, Self>) -> PyResult<usize> {
        let py = slf.py();
        guard(|| {
            lend(
                slf,
                "drain",
                |this| &mut this.inner,
                // guard: P2-transfers-wait-without-the-gil
                |inner| py.detach(|| inner.wait_idle()),
            )
        })
    }

    /// Stops the transfers, with the GIL released: queued loads are
    /// dropped, queued stores get `grace` seconds to start (then the rest
    /// are dropped), running jobs finish, the I/O threads stop, and the
    /// primary memory's buffer is released. Dropped jobs are reported as
    /// failed by the next `finished()`. Returns `(loads_dropped,
    /// stores_dropped)`.
    #[pyo3(signature = (grace = 0.0))]
    fn shutdown(slf: &Bound<'_, Self>, grace: f64) -> PyResult<(usize, usize)> {
        let py = slf.py();
        let grace = seconds("grace", grace)?;
        guard(|| {
            let report = lend(
                slf,
                "shutdown",
                |this| &mut this.inner,
                |inner| py.detach(|| inner.shutdown(grace)),
            )?;
            Ok((report.loads_dropped, report.stores_dropped))
        })
    }

    /// Queues a sweep of the temporary files that writers which died
    /// mid-store left in the rank directory, last modified at least
    /// `older_than` seconds ago; it runs on an I/O thread (`swept` counts
    /// what it removed).
    fn sweep_stale_temps(&self, older_than: f64) -> PyResult<()> {
        let age = seconds("older_than", older_than)?;
        self.inner
            .get_ref("sweep_stale_temps")?
            .sweep_stale_temps(age);
        Ok(())
    }

    /// The byte budget's counters and gauges by name (`None` without a
    /// budget): `capacity_bytes`, `resident_bytes`, `reserved_bytes`,
    /// `evictions`, `rejected_no_room`, `enospc`, `startup_trims`, ...
    fn capacity_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inner = self.inner.get_ref("capacity_stats")?;
        inner
            .capacity_stats()
            .map(|stats| stats_dict(py, &stats))
            .transpose()
    }

    /// What the budget's startup scan found and did (`None` without a
    /// budget): `blocks`, `bytes`, `trimmed`, `swept`, `seconds`.
    fn scan_report<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inner = self.inner.get_ref("scan_report")?;
        inner
            .scan_report()
            .map(|report| scan_dict(py, report))
            .transpose()
    }

    /// Sets the byte budget to `capacity_bytes` and deletes blocks until
    /// the files fit it; returns how many it deleted.
    fn trim(&self, capacity_bytes: &Bound<'_, PyAny>) -> PyResult<usize> {
        guard(|| {
            let capacity = capacity_of("capacity_bytes", capacity_bytes)?;
            self.inner
                .get_ref("trim")?
                .trim(capacity)
                .map_err(tier_error)
        })
    }

    /// Lists the rank directory and reconciles the byte budget with it,
    /// now (blocks other processes wrote counted, those they deleted
    /// forgotten, the least valuable deleted until the files fit); returns
    /// `adopted`, `forgotten`, `evicted`, `swept`, `seconds`. Runs without
    /// the GIL.
    fn reconcile<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = guard(|| {
            let inner = self.inner.get_ref("reconcile")?;
            py.detach(|| inner.reconcile()).map_err(tier_error)
        })?;
        reconcile_dict(py, &report)
    }

    /// Temporary files the sweeps removed so far.
    #[getter]
    fn swept(&self) -> PyResult<usize> {
        Ok(self.inner.get_ref("swept")?.swept())
    }

    /// Jobs queued that no I/O thread has started: `(loads, stores)`.
    fn queued(&self) -> PyResult<(usize, usize)> {
        let inner = self.inner.get_ref("queued")?;
        Ok((
            inner.queued(TransferKind::Load),
            inner.queued(TransferKind::Store),
        ))
    }

    /// I/O threads running (0 after `shutdown`).
    #[getter]
    fn threads_alive(&self) -> PyResult<usize> {
        Ok(self.inner.get_ref("threads_alive")?.threads_alive())
    }

    /// Jobs submitted and not reported yet, as `(job_id, is_load, keys)`.
    fn in_flight<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let list = PyList::empty(py);
            for job in self.inner.get_ref("in_flight")?.in_flight() {
                let row = (
                    job.id,
                    job.kind == TransferKind::Load,
                    key_list(py, &job.keys)?,
                );
                list.append(row.into_pyobject(py)?)?;
            }
            Ok(list)
        })
    }

    /// Blocks in the primary memory, and bytes per block.
    #[getter]
    fn shape(&self) -> PyResult<(usize, usize)> {
        Ok(self.inner.get_ref("shape")?.shape())
    }

    /// The path of `key`'s block file (whether or not it exists).
    fn path_of(&self, key: &[u8]) -> PyResult<PathBuf> {
        guard(|| {
            let inner = self.inner.get_ref("path_of")?;
            let Some(layout) = inner.layout() else {
                return Err(config(
                    "the transfers keep their blocks in an object store, not in files",
                ));
            };
            layout.path_of(key).map_err(tier_error)
        })
    }

    fn __repr__(&self) -> String {
        match self.inner.ready() {
            Some(inner) => format!("{inner:?}"),
            None => "VllmTransfers (busy, or made before a fork)".to_owned(),
        }
    }
}

impl Drop for PyVllmTransfers {
    /// Stops the I/O threads with the GIL released (they never take it, but
    /// a job waited for should not hold up the interpreter).
    fn drop(&mut self) {
        let Some(mut inner) = self.inner.take_to_drop() else {
            return;
        };
        let inner = &mut inner;
        if Python::try_attach(|py| py.detach(|| inner.shutdown(Duration::ZERO))).is_none() {
            inner.shutdown(Duration::ZERO);
        }
    }
}

/// Where `VllmTransfers(rank_dir, ...)` stores the block of `key`: the
/// path its stores and loads use, without making transfers (nothing on
/// disk is touched), so a tier can check it against vLLM's `FileMapper`
/// before its startup scan runs.
#[pyfunction]
fn vllm_block_path(rank_dir: PathBuf, key: &[u8]) -> PyResult<PathBuf> {
    guard(|| {
        let layout = VllmFsLayout::new(rank_dir).map_err(tier_error)?;
        layout.path_of(key).map_err(tier_error)
    })
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyVllmTransfers>()?;
    module.add_function(wrap_pyfunction!(vllm_block_path, module)?)
}
