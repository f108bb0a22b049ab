//! The tokio prober: each request group is probed by an async task, up to
//! `max_concurrent_groups` at once, each bounded by a timeout.
//!
//! Everything tokio-specific, and the twin built for shuttle's executor
//! under `--cfg kvtier_shuttle`, lives in this folder.
//!
//! Groups wait in a FIFO queue under one mutex. A flush queues its groups
//! and starts as many *runner* tasks as there are free slots; a runner takes
//! the queue's head, probes it, publishes the result through its
//! [`Publisher`] (the same lock-free stack and the same table as the thread
//! prober), and takes the next head until the queue is empty. With one slot
//! a single runner serves the queue in order, which is the thread prober's
//! FIFO; with more, a fast group queued behind a slow one is published as
//! soon as it is done.
//!
//! A runner owns the group it is probing. However the runner ends without
//! finishing (aborted at shutdown, dropped by a runtime shutting down, never
//! polled at all), its destructor publishes that group, and every group
//! still queued, as [`GroupOutcome::Cancelled`]: every key a miss, none left
//! in flight.

mod backend;
mod config;
mod runner;

use std::fmt;
use std::hash::Hash;
#[cfg(not(kvtier_shuttle))]
use std::panic;
use std::time::{Duration, Instant};

pub use backend::AsyncBackend;
pub use config::TokioConfig;
use runner::{CANCEL_WAIT, Pool, Runner, Shared};

use super::error::LookupError;
use super::scheduler::{Lookup, Prober, Publisher, Refused};
use super::submission::Submission;
use super::types::Request;
use crate::sync::{Arc, Condvar, Mutex, task};

/// A [`Prober`] that probes an [`AsyncBackend`] with tokio tasks, several
/// groups at once, each within a timeout. Built by [`Lookup::tokio`] and
/// [`Lookup::tokio_on`].
///
/// - Up to `max_concurrent_groups` groups are probed at once, each
///   published as soon as it is done, so a slow group does not hold back
///   the ones behind it.
/// - Each backend call is bounded by `group_timeout`: on expiry its future
///   is dropped and its keys become misses.
/// - Shutdown lets outstanding groups finish for at most `shutdown_grace`,
///   then cancels them (their keys become misses); it never waits on a hung
///   backend. Groups whose calls ignore cancellation (a backend blocking its
///   thread inside a future) make it return [`LookupError::Stuck`] after a
///   second; their keys stay in flight.
///
/// The scheduler calls never block and never need to run inside the
/// runtime. `wait_idle` and `shutdown` block the calling thread, so call
/// them from a thread that is not one of the runtime's workers.
pub struct TokioProber<K, R: Request, B> {
    shared: Arc<Shared<K, R, B>>,
    spawner: task::Spawner,
    /// Runner tasks not known to have finished, for aborting at shutdown.
    tasks: Vec<task::Task>,
    max_concurrent_groups: usize,
    shutdown_grace: Duration,
    stopped: bool,
    #[cfg(not(kvtier_shuttle))]
    runtime: Option<::tokio::runtime::Runtime>,
}

/// A [`Lookup`] whose groups tokio tasks probe.
pub type TokioLookup<K, R, B> = Lookup<K, R, TokioProber<K, R, B>>;

#[cfg(not(kvtier_shuttle))]
impl<K, R, B> Lookup<K, R, TokioProber<K, R, B>>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncBackend<K, R>,
{
    /// A lookup whose groups are probed with `backend` on a multi-threaded
    /// runtime of its own (`worker_threads` threads named `kvtier-lookup`),
    /// shut down with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kvtier::Lookup;
    /// use kvtier::lookup::{AsyncBackend, TokioConfig};
    ///
    /// struct EvenKeys;
    ///
    /// impl AsyncBackend<u64, String> for EvenKeys {
    ///     type Error = std::convert::Infallible;
    ///
    ///     async fn batch_lookup(&self, keys: &[u64], _: &String) -> Result<Vec<bool>, Self::Error> {
    ///         Ok(keys.iter().map(|key| key % 2 == 0).collect())
    ///     }
    /// }
    ///
    /// let config = TokioConfig::default().group_timeout(Some(Duration::from_secs(1)));
    /// let mut lookup = Lookup::tokio(EvenKeys, config)?;
    /// let request = "req-1".to_string();
    /// assert!(lookup.lookup(&4, &request).is_pending());
    /// lookup.flush()?;
    /// lookup.wait_idle()?; // a real scheduler just asks again next step
    /// assert!(lookup.lookup(&4, &request).is_hit());
    /// lookup.shutdown()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tokio(backend: B, config: TokioConfig) -> Result<Self, LookupError> {
        Self::try_with_prober(|results| TokioProber::spawn(backend, config, results))
    }

    /// A lookup whose groups are probed with `backend` on the caller's
    /// runtime. The runtime must keep running tasks while the scheduler
    /// works: a multi-threaded runtime, or a current-thread one driven by
    /// another thread. With a group timeout it must have its time driver
    /// (`enable_time` or `enable_all`): without one this is a
    /// [`LookupError::Config`], where every group would otherwise be
    /// cancelled and every stored key read as a miss.
    pub fn tokio_on(
        backend: B,
        config: TokioConfig,
        handle: ::tokio::runtime::Handle,
    ) -> Result<Self, LookupError> {
        config.validate()?;
        if config.group_timeout.is_some() && !has_timers(&handle) {
            return Err(LookupError::Config(
                "the runtime has no time driver, which the group timeout needs: build it with \
                 enable_time() or enable_all(), or set group_timeout(None)"
                    .into(),
            ));
        }
        Ok(Self::with_prober(|results| {
            TokioProber::start(backend, &config, handle, results)
        }))
    }
}

#[cfg(kvtier_shuttle)]
impl<K, R, B> Lookup<K, R, TokioProber<K, R, B>>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncBackend<K, R>,
{
    /// Under `--cfg kvtier_shuttle`: runs the groups as tasks of shuttle's
    /// executor, inside a shuttle test.
    pub fn tokio(backend: B, config: TokioConfig) -> Result<Self, LookupError> {
        config.validate()?;
        Ok(Self::with_prober(|results| {
            TokioProber::start(backend, &config, task::Spawner, results)
        }))
    }
}

#[cfg(not(kvtier_shuttle))]
impl<K, R, B> TokioProber<K, R, B>
where
    K: Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncBackend<K, R>,
{
    /// A prober of its own on a multi-threaded runtime of its own
    /// (`worker_threads` threads named `kvtier-lookup`, shut down with it),
    /// publishing through `results`: what [`Lookup::tokio`] builds, for a
    /// caller that composes probers itself (behind a trait object, say).
    pub fn spawn(
        backend: B,
        config: TokioConfig,
        results: Publisher<K>,
    ) -> Result<Self, LookupError> {
        config.validate()?;
        let runtime = ::tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.worker_threads)
            .thread_name("kvtier-lookup")
            // Timers for the group timeout, and I/O for network backends
            // (whatever this build of tokio has).
            .enable_all()
            .build()
            .map_err(LookupError::Spawn)?;
        let mut prober = Self::start(backend, &config, runtime.handle().clone(), results);
        prober.runtime = Some(runtime);
        Ok(prober)
    }
}

impl<K, R: Request, B> TokioProber<K, R, B> {
    fn start(
        backend: B,
        config: &TokioConfig,
        spawner: task::Spawner,
        published: Publisher<K>,
    ) -> Self {
        let shared = Arc::new(Shared {
            backend,
            published,
            pool: Mutex::new(Pool {
                queue: std::collections::VecDeque::new(),
                running: 0,
                submitted: 0,
                finished: 0,
            }),
            progress: Condvar::new(),
            timeout: config.group_timeout,
        });
        Self {
            shared,
            spawner,
            tasks: Vec::new(),
            max_concurrent_groups: config.max_concurrent_groups,
            shutdown_grace: config.shutdown_grace,
            stopped: false,
            #[cfg(not(kvtier_shuttle))]
            runtime: None,
        }
    }

    /// Groups taken but not yet published: queued or being probed.
    pub fn outstanding_groups(&self) -> u64 {
        let pool = self.shared.pool.lock();
        pool.submitted - pool.finished
    }
}

impl<K, R, B> Prober<K, R> for TokioProber<K, R, B>
where
    K: Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncBackend<K, R>,
{
    /// Queues the groups and starts runner tasks for the free slots.
    fn submit(&mut self, submission: Submission<K, R>) -> Result<(), Refused<K, R>> {
        let groups = submission.into_groups();
        let starts = {
            let mut pool = self.shared.pool.lock();
            pool.submitted += groups.len() as u64;
            pool.queue.extend(groups);
            // The bound: never more runners than slots.
            // guard: T1-concurrency-bound
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
        Ok(())
    }

    /// Waits until every group was published: answered, timed out or
    /// cancelled. With `group_timeout(None)` a hung backend makes this wait
    /// forever.
    fn wait_idle(&mut self) -> Result<(), LookupError> {
        let mut pool = self.shared.pool.lock();
        while pool.finished < pool.submitted {
            pool = self.shared.progress.wait(pool);
        }
        Ok(())
    }

    fn wait_idle_for(&mut self, limit: Duration) -> Result<bool, LookupError> {
        let deadline = Instant::now() + limit;
        let mut pool = self.shared.pool.lock();
        while pool.finished < pool.submitted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            pool = self.shared.progress.wait_timeout(pool, left);
        }
        Ok(true)
    }

    /// 1. Lets queued and running groups finish for at most
    ///    `shutdown_grace`;
    /// 2. cancels the rest: queued groups and running calls are published
    ///    as cancelled (every key a miss), running tasks are aborted;
    /// 3. shuts down the runtime if the prober owns it.
    fn shutdown(&mut self) -> Result<(), LookupError> {
        match self.stop() {
            0 => Ok(()),
            groups => Err(LookupError::Stuck { groups }),
        }
    }
}

impl<K, R: Request, B> TokioProber<K, R, B> {
    /// Steps 1 and 2 of shutdown and the runtime's; returns how many groups
    /// are still unpublished.
    fn stop(&mut self) -> u64 {
        if self.stopped {
            return 0;
        }
        self.stopped = true;
        let shared = &*self.shared;
        let mut pool = shared.pool.lock();
        let deadline = deadline_after(self.shutdown_grace);
        while pool.finished < pool.submitted {
            pool = match deadline {
                None => shared.progress.wait(pool),
                Some(deadline) => {
                    let now = Instant::now();
                    // guard: T3-grace-deadline
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
            // guard: T3-abort-at-shutdown
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
            shared.published.publish(group.cancelled());
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

impl<K, R: Request, B> Drop for TokioProber<K, R, B> {
    fn drop(&mut self) {
        // Only a prober never handed to a `Lookup` is still running here.
        self.stop();
    }
}

impl<K, R: Request, B> fmt::Debug for TokioProber<K, R, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokioProber")
            .field("outstanding_groups", &self.outstanding_groups())
            .field("max_concurrent_groups", &self.max_concurrent_groups)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

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
