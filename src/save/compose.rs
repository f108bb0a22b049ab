//! Connector composition: the connector traits and [`MultiConnector`].

use hashbrown::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use super::report::{Report, ReportError};
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

    /// Whether this connector owes a report of `request`: it delays the
    /// request's free and has not reported it yet. A [`MultiConnector`]
    /// asks every inner connector this when `request` finishes, to know
    /// whose reports to fold into the worker's one report.
    fn will_report(&self, request: &R) -> bool;
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

    fn will_report(&self, request: &R) -> bool {
        self.is_tracked(request)
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

    fn will_report(&self, request: &R) -> bool {
        (**self).will_report(request)
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
/// Worker side, two ways:
/// - as a [`WorkerConnector`], it **folds** its inner connectors' reports
///   into one per request: when a request finishes it notes which inner
///   connectors owe a report ([`WorkerConnector::will_report`]), and
///   reports the request once every one of them has. This is what an
///   aggregator expecting exactly one report per worker (vLLM's) needs;
/// - [`get_finished_each`](Self::get_finished_each) returns the inner
///   reports tagged with their index instead, for a scheduler-side
///   `MultiConnector` to fold with [`finished_sending`](Self::finished_sending).
///
/// One `MultiConnector` value is either the scheduler's or a worker's: the
/// two sides keep their owed reports in the same map.
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

impl Owed {
    /// What a connector owes for a request it does (or does not) delay.
    fn if_delayed(delays: bool) -> Self {
        if delays { Self::Report } else { Self::Nothing }
    }
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

impl<C, R> WorkerConnector<R> for MultiConnector<C, R>
where
    C: WorkerConnector<R>,
    R: Eq + Hash + Clone + Debug,
{
    /// One report per request for the whole worker: a finished request is
    /// reported once every inner connector that owed a report of it when it
    /// finished has reported it; an inner report nobody owes is refused
    /// (counted in [`unexpected_reports`](MultiConnector::unexpected_reports)
    /// and logged), never passed on.
    ///
    /// ```
    /// use kvtier::{SaveScheduler, SaveTracker, StoreTask, save::{MultiConnector, TaskError, WorkerConnector}};
    ///
    /// struct Done;
    /// impl StoreTask for Done {
    ///     fn check(&self) -> bool { true }
    ///     fn wait(self) -> Result<(), TaskError> { Ok(()) }
    /// }
    ///
    /// // Two save paths in one worker (a local and a remote store), each with
    /// // its tracker; only the first saves request 2.
    /// let (mut local, mut remote) = (SaveScheduler::new(), SaveScheduler::new());
    /// let mut worker = MultiConnector::new(vec![SaveTracker::<u64, Done>::new(), SaveTracker::new()]);
    /// worker.inner_mut()[0].begin_step(&local.record_step([(1, 4), (2, 4)]))?;
    /// worker.inner_mut()[1].begin_step(&remote.record_step([(1, 4)]))?;
    /// worker.inner_mut()[0].submit(Done, &[1, 2]);
    ///
    /// // Request 1 is reported once, though both paths delayed it.
    /// assert_eq!(worker.get_finished(&[1, 2]), vec![2, 1]);
    /// assert!(worker.get_finished(&[]).is_empty());
    /// # Ok::<(), kvtier::save::StepError>(())
    /// ```
    fn get_finished(&mut self, finished: &[R]) -> Vec<R> {
        for request in finished {
            if self.outstanding.contains_key(request) {
                continue;
            }
            // Asked before the inner connectors see `finished`: one that
            // reports the request in this very call forgets it then.
            let owed: Vec<Owed> = self
                .inner
                .iter()
                .map(|connector| Owed::if_delayed(connector.will_report(request)))
                .collect();
            if owed.contains(&Owed::Report) {
                self.outstanding.insert(request.clone(), owed);
            }
        }
        let reports = self.get_finished_each(finished);
        // guard: S2-fold-waits-for-every-path
        self.finished_sending(reports).free
    }

    fn will_report(&self, request: &R) -> bool {
        self.outstanding.contains_key(request)
            || self
                .inner
                .iter()
                .any(|connector| connector.will_report(request))
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
            .map(|connector| Owed::if_delayed(connector.request_finished(request)))
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
