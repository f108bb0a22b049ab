//! shuttle models of budgets shared across processes at sizes loom cannot
//! reach: three processes with budgets of three blocks storing random
//! blocks of eight in one directory and reconciling at random points; and
//! one process whose reconciles race two store threads of its own. See
//! `kvtier_models::shared_dir`.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_shared_dir`
//! - `KVTIER_SHUTTLE_ITERATIONS=N`: schedules per test (default 100,000).
//! - `KVTIER_SHUTTLE_REPLAY='<schedule>'`: replays a printed failing schedule.
#![cfg(kvtier_shuttle)]

use kvtier_models::checkers::{Schedules, run_shuttle};
use kvtier_models::shared_dir::{Dir, Process};
use shuttle::rand::{Rng, thread_rng};
use shuttle::thread;

const KEYS: u64 = 8;
const CAPACITY: u64 = 3;

/// Stores (and, half the time, a reconcile after each) of random blocks.
fn work(process: &Process, rounds: usize) {
    let mut rng = thread_rng();
    for _ in 0..rounds {
        process.store(rng.gen_range(0..KEYS));
        if rng.gen_bool(0.5) {
            process.reconcile();
        }
    }
}

fn processes() {
    let dir = Dir::new(KEYS);
    let all: Vec<Process> = (0..3).map(|_| Process::open(&dir, CAPACITY)).collect();
    let threads: Vec<_> = all
        .iter()
        .map(|process| {
            let process = process.clone();
            thread::spawn(move || work(&process, 4))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let refs: Vec<&Process> = all.iter().collect();
    dir.check_counted(&refs);
    all[0].reconcile();
    assert!(
        dir.bytes() <= CAPACITY,
        "{} blocks after a quiet reconcile",
        dir.bytes()
    );
    dir.check_counted(&refs);
}

fn one_process() {
    let dir = Dir::new(KEYS);
    let process = Process::open(&dir, CAPACITY);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let process = process.clone();
            thread::spawn(move || work(&process, 3))
        })
        .collect();
    for _ in 0..3 {
        process.reconcile();
    }
    for thread in threads {
        thread.join().unwrap();
    }
    process.check_exact();
}

#[test]
fn three_processes_stay_counted_and_a_quiet_reconcile_ends_within_one_budget() {
    run_shuttle("three_processes", processes, Schedules::Random);
}

#[test]
fn a_process_reconciling_while_its_threads_store_keeps_exact_books() {
    run_shuttle("one_process", one_process, Schedules::Random);
}
