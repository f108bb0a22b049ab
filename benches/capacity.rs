//! The capacity ledger's figures (docs/performance.md, "Capacity"):
//!
//! 1. Hit ratio against capacity on a multi-turn, prefix-sharing trace, for
//!    LRU, S3-FIFO and an unbounded tier. Deterministic (a seeded
//!    generator), so the figures are exact, not timed.
//! 2. The cost of eviction per store: stores into a full ledger (each
//!    evicts one block) against stores with room, timed in the same run,
//!    medians of 7 rounds, as a ratio.
//!
//! Run: `cargo bench --bench capacity` (`-- --test`: one small round).
//!
//! The trace: benches/support/trace.rs (multi-turn conversations on shared
//! system prompts, and one-off documents). A request is served the leading
//! blocks the tier holds (a prefix cache cannot use a block after a miss),
//! then stores the blocks it computed.

use std::hint::black_box;
use std::time::Instant;

use kvtier::capacity::{Admission, CapacityLedger, Policy};

#[path = "support/trace.rs"]
mod trace;

use trace::{store, trace};

const BLOCK: u64 = 1;

/// Blocks served from the tier, of blocks requested.
fn hit_ratio(requests: &[Vec<u64>], capacity: u64, policy: Policy) -> f64 {
    let mut ledger = CapacityLedger::new(capacity, policy);
    let (mut served, mut asked) = (0u64, 0u64);
    for keys in requests {
        asked += keys.len() as u64;
        let mut leading = true;
        for key in keys {
            if leading {
                if let Some(pin) = ledger.pin(key) {
                    served += 1;
                    ledger.unpin(pin).expect("pinned just now");
                    continue;
                }
                leading = false;
            }
            // Computed: stored, evicting as asked.
            store(&mut ledger, *key, BLOCK);
        }
    }
    served as f64 / asked as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Nanoseconds per store of `stores` one-block stores into a ledger of
/// `capacity` blocks already full (`full`: each store evicts one) or empty.
fn per_store(policy: Policy, capacity: u64, stores: u64, full: bool) -> f64 {
    let mut ledger = CapacityLedger::new(if full { capacity } else { capacity + stores }, policy);
    for key in 0..capacity {
        let Admission::Granted(r) = ledger.reserve(key, 1) else {
            unreachable!()
        };
        ledger.commit(r).unwrap();
    }
    let started = Instant::now();
    for key in capacity..capacity + stores {
        assert!(store(&mut ledger, key, 1), "a one-block store was refused");
    }
    black_box(ledger.stats());
    started.elapsed().as_nanos() as f64 / stores as f64
}

/// The fs tier's part (no tiers are built under the model checkers' cfgs).
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
mod tier {
    use std::time::Instant;

    use kvtier::FsTier;
    use kvtier::block::HEADER_LEN;
    use kvtier::settings::BudgetConfig;
    use kvtier::tier::FsOptions;

    /// Microseconds per `FsTier::store` of `stores` 4 KiB blocks after
    /// `resident` blocks, into a tier whose budget is `capacity` blocks
    /// (`Some(resident)`: full, each store deletes a victim's file; larger:
    /// room for all) or has no budget (`None`).
    pub(crate) fn tier_store(resident: u64, stores: u64, capacity: Option<u64>) -> f64 {
        const PAYLOAD: usize = 4096 - HEADER_LEN;
        let root = tempfile::tempdir().expect("tempdir");
        let options = FsOptions::default()
            .budget(capacity.map(|blocks| BudgetConfig::new(blocks * 4096).expect("a budget")));
        let tier = FsTier::open_with(root.path(), "bench", options).expect("open");
        let payload = [3u8; PAYLOAD];
        for key in 0..resident {
            tier.store(&key, &payload).expect("store");
        }
        let started = Instant::now();
        for key in resident..resident + stores {
            tier.store(&key, &payload).expect("store");
        }
        let elapsed = started.elapsed();
        if capacity == Some(resident) {
            assert_eq!(tier.capacity_stats().unwrap().evictions, stores);
        }
        elapsed.as_secs_f64() * 1e6 / stores as f64
    }
}

fn main() {
    let requests = trace();
    let asked: usize = requests.iter().map(Vec::len).sum();
    let mut unique: Vec<u64> = requests.iter().flatten().copied().collect();
    unique.sort_unstable();
    unique.dedup();
    let working_set = unique.len() as u64;
    println!(
        "trace: {} requests, {asked} blocks asked, {working_set} distinct blocks",
        requests.len()
    );
    let unbounded = hit_ratio(&requests, u64::MAX, Policy::Lru);
    println!("capacity (share of distinct blocks) | LRU | S3-FIFO | unbounded");
    for share in [0.02, 0.05, 0.1, 0.2, 0.4] {
        let capacity = ((working_set as f64 * share) as u64).max(1);
        let lru = hit_ratio(&requests, capacity, Policy::Lru);
        let s3 = hit_ratio(&requests, capacity, Policy::S3Fifo);
        println!(
            "{capacity:>6} blocks ({:>3.0}%) | {:.3} | {:.3} | {unbounded:.3}",
            share * 100.0,
            lru,
            s3
        );
    }
    // `cargo bench -- --test` (CI): one small round, to show it runs.
    let quick = std::env::args().any(|a| a == "--test");
    let (stores, resident, rounds) = if quick {
        (10_000, 10_000, 1)
    } else {
        (200_000, 100_000, 7)
    };
    for policy in [Policy::Lru, Policy::S3Fifo] {
        let (mut evicting, mut roomy) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            evicting.push(per_store(policy, resident, stores, true));
            roomy.push(per_store(policy, resident, stores, false));
        }
        let (e, r) = (median(evicting), median(roomy));
        println!(
            "{}: a store that evicts one block {e:.0} ns, with room {r:.0} ns (ratio {:.2}), medians of {rounds}",
            policy.name(),
            e / r
        );
    }
    #[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
    tier_figures(quick);
}

/// The same in the fs tier, files deleted and written (this disk, its page
/// cache): a full budget against no budget.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
fn tier_figures(quick: bool) {
    use tier::tier_store;

    let (stores, resident, rounds) = if quick {
        (500, 500, 1)
    } else {
        (5_000, 5_000, 5)
    };
    let (mut full, mut room, mut none) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        full.push(tier_store(resident, stores, Some(resident)));
        room.push(tier_store(resident, stores, Some(resident + stores)));
        none.push(tier_store(resident, stores, None));
    }
    let (full, room, none) = (median(full), median(room), median(none));
    println!(
        "fs tier, 4 KiB blocks, medians of {rounds}: a store that evicts one block {full:.1} us, \
         with room {room:.1} us (ratio {:.2}); without a budget {none:.1} us (with room / without {:.2})",
        full / room,
        room / none
    );
}
