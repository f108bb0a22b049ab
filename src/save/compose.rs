//! Connector composition and multi-worker report aggregation.

use hashbrown::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use super::scheduler::SaveScheduler;
use super::task::StoreTask;
use super::tracker::SaveTracker;

/// The scheduler side of a KV connector, as far as freeing blocks goes.
///
/// `request_finished` has no default on purpose: a connector that wraps
/// another must say what it answers, so it cannot silently drop the inner
/// connector's "delay the free" (an outer connector that does not forward
/// the call frees blocks while the inner connector's save still reads
/// them). [`MultiConnector`] forwards to every inner connector.
///
/// A wrapper that forgets to answer does not compile:
///
/// ```compile_fail,E0046
/// use kvtier::{SaveScheduler, save::SchedulerConnector};
///
/// struct Outer {
///     inner: SaveScheduler<u64>,
/// }
///
/// impl SchedulerConnector<u64> for Outer {} // error: `request_finished` missing
/// ```
///
/// It has to say what it answers, and forwarding is one line:
///
/// ```
/// use kvtier::{SaveScheduler, save::SchedulerConnector};
///
/// struct Outer {
///     inner: SaveScheduler<u64>,
/// }
///
/// impl SchedulerConnector<u64> for Outer {
///     fn request_finished(&mut self, request: &u64) -> bool {
///         self.inner.request_finished(request)
///     }
/// }
///
/// let mut outer = Outer { inner: SaveScheduler::new() };
/// outer.inner.record_step([(1, 2)]);
/// assert!(outer.request_finished(&1));
/// ```
pub trait SchedulerConnector<R> {
    /// Called exactly once when `request` finishes, before its blocks are
    /// freed. True means the connector takes responsibility: the blocks stay
    /// allocated until the workers report `request` as finished sending.
    fn request_finished(&mut self, request: &R) -> bool;
}

/// The worker side of a KV connector, as far as freeing blocks goes.
pub trait WorkerConnector<R> {
    /// Called every step with the requests that finished since the last call
    /// (each passed once); returns the requests whose saves are done
    /// ("finished sending"), each exactly once.
    fn get_finished(&mut self, finished: &[R]) -> Vec<R>;
}

impl<R: Eq + Hash + Clone + Debug> SchedulerConnector<R> for SaveScheduler<R> {
    fn request_finished(&mut self, request: &R) -> bool {
        SaveScheduler::request_finished(self, request)
    }
}

impl<R: Eq + Hash + Clone + Debug, T: StoreTask> WorkerConnector<R> for SaveTracker<R, T> {
    fn get_finished(&mut self, finished: &[R]) -> Vec<R> {
        SaveTracker::get_finished(self, finished)
    }
}

impl<R, C: SchedulerConnector<R> + ?Sized> SchedulerConnector<R> for Box<C> {
    fn request_finished(&mut self, request: &R) -> bool {
        (**self).request_finished(request)
    }
}

impl<R, C: WorkerConnector<R> + ?Sized> WorkerConnector<R> for Box<C> {
    fn get_finished(&mut self, finished: &[R]) -> Vec<R> {
        (**self).get_finished(finished)
    }
}

/// Several connectors acting as one (vLLM's `MultiConnector` pattern).
///
/// Scheduler side: `request_finished` is forwarded to **every** inner
/// connector (no short-circuit: each must forget the request), and the free
/// is delayed when any of them delays it. The request is then expected back
/// once from each delaying connector, and
/// [`finished_sending`](Self::finished_sending) frees it when each of those
/// has reported it. Reports carry the index of the connector that made them,
/// so one connector reporting a request twice can never stand in for
/// another's report.
///
/// Worker side: [`get_finished_each`](Self::get_finished_each) asks every
/// inner connector and returns their reports tagged with its index.
///
/// ```
/// use kvtier::{save::MultiConnector, SaveScheduler, save::SchedulerConnector};
///
/// let mut local = SaveScheduler::new();
/// let mut remote = SaveScheduler::new();
/// local.record_step([(1u64, 2)]);
/// remote.record_step([(1u64, 2), (2, 1)]);
///
/// let mut both = MultiConnector::new(vec![local, remote]);
/// assert!(both.request_finished(&1)); // both delay: a report from each expected
/// assert!(both.request_finished(&2)); // only `remote` (index 1) delays
/// assert!(both.finished_sending([(0, 1)]).free.is_empty());
/// let report = both.finished_sending([(1, 2), (0, 1)]);
/// assert_eq!(report.free, vec![2]);
/// assert_eq!(report.refused.len(), 1); // connector 0 reported 1 twice
/// assert_eq!(both.finished_sending([(1, 1)]).free, vec![1]);
/// ```
#[derive(Debug)]
pub struct MultiConnector<C, R> {
    inner: Vec<C>,
    /// Per delayed request, what each inner connector owes.
    outstanding: HashMap<R, Vec<Owed>>,
    unexpected_reports: u64,
}

/// What one inner connector owes for a delayed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    /// It did not delay the request: a report from it is unexpected.
    Nothing,
    /// It delayed the request and has not reported it yet.
    Report,
    /// It reported the request: another report from it is a duplicate.
    Reported,
}

impl<C, R: Eq + Hash + Clone + Debug> MultiConnector<C, R> {
    /// Combines `inner`; a connector's index in this list is how its
    /// reports are told apart.
    pub fn new(inner: Vec<C>) -> Self {
        Self {
            inner,
            outstanding: HashMap::new(),
            unexpected_reports: 0,
        }
    }

    /// The inner connectors.
    pub fn inner(&self) -> &[C] {
        &self.inner
    }

    /// The inner connectors, mutably (to record steps, submit saves).
    pub fn inner_mut(&mut self) -> &mut [C] {
        &mut self.inner
    }

    /// Scheduler side: takes `(connector index, request)` reports (from the
    /// workers' [`get_finished_each`](Self::get_finished_each)) and returns
    /// the requests whose blocks may be freed now — those every delaying
    /// inner connector has reported — in report order, with the reports it
    /// refused: from a connector that did not delay the request, a second
    /// report from one connector, a report nobody expects (freeing on any of
    /// them could release blocks a save still reads, or twice). Refusals are
    /// counted and logged; they never undo an accepted report.
    pub fn finished_sending(
        &mut self,
        reported: impl IntoIterator<Item = (usize, R)>,
    ) -> Report<R> {
        let mut report = Report::default();
        for (connector, request) in reported {
            let refusal = match self.outstanding.get_mut(&request) {
                _ if connector >= self.inner.len() => Some(ReportError::NoSuchWorker {
                    worker: connector,
                    workers: self.inner.len(),
                }),
                None => Some(ReportError::Unexpected {
                    worker: connector,
                    request,
                }),
                Some(owed) => match owed[connector] {
                    Owed::Nothing => Some(ReportError::Unexpected {
                        worker: connector,
                        request,
                    }),
                    // guard: S2-multi-counts-per-connector
                    Owed::Reported => Some(ReportError::Duplicate {
                        worker: connector,
                        request,
                    }),
                    Owed::Report => {
                        owed[connector] = Owed::Reported;
                        if !owed.contains(&Owed::Report) {
                            self.outstanding.remove(&request);
                            report.free.push(request);
                        }
                        None
                    }
                },
            };
            if let Some(refusal) = refusal {
                self.unexpected_reports += 1;
                tracing::warn!(%refusal, "a finished-sending report refused");
                report.refused.push(refusal);
            }
        }
        report
    }

    /// Requests whose free is delayed and not yet complete.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Reports `finished_sending` refused.
    pub fn unexpected_reports(&self) -> u64 {
        self.unexpected_reports
    }
}

impl<C, R> MultiConnector<C, R>
where
    C: WorkerConnector<R>,
    R: Eq + Hash + Clone + Debug,
{
    /// Worker side: asks every inner connector for its finished requests
    /// (each gets the same `finished` list) and returns their reports as
    /// `(connector index, request)`, connector by connector, for
    /// [`finished_sending`](Self::finished_sending).
    pub fn get_finished_each(&mut self, finished: &[R]) -> Vec<(usize, R)> {
        let mut reports = Vec::new();
        for (index, connector) in self.inner.iter_mut().enumerate() {
            reports.extend(
                connector
                    .get_finished(finished)
                    .into_iter()
                    .map(|request| (index, request)),
            );
        }
        reports
    }
}

impl<C, R> SchedulerConnector<R> for MultiConnector<C, R>
where
    C: SchedulerConnector<R>,
    R: Eq + Hash + Clone + Debug,
{
    fn request_finished(&mut self, request: &R) -> bool {
        let owed: Vec<Owed> = self
            // guard: S6-multi-forwards-to-all
            .inner
            .iter_mut()
            .map(|connector| match connector.request_finished(request) {
                true => Owed::Report,
                false => Owed::Nothing,
            })
            .collect();
        if !owed.contains(&Owed::Report) {
            return false;
        }
        match self.outstanding.entry(request.clone()) {
            hashbrown::hash_map::Entry::Vacant(vacant) => {
                vacant.insert(owed);
            }
            // Finished again before every report arrived (a caller bug): a
            // connector that delays again owes one more report, which the
            // merged entry cannot count, so it is owed once; none is dropped.
            hashbrown::hash_map::Entry::Occupied(mut occupied) => {
                for (old, new) in occupied.get_mut().iter_mut().zip(owed) {
                    if new == Owed::Report {
                        *old = Owed::Report;
                    }
                }
            }
        }
        true
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

/// Why [`ReportAggregator::report`] or [`MultiConnector::finished_sending`]
/// refused a report. For a `MultiConnector`, `worker` is the index of the
/// inner connector that reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError<R: Debug> {
    /// An aggregator for no workers: nobody could ever report, so no request
    /// would ever be freed.
    #[error("an aggregator needs at least one worker")]
    NoWorkers,
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
}

impl<R: Eq + Hash + Clone + Debug> ReportAggregator<R> {
    /// An aggregator for `workers` workers; [`ReportError::NoWorkers`] for
    /// none.
    pub fn new(workers: usize) -> Result<Self, ReportError<R>> {
        // guard: S2-aggregator-needs-a-worker
        if workers == 0 {
            return Err(ReportError::NoWorkers);
        }
        Ok(Self {
            workers,
            waiting: HashMap::new(),
        })
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
