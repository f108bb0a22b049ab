//! Processes sharing one directory, each with its own budget, reconciling
//! with listings of it: the loom and shuttle models of the cross-process
//! capacity protocol (tests/loom_shared_dir.rs, tests/shuttle_shared_dir.rs;
//! `capacity/reconcile.rs`).
//!
//! Each process is the real [`SharedLedger`] over the same "directory" of
//! one-byte block files (a lock per file, so a listing reads them one by
//! one while others write, as `readdir` does). A store gets room (its
//! victims' files removed, each reported after its removal), creates its
//! file, then commits, as `DirBudget::store` does. A reconcile begins its
//! listing, reads the files one at a time, reconciles and deletes its
//! victims, as `DirBudget::reconcile` does.
//!
//! The properties (see [`Dir::check_counted`] and [`Process::check_exact`]):
//! - every file on disk is counted by some process (a reconcile never
//!   forgets a block that is still there and that no one else counts), so
//!   the processes' books bound the directory;
//! - one process alone ends with its books equal to its files however its
//!   reconciles and stores interleave (nothing forgotten or adopted by
//!   mistake);
//! - after a reconcile with no writer running, the directory is within
//!   that process's capacity.

use std::collections::BTreeSet;

use kvtier::capacity::{Admitted, Policy, SharedLedger};

#[cfg(kvtier_loom)]
use loom::sync::{Arc, Mutex};
#[cfg(all(kvtier_shuttle, not(kvtier_loom)))]
use shuttle::sync::{Arc, Mutex};

/// A directory of one-byte block files `0..keys`, one lock per file.
#[derive(Clone)]
pub struct Dir {
    files: Arc<Vec<Mutex<bool>>>,
}

impl Dir {
    /// An empty directory of `keys` possible blocks.
    pub fn new(keys: u64) -> Self {
        Self {
            files: Arc::new((0..keys).map(|_| Mutex::new(false)).collect()),
        }
    }

    fn set(&self, key: u64, present: bool) {
        *self.files[key as usize].lock().unwrap() = present;
    }

    /// The blocks whose files exist (read one at a time).
    pub fn listing(&self) -> Vec<u64> {
        (0..self.files.len() as u64)
            .filter(|&key| *self.files[key as usize].lock().unwrap())
            .collect()
    }

    /// Bytes on disk.
    pub fn bytes(&self) -> u64 {
        self.listing().len() as u64
    }

    /// Every file is counted by at least one of `processes`, and each one's
    /// books are consistent.
    pub fn check_counted(&self, processes: &[&Process]) {
        for process in processes {
            process.ledger.with(|ledger| ledger.audit()).expect("audit");
        }
        for key in self.listing() {
            let counted = processes
                .iter()
                .any(|process| process.ledger.with(|ledger| ledger.is_resident(&key)));
            assert!(counted, "block {key} is on disk and no process counts it");
        }
    }
}

/// One process: its budget over the shared directory.
#[derive(Clone)]
pub struct Process {
    /// The process's books.
    pub ledger: SharedLedger<u64>,
    dir: Dir,
}

impl Process {
    /// A process with a budget of `capacity` blocks, its books seeded with
    /// what the directory holds now (its startup scan).
    pub fn open(dir: &Dir, capacity: u64) -> Self {
        let (ledger, victims) = SharedLedger::seeded(
            capacity,
            Policy::Lru,
            dir.listing().into_iter().map(|k| (k, 1)),
        );
        let process = Self {
            ledger,
            dir: dir.clone(),
        };
        process.delete(victims);
        process
    }

    fn delete(&self, victims: Vec<kvtier::capacity::Victim<u64>>) -> usize {
        self.ledger.delete_victims(victims, |&victim| {
            self.dir.set(victim, false);
            true
        })
    }

    /// Stores block `key`: room first, then the file, then the commit.
    pub fn store(&self, key: u64) {
        let admitted = self.ledger.admit(key, 1, |&victim| {
            self.dir.set(victim, false);
            true
        });
        if let Ok(Admitted::Write(write)) = admitted {
            self.dir.set(key, true);
            write.commit();
        }
    }

    /// Lists the directory and reconciles the books with it; deletes the
    /// victims.
    pub fn reconcile(&self) {
        let listing = self.ledger.with(|ledger| ledger.begin_listing());
        let listed = self.dir.listing();
        let done = self
            .ledger
            .with(|ledger| ledger.reconcile(listing, listed.into_iter().map(|k| (k, 1))));
        self.delete(done.victims);
    }

    /// The books count exactly the files on disk (one process alone).
    pub fn check_exact(&self) {
        self.ledger.with(|ledger| ledger.audit()).expect("audit");
        let files: BTreeSet<u64> = self.dir.listing().into_iter().collect();
        let books: BTreeSet<u64> = (0..self.dir.files.len() as u64)
            .filter(|key| self.ledger.with(|ledger| ledger.is_resident(key)))
            .collect();
        assert_eq!(books, files, "the books against the files");
        let stats = self.ledger.stats();
        assert_eq!(stats.resident_bytes, files.len() as u64, "{stats:?}");
    }
}
