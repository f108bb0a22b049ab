//! vLLM's transfer jobs, run natively: stores copy blocks of the primary
//! region into vLLM's fs layout, loads copy them back, on I/O threads that
//! never need the GIL; completion is polled without blocking.
//!
//! The bookkeeping is the save core's: every job is a request of a
//! [`SaveTracker`] that is its own scheduler ([`SaveTracker::record`]), with
//! one task, so a job is reported exactly once (S2), never while its I/O
//! still touches the region (S1: its task completes after the I/O and after
//! its claim on the blocks is given back), and with how it went
//! ([`SaveOutcome`]). A job whose input is wrong (a block out of range, keys
//! and blocks of different counts, a block another transfer holds) is
//! refused the same way, as a failed job, so the engine hears of it where it
//! hears of every other job.

use std::fmt;
use std::time::{Duration, Instant};

use super::super::tree::{BlockLayout, sweep_temps};
use super::books::{Budget, Changes};
#[cfg(object_tier)]
use super::bucket::VllmObjectLayout;
use super::home::Home;
use super::job::{Job, TransferKind, transfer};
use super::layout::VllmFsLayout;
use super::region::PrimaryRegion;
use crate::save::SaveTracker;
use crate::save::{CompletionTask, SaveOutcome, TaskError};
use crate::settings::MAX_IO_THREADS;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::tier::error::TierError;
use crate::tier::pool::IoPool;

/// A job the tier is done with: reported once, after its I/O ended.
#[derive(Clone, Debug)]
pub struct FinishedTransfer {
    /// The job's id, as submitted.
    pub id: u64,
    /// Store or load.
    pub kind: TransferKind,
    /// Whether every block of it was transferred.
    pub outcome: SaveOutcome,
    /// The job's keys, as submitted.
    pub keys: Arc<[Vec<u8>]>,
    /// Blocks transferred, in the job's order, before the first that failed
    /// (all of them for a job that succeeded).
    pub done: usize,
    /// Time spent in the job's I/O.
    pub io_time: Duration,
    /// Of a store without a budget: the indices (ascending) of the blocks
    /// that were in the tier already (nothing written, nothing changed).
    pub(crate) present: Vec<usize>,
}

impl FinishedTransfer {
    /// Whether every block was transferred.
    pub fn succeeded(&self) -> bool {
        self.outcome == SaveOutcome::Saved
    }

    /// The keys transferred before the first failure (every key of a job
    /// that succeeded): for a failed load, the blocks the primary tier keeps.
    pub fn done_keys(&self) -> &[Vec<u8>] {
        match self.outcome {
            SaveOutcome::Saved => &self.keys,
            SaveOutcome::Failed => &self.keys[..self.done.min(self.keys.len())],
        }
    }

    /// The keys from the first failure on (none of a job that succeeded):
    /// for a failed load, the blocks whose lookups become misses. A request
    /// needs its blocks as a prefix, so a block after a failed one is
    /// recomputed whether or not it was read.
    pub fn failed_keys(&self) -> &[Vec<u8>] {
        // guard: V4-only-the-failed-tail-is-given-up
        &self.keys[self.done_keys().len()..]
    }
}

/// A job submitted and not reported yet.
#[derive(Clone, Debug)]
pub struct InFlightTransfer {
    /// The job's id.
    pub id: u64,
    /// Store or load.
    pub kind: TransferKind,
    /// The job's keys, as submitted.
    pub keys: Arc<[Vec<u8>]>,
}

/// Why [`VllmTransfers::submit`] refused a job outright (every other
/// problem fails the job, which is then reported).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// A job with this id is still in flight: its report would answer for
    /// both.
    #[error("transfer job {0} is still in flight")]
    InFlight(u64),
}

/// vLLM's transfer jobs between a [`PrimaryRegion`] and one rank's
/// directory of vLLM's fs layout (see the module docs).
///
/// ```
/// use kvtier::tier::{PrimaryRegion, TransferKind, VllmFsLayout, VllmTransfers};
///
/// let dir = tempfile::tempdir()?;
/// let layout = VllmFsLayout::new(dir.path().join("llama_0123456789ab_r0"))?;
/// let region = PrimaryRegion::zeroed(4, 64)?;
/// region.write_block(1, &[9; 64])?;
/// let mut transfers = VllmTransfers::new(layout, region, 2, 2)?;
///
/// let key = vec![0xab, 0xcd, 0xef, 0, 0, 0, 0]; // block hash abcdef, group 0
/// transfers.submit(TransferKind::Store, 1, vec![key.clone()], &[1])?;
/// transfers.wait_idle(); // a scheduler polls `finished` instead
/// let stored = transfers.finished();
/// assert!(stored[0].succeeded());
///
/// transfers.submit(TransferKind::Load, 2, vec![key], &[3])?;
/// transfers.wait_idle();
/// assert!(transfers.finished()[0].succeeded());
/// assert_eq!(transfers.region().expect("running").read_block(3)?, vec![9; 64]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VllmTransfers {
    /// The rank directory or the rank prefix.
    pub(super) home: Home,
    /// `None` once shut down: the engine's memory is given back then.
    region: Option<Arc<PrimaryRegion>>,
    /// The region's blocks and bytes per block (kept past shutdown).
    shape: (usize, usize),
    /// `None` once shut down.
    pool: Option<IoPool>,
    jobs: SaveTracker<Job, CompletionTask>,
    /// Jobs submitted since the last `finished`: finished from the
    /// tracker's point of view (nothing more will be submitted for them),
    /// reported once their task is done.
    submitted: Vec<Job>,
    /// Temporary files swept (see [`sweep_stale_temps`](Self::sweep_stale_temps)).
    swept: Arc<AtomicUsize>,
    /// The byte budget, once [`set_budget`](Self::set_budget) set one.
    pub(super) budget: Option<Budget>,
    /// Changes for the lookups, while recorded (see `changes.rs`): stores
    /// reported by `finished` when there is no budget (with one, the
    /// budget's ledger logs them).
    pub(super) changes: Option<Changes>,
}

impl VllmTransfers {
    /// Transfers between `region` and `layout`'s rank directory, on
    /// `load_threads` threads that serve loads first and `store_threads`
    /// that serve stores first (each takes the other kind when its own has
    /// none; vLLM's fs tier has 16 of each by default). At least one thread
    /// in all.
    pub fn new(
        layout: VllmFsLayout,
        region: PrimaryRegion,
        load_threads: usize,
        store_threads: usize,
    ) -> Result<Self, TierError> {
        Self::at(Home::Dir(layout), region, load_threads, store_threads)
    }

    /// Transfers between `region` and `layout`'s rank prefix of an object
    /// store, as [`new`](Self::new) has them with a directory: each I/O
    /// thread has one request in flight at a time (a job's blocks go one
    /// after another), so `load_threads + store_threads` bounds the
    /// requests in flight, as does the layout's own bound. The requests run
    /// on a runtime of two threads of the transfers' own. Stores never
    /// leave a partial object (objects appear whole); a block already there
    /// is not written again.
    #[cfg(object_tier)]
    pub fn on_objects(
        layout: VllmObjectLayout,
        region: PrimaryRegion,
        load_threads: usize,
        store_threads: usize,
    ) -> Result<Self, TierError> {
        let bucket = super::home::Bucket::new(layout, 2).map_err(|source| {
            TierError::Config(format!("cannot start the object store's runtime: {source}"))
        })?;
        Self::at(
            Home::Bucket(Arc::new(bucket)),
            region,
            load_threads,
            store_threads,
        )
    }

    fn at(
        home: Home,
        region: PrimaryRegion,
        load_threads: usize,
        store_threads: usize,
    ) -> Result<Self, TierError> {
        // guard: H2-transfer-threads-capped
        match load_threads.checked_add(store_threads) {
            Some(0) => {
                return Err(TierError::Config(
                    "vLLM transfers need at least one I/O thread".into(),
                ));
            }
            Some(threads) if threads <= MAX_IO_THREADS => {}
            _ => {
                return Err(TierError::Config(format!(
                    "vLLM transfers run at most {MAX_IO_THREADS} I/O threads in all, \
                     not {load_threads} load + {store_threads} store threads"
                )));
            }
        }
        let pool = IoPool::with_lanes([load_threads, store_threads], "kvtier-vllm-io").map_err(
            |source| {
                TierError::io(
                    "start I/O threads for",
                    std::path::Path::new(&home.describe()),
                    source,
                )
            },
        )?;
        Ok(Self {
            home,
            shape: (region.blocks(), region.block_bytes()),
            region: Some(Arc::new(region)),
            pool: Some(pool),
            jobs: SaveTracker::new(),
            submitted: Vec::new(),
            swept: Arc::default(),
            budget: None,
            changes: None,
        })
    }

    /// Queues a sweep of the temporary files that writers which died
    /// mid-store left in the rank directory, last modified at least
    /// `older_than` ago (younger ones may be another live engine's). It
    /// runs on an I/O thread, behind the stores queued before it, so a
    /// start against a large directory does not wait for it; a shutdown
    /// treats it as a queued store. [`swept`](Self::swept) counts what it
    /// removed. On an object store it aborts the unfinished multipart
    /// uploads of the layout's blocks that began at least `older_than` ago
    /// instead (on the bucket's runtime, in the background).
    #[cfg_attr(not(object_tier), allow(clippy::infallible_destructuring_match))]
    pub fn sweep_stale_temps(&self, older_than: Duration) {
        let Some(pool) = &self.pool else { return };
        let layout = match &self.home {
            Home::Dir(layout) => layout,
            #[cfg(object_tier)]
            Home::Bucket(bucket) => {
                let (layout, swept) = (bucket.layout.clone(), self.swept.clone());
                // guard: O16-a-start-aborts-stale-uploads
                bucket.spawn(async move {
                    match layout.abort_stale_uploads(older_than).await {
                        Ok(report) => {
                            if report.aborted > 0 {
                                tracing::info!(aborted = report.aborted, prefix = layout.rank_prefix(), "aborted stale multipart uploads");
                            }
                            swept.fetch_add(report.aborted as usize, Ordering::Relaxed);
                        }
                        Err(error) => {
                            tracing::warn!(%error, prefix = layout.rank_prefix(), "cannot list the multipart uploads");
                        }
                    }
                });
                return;
            }
        };
        let (rank_dir, swept) = (layout.rank_dir().to_path_buf(), self.swept.clone());
        pool.submit_to(
            TransferKind::Store.lane(),
            Box::new(move || {
                let removed = sweep_temps(&rank_dir, BlockLayout::Vllm, older_than);
                if removed > 0 {
                    tracing::info!(removed, dir = %rank_dir.display(), "swept stale temporary block files");
                }
                swept.fetch_add(removed, Ordering::Relaxed);
            }),
        );
    }

    /// Temporary files the sweeps removed so far (on an object store:
    /// stale multipart uploads aborted).
    pub fn swept(&self) -> usize {
        self.swept.load(Ordering::Relaxed)
    }

    /// The rank directory's layout (`None` on an object store).
    pub fn layout(&self) -> Option<&VllmFsLayout> {
        match &self.home {
            Home::Dir(layout) => Some(layout),
            #[cfg(object_tier)]
            Home::Bucket(_) => None,
        }
    }

    /// The rank prefix's layout (`None` on a directory).
    #[cfg(object_tier)]
    pub fn object_layout(&self) -> Option<&VllmObjectLayout> {
        match &self.home {
            Home::Dir(_) => None,
            Home::Bucket(bucket) => Some(&bucket.layout),
        }
    }

    /// The primary region; `None` after [`shutdown`](Self::shutdown),
    /// which gives the memory back.
    pub fn region(&self) -> Option<&PrimaryRegion> {
        self.region.as_deref()
    }

    /// The primary region's blocks and bytes per block (also after
    /// shutdown).
    pub fn shape(&self) -> (usize, usize) {
        self.shape
    }

    /// Starts job `id`: `keys[i]` moves between the tier and block
    /// `blocks[i]` of the region. Never waits for I/O. A job that cannot run
    /// is reported as failed by a later [`finished`](Self::finished); only
    /// an id still in flight is refused here.
    pub fn submit(
        &mut self,
        kind: TransferKind,
        id: u64,
        keys: Vec<Vec<u8>>,
        blocks: &[usize],
    ) -> Result<(), TransferError> {
        let job = self.open(kind, id, keys)?;
        match self.start(&job, blocks) {
            Ok(task) => {
                self.jobs.submit(task, std::slice::from_ref(&job));
            }
            Err(error) => {
                tracing::warn!(?job, %error, "a vLLM transfer job was refused");
                self.jobs.submit_failed(std::slice::from_ref(&job), error);
            }
        }
        Ok(())
    }

    /// Takes job `id` without running it: the caller refused it (its own
    /// check failed, say), for `why`. It is reported as failed by the next
    /// [`finished`](Self::finished), with no block done, as a job that could
    /// not run is.
    pub fn refuse(
        &mut self,
        kind: TransferKind,
        id: u64,
        keys: Vec<Vec<u8>>,
        why: impl fmt::Display,
    ) -> Result<(), TransferError> {
        let job = self.open(kind, id, keys)?;
        self.jobs.submit_failed(std::slice::from_ref(&job), why);
        Ok(())
    }

    /// Records a new job, to be reported by `finished`.
    fn open(
        &mut self,
        kind: TransferKind,
        id: u64,
        keys: Vec<Vec<u8>>,
    ) -> Result<Job, TransferError> {
        let job = Job::new(id, kind, keys);
        // guard: V2-one-job-per-id-in-flight
        if self.jobs.is_tracked(&job) {
            return Err(TransferError::InFlight(id));
        }
        self.jobs.record(std::slice::from_ref(&job));
        self.submitted.push(job.clone());
        Ok(job)
    }

    /// Claims the job's blocks and queues its I/O.
    fn start(&self, job: &Job, blocks: &[usize]) -> Result<CompletionTask, TierError> {
        let (Some(pool), Some(region)) = (&self.pool, &self.region) else {
            return Err(TierError::Config(
                "the vLLM transfers were shut down".into(),
            ));
        };
        if job.keys.len() != blocks.len() {
            return Err(TierError::Config(format!(
                "{} keys for {} primary blocks",
                job.keys.len(),
                blocks.len()
            )));
        }
        let claim = region.claim(blocks, job.kind.access())?;
        let (task, completer) = CompletionTask::new(());
        let (home, job) = (self.home.clone(), job.clone());
        let budget = self.budget.as_ref().map(|budget| budget.books.clone());
        pool.submit_to(
            job.kind.lane(),
            Box::new(move || {
                let started = Instant::now();
                let result = transfer(&home, budget.as_ref(), &job, claim);
                let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                job.progress.nanos.store(nanos, Ordering::Relaxed);
                // The claim is given back (in `transfer`) before the task
                // completes: a reported job touches no block.
                completer.complete(result.map_err(|error| TaskError::Failed(Box::new(error))));
            }),
        );
        Ok(task)
    }

    /// The jobs that ended since the last call, each reported once. Never
    /// blocks.
    pub fn finished(&mut self) -> Vec<FinishedTransfer> {
        let finished: Vec<FinishedTransfer> = self
            .jobs
            .take_finished_outcomes(&mut self.submitted)
            .into_iter()
            .map(|(job, outcome)| FinishedTransfer {
                id: job.id,
                kind: job.kind,
                outcome,
                done: job.progress.done.load(Ordering::Acquire),
                io_time: Duration::from_nanos(job.progress.nanos.load(Ordering::Relaxed)),
                // Only an unbudgeted store notes blocks that were there:
                // a load's report (the scheduler's step) takes no lock.
                present: match job.kind {
                    TransferKind::Store => std::mem::take(&mut *job.progress.present.lock()),
                    TransferKind::Load => Vec::new(),
                },
                keys: job.keys,
            })
            .collect();
        self.note_stores(&finished);
        finished
    }

    /// Waits until no job's I/O touches the region; returns how many jobs
    /// it waited for. Their reports come with the next
    /// [`finished`](Self::finished). For vLLM's `drain_jobs` (a cache
    /// reset), not for the scheduler's step.
    pub fn wait_idle(&mut self) -> usize {
        self.jobs.wait_running()
    }

    /// Jobs of `kind` queued that no I/O thread has started.
    pub fn queued(&self, kind: TransferKind) -> usize {
        self.pool
            .as_ref()
            .map_or(0, |pool| pool.queued(kind.lane()))
    }

    /// Jobs submitted and not reported yet, in no particular order.
    pub fn in_flight(&self) -> Vec<InFlightTransfer> {
        self.jobs
            .tracked()
            .map(|job| InFlightTransfer {
                id: job.id,
                kind: job.kind,
                keys: job.keys.clone(),
            })
            .collect()
    }

    /// I/O threads still running (none after [`shutdown`](Self::shutdown)).
    pub fn threads_alive(&self) -> usize {
        self.pool.as_ref().map_or(0, IoPool::threads_alive)
    }

    /// Stops the transfers and gives the primary memory back:
    ///
    /// - queued loads are dropped at once (the engine that would use their
    ///   blocks is going away);
    /// - queued stores get `grace` to start, so the blocks a shutting-down
    ///   engine was still writing reach the tier; those still queued after
    ///   it are dropped;
    /// - running jobs finish, the I/O threads stop, and the region (and with
    ///   it the engine's buffer export) is released.
    ///
    /// Every dropped job is reported as failed by the next
    /// [`finished`](Self::finished); a job submitted afterwards fails.
    /// Returns what was dropped. Waits at most `grace` plus the longest
    /// single job.
    pub fn shutdown(&mut self, grace: Duration) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        if let Some(budget) = &mut self.budget {
            budget.stop_reconciling();
        }
        if let Some(pool) = self.pool.take() {
            // guard: V5-shutdown-drops-queued-loads
            report.loads_dropped = pool.discard_lanes(&[TransferKind::Load.lane()]);
            report.stores_dropped = pool.close_within(grace);
            drop(pool);
            self.jobs.wait_running();
        }
        // Every claim (each holds the region) was dropped with its job, run
        // or discarded: this is the region's last owner, and dropping it
        // releases the engine's memory.
        // guard: V7-shutdown-releases-the-primary-memory
        let region = self.region.take();
        debug_assert!(
            region
                .as_ref()
                .is_none_or(|region| Arc::strong_count(region) == 1),
            "V7: no claim outlives the transfers' shutdown"
        );
        drop(region);
        report
    }
}

/// What [`VllmTransfers::shutdown`] dropped (each reported as a failed job).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Loads queued at shutdown.
    pub loads_dropped: usize,
    /// Stores still queued when the grace time ran out.
    pub stores_dropped: usize,
}

impl Drop for VllmTransfers {
    /// A drop without [`shutdown`](VllmTransfers::shutdown) gives queued
    /// stores no grace: a drop should not block.
    fn drop(&mut self) {
        self.shutdown(Duration::ZERO);
    }
}

impl fmt::Debug for VllmTransfers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VllmTransfers")
            .field("home", &self.home.describe())
            .field("region", &self.region)
            .field("running", &self.jobs.running_tasks())
            .finish_non_exhaustive()
    }
}
