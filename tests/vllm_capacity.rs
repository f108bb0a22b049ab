//! vLLM's transfers under a byte budget (`VllmTransfers::set_budget`, what
//! `kvtier.vllm.FsTier`'s `"capacity_bytes"` sets): stores make room first
//! and the files stay within it, loads pin, an evicted block's load fails
//! and keeps the blocks before it, a present block is counted once.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::time::Duration;

use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::tier::{PrimaryRegion, TransferKind, VllmFsLayout, VllmTransfers};

#[path = "common/files.rs"]
mod files;
use files::bytes_on_disk;

const BLOCK: usize = 4096;

fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

fn run(
    transfers: &mut VllmTransfers,
    kind: TransferKind,
    id: u64,
    keys: &[u64],
    blocks: &[usize],
) -> (bool, usize) {
    let keys = keys.iter().map(|&n| key(n)).collect();
    transfers.submit(kind, id, keys, blocks).expect("submitted");
    transfers.wait_idle();
    let finished = transfers.finished();
    assert_eq!(finished.len(), 1);
    (finished[0].succeeded(), finished[0].done)
}

#[test]
fn stores_stay_within_the_budget_and_an_evicted_blocks_load_fails_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let rank_dir = dir.path().join("model_0123456789ab_r0");
    let layout = VllmFsLayout::new(&rank_dir).unwrap();
    let region = PrimaryRegion::zeroed(4, BLOCK).unwrap();
    let mut transfers = VllmTransfers::new(layout, region, 1, 1).unwrap();
    let capacity = 3 * BLOCK as u64;
    let report = transfers
        .set_budget(
            BudgetConfig::new(capacity)
                .unwrap()
                .with_policy(Policy::Lru)
                .with_stale_temp_age(Some(Duration::from_secs(600)))
                .unwrap(),
        )
        .expect("budget");
    assert_eq!(report.blocks, 0);
    for n in 0..10u64 {
        assert_eq!(
            run(&mut transfers, TransferKind::Store, n, &[n], &[0]),
            (true, 1)
        );
        assert!(bytes_on_disk(&rank_dir) <= capacity, "after store {n}");
    }
    // The same block again: present, counted once.
    assert_eq!(
        run(&mut transfers, TransferKind::Store, 20, &[9], &[1]),
        (true, 1)
    );
    let stats = transfers.capacity_stats().unwrap();
    assert_eq!((stats.resident_bytes, stats.evictions), (capacity, 7));
    assert_eq!(stats.resident_bytes, bytes_on_disk(&rank_dir));
    // 8 and 9 are resident, 0 was evicted: the load keeps 8 and 9, fails at 0.
    assert_eq!(
        run(
            &mut transfers,
            TransferKind::Load,
            21,
            &[8, 9, 0, 7],
            &[0, 1, 2, 3]
        ),
        (false, 2)
    );
    let stats = transfers.capacity_stats().unwrap();
    assert_eq!(
        (stats.pins, stats.pin_misses, stats.pinned_entries),
        (2, 1, 0)
    );
    assert_eq!(transfers.trim(BLOCK as u64).unwrap(), 2);
    assert_eq!(bytes_on_disk(&rank_dir), BLOCK as u64);
    assert!(
        transfers
            .set_budget(
                BudgetConfig::new(capacity)
                    .unwrap()
                    .with_policy(Policy::Lru)
                    .with_stale_temp_age(Some(Duration::ZERO))
                    .unwrap()
            )
            .is_err(),
        "one budget"
    );
}

/// A budget smaller than one block would fail every store and show it only
/// in a counter: refused where it is set, naming the setting and the
/// block's size (issue 41); one block exactly is a budget.
#[test]
fn a_budget_smaller_than_one_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rank_dir = dir.path().join("model_0123456789ab_r0");
    let layout = VllmFsLayout::new(&rank_dir).unwrap();
    let region = PrimaryRegion::zeroed(2, BLOCK).unwrap();
    let mut transfers = VllmTransfers::new(layout, region, 1, 1).unwrap();
    let small = BudgetConfig::new(BLOCK as u64 - 1).unwrap();
    match transfers.set_budget(small) {
        Err(kvtier::TierError::Config(why)) => assert!(
            why.starts_with("capacity_bytes is") && why.contains(&format!("({BLOCK} bytes)")),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    let one = BudgetConfig::new(BLOCK as u64).unwrap();
    assert!(transfers.set_budget(one).is_ok());
    transfers.shutdown(Duration::ZERO);
}
