//! A ready-made [`StoreTask`] completed from another thread.

use std::fmt;

use super::task::{StoreTask, TaskError};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, Condvar, Mutex};

struct Shared {
    /// Set, with `Release`, once `outcome` holds the result: a `check` that
    /// reads it `Acquire` sees everything the I/O thread did before.
    done: AtomicBool,
    outcome: Mutex<Option<Result<(), TaskError>>>,
    completed: Condvar,
}

/// A [`StoreTask`] whose I/O runs elsewhere — a thread pool, an async
/// runtime, a device queue — and is completed through its [`Completer`].
///
/// The task owns a handle `H` (the device event the store waits on before
/// reading the blocks, a pinned buffer, anything to release after the save):
/// it is dropped exactly once, when the task is waited for or dropped.
///
/// ```
/// use kvtier::{save::CompletionTask, StoreTask};
///
/// let (task, completer) = CompletionTask::new("event#1");
/// let io = std::thread::spawn(move || {
///     // ... write the blocks ...
///     completer.succeed();
/// });
/// assert!(task.wait().is_ok()); // returns once the I/O thread completed it
/// io.join().unwrap();
/// ```
pub struct CompletionTask<H = ()> {
    shared: Arc<Shared>,
    handle: Option<H>,
}

/// Completes one [`CompletionTask`]. Dropping it without completing marks the
/// task [`TaskError::Abandoned`], so a waiter is never stranded by an I/O
/// thread that died.
pub struct Completer {
    shared: Option<Arc<Shared>>,
}

impl<H> CompletionTask<H> {
    /// A running task owning `handle`, and the completer for its I/O side.
    pub fn new(handle: H) -> (Self, Completer) {
        let shared = Arc::new(Shared {
            done: AtomicBool::new(false),
            outcome: Mutex::new(None),
            completed: Condvar::new(),
        });
        let completer = Completer {
            shared: Some(shared.clone()),
        };
        (
            Self {
                shared,
                handle: Some(handle),
            },
            completer,
        )
    }

    /// The handle the task owns.
    pub fn handle(&self) -> Option<&H> {
        self.handle.as_ref()
    }
}

impl<H> StoreTask for CompletionTask<H> {
    fn check(&self) -> bool {
        self.shared.done.load(Ordering::Acquire)
    }

    fn wait(mut self) -> Result<(), TaskError> {
        let mut outcome = self.shared.outcome.lock();
        let result = loop {
            // guard: S1-completion-wait-returns-early
            if let Some(result) = outcome.take() {
                break result;
            }
            outcome = self.shared.completed.wait(outcome);
        };
        drop(outcome);
        // The I/O is over: release the handle now rather than whenever the
        // caller drops the task's shell.
        drop(self.handle.take());
        result
    }
}

impl<H> fmt::Debug for CompletionTask<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionTask")
            .field("complete", &self.check())
            .finish_non_exhaustive()
    }
}

impl Completer {
    /// The save succeeded.
    pub fn succeed(self) {
        self.complete(Ok(()));
    }

    /// The save failed with `error`.
    pub fn fail(self, error: TaskError) {
        self.complete(Err(error));
    }

    /// Completes the task with `result`; call it only once the I/O no longer
    /// touches the blocks.
    pub fn complete(mut self, result: Result<(), TaskError>) {
        if let Some(shared) = self.shared.take() {
            finish(&shared, result);
        }
    }
}

fn finish(shared: &Shared, result: Result<(), TaskError>) {
    let mut outcome = shared.outcome.lock();
    *outcome = Some(result);
    shared.done.store(true, Ordering::Release);
    drop(outcome);
    shared.completed.notify_all();
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            finish(&shared, Err(TaskError::Abandoned));
        }
    }
}

impl fmt::Debug for Completer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer").finish_non_exhaustive()
    }
}
