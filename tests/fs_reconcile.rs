//! Budgeted fs tiers sharing one namespace, reconciled with the directory
//! (`FsTier::reconcile`, `FsOptions::rescan_interval`): what one writes the
//! others count, what one deletes the others forget, and after a reconcile
//! with no writer running the namespace is within one budget. A reconcile
//! racing the tier's own stores never forgets a block of its own that is on
//! disk: the books end equal to the files.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::path::Path;
use std::time::{Duration, Instant};

use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::tier::{BlockLayout, FsOptions, scan_directory};
use kvtier::{FsTier, TierError};

#[path = "common/files.rs"]
mod files;
use files::bytes_on_disk;

/// 100 bytes a file: an 84-byte payload and the 16-byte header.
const FILE: u64 = 100;
const PAYLOAD: [u8; 84] = [5; 84];

fn budget(blocks: u64) -> BudgetConfig {
    BudgetConfig::new(blocks * FILE).unwrap()
}

fn options(blocks: u64) -> FsOptions {
    FsOptions::default().budget(Some(budget(blocks)))
}

fn open(root: &Path, options: FsOptions) -> FsTier {
    FsTier::open_with(root, "shared", options).expect("open")
}

#[test]
fn a_reconcile_counts_the_neighbours_blocks_and_brings_the_namespace_within_one_budget() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    let (a, b) = (
        open(root.path(), options(10)),
        open(root.path(), options(10)),
    );
    for key in 0u64..20 {
        let tier = if key % 2 == 0 { &a } else { &b };
        tier.store(&key, &PAYLOAD).unwrap();
    }
    assert_eq!(bytes_on_disk(&dir), 20 * FILE, "each counts its own 10");

    let report = a.reconcile().unwrap();
    assert_eq!(
        (report.adopted, report.forgotten, report.evicted),
        (10, 0, 10)
    );
    assert_eq!(bytes_on_disk(&dir), 10 * FILE, "within one budget");
    let stats = a.capacity_stats().unwrap();
    assert_eq!(
        (stats.resident_bytes, stats.adopted, stats.reconciles),
        (10 * FILE, 10, 1)
    );

    // b learns that a deleted 5 of b's blocks (a adopted them as recently
    // used, so a's own older ones went first; then a's store evicts more).
    for key in 100u64..105 {
        a.store(&key, &PAYLOAD).unwrap();
    }
    let report = b.reconcile().unwrap();
    assert_eq!(
        (report.adopted, report.forgotten, report.evicted),
        (5, 5, 0)
    );
    assert_eq!(
        b.capacity_stats().unwrap().resident_bytes,
        bytes_on_disk(&dir)
    );

    // A block the neighbour wrote is not written again, and reads pin it.
    let before = a.capacity_stats().unwrap().committed;
    let kept = (0u64..20)
        .find(|key| a.contains(key).unwrap())
        .expect("one is left");
    a.store(&kept, &PAYLOAD).unwrap();
    b.store(&kept, &PAYLOAD).unwrap();
    assert_eq!(a.capacity_stats().unwrap().committed, before);
    assert_eq!(b.load(&kept).unwrap().as_deref(), Some(&PAYLOAD[..]));
    assert!(b.capacity_stats().unwrap().pins >= 1);
}

#[test]
fn tiers_rescanning_on_their_own_threads_settle_within_one_budget() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    let rescan = |blocks| {
        let budget = budget(blocks).with_rescan_interval(Some(Duration::from_millis(20)));
        FsOptions::default().budget(Some(budget.unwrap()))
    };
    let tiers: Vec<FsTier> = (0..3).map(|_| open(root.path(), rescan(8))).collect();
    for key in 0u64..90 {
        tiers[(key % 3) as usize].store(&key, &PAYLOAD).unwrap();
    }
    // No writer now: within a few intervals every tier has reconciled and
    // the namespace holds one budget (waited for up to 10 s: a loaded
    // machine may run a thread late).
    let settled = || {
        bytes_on_disk(&dir) <= 8 * FILE
            && tiers
                .iter()
                .all(|tier| tier.capacity_stats().unwrap().reconciles > 0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !settled() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        bytes_on_disk(&dir) <= 8 * FILE,
        "{} bytes",
        bytes_on_disk(&dir)
    );
    for tier in &tiers {
        assert!(tier.capacity_stats().unwrap().reconciles > 0);
    }
    // The threads stop with their tiers: dropping them does not hang.
    drop(tiers);
}

#[test]
fn a_reconcile_racing_the_tiers_own_stores_keeps_the_books_equal_to_the_files() {
    for round in 0..20 {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shared");
        let tier = open(root.path(), options(6));
        std::thread::scope(|scope| {
            let storing = scope.spawn(|| {
                for key in 0u64..40 {
                    tier.store(&key, &PAYLOAD).unwrap();
                }
            });
            while !storing.is_finished() {
                tier.reconcile().unwrap();
            }
        });
        let stats = tier.capacity_stats().unwrap();
        assert_eq!(
            (stats.resident_bytes, stats.forgotten, stats.adopted),
            (bytes_on_disk(&dir), 0, 0),
            "round {round}: {stats:?}"
        );
    }
}

#[test]
fn a_trim_from_another_process_is_forgotten_at_the_next_reconcile() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared");
    let tier = open(root.path(), options(10));
    for key in 0u64..10 {
        tier.store(&key, &PAYLOAD).unwrap();
    }
    // `kvtier trim --capacity 400` from another process.
    scan_directory(&dir, BlockLayout::Kvtier, Some(4 * FILE), Policy::Lru, None).unwrap();
    let report = tier.reconcile().unwrap();
    assert_eq!((report.forgotten, report.adopted), (6, 0));
    assert_eq!(tier.capacity_stats().unwrap().resident_bytes, 4 * FILE);
    // The whole budget is usable again at once.
    for key in 10u64..16 {
        tier.store(&key, &PAYLOAD).unwrap();
    }
    assert_eq!(tier.capacity_stats().unwrap().evictions, 0);
    assert_eq!(bytes_on_disk(&dir), 10 * FILE);
}

#[test]
fn rescan_settings_are_checked() {
    let root = tempfile::tempdir().unwrap();
    // A rescan needs a budget: it is one of a budget's settings, checked
    // where the budget is built, one day at most.
    for interval in [Duration::ZERO, Duration::from_secs(86_401)] {
        let error = budget(1).with_rescan_interval(Some(interval)).unwrap_err();
        assert_eq!(error.setting, "rescan_interval");
        assert!(error.to_string().contains("(a day)"), "{error}");
    }
    let unbounded = FsTier::open(root.path(), "ns").unwrap();
    assert!(matches!(unbounded.reconcile(), Err(TierError::Config(_))));
}
