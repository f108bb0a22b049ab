//! vLLM's transfers on real directories: blocks stored from the primary
//! region land as vLLM's raw files at vLLM's paths and load back; a failed
//! load keeps the blocks before its first bad one; damaged files are removed
//! and nothing else is; every job is reported once, only after its I/O.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvtier::save::SaveOutcome;
use kvtier::tier::{
    FinishedTransfer, PrimaryRegion, TierError, TransferError, TransferKind, VllmFsLayout,
    VllmTransfers,
};

const BLOCK: usize = 4096;

/// vLLM's key: the block hash, then the group index as 4 big-endian bytes.
fn key(n: u64) -> Vec<u8> {
    let mut key = n.to_be_bytes().to_vec();
    key.extend_from_slice(&0u32.to_be_bytes());
    key
}

/// Where vLLM's fs tier writes the block of `key(n)`, spelled out.
fn vllm_path(rank_dir: &Path, n: u64) -> PathBuf {
    let hex: String = n.to_be_bytes().iter().map(|b| format!("{b:02x}")).collect();
    rank_dir
        .join(&hex[0..3])
        .join(format!("{}_g0", &hex[3..5]))
        .join(format!("{hex}.bin"))
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    rank_dir: PathBuf,
    transfers: VllmTransfers,
}

fn fixture(blocks: usize, threads: usize) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let rank_dir = dir.path().join("model_0123456789ab_r0");
    let layout = VllmFsLayout::new(&rank_dir).expect("layout");
    let region = PrimaryRegion::zeroed(blocks, BLOCK).expect("region");
    let transfers = VllmTransfers::new(layout, region, threads, threads).expect("transfers");
    Fixture {
        _dir: dir,
        rank_dir,
        transfers,
    }
}

impl Fixture {
    fn run(
        &mut self,
        kind: TransferKind,
        id: u64,
        keys: &[u64],
        blocks: &[usize],
    ) -> FinishedTransfer {
        let keys = keys.iter().map(|&n| key(n)).collect();
        self.transfers
            .submit(kind, id, keys, blocks)
            .expect("submitted");
        self.transfers.wait_idle();
        let mut finished = self.transfers.finished();
        assert_eq!(finished.len(), 1, "one job, one report");
        finished.pop().unwrap()
    }

    fn fill(&self, block: usize, seed: u8) {
        self.transfers
            .region()
            .expect("running")
            .write_block(block, &pattern(seed))
            .unwrap();
    }

    fn block(&self, block: usize) -> Vec<u8> {
        self.transfers
            .region()
            .expect("running")
            .read_block(block)
            .unwrap()
    }
}

#[test]
fn stored_blocks_are_vllms_raw_files_at_vllms_paths_and_load_back_elsewhere() {
    let mut f = fixture(8, 2);
    f.fill(0, 1);
    f.fill(1, 2);
    let stored = f.run(TransferKind::Store, 1, &[10, 11], &[0, 1]);
    assert!(stored.succeeded() && stored.done == 2);
    assert_eq!(
        fs::read(vllm_path(&f.rank_dir, 10)).unwrap(),
        pattern(1),
        "the bytes alone"
    );
    assert_eq!(fs::read(vllm_path(&f.rank_dir, 11)).unwrap(), pattern(2));

    let loaded = f.run(TransferKind::Load, 2, &[11, 10], &[6, 7]);
    assert!(loaded.succeeded());
    assert_eq!(loaded.done_keys(), [key(11), key(10)]);
    assert!(loaded.failed_keys().is_empty());
    assert_eq!((f.block(6), f.block(7)), (pattern(2), pattern(1)));
    assert!(
        vllm_path(&f.rank_dir, 10).exists(),
        "a good load leaves its file"
    );
}

#[test]
fn a_block_already_stored_is_not_written_again() {
    let mut f = fixture(2, 1);
    f.fill(0, 1);
    assert!(f.run(TransferKind::Store, 1, &[5], &[0]).succeeded());
    f.fill(0, 9);
    assert!(f.run(TransferKind::Store, 2, &[5], &[0]).succeeded());
    assert_eq!(fs::read(vllm_path(&f.rank_dir, 5)).unwrap(), pattern(1));
}

#[test]
fn a_failed_load_keeps_the_blocks_before_its_first_bad_one_and_stops_there() {
    let mut f = fixture(8, 1);
    for block in 0..3 {
        f.fill(block, block as u8 + 1);
    }
    assert!(
        f.run(TransferKind::Store, 1, &[1, 2, 3], &[0, 1, 2])
            .succeeded()
    );
    fs::remove_file(vllm_path(&f.rank_dir, 2)).unwrap();
    let loaded = f.run(TransferKind::Load, 2, &[1, 2, 3], &[4, 5, 6]);
    assert_eq!(loaded.outcome, SaveOutcome::Failed);
    assert_eq!(loaded.done, 1);
    assert_eq!(loaded.done_keys(), [key(1)]);
    assert_eq!(
        loaded.failed_keys(),
        [key(2), key(3)],
        "the tail from the first bad block"
    );
    assert_eq!(f.block(4), pattern(1), "the block before it was loaded");
    assert_eq!(
        f.block(6),
        vec![0; BLOCK],
        "nothing is loaded past the bad block"
    );

    fs::remove_file(vllm_path(&f.rank_dir, 1)).unwrap();
    let first_bad = f.run(TransferKind::Load, 3, &[1, 3], &[4, 6]);
    assert!(first_bad.done_keys().is_empty());
    assert_eq!(first_bad.failed_keys().len(), 2);
}

/// A regular file of the wrong size at a block's name is not a block: a
/// store replaces it (atomically, through a temporary file) and the next
/// load reads the block back.
#[test]
fn a_wrong_sized_file_is_replaced_by_a_store() {
    let mut f = fixture(2, 1);
    f.fill(0, 4);
    let path = vllm_path(&f.rank_dir, 7);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    for wrong in [vec![1u8; BLOCK + 1], vec![1u8; BLOCK - 1], Vec::new()] {
        fs::write(&path, &wrong).unwrap();
        assert!(f.run(TransferKind::Store, 1, &[7], &[0]).succeeded());
        assert_eq!(fs::read(&path).unwrap(), pattern(4), "replaced");
        let loaded = f.run(TransferKind::Load, 2, &[7], &[1]);
        assert!(loaded.succeeded());
        assert_eq!(f.block(1), pattern(4));
        f.fill(1, 0);
    }
    let leftovers = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tmp")
        })
        .count();
    assert_eq!(leftovers, 0, "no temporary file is left");
}

#[test]
fn a_short_or_long_file_is_removed_and_files_that_are_not_regular_stay() {
    let mut f = fixture(4, 1);
    f.fill(0, 3);
    assert!(
        f.run(TransferKind::Store, 1, &[1, 2, 3], &[0, 0, 0])
            .succeeded()
    );
    let (short, long) = (vllm_path(&f.rank_dir, 1), vllm_path(&f.rank_dir, 2));
    fs::write(&short, b"x").unwrap();
    fs::write(&long, vec![0u8; BLOCK + 1]).unwrap();
    assert!(!f.run(TransferKind::Load, 2, &[1], &[1]).succeeded());
    assert!(
        !short.exists(),
        "a short block is damaged: removed, so the next lookup misses"
    );
    assert!(!f.run(TransferKind::Load, 3, &[2], &[1]).succeeded());
    assert!(
        !long.exists(),
        "a longer file is a damaged block too: removed, so the next lookup misses"
    );
    #[cfg(unix)]
    {
        let fifo = vllm_path(&f.rank_dir, 3);
        fs::remove_file(&fifo).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        assert!(
            !f.run(TransferKind::Load, 4, &[3], &[1]).succeeded(),
            "refused, not waited on"
        );
        assert!(fifo.exists());
    }
}

#[test]
fn a_job_is_reported_only_once_its_bytes_are_in_the_region() {
    let mut f = fixture(2, 2);
    f.fill(0, 5);
    assert!(f.run(TransferKind::Store, 0, &[1], &[0]).succeeded());
    for id in 1..=200u64 {
        f.transfers
            .region()
            .expect("running")
            .write_block(1, &vec![0; BLOCK])
            .unwrap();
        f.transfers
            .submit(TransferKind::Load, id, vec![key(1)], &[1])
            .unwrap();
        let report = loop {
            if let Some(report) = f.transfers.finished().pop() {
                break report;
            }
            std::hint::spin_loop();
        };
        assert!(report.succeeded());
        assert_eq!(
            f.block(1),
            pattern(5),
            "job {id} was reported before its load ended"
        );
    }
}

#[test]
fn an_id_in_flight_is_refused_and_free_again_once_reported() {
    let mut f = fixture(2, 1);
    f.transfers
        .submit(TransferKind::Store, 7, vec![key(1)], &[0])
        .unwrap();
    assert!(matches!(
        f.transfers
            .submit(TransferKind::Load, 7, vec![key(1)], &[1]),
        Err(TransferError::InFlight(7))
    ));
    f.transfers.wait_idle();
    assert_eq!(f.transfers.finished().len(), 1);
    assert!(f.transfers.finished().is_empty(), "reported once");
    f.transfers
        .submit(TransferKind::Load, 7, vec![key(1)], &[1])
        .unwrap();
    f.transfers.wait_idle();
    assert!(f.transfers.finished()[0].succeeded());
}

#[test]
fn jobs_that_cannot_run_are_reported_failed_and_touch_nothing() {
    let mut f = fixture(2, 1);
    let cases: [(&[u64], &[usize]); 3] = [
        (&[1], &[2]),       // past the region's last block
        (&[1, 2], &[0]),    // keys and blocks of different counts
        (&[1, 2], &[1, 1]), // one block loaded twice at once
    ];
    for (id, (keys, blocks)) in cases.iter().enumerate() {
        let report = f.run(TransferKind::Load, id as u64, keys, blocks);
        assert_eq!(
            (report.outcome, report.done),
            (SaveOutcome::Failed, 0),
            "case {id}"
        );
    }
    let keys = vec![key(1)];
    f.transfers
        .refuse(TransferKind::Store, 9, keys, "the caller said no")
        .unwrap();
    let refused = f.transfers.finished();
    assert_eq!(
        (refused[0].id, refused[0].outcome),
        (9, SaveOutcome::Failed)
    );
    assert!(!f.rank_dir.exists(), "nothing was written");
    // The claims of refused jobs were given back.
    assert!(f.run(TransferKind::Store, 10, &[1, 2], &[1, 1]).succeeded());
}

#[test]
fn shutdown_without_grace_drops_queued_jobs_reports_them_failed_and_stops_the_threads() {
    let mut f = fixture(256, 1);
    assert_eq!(f.transfers.threads_alive(), 2);
    for id in 0..256u64 {
        let block = id as usize;
        let kind = if id % 2 == 0 {
            TransferKind::Store
        } else {
            TransferKind::Load
        };
        f.transfers
            .submit(kind, id, vec![key(id)], &[block])
            .unwrap();
    }
    let report = f.transfers.shutdown(Duration::ZERO);
    let dropped = report.loads_dropped + report.stores_dropped;
    // Two threads cannot have moved 256 blocks while the jobs were queued.
    assert!(dropped > 0, "the queued jobs were dropped, not run");
    assert_eq!(f.transfers.threads_alive(), 0);
    assert_eq!(f.transfers.queued(TransferKind::Store), 0);
    let finished = f.transfers.finished();
    assert_eq!(finished.len(), 256, "every job is reported, dropped or not");
    let failed = finished.iter().filter(|job| !job.succeeded()).count();
    // Loads of blocks never stored fail on their own too.
    assert!(failed >= dropped, "every dropped job failed");
    let failed_stores = finished
        .iter()
        .filter(|job| job.kind == TransferKind::Store && !job.succeeded())
        .count();
    assert_eq!(
        failed_stores, report.stores_dropped,
        "exactly the dropped stores failed"
    );
    f.transfers
        .submit(TransferKind::Store, 999, vec![key(1)], &[0])
        .unwrap();
    assert!(
        !f.transfers.finished()[0].succeeded(),
        "a job after shutdown fails"
    );
    assert!(f.transfers.in_flight().is_empty());
}

#[test]
fn shutdown_lets_queued_stores_finish_within_its_grace_and_drops_queued_loads() {
    let mut f = fixture(256, 1);
    for id in 0..256u64 {
        f.fill(id as usize, id as u8);
    }
    for id in 0..256u64 {
        let kind = if id < 200 {
            TransferKind::Store
        } else {
            TransferKind::Load
        };
        f.transfers
            .submit(kind, id, vec![key(id)], &[id as usize])
            .unwrap();
    }
    let report = f.transfers.shutdown(Duration::from_secs(60));
    assert_eq!(
        report.stores_dropped, 0,
        "no store is dropped within the grace"
    );
    let finished = f.transfers.finished();
    assert_eq!(finished.len(), 256);
    for job in &finished {
        match job.kind {
            TransferKind::Store => {
                assert!(job.succeeded(), "store {} was dropped", job.id);
                assert_eq!(
                    fs::read(vllm_path(&f.rank_dir, job.id)).unwrap(),
                    pattern(job.id as u8)
                );
            }
            // A load either ran (and failed: nothing was stored under its key)
            // or was dropped; none succeeds.
            TransferKind::Load => assert!(!job.succeeded()),
        }
    }
}

#[test]
fn shutdown_gives_the_primary_memory_back() {
    /// Counts its drops: stands for the engine's buffer export.
    struct Export(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Export {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let released = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut memory = vec![0u8; 8 * BLOCK];
    let dir = tempfile::tempdir().unwrap();
    let layout = VllmFsLayout::new(dir.path().join("m_0123456789ab_r0")).unwrap();
    // SAFETY: `memory` outlives the transfers (dropped at the end of the
    // test, after the region was released by shutdown or drop).
    let region = unsafe {
        PrimaryRegion::from_raw_parts(
            memory.as_mut_ptr(),
            memory.len(),
            BLOCK,
            Box::new(Export(released.clone())),
        )
    }
    .unwrap();
    let mut transfers = VllmTransfers::new(layout, region, 1, 1).unwrap();
    for id in 0..8u64 {
        transfers
            .submit(TransferKind::Store, id, vec![key(id)], &[id as usize])
            .unwrap();
    }
    transfers.shutdown(Duration::from_secs(60));
    assert_eq!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "shutdown released the engine's memory, with the object still alive"
    );
    assert!(transfers.region().is_none());
    assert_eq!(
        transfers.shape(),
        (8, BLOCK),
        "the shape outlives the region"
    );
    assert_eq!(transfers.finished().len(), 8);
    drop(transfers);
    assert_eq!(
        released.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "released once"
    );
    drop(memory);
}

#[test]
fn a_sweep_removes_stale_temporary_files_and_nothing_else() {
    let f = fixture(1, 1);
    let dir = f.rank_dir.join("abc").join("de_g0");
    fs::create_dir_all(&dir).unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let file = |name: &str, stale: bool| {
        let path = dir.join(name);
        let file = fs::File::create(&path).unwrap();
        if stale {
            file.set_modified(hour_ago).unwrap();
        }
        path
    };
    let stale_ours = file("abcdef.bin_18446744073709551615.tmp", true);
    let stale_vllms = file("abcdef.bin_123456789.tmp", true);
    let fresh = file("abcdef.bin_99.tmp", false);
    let block = file("abcdef.bin", true);
    let other = file("notes.tmp", true);
    // Names no writer of the layout gives: not a decimal suffix, a block
    // name that is not this directory's, a temporary file of no block.
    let foreign = [
        file("abcdef.bin_7f3a.tmp", true),
        file("abcdef.bin_v2.tmp", true),
        file("abddef.bin_1.tmp", true),
        file("report.bin_2.tmp", true),
    ];
    let elsewhere = f.rank_dir.join("docs").join("2024");
    fs::create_dir_all(&elsewhere).unwrap();
    let report = elsewhere.join("report.bin_v2.tmp");
    fs::File::create(&report)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    f.transfers.sweep_stale_temps(Duration::from_secs(600));
    let mut transfers = f.transfers;
    transfers.shutdown(Duration::from_secs(60));
    assert_eq!(transfers.swept(), 2);
    assert!(
        !stale_ours.exists() && !stale_vllms.exists(),
        "stale temporaries are swept"
    );
    assert!(fresh.exists(), "a temporary a live writer may own is kept");
    assert!(
        block.exists() && other.exists(),
        "nothing but block temporaries is touched"
    );
    for path in foreign.iter().chain([&report]) {
        assert!(path.exists(), "{} is not the layout's", path.display());
    }
}

#[test]
fn shutdown_drops_the_loads_still_queued() {
    let mut f = fixture(1024, 1);
    let keys: Vec<u64> = (0..16).collect();
    let blocks: Vec<usize> = (0..16).collect();
    assert!(f.run(TransferKind::Store, 0, &keys, &blocks).succeeded());
    // 63 loads of 16 blocks each, into blocks of their own: two threads
    // cannot have started them all by the time shutdown runs.
    for id in 1..64u64 {
        let into: Vec<usize> = (0..16).map(|i| id as usize * 16 + i).collect();
        let load_keys = keys.iter().map(|&n| key(n)).collect();
        f.transfers
            .submit(TransferKind::Load, id, load_keys, &into)
            .unwrap();
    }
    let report = f.transfers.shutdown(Duration::from_secs(60));
    assert!(
        report.loads_dropped > 0,
        "the queued loads were run: {report:?}"
    );
    let finished = f.transfers.finished();
    let failed = finished.iter().filter(|job| !job.succeeded()).count();
    assert_eq!(finished.len(), 63);
    assert_eq!(
        failed, report.loads_dropped,
        "exactly the dropped loads failed"
    );
}

/// Thread counts are a caller's numbers: past the cap (or when their sum
/// wraps) they are a configuration error, not an allocation that aborts
/// the process or a sum that wraps to "no threads".
#[test]
fn thread_counts_past_the_cap_are_configuration_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let new = |load, store| {
        let layout = VllmFsLayout::new(dir.path().join("m_r0")).unwrap();
        let region = PrimaryRegion::zeroed(1, BLOCK).unwrap();
        VllmTransfers::new(layout, region, load, store)
    };
    let max = kvtier::settings::MAX_IO_THREADS;
    for (load, store) in [(1 << 40, 0), (max, 1), (1 << 63, 1 << 63), (usize::MAX, 1)] {
        match new(load, store) {
            Err(TierError::Config(message)) => {
                assert!(message.contains(&max.to_string()), "{message}")
            }
            other => panic!("{load} + {store} threads: {:?}", other.map(|_| ())),
        }
    }
    assert!(
        matches!(new(0, 0), Err(TierError::Config(message)) if message.contains("at least one"))
    );
    assert!(new(max / 2, max / 2).is_ok());
}

/// A store of blocks the tier holds already writes nothing, and logs
/// nothing for the lookups: without a budget it logged them "stored" again
/// at every such store (a second report of the same blocks, and a new
/// generation for their lookups), where a budget's ledger logs none (issue
/// 41). vLLM itself hears of each job once.
#[test]
fn a_store_of_blocks_already_there_is_reported_once_and_logs_no_change() {
    use kvtier::settings::BudgetConfig;

    for budget in [false, true] {
        let mut f = fixture(4, 1);
        if budget {
            f.transfers
                .set_budget(BudgetConfig::new(1 << 20).unwrap())
                .unwrap();
        }
        f.transfers.record_changes(true);
        assert!(f.run(TransferKind::Store, 1, &[1, 2], &[0, 1]).succeeded());
        let first: Vec<_> = f.transfers.take_changes();
        assert_eq!(first, [(key(1), true), (key(2), true)], "budget: {budget}");
        // The same blocks again, and one new one.
        assert!(
            f.run(TransferKind::Store, 2, &[1, 2, 3], &[0, 1, 2])
                .succeeded()
        );
        assert!(
            f.transfers.finished().is_empty(),
            "each job is reported once"
        );
        assert_eq!(
            f.transfers.take_changes(),
            [(key(3), true)],
            "only the block written is a change (budget: {budget})"
        );
    }
}
