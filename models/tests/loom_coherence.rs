//! loom models of lookup coherence with a budgeted tier (invariant L18):
//! the scheduler (the model's main thread), the lookup worker probing the
//! tier's files, and a store thread that evicts and writes, every
//! interleaving up to the preemption bound. See `kvtier_models::coherence`.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_coherence -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5`, or `KVTIER_LOOM_EXHAUSTIVE=1`.
#![cfg(kvtier_loom)]

use kvtier_models::checkers::explore;
use kvtier_models::coherence::{REQUEST, Tier};
use loom::thread;

/// Block 1 is resident in a budget of one block and block 2 is not; both
/// are being probed when a store of block 2 evicts block 1. Whatever the
/// probe read and whenever its answers and the settles land, the lookups
/// end with 1 a miss and 2 a hit, as the files are.
#[test]
fn a_store_that_evicts_during_the_probe_leaves_the_lookups_as_the_files_are() {
    explore("a_store_that_evicts_during_the_probe", || {
        let tier = Tier::with_blocks(1, &[1]);
        let mut lookup = tier.lookups();
        assert!(lookup.lookup(&1, &REQUEST).is_pending());
        assert!(lookup.lookup(&2, &REQUEST).is_pending());
        lookup.flush().expect("the worker takes the group");
        let store = {
            let tier = tier.clone();
            thread::spawn(move || tier.store(2))
        };
        // The scheduler's step: what the store logged so far.
        tier.settle(&mut lookup);
        store.join().unwrap();
        tier.check_coherent(lookup, &[1, 2]);
        assert!(!tier.holds(1) && tier.holds(2));
    });
}

/// A resolved hit whose block a store evicts: the settle makes it a miss
/// whether it lands before or after the scheduler's next look.
#[test]
fn an_evicted_hit_becomes_a_miss() {
    explore("an_evicted_hit_becomes_a_miss", || {
        let tier = Tier::with_blocks(1, &[1]);
        let mut lookup = tier.lookups();
        lookup.lookup(&1, &REQUEST);
        lookup.flush().expect("the worker takes the group");
        let store = {
            let tier = tier.clone();
            thread::spawn(move || tier.store(3))
        };
        lookup.wait_idle().expect("answered");
        tier.settle(&mut lookup);
        store.join().unwrap();
        tier.check_coherent(lookup, &[1]);
    });
}
