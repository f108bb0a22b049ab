//! shuttle models of the real `AsyncLookup` driver at sizes loom cannot
//! reach: at least four live requests over sixteen keys, several steps,
//! random cleanups, key reuse, `mark_miss` by ticket and by key, and backend
//! faults, all interleaved with the worker's progress. Every call is checked
//! against the specification by [`CheckedDriver`]; every run ends with every
//! request cleaned up, the driver shut down, no anomaly and an empty table.
//!
//! The workload itself is drawn from `shuttle::rand`, so it is part of the
//! schedule: a failure prints a schedule string that replays both the
//! workload and the interleaving.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_lookup`
//! - `KVTIER_SHUTTLE_ITERATIONS=N`: schedules per test (default 100,000);
//!   the deep run is `KVTIER_SHUTTLE_ITERATIONS=5000000`.
//! - `KVTIER_SHUTTLE_REPLAY='<schedule>'`: replays a printed failing schedule
//!   in every test of this file (run the one that failed by name).
#![cfg(kvtier_shuttle)]

use kvtier::Verdict;
use kvtier_models::checked::CheckedDriver;
use kvtier_models::checkers::{Schedules, run_shuttle};
use kvtier_models::reference::{Key, ModelLimits, Req};
use kvtier_models::scripted::{Fault, Script, mixed};
use shuttle::rand::{Rng, thread_rng};

/// Keys are drawn from `0..KEYS`.
const KEYS: u64 = 16;
/// Requests live at the same time.
const LIVE: usize = 4;

/// A fault for about one backend call in five; panics are left to the loom
/// model (each panic would make shuttle's hook print a schedule).
fn random_faults(rng: &mut impl Rng) -> Vec<Fault> {
    (0..64)
        .map(|_| match rng.gen_range(0..15) {
            0 => Fault::Error,
            1 => Fault::Short,
            2 => Fault::Surplus,
            _ => Fault::None,
        })
        .collect()
}

/// Several steps of four live requests over sixteen keys. Each request asks
/// for a shared prefix and a few keys of its own; between lookups the
/// scheduler sometimes drains, marks a seen hit as a failed load (by ticket
/// or by key), or ends a request and starts a new one; after each flush one or two requests end and are replaced by
/// new ones, which look up keys the old ones held (key reuse, joins of
/// in-flight probes, fresh generations).
fn scheduler_workload() {
    let mut rng = thread_rng();
    // Half the runs with bounds (L13, L14): a budget of a step or two,
    // room for a few keys and groups; all of them give unwanted groups up
    // (L15). The budget is in steps only: the checker cannot know the time.
    let limits = if rng.gen_bool(0.5) {
        ModelLimits {
            pending_steps: Some(rng.gen_range(1..3)),
            max_keys: rng.gen_range(3..12),
            max_groups: rng.gen_range(1..4),
            ..ModelLimits::default()
        }
    } else {
        ModelLimits::default()
    };
    let mut driver = CheckedDriver::with_limits(
        Script::new(mixed).with_faults(random_faults(&mut rng)),
        limits,
    );
    let mut live: Vec<Req> = (0..LIVE as Req).collect();
    let mut next_request = LIVE as Req;
    let steps = rng.gen_range(3..6);
    for _ in 0..steps {
        let prefix: Vec<Key> = (0..rng.gen_range(1..4))
            .map(|_| rng.gen_range(0..KEYS))
            .collect();
        for slot in 0..live.len() {
            let own = rng.gen_range(1..4);
            let mut keys = prefix.clone();
            keys.extend((0..own).map(|_| rng.gen_range(0..KEYS)));
            for key in keys {
                match rng.gen_range(0..14) {
                    0 => {
                        driver.drain();
                    }
                    1 => {
                        driver.mark_miss_ticket(rng.gen_range(0..64));
                    }
                    2 => {
                        driver.mark_miss_keys(&[key]);
                    }
                    3 => {
                        // A request ends mid-step (before the flush) and a
                        // new one takes its place: its pending keys go, and
                        // may be looked up again under a new generation.
                        let gone = rng.gen_range(0..live.len());
                        driver.cleanup(live[gone]);
                        live[gone] = next_request;
                        next_request += 1;
                    }
                    _ => {}
                }
                driver.lookup(key, live[slot]);
            }
        }
        driver.flush();
        for _ in 0..rng.gen_range(1..3) {
            let gone = live.swap_remove(rng.gen_range(0..live.len()));
            driver.cleanup(gone);
            live.push(next_request);
            next_request += 1;
        }
    }
    // Half the runs wait for every answer and ask again, so final verdicts
    // are checked with everything applied; the others end mid-flight.
    if rng.gen_bool(0.5) {
        driver.wait_idle();
        for &request in &live {
            for key in 0..KEYS {
                if driver.table().key_state(&key).is_some() {
                    // Everything tracked was flushed and answered: a
                    // request that asks gets a verdict.
                    let verdict = driver.lookup(key, request);
                    assert_ne!(verdict, Verdict::Pending, "key {key} after wait_idle");
                }
            }
        }
    }
    let stats = driver.finish();
    assert_eq!(stats.anomalies, 0);
    for (total, n) in SEEN
        .iter()
        .zip([stats.deadline_misses, stats.shed, stats.abandoned])
    {
        total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Deadline misses, shed keys and abandoned groups over every run (plain
/// std atomics, outside shuttle's view): the workload must reach them.
static SEEN: [std::sync::atomic::AtomicU64; 3] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// The earlier smoke workload: three requests sharing keys over three steps,
/// the oldest ending while its probes may be in flight.
fn shared_keys_workload() {
    let mut driver = CheckedDriver::new(Script::new(mixed));
    for step in 0..3u64 {
        for request in 0..3u64 {
            for offset in 0..3u64 {
                driver.lookup((step + request * 2 + offset) % 6, request + 10 * step);
            }
        }
        driver.flush();
        if step > 0 {
            for request in 0..3u64 {
                driver.cleanup(request + 10 * (step - 1));
            }
        }
    }
    driver.finish();
}

#[test]
fn scheduler_workload_agrees_with_the_specification_under_random_schedules() {
    run_shuttle("scheduler_workload", scheduler_workload, Schedules::Random);
    let seen = SEEN
        .each_ref()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        seen.iter().all(|&n| n > 0),
        "deadline misses, shed keys, abandoned groups never happened: {seen:?}"
    );
}

#[test]
fn scheduler_workload_agrees_with_the_specification_under_pct_schedules() {
    run_shuttle("scheduler_workload", scheduler_workload, Schedules::Pct);
}

#[test]
fn shared_keys_cleanups_and_reuse_under_random_schedules() {
    run_shuttle("shared_keys", shared_keys_workload, Schedules::Random);
}

#[test]
fn shared_keys_cleanups_and_reuse_under_pct_schedules() {
    run_shuttle("shared_keys", shared_keys_workload, Schedules::Pct);
}
