//! The fleet's hit ratio (docs/performance.md §16): one fleet-wide budget
//! and recency, as the fleet's books keep them, against the same total
//! budget split per host, on the multi-turn trace (benches/support/trace.rs)
//! spread over 4 hosts. Deterministic: the figures are exact, not timed.
//!
//! Run: `cargo bench --bench fleet_hits` (`-- --test` runs the same).
//!
//! Three arrangements of one total capacity `C`, each replaying the trace:
//! - **books**: one LRU ledger of `C` that every host reserves in and whose
//!   recency every host's hits touch (the books' script runs the same rules
//!   as the ledger: models/tests/fleet_differential.rs);
//! - **split, shared reads**: each host bounds what it stored by a ledger
//!   of `C / 4` (its own books, as with listing reconciles), reads every
//!   host's blocks from the shared bucket, but its hits touch only its own
//!   ledger: no host learns of another's hits;
//! - **split**: each host keeps its own prefix of `C / 4` and reads only it.
//!
//! Two routings: round robin (request `i` to host `i % 4`), and
//! prefix-aware (a conversation stays on one host: the request goes by its
//! first nine blocks, the system prompt and the conversation's first turn;
//! a document by its first block). A request is served the leading blocks
//! found, then stores the blocks it computed where its host stores.

use kvtier::capacity::{CapacityLedger, Policy};

#[path = "support/trace.rs"]
mod trace;

use trace::{store, trace};

const HOSTS: usize = 4;

#[derive(Clone, Copy)]
enum Arrangement {
    Books,
    SplitSharedReads,
    Split,
}

#[derive(Clone, Copy)]
enum Routing {
    RoundRobin,
    PrefixAware,
}

fn host_of(routing: Routing, index: usize, keys: &[u64]) -> usize {
    match routing {
        Routing::RoundRobin => index % HOSTS,
        Routing::PrefixAware => {
            let sticky = keys[keys.len().min(9) - 1];
            (sticky.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61) as usize % HOSTS
        }
    }
}

/// Blocks served from the tier, of blocks requested.
fn hit_ratio(
    requests: &[Vec<u64>],
    capacity: u64,
    arrangement: Arrangement,
    routing: Routing,
) -> f64 {
    let ledgers = match arrangement {
        Arrangement::Books => 1,
        Arrangement::SplitSharedReads | Arrangement::Split => HOSTS,
    };
    let share = (capacity / ledgers as u64).max(1);
    let mut ledgers: Vec<CapacityLedger<u64>> = (0..ledgers)
        .map(|_| CapacityLedger::new(share, Policy::Lru))
        .collect();
    let (mut served, mut asked) = (0u64, 0u64);
    for (index, keys) in requests.iter().enumerate() {
        asked += keys.len() as u64;
        let host = host_of(routing, index, keys);
        let own = match arrangement {
            Arrangement::Books => 0,
            _ => host,
        };
        let mut leading = true;
        for key in keys {
            if leading {
                // A hit touches the ledger that holds the block only if
                // the reader keeps it (the books: always).
                if let Some(pin) = ledgers[own].pin(key) {
                    ledgers[own].unpin(pin).expect("pinned just now");
                    served += 1;
                    continue;
                }
                let elsewhere = matches!(arrangement, Arrangement::SplitSharedReads)
                    && ledgers.iter().any(|ledger| ledger.is_resident(key));
                if elsewhere {
                    served += 1;
                    continue;
                }
                leading = false;
            }
            // Computed: stored where the host stores (a block another
            // host's share holds is in the bucket already: not written).
            let present = matches!(arrangement, Arrangement::SplitSharedReads)
                && ledgers.iter().any(|ledger| ledger.is_resident(key));
            if !present {
                store(&mut ledgers[own], *key, 1);
            }
        }
    }
    served as f64 / asked as f64
}

/// The books' states, on the index's side.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Undisturbed,
    /// Out for the window (lookups miss, stores are refused), then back as
    /// they were.
    Unreachable,
    /// Lost for the window, then rebuilt from a listing: the same blocks,
    /// ranked by when their objects were written (the hits' recency lost).
    Rebuilt,
}

/// What the books' states cost: the fleet-wide books (round robin) in
/// `state` for `window` requests from `from`. Returns the ratio over the
/// whole trace and over the `window` requests after the window.
fn with_outage(
    requests: &[Vec<u64>],
    capacity: u64,
    from: usize,
    window: usize,
    state: State,
) -> (f64, f64) {
    let mut ledger: CapacityLedger<u64> = CapacityLedger::new(capacity, Policy::Lru);
    let mut written: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let (mut served, mut asked, mut served_after, mut asked_after) = (0u64, 0u64, 0u64, 0u64);
    for (index, keys) in requests.iter().enumerate() {
        asked += keys.len() as u64;
        let after = (from + window..from + 2 * window).contains(&index);
        if after {
            asked_after += keys.len() as u64;
        }
        if state != State::Undisturbed && (from..from + window).contains(&index) {
            continue; // every block a miss, computed, not stored
        }
        if state == State::Rebuilt && index == from + window {
            let mut listed: Vec<(usize, u64)> = written
                .iter()
                .filter(|&(key, _)| ledger.is_resident(key))
                .map(|(&key, &at)| (at, key))
                .collect();
            listed.sort_unstable();
            ledger = CapacityLedger::new(capacity, Policy::Lru);
            for (_, key) in listed {
                assert!(ledger.seed(key, 1).is_none(), "the listing fits");
            }
        }
        let mut leading = true;
        for key in keys {
            if leading {
                if let Some(pin) = ledger.pin(key) {
                    ledger.unpin(pin).expect("pinned just now");
                    served += 1;
                    served_after += u64::from(after);
                    continue;
                }
                leading = false;
            }
            if store(&mut ledger, *key, 1) {
                written.insert(*key, index);
            }
        }
    }
    (
        served as f64 / asked as f64,
        served_after as f64 / asked_after.max(1) as f64,
    )
}

fn main() {
    let requests = trace();
    let mut unique: Vec<u64> = requests.iter().flatten().copied().collect();
    unique.sort_unstable();
    unique.dedup();
    let working_set = unique.len() as u64;
    println!(
        "trace: {} requests over {HOSTS} hosts, {working_set} distinct blocks",
        requests.len()
    );
    for (routing, name) in [
        (Routing::RoundRobin, "round robin"),
        (Routing::PrefixAware, "prefix-aware"),
    ] {
        println!(
            "{name}: total capacity | books | split, shared reads | split | books / split, shared reads"
        );
        for share in [0.05, 0.1, 0.2, 0.4] {
            let capacity = (working_set as f64 * share) as u64;
            let books = hit_ratio(&requests, capacity, Arrangement::Books, routing);
            let shared = hit_ratio(&requests, capacity, Arrangement::SplitSharedReads, routing);
            let split = hit_ratio(&requests, capacity, Arrangement::Split, routing);
            println!(
                "  {capacity:>5} blocks ({:>2.0}%) | {books:.3} | {shared:.3} | {split:.3} | {:.2}",
                share * 100.0,
                books / shared
            );
        }
    }
    let capacity = working_set / 10;
    let (from, window) = (requests.len() / 2, 100);
    let (whole, after) = with_outage(&requests, capacity, from, window, State::Undisturbed);
    println!(
        "the books' states, round robin, {capacity} blocks (10%), {window} requests from request {from}: \
         whole trace | the {window} requests after"
    );
    println!("  undisturbed | {whole:.3} | {after:.3}");
    for (state, name) in [
        (State::Unreachable, "index unreachable"),
        (State::Rebuilt, "books lost, rebuilt from a listing"),
    ] {
        let (whole, after) = with_outage(&requests, capacity, from, window, state);
        println!("  {name} | {whole:.3} | {after:.3} (during: 0)");
    }
}
