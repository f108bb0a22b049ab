//! loom models of budgets shared across processes (reconciles with a
//! listing of the shared directory; `capacity/reconcile.rs`): a store
//! thread evicting and writing while a reconcile lists the same files one
//! at a time, every interleaving up to the preemption bound. See
//! `kvtier_models::shared_dir`.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_shared_dir -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5`, or `KVTIER_LOOM_EXHAUSTIVE=1`.
#![cfg(kvtier_loom)]

use kvtier_models::checkers::explore;
use kvtier_models::shared_dir::{Dir, Process};
use loom::thread;

/// One process, a budget of one block holding block 0: its store of 1
/// (evicting 0) and of 2 (evicting 1) race its own reconcile. The listing
/// may miss a block committed after it began (it must not be forgotten) and
/// may see a block deleted after it began (it must not be adopted): the
/// books end equal to the files.
#[test]
fn a_reconcile_racing_its_own_stores_keeps_the_books_equal_to_the_files() {
    explore("a_reconcile_racing_its_own_stores", || {
        let dir = Dir::new(3);
        let seed = Process::open(&dir, 3);
        seed.store(0);
        let process = Process::open(&dir, 1);
        let store = {
            let process = process.clone();
            thread::spawn(move || {
                process.store(1);
                process.store(2);
            })
        };
        process.reconcile();
        store.join().unwrap();
        process.check_exact();
    });
}

/// Two processes with a budget of two blocks each write disjoint blocks
/// while one of them reconciles: every file stays counted by someone, and a
/// reconcile once both are done brings the directory within one budget.
#[test]
fn two_processes_stay_counted_and_a_quiet_reconcile_ends_within_one_budget() {
    explore("two_processes_stay_counted", || {
        let dir = Dir::new(4);
        let (a, b) = (Process::open(&dir, 2), Process::open(&dir, 2));
        let other = {
            let b = b.clone();
            thread::spawn(move || {
                b.store(2);
                b.store(3);
            })
        };
        a.store(0);
        a.reconcile();
        a.store(1);
        other.join().unwrap();
        dir.check_counted(&[&a, &b]);
        a.reconcile();
        assert!(
            dir.bytes() <= 2,
            "{} blocks after a quiet reconcile",
            dir.bytes()
        );
        dir.check_counted(&[&a, &b]);
    });
}
