//! The fs tier under a byte budget (`FsOptions::capacity_bytes`): the
//! files on disk stay within it, loads refresh recency and pin, the startup
//! scan keeps the newest blocks and sweeps stale temporary files, damaged
//! and vanished blocks leave the books, and a full device (a small tmpfs
//! this test mounts, where the machine lets it) makes the tier evict and
//! retry, never leaving a partial block.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use kvtier::capacity::{Policy, Rejection};
use kvtier::settings::BudgetConfig;
use kvtier::tier::FsOptions;
use kvtier::{FsTier, StoreTask, TierError};

#[path = "common/files.rs"]
mod files;
use files::{bytes_on_disk, files};

/// Header plus payload: what one block's file holds.
const HEADER: u64 = 16;

fn budgeted(root: &Path, capacity: u64) -> FsTier {
    FsTier::open_with(
        root,
        "ns",
        FsOptions::default().budget(Some(BudgetConfig::new(capacity).unwrap())),
    )
    .expect("open")
}

#[test]
fn the_files_stay_within_the_budget_and_the_books_match_them() {
    let root = tempfile::tempdir().expect("tempdir");
    // Room for 10 blocks of 100 payload bytes.
    let capacity = 10 * (HEADER + 100);
    let tier = budgeted(root.path(), capacity);
    for key in 0u64..200 {
        tier.store(&key, &[key as u8; 100]).expect("store");
        let on_disk = bytes_on_disk(root.path());
        assert!(
            on_disk <= capacity,
            "{on_disk} bytes on disk after store {key}"
        );
        let stats = tier.capacity_stats().expect("a budget");
        assert_eq!(stats.resident_bytes, on_disk, "the books count the files");
        assert_eq!(stats.reserved_bytes, 0);
    }
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.entries, stats.evictions), (10, 190));
    assert_eq!(stats.evicted_bytes, 190 * (HEADER + 100));
    for key in 190u64..200 {
        assert_eq!(
            tier.load(&key).expect("load").as_deref(),
            Some(&[key as u8; 100][..])
        );
    }
    assert!(!tier.contains(&189u64).unwrap(), "the oldest went first");
}

#[test]
fn a_load_refreshes_recency_and_pins_its_block() {
    let root = tempfile::tempdir().expect("tempdir");
    let tier = budgeted(root.path(), 3 * (HEADER + 8));
    for key in 0u64..3 {
        tier.store(&key, &[1; 8]).unwrap();
    }
    assert!(tier.load(&0u64).unwrap().is_some());
    tier.store(&3u64, &[1; 8]).unwrap();
    assert!(tier.contains(&0u64).unwrap(), "read, so kept");
    assert!(
        !tier.contains(&1u64).unwrap(),
        "the least recently used went"
    );
    let stats = tier.capacity_stats().unwrap();
    assert_eq!(
        (stats.pins, stats.pinned_entries),
        (1, 0),
        "pinned for the read, then released"
    );
}

#[test]
fn a_block_larger_than_the_budget_is_refused_and_nothing_is_lost() {
    let root = tempfile::tempdir().expect("tempdir");
    let tier = budgeted(root.path(), 100);
    tier.store(&1u64, &[1; 50]).unwrap();
    let error = tier.store(&2u64, &[2; 200]).expect_err("too large");
    assert!(
        matches!(
            error,
            TierError::NoRoom {
                reason: Rejection::TooLarge,
                bytes: 216,
                capacity: 100,
                ..
            }
        ),
        "{error}"
    );
    assert!(tier.contains(&1u64).unwrap(), "the block there stays");
    assert!(files(root.path(), ".tmp").is_empty());
    let task = tier.save(&3u64, vec![3; 500]);
    assert!(task.wait().is_err(), "a save without room fails as a save");
}

#[test]
fn a_vanished_or_damaged_block_leaves_the_books_and_is_written_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let tier = budgeted(root.path(), 1 << 20);
    tier.store(&1u64, &[1; 64]).unwrap();
    tier.store(&2u64, &[2; 64]).unwrap();
    // Removed behind the tier's back: the next store of the key writes it.
    fs::remove_file(tier.path_of(&1u64)).unwrap();
    tier.store(&1u64, &[1; 64]).unwrap();
    assert_eq!(tier.load(&1u64).unwrap().as_deref(), Some(&[1; 64][..]));
    // Truncated: the load fails, the file goes, the books forget it.
    let path = tier.path_of(&2u64);
    fs::write(&path, b"short").unwrap();
    assert!(matches!(tier.load(&2u64), Err(TierError::Corrupt { .. })));
    assert!(!path.exists(), "a damaged block is deleted");
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.entries, stats.resident_bytes), (1, HEADER + 64));
    tier.store(&2u64, &[2; 64]).unwrap();
    assert_eq!(tier.load(&2u64).unwrap().as_deref(), Some(&[2; 64][..]));
    assert_eq!(tier.capacity_stats().unwrap().lost, 2);
}

#[test]
fn concurrent_stores_of_one_block_leave_one_whole_block_counted_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let tier = budgeted(root.path(), 1 << 20);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..50 {
                    // Refused as busy while another writes it: never damaged.
                    match tier.store(&7u64, &[7; 4096]) {
                        Ok(())
                        | Err(TierError::NoRoom {
                            reason: Rejection::Busy,
                            ..
                        }) => {}
                        Err(error) => panic!("{error}"),
                    }
                }
            });
        }
    });
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.entries, stats.resident_bytes), (1, HEADER + 4096));
    assert_eq!(files(root.path(), ".bin").len(), 1);
    assert!(files(root.path(), ".tmp").is_empty());
    assert_eq!(tier.load(&7u64).unwrap().as_deref(), Some(&[7; 4096][..]));
}

#[test]
fn reopening_keeps_the_newest_blocks_that_fit_and_sweeps_stale_temporary_files() {
    let root = tempfile::tempdir().expect("tempdir");
    let block = HEADER + 32;
    {
        let tier = FsTier::open(root.path(), "ns").expect("open");
        let now = SystemTime::now();
        for key in 0u64..10 {
            tier.store(&key, &[key as u8; 32]).unwrap();
            // Key 9 the newest, key 0 the oldest.
            let file = fs::File::options()
                .write(true)
                .open(tier.path_of(&key))
                .unwrap();
            file.set_modified(now - Duration::from_secs(1000 - key * 10))
                .unwrap();
        }
        let shard = tier.path_of(&0u64).parent().unwrap().to_path_buf();
        let stale = shard.join("00.bin.00000000000000aa.tmp");
        fs::write(&stale, b"dead writer").unwrap();
        fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(now - Duration::from_secs(3600))
            .unwrap();
        fs::write(shard.join("00.bin.00000000000000bb.tmp"), b"live writer").unwrap();
    }
    let options = FsOptions::default().budget(Some(BudgetConfig::new(4 * block).unwrap()));
    let tier = FsTier::open_with(root.path(), "ns", options).expect("reopen");
    let report = tier.scan_report().expect("a scan").clone();
    assert_eq!(
        (report.blocks, report.bytes, report.trimmed, report.swept),
        (4, 4 * block, 6, 1)
    );
    for key in 0u64..10 {
        assert_eq!(tier.contains(&key).unwrap(), key >= 6, "key {key}");
    }
    let temps = files(root.path(), ".tmp");
    assert_eq!(temps.len(), 1, "the young temporary file stays: {temps:?}");
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.resident_bytes, stats.startup_trims), (4 * block, 6));
    // The oldest resident (key 6) is the first victim.
    tier.store(&10u64, &[0; 32]).unwrap();
    assert!(!tier.contains(&6u64).unwrap() && tier.contains(&7u64).unwrap());
}

#[test]
fn a_trim_brings_the_files_under_the_new_budget() {
    let root = tempfile::tempdir().expect("tempdir");
    let block = HEADER + 100;
    let tier = budgeted(root.path(), 20 * block);
    for key in 0u64..20 {
        tier.store(&key, &[0; 100]).unwrap();
    }
    assert_eq!(tier.trim(5 * block).unwrap(), 15);
    assert_eq!(bytes_on_disk(root.path()), 5 * block);
    assert_eq!(tier.capacity_stats().unwrap().trims, 15);
    let unbounded = FsTier::open(root.path(), "other").unwrap();
    assert!(matches!(unbounded.trim(0), Err(TierError::Config(_))));
    assert!(unbounded.capacity_stats().is_none());
}

#[test]
fn s3_fifo_keeps_the_same_bound() {
    let root = tempfile::tempdir().expect("tempdir");
    let capacity = 8 * (HEADER + 10);
    let options = FsOptions::default().budget(Some(
        BudgetConfig::new(capacity)
            .unwrap()
            .with_policy(Policy::S3Fifo),
    ));
    let tier = FsTier::open_with(root.path(), "ns", options).unwrap();
    for key in 0u64..100 {
        tier.store(&key, &[0; 10]).unwrap();
        if key % 3 == 0 {
            let _ = tier.load(&(key / 2)).unwrap();
        }
        assert!(bytes_on_disk(root.path()) <= capacity);
    }
}

/// A tmpfs of `kib` KiB mounted on a new directory, unmounted on drop;
/// `None` (with the reason printed) where the machine does not allow it.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount(kib: u32) -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir.path())
            .output();
        match output {
            Ok(output) if output.status.success() => Some(Self(dir)),
            Ok(output) => {
                let why = String::from_utf8_lossy(&output.stderr);
                eprintln!(
                    "SKIPPED: cannot mount a {kib} KiB tmpfs here: {}",
                    why.trim()
                );
                None
            }
            Err(error) => {
                eprintln!("SKIPPED: cannot run mount: {error}");
                None
            }
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_device_makes_the_tier_evict_and_retry_and_never_leaves_a_partial_block() {
    let Some(small) = SmallFs::mount(512) else {
        return;
    };
    // A budget far above the device: the device fills first.
    let tier = budgeted(small.0.path(), 64 << 20);
    let payload = vec![9u8; 60 << 10];
    let mut failed = 0;
    for key in 0u64..40 {
        match tier.store(&key, &payload) {
            Ok(()) => assert!(tier.contains(&key).unwrap()),
            Err(TierError::Io { source, .. }) if source.raw_os_error() == Some(28) => failed += 1,
            Err(error) => panic!("store {key}: {error}"),
        }
        for (path, size) in files(small.0.path(), ".bin") {
            assert_eq!(
                size,
                HEADER + payload.len() as u64,
                "partial block {path:?}"
            );
        }
        assert!(
            files(small.0.path(), ".tmp").is_empty(),
            "a temporary file left"
        );
    }
    let stats = tier.capacity_stats().unwrap();
    eprintln!(
        "{failed} of 40 stores failed; {} ENOSPC, {} evictions",
        stats.enospc, stats.evictions
    );
    assert!(stats.enospc > 0, "the device never filled: {stats:?}");
    assert!(stats.evictions > 0, "ENOSPC evicted nothing: {stats:?}");
    assert!(
        failed < 40 - 8,
        "{failed} stores failed: the retries found no room"
    );
    assert!(tier.contains(&39u64).unwrap(), "the last store got room");
    assert_eq!(stats.resident_bytes, bytes_on_disk(small.0.path()));
    drop(tier);
}
