//! shuttle model of the capacity ledger shared by threads at sizes loom
//! cannot reach: three threads, each a random mix of reads (pin, read,
//! unpin) and stores (admit, evicting as asked, then commit, or drop the
//! write as a failed one) over six keys of random sizes, with a capacity
//! that holds only a few of them, under LRU or S3-FIFO.
//!
//! A read marks its block (a per-key reader count) while it holds the pin;
//! a deletion asserts nobody reads the block it deletes (E-b). Every thread
//! checks the budget after each admission (E-a); at the end no token is
//! held, the ledger's sums match its entries and the evictions match the
//! deletions (E-e).
//!
//! The workload is drawn from `shuttle::rand`, so a printed failing schedule
//! replays workload and interleaving together.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_capacity`
//! - `KVTIER_SHUTTLE_ITERATIONS=N`: schedules per test (default 100,000).
//! - `KVTIER_SHUTTLE_REPLAY='<schedule>'`: replays a printed failing schedule.
#![cfg(kvtier_shuttle)]

use kvtier::capacity::{Admitted, Policy, SharedLedger};
use kvtier_models::checkers::{Schedules, run_shuttle};
use shuttle::rand::{Rng, thread_rng};
use shuttle::sync::Arc;
use shuttle::sync::atomic::{AtomicUsize, Ordering};
use shuttle::thread;

const KEYS: usize = 6;
const CAPACITY: u64 = 10;
const THREADS: usize = 3;
const OPS: usize = 6;

struct Disk {
    readers: Vec<AtomicUsize>,
    deletions: AtomicUsize,
}

fn worker(ledger: SharedLedger<usize>, disk: Arc<Disk>) {
    let mut rng = thread_rng();
    for _ in 0..OPS {
        let key = rng.gen_range(0..KEYS);
        if rng.gen_bool(0.4) {
            if let Some(pin) = ledger.pin(&key) {
                disk.readers[key].fetch_add(1, Ordering::SeqCst);
                thread::yield_now();
                disk.readers[key].fetch_sub(1, Ordering::SeqCst);
                drop(pin);
            }
            continue;
        }
        let bytes = rng.gen_range(1..=4);
        let admitted = ledger.admit(key, bytes, |victim| {
            assert_eq!(
                disk.readers[*victim].load(Ordering::SeqCst),
                0,
                "block {victim} deleted under a read"
            );
            disk.deletions.fetch_add(1, Ordering::SeqCst);
            true
        });
        let stats = ledger.stats();
        assert!(
            stats.resident_bytes + stats.reserved_bytes <= CAPACITY,
            "over budget: {stats:?}"
        );
        if let Ok(Admitted::Write(write)) = admitted {
            thread::yield_now();
            if rng.gen_bool(0.2) {
                drop(write); // the write failed
            } else {
                write.commit();
            }
        }
    }
}

fn scenario(policy: Policy) {
    let ledger = SharedLedger::new(CAPACITY, policy);
    let disk = Arc::new(Disk {
        readers: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
        deletions: AtomicUsize::new(0),
    });
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (ledger, disk) = (ledger.clone(), disk.clone());
            thread::spawn(move || worker(ledger, disk))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
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
    assert_eq!(
        stats.evictions as usize,
        disk.deletions.load(Ordering::SeqCst)
    );
}

#[test]
fn threads_reading_and_storing_keep_the_budget_lru() {
    run_shuttle("capacity, LRU", || scenario(Policy::Lru), Schedules::Random);
}

#[test]
fn threads_reading_and_storing_keep_the_budget_s3fifo() {
    run_shuttle(
        "capacity, S3-FIFO",
        || scenario(Policy::S3Fifo),
        Schedules::Pct,
    );
}
