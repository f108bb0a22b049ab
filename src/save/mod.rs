//! Deferred save completion with delayed block release.
//!
//! [`SaveScheduler`] (scheduler side) and [`SaveTracker`] (one per worker)
//! implement the protocol; the tracker's bookkeeping is a sans-IO ledger and
//! its only I/O is calling [`StoreTask::check`] / [`StoreTask::wait`].
//! [`CompletionTask`] is a ready-made task completed from another thread;
//! [`MultiConnector`] and [`ReportAggregator`] compose connectors and
//! workers. See `docs/design.md` for the invariants S1–S6.

mod completion;
mod compose;
mod ending;
mod ledger;
mod report;
mod running;
mod scheduler;
mod stats;
mod step_error;
mod task;
mod tracker;
pub mod wire;

pub use crate::invariant::InvariantViolation;
pub use completion::{Completer, CompletionTask};
pub use compose::{MultiConnector, SchedulerConnector, WorkerConnector};
pub use report::{Report, ReportAggregator, ReportError, WorkerReport};
pub use scheduler::{SaveScheduler, SaveStep, SchedulerSaveStats};
pub use stats::{SaveLatency, SaveStats};
pub use step_error::StepError;
pub use task::{Interrupted, SaveOutcome, StoreTask, TaskError, TaskId};
pub use tracker::{CompletionMode, SaveTracker};
