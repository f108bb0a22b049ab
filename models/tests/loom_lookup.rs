//! loom models of the real `AsyncLookup` driver: the scheduler (the model's
//! main thread) against the worker thread, every interleaving up to the
//! preemption bound.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_lookup`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5` (the default bound here is 3), or
//! `KVTIER_LOOM_EXHAUSTIVE=1` for no bound at all.
#![cfg(kvtier_loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use kvtier::{AsyncLookup, Phase, Verdict};

/// Explores `body` with loom, preemption bound 3 unless LOOM_MAX_PREEMPTIONS
/// says otherwise, and prints how many interleavings were explored.
fn explore(name: &str, body: impl Fn() + Sync + Send + 'static) {
    // A plain std counter: it only counts model executions, outside loom's view.
    let executions = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("KVTIER_LOOM_EXHAUSTIVE").is_some() {
        builder.preemption_bound = None;
    } else {
        builder.preemption_bound.get_or_insert(3);
    }
    let bound = builder.preemption_bound;
    let started = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        body();
    });
    println!(
        "loom model {name}: {} interleavings, preemption bound {bound:?}, {:.2?}",
        executions.load(Ordering::Relaxed),
        started.elapsed()
    );
}

/// "Even keys are stored."
fn even(keys: &[u64], _request: &u64) -> Vec<bool> {
    keys.iter().map(|key| key % 2 == 0).collect()
}

type Backend = fn(&[u64], &u64) -> Vec<bool>;

fn phase(lookup: &AsyncLookup<u64, u64, Backend>, key: u64) -> Option<Phase> {
    lookup.table().key_state(&key).map(|state| state.phase)
}

#[test]
fn two_groups_published_while_the_scheduler_drains_arrive_once_and_in_order() {
    explore("two_groups_published_while_the_scheduler_drains", || {
        let backend: Backend = even;
        let mut lookup = AsyncLookup::new(backend).unwrap();
        // Two requests, so two groups: [1] for request 10, then [2] for request 20.
        assert_eq!(lookup.lookup(&1, &10).unwrap(), Verdict::Pending);
        assert_eq!(lookup.lookup(&2, &20).unwrap(), Verdict::Pending);
        assert_eq!(lookup.flush().unwrap(), 2);

        // The scheduler drains while the worker may be publishing either group.
        lookup.drain().unwrap();
        let second_visible = phase(&lookup, 2) != Some(Phase::InFlight);
        let first_visible = phase(&lookup, 1) != Some(Phase::InFlight);
        assert!(
            !second_visible || first_visible,
            "group 2 applied before group 1"
        );

        // Whatever the lookup sees is Pending or the backend's answer, never a wrong verdict.
        match lookup.lookup(&2, &20).unwrap() {
            Verdict::Pending | Verdict::Hit(_) => {}
            Verdict::Miss => panic!("key 2 is stored"),
        }
        match lookup.lookup(&1, &10).unwrap() {
            Verdict::Pending | Verdict::Miss => {}
            Verdict::Hit(_) => panic!("key 1 is not stored"),
        }

        // Cleanup while the probes may still be in flight: orphans until answered.
        lookup.cleanup(&10).unwrap();
        lookup.cleanup(&20).unwrap();
        lookup.shutdown().unwrap();

        let stats = lookup.stats();
        assert_eq!(stats.groups_applied, 2, "each group applied exactly once");
        assert_eq!(stats.anomalies, 0);
        assert!(lookup.table().is_empty(), "nothing leaks");
        lookup.table().check_invariants().unwrap();
    });
}

#[test]
fn a_request_joining_an_orphaned_probe_shares_it_and_sees_its_answer() {
    explore("a_request_joining_an_orphaned_probe", || {
        let backend: Backend = even;
        let mut lookup = AsyncLookup::new(backend).unwrap();
        lookup.lookup(&4, &10).unwrap();
        lookup.flush().unwrap();
        // Request 10 ends while its probe may be running, done, or published.
        lookup.cleanup(&10).unwrap();
        // Pending either way: 20 joined the in-flight probe, or the answer
        // had been applied before and the state removed, so 20 starts afresh.
        assert_eq!(lookup.lookup(&4, &20).unwrap(), Verdict::Pending);
        let resubmitted = lookup.flush().unwrap() as u64;
        assert!(resubmitted <= 1);
        lookup.shutdown().unwrap();
        // Both ways, 20 ends with the backend's answer, from one probe per
        // incarnation of the state.
        assert_eq!(
            lookup.table().key_state(&4).map(|s| s.phase),
            Some(Phase::Resolved { found: true })
        );
        let stats = lookup.stats();
        assert_eq!(stats.anomalies, 0);
        assert_eq!(stats.keys_submitted, 1 + resubmitted);
        assert_eq!(stats.groups_applied, 1 + resubmitted);
        assert_eq!(stats.stale_results, 0);
        lookup.table().check_invariants().unwrap();
    });
}
