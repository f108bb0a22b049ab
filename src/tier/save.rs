//! The save task both tiers hand out.

use crate::save::{Completer, CompletionTask, StoreTask, TaskError};

use super::error::TierError;

/// A block save running on a tier, for the
/// [`SaveTracker`](crate::SaveTracker): complete when the block is published
/// whole, or the write failed. `L` says where the block goes: a file path on
/// [`FsTier`](super::FsTier) ([`FsSaveTask`](super::FsSaveTask)), an object
/// location on [`ObjectTier`](super::ObjectTier)
/// ([`ObjectSaveTask`](super::ObjectSaveTask)). `check` never blocks; `wait`
/// returns the write's error, or [`TaskError::Abandoned`] if the job was
/// dropped unrun.
#[derive(Debug)]
pub struct SaveTask<L> {
    id: u64,
    location: L,
    task: CompletionTask<()>,
}

impl<L> SaveTask<L> {
    /// A save numbered `id` of the block at `location`, and the completer
    /// its I/O job finishes it with.
    pub(crate) fn start(id: u64, location: L) -> (Self, Completer) {
        let (task, completer) = CompletionTask::new(());
        (Self { id, location, task }, completer)
    }

    /// This save's id: the saves of one tier are numbered 0, 1, 2, ...
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where the block goes.
    pub fn location(&self) -> &L {
        &self.location
    }
}

impl<L> StoreTask for SaveTask<L> {
    fn check(&self) -> bool {
        self.task.check()
    }

    fn wait(self) -> Result<(), TaskError> {
        self.task.wait()
    }
}

/// Ends a save's task with how its write went.
pub(crate) fn finish(completer: Completer, written: Result<(), TierError>) {
    match written {
        Ok(()) => completer.succeed(),
        Err(error) => completer.fail(TaskError::Failed(Box::new(error))),
    }
}
