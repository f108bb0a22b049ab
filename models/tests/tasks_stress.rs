//! The concurrent-group driver on a real tokio runtime (real threads, real
//! timers), under the same oracle as its shuttle models: random workloads,
//! each checked call by call against the specification with groups applied
//! in whatever order they finish.
//!
//! Runs: `KVTIER_STRESS_RUNS` (default 40 in debug builds, 400 in release).
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

use kvtier_models::checked_tasks::{TasksSetup, random_acts, workload};

fn runs() -> u64 {
    std::env::var("KVTIER_STRESS_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 40 } else { 400 })
}

/// xorshift64*: a small seeded generator, so a failing run can be replayed
/// from the seed it prints.
fn generator(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move |n| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn stress(name: &str, setup: impl Fn(&mut dyn FnMut(u64) -> u64) -> TasksSetup) {
    let mut totals = [0u64; 3];
    for seed in 0..runs() {
        let mut rand = generator(seed);
        let setup = setup(&mut rand);
        // Each run on its own thread under a watchdog: a driver that hangs
        // (a shutdown waiting on a hung call, say) fails the test with its
        // seed instead of stalling it.
        let (done, finished) = std::sync::mpsc::channel();
        let run_setup = setup.clone();
        let run = std::thread::spawn(move || {
            let observed = workload(&mut rand, run_setup);
            let _ = done.send(());
            observed
        });
        match finished.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("{name}: seed {seed} hung for 60 s with {setup:?}")
            }
        }
        match run.join() {
            Ok(observed) => {
                totals[0] += observed.overtaken;
                totals[1] += observed.stats.timeouts;
                totals[2] += observed.stats.cancelled;
            }
            Err(panic) => {
                eprintln!("{name}: seed {seed} failed with {setup:?}");
                std::panic::resume_unwind(panic);
            }
        }
    }
    println!(
        "{name}: {} runs, groups overtaken {}, timed out {}, cancelled {}",
        runs(),
        totals[0],
        totals[1],
        totals[2]
    );
}

#[test]
fn concurrent_groups_on_tokio_agree_with_the_specification() {
    stress("concurrent", |rand| TasksSetup {
        acts: random_acts(rand, 8, true),
        max_concurrent_groups: 2 + rand(3) as usize,
        timeout: true,
        cancel_at_shutdown: false,
    });
}

#[test]
fn one_slot_on_tokio_is_fifo() {
    stress("one slot", |rand| TasksSetup {
        acts: random_acts(rand, 8, true),
        max_concurrent_groups: 1,
        timeout: true,
        cancel_at_shutdown: false,
    });
}

#[test]
fn shutdown_on_tokio_cancels_hung_groups() {
    stress("cancelling", |rand| TasksSetup {
        acts: random_acts(rand, 8, true),
        max_concurrent_groups: 1 + rand(3) as usize,
        timeout: false,
        cancel_at_shutdown: true,
    });
}
