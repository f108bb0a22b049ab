//! What every worker thread of kvtier waits on: a queue of jobs under a
//! mutex, and the rule for taking the next one.

use crate::sync::{Condvar, Mutex};

/// A queue a worker thread serves.
pub(crate) trait Jobs {
    /// One unit of work.
    type Job;

    /// Takes the oldest queued job.
    fn pop(&mut self) -> Option<Self::Job>;

    /// Whether the owner asked the workers to stop.
    fn closing(&self) -> bool;
}

/// Blocks until `queue` holds a job and takes it; `None` once the queue is
/// closing and empty. Queued jobs are served before closing is honoured,
/// so nothing submitted before a shutdown is lost. `ready` must be
/// notified after every push and when closing is set.
pub(crate) fn next_job<Q: Jobs>(queue: &Mutex<Q>, ready: &Condvar) -> Option<Q::Job> {
    let mut queue = queue.lock();
    loop {
        // guard: L8-shutdown-finishes-queued-work
        if let Some(job) = queue.pop() {
            return Some(job);
        }
        if queue.closing() {
            return None;
        }
        queue = ready.wait(queue);
    }
}
