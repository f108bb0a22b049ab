//! The runner tasks that probe queued groups, and the queue they share with
//! the scheduler. See the parent module for the design.

use std::collections::VecDeque;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use super::backend::{AsyncBackend, probe};
use crate::lookup::backend::settle;
use crate::lookup::scheduler::Publisher;
use crate::lookup::submission::Group;
use crate::lookup::types::Request;
use crate::sync::{Arc, Condvar, Mutex};

/// How long shutdown waits for aborted runners to drop their groups. An
/// abort takes effect at the task's next await, so only a backend that
/// blocks its thread inside a future can make this wait run out.
pub(super) const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// The groups between the scheduler and the runners.
pub(super) struct Pool<K, R> {
    pub(super) queue: VecDeque<Group<K, R>>,
    /// Runners started and not yet exited; never above the concurrency.
    pub(super) running: usize,
    /// Groups handed over / published, for `wait_idle` and shutdown.
    pub(super) submitted: u64,
    pub(super) finished: u64,
}

pub(super) struct Shared<K, R, B> {
    pub(super) backend: B,
    pub(super) published: Publisher<K>,
    pub(super) pool: Mutex<Pool<K, R>>,
    /// Signals the scheduler: `finished` grew or a runner exited.
    pub(super) progress: Condvar,
    pub(super) timeout: Option<Duration>,
}

/// A task that probes queued groups one after another until the queue is
/// empty. See the module docs for what its destructor guarantees.
pub(super) struct Runner<K, R: Request, B> {
    pub(super) shared: Arc<Shared<K, R, B>>,
    pub(super) current: Option<Group<K, R>>,
    pub(super) exited: bool,
}

impl<K, R, B> Runner<K, R, B>
where
    K: Send + Sync + 'static,
    R: Request + Send + Sync + 'static,
    B: AsyncBackend<K, R>,
{
    pub(super) async fn run(mut self) {
        loop {
            let group = {
                let mut pool = self.shared.pool.lock();
                match pool.queue.pop_front() {
                    Some(group) => group,
                    None => {
                        pool.running -= 1;
                        self.exited = true;
                        // guard: T3-runner-exit-notifies
                        drop(pool);
                        // Shutdown may be waiting for the runners to exit.
                        self.shared.progress.notify_all();
                        return;
                    }
                }
            };
            // L15: a group nobody wants any more is not probed (the time it
            // spent queued may have outlived its requests), and a probe whose
            // keys all lose their requests while it runs is dropped. Both are
            // the race below: `unwanted` is polled before the call starts.
            let group = self.current.insert(group);
            let found = group.found_buffer();
            let call = probe(&self.shared.backend, group, found, self.shared.timeout);
            // guard: L15-tokio-prober-drops-unwanted-running-probes
            let ended = first_of(call, group.unwanted()).await;
            let group = self.current.take().expect("the group being probed");
            let result = match ended {
                Some((found, end)) => settle(group, found, end),
                None => group.abandoned(),
            };
            // Each group is visible to the scheduler as soon as it
            // is done, not when the whole submission is.
            self.shared.published.publish(result);
            self.shared.pool.lock().finished += 1;
            self.shared.progress.notify_all();
        }
    }
}

/// `call`'s output, or `None` if `unwanted` finished first (`call` is then
/// dropped, as a timeout drops it). `unwanted` is polled first: its waker is
/// registered before the backend call starts, and once it is ready nobody
/// wants the call's answers anyway.
async fn first_of<T>(
    call: impl Future<Output = T>,
    unwanted: impl Future<Output = ()>,
) -> Option<T> {
    let mut call = std::pin::pin!(call);
    let mut unwanted = std::pin::pin!(unwanted);
    std::future::poll_fn(move |cx| {
        if unwanted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        call.as_mut().poll(cx).map(Some)
    })
    .await
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
        // guard: T2-cancelled-group-published
        // guard: T2-queue-cancelled-with-runner
        for group in self.current.take().into_iter().chain(pool.queue.drain(..)) {
            self.shared.published.publish(group.cancelled());
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
