//! A budget the disk agrees with: eviction, trims and sweeps take the
//! directories they empty with them, in kvtier's layout and in vLLM's, so
//! a long-running tier holds no empty fan-out directories beyond its
//! budget; and a store into a directory that an eviction removes at the
//! same moment creates it again instead of failing.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier::FsTier;
use kvtier::capacity::Policy;
use kvtier::settings::BudgetConfig;
use kvtier::tier::{FsOptions, PrimaryRegion, TransferKind, VllmFsLayout, VllmTransfers};

#[path = "common/files.rs"]
mod files;
use files::bytes_on_disk;

/// Directories below `dir` (two levels, as both layouts nest) that hold
/// no file at any depth, and how many directories there are in all.
fn empty_directories(dir: &Path) -> (Vec<String>, usize) {
    let mut empty = Vec::new();
    let mut total = 0;
    for fan_out in fs::read_dir(dir).unwrap().flatten() {
        if !fan_out.file_type().unwrap().is_dir() {
            continue;
        }
        total += 1;
        let mut files_below = 0;
        for shard in fs::read_dir(fan_out.path()).unwrap().flatten() {
            total += 1;
            let files = fs::read_dir(shard.path()).unwrap().count();
            if files == 0 {
                empty.push(shard.path().display().to_string());
            }
            files_below += files;
        }
        if files_below == 0 {
            empty.push(fan_out.path().display().to_string());
        }
    }
    (empty, total)
}

/// A 32-byte key from a seeded generator (a SHA-256 block hash's shape):
/// keys spread over the whole fan-out.
fn spread_key(state: &mut u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        // xorshift64*
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        chunk.copy_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_be_bytes());
    }
    key
}

#[test]
fn ten_thousand_evictions_leave_no_directory_without_a_block() {
    let root = tempfile::tempdir().unwrap();
    let block = 16 + 64;
    let tier = FsTier::open_with(
        root.path(),
        "ns",
        FsOptions::default().budget(Some(BudgetConfig::new(50 * block).unwrap())),
    )
    .unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..10_050 {
        tier.store(&spread_key(&mut state), &[7; 64]).unwrap();
    }
    let stats = tier.capacity_stats().unwrap();
    assert_eq!((stats.entries, stats.evictions), (50, 10_000));
    let dir = root.path().join("ns");
    let (empty, total) = empty_directories(&dir);
    assert!(
        empty.is_empty(),
        "{} empty directories: {:?}",
        empty.len(),
        &empty[..empty.len().min(5)]
    );
    assert!(total <= 2 * 50, "{total} directories for 50 blocks");
    assert_eq!(bytes_on_disk(&dir), 50 * block);

    // A trim to a smaller budget empties more of them: gone too.
    assert_eq!(tier.trim(5 * block).unwrap(), 45);
    let (empty, total) = empty_directories(&dir);
    assert!(empty.is_empty() && total <= 10, "{empty:?} of {total}");
}

fn vllm_key(key: &[u8; 32]) -> Vec<u8> {
    let mut key = key.to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

#[test]
fn ten_thousand_vllm_evictions_leave_no_directory_without_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let rank_dir = dir.path().join("model_0123456789ab_r0");
    let layout = VllmFsLayout::new(&rank_dir).unwrap();
    let region = PrimaryRegion::zeroed(64, 256).unwrap();
    let mut transfers = VllmTransfers::new(layout, region, 1, 2).unwrap();
    transfers
        .set_budget(
            BudgetConfig::new(40 * 256)
                .unwrap()
                .with_policy(Policy::Lru)
                .with_stale_temp_age(Some(Duration::from_secs(600)))
                .unwrap(),
        )
        .unwrap();
    let mut state = 0x2545_f491_4f6c_dd1d;
    for job in 0..(10_040 / 8) {
        let keys: Vec<Vec<u8>> = (0..8).map(|_| vllm_key(&spread_key(&mut state))).collect();
        transfers
            .submit(TransferKind::Store, job, keys, &(0..8).collect::<Vec<_>>())
            .unwrap();
        transfers.wait_idle();
        assert!(transfers.finished().iter().all(|t| t.succeeded()));
    }
    let stats = transfers.capacity_stats().unwrap();
    assert_eq!((stats.entries, stats.evictions), (40, 10_000));
    let (empty, total) = empty_directories(&rank_dir);
    assert!(
        empty.is_empty(),
        "{} empty directories: {:?}",
        empty.len(),
        &empty[..empty.len().min(5)]
    );
    assert!(total <= 2 * 40, "{total} directories for 40 blocks");
    assert_eq!(bytes_on_disk(&rank_dir), 40 * 256);
}

/// Keys that fall into `dirs` shard directories only (the first five hex
/// digits `abcd<d>`), so that the budget empties those directories over
/// and over while other threads store into them.
fn crowded_key(thread: u64, n: u64, dirs: u64) -> [u8; 8] {
    // Hex digits: "abcd", then the shard's digit (the fifth: the shard
    // directory is "d<shard>"), then the writer and the count.
    (0xabcd_0000_0000_0000u64 | (n % dirs) << 44 | thread << 32 | n).to_be_bytes()
}

#[test]
fn stores_into_directories_that_evictions_remove_meanwhile_succeed() {
    let root = tempfile::tempdir().unwrap();
    let block = 16 + 64;
    let threads = 4;
    // Room for 8 blocks over 16 directories: most of them are empty most
    // of the time, and removed, while the next store into them runs.
    let tier = Arc::new(
        FsTier::open_with(
            root.path(),
            "ns",
            FsOptions::default().budget(Some(BudgetConfig::new(8 * block).unwrap())),
        )
        .unwrap(),
    );
    let writers: Vec<_> = (0..threads)
        .map(|thread| {
            let tier = tier.clone();
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                for n in 0..3000 {
                    if let Err(error) = tier.store(&crowded_key(thread, n, 16), &[1; 64]) {
                        failed.push(error.to_string());
                    }
                }
                failed
            })
        })
        .collect();
    let failed: Vec<String> = writers
        .into_iter()
        .flat_map(|writer| writer.join().unwrap())
        .collect();
    assert!(
        failed.is_empty(),
        "{} stores failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    let dir = root.path().join("ns");
    let stats = tier.capacity_stats().unwrap();
    assert_eq!(
        stats.resident_bytes,
        bytes_on_disk(&dir),
        "the books count the files"
    );
    let (empty, _) = empty_directories(&dir);
    assert!(empty.is_empty(), "{empty:?}");
}

#[test]
fn vllm_stores_into_directories_that_evictions_remove_meanwhile_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let rank_dir = dir.path().join("model_0123456789ab_r0");
    let layout = VllmFsLayout::new(&rank_dir).unwrap();
    let region = PrimaryRegion::zeroed(64, 256).unwrap();
    let mut transfers = VllmTransfers::new(layout, region, 1, 4).unwrap();
    transfers
        .set_budget(
            BudgetConfig::new(8 * 256)
                .unwrap()
                .with_policy(Policy::Lru)
                .with_stale_temp_age(Some(Duration::from_secs(600)))
                .unwrap(),
        )
        .unwrap();
    let mut job = 0;
    for round in 0..100u64 {
        // 64 stores of one block each, on four threads, into 16 directories.
        for i in 0..64u64 {
            let mut key = crowded_key(i % 4, round * 64 + i, 16).to_vec();
            key.extend_from_slice(&0u32.to_be_bytes());
            transfers
                .submit(TransferKind::Store, job, vec![key], &[i as usize])
                .unwrap();
            job += 1;
        }
        transfers.wait_idle();
        let finished = transfers.finished();
        assert!(
            finished.iter().all(|t| t.succeeded()),
            "round {round}: {:?}",
            finished.iter().find(|t| !t.succeeded())
        );
    }
    let stats = transfers.capacity_stats().unwrap();
    assert_eq!(stats.resident_bytes, bytes_on_disk(&rank_dir));
    let (empty, _) = empty_directories(&rank_dir);
    assert!(empty.is_empty(), "{empty:?}");
}
