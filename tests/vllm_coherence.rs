//! Lookups stay coherent with a budgeted vLLM tier's files (invariant L18):
//! the transfers' change log, replayed into the lookup table, makes a hit
//! whose block was evicted a miss, a completed store a hit even when a probe
//! issued before it answers "absent" afterwards, and leaves every tracked
//! key's verdict equal to whether its file exists.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::time::Duration;

use kvtier::Verdict;
use kvtier::capacity::Policy;
use kvtier::lookup::LookupTable;
use kvtier::settings::BudgetConfig;
use kvtier::tier::{PrimaryRegion, TransferKind, VllmFsLayout, VllmTransfers};

const BLOCK: usize = 4096;
const REQUEST: u64 = 1;

fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

struct Tier {
    _dir: tempfile::TempDir,
    layout: VllmFsLayout,
    transfers: VllmTransfers,
    table: LookupTable<Vec<u8>, u64>,
    next_job: u64,
}

impl Tier {
    fn open(capacity_blocks: Option<u64>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let layout = VllmFsLayout::new(dir.path().join("model_0123456789ab_r0")).unwrap();
        let region = PrimaryRegion::zeroed(4, BLOCK).unwrap();
        let mut transfers = VllmTransfers::new(layout.clone(), region, 1, 1).unwrap();
        transfers.record_changes(true);
        if let Some(blocks) = capacity_blocks {
            transfers
                .set_budget(
                    BudgetConfig::new(blocks * BLOCK as u64)
                        .unwrap()
                        .with_policy(Policy::Lru)
                        .with_stale_temp_age(Some(Duration::from_secs(600)))
                        .unwrap(),
                )
                .unwrap();
        }
        Self {
            _dir: dir,
            layout,
            transfers,
            table: LookupTable::new(),
            next_job: 0,
        }
    }

    /// Stores blocks `keys` and settles the lookups with what changed, as
    /// `kvtier.vllm.FsTier` does each step.
    fn store(&mut self, keys: &[u64]) -> usize {
        self.next_job += 1;
        let keys: Vec<Vec<u8>> = keys.iter().map(|&n| key(n)).collect();
        let slots = vec![0; keys.len()];
        self.transfers
            .submit(TransferKind::Store, self.next_job, keys, &slots)
            .unwrap();
        self.transfers.wait_idle();
        assert!(self.transfers.finished().iter().all(|job| job.succeeded()));
        self.settle()
    }

    fn settle(&mut self) -> usize {
        let mut changed = 0;
        for (key, present) in self.transfers.take_changes() {
            changed += self.table.settle([&key], present);
        }
        changed
    }

    fn lookup(&mut self, n: u64) -> Verdict<Vec<u8>> {
        self.table.lookup(&key(n), &REQUEST)
    }

    /// Probes everything batched, now, answering from the files; the
    /// answers are returned unapplied (a probe that is slow to publish).
    fn probe_now(&mut self) -> Vec<kvtier::lookup::GroupResult<Vec<u8>>> {
        let Some(submission) = self.table.take_submission() else {
            return Vec::new();
        };
        submission
            .into_groups()
            .into_iter()
            .map(|group| {
                let found: Vec<bool> = group
                    .keys()
                    .iter()
                    .map(|key| self.layout.contains(key).unwrap())
                    .collect();
                group.answered(found)
            })
            .collect()
    }

    fn on_disk(&self, n: u64) -> bool {
        self.layout.contains(&key(n)).unwrap()
    }
}

#[test]
fn a_store_completing_after_an_absent_probe_makes_the_lookup_hit() {
    for budget in [None, Some(8)] {
        let mut tier = Tier::open(budget);
        assert_eq!(tier.lookup(1), Verdict::Pending);
        let late = tier.probe_now(); // block 1 is not there yet
        assert_eq!(tier.store(&[1]), 1, "budget {budget:?}");
        assert!(tier.lookup(1).is_hit());
        for answer in late {
            tier.table.apply(answer); // "absent", from before the store
        }
        assert!(
            tier.lookup(1).is_hit(),
            "budget {budget:?}: the store stands"
        );
        assert_eq!(tier.table.stats().stale_results, 1);
    }
}

#[test]
fn an_evicted_hit_misses_before_any_load_is_tried() {
    let mut tier = Tier::open(Some(2));
    tier.store(&[1, 2]);
    tier.lookup(1);
    tier.lookup(2);
    for answer in tier.probe_now() {
        tier.table.apply(answer);
    }
    assert!(tier.lookup(1).is_hit() && tier.lookup(2).is_hit());
    // Two more blocks: the budget of two evicts 1 and 2.
    assert_eq!(tier.store(&[3, 4]), 2, "two hits settled as misses");
    assert!(!tier.on_disk(1) && !tier.on_disk(2));
    assert_eq!(tier.lookup(1), Verdict::Miss);
    assert_eq!(tier.lookup(2), Verdict::Miss);
    assert_eq!(tier.table.stats().settled_misses, 2);
}

#[test]
fn after_any_interleaving_of_probes_and_stores_every_verdict_is_the_files_truth() {
    // Keys 0..12 under a budget of 4 blocks: probes issued at every point,
    // answered late or at once, stores evicting all along.
    let mut tier = Tier::open(Some(4));
    let mut late = Vec::new();
    for round in 0..12u64 {
        for n in 0..12 {
            tier.lookup(n);
        }
        late.extend(tier.probe_now());
        tier.store(&[(round * 5) % 12, (round * 7 + 3) % 12]);
        if round % 3 == 2 {
            for answer in late.drain(..) {
                tier.table.apply(answer);
            }
        }
    }
    for answer in late.drain(..) {
        tier.table.apply(answer);
    }
    tier.settle();
    tier.table.check_invariants().unwrap();
    let mut hits = 0;
    for n in 0..12 {
        let verdict = tier.lookup(n);
        if verdict == Verdict::Pending {
            continue; // never answered: no claim either way
        }
        assert_eq!(verdict.is_hit(), tier.on_disk(n), "block {n}");
        hits += usize::from(verdict.is_hit());
    }
    assert_eq!(
        hits, 4,
        "the budget holds four blocks, and the lookups know which"
    );
    assert_eq!(tier.table.stats().anomalies, 0);
}
