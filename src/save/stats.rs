//! Counters of the save-completion protocol.

/// A snapshot of a [`SaveTracker`](crate::SaveTracker)'s counters (one
/// worker's view).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SaveStats {
    /// Steps begun ([`SaveTracker::begin_step`](crate::SaveTracker::begin_step)).
    pub steps: u64,
    /// Requests that started being tracked (their free is delayed).
    pub recorded: u64,
    /// Tasks accepted by [`submit`](crate::SaveTracker::submit).
    pub tasks_submitted: u64,
    /// Submissions the store refused ([`submit_failed`](crate::SaveTracker::submit_failed)).
    pub submit_failures: u64,
    /// Tasks found complete by a non-blocking check and reaped.
    pub tasks_reaped: u64,
    /// Tasks waited for while still running: by a blocking `get_finished`, a
    /// preemption fence or [`wait_all`](crate::SaveTracker::wait_all).
    pub tasks_waited: u64,
    /// Tasks whose wait returned [`TaskError::Failed`](crate::save::TaskError::Failed).
    pub task_failures: u64,
    /// Tasks whose wait returned [`TaskError::TimedOut`](crate::save::TaskError::TimedOut).
    pub task_timeouts: u64,
    /// Tasks whose wait returned [`TaskError::Abandoned`](crate::save::TaskError::Abandoned).
    pub tasks_abandoned: u64,
    /// Panics caught in a task's `check` or `wait`.
    pub task_panics: u64,
    /// Requests reported by `get_finished` (each exactly once).
    pub reported: u64,
    /// Finished requests that could not be reported in the call that passed
    /// them (a task was still running); they are reported by a later call.
    pub deferred: u64,
    /// Finished ids that were never recorded as saving: not reported, since
    /// the scheduler did not delay their free.
    pub not_delayed: u64,
    /// Finished ids passed again after they had already finished (ignored).
    pub repeated_finishes: u64,
    /// Request ids submitted with a task although no step recorded them. The
    /// scheduler did not delay their free, so their blocks may be released
    /// while the task reads them: a bug in the caller, logged and counted.
    pub unrecorded_saves: u64,
    /// [`handle_preemptions`](crate::SaveTracker::handle_preemptions) calls.
    pub preemption_fences: u64,
}
