//! loom models of deferred save completion: the real [`SaveTracker`] on the
//! model's main thread (the worker) and real [`CompletionTask`]s completed by
//! I/O threads, every interleaving up to the preemption bound.
//!
//! The blocks are `loom::cell::UnsafeCell`s: an I/O thread reads the blocks
//! of its task's requests, and the worker overwrites a request's blocks as
//! soon as the tracker lets it (the request was reported, or the preemption
//! fence for it returned) — which is what vLLM does by freeing and reusing
//! them. If the tracker ever let that happen while a task could still read
//! them (S1, S5), the read and the write would not be ordered and loom would
//! report the race. Each model also counts handle releases (S4) and reports
//! (S2, S3).
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_save -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5` (the default bound here is 3), or
//! `KVTIER_LOOM_EXHAUSTIVE=1` for no bound at all.
#![cfg(kvtier_loom)]

use std::sync::atomic::{AtomicUsize, Ordering};

use kvtier::{
    SaveScheduler, SaveStep, SaveTracker, save::Completer, save::CompletionMode,
    save::CompletionTask, save::TaskError,
};
use kvtier_models::checkers::explore;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread::{self, JoinHandle};

/// One request's KV blocks.
type Blocks = Arc<UnsafeCell<u64>>;

/// The device event a task owns; counts its releases (S4).
struct Event(std::sync::Arc<AtomicUsize>);

impl Drop for Event {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// How an I/O thread ends its task.
#[derive(Clone, Copy)]
enum Io {
    Succeeds,
    Fails,
    Dies,
}

/// Starts an I/O thread that reads `blocks` and then completes the task.
fn start_io(blocks: Vec<Blocks>, completer: Completer, io: Io) -> JoinHandle<()> {
    thread::spawn(move || {
        for block in &blocks {
            // SAFETY: loom checks this read against every write for a
            // happens-before edge; that check is the point of the model.
            let _ = block.with(|p| unsafe { *p });
        }
        match io {
            Io::Succeeds => completer.succeed(),
            Io::Fails => completer.fail(TaskError::failed("device error")),
            Io::Dies => drop(completer),
        }
    })
}

/// The scheduler frees and reuses a request's blocks: a write.
fn reuse(block: &Blocks) {
    // SAFETY: as above; loom flags this write if a task may still read.
    block.with_mut(|p| unsafe { *p += 1 });
}

fn blocks(n: usize) -> Vec<Blocks> {
    (0..n).map(|_| Arc::new(UnsafeCell::new(0))).collect()
}

fn step(scheduler: &mut SaveScheduler<u64>, requests: &[u64]) -> SaveStep<u64> {
    scheduler.record_step(requests.iter().map(|r| (*r, 1)))
}

/// Non-blocking reporting, as vLLM drives it: `finished` passed once, then
/// empty calls each step until the request is reported. Returns every report.
fn report_eventually<H>(
    worker: &mut SaveTracker<u64, CompletionTask<H>>,
    finished: &[u64],
    want: usize,
) -> Vec<u64> {
    let mut reported = worker.get_finished(finished);
    while reported.len() < want {
        thread::yield_now();
        reported.extend(worker.get_finished(&[]));
    }
    reported
}

#[test]
fn a_finished_request_is_reported_only_after_its_save_stopped_reading() {
    explore("reported_only_after_its_save_stopped_reading", || {
        let released = std::sync::Arc::new(AtomicUsize::new(0));
        let block = blocks(1);
        let mut scheduler = SaveScheduler::new();
        let mut worker = SaveTracker::new();
        worker
            .begin_step(&step(&mut scheduler, &[1]))
            .expect("steps in sequence");
        let (task, completer) = CompletionTask::new(Event(released.clone()));
        worker.submit(task, &[1]);
        let io = start_io(block.clone(), completer, Io::Succeeds);

        assert!(scheduler.request_finished(&1));
        assert_eq!(report_eventually(&mut worker, &[1], 1), vec![1]);
        reuse(&block[0]);
        io.join().unwrap();
        assert!(worker.get_finished(&[]).is_empty(), "S2: reported once");
        assert_eq!(released.load(Ordering::Relaxed), 1, "S4");
    });
}

#[test]
fn layer_wise_saves_on_two_threads_report_after_the_last_layer() {
    explore("layer_wise_saves_report_after_the_last_layer", || {
        let block = blocks(1);
        let mut scheduler = SaveScheduler::new();
        let mut worker = SaveTracker::new();
        worker
            .begin_step(&step(&mut scheduler, &[1]))
            .expect("steps in sequence");
        let mut io = Vec::new();
        for _ in 0..2 {
            let (task, completer) = CompletionTask::new(());
            worker.submit(task, &[1]);
            io.push(start_io(block.clone(), completer, Io::Succeeds));
        }
        // The worker polls while the layers complete.
        worker.poll();
        assert!(scheduler.request_finished(&1));
        assert_eq!(report_eventually(&mut worker, &[1], 1), vec![1]);
        reuse(&block[0]);
        for thread in io {
            thread.join().unwrap();
        }
        let stats = worker.stats();
        assert_eq!(
            stats.tasks_reaped + stats.tasks_waited,
            2,
            "S4: each layer once"
        );
    });
}

#[test]
fn a_blocking_get_finished_waits_the_shared_task_once_for_both_requests() {
    explore("blocking_waits_the_shared_task_once", || {
        let shared_blocks = blocks(2);
        let mut scheduler = SaveScheduler::new();
        let mut worker = SaveTracker::with_mode(CompletionMode::Blocking);
        worker
            .begin_step(&step(&mut scheduler, &[1, 2]))
            .expect("steps in sequence");
        let (task, completer) = CompletionTask::new(());
        worker.submit(task, &[1, 2]);
        let io = start_io(shared_blocks.clone(), completer, Io::Succeeds);

        assert!(scheduler.request_finished(&1));
        assert_eq!(worker.get_finished(&[1]), vec![1]);
        reuse(&shared_blocks[0]);
        // 2's blocks were read by the same task, already waited: reusable
        // as soon as 2 is reported, without a second wait.
        assert!(scheduler.request_finished(&2));
        assert_eq!(worker.get_finished(&[2]), vec![2]);
        reuse(&shared_blocks[1]);
        io.join().unwrap();
        let stats = worker.stats();
        assert_eq!(
            stats.tasks_waited + stats.tasks_reaped,
            1,
            "S4: waited once"
        );
    });
}

#[test]
fn the_preemption_fence_waits_only_the_preempted_requests_task() {
    explore("preemption_fence_waits_only_the_preempted", || {
        let block = blocks(2);
        let mut scheduler = SaveScheduler::new();
        let mut worker = SaveTracker::new();
        worker
            .begin_step(&step(&mut scheduler, &[1, 2]))
            .expect("steps in sequence");
        let mut io = Vec::new();
        for (request, block) in [1u64, 2].iter().zip(&block) {
            let (task, completer) = CompletionTask::new(());
            worker.submit(task, &[*request]);
            io.push(start_io(vec![block.clone()], completer, Io::Succeeds));
        }

        assert_eq!(worker.handle_preemptions(&[1]), 1);
        // The fence returned: 1's blocks may be overwritten by the next pass.
        reuse(&block[0]);
        assert_eq!(worker.running_tasks(), 1, "S5: 2's task was not waited");
        assert!(worker.is_tracked(&1), "a preempted request stays tracked");

        for request in [1, 2] {
            assert!(scheduler.request_finished(&request));
        }
        let mut reported = report_eventually(&mut worker, &[1, 2], 2);
        reported.sort_unstable();
        assert_eq!(reported, vec![1, 2]);
        reuse(&block[1]);
        for thread in io {
            thread.join().unwrap();
        }
    });
}

#[test]
fn a_failed_or_abandoned_save_is_reported_once_and_releases_its_handle_once() {
    for (name, ending) in [("failed", Io::Fails), ("abandoned", Io::Dies)] {
        explore(&format!("a_{name}_save_is_reported_once"), move || {
            let released = std::sync::Arc::new(AtomicUsize::new(0));
            let block = blocks(1);
            let mut scheduler = SaveScheduler::new();
            let mut worker = SaveTracker::new();
            worker
                .begin_step(&step(&mut scheduler, &[1]))
                .expect("steps in sequence");
            let (task, completer) = CompletionTask::new(Event(released.clone()));
            worker.submit(task, &[1]);
            let io = start_io(block.clone(), completer, ending);

            assert!(scheduler.request_finished(&1));
            assert_eq!(report_eventually(&mut worker, &[1], 1), vec![1]);
            reuse(&block[0]);
            io.join().unwrap();
            let stats = worker.stats();
            assert_eq!(stats.task_failures + stats.tasks_abandoned, 1);
            assert!(worker.get_finished(&[]).is_empty(), "S2: once");
            assert_eq!(released.load(Ordering::Relaxed), 1, "S4");
        });
    }
}
