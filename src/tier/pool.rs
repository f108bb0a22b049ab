//! A few threads that run blocking I/O jobs, from one queue or from two
//! lanes each thread prefers one of.
//!
//! [`FsTier`](super::FsTier) saves through one lane, and its pool finishes
//! every queued save when dropped: a save handed to the tier is never lost.
//! vLLM's transfers ([`VllmTransfers`](super::VllmTransfers)) use two lanes,
//! loads and stores, with threads that serve loads first and threads that
//! serve stores first, so a promotion a request waits for is not queued
//! behind background saves while neither lane starves; at shutdown their
//! queued loads are dropped and their queued stores get a bounded time to
//! start ([`close_within`](IoPool::close_within)); what is still queued then
//! is dropped (a job's completer then ends its task as abandoned).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::fault::{drop_payload, take_panic};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex, thread};

type Job = Box<dyn FnOnce() + Send>;

/// A pool's lanes (at most two).
const LANES: usize = 2;

struct Queue {
    lanes: [VecDeque<Job>; LANES],
    closing: bool,
}

impl Queue {
    /// The next job for a thread that prefers `lane`: the oldest of that
    /// lane, else the oldest of the other.
    fn pop(&mut self, lane: usize) -> Option<Job> {
        let [first, second] = &mut self.lanes;
        let (preferred, other) = if lane == 0 {
            (first, second)
        } else {
            (second, first)
        };
        // guard: V5-threads-serve-their-lane-first
        preferred.pop_front().or_else(|| other.pop_front())
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Signalled when a closing pool's queue runs empty.
    emptied: Condvar,
    /// Threads that have not returned from `serve`.
    alive: AtomicUsize,
}

/// Runs jobs on its threads; dropping it joins them, after finishing the
/// queued jobs (or dropping them, after [`discard_queued`](Self::discard_queued)).
pub(crate) struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl IoPool {
    /// `threads` threads serving one lane.
    pub(crate) fn start(threads: usize, name: &str) -> std::io::Result<Self> {
        Self::with_lanes([threads, 0], name)
    }

    /// `threads[lane]` threads preferring each lane (threads of lane 0 are
    /// named `<name>-l<i>`, of lane 1 `<name>-s<i>` when both have some).
    pub(crate) fn with_lanes(threads: [usize; LANES], name: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                lanes: [VecDeque::new(), VecDeque::new()],
                closing: false,
            }),
            ready: Condvar::new(),
            emptied: Condvar::new(),
            alive: AtomicUsize::new(0),
        });
        // A last line behind the callers' typed checks: a thread count never
        // sizes an allocation unchecked.
        let total = threads[0].checked_add(threads[1]);
        let Some(total) = total.filter(|&total| total <= crate::settings::MAX_IO_THREADS) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "at most {} I/O threads, not {threads:?}",
                    crate::settings::MAX_IO_THREADS
                ),
            ));
        };
        let mut pool = Self {
            shared,
            threads: Vec::with_capacity(total),
        };
        let tags = if threads[1] == 0 {
            ["", ""]
        } else {
            ["l", "s"]
        };
        for (lane, &count) in threads.iter().enumerate() {
            for i in 0..count {
                let shared = pool.shared.clone();
                shared.alive.fetch_add(1, Ordering::SeqCst);
                // On failure `pool` is dropped, which stops the threads started.
                let spawned = thread::Builder::new()
                    .name(format!("{name}-{}{i}", tags[lane]))
                    .spawn(move || serve(&shared, lane));
                match spawned {
                    Ok(handle) => pool.threads.push(handle),
                    Err(error) => {
                        pool.shared.alive.fetch_sub(1, Ordering::SeqCst);
                        return Err(error);
                    }
                }
            }
        }
        Ok(pool)
    }

    pub(crate) fn submit(&self, job: Job) {
        self.submit_to(0, job);
    }

    /// Queues `job` on `lane` (0 or 1).
    pub(crate) fn submit_to(&self, lane: usize, job: Job) {
        self.shared.queue.lock().lanes[lane.min(LANES - 1)].push_back(job);
        self.shared.ready.notify_one();
    }

    /// Jobs queued on `lane` that no thread has started.
    pub(crate) fn queued(&self, lane: usize) -> usize {
        self.shared.queue.lock().lanes[lane.min(LANES - 1)].len()
    }

    /// Threads still serving (all of them until the pool is dropped, unless
    /// one could not be kept running).
    pub(crate) fn threads_alive(&self) -> usize {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Drops every queued job no thread has started; returns how many. Jobs
    /// running go on.
    pub(crate) fn discard_queued(&self) -> usize {
        self.discard_lanes(&[0, 1])
    }

    /// Drops the jobs queued on `lanes` that no thread has started; returns
    /// how many.
    pub(crate) fn discard_lanes(&self, lanes: &[usize]) -> usize {
        let dropped: Vec<Job> = {
            let mut queue = self.shared.queue.lock();
            lanes
                .iter()
                .flat_map(|&lane| std::mem::take(&mut queue.lanes[lane.min(LANES - 1)]))
                .collect()
        };
        // Dropped outside the lock: a job's completer wakes its waiters.
        dropped.len()
    }

    /// Closes the pool and gives its threads `grace` to start the jobs
    /// queued; drops the jobs still queued then and returns how many. Jobs
    /// running go on (dropping the pool joins them), so the wait is bounded
    /// by `grace` plus the longest single job.
    pub(crate) fn close_within(&self, grace: Duration) -> usize {
        let deadline = Instant::now().checked_add(grace);
        {
            let mut queue = self.shared.queue.lock();
            queue.closing = true;
            self.shared.ready.notify_all();
            // guard: V6-shutdown-drains-queued-stores
            while queue.lanes.iter().any(|lane| !lane.is_empty()) {
                let now = Instant::now();
                let left = match deadline {
                    Some(deadline) if deadline <= now => break,
                    Some(deadline) => deadline - now,
                    None => Duration::from_secs(3600),
                };
                queue = self.shared.emptied.wait_timeout(queue, left);
            }
        }
        self.discard_queued()
    }
}

fn serve(shared: &Shared, lane: usize) {
    loop {
        let job = {
            let mut queue = shared.queue.lock();
            loop {
                // guard: F13-pool-finishes-queued-jobs
                if let Some(job) = queue.pop(lane) {
                    if queue.closing && queue.lanes.iter().all(VecDeque::is_empty) {
                        shared.emptied.notify_all();
                    }
                    break Some(job);
                }
                if queue.closing {
                    break None;
                }
                queue = shared.ready.wait(queue);
            }
        };
        let Some(job) = job else { break };
        // A job's completer reports a panic as an abandoned task when it is
        // dropped during the unwind; the thread keeps serving.
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
            tracing::error!(panic = %take_panic(payload), "I/O job panicked");
        }
    }
    shared.alive.fetch_sub(1, Ordering::SeqCst);
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.queue.lock().closing = true;
        self.shared.ready.notify_all();
        for handle in self.threads.drain(..) {
            if let Err(payload) = handle.join() {
                drop_payload(payload);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::atomic::AtomicBool;

    /// A job that waits until `gate` opens, then counts itself in `ran`.
    fn gated(gate: &Arc<(Mutex<bool>, Condvar)>, ran: &Arc<AtomicUsize>) -> Job {
        let (gate, ran) = (gate.clone(), ran.clone());
        Box::new(move || {
            let (open, opened) = &*gate;
            let mut open = open.lock();
            while !*open {
                open = opened.wait(open);
            }
            ran.fetch_add(1, Ordering::SeqCst);
        })
    }

    fn open(gate: &Arc<(Mutex<bool>, Condvar)>) {
        *gate.0.lock() = true;
        gate.1.notify_all();
    }

    #[test]
    fn a_thread_serves_its_own_lane_first_and_the_other_when_it_is_empty() {
        let pool = IoPool::with_lanes([1, 0], "lanes").expect("pool");
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let ran = Arc::new(AtomicUsize::new(0));
        // Holds the one thread while both lanes fill.
        pool.submit_to(0, gated(&gate, &ran));
        while pool.queued(0) > 0 {
            std::thread::yield_now();
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        for (lane, tag) in [(1, "store"), (0, "load"), (1, "store2")] {
            let order = order.clone();
            pool.submit_to(lane, Box::new(move || order.lock().push(tag)));
        }
        assert_eq!((pool.queued(0), pool.queued(1)), (1, 2));
        open(&gate);
        drop(pool); // finishes the queued jobs
        assert_eq!(*order.lock(), ["load", "store", "store2"]);
    }

    #[test]
    fn discarded_jobs_never_run_and_running_ones_finish() {
        let pool = IoPool::with_lanes([1, 1], "discard").expect("pool");
        assert_eq!(pool.threads_alive(), 2);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let ran = Arc::new(AtomicUsize::new(0));
        pool.submit_to(0, gated(&gate, &ran));
        pool.submit_to(1, gated(&gate, &ran));
        while pool.queued(0) + pool.queued(1) > 0 {
            std::thread::yield_now();
        }
        let late = Arc::new(AtomicBool::new(false));
        for lane in [0, 1, 1] {
            let late = late.clone();
            pool.submit_to(lane, Box::new(move || late.store(true, Ordering::SeqCst)));
        }
        assert_eq!(pool.discard_queued(), 3);
        open(&gate);
        drop(pool);
        assert_eq!(ran.load(Ordering::SeqCst), 2, "the running jobs finished");
        assert!(!late.load(Ordering::SeqCst), "no discarded job ran");
    }
}
