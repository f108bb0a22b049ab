//! shuttle smoke model of the real `AsyncLookup` driver: proves the shim's
//! shuttle back-end works end to end, on a workload a little larger than the
//! loom models (three requests sharing keys over three steps, cleanups and
//! key reuse while probes are in flight). The full shuttle suite comes with
//! the verification issue.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_lookup`
//! More schedules: `KVTIER_SHUTTLE_ITERATIONS=1000000`.
#![cfg(kvtier_shuttle)]

use kvtier::{AsyncLookup, Verdict};

fn iterations() -> usize {
    std::env::var("KVTIER_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000)
}

/// "Keys divisible by three are stored."
fn stored(key: u64) -> bool {
    key.is_multiple_of(3)
}

fn scenario() {
    let backend = |keys: &[u64], _request: &u64| keys.iter().map(|&k| stored(k)).collect();
    let mut lookup = AsyncLookup::new(backend).unwrap();
    for step in 0..3u64 {
        for request in 0..3u64 {
            for offset in 0..3u64 {
                let key = (step + request * 2 + offset) % 6;
                match lookup.lookup(&key, &(request + 10 * step)).unwrap() {
                    Verdict::Pending => {}
                    Verdict::Hit(_) => assert!(stored(key), "hit for unstored key {key}"),
                    Verdict::Miss => assert!(!stored(key), "miss for stored key {key}"),
                }
            }
        }
        lookup.flush().unwrap();
        // The oldest request ends while its probes may be in flight.
        for request in 0..3u64 {
            if step > 0 {
                lookup.cleanup(&(request + 10 * (step - 1))).unwrap();
            }
        }
    }
    for request in 0..3u64 {
        lookup.cleanup(&(request + 20)).unwrap();
    }
    lookup.shutdown().unwrap();
    let stats = lookup.stats();
    assert_eq!(stats.anomalies, 0);
    assert_eq!(stats.groups_applied, stats.groups_submitted);
    assert!(
        lookup.table().is_empty(),
        "leaked {} keys",
        lookup.table().len()
    );
}

#[test]
fn shared_keys_cleanups_and_reuse_under_random_schedules() {
    shuttle::check_random(scenario, iterations());
}

#[test]
fn shared_keys_cleanups_and_reuse_under_pct_schedules() {
    shuttle::check_pct(scenario, iterations(), 3);
}
