//! Save tracking with 10^4 outstanding tasks: the cost of `submit`, of a
//! `poll` that finds nothing done and of one that reaps, and of
//! `get_finished`, per task, next to a bare loop calling `check` on the
//! same tasks (the least any poll-based tracker must do).
//!
//! The wire form: encoding and decoding one step's metadata (256 saving
//! requests with `String` ids, 16 preempted, 16 finished) and one worker's
//! report of 256 finished requests, next to what the scheduler does for the
//! step anyway (`record_step`) and to cloning the step (the allocations any
//! decoder of owned ids must make).
//!
//! `cargo bench --bench save`; tasks are the crate's `CompletionTask`s.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod workload;

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
        super::workload::saving_tracker(OUTSTANDING, OUTSTANDING + BATCH)
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

    const STEP_IDS: usize = 256;

    fn ids(from: usize, count: usize) -> Vec<String> {
        (from..from + count)
            .map(|n| format!("cmpl-{n:08x}"))
            .collect()
    }

    fn wire(c: &mut Criterion) {
        use kvtier::SaveStep;
        use kvtier::save::WorkerReport;

        let mut group = c.benchmark_group("wire");
        group.throughput(Throughput::Elements(STEP_IDS as u64));
        let saving = ids(0, STEP_IDS);
        let step = {
            let mut scheduler = SaveScheduler::new();
            scheduler.record_step(ids(1_000, 16).into_iter().map(|r| (r, 1)));
            for request in ids(1_000, 16) {
                scheduler.request_finished(&request);
            }
            scheduler.preempt(&ids(0, 16));
            scheduler.record_step(saving.iter().cloned().map(|r| (r, 1)))
        };
        group.bench_function("baseline_record_step", |b| {
            b.iter_batched(
                || (SaveScheduler::new(), saving.clone()),
                |(mut scheduler, saving)| {
                    black_box(scheduler.record_step(saving.into_iter().map(|r| (r, 1))))
                },
                BatchSize::SmallInput,
            )
        });
        let mut out = Vec::new();
        group.bench_function("encode_step", |b| {
            b.iter(|| {
                out.clear();
                step.encode_into(&mut out).unwrap();
                black_box(out.len())
            })
        });
        let bytes = step.encode().unwrap();
        group.bench_function("baseline_clone_step", |b| {
            b.iter(|| black_box(step.clone()))
        });
        group.bench_function("decode_step", |b| {
            b.iter(|| black_box(SaveStep::<String>::decode(black_box(&bytes)).unwrap()))
        });
        let (mut tracker, _) = tracker();
        let report = WorkerReport::new(3, 17, saving.clone(), tracker.stats(), tracker.latency());
        tracker.wait_all();
        group.bench_function("encode_report", |b| {
            b.iter(|| {
                out.clear();
                report.encode_into(&mut out).unwrap();
                black_box(out.len())
            })
        });
        let bytes = report.encode().unwrap();
        group.bench_function("decode_report", |b| {
            b.iter(|| black_box(WorkerReport::<String>::decode(black_box(&bytes)).unwrap()))
        });
        group.finish();
    }

    criterion::criterion_group!(all, save_tracking, wire);
}

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
criterion::criterion_main!(bench::all);

#[cfg(any(kvtier_loom, kvtier_shuttle))]
fn main() {}
