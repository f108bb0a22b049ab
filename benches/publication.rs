//! Publication latency: one flush carries a slow group (50 ms) queued before
//! a fast one; how long until the fast group's verdict is visible to the
//! scheduler?
//!
//! `cargo bench --bench publication` (a plain harness: the measured latency
//! of a fast group is microseconds while every round lasts the slow group's
//! 50 ms, which criterion's iteration planning cannot express). Each
//! scenario runs `ROUNDS` rounds after warm-up, interleaved round by round
//! so all see the same machine noise; the table gives the median and the
//! 10th/90th percentiles. Scenarios:
//!
//! - `thread_fifo`: [`ThreadLookup`], one worker thread, groups in order.
//! - `tokio_2`: [`TokioLookup`] with 2 concurrent groups.
//! - `tokio_2_fast_alone`: the same driver with only the fast group in the
//!   flush: the fast group's own latency, the reference for the target
//!   (`tokio_2` within it + 1 ms).
//! - `baseline_whole_submission`: the submission probed group after group
//!   and published at once when all are done (how the reference protocol
//!   publishes), on the same table.

#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod bench {
    use std::convert::Infallible;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::{Duration, Instant};

    use kvtier::lookup::{
        AsyncBackend, GroupResult, LookupTable, Prober, ThreadLookup, TokioConfig, TokioLookup,
    };
    use kvtier::{Lookup, Verdict};

    const SLOW: Duration = Duration::from_millis(50);
    /// The slow request's id; every other request is fast.
    const SLOW_REQUEST: u64 = 0;
    const KEYS_PER_GROUP: u64 = 16;
    const WARM_UP: usize = 3;
    const ROUNDS: usize = 25;

    fn answer(keys: &[u64]) -> Vec<bool> {
        keys.iter().map(|k| k % 2 == 0).collect()
    }

    fn sync_backend(keys: &[u64], request: &u64) -> Vec<bool> {
        if *request == SLOW_REQUEST {
            thread::sleep(SLOW);
        }
        answer(keys)
    }

    struct SlowAsync;

    impl AsyncBackend<u64, u64> for SlowAsync {
        type Error = Infallible;

        async fn batch_lookup(&self, keys: &[u64], request: &u64) -> Result<Vec<bool>, Infallible> {
            if *request == SLOW_REQUEST {
                tokio::time::sleep(SLOW).await;
            }
            Ok(answer(keys))
        }
    }

    /// What a scenario needs from a driver.
    trait Driver {
        fn lookup(&mut self, key: u64, request: u64) -> Verdict<u64>;
        fn flush(&mut self);
        fn wait_idle(&mut self);
        fn cleanup(&mut self, request: u64);
    }

    impl<P: Prober<u64, u64>> Driver for Lookup<u64, u64, P> {
        fn lookup(&mut self, key: u64, request: u64) -> Verdict<u64> {
            Lookup::lookup(self, &key, &request)
        }
        fn flush(&mut self) {
            Lookup::flush(self).expect("prober alive");
        }
        fn wait_idle(&mut self) {
            Lookup::wait_idle(self).expect("prober alive");
        }
        fn cleanup(&mut self, request: u64) {
            Lookup::cleanup(self, &request);
        }
    }

    /// The baseline: the table on the scheduler thread, a worker that
    /// probes the whole submission and then publishes every group at once.
    struct WholeSubmission {
        table: LookupTable<u64, u64>,
        to_worker: Option<mpsc::Sender<kvtier::lookup::Submission<u64, u64>>>,
        published: Arc<Mutex<Vec<GroupResult<u64>>>>,
        worker: Option<thread::JoinHandle<()>>,
    }

    impl WholeSubmission {
        fn new() -> Self {
            let (to_worker, submissions) = mpsc::channel::<kvtier::lookup::Submission<u64, u64>>();
            let published = Arc::new(Mutex::new(Vec::new()));
            let out = published.clone();
            let worker = thread::spawn(move || {
                for submission in submissions {
                    let results: Vec<GroupResult<u64>> = submission
                        .into_groups()
                        .into_iter()
                        .map(|group| {
                            let found = sync_backend(group.keys(), group.request());
                            group.answered(found)
                        })
                        .collect();
                    out.lock().unwrap().extend(results);
                }
            });
            Self {
                table: LookupTable::new(),
                to_worker: Some(to_worker),
                published,
                worker: Some(worker),
            }
        }

        fn apply_published(&mut self) {
            let results = std::mem::take(&mut *self.published.lock().unwrap());
            for result in results {
                self.table.apply(result);
            }
        }
    }

    impl Driver for WholeSubmission {
        fn lookup(&mut self, key: u64, request: u64) -> Verdict<u64> {
            self.apply_published();
            self.table.lookup(&key, &request)
        }
        fn flush(&mut self) {
            if let Some(submission) = self.table.take_submission() {
                self.to_worker.as_ref().unwrap().send(submission).unwrap();
            }
        }
        fn wait_idle(&mut self) {
            while self.table.stats().groups_applied < self.table.stats().groups_submitted {
                thread::sleep(Duration::from_micros(100));
                self.apply_published();
            }
        }
        fn cleanup(&mut self, request: u64) {
            self.apply_published();
            self.table.cleanup(&request);
        }
    }

    impl Drop for WholeSubmission {
        fn drop(&mut self) {
            self.to_worker.take();
            if let Some(worker) = self.worker.take() {
                worker.join().unwrap();
            }
        }
    }

    /// One round: (optionally) a slow group, then a fast one, in one flush.
    /// Returns the time from the flush until the fast group's first key is
    /// no longer pending.
    fn round(driver: &mut dyn Driver, round: u64, with_slow: bool) -> Duration {
        let base = (round + 1) * 1_000;
        let fast_request = round + 1;
        if with_slow {
            for key in base..base + KEYS_PER_GROUP {
                driver.lookup(key, SLOW_REQUEST);
            }
        }
        let fast_keys = base + 500..base + 500 + KEYS_PER_GROUP;
        for key in fast_keys.clone() {
            driver.lookup(key, fast_request);
        }
        let start = Instant::now();
        driver.flush();
        while driver.lookup(fast_keys.start, fast_request).is_pending() {
            std::hint::spin_loop();
        }
        let latency = start.elapsed();
        driver.wait_idle();
        driver.cleanup(SLOW_REQUEST);
        driver.cleanup(fast_request);
        latency
    }

    fn percentile(sorted: &[Duration], p: f64) -> Duration {
        sorted[((sorted.len() - 1) as f64 * p).round() as usize]
    }

    pub fn main() {
        let thread_fifo = ThreadLookup::threaded(sync_backend as fn(&[u64], &u64) -> Vec<bool>)
            .expect("worker thread");
        let config = TokioConfig::default()
            .max_concurrent_groups(2)
            .group_timeout(None);
        let tokio_2 = TokioLookup::tokio(SlowAsync, config.clone()).expect("runtime");
        let tokio_alone = TokioLookup::tokio(SlowAsync, config).expect("runtime");
        let mut scenarios: Vec<(&str, Box<dyn Driver>, bool)> = vec![
            ("thread_fifo", Box::new(thread_fifo), true),
            ("tokio_2", Box::new(tokio_2), true),
            ("tokio_2_fast_alone", Box::new(tokio_alone), false),
            (
                "baseline_whole_submission",
                Box::new(WholeSubmission::new()),
                true,
            ),
        ];
        let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); scenarios.len()];
        for r in 0..(WARM_UP + ROUNDS) as u64 {
            for (index, (_, driver, with_slow)) in scenarios.iter_mut().enumerate() {
                let latency = round(driver.as_mut(), r, *with_slow);
                if r as usize >= WARM_UP {
                    latencies[index].push(latency);
                }
            }
        }
        println!(
            "publication latency of a fast group flushed behind a {} ms group ({} keys each), {ROUNDS} rounds",
            SLOW.as_millis(),
            KEYS_PER_GROUP
        );
        println!("| scenario | median | p10 | p90 |");
        println!("|---|---|---|---|");
        let mut medians = Vec::new();
        for ((name, _, _), mut values) in scenarios.iter().zip(latencies) {
            values.sort();
            let median = percentile(&values, 0.5);
            medians.push(median);
            println!(
                "| {name} | {:.3} ms | {:.3} ms | {:.3} ms |",
                median.as_secs_f64() * 1e3,
                percentile(&values, 0.1).as_secs_f64() * 1e3,
                percentile(&values, 0.9).as_secs_f64() * 1e3
            );
        }
        let over_own = medians[1].as_secs_f64() - medians[2].as_secs_f64();
        println!(
            "tokio_2 - tokio_2_fast_alone = {:+.3} ms (target: within +1 ms)",
            over_own * 1e3
        );
    }
}

fn main() {
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    bench::main();
}
