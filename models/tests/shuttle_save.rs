//! shuttle model of deferred save completion at sizes loom cannot reach:
//! eight live requests over four steps, two workers (one of which may skip
//! saving a step), tasks shared by several requests and one task per layer,
//! refused submissions, failed, timed-out and abandoned saves, preemptions,
//! and finishes, while every save's I/O runs on its own thread and completes
//! a real `CompletionTask`.
//!
//! Each I/O thread marks the blocks it reads (a per-request reader count)
//! and asserts that none of them was released yet; the worker asserts, when
//! a request is freed (every worker reported it) or fenced, that nobody reads
//! it (S1, S5). Reports go through a `ReportAggregator` that rejects
//! duplicates and unexpected ids (S2, S3); at the end every delayed request
//! must have been freed and every handle released exactly once (S2, S4),
//! and the scheduler's set must match every worker's at every step (S6).
//!
//! The workload is drawn from `shuttle::rand`, so a printed failing schedule
//! replays workload and interleaving together.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_save`
//! - `KVTIER_SHUTTLE_ITERATIONS=N`: schedules per test (default 100,000).
//! - `KVTIER_SHUTTLE_REPLAY='<schedule>'`: replays a printed failing schedule.
#![cfg(kvtier_shuttle)]

use kvtier::{
    SaveScheduler, SaveTracker, save::Completer, save::CompletionMode, save::CompletionTask,
    save::ReportAggregator, save::TaskError,
};
use kvtier_models::checkers::{Schedules, run_shuttle};
use shuttle::rand::{Rng, thread_rng};
use shuttle::sync::Arc;
use shuttle::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use shuttle::thread::{self, JoinHandle};

/// Requests live at the same time.
const LIVE: usize = 8;
const WORKERS: usize = 2;
const STEPS: usize = 4;

/// What the I/O threads and the worker share about one request's blocks.
#[derive(Default)]
struct BlockState {
    /// Saves reading the blocks right now.
    readers: AtomicUsize,
    /// The blocks were freed or fenced (and may be overwritten).
    released: AtomicBool,
}

/// The device event a task owns; counts releases (S4).
struct Event(Arc<AtomicUsize>);

impl Drop for Event {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

type Worker = SaveTracker<u64, CompletionTask<Event>>;

struct World {
    blocks: Vec<Arc<BlockState>>,
    released_handles: Arc<AtomicUsize>,
    tasks: usize,
    io: Vec<JoinHandle<()>>,
}

impl World {
    fn block(&self, request: u64) -> &Arc<BlockState> {
        &self.blocks[request as usize]
    }

    /// Submits one save of `requests` to `worker`: its I/O runs on a new
    /// thread and ends as the workload drew it.
    fn save(&mut self, worker: &mut Worker, requests: &[u64], rng: &mut impl Rng) {
        let (task, completer) = CompletionTask::new(Event(self.released_handles.clone()));
        worker.submit(task, requests);
        self.tasks += 1;
        let blocks: Vec<Arc<BlockState>> =
            requests.iter().map(|r| self.block(*r).clone()).collect();
        let ending = rng.gen_range(0..10u8);
        self.io
            .push(thread::spawn(move || io(blocks, completer, ending)));
    }

    /// The blocks of `request` are released: nothing may read them now.
    fn release(&self, request: u64, why: &str) {
        let block = self.block(request);
        assert_eq!(
            block.readers.load(Ordering::SeqCst),
            0,
            "{why}: request {request}'s blocks released while a save reads them"
        );
        block.released.store(true, Ordering::SeqCst);
    }
}

fn io(blocks: Vec<Arc<BlockState>>, completer: Completer, ending: u8) {
    for block in &blocks {
        block.readers.fetch_add(1, Ordering::SeqCst);
        assert!(
            !block.released.load(Ordering::SeqCst),
            "a save reads blocks that were already released"
        );
    }
    thread::yield_now();
    for block in &blocks {
        block.readers.fetch_sub(1, Ordering::SeqCst);
    }
    match ending {
        0 => completer.fail(TaskError::failed("device error")),
        1 => completer.complete(Err(TaskError::TimedOut)),
        2 => drop(completer),
        _ => completer.succeed(),
    }
}

fn save_workload(mode: CompletionMode) {
    let mut rng = thread_rng();
    // Every id a run can use: the live ones and one fresh id per finish.
    let requests = (LIVE * (STEPS + 1)) as u64;
    let mut world = World {
        blocks: (0..requests)
            .map(|_| Arc::new(BlockState::default()))
            .collect(),
        released_handles: Arc::new(AtomicUsize::new(0)),
        tasks: 0,
        io: Vec::new(),
    };
    let mut scheduler = SaveScheduler::new();
    let mut workers: Vec<Worker> = (0..WORKERS).map(|_| SaveTracker::with_mode(mode)).collect();
    let mut frees = ReportAggregator::new(WORKERS).unwrap();
    let mut live: Vec<u64> = (0..LIVE as u64).collect();
    let mut next = LIVE as u64;
    let mut delayed = 0;

    for _ in 0..STEPS {
        // Preempted requests are fenced at the start of the step, on every worker.
        let preempted: Vec<u64> = live
            .iter()
            .copied()
            .filter(|_| rng.gen_range(0..8) == 0)
            .collect();
        for worker in &mut workers {
            worker.handle_preemptions(&preempted);
        }
        for request in &preempted {
            world.release(*request, "S5 preemption fence");
            world
                .block(*request)
                .released
                .store(false, Ordering::SeqCst); // rescheduled later
        }

        let step = scheduler.record_step(live.iter().map(|r| (*r, rng.gen_range(0..3usize))));
        for (rank, worker) in workers.iter_mut().enumerate() {
            worker.begin_step(&step).expect("steps in sequence");
            let saving = step.requests();
            if saving.is_empty() || (rank == 1 && rng.gen_range(0..4) == 0) {
                continue; // this rank saves nothing this step, after recording
            }
            match rng.gen_range(0..6) {
                // One task shared by every saving request.
                0 | 1 => world.save(worker, saving, &mut rng),
                // One task per layer (two layers), each reading everything.
                2 => {
                    world.save(worker, saving, &mut rng);
                    world.save(worker, saving, &mut rng);
                }
                // One task per request.
                3 | 4 => {
                    for request in saving {
                        world.save(worker, &[*request], &mut rng);
                    }
                }
                _ => worker.submit_failed(saving, "store queue full"),
            }
        }
        for worker in &mut workers {
            if rng.gen_bool(0.5) {
                worker.poll();
            }
        }
        // S6: a worker tracks exactly the requests the scheduler delays,
        // plus finished ones whose free still waits for a report.
        for request in 0..next {
            for worker in &workers {
                let tracked = worker.is_tracked(&request);
                assert!(
                    !scheduler.is_delayed(&request) || tracked,
                    "S6: {request} delayed, not tracked"
                );
                assert!(
                    !tracked || scheduler.is_delayed(&request) || frees.is_waiting(&request),
                    "S6: {request} tracked, but nobody delays its free"
                );
            }
        }

        // Some requests finish; their slots get fresh ids.
        let finished: Vec<u64> = live
            .iter()
            .copied()
            .filter(|_| rng.gen_range(0..3) == 0)
            .collect();
        for request in &finished {
            if scheduler.request_finished(request) {
                frees.expect(*request);
                delayed += 1;
            }
            let slot = live.iter().position(|r| r == request).expect("live");
            live[slot] = next;
            next += 1;
        }
        for (rank, worker) in workers.iter_mut().enumerate() {
            let reported = worker.get_finished(&finished);
            let report = frees.report(rank, reported).expect("a real worker");
            assert!(
                report.is_clean(),
                "S2/S3: every report expected, once: {report:?}"
            );
            for request in report.free {
                world.release(request, "S1 free");
            }
        }
        thread::yield_now();
    }

    // Everything finishes; the workers report until every free happened.
    for request in live.clone() {
        if scheduler.request_finished(&request) {
            frees.expect(request);
            delayed += 1;
        }
    }
    let mut first = true;
    while frees.waiting() > 0 {
        for (rank, worker) in workers.iter_mut().enumerate() {
            let reported = worker.get_finished(if first { &live } else { &[] });
            let report = frees.report(rank, reported).expect("a real worker");
            assert!(
                report.is_clean(),
                "S2/S3: every report expected, once: {report:?}"
            );
            for request in report.free {
                world.release(request, "S1 free");
            }
        }
        first = false;
        thread::yield_now();
    }
    for thread in std::mem::take(&mut world.io) {
        thread.join().expect("an I/O thread failed");
    }
    let reported: u64 = workers.iter().map(|w| w.stats().reported).sum();
    assert_eq!(
        reported,
        (delayed * WORKERS) as u64,
        "S2: every delayed request, once per worker"
    );
    for worker in &workers {
        assert_eq!(worker.running_tasks(), 0, "S4: every task reaped or waited");
        assert_eq!(worker.tracked_requests(), 0);
        worker.check_invariants().expect("tracker invariants");
    }
    assert_eq!(
        world.released_handles.load(Ordering::SeqCst),
        world.tasks,
        "S4: each handle once"
    );
}

fn non_blocking() {
    save_workload(CompletionMode::NonBlocking);
}

fn blocking() {
    save_workload(CompletionMode::Blocking);
}

#[test]
fn non_blocking_save_tracking_under_random_schedules() {
    run_shuttle("save non-blocking", non_blocking, Schedules::Random);
}

#[test]
fn non_blocking_save_tracking_under_pct_schedules() {
    run_shuttle("save non-blocking", non_blocking, Schedules::Pct);
}

#[test]
fn blocking_save_tracking_under_random_schedules() {
    run_shuttle("save blocking", blocking, Schedules::Random);
}
