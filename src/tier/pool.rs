//! A few threads that run blocking I/O jobs in submission order.

use std::collections::VecDeque;

use crate::fault::{drop_payload, take_panic};
use crate::sync::{Condvar, Mutex, thread};
use crate::worker::{Jobs, next_job};

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    closing: bool,
}

impl Jobs for Queue {
    type Job = Job;

    fn pop(&mut self) -> Option<Job> {
        self.jobs.pop_front()
    }

    fn closing(&self) -> bool {
        self.closing
    }
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// Runs jobs on its threads; dropping it lets the threads finish every
/// queued job, then joins them, so no save submitted before is lost.
pub(crate) struct IoPool {
    shared: crate::sync::Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl IoPool {
    pub(crate) fn start(threads: usize, name: &str) -> std::io::Result<Self> {
        let shared = crate::sync::Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                closing: false,
            }),
            ready: Condvar::new(),
        });
        let mut pool = Self {
            shared,
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let shared = pool.shared.clone();
            // On failure `pool` is dropped, which stops the threads started.
            let handle = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || serve(&shared))?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    pub(crate) fn submit(&self, job: Job) {
        self.shared.queue.lock().jobs.push_back(job);
        self.shared.ready.notify_one();
    }
}

fn serve(shared: &Shared) {
    while let Some(job) = next_job(&shared.queue, &shared.ready) {
        // A job's completer reports a panic as an abandoned task when it is
        // dropped during the unwind; the thread keeps serving.
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
            tracing::error!(panic = %take_panic(payload), "I/O job panicked");
        }
    }
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
