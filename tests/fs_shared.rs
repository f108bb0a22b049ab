//! One directory shared by several budgeted fs tiers (engines in separate
//! processes each open their own) and by `kvtier trim`: the tolerance
//! docs/design.md states ("Capacity across processes"), checked.
//!
//! Each tier's books count what its scan found at open plus what it wrote
//! since, so N tiers with budget C hold at most N x C together until a scan
//! (a reopen, `kvtier trim`) brings the directory back to C; a trim under
//! an open tier only makes that tier count files that are gone, which it
//! deletes as victims (already gone) or writes again, never exceeding C.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::path::Path;

use kvtier::FsTier;
use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::tier::{BlockLayout, FsOptions, scan_directory};

#[path = "common/files.rs"]
mod files;
use files::bytes_on_disk;

/// 100 bytes a file: an 84-byte payload and the 16-byte header.
const FILE: u64 = 100;
const PAYLOAD: [u8; 84] = [5; 84];

fn open(root: &Path, blocks: u64) -> FsTier {
    let options = FsOptions::default().budget(Some(BudgetConfig::new(blocks * FILE).unwrap()));
    FsTier::open_with(root, "shared", options).expect("open")
}

#[test]
fn two_tiers_on_one_directory_hold_at_most_twice_the_budget_until_a_scan() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    let (a, b) = (open(root.path(), 10), open(root.path(), 10));
    for key in 0u64..40 {
        // Disjoint keys, interleaved, as two engines would write.
        let tier = if key % 2 == 0 { &a } else { &b };
        tier.store(&key, &PAYLOAD).unwrap();
        let on_disk = bytes_on_disk(&dir);
        assert!(
            on_disk <= 2 * 10 * FILE,
            "{on_disk} bytes after store {key}"
        );
    }
    assert_eq!(
        bytes_on_disk(&dir),
        2 * 10 * FILE,
        "each tier kept its own 10"
    );
    // The same key stored by both: one file, each tier counts it once.
    a.store(&1000u64, &PAYLOAD).unwrap();
    b.store(&1000u64, &PAYLOAD).unwrap();
    assert!(a.contains(&1000u64).unwrap());
    // A reopen scans: the directory is back within one budget.
    drop(a);
    let again = open(root.path(), 10);
    assert_eq!(again.scan_report().unwrap().blocks, 10);
    assert!(bytes_on_disk(&dir) <= 10 * FILE);
}

#[test]
fn a_trim_under_an_open_tier_never_makes_it_exceed_its_budget() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    let tier = open(root.path(), 10);
    for key in 0u64..10 {
        tier.store(&key, &PAYLOAD).unwrap();
    }
    // `kvtier trim --capacity 500` from another process.
    let trimmed =
        scan_directory(&dir, BlockLayout::Kvtier, Some(5 * FILE), Policy::Lru, None).unwrap();
    assert_eq!((trimmed.blocks, trimmed.trimmed), (5, 5));
    // The tier still counts the trimmed files: it under-uses its budget
    // until it evicts them (already gone) or writes them again.
    assert_eq!(tier.capacity_stats().unwrap().resident_bytes, 10 * FILE);
    for key in 0u64..30 {
        tier.store(&(100 + key), &PAYLOAD).unwrap();
        let on_disk = bytes_on_disk(&dir);
        let books = tier.capacity_stats().unwrap().resident_bytes;
        assert!(
            on_disk <= 10 * FILE && on_disk <= books,
            "{on_disk} on disk, {books} in the books"
        );
    }
    assert_eq!(
        bytes_on_disk(&dir),
        10 * FILE,
        "back to the whole budget, all its own"
    );
    // A trimmed block stored again is written again.
    tier.store(&0u64, &PAYLOAD).unwrap();
    assert_eq!(tier.load(&0u64).unwrap().as_deref(), Some(&PAYLOAD[..]));
}
