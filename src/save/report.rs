//! What workers report and how the scheduler side counts it: one report
//! per worker per request, checked.

use hashbrown::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use super::stats::{SaveLatency, SaveStats};

/// What one worker sends the scheduler after each step: the requests whose
/// saves are done ("finished sending"), each exactly once over the run, and
/// a snapshot of its counters and save latency. Made by
/// [`SaveTracker::finish_step`](crate::SaveTracker::finish_step) (or
/// [`new`](Self::new)), encoded by [`encode`](Self::encode) and taken by
/// [`ReportAggregator::accept`], which checks that each worker's reports
/// come one per step, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport<R> {
    /// The worker's index (its rank), below the aggregator's worker count.
    pub worker: u32,
    /// The step this report closes: the worker's reports are numbered like
    /// the steps, one each.
    pub step: u64,
    /// The requests whose saves on this worker are all done.
    pub finished: Vec<R>,
    /// The worker's counters after the step.
    pub stats: SaveStats,
    /// The worker's save latency histogram after the step.
    pub latency: SaveLatency,
}

impl<R> WorkerReport<R> {
    /// A report of `worker` closing `step`.
    pub fn new(
        worker: u32,
        step: u64,
        finished: Vec<R>,
        stats: SaveStats,
        latency: SaveLatency,
    ) -> Self {
        Self {
            worker,
            step,
            finished,
            stats,
            latency,
        }
    }
}

/// What a batch of finished-sending reports did: the requests whose blocks
/// may be freed now, and every report that was refused. A refusal never
/// undoes the reports accepted beside it, so no free is lost to a bad
/// report in the same batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the requests in `free` must have their blocks freed"]
pub struct Report<R: Debug> {
    /// Requests every expected report has now arrived for: free their blocks.
    pub free: Vec<R>,
    /// Reports refused, with why, in report order.
    pub refused: Vec<ReportError<R>>,
}

impl<R: Debug> Default for Report<R> {
    fn default() -> Self {
        Self {
            free: Vec::new(),
            refused: Vec::new(),
        }
    }
}

impl<R: Debug> Report<R> {
    /// Whether every report was accepted.
    pub fn is_clean(&self) -> bool {
        self.refused.is_empty()
    }
}

/// Why [`ReportAggregator::report`] or [`MultiConnector::finished_sending`](super::MultiConnector::finished_sending)
/// refused a report. For a `MultiConnector`, `worker` is the index of the
/// inner connector that reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError<R: Debug> {
    /// An aggregator for no workers: nobody could ever report, so no request
    /// would ever be freed.
    #[error("an aggregator needs at least one worker")]
    NoWorkers,
    /// More workers than [`ReportAggregator::MAX_WORKERS`]: every delayed
    /// request would cost a flag per worker, and no engine has that many.
    #[error("an aggregator counts at most {max} workers, not {workers}")]
    TooManyWorkers {
        /// The count given.
        workers: usize,
        /// [`ReportAggregator::MAX_WORKERS`].
        max: usize,
    },
    /// The worker index is not below the aggregator's worker count.
    #[error("worker {worker} does not exist ({workers} workers)")]
    NoSuchWorker {
        /// The index given.
        worker: usize,
        /// How many workers the aggregator counts.
        workers: usize,
    },
    /// A report for a request whose free was not delayed, or was already
    /// freed (S3).
    #[error("worker {worker} reported {request:?}, which nobody waits for")]
    Unexpected {
        /// The reporting worker.
        worker: usize,
        /// The request reported.
        request: R,
    },
    /// A second report of one request from one worker: counting it would
    /// free the blocks before another worker's save is done.
    #[error("worker {worker} reported {request:?} twice")]
    Duplicate {
        /// The reporting worker.
        worker: usize,
        /// The request reported.
        request: R,
    },
    /// A worker's report for another step than the one due from it: a
    /// report was lost (its requests would never be freed) or repeated.
    /// Nothing of the report was taken.
    #[error("worker {worker} sent its report for step {got} while step {expected} was due")]
    OutOfSequence {
        /// The reporting worker.
        worker: usize,
        /// The step whose report was due.
        expected: u64,
        /// The step the report closes.
        got: u64,
    },
}

/// Frees a request only when every worker reported it, like vLLM's output
/// aggregator under tensor parallelism — and, unlike a bare counter, rejects
/// a duplicate report from one worker and a report nobody expects, so tests
/// can prove each worker reports each delayed request exactly once.
///
/// ```
/// use kvtier::save::ReportAggregator;
///
/// let mut frees = ReportAggregator::new(2)?;
/// frees.expect(7u64); // request_finished(7) answered true
/// frees.expect(8u64);
/// assert!(frees.report(0, [7, 8])?.free.is_empty());
/// let report = frees.report(1, [7, 999, 7])?;
/// assert_eq!(report.free, vec![7]); // both workers reported 7: free it
/// assert_eq!(report.refused.len(), 2); // 999 nobody waits for; 7 twice
/// assert_eq!(frees.report(1, [8])?.free, vec![8]);
/// # Ok::<(), kvtier::save::ReportError<u64>>(())
/// ```
#[derive(Debug)]
pub struct ReportAggregator<R> {
    workers: usize,
    /// Which workers reported each expected request so far.
    waiting: HashMap<R, Vec<bool>>,
    /// Per worker, the step whose [`WorkerReport`] is due next.
    next_report: Vec<u64>,
    /// Per worker, the counters and latency of its last accepted report.
    last: Vec<Option<(SaveStats, SaveLatency)>>,
}

impl<R: Eq + Hash + Clone + Debug> ReportAggregator<R> {
    /// The most workers an aggregator counts (tensor- and pipeline-parallel
    /// ranks of one engine are far fewer). Each delayed request holds a flag
    /// per worker, so the bound is also what one request can cost.
    pub const MAX_WORKERS: usize = 4096;

    /// An aggregator for `workers` workers; [`ReportError::NoWorkers`] for
    /// none, [`ReportError::TooManyWorkers`] for more than
    /// [`MAX_WORKERS`](Self::MAX_WORKERS) (a caller's number never sizes an
    /// allocation unchecked).
    pub fn new(workers: usize) -> Result<Self, ReportError<R>> {
        // guard: S2-aggregator-needs-a-worker
        if workers == 0 {
            return Err(ReportError::NoWorkers);
        }
        // guard: H1-aggregator-workers-capped
        if workers > Self::MAX_WORKERS {
            return Err(ReportError::TooManyWorkers {
                workers,
                max: Self::MAX_WORKERS,
            });
        }
        Ok(Self {
            workers,
            waiting: HashMap::new(),
            next_report: vec![0; workers],
            last: vec![None; workers],
        })
    }

    /// Takes one worker's [`WorkerReport`] for the step due from it: its
    /// finished requests go through [`report`](Self::report), its stats are
    /// kept ([`worker_stats`](Self::worker_stats)). A report for another
    /// step is [`ReportError::OutOfSequence`] (a lost or repeated report) and
    /// a report from a worker that does not exist
    /// [`ReportError::NoSuchWorker`]; neither takes anything.
    ///
    /// ```
    /// use kvtier::save::{ReportAggregator, ReportError, SaveLatency, SaveStats, WorkerReport};
    ///
    /// let mut frees = ReportAggregator::new(1)?;
    /// frees.expect(7u64);
    /// let report = |step, finished| {
    ///     WorkerReport::new(0, step, finished, SaveStats::default(), SaveLatency::default())
    /// };
    /// assert!(frees.accept(report(0, vec![]))?.free.is_empty());
    /// assert!(matches!(
    ///     frees.accept(report(2, vec![7])), // step 1's report was lost
    ///     Err(ReportError::OutOfSequence { expected: 1, got: 2, .. })
    /// ));
    /// assert_eq!(frees.accept(report(1, vec![7]))?.free, vec![7]);
    /// # Ok::<(), ReportError<u64>>(())
    /// ```
    pub fn accept(&mut self, report: WorkerReport<R>) -> Result<Report<R>, ReportError<R>> {
        let worker = report.worker as usize;
        if worker >= self.workers {
            return Err(ReportError::NoSuchWorker {
                worker,
                workers: self.workers,
            });
        }
        let expected = self.next_report[worker];
        // guard: S2-reports-in-sequence
        if report.step != expected {
            return Err(ReportError::OutOfSequence {
                worker,
                expected,
                got: report.step,
            });
        }
        self.next_report[worker] += 1;
        self.last[worker] = Some((report.stats, report.latency));
        self.report(worker, report.finished)
    }

    /// The step whose report is due next from `worker` (`None` for a
    /// worker that does not exist).
    pub fn next_report(&self, worker: usize) -> Option<u64> {
        self.next_report.get(worker).copied()
    }

    /// The counters and save latency of `worker`'s last accepted
    /// [`WorkerReport`]; `None` before its first or for a worker that does
    /// not exist.
    pub fn worker_stats(&self, worker: usize) -> Option<(SaveStats, SaveLatency)> {
        self.last.get(worker).copied().flatten()
    }

    /// Every worker's save latency, merged: what a back-pressure policy
    /// reads its quantiles from.
    pub fn latency(&self) -> SaveLatency {
        let mut merged = SaveLatency::default();
        for (_, latency) in self.last.iter().flatten() {
            merged.merge(latency);
        }
        merged
    }

    /// Expects a report of `request` from every worker (its free was delayed).
    /// Returns false if it was already expected.
    pub fn expect(&mut self, request: R) -> bool {
        if self.waiting.contains_key(&request) {
            return false;
        }
        self.waiting.insert(request, vec![false; self.workers]);
        true
    }

    /// Takes one worker's reports: returns the requests every worker has
    /// now reported (free them), in report order, with the reports refused
    /// (a request nobody waits for, a second report from this worker). Every
    /// report is looked at; a refused one never swallows the others, so no
    /// free is lost. An error only for a worker that does not exist, and
    /// then nothing was taken.
    pub fn report(
        &mut self,
        worker: usize,
        reported: impl IntoIterator<Item = R>,
    ) -> Result<Report<R>, ReportError<R>> {
        if worker >= self.workers {
            return Err(ReportError::NoSuchWorker {
                worker,
                workers: self.workers,
            });
        }
        let mut report = Report::default();
        for request in reported {
            let Some(seen) = self.waiting.get_mut(&request) else {
                report
                    .refused
                    // guard: S3-aggregator-keeps-the-batch
                    .push(ReportError::Unexpected { worker, request });
                continue;
            };
            if seen[worker] {
                report
                    .refused
                    .push(ReportError::Duplicate { worker, request });
                continue;
            }
            seen[worker] = true;
            if seen.iter().all(|reported| *reported) {
                self.waiting.remove(&request);
                report.free.push(request);
            }
        }
        Ok(report)
    }

    /// Requests still waiting for some worker's report.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether `request` waits for reports.
    pub fn is_waiting(&self, request: &R) -> bool {
        self.waiting.contains_key(request)
    }
}
