//! The thread prober: a worker thread that probes a blocking [`Backend`]
//! one request group at a time, in submission order, with a queue of
//! submissions from the scheduler under one mutex.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use super::backend::{Backend, probe_and_publish};
use super::error::LookupError;
use super::scheduler::{Lookup, Prober, Publisher, Refused};
use super::submission::Submission;
use super::types::Request;
use crate::fault::take_panic;
use crate::sync::{Arc, Condvar, Mutex, thread};
use crate::worker::{Jobs, next_job};

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

impl<K, R> Jobs for Queue<K, R> {
    type Job = Submission<K, R>;

    fn pop(&mut self) -> Option<Submission<K, R>> {
        self.submissions.pop_front()
    }

    fn closing(&self) -> bool {
        self.closing
    }
}

struct Shared<K, R> {
    queue: Mutex<Queue<K, R>>,
    /// Signals the worker: a submission was queued, or `closing` was set.
    work_ready: Condvar,
    /// Signals the scheduler: `completed` grew, or the worker exited.
    progress: Condvar,
}

/// A [`Prober`] that probes a blocking [`Backend`] on a worker thread, one
/// request group at a time in submission order, publishing each group as
/// soon as it is done. Built by [`Lookup::threaded`].
///
/// Shutdown lets the worker finish every queued submission and joins it.
/// Without a [shutdown grace](Self::with_shutdown_grace), a backend call
/// that never returns makes it wait forever (timeouts are the tokio
/// prober's); with one, shutdown (and a drop) waits at most that long, then
/// leaves the worker behind, detached, and reports [`LookupError::Stuck`]:
/// a stuck backend never holds up its owner's exit. A backend may own its lookup (a Python backend
/// reaches the manager that holds it): dropped or shut down inside one of
/// its calls, the prober asks the worker to stop after the queue and
/// returns at once, and `wait_idle` there returns [`LookupError::OnWorker`]
/// instead of waiting for the call that makes it.
pub struct ThreadProber<K, R> {
    shared: Arc<Shared<K, R>>,
    worker: Option<thread::JoinHandle<()>>,
    /// How long shutdown waits for the worker; `None`: as long as it takes.
    grace: Option<Duration>,
}

/// A [`Lookup`] whose groups a worker thread probes.
pub type ThreadLookup<K, R> = Lookup<K, R, ThreadProber<K, R>>;

impl<K, R> ThreadProber<K, R>
where
    K: Send + 'static,
    R: Request + Send + 'static,
{
    /// Starts a worker thread named `name` that probes `backend` and
    /// publishes through `results`.
    pub fn spawn<B>(backend: B, results: Publisher<K>, name: &str) -> Result<Self, LookupError>
    where
        B: Backend<K, R> + Send + 'static,
    {
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
        // guard: H3-nul-in-a-thread-name-refused
        if name.contains('\0') {
            return Err(LookupError::Config(format!(
                "a worker thread's name cannot hold a NUL byte: {name:?}"
            )));
        }
        let worker_shared = shared.clone();
        let worker = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run_worker(&worker_shared, &results, backend))
            .map_err(LookupError::Spawn)?;
        Ok(Self {
            shared,
            worker: Some(worker),
            grace: None,
        })
    }
}

impl<K, R> ThreadProber<K, R> {
    /// Bounds how long shutdown (or a drop) waits for the worker to finish
    /// its call and the queue: past `grace` the worker is left behind,
    /// detached, and shutdown reports [`LookupError::Stuck`] with the
    /// submissions it never published. `None` (the default) waits as long
    /// as it takes.
    #[must_use]
    pub fn with_shutdown_grace(mut self, grace: Option<Duration>) -> Self {
        self.grace = grace;
        self
    }

    /// Refuses a wait made from inside a backend call: the worker would
    /// wait for itself.
    fn refuse_on_worker(&self) -> Result<(), LookupError> {
        // guard: L16-no-wait-on-the-worker
        if self.on_worker() {
            return Err(LookupError::OnWorker("wait_idle"));
        }
        Ok(())
    }

    /// Whether this is the worker thread, inside a backend call.
    fn on_worker(&self) -> bool {
        self.worker
            .as_ref()
            .is_some_and(|worker| worker.thread().id() == thread::current().id())
    }

    /// Submissions taken but not yet fully published: queued or being
    /// probed.
    pub fn outstanding_submissions(&self) -> u64 {
        let queue = self.shared.queue.lock();
        queue.submitted - queue.completed
    }
}

impl<K, R> Lookup<K, R, ThreadProber<K, R>>
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
    R: Request + Send + 'static,
{
    /// A lookup whose groups a worker thread named `kvtier-lookup` probes
    /// with `backend`, one at a time.
    pub fn threaded<B>(backend: B) -> Result<Self, LookupError>
    where
        B: Backend<K, R> + Send + 'static,
    {
        Self::threaded_named(backend, "kvtier-lookup")
    }

    /// [`threaded`](Self::threaded) with the worker thread named `name`.
    pub fn threaded_named<B>(backend: B, name: &str) -> Result<Self, LookupError>
    where
        B: Backend<K, R> + Send + 'static,
    {
        Self::try_with_prober(|results| ThreadProber::spawn(backend, results, name))
    }
}

impl<K, R> Prober<K, R> for ThreadProber<K, R> {
    fn submit(&mut self, submission: Submission<K, R>) -> Result<(), Refused<K, R>> {
        let mut queue = self.shared.queue.lock();
        if let Some(reason) = &queue.exited {
            let error = LookupError::WorkerLost(reason.clone());
            return Err(Refused { submission, error });
        }
        queue.submissions.push_back(submission);
        queue.submitted += 1;
        drop(queue);
        self.shared.work_ready.notify_one();
        Ok(())
    }

    fn wait_idle(&mut self) -> Result<(), LookupError> {
        self.refuse_on_worker()?;
        let mut queue = self.shared.queue.lock();
        while queue.completed < queue.submitted {
            if let Some(reason) = &queue.exited {
                return Err(LookupError::WorkerLost(reason.clone()));
            }
            queue = self.shared.progress.wait(queue);
        }
        Ok(())
    }

    fn wait_idle_for(&mut self, limit: Duration) -> Result<bool, LookupError> {
        self.refuse_on_worker()?;
        let deadline = Instant::now() + limit;
        let mut queue = self.shared.queue.lock();
        while queue.completed < queue.submitted {
            if let Some(reason) = &queue.exited {
                return Err(LookupError::WorkerLost(reason.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            queue = self.shared.progress.wait_timeout(queue, left);
        }
        Ok(true)
    }

    fn shutdown(&mut self) -> Result<(), LookupError> {
        let on_worker = self.on_worker();
        let Some(worker) = self.worker.take() else {
            return Ok(());
        };
        self.shared.queue.lock().closing = true;
        self.shared.work_ready.notify_one();
        // Dropped inside a backend call (its last owner let go there): the
        // worker cannot join itself. It finishes this call and the queue,
        // then exits on its own.
        // guard: L16-no-join-on-the-worker
        if on_worker {
            return Ok(());
        }
        if let Some(grace) = self.grace {
            let unpublished = self.wait_exit(grace);
            // guard: H5-stuck-worker-left-behind
            if unpublished > 0 {
                // Dropping the handle detaches the worker: it finishes its
                // call whenever it returns, and exits then.
                drop(worker);
                return Err(LookupError::Stuck {
                    groups: unpublished,
                });
            }
        }
        worker
            .join()
            .map_err(|payload| LookupError::WorkerLost(take_panic(payload)))
    }
}

impl<K, R> ThreadProber<K, R> {
    /// Waits at most `grace` for a closing worker to exit; returns 0 once it
    /// exited, else how many submissions it has not published. Queued ones
    /// are dropped (their keys stay in flight), so a worker that comes back
    /// from its call exits at once.
    fn wait_exit(&self, grace: Duration) -> u64 {
        let deadline = Instant::now() + grace;
        let mut queue = self.shared.queue.lock();
        while queue.exited.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                queue.submissions.clear();
                return (queue.submitted - queue.completed).max(1);
            }
            queue = self.shared.progress.wait_timeout(queue, left);
        }
        0
    }
}

impl<K, R> Drop for ThreadProber<K, R> {
    fn drop(&mut self) {
        // Only a prober never handed to a `Lookup` still has its worker
        // here. Nothing to report to: a worker that panicked already logged.
        if let Err(error) = Prober::shutdown(self) {
            drop(error);
        }
    }
}

impl<K, R> fmt::Debug for ThreadProber<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.shared.queue.lock();
        f.debug_struct("ThreadProber")
            .field("submitted", &queue.submitted)
            .field("completed", &queue.completed)
            .field("running", &self.worker.is_some())
            .finish()
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

fn run_worker<K, R, B>(shared: &Shared<K, R>, published: &Publisher<K>, mut backend: B)
where
    R: Request,
    B: Backend<K, R>,
{
    let _exit = ExitGuard(shared);
    while let Some(submission) = next_job(&shared.queue, &shared.work_ready) {
        // guard: L7-per-group-publication
        for group in submission.into_groups() {
            // L15: a group nobody wants any more is not probed.
            // guard: L15-thread-prober-claims
            // Each group is visible to the scheduler as soon as it
            // is done, not when the whole submission is; a probed one is
            // published inside the backend's around_group (L17).
            // guard: L7-per-group-publication
            if group.claim() {
                probe_and_publish(&mut backend, group, |result| published.publish(result));
            } else {
                published.publish(group.abandoned());
            }
        }
        // guard: L7-per-group-publication
        shared.queue.lock().completed += 1;
        shared.progress.notify_all();
    }
}
