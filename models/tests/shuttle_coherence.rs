//! shuttle model of lookup coherence with a budgeted tier (invariant L18)
//! at sizes loom cannot reach: two store threads evicting and writing
//! random blocks of eight under a budget of three, while the scheduler
//! looks up, flushes and replays the change log at random points and the
//! lookup worker probes the files. At the end every verdict is whether the
//! block's file exists. See `kvtier_models::coherence`.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_coherence`
//! - `KVTIER_SHUTTLE_ITERATIONS=N`: schedules per test (default 100,000).
//! - `KVTIER_SHUTTLE_REPLAY='<schedule>'`: replays a printed failing schedule.
#![cfg(kvtier_shuttle)]

use kvtier_models::checkers::{Schedules, run_shuttle};
use kvtier_models::coherence::{REQUEST, Tier};
use shuttle::rand::{Rng, thread_rng};
use shuttle::thread;

const KEYS: u64 = 8;
const CAPACITY: u64 = 3;

fn scenario() {
    let tier = Tier::with_blocks(CAPACITY, &[0, 1, 2]);
    let mut lookup = tier.lookups();
    let stores: Vec<_> = (0..2)
        .map(|_| {
            let tier = tier.clone();
            thread::spawn(move || {
                let mut rng = thread_rng();
                for _ in 0..3 {
                    tier.store(rng.gen_range(0..KEYS));
                }
            })
        })
        .collect();
    let mut rng = thread_rng();
    for _ in 0..4 {
        for _ in 0..3 {
            lookup.lookup(&rng.gen_range(0..KEYS), &REQUEST);
        }
        lookup.flush().expect("the worker takes the groups");
        if rng.gen_bool(0.5) {
            tier.settle(&mut lookup);
        }
    }
    for store in stores {
        store.join().unwrap();
    }
    tier.check_coherent(lookup, &(0..KEYS).collect::<Vec<_>>());
}

#[test]
fn lookups_end_as_the_files_are_under_random_schedules() {
    run_shuttle("coherence", scenario, Schedules::Random);
}

#[test]
fn lookups_end_as_the_files_are_under_pct_schedules() {
    run_shuttle("coherence", scenario, Schedules::Pct);
}
