//! A bounded fs tier killed (SIGKILL) during 32 concurrent writes, then
//! opened again: no partial block under a block's name, every block left
//! loads intact, the dead writer's temporary files are swept, and the books
//! match the files, within the budget.
#![cfg(all(feature = "fs", unix, not(any(kvtier_loom, kvtier_shuttle))))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvtier::settings::BudgetConfig;
use kvtier::tier::FsOptions;
use kvtier::{FsTier, StoreTask};

#[path = "common/files.rs"]
mod files;

/// The child's budget and block size: 128 blocks of 256 KiB fit.
const CAPACITY: u64 = 128 * ((256 << 10) + 16);
const PAYLOAD: usize = 256 << 10;
const WRITERS: usize = 32;

/// The paths of the files below `dir` whose names end in `suffix`.
fn paths(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    files::files(dir, suffix)
        .into_iter()
        .map(|(path, _)| path)
        .collect()
}

/// The writer the test kills: 32 saves in flight at all times, for ever.
/// Run by the test below in a child process (ignored otherwise).
#[test]
#[ignore = "the child process of the crash test"]
fn crash_child_writes_for_ever() {
    let root = std::env::var("KVTIER_CRASH_ROOT").expect("run by the crash test");
    let options = FsOptions::default()
        .budget(Some(
            BudgetConfig::new(CAPACITY)
                .unwrap()
                .with_stale_temp_age(Some(Duration::from_secs(3600)))
                .unwrap(),
        ))
        .io_threads(WRITERS)
        // Each write waits for the device: 32 are in flight at any time.
        .sync_data(true);
    let tier = FsTier::open_with(&root, "ns", options).expect("open");
    let mut key = 0u64;
    loop {
        let tasks: Vec<_> = (0..WRITERS)
            .map(|_| {
                key += 1;
                tier.save(&key, vec![(key % 251) as u8; PAYLOAD])
            })
            .collect();
        for task in tasks {
            let _ = task.wait();
        }
    }
}

/// The writer process, killed (SIGKILL) and reaped when dropped: also
/// when the test fails before it means to kill it.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the writer on `root` and kills it once it has evicted and while
/// a write is half done (a temporary file exists). Returns the blocks and
/// temporary files the kill left, and the most temporary files seen at once
/// before it; none left when the writes in flight all ended between the
/// look and the kill (on a fast file system, a tmpfs, they take
/// microseconds).
fn kill_the_writer(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>, usize) {
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "crash_child_writes_for_ever",
                "--nocapture",
            ])
            .env("KVTIER_CRASH_ROOT", root)
            .spawn()
            .expect("start the writer"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_temps = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the writer never had a write half done past block 256 in 60 s"
        );
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the writer died by itself"
        );
        let temps = paths(root, ".tmp").len();
        seen_temps = seen_temps.max(temps);
        // Key numbers count up: a block above 256 means about half of what
        // was written has been evicted already.
        let newest = paths(root, ".bin")
            .iter()
            .filter_map(|p| u64::from_str_radix(p.file_stem()?.to_str()?, 16).ok())
            .max();
        if temps > 0 && newest.is_some_and(|key| key > 256) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(child); // SIGKILL, then reaped
    (paths(root, ".bin"), paths(root, ".tmp"), seen_temps)
}

#[test]
fn a_tier_killed_during_32_writes_opens_clean_within_its_budget() {
    let mut attempts = 0;
    let (root, blocks, temps, seen_temps) = loop {
        attempts += 1;
        assert!(attempts <= 20, "no kill in 20 left a write half done");
        let root = tempfile::tempdir().expect("tempdir");
        let (blocks, temps, seen) = kill_the_writer(root.path());
        if !temps.is_empty() {
            break (root, blocks, temps, seen);
        }
    };

    let options = FsOptions::default().budget(Some(
        BudgetConfig::new(CAPACITY)
            .unwrap()
            .with_stale_temp_age(Some(Duration::ZERO))
            .unwrap(),
    ));
    let tier = FsTier::open_with(root.path(), "ns", options).expect("reopen");
    let report = tier.scan_report().unwrap().clone();
    assert_eq!(
        report.swept as usize,
        temps.len(),
        "every dead writer's file swept"
    );
    assert!(paths(root.path(), ".tmp").is_empty());
    let stats = tier.capacity_stats().unwrap();
    let left = paths(root.path(), ".bin");
    let on_disk: u64 = left.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert_eq!(stats.resident_bytes, on_disk);
    assert!(on_disk <= CAPACITY, "{on_disk} bytes over the budget");
    assert_eq!(left.len() as u64, report.blocks);
    // Every block left is whole: it loads (header, length and checksum).
    for path in &left {
        let hex = path.file_stem().unwrap().to_str().unwrap();
        let key = u64::from_str_radix(hex, 16).expect("a u64 key's name");
        let block = tier.load(&key).expect("intact").expect("present");
        assert_eq!(block, vec![(key % 251) as u8; PAYLOAD]);
    }
    eprintln!(
        "kill {attempts}: {} blocks and {} temporary files on disk (up to {seen_temps} seen \
         before it); reopened: {} blocks kept, {} swept",
        blocks.len(),
        temps.len(),
        report.blocks,
        report.swept
    );
}
