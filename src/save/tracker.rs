//! The worker-side tracker: a [`SaveLedger`] and the one thing it does not
//! do itself, calling the tasks it holds (their `check` and `wait`).

use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::mem;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use super::ending::{Check, Closed, Closing, Ended};
use super::ledger::SaveLedger;
use super::report::WorkerReport;
use super::scheduler::SaveStep;
use super::stats::{SaveLatency, SaveStats};
use super::step_error::StepError;
use super::task::{Interrupted, SaveOutcome, StoreTask, TaskId};
use crate::fault::take_panic;
use crate::invariant::InvariantViolation;

/// How [`SaveTracker::get_finished`] treats finished requests whose saves are
/// still running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompletionMode {
    /// Report the finished requests whose tasks are all complete; remember
    /// the others and report each in a later call once its tasks are done.
    /// `get_finished` never blocks.
    #[default]
    NonBlocking,
    /// Wait for the tasks of the finished requests, then report them all (the
    /// reference behaviour; `get_finished` blocks on the store).
    Blocking,
}

/// One worker's deferred save completion.
///
/// Saves run asynchronously; a finished request's blocks may be released
/// only after every save reading them is done. Each step the worker:
///
/// 1. calls [`begin_step`](Self::begin_step) with the scheduler's
///    [`SaveStep`] — first, before the forward pass and before any early
///    return, so that every worker (including one that saves nothing
///    itself) tracks the same requests; this also runs the preemption fence
///    for the step's preempted requests;
/// 2. [`submit`](Self::submit)s its save tasks (one per step, or one per
///    layer), or calls [`submit_failed`](Self::submit_failed) when the store
///    refuses one; neither blocks;
/// 3. calls [`get_finished`](Self::get_finished) with the requests that
///    finished (the step's [`finished`](SaveStep::finished) list, or the
///    engine's own), and hands the returned ids to the scheduler, which may
///    now free their blocks.
///
/// [`handle_preemptions`](Self::handle_preemptions) is the fence on its own,
/// for engines that pass preemptions outside the step, and
/// [`poll`](Self::poll) reaps completed tasks at any time.
///
/// Every task is checked without blocking and waited exactly once; its
/// handle is released when the task value is dropped, right after that wait.
/// A failed submission, a failed wait and a timeout are counted and logged,
/// and the request is still reported: its blocks never leak.
///
/// A task whose [`try_check`](StoreTask::try_check) or
/// [`try_wait`](StoreTask::try_wait) is interrupted stays running, and the
/// call stops there: a fence does not pass, a step is not taken
/// ([`StepError::Interrupted`]), nothing is reported by that call (the
/// finished requests are remembered for the next); the cause waits in
/// [`take_interruption`](Self::take_interruption).
///
/// ```
/// use kvtier::{SaveScheduler, SaveTracker, StoreTask, save::TaskError};
///
/// struct Instant; // a save the store completed at once
/// impl StoreTask for Instant {
///     fn check(&self) -> bool { true }
///     fn wait(self) -> Result<(), TaskError> { Ok(()) }
/// }
///
/// let mut scheduler = SaveScheduler::new();
/// let mut worker = SaveTracker::new();
///
/// // Step 1: request 7 saves 4 blocks, request 8 saves none.
/// let step = scheduler.record_step([(7u64, 4), (8, 0)]);
/// worker.begin_step(&step)?;
/// worker.submit(Instant, &[7]);
///
/// // Both finish: only 7 delays its free, and only 7 is reported.
/// assert!(scheduler.request_finished(&7));
/// assert!(!scheduler.request_finished(&8));
/// assert_eq!(worker.get_finished(&[7, 8]), vec![7]);
///
/// // Steps are taken in sequence: one taken twice is refused.
/// assert!(worker.begin_step(&step).is_err());
/// # Ok::<(), kvtier::save::StepError>(())
/// ```
pub struct SaveTracker<R, T> {
    /// Every running task and what it reads. Ordered by id, so `poll`
    /// checks tasks in id order: deterministic, which the model checkers
    /// need (they replay schedules), and no sort.
    ledger: SaveLedger<R, T>,
    mode: CompletionMode,
    /// `poll`'s list of tasks to close (and where they are), kept for its
    /// allocation.
    done: Vec<(TaskId, usize)>,
    /// The first interruption not taken yet.
    interrupted: Option<Interrupted>,
}

impl<R, T> Default for SaveTracker<R, T>
where
    R: Eq + Hash + Clone + Debug,
    T: StoreTask,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<R, T> SaveTracker<R, T>
where
    R: Eq + Hash + Clone + Debug,
    T: StoreTask,
{
    /// A tracker whose `get_finished` never blocks ([`CompletionMode::NonBlocking`]).
    pub fn new() -> Self {
        Self::with_mode(CompletionMode::NonBlocking)
    }

    /// A tracker with the given completion mode.
    pub fn with_mode(mode: CompletionMode) -> Self {
        Self {
            ledger: SaveLedger::new(),
            mode,
            done: Vec::new(),
            interrupted: None,
        }
    }

    /// Why the last call stopped early, if a task's check or wait was
    /// interrupted (see [`Interrupted`]); taking it clears it.
    pub fn take_interruption(&mut self) -> Option<Interrupted> {
        self.interrupted.take()
    }

    /// Whether a call stopped early and its cause was not taken.
    pub fn is_interrupted(&self) -> bool {
        self.interrupted.is_some()
    }

    fn interrupt(&mut self, cause: Interrupted) {
        self.interrupted.get_or_insert(cause);
    }

    /// The completion mode.
    pub fn mode(&self) -> CompletionMode {
        self.mode
    }

    /// Takes the scheduler's next [`SaveStep`]: runs the preemption fence
    /// for its [`preempted`](SaveStep::preempted) requests (see
    /// [`handle_preemptions`](Self::handle_preemptions)), then records its
    /// saving requests, whose free stays delayed until this tracker reports
    /// them.
    ///
    /// Steps must come in sequence, starting at 0: a step that skips one, or
    /// one already taken, is refused with a [`StepError`] and changes
    /// nothing. Taking a step after a lost one would drop the lost step's
    /// saving requests, whose blocks the scheduler keeps until this worker
    /// reports them (S6 across a process boundary).
    pub fn begin_step(&mut self, step: &SaveStep<R>) -> Result<(), StepError> {
        // guard: S6-steps-in-sequence
        self.ledger.expect_step(step.step())?;
        if !step.preempted().is_empty() {
            // guard: S5-step-drives-the-fence
            self.handle_preemptions(step.preempted());
            // guard: S14-interrupted-fence-takes-no-step
            if self.is_interrupted() {
                return Err(StepError::Interrupted);
            }
        }
        // guard: S6-worker-records-the-step
        self.ledger.begin_step(step.requests());
        Ok(())
    }

    /// The sequence number of the step [`begin_step`](Self::begin_step)
    /// expects next.
    pub fn next_step(&self) -> u64 {
        self.ledger.next_step()
    }

    /// Takes over a submitted task that reads the blocks of `requests`.
    /// Never blocks; the task is reaped by a later [`poll`](Self::poll), or
    /// waited for by a fence or a blocking `get_finished`.
    pub fn submit(&mut self, task: T, requests: &[R]) -> TaskId {
        // guard: S4-task-kept-until-waited
        self.ledger.open_task(requests, task, Instant::now())
    }

    /// A save for `requests` that the store refused. Nothing reads their
    /// blocks, so they are reported as soon as they finish. `error` (which
    /// may own the refused task's handle) is logged and dropped here.
    pub fn submit_failed(&mut self, requests: &[R], error: impl Display) {
        self.ledger.submit_failed(requests);
        tracing::warn!(?requests, %error, "the store refused a save; the requests will be reported when they finish");
    }

    /// Reaps every task whose non-blocking check says it is complete; returns
    /// how many.
    pub fn poll(&mut self) -> usize {
        // Checked in place (no copy of the running set), in ascending id
        // order, and closed afterwards in the same order.
        let mut done = mem::take(&mut self.done);
        let mut interrupted = None;
        self.ledger.check_running(
            |task| match panic::catch_unwind(AssertUnwindSafe(|| task.try_check())) {
                Ok(Ok(false)) => Check::Running,
                Ok(Ok(true)) => Check::Complete,
                Ok(Err(cause)) => {
                    interrupted = Some(cause);
                    Check::Interrupted
                }
                Err(payload) => Check::Panicked(take_panic(payload)),
            },
            &mut done,
        );
        if let Some(cause) = interrupted {
            self.interrupt(cause);
        }
        // Every task reaped here was found complete by this poll: one clock
        // reading times them all.
        let seen_complete = (!done.is_empty()).then(Instant::now);
        let mut reaped = 0;
        for (id, at) in done.drain(..) {
            if !self.close_at(id, Some(at), Closed::Reaped, seen_complete) {
                break;
            }
            reaped += 1;
        }
        done.clear();
        self.done = done;
        reaped
    }

    /// Reports the finished requests whose saves are all done. `finished`
    /// lists the requests that finished since the last call, each once;
    /// requests that never saved are ignored.
    ///
    /// [`NonBlocking`](CompletionMode::NonBlocking): reaps completed tasks,
    /// reports every finished request (from this call or an earlier one) none
    /// of whose tasks is still running, and remembers the rest for a later
    /// call. [`Blocking`](CompletionMode::Blocking): first waits for every
    /// task reading a finished request's blocks (a task shared with
    /// unfinished requests is waited once, whole), so all are reported now.
    ///
    /// Every returned id was recorded by a step, and no task reading its
    /// blocks is still running; every recorded id is returned exactly once.
    pub fn get_finished(&mut self, finished: &[R]) -> Vec<R> {
        let mut reported = Vec::new();
        self.finished_into(finished, |request, _| reported.push(request));
        reported
    }

    /// [`get_finished`](Self::get_finished), with how each reported
    /// request's saves went: [`SaveOutcome::Failed`] when a task reading its
    /// blocks ended badly or a save of them was refused. For an owner that
    /// acts on a failed save (a tier that reports its transfer jobs).
    ///
    /// ```
    /// use kvtier::save::{CompletionTask, SaveOutcome, TaskError};
    /// use kvtier::SaveTracker;
    ///
    /// let mut jobs = SaveTracker::new();
    /// jobs.record(&[1u64, 2]); // two transfer jobs, their own scheduler
    /// let (good, done) = CompletionTask::new(());
    /// let (bad, failed) = CompletionTask::new(());
    /// jobs.submit(good, &[1]);
    /// jobs.submit(bad, &[2]);
    /// done.succeed();
    /// failed.fail(TaskError::failed("disk full"));
    /// assert_eq!(
    ///     jobs.get_finished_outcomes(&[1, 2]),
    ///     vec![(1, SaveOutcome::Saved), (2, SaveOutcome::Failed)],
    /// );
    /// ```
    pub fn get_finished_outcomes(&mut self, finished: &[R]) -> Vec<(R, SaveOutcome)> {
        let mut reported = Vec::new();
        self.finished_into(finished, |request, outcome| {
            reported.push((request, outcome))
        });
        reported
    }

    /// [`get_finished_outcomes`](Self::get_finished_outcomes) of the
    /// requests in `submitted`, which it then empties, its allocation kept
    /// for the next step's: how a driver that reports every job it
    /// submitted (vLLM's transfers, the KV copier) takes its reports.
    pub fn take_finished_outcomes(&mut self, submitted: &mut Vec<R>) -> Vec<(R, SaveOutcome)> {
        let reported = self.get_finished_outcomes(submitted);
        submitted.clear();
        reported
    }

    fn finished_into(&mut self, finished: &[R], emit: impl FnMut(R, SaveOutcome)) {
        let started = self.ledger.finish(finished);
        // guard: S1-blocking-mode-waits
        if self.mode == CompletionMode::Blocking {
            for id in self.ledger.tasks_of_finishing() {
                if !self.close(id, Closed::Waited) {
                    // Interrupted: the finished requests stay remembered.
                    return;
                }
            }
        }
        self.poll();
        // guard: S14-interrupted-call-reports-nothing
        if self.is_interrupted() {
            return;
        }
        self.ledger.report(&started, emit);
    }

    /// Ends a step on this worker: reports the requests of the step's
    /// [`finished`](SaveStep::finished) list (and earlier ones) whose saves
    /// are done, as [`get_finished`](Self::get_finished) does, in a
    /// [`WorkerReport`] for the scheduler's
    /// [`ReportAggregator::accept`](crate::save::ReportAggregator::accept),
    /// with this tracker's counters and latency. Call it once per step taken
    /// by [`begin_step`](Self::begin_step), with that step.
    pub fn finish_step(&mut self, worker: u32, step: &SaveStep<R>) -> WorkerReport<R> {
        let finished = self.get_finished(step.finished());
        WorkerReport::new(worker, step.step(), finished, self.stats(), self.latency())
    }

    /// The preemption fence: waits for every task that reads blocks of a
    /// `preempted` request, and for no other. When it returns, the scheduler
    /// may overwrite those blocks. The requests stay tracked (a preempted
    /// request resumes and finishes later). Returns how many tasks it waited.
    pub fn handle_preemptions(&mut self, preempted: &[R]) -> usize {
        // guard: S5-fence-only-preempted
        let fenced = self.ledger.tasks_of(preempted);
        // guard: S5-fence-waits-preempted
        for (waited, id) in fenced.iter().enumerate() {
            if !self.close(*id, Closed::Waited) {
                return waited;
            }
        }
        self.ledger.count_fence();
        fenced.len()
    }

    /// Waits for every running task and reports every finished request; for
    /// an orderly shutdown. Requests that have not finished stay tracked.
    pub fn wait_all(&mut self) -> Vec<R> {
        self.wait_running();
        let mut reported = Vec::new();
        if self.is_interrupted() {
            return reported;
        }
        self.ledger
            .take_reportable(|request, _| reported.push(request));
        reported
    }

    /// Waits for every running task and reports nothing: the finished
    /// requests are reported by the next `get_finished`. Afterwards no task
    /// of this tracker touches any block. Returns how many tasks it waited.
    pub fn wait_running(&mut self) -> usize {
        let running: Vec<TaskId> = self.ledger.running().collect();
        for (waited, id) in running.iter().enumerate() {
            if !self.close(*id, Closed::Waited) {
                return waited;
            }
        }
        running.len()
    }

    /// Records `requests` as a step would, outside the step sequence: their
    /// free is delayed until this tracker reports them. For an owner that is
    /// its own scheduler, in one process, such as a tier reporting its
    /// transfer jobs; a worker of a [`SaveScheduler`](crate::SaveScheduler)
    /// takes its steps with [`begin_step`](Self::begin_step) instead. No
    /// preemption fence runs.
    pub fn record(&mut self, requests: &[R]) {
        self.ledger.record(requests);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SaveStats {
        self.ledger.stats()
    }

    /// How long the closed tasks took, from [`submit`](Self::submit) to the
    /// poll, fence or wait that closed them (a histogram; see
    /// [`SaveLatency`](crate::save::SaveLatency)). Kept apart from
    /// [`stats`](Self::stats), whose counters are deterministic.
    pub fn latency(&self) -> SaveLatency {
        self.ledger.latency()
    }

    /// Tasks submitted and not yet reaped or waited.
    pub fn running_tasks(&self) -> usize {
        self.ledger.running_count()
    }

    /// Requests recorded and not yet reported.
    pub fn tracked_requests(&self) -> usize {
        self.ledger.recorded_count()
    }

    /// Whether `request` delays its free on this worker: recorded by a step
    /// and not reported yet.
    pub fn is_tracked(&self, request: &R) -> bool {
        self.ledger.is_recorded(request)
    }

    /// The requests recorded and not reported yet, in no particular order.
    pub fn tracked(&self) -> impl Iterator<Item = &R> + '_ {
        self.ledger.recorded()
    }

    /// Finished requests waiting for their tasks, in the order they finished.
    pub fn deferred_requests(&self) -> &[R] {
        self.ledger.finishing()
    }

    /// The running tasks reading blocks of `request`, ascending.
    pub fn tasks_of(&self, request: &R) -> Vec<TaskId> {
        self.ledger.tasks_of([request])
    }

    /// Checks the tracker's internal consistency (every task accounted for
    /// once, the reverse index exact); for tests and models, not part of the
    /// stable API.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_structure().map_err(InvariantViolation)
    }

    fn check_structure(&self) -> Result<(), String> {
        self.ledger.check_invariants()
    }

    /// Waits for (or, after a complete check, reaps) one task and closes it:
    /// the task value is consumed by `wait`, which releases its handle.
    /// False when the wait was interrupted: the task stays running.
    fn close(&mut self, id: TaskId, how: Closed) -> bool {
        self.close_at(id, None, how, None)
    }

    /// [`close`](Self::close), with where the task is in the ledger if
    /// known, and when it was seen complete if it was (else the clock is
    /// read once `wait` returns).
    fn close_at(
        &mut self,
        id: TaskId,
        hint: Option<usize>,
        how: Closed,
        seen_complete: Option<Instant>,
    ) -> bool {
        let mut interrupted = None;
        let closing = self.ledger.try_close_task(id, hint, how, |task| {
            let ended = match panic::catch_unwind(AssertUnwindSafe(|| task.try_wait())) {
                Ok(Ok(outcome)) => {
                    if let Err(error) = &outcome {
                        tracing::warn!(task = %id, %error, "a save did not complete; its requests are still reported");
                    }
                    Ended::Returned(outcome)
                }
                Ok(Err((task, cause))) => {
                    interrupted = Some(cause);
                    return Err(task);
                }
                Err(payload) => {
                    tracing::error!(task = %id, panic = %take_panic(payload), "a save task's wait panicked; its requests are still reported");
                    Ended::Panicked
                }
            };
            Ok((ended, seen_complete.unwrap_or_else(Instant::now)))
        });
        debug_assert!(closing != Closing::NotRunning, "S4: {id} closed twice");
        if let Some(cause) = interrupted {
            self.interrupt(cause);
            return false;
        }
        true
    }
}

impl<R, T> Drop for SaveTracker<R, T> {
    fn drop(&mut self) {
        if self.ledger.running_count() > 0 {
            tracing::warn!(
                running = self.ledger.running_count(),
                "a save tracker was dropped with running tasks; call wait_all first so no block is released while a save reads it"
            );
        }
    }
}

#[cfg(test)]
mod tests;
