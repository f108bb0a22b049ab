//! A budgeted tier's lookups against its store threads, for the loom and
//! shuttle models of lookup coherence (invariant L18;
//! tests/loom_coherence.rs, tests/shuttle_coherence.rs).
//!
//! The tier is the real [`SharedLedger`] with its change log on, over a set
//! of "files" (one lock, standing for the directory): a store gets room
//! (its victims' files removed, each victim reported after its removal),
//! creates its file, then commits, as `DirBudget::store` does. The lookups
//! are the real threaded driver whose backend reads the same files. The
//! scheduler replays the change log into [`Lookup::settle`] in order, as
//! `kvtier.vllm.FsTier` does each step. The property: once the stores are
//! done, every answer applied and the log replayed, each tracked key's
//! verdict is whether its file exists, however probes, publications,
//! stores and settles interleaved.

use std::collections::BTreeSet;

use kvtier::Verdict;
use kvtier::capacity::{Admitted, Policy, SharedLedger};
use kvtier::lookup::ThreadLookup;

#[cfg(kvtier_loom)]
use loom::sync::{Arc, Mutex};
#[cfg(all(kvtier_shuttle, not(kvtier_loom)))]
use shuttle::sync::{Arc, Mutex};

/// The request every lookup of the models is made for.
pub const REQUEST: u64 = 7;

/// A budgeted tier of one-byte blocks (see the module docs).
#[derive(Clone)]
pub struct Tier {
    /// The budget, its change log on.
    pub ledger: SharedLedger<u64>,
    files: Arc<Mutex<BTreeSet<u64>>>,
}

impl Tier {
    /// A tier of `capacity` one-byte blocks holding `keys` (in that
    /// order, the first the least recently used).
    pub fn with_blocks(capacity: u64, keys: &[u64]) -> Self {
        let tier = Self {
            ledger: SharedLedger::new(capacity, Policy::Lru),
            files: Arc::new(Mutex::new(BTreeSet::new())),
        };
        for &key in keys {
            tier.store(key);
        }
        tier.ledger.with(|ledger| ledger.record_changes(true));
        tier
    }

    /// Stores block `key`: room first, then the file, then the commit.
    pub fn store(&self, key: u64) {
        let admitted = self.ledger.admit(key, 1, |victim| {
            self.files.lock().unwrap().remove(victim);
            true
        });
        if let Ok(Admitted::Write(write)) = admitted {
            self.files.lock().unwrap().insert(key);
            write.commit();
        }
    }

    /// Whether block `key`'s file exists.
    pub fn holds(&self, key: u64) -> bool {
        self.files.lock().unwrap().contains(&key)
    }

    /// Lookups whose backend reads this tier's files.
    pub fn lookups(&self) -> ThreadLookup<u64, u64> {
        let files = self.files.clone();
        ThreadLookup::threaded(move |keys: &[u64], _request: &u64| {
            let files = files.lock().unwrap();
            keys.iter().map(|key| files.contains(key)).collect()
        })
        .expect("start the lookup worker")
    }

    /// Replays the change log into `lookup`, in order; returns how many
    /// key states changed.
    pub fn settle(&self, lookup: &mut ThreadLookup<u64, u64>) -> usize {
        let mut changes = Vec::new();
        self.ledger.with(|ledger| ledger.take_changes(&mut changes));
        changes
            .iter()
            .map(|(key, present)| lookup.settle([key], *present))
            .sum()
    }

    /// With the stores done: applies every answer, replays the log, and
    /// checks that each of `keys` the lookups answer is answered as its
    /// file says; then shuts the lookups down and checks the table and the
    /// ledger.
    pub fn check_coherent(&self, mut lookup: ThreadLookup<u64, u64>, keys: &[u64]) {
        lookup.wait_idle().expect("the worker answers");
        self.settle(&mut lookup);
        for &key in keys {
            match lookup.lookup(&key, &REQUEST) {
                Verdict::Pending => {
                    // Never flushed: no claim either way.
                    assert!(lookup.table().batched_keys() > 0, "key {key} pending");
                }
                verdict => assert_eq!(
                    verdict.is_hit(),
                    self.holds(key),
                    "key {key}: the lookup says {verdict:?}"
                ),
            }
        }
        let table = lookup.shutdown().expect("shut down");
        assert_eq!(table.stats().anomalies, 0);
        table.check_invariants().expect("structure holds");
        self.ledger
            .with(|ledger| ledger.audit())
            .expect("ledger sums");
    }
}
