//! Save tracking with 10^4 outstanding tasks: the cost of `submit`, of a
//! `poll` that finds nothing done and of one that reaps, and of
//! `get_finished`, per task, next to a bare loop calling `check` on the
//! same tasks (the least any poll-based tracker must do).
//!
//! `cargo bench --bench save`; tasks are the crate's `CompletionTask`s.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::hint::black_box;

    use criterion::{BatchSize, Criterion, Throughput};
    use kvtier::{SaveScheduler, SaveTracker, StoreTask, save::Completer, save::CompletionTask};

    const OUTSTANDING: u64 = 10_000;
    const BATCH: u64 = 1_024;

    type Tracker = SaveTracker<u64, CompletionTask>;

    /// A tracker with `OUTSTANDING` running tasks, one per recorded request
    /// (requests `0..OUTSTANDING`), and the tasks' completers.
    fn tracker() -> (Tracker, Vec<Completer>) {
        let mut scheduler = SaveScheduler::new();
        let mut tracker = Tracker::new();
        let step = scheduler.record_step((0..OUTSTANDING + BATCH).map(|r| (r, 1)));
        tracker.begin_step(&step).expect("steps in sequence");
        let completers = (0..OUTSTANDING)
            .map(|request| {
                let (task, completer) = CompletionTask::new(());
                tracker.submit(task, &[request]);
                completer
            })
            .collect();
        (tracker, completers)
    }

    fn save_tracking(c: &mut Criterion) {
        let mut group = c.benchmark_group("save");

        group.throughput(Throughput::Elements(BATCH));
        group.bench_function("submit", |b| {
            b.iter_batched_ref(
                || {
                    let (tracker, completers) = tracker();
                    let tasks: Vec<_> = (0..BATCH).map(|_| CompletionTask::new(())).collect();
                    (tracker, completers, tasks)
                },
                |(tracker, _, tasks)| {
                    for (i, (task, _)) in tasks.drain(..).enumerate() {
                        black_box(tracker.submit(task, &[OUTSTANDING + i as u64]));
                    }
                },
                BatchSize::PerIteration,
            )
        });

        group.throughput(Throughput::Elements(OUTSTANDING));
        let (mut idle, _completers) = tracker();
        group.bench_function("poll_none_done", |b| b.iter(|| black_box(idle.poll())));
        let tasks: Vec<(CompletionTask, Completer)> =
            (0..OUTSTANDING).map(|_| CompletionTask::new(())).collect();
        group.bench_function("baseline_check_loop", |b| {
            b.iter(|| tasks.iter().filter(|(task, _)| task.check()).count())
        });

        group.throughput(Throughput::Elements(BATCH));
        group.bench_function("poll_reaping_1024", |b| {
            b.iter_batched_ref(
                || {
                    let (tracker, mut completers) = tracker();
                    for completer in completers.drain(..BATCH as usize) {
                        completer.succeed();
                    }
                    (tracker, completers)
                },
                |(tracker, _)| assert_eq!(tracker.poll(), BATCH as usize),
                BatchSize::PerIteration,
            )
        });

        group.bench_function("get_finished_1024_done", |b| {
            b.iter_batched_ref(
                || {
                    let (tracker, mut completers) = tracker();
                    for completer in completers.drain(..BATCH as usize) {
                        completer.succeed();
                    }
                    let finished: Vec<u64> = (0..BATCH).collect();
                    (tracker, completers, finished)
                },
                |(tracker, _, finished)| {
                    assert_eq!(tracker.get_finished(finished).len(), BATCH as usize)
                },
                BatchSize::PerIteration,
            )
        });

        group.bench_function("get_finished_1024_still_saving", |b| {
            b.iter_batched_ref(
                || {
                    let (tracker, completers) = tracker();
                    let finished: Vec<u64> = (0..BATCH).collect();
                    (tracker, completers, finished)
                },
                |(tracker, _, finished)| assert!(tracker.get_finished(finished).is_empty()),
                BatchSize::PerIteration,
            )
        });
        group.finish();
    }

    criterion::criterion_group!(all, save_tracking);
}

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
criterion::criterion_main!(bench::all);

#[cfg(any(kvtier_loom, kvtier_shuttle))]
fn main() {}
