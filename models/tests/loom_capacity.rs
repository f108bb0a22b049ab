//! loom models of the capacity ledger shared by threads
//! ([`kvtier::capacity::SharedLedger`]): reads that pin, stores that evict
//! and write, every interleaving up to the preemption bound.
//!
//! Each block's file is a `loom::cell::UnsafeCell`: a read reads it while
//! its pin is held, a store's deletion of a victim writes it (as deleting
//! and rewriting a file does). If the ledger ever chose a pinned block as a
//! victim (E-b), the read and the deletion would not be ordered and loom
//! would report the race. Each model also checks the budget from every
//! thread after its admission (E-a), that each victim is deleted once, and
//! at the end the ledger's sums (`audit`) and that no token is left held
//! (E-e).
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_capacity -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5`, or `KVTIER_LOOM_EXHAUSTIVE=1`.
#![cfg(kvtier_loom)]

use kvtier::capacity::{Admitted, Policy, SharedLedger};
use kvtier_models::checkers::explore;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Blocks of one byte each; the capacity holds two.
const CAPACITY: u64 = 2;

/// The block files, by key, and how often each was deleted.
struct Disk {
    files: Vec<UnsafeCell<u64>>,
    deletions: Vec<AtomicUsize>,
}

impl Disk {
    fn new(keys: usize) -> Arc<Self> {
        Arc::new(Self {
            files: (0..keys).map(|_| UnsafeCell::new(0)).collect(),
            deletions: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    fn read(&self, key: usize) -> u64 {
        // SAFETY: loom checks this read against every deletion (a write)
        // for a happens-before edge; that check is the model's point.
        self.files[key].with(|p| unsafe { *p })
    }

    fn delete(&self, key: usize) -> bool {
        // SAFETY: as in `read`.
        self.files[key].with_mut(|p| unsafe { *p += 1 });
        self.deletions[key].fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// A ledger holding blocks 0 and 1 (0 the least recently used).
fn full_ledger(policy: Policy) -> SharedLedger<usize> {
    let ledger = SharedLedger::new(CAPACITY, policy);
    for key in 0..2 {
        let Ok(Admitted::Write(write)) = ledger.admit(key, 1, |_| unreachable!("room for both"))
        else {
            panic!("block {key} was not admitted");
        };
        write.commit();
    }
    ledger
}

fn store(ledger: &SharedLedger<usize>, disk: &Disk, key: usize) {
    let admitted = ledger.admit(key, 1, |victim| disk.delete(*victim));
    let stats = ledger.stats();
    assert!(
        stats.resident_bytes + stats.reserved_bytes <= CAPACITY,
        "over budget: {stats:?}"
    );
    if let Ok(Admitted::Write(write)) = admitted {
        write.commit();
    }
}

fn read(ledger: &SharedLedger<usize>, disk: &Disk, key: usize) {
    if let Some(pin) = ledger.pin(&key) {
        disk.read(key);
        drop(pin);
    }
}

fn settle(ledger: &SharedLedger<usize>, disk: &Disk) {
    ledger
        .with(|l| l.audit())
        .expect("the ledger's sums match its entries");
    let stats = ledger.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.pinned_entries),
        (0, 0),
        "a token left held: {stats:?}"
    );
    assert!(stats.resident_bytes <= CAPACITY);
    for (key, deletions) in disk.deletions.iter().enumerate() {
        assert!(
            deletions.load(Ordering::Relaxed) <= 1,
            "block {key} deleted twice"
        );
    }
    assert_eq!(
        stats.evictions as usize,
        disk.deletions
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .sum::<usize>()
    );
}

/// A read of the least recently used block races a store that needs its
/// room: the store evicts the other block, or the read misses.
fn a_read_and_an_eviction(policy: Policy) {
    let ledger = full_ledger(policy);
    let disk = Disk::new(3);
    let (l, d) = (ledger.clone(), disk.clone());
    let reader = thread::spawn(move || read(&l, &d, 0));
    store(&ledger, &disk, 2);
    reader.join().unwrap();
    settle(&ledger, &disk);
}

#[test]
fn a_pinned_block_is_never_deleted_under_its_read_lru() {
    explore("capacity: read vs eviction, LRU", || {
        a_read_and_an_eviction(Policy::Lru)
    });
}

#[test]
fn a_pinned_block_is_never_deleted_under_its_read_s3fifo() {
    explore("capacity: read vs eviction, S3-FIFO", || {
        a_read_and_an_eviction(Policy::S3Fifo)
    });
}

/// Three threads: two reads (one of each resident block) and a store that
/// needs room; with both pinned it gets none and nothing is deleted.
#[test]
fn two_reads_and_a_store_keep_the_budget_and_their_blocks() {
    explore("capacity: two reads and a store", || {
        let ledger = full_ledger(Policy::Lru);
        let disk = Disk::new(3);
        let readers: Vec<_> = (0..2)
            .map(|key| {
                let (l, d) = (ledger.clone(), disk.clone());
                thread::spawn(move || read(&l, &d, key))
            })
            .collect();
        store(&ledger, &disk, 2);
        for reader in readers {
            reader.join().unwrap();
        }
        settle(&ledger, &disk);
    });
}

/// Two stores compete for the room of the same two blocks: each victim is
/// deleted once, and the budget holds after each admission.
#[test]
fn two_stores_competing_for_room_delete_each_victim_once() {
    explore("capacity: two stores compete", || {
        let ledger = full_ledger(Policy::Lru);
        let disk = Disk::new(4);
        let (l, d) = (ledger.clone(), disk.clone());
        let other = thread::spawn(move || store(&l, &d, 3));
        store(&ledger, &disk, 2);
        other.join().unwrap();
        settle(&ledger, &disk);
    });
}
