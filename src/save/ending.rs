//! How a running task ends, as the ledger and the tracker tell it.

use super::task::TaskError;

/// How a task ended, as far as the counters care.
#[derive(Debug)]
pub(crate) enum Ended {
    /// `wait` returned this.
    Returned(Result<(), TaskError>),
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

/// What a non-blocking check of a running task found.
pub(crate) enum Check {
    /// Not complete yet.
    Running,
    /// Complete: waiting for it will not block.
    Complete,
    /// The check panicked, with this message: nothing says whether the I/O
    /// is over.
    Panicked(String),
    /// The check was interrupted (a signal in the caller's thread): nothing
    /// says whether the I/O is over, and the caller stops checking.
    Interrupted,
}

/// What [`SaveLedger::try_close_task`](super::ledger::SaveLedger::try_close_task) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closing {
    /// The task was not running.
    NotRunning,
    /// The task was closed.
    Closed,
    /// The wait was interrupted: the task is running, as before.
    Kept,
}
