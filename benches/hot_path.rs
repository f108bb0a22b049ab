//! Scheduler hot path: each table operation on its own, and the step
//! workload (`benches/workload`) on the threaded driver, each next to a
//! bare hash-map probe baseline measured in the same run.
//!
//! `cargo bench --bench hot_path`; `python3 benches/summarize.py` turns the
//! results into the ratios docs/performance.md reports.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod workload;

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod benches {
    use std::collections::HashMap as StdMap;
    use std::hint::black_box;
    use std::thread;
    use std::time::{Duration, Instant};

    use criterion::{BatchSize, Criterion, Throughput};
    use hashbrown::HashMap as FoldMap;
    use kvtier::{lookup::GroupResult, lookup::LookupTable, lookup::ThreadLookup};

    use super::workload::floor::Floor;
    use super::workload::reference_port::ReferencePort;
    use super::workload::{self, Trace, present};
    use hashbrown::DefaultHashBuilder as FoldState;
    use std::collections::hash_map::RandomState as StdState;

    /// Keys per measured batch in the per-operation benches.
    const BATCH: u64 = 1024;
    /// Requests the batch is spread over (128 keys each, as in the workload).
    const REQUESTS: u64 = BATCH / 128;

    fn keys(from: u64) -> Vec<u64> {
        (from..from + BATCH).map(workload::mix).collect()
    }

    fn request_of(index: usize) -> u64 {
        index as u64 / 128 % REQUESTS
    }

    /// A table in which `REQUESTS` requests looked up `keys` (128 each).
    fn looked_up(keys: &[u64]) -> LookupTable<u64, u64> {
        let mut table = LookupTable::new();
        for (index, key) in keys.iter().enumerate() {
            table.lookup(key, &request_of(index));
        }
        table
    }

    fn answer_all(table: &mut LookupTable<u64, u64>) {
        for result in flush_and_answer(table) {
            table.apply(result);
        }
    }

    fn flush_and_answer(table: &mut LookupTable<u64, u64>) -> Vec<GroupResult<u64>> {
        workload::answers(table.take_submission().expect("new keys"))
    }

    fn operations(c: &mut Criterion) {
        let mut group = c.benchmark_group("op");
        group.throughput(Throughput::Elements(BATCH));

        let keys = keys(0);
        let mut table = looked_up(&keys);
        answer_all(&mut table);
        group.bench_function("lookup_known", |b| {
            b.iter(|| {
                for (index, key) in keys.iter().enumerate() {
                    black_box(table.lookup(key, &request_of(index)));
                }
            })
        });

        // Every key held by 32 requests; the last of them asks.
        let mut shared = LookupTable::<u64, u64>::new();
        for request in 0..32 {
            for key in &keys {
                shared.lookup(key, &request);
            }
        }
        answer_all(&mut shared);
        group.bench_function("lookup_known_32_requesters", |b| {
            b.iter(|| {
                for key in &keys {
                    black_box(shared.lookup(key, &31));
                }
            })
        });

        // New keys arrive in a table of steady size: one that held as many
        // keys before (so it does not grow while measured).
        let mut next = BATCH;
        group.bench_function("lookup_new", |b| {
            b.iter_batched_ref(
                || {
                    next += 2 * BATCH;
                    let mut table = looked_up(&self::keys(next));
                    answer_all(&mut table);
                    for request in 0..REQUESTS {
                        table.cleanup(&request);
                    }
                    (table, self::keys(next + BATCH))
                },
                |(table, keys)| {
                    for (index, key) in keys.iter().enumerate() {
                        black_box(table.lookup(key, &request_of(index)));
                    }
                },
                BatchSize::PerIteration,
            )
        });

        group.bench_function("flush", |b| {
            b.iter_batched_ref(
                || looked_up(&keys),
                |table| black_box(table.take_submission()),
                BatchSize::PerIteration,
            )
        });

        group.bench_function("apply", |b| {
            b.iter_batched_ref(
                || {
                    let mut table = looked_up(&keys);
                    let results = flush_and_answer(&mut table);
                    (table, results)
                },
                |(table, results)| {
                    for result in results.drain(..) {
                        table.apply(result);
                    }
                },
                BatchSize::PerIteration,
            )
        });

        group.bench_function("cleanup", |b| {
            b.iter_batched_ref(
                || {
                    let mut table = looked_up(&keys);
                    answer_all(&mut table);
                    table
                },
                |table| {
                    for request in 0..REQUESTS {
                        table.cleanup(&request);
                    }
                },
                BatchSize::PerIteration,
            )
        });

        let std_map: StdMap<u64, bool> = keys.iter().map(|&k| (k, present(k))).collect();
        group.bench_function("baseline_std_hashmap", |b| {
            b.iter(|| {
                for key in &keys {
                    black_box(std_map.get(key));
                }
            })
        });
        let fold_map: FoldMap<u64, bool> = keys.iter().map(|&k| (k, present(k))).collect();
        group.bench_function("baseline_hashbrown_foldhash", |b| {
            b.iter(|| {
                for key in &keys {
                    black_box(fold_map.get(key));
                }
            })
        });
        group.finish();
    }

    /// The step workload on the threaded driver, as in
    /// `examples/step_workload.rs`.
    type Backend = fn(&[u64], &u64) -> Vec<bool>;

    struct Driven {
        lookup: ThreadLookup<u64, u64>,
        trace: Trace,
        /// The batched call's buffer, reused across steps.
        verdicts: Vec<kvtier::Verdict<u64>>,
    }

    fn answer(keys: &[u64], _request: &u64) -> Vec<bool> {
        keys.iter().map(|&k| present(k)).collect()
    }

    /// Scheduler-thread time of one step.
    struct StepTime {
        /// Inside `lookup` calls.
        lookup: Duration,
        /// Lookups, applying the worker's answers, flush and cleanup.
        scheduler: Duration,
    }

    impl Driven {
        fn new() -> Self {
            let backend: Backend = answer;
            Self {
                lookup: ThreadLookup::threaded(backend).expect("worker thread"),
                trace: Trace::new(),
                verdicts: Vec::new(),
            }
        }

        /// One step; with `batched`, each request's keys in one
        /// `lookup_all` call instead of a `lookup` per key.
        fn step(&mut self, batched: bool) -> StepTime {
            let step = self.trace.next_step();
            let lookup = if batched {
                // Each request's keys, gathered before the clock starts.
                let requests: Vec<(Vec<u64>, u64)> = step
                    .lookups
                    .chunks(workload::KEYS_PER_REQUEST)
                    .map(|chunk| (chunk.iter().map(|&(key, _)| key).collect(), chunk[0].1))
                    .collect();
                let mut verdicts = std::mem::take(&mut self.verdicts);
                let start = Instant::now();
                for (keys, request) in &requests {
                    black_box(self.lookup.lookup_all(keys, request, &mut verdicts));
                    black_box(&verdicts);
                }
                let elapsed = start.elapsed();
                self.verdicts = verdicts;
                elapsed
            } else {
                let start = Instant::now();
                for (key, request) in &step.lookups {
                    black_box(self.lookup.lookup(key, request));
                }
                start.elapsed()
            };
            let start = Instant::now();
            self.lookup.flush().expect("open");
            let mut scheduler = lookup + start.elapsed();
            // Waiting for the worker is untimed; applying its answers is timed.
            loop {
                let start = Instant::now();
                self.lookup.drain();
                scheduler += start.elapsed();
                let stats = self.lookup.stats();
                if stats.groups_applied == stats.groups_submitted {
                    break;
                }
                thread::yield_now();
            }
            let start = Instant::now();
            for request in &step.finished {
                self.lookup.cleanup(request);
            }
            scheduler += start.elapsed();
            StepTime { lookup, scheduler }
        }
    }

    fn step_workload(c: &mut Criterion) {
        let per_step = (workload::LIVE * workload::KEYS_PER_REQUEST) as u64;
        let mut group = c.benchmark_group("step");
        group.throughput(Throughput::Elements(per_step));
        group.measurement_time(Duration::from_secs(4));

        let mut driven = Driven::new();
        group.bench_function("kvtier_lookup", |b| {
            b.iter_custom(|steps| (0..steps).map(|_| driven.step(false).lookup).sum())
        });
        let mut driven = Driven::new();
        group.bench_function("kvtier_lookup_all", |b| {
            b.iter_custom(|steps| (0..steps).map(|_| driven.step(true).lookup).sum())
        });
        let mut driven = Driven::new();
        group.bench_function("kvtier_scheduler", |b| {
            b.iter_custom(|steps| (0..steps).map(|_| driven.step(false).scheduler).sum())
        });

        fn baseline<M: FromIterator<(u64, bool)>>(
            trace: &mut Trace,
            steps: u64,
            probe: impl Fn(&M, &u64) -> Option<bool>,
        ) -> Duration {
            let mut elapsed = Duration::ZERO;
            for _ in 0..steps {
                let step = trace.next_step();
                let map: M = step.lookups.iter().map(|&(k, _)| (k, present(k))).collect();
                let start = Instant::now();
                for (key, _) in &step.lookups {
                    black_box(probe(&map, key));
                }
                elapsed += start.elapsed();
            }
            elapsed
        }
        // The reference design ported directly (benches/workload/reference_port.rs),
        // with std's hasher and with foldhash, on the same trace and backend.
        fn reference<S>(port: &mut Reference<S>, trace: &mut Trace, steps: u64) -> StepTime
        where
            S: std::hash::BuildHasher + Default + Clone,
        {
            let mut time = StepTime {
                lookup: Duration::ZERO,
                scheduler: Duration::ZERO,
            };
            for _ in 0..steps {
                let step = trace.next_step();
                let start = Instant::now();
                for (key, request) in &step.lookups {
                    black_box(port.lookup(key, request));
                }
                let lookup = start.elapsed();
                let start = Instant::now();
                port.flush();
                let mut scheduler = lookup + start.elapsed();
                port.wait_published(); // untimed, as kvtier's wait
                let start = Instant::now();
                port.drain();
                for request in &step.finished {
                    port.cleanup(request);
                }
                scheduler += start.elapsed();
                time.lookup += lookup;
                time.scheduler += scheduler;
            }
            time
        }
        type Reference<S> = ReferencePort<u64, u64, S>;
        let (mut port, mut trace) = (Reference::<StdState>::new(answer), Trace::new());
        group.bench_function("baseline_reference_std", |b| {
            b.iter_custom(|steps| reference(&mut port, &mut trace, steps).lookup)
        });
        let (mut port, mut trace) = (Reference::<FoldState>::new(answer), Trace::new());
        group.bench_function("baseline_reference_foldhash", |b| {
            b.iter_custom(|steps| reference(&mut port, &mut trace, steps).lookup)
        });
        let (mut port, mut trace) = (Reference::<FoldState>::new(answer), Trace::new());
        group.bench_function("baseline_reference_foldhash_scheduler", |b| {
            b.iter_custom(|steps| reference(&mut port, &mut trace, steps).scheduler)
        });

        // The floor (benches/workload/floor.rs): the work every
        // implementation does, and nothing else. The backend's answers
        // are computed untimed, as the worker's are for the others.
        fn floor(floor: &mut Floor, trace: &mut Trace, steps: u64) -> StepTime {
            let mut time = StepTime {
                lookup: Duration::ZERO,
                scheduler: Duration::ZERO,
            };
            let mut queued = Vec::new();
            for _ in 0..steps {
                let step = trace.next_step();
                let start = Instant::now();
                for (key, _) in &step.lookups {
                    black_box(floor.lookup(*key));
                }
                let lookup = start.elapsed();
                let start = Instant::now();
                floor.flush(&mut queued);
                let mut scheduler = lookup + start.elapsed();
                let answers: Vec<(u64, bool)> = queued.iter().map(|&k| (k, present(k))).collect();
                let start = Instant::now();
                floor.apply(&answers);
                for &request in &step.finished {
                    floor.cleanup(request);
                }
                scheduler += start.elapsed();
                time.lookup += lookup;
                time.scheduler += scheduler;
            }
            time
        }
        let (mut state, mut trace) = (Floor::new(), Trace::new());
        group.bench_function("baseline_floor", |b| {
            b.iter_custom(|steps| floor(&mut state, &mut trace, steps).lookup)
        });
        let (mut state, mut trace) = (Floor::new(), Trace::new());
        group.bench_function("baseline_floor_scheduler", |b| {
            b.iter_custom(|steps| floor(&mut state, &mut trace, steps).scheduler)
        });

        let mut trace = Trace::new();
        group.bench_function("baseline_std_hashmap", |b| {
            b.iter_custom(|steps| {
                baseline::<StdMap<u64, bool>>(&mut trace, steps, |m, k| m.get(k).copied())
            })
        });
        let mut trace = Trace::new();
        group.bench_function("baseline_hashbrown_foldhash", |b| {
            b.iter_custom(|steps| {
                baseline::<FoldMap<u64, bool>>(&mut trace, steps, |m, k| m.get(k).copied())
            })
        });
        group.finish();
    }

    criterion::criterion_group!(all, operations, step_workload);
}

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
criterion::criterion_main!(benches::all);

#[cfg(any(kvtier_loom, kvtier_shuttle))]
fn main() {}
