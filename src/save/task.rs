//! Store tasks: what a save tracker waits on.

use std::fmt;

/// Identifies a task inside one [`SaveTracker`](crate::SaveTracker).
///
/// Ids come from a monotonic counter and are never reused by a tracker, so a
/// log line or a stats snapshot naming a task is unambiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub(crate) u64);

impl TaskId {
    /// The counter value (0 for a tracker's first task).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task#{}", self.0)
    }
}

/// How a store task ended badly. Whatever the error, the store guarantees
/// that the task's I/O no longer touches the blocks once [`StoreTask::wait`]
/// returns, so the tracker may report the requests and release their blocks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// The store tried and failed (a write error, a full device, ...).
    #[error("the save failed: {0}")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The store gave up waiting for the I/O and cancelled it.
    #[error("the save timed out")]
    TimedOut,
    /// Whatever was going to complete the task went away without saying how
    /// it ended (for a [`CompletionTask`](crate::save::CompletionTask): its
    /// [`Completer`](crate::save::Completer) was dropped).
    #[error("the save was abandoned before it completed")]
    Abandoned,
}

impl TaskError {
    /// A [`TaskError::Failed`] carrying a plain message.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into().into())
    }
}

/// A check or wait that gave up before the task's I/O ended, because the
/// waiting thread was asked to stop (a Python `KeyboardInterrupt` or
/// `SystemExit` raised inside a store task's `done()` or `wait()`, say).
/// It is not how the task ended: the tracker keeps the task running, the
/// call returns early without passing its fence, and
/// [`SaveTracker::take_interruption`](crate::SaveTracker::take_interruption)
/// hands the cause back, so the caller can raise it and retry later.
#[derive(Debug, thiserror::Error)]
#[error("interrupted while waiting for a save: {0}")]
pub struct Interrupted(pub Box<dyn std::error::Error + Send + Sync>);

/// How the saves of a reported request went (see
/// [`SaveTracker::get_finished_outcomes`](crate::SaveTracker::get_finished_outcomes)).
/// Either way no save reads the request's blocks any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaveOutcome {
    /// Every task that read its blocks completed successfully.
    Saved,
    /// A task that read its blocks failed, timed out, was abandoned or
    /// panicked, or the store refused a save of them.
    Failed,
}

/// One asynchronous save (dump) submitted to a store: something that reads
/// KV blocks on its own time and can be asked whether it is done.
///
/// The two methods mirror a store's task API: [`check`](Self::check) polls
/// without consuming the task, [`wait`](Self::wait) consumes it and returns
/// only when no I/O of the task reads the blocks any more — on success, on
/// error and on timeout alike. Whatever the task owns for its lifetime (the
/// device event the store waits on before reading, a pinned buffer) is
/// released when the value is dropped, which ownership makes happen exactly
/// once: inside `wait`, or wherever an unsubmitted task is dropped.
///
/// ```
/// use kvtier::{StoreTask, save::TaskError};
///
/// /// A save the store finished synchronously.
/// struct Done(Result<(), String>);
///
/// impl StoreTask for Done {
///     fn check(&self) -> bool {
///         true
///     }
///     fn wait(self) -> Result<(), TaskError> {
///         self.0.map_err(TaskError::failed)
///     }
/// }
/// assert!(Done(Ok(())).wait().is_ok());
/// ```
pub trait StoreTask {
    /// Whether the task's I/O is over (successfully or not). Must not block:
    /// the tracker calls it on the model-execution path.
    fn check(&self) -> bool;

    /// Waits until the task's I/O no longer touches the blocks and returns how
    /// it ended. Consumes the task, so it can be waited only once.
    fn wait(self) -> Result<(), TaskError>;

    /// [`check`](Self::check), for a task whose check can be interrupted
    /// (see [`Interrupted`]). The tracker calls this one; the default never
    /// is interrupted.
    fn try_check(&self) -> Result<bool, Interrupted> {
        Ok(self.check())
    }

    /// [`wait`](Self::wait), for a task whose wait can be interrupted before
    /// its I/O is over: it then hands the task back with the cause, and the
    /// task is still running. The tracker calls this one; the default never
    /// is interrupted.
    fn try_wait(self) -> Result<Result<(), TaskError>, (Self, Interrupted)>
    where
        Self: Sized,
    {
        Ok(self.wait())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_name_their_counter_value() {
        assert_eq!(TaskId(7).get(), 7);
        assert_eq!(TaskId(7).to_string(), "task#7");
        assert_eq!(
            TaskError::failed("disk full").to_string(),
            "the save failed: disk full"
        );
    }
}
