//! The sans-IO bookkeeping of one worker's saves: the one owner of every
//! running task, of the requests each reads, and of the counters.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

use hashbrown::{HashMap, HashSet};

use super::ending::{Check, Closed, Closing, Ended};
use super::running::{OneOrMany, Running};
use super::stats::{SaveLatency, SaveStats};
use super::step_error::StepError;
use super::task::{SaveOutcome, TaskError, TaskId};

/// Above this many requests per task, duplicates are found with a set.
const DEDUPE_BY_SCAN: usize = 16;

/// A running task: the value that holds its handle, and the requests whose
/// blocks it reads.
#[derive(Debug)]
struct Open<R, T> {
    task: T,
    members: OneOrMany<R>,
    /// When it was opened (submitted).
    opened: Instant,
    /// Its check panicked once (counted and logged then, not again).
    check_panicked: bool,
}

/// Whether a step recorded a request, as far as the ledger knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recorded {
    /// No step recorded it (it may still have running tasks: a save the
    /// scheduler did not announce).
    No,
    /// Recorded, not finished: its free is delayed.
    Saving,
    /// Recorded and finished, queued for report.
    Finished,
}

/// What the ledger knows of one request. An entry lives while the request
/// is recorded or has a running task.
#[derive(Debug)]
struct RequestState {
    recorded: Recorded,
    /// The running tasks reading its blocks; `None` when none is.
    tasks: Option<OneOrMany<TaskId>>,
    /// A task reading its blocks ended badly, or a save for it was
    /// refused: reported as [`SaveOutcome::Failed`].
    failed: bool,
}

impl RequestState {
    /// Whether a running task reads its blocks.
    fn has_tasks(&self) -> bool {
        self.tasks.is_some()
    }

    /// Marks a recorded request finished. Returns how it was recorded
    /// before (`No` for a request the ledger does not hold): only a
    /// `Saving` one changes.
    fn finish(state: Option<&mut Self>) -> Recorded {
        match state {
            Some(state) if state.recorded == Recorded::Saving => {
                state.recorded = Recorded::Finished;
                Recorded::Saving
            }
            Some(state) => state.recorded,
            None => Recorded::No,
        }
    }
}

/// Which requests delay their free, which tasks read whose blocks, which
/// finished requests wait for tasks. Pure bookkeeping over task values of
/// any type `T`: it never calls a task itself, so the tracker decides how
/// to check and wait one (the I/O), and this decides what may be reported.
#[derive(Debug)]
pub(crate) struct SaveLedger<R, T> {
    next_task: u64,
    /// The sequence number of the step to take next.
    next_step: u64,
    /// Every request recorded and not reported yet, and every request with
    /// a running task (recorded or not: the preemption fence covers both),
    /// with both facts. One map, so a submit finds both in one probe.
    requests: HashMap<R, RequestState>,
    /// Entries of `requests` that are recorded.
    recorded: usize,
    /// Finished recorded requests not reported yet, in the order they
    /// finished (so reports come out in a deterministic order).
    finishing: Vec<R>,
    /// Running tasks, each with the requests whose blocks it reads, in id
    /// order; `requests` holds the reverse.
    tasks: Running<Open<R, T>>,
    stats: SaveStats,
    /// How long closed tasks ran, from open to close.
    latency: SaveLatency,
}

impl<R, T> SaveLedger<R, T> {
    /// How many tasks are running.
    pub(crate) fn running_count(&self) -> usize {
        self.tasks.len()
    }
}

impl<R: Eq + Hash + Clone + Debug, T> SaveLedger<R, T> {
    pub(crate) fn new() -> Self {
        Self {
            next_task: 0,
            next_step: 0,
            requests: HashMap::new(),
            recorded: 0,
            finishing: Vec::new(),
            tasks: Running::default(),
            stats: SaveStats::default(),
            latency: SaveLatency::default(),
        }
    }

    pub(crate) fn stats(&self) -> SaveStats {
        self.stats
    }

    pub(crate) fn latency(&self) -> SaveLatency {
        self.latency
    }

    /// The sequence number of the step to take next.
    pub(crate) fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Whether step `step` is the one to take next; nothing changes either
    /// way.
    pub(crate) fn expect_step(&self, step: u64) -> Result<(), StepError> {
        let expected = self.next_step;
        match step.cmp(&expected) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Greater => Err(StepError::Skipped {
                expected,
                got: step,
            }),
            std::cmp::Ordering::Less => Err(StepError::Repeated {
                expected,
                got: step,
            }),
        }
    }

    /// Records a step's saving requests: from now on their free is delayed.
    /// The step is the one [`expect_step`](Self::expect_step) accepted.
    pub(crate) fn begin_step<'r>(&mut self, requests: impl IntoIterator<Item = &'r R>)
    where
        R: 'r,
    {
        self.stats.steps += 1;
        self.next_step += 1;
        self.record(requests);
    }

    /// Records saving requests: from now on their free is delayed. A
    /// request recorded already is left as it is.
    pub(crate) fn record<'r>(&mut self, requests: impl IntoIterator<Item = &'r R>)
    where
        R: 'r,
    {
        for request in requests {
            match self.requests.get_mut(request) {
                Some(state) if state.recorded != Recorded::No => continue,
                Some(state) => state.recorded = Recorded::Saving,
                None => {
                    let state = RequestState {
                        recorded: Recorded::Saving,
                        tasks: None,
                        failed: false,
                    };
                    self.requests.insert(request.clone(), state);
                }
            }
            self.recorded += 1;
            self.stats.recorded += 1;
        }
    }

    /// Opens `task` at `now`, reading the blocks of `requests` (duplicates
    /// ignored); the ledger holds it until it is closed.
    pub(crate) fn open_task(&mut self, requests: &[R], task_value: T, now: Instant) -> TaskId {
        let task = TaskId(self.next_task);
        self.next_task += 1;
        self.stats.tasks_submitted += 1;
        let members = if let [request] = requests {
            self.link(request, task);
            OneOrMany::One(request.clone())
        } else {
            let mut members: Vec<R> = Vec::with_capacity(requests.len());
            // Duplicates are dropped by a scan for the usual handful of
            // requests, by a set for a large batch (no quadratic blow-up).
            let mut seen = (requests.len() > DEDUPE_BY_SCAN).then(HashSet::new);
            for request in requests {
                let duplicate = match &mut seen {
                    Some(seen) => !seen.insert(request),
                    None => members.contains(request),
                };
                if !duplicate {
                    self.link(request, task);
                    members.push(request.clone());
                }
            }
            OneOrMany::Many(members)
        };
        self.tasks.push(
            task,
            Open {
                task: task_value,
                members,
                opened: now,
                check_panicked: false,
            },
        );
        task
    }

    /// Lists `task` among the running tasks of `request`: one probe for a
    /// recorded request, the usual case.
    fn link(&mut self, request: &R, task: TaskId) {
        let recorded = match self.requests.get_mut(request) {
            Some(state) => {
                match &mut state.tasks {
                    Some(tasks) => tasks.push(task),
                    None => state.tasks = Some(OneOrMany::One(task)),
                }
                state.recorded != Recorded::No
            }
            None => {
                let state = RequestState {
                    recorded: Recorded::No,
                    tasks: Some(OneOrMany::One(task)),
                    failed: false,
                };
                self.requests.insert(request.clone(), state);
                false
            }
        };
        if !recorded {
            self.stats.unrecorded_saves += 1;
            tracing::warn!(
                ?request, %task,
                "save submitted for a request no step recorded: the scheduler will not delay its free"
            );
        }
    }

    /// A submission for `requests` the store refused: nothing runs, the
    /// requests stay recorded and are reported, as failed, when they finish.
    pub(crate) fn submit_failed(&mut self, requests: &[R])
    where
        R: Eq + Hash,
    {
        self.stats.submit_failures += 1;
        for request in requests {
            if let Some(state) = self.requests.get_mut(request) {
                // guard: S13-refused-save-is-a-failure
                state.failed = true;
            }
        }
    }

    /// Checks every running task with `check`, in ascending id order, and
    /// appends the complete ones to `done`. A task whose check panicked
    /// stays running (a poll never waits): it is checked again later and
    /// waited by the next fence or `wait_all`; its panic is counted and
    /// logged once.
    pub(crate) fn check_running(
        &mut self,
        mut check: impl FnMut(&T) -> Check,
        done: &mut Vec<(TaskId, usize)>,
    ) {
        for (id, at, open) in self.tasks.iter_mut() {
            match check(&open.task) {
                Check::Running => {}
                Check::Complete => done.push((id, at)),
                // guard: S14-interrupted-check-stops
                Check::Interrupted => return,
                // guard: S9-poll-never-waits
                Check::Panicked(message) => {
                    if !open.check_panicked {
                        open.check_panicked = true;
                        self.stats.task_panics += 1;
                        tracing::error!(task = %id, panic = %message, "a save task's check panicked; it stays running until a check succeeds or a fence or wait_all waits for it");
                    }
                }
            }
        }
    }

    /// Closes a running task: hands its value to `wait` (which consumes it,
    /// releasing its handle, and says how and when it ended), then removes
    /// the task from every request it read. Returns false for a task that is
    /// not running. `hint`: where `check_running` saw it, if it did.
    #[cfg(test)]
    pub(crate) fn close_task(
        &mut self,
        task: TaskId,
        hint: Option<usize>,
        how: Closed,
        wait: impl FnOnce(T) -> (Ended, Instant),
    ) -> bool {
        self.try_close_task(task, hint, how, |value| Ok(wait(value))) == Closing::Closed
    }

    /// [`close_task`](Self::close_task) with a wait that may be interrupted
    /// before the task's I/O is over: it then hands the task value back,
    /// and the task stays running, linked to its requests as before.
    pub(crate) fn try_close_task(
        &mut self,
        task: TaskId,
        hint: Option<usize>,
        how: Closed,
        wait: impl FnOnce(T) -> Result<(Ended, Instant), T>,
    ) -> Closing {
        let Some(Open {
            task: value,
            members,
            opened,
            check_panicked,
        }) = self.tasks.remove(task, hint)
        else {
            return Closing::NotRunning;
        };
        let (ended, at) = match wait(value) {
            Ok(ended) => ended,
            Err(value) => {
                // guard: S14-interrupted-wait-keeps-the-task
                self.tasks.restore(
                    task,
                    Open {
                        task: value,
                        members,
                        opened,
                        check_panicked,
                    },
                );
                return Closing::Kept;
            }
        };
        self.latency.record(at.saturating_duration_since(opened));
        let failed = !matches!(ended, Ended::Returned(Ok(())));
        // guard: S2-failed-wait-closes-task
        self.unlink(task, members.as_slice(), failed);
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
        Closing::Closed
    }

    /// Removes `task` from the running tasks of each of its `members`
    /// (marking them failed when the task `failed`); a request left with
    /// neither a task nor a record leaves the ledger.
    fn unlink(&mut self, task: TaskId, members: &[R], failed: bool) {
        for request in members {
            let Some(state) = self.requests.get_mut(request) else {
                continue;
            };
            // guard: S13-failed-task-fails-its-requests
            state.failed |= failed;
            if let Some(running) = &mut state.tasks
                && running.remove(&task)
            {
                state.tasks = None;
                if state.recorded == Recorded::No {
                    self.requests.remove(request);
                }
            }
        }
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
            match RequestState::finish(self.requests.get_mut(request)) {
                // guard: S3-untracked-not-reported
                Recorded::No => self.stats.not_delayed += 1,
                // guard: S2-report-once
                Recorded::Finished => self.stats.repeated_finishes += 1,
                Recorded::Saving => {
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
            .filter_map(|request| self.requests.get(request)?.tasks.as_ref())
            .flat_map(OneOrMany::as_slice)
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
        self.tasks.iter().map(|(id, _)| id)
    }

    /// Hands `emit` the finished requests none of whose tasks is running
    /// (S1), in the order they finished, each with how its saves went; each
    /// leaves the ledger, so it is reported once (S2). Returns how many.
    pub(crate) fn take_reportable(&mut self, mut emit: impl FnMut(R, SaveOutcome)) -> usize {
        let mut reported = 0;
        let requests = &mut self.requests;
        self.finishing.retain(|request| {
            // guard: S1-report-while-running
            // guard: S2-deferred-remembered
            if requests.get(request).is_some_and(RequestState::has_tasks) {
                return true;
            }
            let outcome = match requests.remove(request) {
                Some(state) if state.failed => SaveOutcome::Failed,
                _ => SaveOutcome::Saved,
            };
            emit(request.clone(), outcome);
            reported += 1;
            false
        });
        self.recorded -= reported;
        self.stats.reported += reported as u64;
        reported
    }

    /// Reports what [`take_reportable`](Self::take_reportable) gives, and
    /// counts how many of `started` (the requests that started finishing
    /// in this call) must still wait for a task.
    pub(crate) fn report(&mut self, started: &[R], emit: impl FnMut(R, SaveOutcome)) {
        self.take_reportable(emit);
        let left = started
            .iter()
            .filter(|request| self.is_finishing(request))
            .count();
        self.stats.deferred += left as u64;
    }

    /// Whether `request` is recorded and not reported yet.
    pub(crate) fn is_recorded(&self, request: &R) -> bool {
        self.recorded_as(request)
            .is_some_and(|recorded| recorded != Recorded::No)
    }

    fn recorded_as(&self, request: &R) -> Option<Recorded> {
        self.requests.get(request).map(|state| state.recorded)
    }

    /// Whether `request` has finished and waits for a task.
    pub(crate) fn is_finishing(&self, request: &R) -> bool {
        self.recorded_as(request) == Some(Recorded::Finished)
    }

    /// The requests recorded and not reported yet.
    pub(crate) fn recorded(&self) -> impl Iterator<Item = &R> + '_ {
        self.requests
            .iter()
            .filter(|(_, state)| state.recorded != Recorded::No)
            .map(|(request, _)| request)
    }

    pub(crate) fn recorded_count(&self) -> usize {
        self.recorded
    }

    pub(crate) fn finishing(&self) -> &[R] {
        &self.finishing
    }

    /// Checks the ledger's internal consistency; for tests and models.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        for (task, open) in self.tasks.iter() {
            for request in open.members.as_slice() {
                let listed = self
                    .requests
                    .get(request)
                    .and_then(|state| state.tasks.as_ref())
                    .is_some_and(|tasks| tasks.contains(&task));
                if !listed {
                    return Err(format!(
                        "{task} reads {request:?} but the reverse index misses it"
                    ));
                }
            }
        }
        let mut recorded = 0;
        let mut finished = 0;
        for (request, state) in &self.requests {
            match state.recorded {
                Recorded::No if state.tasks.is_none() => {
                    return Err(format!("{request:?} is kept with no record and no task"));
                }
                Recorded::No => {}
                Recorded::Saving => recorded += 1,
                Recorded::Finished => {
                    recorded += 1;
                    finished += 1;
                }
            }
            let Some(tasks) = &state.tasks else { continue };
            if tasks.as_slice().is_empty() {
                return Err(format!("{request:?} has an empty task list"));
            }
            for &task in tasks.as_slice() {
                if !self
                    .tasks
                    .get(task)
                    .is_some_and(|open| open.members.contains(request))
                {
                    return Err(format!("{request:?} lists {task}, which does not read it"));
                }
            }
        }
        if recorded != self.recorded {
            return Err(format!(
                "{recorded} requests are recorded but the count says {}",
                self.recorded
            ));
        }
        if finished != self.finishing.len() {
            return Err(format!(
                "{finished} recorded requests are finished but {} are queued for report",
                self.finishing.len()
            ));
        }
        for request in &self.finishing {
            if !self.is_finishing(request) {
                return Err(format!("{request:?} is queued for report but not finished"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
