//! The file-system tier on real temporary directories: layout, atomic
//! publication under concurrent save and lookup, refused writes, damaged
//! and foreign files, bad roots and namespaces, and both lookup drivers and
//! the save tracker running on it.
#![cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]

use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvtier::{
    BlockKey, FsTier, SaveScheduler, SaveTracker, StoreTask, TierError, Verdict,
    lookup::ThreadLookup, save::TaskError, tier::Corruption, tier::FsOptions,
};

fn tier() -> (tempfile::TempDir, FsTier) {
    let root = tempfile::tempdir().unwrap();
    let tier = FsTier::open(root.path(), "model-a/cfg-1/rank0").unwrap();
    (root, tier)
}

/// A payload that names its own version: `version` repeated, a length that
/// depends on it, so a mixed or partial block cannot pass for a real one.
fn payload(version: u32) -> Vec<u8> {
    let len = 64 + (version as usize * 97) % 8192;
    version
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

fn version_of(bytes: &[u8]) -> u32 {
    let version = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    assert_eq!(bytes, payload(version), "block mixes versions");
    version
}

#[test]
fn blocks_are_laid_out_by_namespace_and_key_prefix_and_round_trip() {
    let (root, tier) = tier();
    let key = [0xab_u8, 0xcd, 0xef, 0x01];
    assert_eq!(
        tier.path_of(&key),
        root.path().join("model-a/cfg-1/rank0/abc/de/abcdef01.bin")
    );
    assert!(!tier.contains(&key).unwrap());
    assert_eq!(tier.load(&key).unwrap(), None);

    let first = tier.save(&key, payload(1));
    let second = tier.save(&7u64, payload(2));
    assert_eq!(
        (first.id(), second.id()),
        (0, 1),
        "save ids count up per tier"
    );
    assert_eq!(first.location(), &tier.path_of(&key));
    first.wait().unwrap();
    second.wait().unwrap();
    assert!(tier.contains(&key).unwrap());
    assert_eq!(tier.load(&key).unwrap(), Some(payload(1)));
    assert_eq!(tier.load(&7u64).unwrap(), Some(payload(2)));

    // Overwriting publishes the new block whole.
    tier.store(&key, &payload(3)).unwrap();
    assert_eq!(tier.load(&key).unwrap(), Some(payload(3)));
    // No temporary files are left behind.
    let leftovers: Vec<_> = walk(root.path())
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn concurrent_saves_and_lookups_of_one_key_never_see_a_partial_block() {
    let (_root, tier) = tier();
    let key = 0x5eed_u64;
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u32)
        .map(|writer| {
            let tier = tier.clone();
            std::thread::spawn(move || {
                for round in 0..150u32 {
                    tier.store(&key, &payload(1 + writer + 2 * round)).unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let (tier, done) = (tier.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut absent, mut whole) = (0, 0);
            while !done.load(Ordering::Acquire) {
                let exists = tier.contains(&key).unwrap();
                match tier.load(&key).unwrap() {
                    None => {
                        assert!(
                            !exists || whole == 0,
                            "a block vanished after it was published"
                        );
                        absent += 1;
                    }
                    Some(bytes) => {
                        version_of(&bytes);
                        whole += 1;
                    }
                }
            }
            (absent, whole)
        })
    };
    for writer in writers {
        writer.join().unwrap();
    }
    done.store(true, Ordering::Release);
    let (_absent, whole) = reader.join().unwrap();
    assert!(whole > 0, "the reader never saw a block");
    let last = version_of(&tier.load(&key).unwrap().unwrap());
    assert!(
        last == 299 || last == 300,
        "the last write wins, got {last}"
    );
}

#[test]
fn a_write_the_file_system_refuses_fails_the_task_and_publishes_nothing() {
    let (_root, tier) = tier();
    // The shard directory's name is taken by a regular file: the block's
    // directory cannot be created (the kernel refuses with ENOTDIR/EEXIST,
    // whatever the privileges of the test's user).
    let key = 0x00ab_cdef_u64;
    let shard = tier
        .path_of(&key)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    fs::create_dir_all(shard.parent().unwrap()).unwrap();
    fs::write(&shard, b"in the way").unwrap();
    let task = tier.save(&key, payload(1));
    match task.wait() {
        Err(TaskError::Failed(error)) => {
            let error = error.downcast::<TierError>().expect("a tier error");
            assert!(
                matches!(*error, TierError::Io { op: "create", .. }),
                "{error}"
            );
        }
        other => panic!("expected a failed save, got {other:?}"),
    }
    assert!(!tier.contains(&key).unwrap());

    // The final name is taken by a directory: the rename fails, and the
    // temporary file is removed again.
    let key = 0xfedc_ba98_7654_3210_u64;
    let path = tier.path_of(&key);
    fs::create_dir_all(&path).unwrap();
    let error = tier.store(&key, &payload(2)).unwrap_err();
    assert!(
        matches!(error, TierError::Io { op: "write", .. }),
        "{error}"
    );
    let siblings: Vec<_> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(
        siblings.len(),
        1,
        "temporary file left behind: {siblings:?}"
    );
}

#[test]
fn truncated_foreign_and_damaged_files_are_found_but_refuse_to_load() {
    let (_root, tier) = tier();
    tier.store(&1u64, &payload(1)).unwrap();
    let path = tier.path_of(&1u64);
    let full = fs::read(&path).unwrap();
    fs::write(&path, &full[..full.len() - 10]).unwrap();
    // Lookup is "the file exists": a damaged block is a hit until the
    // load fails and the scheduler marks it a miss.
    assert!(tier.contains(&1u64).unwrap());
    match tier.load(&1u64) {
        Err(TierError::Corrupt {
            kind: Corruption::Truncated { .. },
            location,
        }) => assert!(location.ends_with(".bin")),
        other => panic!("expected a truncated block, got {other:?}"),
    }

    fs::create_dir_all(tier.path_of(&2u64).parent().unwrap()).unwrap();
    fs::write(tier.path_of(&2u64), b"{\"not\": \"a block\"}").unwrap();
    assert!(matches!(
        tier.load(&2u64),
        Err(TierError::Corrupt {
            kind: Corruption::Foreign,
            ..
        })
    ));

    tier.store(&3u64, &payload(3)).unwrap();
    let mut bytes = fs::read(tier.path_of(&3u64)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(tier.path_of(&3u64), bytes).unwrap();
    assert!(matches!(
        tier.load(&3u64),
        Err(TierError::Corrupt {
            kind: Corruption::Checksum,
            ..
        })
    ));
}

#[test]
fn a_missing_root_a_file_as_root_and_bad_namespaces_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("not-there");
    assert!(matches!(
        FsTier::open(&missing, "ns"),
        Err(TierError::MissingRoot(path)) if path == missing
    ));
    assert!(!missing.exists(), "open must not create the root");
    let file = root.path().join("file");
    fs::write(&file, b"").unwrap();
    assert!(matches!(
        FsTier::open(&file, "ns"),
        Err(TierError::MissingRoot(_))
    ));
    for namespace in ["", "../escape", "a//b", "/abs"] {
        let error = FsTier::open(root.path(), namespace).unwrap_err();
        assert!(
            matches!(error, TierError::Namespace(_)),
            "{namespace:?}: {error}"
        );
    }
    let options = FsOptions::default().io_threads(0);
    assert!(matches!(
        FsTier::open_with(root.path(), "ns", options),
        Err(TierError::Config(_))
    ));
}

#[test]
fn dropping_the_tier_finishes_every_queued_save() {
    let root = tempfile::tempdir().unwrap();
    let tier = FsTier::open_with(
        root.path(),
        "ns",
        FsOptions::default().io_threads(1).sync_data(true),
    )
    .unwrap();
    let tasks: Vec<_> = (0..64u64)
        .map(|key| tier.save(&key, payload(key as u32)))
        .collect();
    let reopened = FsTier::open(root.path(), "ns").unwrap();
    drop(tier);
    for task in tasks {
        task.wait().unwrap();
    }
    for key in 0..64u64 {
        assert_eq!(reopened.load(&key).unwrap(), Some(payload(key as u32)));
    }
}

#[test]
fn the_save_tracker_frees_a_request_only_after_its_fs_saves_are_published() {
    let (_root, tier) = tier();
    let mut scheduler = SaveScheduler::new();
    let mut worker: SaveTracker<String, kvtier::tier::FsSaveTask> = SaveTracker::new();
    let request = "req-1".to_string();
    let step = scheduler.record_step([(request.clone(), 2)]);
    worker.begin_step(&step).expect("steps in sequence");
    for key in [10u64, 11] {
        worker.submit(
            tier.save(&key, payload(key as u32)),
            std::slice::from_ref(&request),
        );
    }
    assert!(
        scheduler.request_finished(&request),
        "saves pending: free later"
    );
    let mut reported = Vec::new();
    for _ in 0..10_000 {
        reported = worker.get_finished(std::slice::from_ref(&request));
        if !reported.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(reported, [request]);
    // Reported means published: both blocks are there, whole.
    for key in [10u64, 11] {
        assert_eq!(tier.load(&key).unwrap(), Some(payload(key as u32)));
    }
    assert_eq!(worker.stats().task_failures, 0);
}

#[test]
fn the_thread_driver_looks_blocks_up_on_disk_and_a_failed_load_becomes_a_miss() {
    let (_root, tier) = tier();
    tier.store(&1u64, &payload(1)).unwrap();
    tier.store(&2u64, &payload(2)).unwrap();
    // Block 2 is damaged after it was published.
    fs::write(tier.path_of(&2u64), b"garbage").unwrap();
    let mut lookup = ThreadLookup::threaded(tier.clone()).unwrap();
    let request = "req".to_string();
    for key in [1u64, 2, 3] {
        assert_eq!(lookup.lookup(&key, &request), Verdict::Pending);
    }
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&1, &request).is_hit());
    assert!(lookup.lookup(&3, &request).is_miss());
    let Verdict::Hit(ticket) = lookup.lookup(&2, &request) else {
        panic!("a file that exists is a hit")
    };
    assert!(tier.load(ticket.key()).is_err());
    assert!(lookup.mark_miss(&ticket));
    assert!(lookup.lookup(&2, &request).is_miss());
    lookup.shutdown().unwrap();
}

#[cfg(feature = "tokio")]
#[test]
fn the_tokio_driver_looks_blocks_up_on_disk() {
    use kvtier::{lookup::TokioConfig, lookup::TokioLookup};

    let (_root, tier) = tier();
    let keys: Vec<u64> = (0..40).collect();
    for key in keys.iter().filter(|key| *key % 3 == 0) {
        tier.store(key, &payload(*key as u32)).unwrap();
    }
    let mut lookup = TokioLookup::tokio(tier, TokioConfig::default()).unwrap();
    for (i, key) in keys.iter().enumerate() {
        lookup.lookup(key, &format!("req-{}", i % 4));
    }
    assert_eq!(lookup.flush().unwrap(), keys.len());
    lookup.wait_idle().unwrap();
    for (i, key) in keys.iter().enumerate() {
        let verdict = lookup.lookup(key, &format!("req-{}", i % 4));
        assert_eq!(verdict.is_hit(), key % 3 == 0, "key {key}");
    }
    assert_eq!(lookup.stats().groups_applied, 4);
    lookup.shutdown().unwrap();
}

#[test]
fn keys_name_blocks_in_lowercase_hex() {
    assert_eq!(255u64.hex(), "00000000000000ff");
    assert_eq!(vec![0u8, 1].hex(), "0001");
}

/// The test tier's namespace under `root`, opened to follow symlinks.
fn following_links(root: &std::path::Path) -> FsTier {
    let options = FsOptions::default().follow_symlinks(true);
    FsTier::open_with(root, "model-a/cfg-1/rank0", options).unwrap()
}

/// Runs `test` on a thread and fails if it has not finished after 60 s (a
/// load that blocks on a FIFO would hang the test instead of failing it).
fn within_a_minute(test: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        test();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => worker.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for 60 s"),
    }
}

#[test]
fn a_load_is_bounded_whatever_the_block_path_holds() {
    within_a_minute(|| {
        let (root, tier) = tier();
        let key = 7u64;
        let path = tier.path_of(&key);
        tier.store(&key, b"small").unwrap();

        // A header promising 1 GiB, on a (sparse) file that big: refused by
        // the limit before anything is read.
        let mut header = fs::read(&path).unwrap()[..16].to_vec();
        header[4..12].copy_from_slice(&(1u64 << 30).to_le_bytes());
        let file = fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, &header).unwrap();
        file.set_len(16 + (1 << 30)).unwrap();
        match tier.load(&key) {
            Err(TierError::Corrupt {
                kind: Corruption::TooLarge { length, limit },
                ..
            }) => assert_eq!((length, limit), (1 << 30, 256 << 20)),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // A small header on a 1 GiB file: the size disagrees, nothing read.
        tier.store(&key, b"small").unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert!(matches!(
            tier.load(&key),
            Err(TierError::Corrupt {
                kind: Corruption::Trailing { .. },
                ..
            })
        ));

        // A link to /dev/zero: not followed; followed, a device is refused.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert!(!tier.contains(&key).unwrap(), "a link is not a block");
        assert!(matches!(
            tier.load(&key),
            Err(TierError::NotABlock {
                what: "a symbolic link",
                ..
            })
        ));
        let following = following_links(root.path());
        assert!(matches!(
            following.load(&key),
            Err(TierError::NotABlock {
                what: "a device",
                ..
            })
        ));

        // A FIFO: refused at once, never waited on.
        fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(!tier.contains(&key).unwrap());
        assert!(matches!(
            tier.load(&key),
            Err(TierError::NotABlock { what: "a FIFO", .. })
        ));

        assert!(
            FsTier::open_with(root.path(), "x", FsOptions::default().max_block_bytes(0)).is_err()
        );
        let capped = FsTier::open_with(
            root.path(),
            "capped",
            FsOptions::default().max_block_bytes(4),
        )
        .unwrap();
        assert!(matches!(
            capped.store(&1u64, b"12345"),
            Err(TierError::Config(_))
        ));
        capped.store(&1u64, b"1234").unwrap();
    });
}

/// Every key below `keys` holds one whole version, and no temporary file
/// is left in the tier's directory.
fn assert_whole_blocks_and_no_strays(tier: &FsTier, keys: u64) {
    for key in 0..keys {
        let block = tier.load(&key).unwrap().expect("stored");
        assert_eq!(block, payload(version_of(&block)));
    }
    let dir = tier.root().join(tier.namespace());
    let strays: Vec<_> = walk(&dir)
        .into_iter()
        .filter(|path| path.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
}

#[test]
fn two_tiers_on_one_directory_never_share_a_temporary_file() {
    let root = tempfile::tempdir().unwrap();
    let first = FsTier::open(root.path(), "shared").unwrap();
    let second = FsTier::open(root.path(), "shared").unwrap();
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|tier| {
            let failures = failures.clone();
            std::thread::spawn(move || {
                for round in 0..1000u32 {
                    if tier.store(&u64::from(round % 50), &payload(round)).is_err() {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0, "saves failed");
    assert_whole_blocks_and_no_strays(&first, 50);
}

#[test]
fn stray_temporary_files_are_swept_once_old_and_nothing_else_is() {
    let (_root, tier) = tier();
    tier.store(&1u64, b"kept").unwrap();
    let block = tier.path_of(&1u64);
    let name = block.file_name().unwrap().to_string_lossy().into_owned();
    let stray = |suffix: &str, age: Duration| {
        let path = block.with_file_name(format!("{name}.{suffix}.tmp"));
        let file = fs::File::create(&path).unwrap();
        file.set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        path
    };
    let old = stray("0123456789abcdef", Duration::from_secs(7200));
    let old_style = stray("4242-7", Duration::from_secs(7200));
    let young = stray("fedcba9876543210", Duration::from_secs(1));
    let unrelated = block.with_file_name("notes.tmp");
    fs::write(&unrelated, b"not ours").unwrap();

    assert_eq!(tier.sweep_temp(Duration::from_secs(3600)).unwrap(), 2);
    assert!(!old.exists() && !old_style.exists());
    assert!(young.exists(), "a live writer's file is left alone");
    assert!(unrelated.exists(), "only temporary block names are touched");
    assert_eq!(tier.load(&1u64).unwrap().as_deref(), Some(&b"kept"[..]));
    assert_eq!(tier.sweep_temp(Duration::from_secs(3600)).unwrap(), 0);
}

#[test]
fn symlinks_below_the_root_are_not_followed_by_default() {
    let (root, tier) = tier();
    let outside = tempfile::tempdir().unwrap();
    // A block elsewhere, valid, linked in at a key's path.
    let elsewhere = FsTier::open(outside.path(), "other").unwrap();
    elsewhere.store(&5u64, b"outside").unwrap();
    let path = tier.path_of(&5u64);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(elsewhere.path_of(&5u64), &path).unwrap();
    assert!(!tier.contains(&5u64).unwrap());
    assert!(matches!(tier.load(&5u64), Err(TierError::NotABlock { .. })));

    // A shard directory linked outside: nothing is written through it.
    let victim = outside.path().join("victim");
    fs::create_dir(&victim).unwrap();
    let key = 0xabcd_ef00_0000_0000_u64; // shard abc/de, apart from key 5's
    let shard = tier.path_of(&key);
    let top = shard.parent().unwrap().parent().unwrap().to_path_buf();
    fs::create_dir_all(&top).unwrap();
    std::os::unix::fs::symlink(&victim, shard.parent().unwrap()).unwrap();
    assert!(matches!(
        tier.store(&key, b"escape"),
        Err(TierError::NotABlock { .. })
    ));
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 0, "nothing escaped");
    // A top-level shard linked outside: not even a directory is made there.
    let key = 0x1234_5600_0000_0000_u64; // shard 123/45
    let top = tier
        .path_of(&key)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    std::os::unix::fs::symlink(&victim, &top).unwrap();
    assert!(matches!(
        tier.store(&key, b"escape"),
        Err(TierError::NotABlock { .. })
    ));
    assert_eq!(
        fs::read_dir(&victim).unwrap().count(),
        0,
        "no directory made outside"
    );

    // A namespace component linked elsewhere is refused at open.
    std::os::unix::fs::symlink(outside.path(), root.path().join("linked")).unwrap();
    assert!(matches!(
        FsTier::open(root.path(), "linked/ns"),
        Err(TierError::NotABlock { .. })
    ));

    // Following links is a choice the options make.
    let following = following_links(root.path());
    assert!(following.contains(&5u64).unwrap());
    assert_eq!(
        following.load(&5u64).unwrap().as_deref(),
        Some(&b"outside"[..])
    );
}

#[test]
fn a_key_too_long_for_a_file_name_affects_only_itself() {
    let (_root, mut tier) = tier();
    // One shard directory for all three (a missing directory would hide a
    // too-long name behind "not found").
    let fits = vec![0xab_u8; 115];
    let too_long = vec![0xab_u8; 116];
    let far_too_long = vec![0xab_u8; 126];
    tier.store(&fits, b"longest").unwrap();
    assert_eq!(tier.load(&fits).unwrap().as_deref(), Some(&b"longest"[..]));
    for key in [&too_long, &far_too_long] {
        assert!(matches!(
            tier.store(key, b"x"),
            Err(TierError::KeyTooLong { limit: 234, .. })
        ));
        assert!(!tier.contains(key).unwrap());
        assert_eq!(tier.load(key).unwrap(), None);
    }
    // In one group with a stored neighbour: the neighbour is still a hit.
    let group = vec![fits.clone(), far_too_long.clone(), too_long.clone()];
    let answers =
        kvtier::lookup::Backend::batch_lookup(&mut tier, &group, &"r".to_string()).unwrap();
    assert_eq!(answers, [true, false, false]);
    let task = tier.save(&far_too_long, b"x".to_vec());
    assert!(matches!(task.wait(), Err(TaskError::Failed(_))));
}

/// The writer half of the two-process test below: stores 3000 versions of
/// 50 keys into `KVTIER_WRITER_DIR` and exits non-zero if any store failed.
/// Run only as that test's child.
#[test]
#[ignore = "a child process of two_processes_with_the_same_pid_never_share_a_temporary_file"]
fn writer_process() {
    let dir = std::env::var("KVTIER_WRITER_DIR").expect("run by the two-process test");
    let tier = FsTier::open(&dir, "shared").unwrap();
    println!("writer pid={}", std::process::id());
    // Both writers start together, so their saves overlap.
    let go = std::path::Path::new(&dir).join("go");
    let waiting = std::time::Instant::now();
    while !go.exists() {
        assert!(
            waiting.elapsed() < std::time::Duration::from_secs(60),
            "never told to go"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut failed = 0;
    for round in 0..3000u32 {
        if let Err(error) = tier.store(&u64::from(round % 50), &payload(round)) {
            failed += 1;
            eprintln!("store failed: {error}");
        }
    }
    assert_eq!(failed, 0, "{failed} of 3000 stores failed");
}

/// Two processes with the same PID (each PID 1 of its own PID namespace, as
/// two containers on one NFS export are) save the same keys into one
/// directory at once: no save fails and no temporary file is left. Without
/// `unshare` the two processes have distinct PIDs, which still checks two
/// processes, and the test says so.
#[test]
fn two_processes_with_the_same_pid_never_share_a_temporary_file() {
    let root = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let namespaced = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status()
        .is_ok_and(|status| status.success());
    let spawn = || {
        let mut command = if namespaced {
            let mut command = std::process::Command::new("unshare");
            command.args(["--pid", "--fork"]).arg(&exe);
            command
        } else {
            std::process::Command::new(&exe)
        };
        command
            .args(["--ignored", "--exact", "writer_process", "--nocapture"])
            .env("KVTIER_WRITER_DIR", root.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let writers = [spawn(), spawn()];
    // Give both a moment to open the tier, then start them at once.
    std::thread::sleep(Duration::from_millis(300));
    fs::write(root.path().join("go"), b"").unwrap();
    let mut pids = Vec::new();
    for writer in writers {
        let output = writer.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        pids.extend(
            stdout
                .lines()
                .filter_map(|line| line.strip_prefix("writer pid="))
                .map(str::to_owned),
        );
    }
    assert_eq!(pids.len(), 2, "both writers ran");
    if namespaced {
        assert_eq!(pids, ["1", "1"], "each writer is PID 1 of its namespace");
    } else {
        println!("unshare is not available: two processes with distinct PIDs were checked");
    }
    assert_whole_blocks_and_no_strays(&FsTier::open(root.path(), "shared").unwrap(), 50);
}
