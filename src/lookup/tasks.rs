//! The async driver: each request group is probed by an async task, up to
//! `max_concurrent_groups` at once, each bounded by a timeout.
//!
//! Groups wait in a FIFO queue under one mutex. A flush queues its groups
//! and starts as many *runner* tasks as there are free slots; a runner takes
//! the queue's head, probes it, publishes the result through the shared
//! [`Front`] path (the same lock-free stack and the same table as the thread
//! driver), and takes the next head until the queue is empty. With one slot
//! a single runner serves the queue in order, which is the thread driver's
//! FIFO; with more, a fast group queued behind a slow one is published as
//! soon as it is done.
//!
//! A runner owns the group it is probing. However the runner ends without
//! finishing (aborted at shutdown, dropped by a runtime shutting down, never
//! polled at all), its destructor publishes that group, and every group
//! still queued, as [`GroupOutcome::Cancelled`]: every key a miss, none left
//! in flight.

use std::collections::VecDeque;
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::backend::{CallEnd, settle};
use super::driver::LookupError;
use super::front::{Front, Published};
use super::stats::Stats;
use super::submission::{Group, GroupOutcome, collect_answers};
use super::table::LookupTable;
use super::types::{Request, Ticket, Verdict};
use crate::fault::take_panic;
use crate::sync::{Arc, Condvar, Mutex, task};

/// A tier that answers groups of keys asynchronously; the backend of
/// [`TokioLookup`].
///
/// `batch_lookup` takes `&self`: with `max_concurrent_groups` above 1,
/// several groups are probed at once. Faults become misses, as with
/// [`LookupBackend`](crate::LookupBackend): an `Err`, a panic while the
/// future is created or polled, fewer or more answers than keys, and a call
/// that outlives the driver's per-group timeout (its future is dropped).
///
/// ```
/// use std::collections::HashSet;
/// use kvtier::AsyncLookupBackend;
///
/// struct Resident(HashSet<u64>);
///
/// impl AsyncLookupBackend<u64, String> for Resident {
///     type Error = std::convert::Infallible;
///
///     async fn batch_lookup(&self, keys: &[u64], _request: &String) -> Result<Vec<bool>, Self::Error> {
///         Ok(keys.iter().map(|key| self.0.contains(key)).collect())
///     }
/// }
/// ```
pub trait AsyncLookupBackend<K, R>: Send + Sync + 'static {
    /// Why a whole group could not be answered.
    type Error: Display;

    /// Says, for each of `keys`, whether the tier holds it: one answer per
    /// key, in key order. `request` is the request whose lookups created the
    /// group, as context.
    fn batch_lookup(
        &self,
        keys: &[K],
        request: &R,
    ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send;
}

/// Settings of a [`TokioLookup`]. Start from `TokioConfig::default()` and
/// change what you need:
///
/// ```
/// use std::time::Duration;
/// use kvtier::TokioConfig;
///
/// let config = TokioConfig::default()
///     .max_concurrent_groups(8)
///     .group_timeout(Some(Duration::from_millis(500)));
/// assert_eq!(config.get_max_concurrent_groups(), 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokioConfig {
    max_concurrent_groups: usize,
    group_timeout: Option<Duration>,
    shutdown_grace: Duration,
    worker_threads: usize,
}

impl Default for TokioConfig {
    /// Four groups at once, a 2 s timeout per group, 1 s of grace at
    /// shutdown, two runtime threads when the driver owns its runtime.
    fn default() -> Self {
        Self {
            max_concurrent_groups: 4,
            group_timeout: Some(Duration::from_secs(2)),
            shutdown_grace: Duration::from_secs(1),
            worker_threads: 2,
        }
    }
}

impl TokioConfig {
    /// How many groups are probed at once (at least 1). With 1, groups are
    /// probed and published strictly in submission order, as by
    /// [`AsyncLookup`](crate::AsyncLookup).
    pub fn max_concurrent_groups(mut self, groups: usize) -> Self {
        self.max_concurrent_groups = groups;
        self
    }

    /// How long one backend call may take; a group that takes longer has
    /// its future dropped and every key becomes a miss (counted in
    /// [`Stats::timeouts`]). `None` waits forever, which also makes
    /// shutdown cancel such a call after the grace period instead.
    pub fn group_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.group_timeout = timeout;
        self
    }

    /// How long [`TokioLookup::shutdown`] lets queued and running groups
    /// finish before it cancels them. Zero cancels at once; a grace too long
    /// to end (`Duration::MAX`) waits for them.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Threads of the runtime [`TokioLookup::new`] builds (1 to 1024);
    /// unused with [`TokioLookup::with_handle`].
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.worker_threads = threads;
        self
    }

    /// The configured concurrency.
    pub fn get_max_concurrent_groups(&self) -> usize {
        self.max_concurrent_groups
    }

    /// The configured per-group timeout.
    pub fn get_group_timeout(&self) -> Option<Duration> {
        self.group_timeout
    }

    /// The configured shutdown grace period.
    pub fn get_shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    fn validate(&self) -> Result<(), LookupError> {
        if self.max_concurrent_groups == 0 {
            return Err(LookupError::Config(
                "max_concurrent_groups must be at least 1".into(),
            ));
        }
        if self.group_timeout == Some(Duration::ZERO) {
            return Err(LookupError::Config(
                "a zero group_timeout would make every key a miss; use a positive timeout or None"
                    .into(),
            ));
        }
        if !(1..=MAX_WORKER_THREADS).contains(&self.worker_threads) {
            return Err(LookupError::Config(format!(
                "worker_threads is {}; it must be 1 to {MAX_WORKER_THREADS}",
                self.worker_threads
            )));
        }
        Ok(())
    }
}

/// The most runtime threads [`TokioLookup::new`] starts: more only costs
/// memory (a million of them abort the process).
const MAX_WORKER_THREADS: usize = 1024;

/// `now + wait`, or `None` for a wait too long to have an end (a grace of
/// `Duration::MAX` overflows an `Instant`): wait without a deadline then.
fn deadline_after(wait: Duration) -> Option<Instant> {
    Instant::now().checked_add(wait)
}

/// Whether `handle`'s runtime has a time driver. tokio has no query for it;
/// creating a timer on a runtime without one panics at once (the panic is
/// printed by the panic hook), so creating one is the query.
#[cfg(not(kvtier_shuttle))]
fn has_timers(handle: &tokio::runtime::Handle) -> bool {
    let _inside = handle.enter();
    panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO)))
        .map_err(crate::fault::drop_payload)
        .is_ok()
}

/// How long shutdown waits for aborted runners to drop their groups. An
/// abort takes effect at the task's next await, so only a backend that
/// blocks its thread inside a future can make this wait run out.
const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// The groups between the scheduler and the runners.
struct Pool<K, R> {
    queue: VecDeque<Group<K, R>>,
    /// Runners started and not yet exited; never above the concurrency.
    running: usize,
    /// Groups handed over / published, for `wait_idle` and shutdown.
    submitted: u64,
    finished: u64,
}

struct Shared<K, R, B> {
    backend: B,
    published: Arc<Published<K>>,
    pool: Mutex<Pool<K, R>>,
    /// Signals the scheduler: `finished` grew or a runner exited.
    progress: Condvar,
    timeout: Option<Duration>,
}

/// Async secondary-tier lookup: a [`LookupTable`] whose request groups are
/// probed by async tasks on a tokio runtime, several at once, each within a
/// timeout.
///
/// The scheduler-facing calls are those of [`AsyncLookup`](crate::AsyncLookup)
/// and behave the same (the two drivers share the table and the publication
/// path); what differs is how groups are probed:
///
/// - up to `max_concurrent_groups` groups at once, each published as soon
///   as it is done, so a slow group does not hold back the ones behind it;
/// - each backend call is bounded by `group_timeout`: on expiry its future
///   is dropped and its keys become misses;
/// - [`shutdown`](Self::shutdown) lets outstanding groups finish for at most
///   `shutdown_grace`, then cancels them (their keys become misses); it
///   never waits on a hung backend.
///
/// The scheduler calls never block and never need to run inside the
/// runtime. `wait_idle` and `shutdown` block the calling thread, so call
/// them from a thread that is not one of the runtime's workers.
///
/// ```
/// use std::time::Duration;
/// use kvtier::{AsyncLookupBackend, TokioConfig, TokioLookup, Verdict};
///
/// struct EvenKeys;
///
/// impl AsyncLookupBackend<u64, String> for EvenKeys {
///     type Error = std::convert::Infallible;
///
///     async fn batch_lookup(&self, keys: &[u64], _: &String) -> Result<Vec<bool>, Self::Error> {
///         Ok(keys.iter().map(|key| key % 2 == 0).collect())
///     }
/// }
///
/// let config = TokioConfig::default().group_timeout(Some(Duration::from_secs(1)));
/// let mut lookup = TokioLookup::new(EvenKeys, config)?; // owns a small runtime
/// let request = "req-1".to_string();
/// assert_eq!(lookup.lookup(&4, &request)?, Verdict::Pending);
/// lookup.flush()?;
/// lookup.wait_idle()?; // a real scheduler just asks again next step
/// assert!(lookup.lookup(&4, &request)?.is_hit());
/// lookup.shutdown()?;
/// # Ok::<(), kvtier::LookupError>(())
/// ```
pub struct TokioLookup<K, R: Request, B> {
    front: Front<K, R>,
    shared: Arc<Shared<K, R, B>>,
    spawner: task::Spawner,
    /// Runner tasks not known to have finished, for aborting at shutdown.
    tasks: Vec<task::Task>,
    max_concurrent_groups: usize,
    shutdown_grace: Duration,
    open: bool,
    #[cfg(not(kvtier_shuttle))]
    runtime: Option<tokio::runtime::Runtime>,
}

#[cfg(not(kvtier_shuttle))]
impl<K, R, B> TokioLookup<K, R, B>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncLookupBackend<K, R>,
{
    /// Builds a multi-threaded runtime of its own (`worker_threads`
    /// threads named `kvtier-lookup`) and probes `backend` on it. The
    /// runtime is shut down with the driver.
    pub fn new(backend: B, config: TokioConfig) -> Result<Self, LookupError> {
        config.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads)
            .thread_name("kvtier-lookup")
            // Timers for the group timeout, and I/O for network backends
            // (whatever this build of tokio has).
            .enable_all()
            .build()
            .map_err(LookupError::Spawn)?;
        let mut driver = Self::start(backend, &config, runtime.handle().clone());
        driver.runtime = Some(runtime);
        Ok(driver)
    }

    /// Probes `backend` on the caller's runtime. The runtime must keep
    /// running tasks while the scheduler works: a multi-threaded runtime, or
    /// a current-thread one driven by another thread. With a group timeout
    /// it must have its time driver (`enable_time` or `enable_all`): without
    /// one this is a [`LookupError::Config`], where every group would
    /// otherwise be cancelled and every stored key read as a miss.
    pub fn with_handle(
        backend: B,
        config: TokioConfig,
        handle: tokio::runtime::Handle,
    ) -> Result<Self, LookupError> {
        config.validate()?;
        if config.group_timeout.is_some() && !has_timers(&handle) {
            return Err(LookupError::Config(
                "the runtime has no time driver, which the group timeout needs: build it with \
                 enable_time() or enable_all(), or set group_timeout(None)"
                    .into(),
            ));
        }
        Ok(Self::start(backend, &config, handle))
    }
}

#[cfg(kvtier_shuttle)]
impl<K, R, B> TokioLookup<K, R, B>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncLookupBackend<K, R>,
{
    /// Under `--cfg kvtier_shuttle`: runs the groups as tasks of shuttle's
    /// executor, inside a shuttle test.
    pub fn new(backend: B, config: TokioConfig) -> Result<Self, LookupError> {
        config.validate()?;
        Ok(Self::start(backend, &config, task::Spawner))
    }
}

impl<K, R, B> TokioLookup<K, R, B>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncLookupBackend<K, R>,
{
    fn start(backend: B, config: &TokioConfig, spawner: task::Spawner) -> Self {
        let front = Front::new();
        let shared = Arc::new(Shared {
            backend,
            published: front.publisher(),
            pool: Mutex::new(Pool {
                queue: VecDeque::new(),
                running: 0,
                submitted: 0,
                finished: 0,
            }),
            progress: Condvar::new(),
            timeout: config.group_timeout,
        });
        Self {
            front,
            shared,
            spawner,
            tasks: Vec::new(),
            max_concurrent_groups: config.max_concurrent_groups,
            shutdown_grace: config.shutdown_grace,
            open: true,
            #[cfg(not(kvtier_shuttle))]
            runtime: None,
        }
    }

    /// What the tier knows about `key`, recording that `request` asked (see
    /// [`LookupTable::lookup`]). Applies everything published first.
    #[inline(always)]
    pub fn lookup(&mut self, key: &K, request: &R) -> Result<Verdict<K>, LookupError> {
        self.ensure_open()?;
        Ok(self.front.lookup(key, request))
    }

    /// Ends the step: queues the new keys' groups and starts runner tasks
    /// for the free slots. Never waits. Returns how many keys were handed
    /// over.
    pub fn flush(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        let Some(submission) = self.front.take_submission() else {
            return Ok(0);
        };
        let keys = submission.key_count();
        let groups = submission.into_groups();
        let starts = {
            let mut pool = self.shared.pool.lock();
            pool.submitted += groups.len() as u64;
            pool.queue.extend(groups);
            // The bound: never more runners than slots.
            let free = self.max_concurrent_groups - pool.running;
            let starts = free.min(pool.queue.len());
            pool.running += starts;
            starts
        };
        self.tasks.retain(|task| !task.is_finished());
        // Spawned outside the lock: a runtime that is shutting down drops
        // the runner at once, and its destructor takes the lock.
        for _ in 0..starts {
            let runner = Runner {
                shared: self.shared.clone(),
                current: None,
                exited: false,
            };
            self.tasks.push(task::spawn(&self.spawner, runner.run()));
        }
        Ok(keys)
    }

    /// Applies every group result published so far; returns how many.
    pub fn drain(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        Ok(self.front.apply_published())
    }

    /// Blocks until every flushed group has been published (answered, timed
    /// out or cancelled), then applies them; returns how many were applied.
    /// For tests, demos and orderly pauses, not for the scheduler's hot
    /// path. With `group_timeout(None)` a hung backend makes this wait
    /// forever.
    pub fn wait_idle(&mut self) -> Result<usize, LookupError> {
        self.ensure_open()?;
        let mut pool = self.shared.pool.lock();
        while pool.finished < pool.submitted {
            pool = self.shared.progress.wait(pool);
        }
        drop(pool);
        Ok(self.front.apply_published())
    }

    /// Turns the hit recorded by `ticket` into a miss after its load failed
    /// (see [`LookupTable::mark_miss`]).
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
    pub fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.front.take_applied()
    }

    /// Counters of everything applied so far. Available after shutdown too.
    pub fn stats(&self) -> Stats {
        self.front.stats()
    }

    /// Groups flushed but not yet published: queued or being probed.
    pub fn outstanding_groups(&self) -> u64 {
        let pool = self.shared.pool.lock();
        pool.submitted - pool.finished
    }

    /// Stops the driver without ever waiting on a hung backend:
    ///
    /// 1. lets queued and running groups finish for at most `shutdown_grace`;
    /// 2. cancels the rest: queued groups and running calls are published
    ///    as [`GroupOutcome::Cancelled`] (every key a miss), running tasks
    ///    are aborted;
    /// 3. shuts down the runtime if the driver owns it, and applies every
    ///    published result.
    ///
    /// Returns [`LookupError::Stuck`] if aborted tasks did not stop within
    /// a second (a backend blocking its thread inside a future); their keys
    /// stay in flight. Afterwards every call but `stats`, `table` and
    /// `take_applied` returns [`LookupError::ShutDown`]. Dropping the driver
    /// does the same.
    pub fn shutdown(&mut self) -> Result<(), LookupError> {
        self.ensure_open()?;
        self.open = false;
        let stuck = self.stop();
        self.front.apply_published();
        match stuck {
            0 => Ok(()),
            groups => Err(LookupError::Stuck { groups }),
        }
    }
}

impl<K, R: Request, B> TokioLookup<K, R, B> {
    /// The table, read-only. Available after shutdown too.
    pub fn table(&self) -> &LookupTable<K, R> {
        self.front.table()
    }

    fn ensure_open(&self) -> Result<(), LookupError> {
        if self.open {
            Ok(())
        } else {
            Err(LookupError::ShutDown)
        }
    }

    /// Steps 1 and 2 of shutdown and the runtime's; returns how many groups
    /// are still unpublished.
    fn stop(&mut self) -> u64 {
        let shared = &*self.shared;
        let mut pool = shared.pool.lock();
        let deadline = deadline_after(self.shutdown_grace);
        while pool.finished < pool.submitted {
            pool = match deadline {
                None => shared.progress.wait(pool),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    shared.progress.wait_timeout(pool, deadline - now)
                }
            };
        }
        drop(pool);
        // Aborted runners publish their group and everything still queued
        // as cancelled, in queue order, when their task is dropped.
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let mut pool = shared.pool.lock();
        let deadline = Instant::now() + CANCEL_WAIT;
        while pool.running > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            pool = shared.progress.wait_timeout(pool, deadline - now);
        }
        // Left queued only if a runner is stuck (or none could start).
        let queued = pool.queue.len() as u64;
        for group in pool.queue.drain(..) {
            shared.published.push(cancelled(group));
        }
        pool.finished += queued;
        let unpublished = pool.submitted - pool.finished;
        drop(pool);
        if unpublished > 0 {
            tracing::error!(
                unpublished,
                "lookup driver shut down with backend calls that ignored cancellation; \
                 their keys stay in flight"
            );
        }
        #[cfg(not(kvtier_shuttle))]
        if let Some(runtime) = self.runtime.take() {
            // Never blocks, so dropping the driver inside an async context
            // is fine too; tasks still stuck in a blocking backend are left
            // to finish on their own threads.
            runtime.shutdown_background();
        }
        unpublished
    }
}

impl<K, R: Request, B> Drop for TokioLookup<K, R, B> {
    fn drop(&mut self) {
        if self.open {
            self.open = false;
            self.stop();
        }
    }
}

/// A group nobody will answer: every key a miss.
fn cancelled<K, R>(group: Group<K, R>) -> super::submission::GroupResult<K> {
    group.finish(Vec::new(), GroupOutcome::Cancelled)
}

/// A task that probes queued groups one after another until the queue is
/// empty. See the module docs for what its destructor guarantees.
struct Runner<K, R: Request, B> {
    shared: Arc<Shared<K, R, B>>,
    current: Option<Group<K, R>>,
    exited: bool,
}

impl<K, R, B> Runner<K, R, B>
where
    K: Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncLookupBackend<K, R>,
{
    async fn run(mut self) {
        loop {
            let group = {
                let mut pool = self.shared.pool.lock();
                match pool.queue.pop_front() {
                    Some(group) => group,
                    None => {
                        pool.running -= 1;
                        self.exited = true;
                        drop(pool);
                        // Shutdown may be waiting for the runners to exit.
                        self.shared.progress.notify_all();
                        return;
                    }
                }
            };
            let group = self.current.insert(group);
            let (found, end) = probe(&self.shared.backend, group, self.shared.timeout).await;
            let group = self.current.take().expect("the group being probed");
            // Each group is visible to the scheduler as soon as it
            // is done, not when the whole submission is.
            self.shared.published.push(settle(group, found, end));
            self.shared.pool.lock().finished += 1;
            self.shared.progress.notify_all();
        }
    }
}

impl<K, R: Request, B> Drop for Runner<K, R, B> {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        // Aborted, dropped by a runtime that is shutting down, or never
        // polled: nobody else will publish these groups.
        let mut pool = self.shared.pool.lock();
        let mut cancelled_groups = 0;
        for group in self.current.take().into_iter().chain(pool.queue.drain(..)) {
            self.shared.published.push(cancelled(group));
            cancelled_groups += 1;
        }
        pool.finished += cancelled_groups;
        pool.running -= 1;
        drop(pool);
        self.shared.progress.notify_all();
        if cancelled_groups > 0 {
            tracing::warn!(
                groups = cancelled_groups,
                "lookup groups cancelled unanswered; their keys are misses"
            );
        }
    }
}

/// One backend call for `group`, within `timeout`, with panics caught.
async fn probe<K, R, B>(
    backend: &B,
    group: &Group<K, R>,
    timeout: Option<Duration>,
) -> (Vec<bool>, CallEnd)
where
    R: Request,
    B: AsyncLookupBackend<K, R>,
{
    // Creating the backend's future runs backend code too, so it happens
    // inside the first (panic-guarded) poll; so does formatting its error.
    let call = catch_unwind(async {
        backend
            .batch_lookup(group.keys(), group.request())
            .await
            .map_err(|error| error.to_string())
    });
    match task::timeout(timeout, call).await {
        None => (Vec::new(), CallEnd::TimedOut),
        Some(Err(message)) => (Vec::new(), CallEnd::Panic(message)),
        Some(Ok(Err(error))) => (Vec::new(), CallEnd::Error(error)),
        Some(Ok(Ok(answers))) => {
            let mut found = Vec::with_capacity(group.len());
            let surplus = collect_answers(answers, group.len(), &mut found);
            (found, CallEnd::Answers { surplus })
        }
    }
}

/// `future`'s output, or the message of a panic raised while polling it.
/// A future that panicked is not polled again.
async fn catch_unwind<F: Future>(future: F) -> Result<F::Output, String> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(move |cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(take_panic(payload))),
        }
    })
    .await
}
