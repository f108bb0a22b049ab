//! The sans-IO bookkeeping of one worker's saves.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;

use hashbrown::{HashMap, HashSet};

use super::stats::SaveStats;
use super::task::{TaskError, TaskId};

/// Above this many requests per task, duplicates are found with a set.
const DEDUPE_BY_SCAN: usize = 16;

/// How a task ended, as far as the counters care.
#[derive(Debug)]
pub(crate) enum Ended<'e> {
    /// `wait` returned this.
    Returned(&'e Result<(), TaskError>),
    /// `wait` panicked (the task value was dropped while unwinding).
    Panicked,
}

/// How a task left the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// A non-blocking check found it complete.
    Reaped,
    /// It was waited for.
    Waited,
}

/// Which requests delay their free, which tasks read whose blocks, which
/// finished requests wait for tasks. Pure bookkeeping: it never touches a
/// task, so the tracker decides what to check and wait, and this decides
/// what may be reported.
#[derive(Debug)]
pub(crate) struct SaveLedger<R> {
    next_task: u64,
    /// Recorded requests not reported yet, with whether they have finished.
    recorded: HashMap<R, bool>,
    /// Finished recorded requests not reported yet, in the order they
    /// finished (so reports come out in a deterministic order).
    finishing: Vec<R>,
    /// Running tasks and the requests whose blocks each reads.
    tasks: BTreeMap<TaskId, Vec<R>>,
    /// The reverse of `tasks`: every id with at least one running task,
    /// recorded or not (the preemption fence covers both).
    by_request: HashMap<R, Vec<TaskId>>,
    stats: SaveStats,
}

impl<R: Eq + Hash + Clone + Debug> SaveLedger<R> {
    pub(crate) fn new() -> Self {
        Self {
            next_task: 0,
            recorded: HashMap::new(),
            finishing: Vec::new(),
            tasks: BTreeMap::new(),
            by_request: HashMap::new(),
            stats: SaveStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> SaveStats {
        self.stats
    }

    /// Records a step's saving requests: from now on their free is delayed.
    pub(crate) fn begin_step<'r>(&mut self, requests: impl IntoIterator<Item = &'r R>)
    where
        R: 'r,
    {
        self.stats.steps += 1;
        for request in requests {
            if !self.recorded.contains_key(request) {
                self.recorded.insert(request.clone(), false);
                self.stats.recorded += 1;
            }
        }
    }

    /// Opens a task reading the blocks of `requests` (duplicates ignored).
    pub(crate) fn open_task(&mut self, requests: &[R]) -> TaskId {
        let task = TaskId(self.next_task);
        self.next_task += 1;
        self.stats.tasks_submitted += 1;
        let mut members: Vec<R> = Vec::with_capacity(requests.len());
        // Duplicates are dropped by a scan for the usual handful of
        // requests, by a set for a large batch (no quadratic blow-up).
        let mut seen = (requests.len() > DEDUPE_BY_SCAN).then(HashSet::new);
        for request in requests {
            let duplicate = match &mut seen {
                Some(seen) => !seen.insert(request),
                None => members.contains(request),
            };
            if duplicate {
                continue;
            }
            if !self.recorded.contains_key(request) {
                self.stats.unrecorded_saves += 1;
                tracing::warn!(
                    ?request, %task,
                    "save submitted for a request no step recorded: the scheduler will not delay its free"
                );
            }
            self.by_request
                .entry(request.clone())
                .or_default()
                .push(task);
            members.push(request.clone());
        }
        self.tasks.insert(task, members);
        task
    }

    /// A submission the store refused: nothing runs, the requests stay
    /// recorded and are reported when they finish.
    pub(crate) fn submit_failed(&mut self) {
        self.stats.submit_failures += 1;
    }

    /// Removes a task that no longer reads anything. Returns false for a task
    /// that is not running (a tracker bug; the tracker asserts it).
    pub(crate) fn close_task(&mut self, task: TaskId, how: Closed, ended: Ended<'_>) -> bool {
        let Some(members) = self.tasks.remove(&task) else {
            return false;
        };
        for request in &members {
            if let Some(running) = self.by_request.get_mut(request) {
                running.retain(|t| *t != task);
                if running.is_empty() {
                    self.by_request.remove(request);
                }
            }
        }
        match how {
            Closed::Reaped => self.stats.tasks_reaped += 1,
            Closed::Waited => self.stats.tasks_waited += 1,
        }
        match ended {
            Ended::Returned(Ok(())) => {}
            Ended::Returned(Err(TaskError::Failed(_))) => self.stats.task_failures += 1,
            Ended::Returned(Err(TaskError::TimedOut)) => self.stats.task_timeouts += 1,
            Ended::Returned(Err(TaskError::Abandoned)) => self.stats.tasks_abandoned += 1,
            Ended::Panicked => self.stats.task_panics += 1,
        }
        true
    }

    /// Counts a panic caught in a task's `check` (one in `wait` is counted
    /// by [`close_task`](Self::close_task)).
    pub(crate) fn check_panicked(&mut self) {
        self.stats.task_panics += 1;
    }

    /// Counts a preemption fence.
    pub(crate) fn count_fence(&mut self) {
        self.stats.preemption_fences += 1;
    }

    /// Notes finished requests; only recorded ones will be reported. Returns
    /// the requests that started finishing with this call.
    pub(crate) fn finish<'r>(&mut self, finished: impl IntoIterator<Item = &'r R>) -> Vec<R>
    where
        R: 'r,
    {
        let mut started = Vec::new();
        for request in finished {
            match self.recorded.get_mut(request) {
                // guard: S3-untracked-not-reported
                None => self.stats.not_delayed += 1,
                // guard: S2-report-once
                Some(true) => self.stats.repeated_finishes += 1,
                Some(done) => {
                    *done = true;
                    self.finishing.push(request.clone());
                    started.push(request.clone());
                }
            }
        }
        started
    }

    /// The running tasks that read blocks of any of `requests`, ascending.
    pub(crate) fn tasks_of<'r>(&self, requests: impl IntoIterator<Item = &'r R>) -> Vec<TaskId>
    where
        R: 'r,
    {
        let mut tasks: Vec<TaskId> = requests
            .into_iter()
            .filter_map(|request| self.by_request.get(request))
            .flatten()
            .copied()
            .collect();
        tasks.sort_unstable();
        tasks.dedup();
        tasks
    }

    /// The running tasks of the finished requests not reported yet.
    pub(crate) fn tasks_of_finishing(&self) -> Vec<TaskId> {
        self.tasks_of(&self.finishing)
    }

    /// Every running task, ascending.
    pub(crate) fn running(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.tasks.keys().copied()
    }

    pub(crate) fn running_count(&self) -> usize {
        self.tasks.len()
    }

    /// Takes the finished requests none of whose tasks is running (S1), in
    /// the order they finished; each leaves the ledger, so it is reported
    /// once (S2).
    pub(crate) fn take_reportable(&mut self) -> Vec<R> {
        let mut reportable = Vec::new();
        let by_request = &self.by_request;
        let recorded = &mut self.recorded;
        self.finishing.retain(|request| {
            // guard: S1-report-while-running
            // guard: S2-deferred-remembered
            if by_request.contains_key(request) {
                return true;
            }
            recorded.remove(request);
            reportable.push(request.clone());
            false
        });
        self.stats.reported += reportable.len() as u64;
        reportable
    }

    /// Counts finished requests a call could not report yet.
    pub(crate) fn defer(&mut self, count: usize) {
        self.stats.deferred += count as u64;
    }

    /// Whether `request` is recorded and not reported yet.
    pub(crate) fn is_recorded(&self, request: &R) -> bool {
        self.recorded.contains_key(request)
    }

    /// Whether `request` has finished and waits for a task.
    pub(crate) fn is_finishing(&self, request: &R) -> bool {
        self.recorded.get(request) == Some(&true)
    }

    pub(crate) fn recorded_count(&self) -> usize {
        self.recorded.len()
    }

    pub(crate) fn finishing(&self) -> &[R] {
        &self.finishing
    }

    /// Checks the ledger's internal consistency; for tests and models.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        for (task, members) in &self.tasks {
            for request in members {
                let listed = self
                    .by_request
                    .get(request)
                    .is_some_and(|tasks| tasks.contains(task));
                if !listed {
                    return Err(format!(
                        "{task} reads {request:?} but the reverse index misses it"
                    ));
                }
            }
        }
        for (request, tasks) in &self.by_request {
            if tasks.is_empty() {
                return Err(format!("{request:?} has an empty task list"));
            }
            for task in tasks {
                if !self.tasks.get(task).is_some_and(|m| m.contains(request)) {
                    return Err(format!("{request:?} lists {task}, which does not read it"));
                }
            }
        }
        let finished = self.recorded.values().filter(|done| **done).count();
        if finished != self.finishing.len() {
            return Err(format!(
                "{finished} recorded requests are finished but {} are queued for report",
                self.finishing.len()
            ));
        }
        for request in &self.finishing {
            if self.recorded.get(request) != Some(&true) {
                return Err(format!("{request:?} is queued for report but not finished"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger_with_task() -> (SaveLedger<u64>, TaskId) {
        let mut ledger = SaveLedger::new();
        ledger.begin_step(&[1, 2]);
        let task = ledger.open_task(&[1, 2, 1]);
        (ledger, task)
    }

    #[test]
    fn a_task_lists_each_request_once_and_closes_once() {
        let (mut ledger, task) = ledger_with_task();
        assert_eq!(ledger.tasks[&task], vec![1, 2]);
        assert_eq!(ledger.tasks_of(&[2]), vec![task]);
        assert!(ledger.close_task(task, Closed::Reaped, Ended::Returned(&Ok(()))));
        assert!(!ledger.close_task(task, Closed::Reaped, Ended::Returned(&Ok(()))));
        assert!(ledger.tasks_of(&[1, 2]).is_empty());
        assert_eq!(ledger.stats().tasks_reaped, 1);
        ledger.check_invariants().unwrap();
    }

    #[test]
    fn tasks_of_is_ascending_and_deduplicated() {
        let mut ledger = SaveLedger::new();
        ledger.begin_step(&[1, 2]);
        let a = ledger.open_task(&[2]);
        let b = ledger.open_task(&[1, 2]);
        let c = ledger.open_task(&[1]);
        assert_eq!(ledger.tasks_of(&[1, 2]), vec![a, b, c]);
        assert_eq!(ledger.tasks_of(&[1]), vec![b, c]);
        assert_eq!(ledger.running().collect::<Vec<_>>(), vec![a, b, c]);
    }

    #[test]
    fn check_invariants_finds_a_missing_reverse_entry() {
        let (mut ledger, _) = ledger_with_task();
        ledger.by_request.remove(&2);
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("reverse index"), "{why}");
    }

    #[test]
    fn check_invariants_finds_a_reverse_entry_without_its_task() {
        let (mut ledger, task) = ledger_with_task();
        ledger.tasks.get_mut(&task).unwrap().retain(|r| *r != 1);
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("does not read it"), "{why}");
    }

    #[test]
    fn check_invariants_finds_an_empty_task_list() {
        let (mut ledger, _) = ledger_with_task();
        ledger.by_request.insert(9, Vec::new());
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("empty task list"), "{why}");
    }

    #[test]
    fn check_invariants_finds_finished_requests_missing_from_the_queue() {
        let (mut ledger, _) = ledger_with_task();
        ledger.recorded.insert(1, true);
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("queued for report"), "{why}");
        ledger.recorded.insert(1, false);
        ledger.finishing.push(1);
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("queued for report"), "{why}");
        ledger.recorded.insert(2, true);
        let why = ledger.check_invariants().unwrap_err();
        assert!(why.contains("not finished"), "{why}");
    }

    #[test]
    fn every_ending_is_counted_under_its_own_counter() {
        let mut ledger: SaveLedger<u64> = SaveLedger::new();
        let endings = [
            Ended::Returned(&Ok(())),
            Ended::Returned(&Err(TaskError::TimedOut)),
            Ended::Returned(&Err(TaskError::Abandoned)),
            Ended::Panicked,
        ];
        for ended in endings {
            let task = ledger.open_task(&[]);
            assert!(ledger.close_task(task, Closed::Waited, ended));
        }
        let failed = Err(TaskError::failed("x"));
        let task = ledger.open_task(&[]);
        ledger.close_task(task, Closed::Waited, Ended::Returned(&failed));
        let stats = ledger.stats();
        assert_eq!(
            (
                stats.task_failures,
                stats.task_timeouts,
                stats.tasks_abandoned,
                stats.task_panics
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(stats.tasks_waited, 5);
    }
}
