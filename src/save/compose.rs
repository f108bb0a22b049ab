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
/// connector's "delay the free" — the bug the seed change fixed, where an
/// outer connector did not forward the call and blocks were freed while the
/// inner connector's save still read them. [`MultiConnector`] forwards to
/// every inner connector.
///
/// A wrapper that forgets to answer does not compile:
///
/// ```compile_fail,E0046
/// use kvtier::{SaveScheduler, SchedulerConnector};
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
/// use kvtier::{SaveScheduler, SchedulerConnector};
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
/// once per delaying connector, and [`finished_sending`](Self::finished_sending)
/// frees it when the last of those reports arrived.
///
/// Worker side: `get_finished` asks every inner connector and returns all
/// their reports (one per reporting connector), for `finished_sending`.
///
/// ```
/// use kvtier::{MultiConnector, SaveScheduler, SchedulerConnector};
///
/// let mut local = SaveScheduler::new();
/// let mut remote = SaveScheduler::new();
/// local.record_step([(1u64, 2)]);
/// remote.record_step([(1u64, 2), (2, 1)]);
///
/// let mut both = MultiConnector::new(vec![local, remote]);
/// assert!(both.request_finished(&1)); // both delay: two reports expected
/// assert!(both.request_finished(&2)); // only `remote` delays
/// assert_eq!(both.finished_sending([1]), Vec::<u64>::new());
/// assert_eq!(both.finished_sending([2, 1]), vec![2, 1]);
/// ```
#[derive(Debug)]
pub struct MultiConnector<C, R> {
    inner: Vec<C>,
    /// Reports still expected per delayed request.
    outstanding: HashMap<R, usize>,
    unexpected_reports: u64,
}

impl<C, R: Eq + Hash + Clone + Debug> MultiConnector<C, R> {
    /// Combines `inner`, in the order their reports are collected.
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

    /// Scheduler side: takes the reports of the workers' `get_finished` and
    /// returns the requests whose blocks may be freed now — those every
    /// delaying inner connector has reported — in report order. A report
    /// nobody expects is dropped, counted and logged: freeing on it could
    /// release blocks of a request that never delayed, or twice.
    pub fn finished_sending(&mut self, reported: impl IntoIterator<Item = R>) -> Vec<R> {
        let mut free = Vec::new();
        for request in reported {
            match self.outstanding.get_mut(&request) {
                Some(left) if *left > 1 => *left -= 1,
                Some(_) => {
                    self.outstanding.remove(&request);
                    free.push(request);
                }
                None => {
                    self.unexpected_reports += 1;
                    tracing::warn!(
                        ?request,
                        "a finished-sending report nobody expected; ignored"
                    );
                }
            }
        }
        free
    }

    /// Requests whose free is delayed and not yet complete.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Reports `finished_sending` ignored because nobody expected them.
    pub fn unexpected_reports(&self) -> u64 {
        self.unexpected_reports
    }
}

impl<C, R> SchedulerConnector<R> for MultiConnector<C, R>
where
    C: SchedulerConnector<R>,
    R: Eq + Hash + Clone + Debug,
{
    fn request_finished(&mut self, request: &R) -> bool {
        let delaying = self
            .inner
            .iter_mut()
            .map(|connector| connector.request_finished(request))
            .filter(|delay| *delay)
            .count();
        if delaying > 0 {
            *self.outstanding.entry(request.clone()).or_default() += delaying;
        }
        delaying > 0
    }
}

impl<C, R> WorkerConnector<R> for MultiConnector<C, R>
where
    C: WorkerConnector<R>,
    R: Eq + Hash + Clone + Debug,
{
    fn get_finished(&mut self, finished: &[R]) -> Vec<R> {
        self.inner
            .iter_mut()
            .flat_map(|connector| connector.get_finished(finished))
            .collect()
    }
}

/// Why [`ReportAggregator::report`] refused a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError<R: Debug> {
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
/// use kvtier::ReportAggregator;
///
/// let mut frees = ReportAggregator::new(2);
/// frees.expect(7u64); // request_finished(7) answered true
/// assert_eq!(frees.report(0, [7])?, Vec::<u64>::new());
/// assert!(frees.report(0, [7]).is_err()); // worker 0 again: rejected
/// assert_eq!(frees.report(1, [7])?, vec![7]); // both workers: free
/// # Ok::<(), kvtier::ReportError<u64>>(())
/// ```
#[derive(Debug)]
pub struct ReportAggregator<R> {
    workers: usize,
    /// Which workers reported each expected request so far.
    waiting: HashMap<R, Vec<bool>>,
}

impl<R: Eq + Hash + Clone + Debug> ReportAggregator<R> {
    /// An aggregator for `workers` workers (at least one is counted).
    pub fn new(workers: usize) -> Self {
        Self {
            workers: workers.max(1),
            waiting: HashMap::new(),
        }
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

    /// Takes one worker's reports; returns the requests every worker has now
    /// reported (free them), in report order. Stops at the first refused
    /// report and returns its error; reports before it were taken.
    pub fn report(
        &mut self,
        worker: usize,
        reported: impl IntoIterator<Item = R>,
    ) -> Result<Vec<R>, ReportError<R>> {
        if worker >= self.workers {
            return Err(ReportError::NoSuchWorker {
                worker,
                workers: self.workers,
            });
        }
        let mut free = Vec::new();
        for request in reported {
            let Some(seen) = self.waiting.get_mut(&request) else {
                return Err(ReportError::Unexpected { worker, request });
            };
            if seen[worker] {
                return Err(ReportError::Duplicate { worker, request });
            }
            seen[worker] = true;
            if seen.iter().all(|reported| *reported) {
                self.waiting.remove(&request);
                free.push(request);
            }
        }
        Ok(free)
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
