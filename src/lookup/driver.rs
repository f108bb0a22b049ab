//! The threaded driver: a [`LookupTable`] on the scheduler thread, a backend
//! on a worker thread, a queue of submissions between them one way and a
//! lock-free publication stack the other way.

use std::collections::VecDeque;
use std::hash::Hash;

use super::backend::{LookupBackend, probe_group};
use super::front::{Front, Published};
use super::stats::Stats;
use super::submission::Submission;
use super::table::LookupTable;
use super::types::{Request, Ticket, Verdict};
use crate::fault::{drop_payload, take_panic};
use crate::sync::{Arc, Condvar, Mutex, thread};

/// Why a driver call could not be carried out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The driver was shut down; only [`AsyncLookup::stats`] and
    /// [`AsyncLookup::table`] still answer.
    #[error("the lookup driver has been shut down")]
    ShutDown,
    /// The operating system refused to start the worker thread.
    #[error("could not start the lookup worker thread")]
    Spawn(#[source] std::io::Error),
    /// The worker thread is gone. Backend panics are caught, so this is a
    /// kvtier bug; keys it had in flight stay pending. Shut the driver down.
    #[error("the lookup worker thread stopped unexpectedly: {0}")]
    WorkerLost(String),
    /// A driver setting is out of range; the message says which and why.
    #[error("invalid lookup driver configuration: {0}")]
    Config(String),
    /// Shutdown aborted tasks that did not stop within the cancellation
    /// bound (a backend blocking its thread inside a future); their groups'
    /// keys stay in flight in the (now read-only) table.
    #[error("{groups} lookup groups did not stop after being cancelled")]
    Stuck {
        /// Groups never published.
        groups: u64,
    },
}

/// The scheduler → worker side, guarded by one mutex.
struct Queue<K, R> {
    submissions: VecDeque<Submission<K, R>>,
    /// Submissions handed over / fully published, for `wait_idle`.
    submitted: u64,
    completed: u64,
    /// Set by `shutdown`: finish what is queued, then exit.
    closing: bool,
    /// Set when the worker exits, normally or not.
    exited: Option<String>,
}

struct Shared<K, R> {
    queue: Mutex<Queue<K, R>>,
    /// Signals the worker: a submission was queued, or `closing` was set.
    work_ready: Condvar,
    /// Signals the scheduler: `completed` grew, or the worker exited.
    progress: Condvar,
}

/// Async secondary-tier lookup: a [`LookupTable`] driven by a worker thread
/// that probes a [`LookupBackend`] one request group at a time.
///
/// The scheduler thread owns this value and calls [`lookup`](Self::lookup)
/// for each block it could load, [`flush`](Self::flush) at the end of each
/// step, [`cleanup`](Self::cleanup) when a request ends and
/// [`mark_miss`](Self::mark_miss) when a load fails. None of these blocks on
/// the worker: the worker publishes each group's answers through a lock-free
/// stack as soon as that group is done, and every `lookup` picks up whatever
/// was published (one atomic load when nothing was).
///
/// ```
/// use kvtier::{AsyncLookup, Verdict};
///
/// // A backend is anything that answers a group of keys; here, "even keys are stored".
/// let backend = |keys: &[u64], _request: &String| keys.iter().map(|k| k % 2 == 0).collect();
/// let mut lookup = AsyncLookup::new(backend)?;
/// let request = "req-1".to_string();
///
/// assert_eq!(lookup.lookup(&4, &request)?, Verdict::Pending);
/// assert_eq!(lookup.lookup(&5, &request)?, Verdict::Pending);
/// lookup.flush()?; // end of step: the worker probes the new keys
///
/// // A real scheduler just asks again next step; a test can wait instead.
/// lookup.wait_idle()?;
/// assert!(lookup.lookup(&4, &request)?.is_hit());
/// assert!(lookup.lookup(&5, &request)?.is_miss());
///
/// lookup.cleanup(&request)?;
/// lookup.shutdown()?;
/// assert!(lookup.table().is_empty());
/// # Ok::<(), kvtier::LookupError>(())
/// ```
pub struct AsyncLookup<K, R: Request, B> {
    front: Front<K, R>,
    shared: Arc<Shared<K, R>>,
    worker: Option<thread::JoinHandle<()>>,
    _backend: std::marker::PhantomData<fn(B)>,
}

impl<K, R, B> AsyncLookup<K, R, B>
where
    K: Eq + Hash + Clone + Send + 'static,
    R: Request + Send + 'static,
    B: LookupBackend<K, R> + Send + 'static,
{
    /// Starts a worker thread named `kvtier-lookup` that probes `backend`.
    pub fn new(backend: B) -> Result<Self, LookupError> {
        Self::with_thread_name(backend, "kvtier-lookup")
    }

    /// Starts the worker thread under the given name.
    pub fn with_thread_name(backend: B, name: &str) -> Result<Self, LookupError> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                submissions: VecDeque::new(),
                submitted: 0,
                completed: 0,
                closing: false,
                exited: None,
            }),
            work_ready: Condvar::new(),
            progress: Condvar::new(),
        });
        let front = Front::new();
        let worker_shared = shared.clone();
        let published = front.publisher();
        let worker = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run_worker(&worker_shared, &published, backend))
            .map_err(LookupError::Spawn)?;
        Ok(Self {
            front,
            shared,
            worker: Some(worker),
            _backend: std::marker::PhantomData,
        })
    }

    /// What the tier knows about `key`, recording that `request` asked (see
    /// [`LookupTable::lookup`]). Applies everything the worker published
    /// first, so an answer published mid-step is seen by the very next call.
    #[inline(always)]
    pub fn lookup(&mut self, key: &K, request: &R) -> Result<Verdict<K>, LookupError> {
        self.ensure_open()?;
        Ok(self.front.lookup(key, request))
    }

    /// Ends the step: hands the keys looked up for the first time since the
    /// last flush to the worker (nothing when there are none). Never waits for
    /// the worker. Returns how many keys were handed over.
    pub fn flush(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        let Some(submission) = self.front.take_submission() else {
            return Ok(0);
        };
        let keys = submission.key_count();
        let mut queue = self.shared.queue.lock();
        if let Some(reason) = &queue.exited {
            return Err(LookupError::WorkerLost(reason.clone()));
        }
        queue.submissions.push_back(submission);
        queue.submitted += 1;
        drop(queue);
        self.shared.work_ready.notify_one();
        Ok(keys)
    }

    /// Applies every group result the worker has published; returns how many.
    pub fn drain(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        Ok(self.front.apply_published())
    }

    /// Blocks until the worker has answered every flushed submission, then
    /// applies the answers; returns how many group results were applied.
    ///
    /// Not for the scheduler's hot path (it waits for the backend): for tests,
    /// demos and orderly pauses.
    pub fn wait_idle(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        let mut queue = self.shared.queue.lock();
        while queue.completed < queue.submitted {
            if let Some(reason) = &queue.exited {
                return Err(LookupError::WorkerLost(reason.clone()));
            }
            queue = self.shared.progress.wait(queue);
        }
        drop(queue);
        Ok(self.front.apply_published())
    }

    /// Turns the hit recorded by `ticket` into a miss after its load failed;
    /// a ticket of an older generation is a no-op (see [`LookupTable::mark_miss`]).
    pub fn mark_miss(&mut self, ticket: &Ticket<K>) -> Result<bool, LookupError> {
        self.ensure_open()?;
        Ok(self.front.mark_miss(ticket))
    }

    /// Turns resolved hits of `keys` into misses (see [`LookupTable::mark_miss_keys`]).
    pub fn mark_miss_keys<'k>(
        &mut self,
        keys: impl IntoIterator<Item = &'k K>,
    ) -> Result<usize, LookupError>
    where
        K: 'k,
    {
        self.ensure_open()?;
        Ok(self.front.mark_miss_keys(keys))
    }

    /// Forgets request `id` (see [`LookupTable::cleanup`]).
    pub fn cleanup(&mut self, id: &R::Id) -> Result<(), LookupError> {
        self.ensure_open()?;
        self.front.cleanup(id);
        Ok(())
    }

    /// Starts or stops recording the order in which group results are
    /// applied (see [`LookupTable::record_applied`]).
    pub fn record_applied(&mut self, on: bool) {
        self.front.record_applied(on);
    }

    /// The applied groups recorded since the last call (see
    /// [`LookupTable::take_applied`]).
    pub fn take_applied(&mut self) -> Vec<(u64, crate::GroupOutcome)> {
        self.front.take_applied()
    }

    /// A snapshot of the counters of everything applied so far. Available
    /// after shutdown too.
    pub fn stats(&self) -> Stats {
        self.front.stats()
    }

    /// The table, read-only. Available after shutdown too.
    pub fn table(&self) -> &LookupTable<K, R> {
        self.front.table()
    }

    /// Lets the worker finish every queued submission, joins it and applies
    /// its last answers. Afterwards every call but `stats` and `table`
    /// returns [`LookupError::ShutDown`]. Dropping the driver does the same.
    ///
    /// Waits for in-progress backend calls: a backend that never returns
    /// makes this wait forever (timeouts belong to the async adapter).
    pub fn shutdown(&mut self) -> Result<(), LookupError> {
        let joined = self.close_and_join().ok_or(LookupError::ShutDown)?;
        self.front.apply_published();
        joined.map_err(|payload| LookupError::WorkerLost(take_panic(payload)))
    }
}

impl<K, R: Request, B> AsyncLookup<K, R, B> {
    /// Lets the worker finish what is queued and joins it; `None` when that
    /// already happened.
    fn close_and_join(&mut self) -> Option<std::thread::Result<()>> {
        let worker = self.worker.take()?;
        self.shared.queue.lock().closing = true;
        self.shared.work_ready.notify_one();
        Some(worker.join())
    }

    fn ensure_open(&self) -> Result<(), LookupError> {
        match self.worker {
            Some(_) => Ok(()),
            None => Err(LookupError::ShutDown),
        }
    }
}

impl<K, R: Request, B> Drop for AsyncLookup<K, R, B> {
    fn drop(&mut self) {
        // Nothing to report to: a worker that panicked already logged.
        if let Some(Err(payload)) = self.close_and_join() {
            drop_payload(payload);
        }
    }
}

/// Marks the worker's exit in the queue, however it exits, so a scheduler in
/// `wait_idle` or `flush` learns of it instead of waiting forever.
struct ExitGuard<'a, K, R>(&'a Shared<K, R>);

impl<K, R> Drop for ExitGuard<'_, K, R> {
    fn drop(&mut self) {
        let reason = if std::thread::panicking() {
            "the worker panicked"
        } else {
            "the worker stopped"
        };
        self.0.queue.lock().exited = Some(reason.to_owned());
        self.0.progress.notify_all();
    }
}

fn run_worker<K, R, B>(shared: &Shared<K, R>, published: &Published<K>, mut backend: B)
where
    R: Request,
    B: LookupBackend<K, R>,
{
    let _exit = ExitGuard(shared);
    loop {
        let submission = {
            let mut queue = shared.queue.lock();
            loop {
                if let Some(submission) = queue.submissions.pop_front() {
                    break submission;
                }
                if queue.closing {
                    return;
                }
                queue = shared.work_ready.wait(queue);
            }
        };
        for group in submission.into_groups() {
            // Each group is visible to the scheduler as soon as it
            // is done, not when the whole submission is.
            published.push(probe_group(&mut backend, group));
        }
        shared.queue.lock().completed += 1;
        shared.progress.notify_all();
    }
}
