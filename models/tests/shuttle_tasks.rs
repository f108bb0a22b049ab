//! shuttle models of the concurrent-group driver (`TokioLookup`, built under
//! `--cfg kvtier_shuttle` so its tasks run on shuttle's executor and its
//! timeouts are races): every call checked by
//! [`CheckedTasks`](kvtier_models::checked_tasks::CheckedTasks) against the
//! specification, with groups applied in whatever order they finish; at most
//! `max_concurrent_groups` backend calls at once; FIFO with one slot;
//! timeouts and cancellation at shutdown leave nothing in flight.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_shuttle" cargo test -p kvtier-models --release --test shuttle_tasks`
//! (`KVTIER_SHUTTLE_ITERATIONS`, `KVTIER_SHUTTLE_REPLAY` as in shuttle_lookup.rs).
#![cfg(kvtier_shuttle)]

use std::sync::atomic::{AtomicU64, Ordering};

use kvtier_models::checked_tasks::{Observed, TasksSetup, random_acts, workload};
use kvtier_models::checkers::{Schedules, run_shuttle};
use shuttle::rand::{Rng, thread_rng};

fn rand(n: u64) -> u64 {
    thread_rng().gen_range(0..n)
}

/// What the runs of one test exercised, summed over its schedules (plain std
/// atomics: bookkeeping outside shuttle's view). Each test demands that the
/// behaviour it is about happened, so a model that stopped reaching it fails
/// instead of passing vacuously.
#[derive(Default)]
struct Seen {
    overtaken: AtomicU64,
    timeouts: AtomicU64,
    cancelled: AtomicU64,
}

impl Seen {
    const fn new() -> Self {
        Self {
            overtaken: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    fn add(&self, observed: Observed) {
        self.overtaken
            .fetch_add(observed.overtaken, Ordering::Relaxed);
        self.timeouts
            .fetch_add(observed.stats.timeouts, Ordering::Relaxed);
        self.cancelled
            .fetch_add(observed.stats.cancelled, Ordering::Relaxed);
    }

    /// `[overtaken, timeouts, cancelled]`, printed; `None` when replaying.
    fn totals(&self, name: &str) -> Option<[u64; 3]> {
        let totals = [
            self.overtaken.load(Ordering::Relaxed),
            self.timeouts.load(Ordering::Relaxed),
            self.cancelled.load(Ordering::Relaxed),
        ];
        println!(
            "{name}: groups overtaken {}, timed out {}, cancelled {}",
            totals[0], totals[1], totals[2]
        );
        std::env::var_os("KVTIER_SHUTTLE_REPLAY")
            .is_none()
            .then_some(totals)
    }
}

static CONCURRENT: Seen = Seen::new();
static ONE_SLOT: Seen = Seen::new();
static CANCELLING: Seen = Seen::new();

/// Two or three slots, timeouts on, shutdown waits for every group: groups
/// overtake each other, slow ones may time out, hung ones always do.
fn concurrent_groups() {
    let acts = random_acts(&mut rand, 8, true);
    let slots = 2 + rand(2) as usize;
    CONCURRENT.add(workload(
        &mut rand,
        TasksSetup {
            acts,
            max_concurrent_groups: slots,
            timeout: true,
            cancel_at_shutdown: false,
        },
    ));
}

/// One slot: the same workload must see groups strictly in submission order.
fn one_slot_is_fifo() {
    let acts = random_acts(&mut rand, 8, true);
    ONE_SLOT.add(workload(
        &mut rand,
        TasksSetup {
            acts,
            max_concurrent_groups: 1,
            timeout: true,
            cancel_at_shutdown: false,
        },
    ));
}

/// No timeout, hung calls, and shutdown cancels at once: queued and running
/// groups are cancelled, each published exactly once, none left in flight.
fn shutdown_cancels_hung_groups() {
    let acts = random_acts(&mut rand, 8, true);
    let slots = 1 + rand(3) as usize;
    CANCELLING.add(workload(
        &mut rand,
        TasksSetup {
            acts,
            max_concurrent_groups: slots,
            timeout: false,
            cancel_at_shutdown: true,
        },
    ));
}

#[test]
fn concurrent_groups_agree_with_the_specification() {
    run_shuttle(
        "tasks concurrent_groups",
        concurrent_groups,
        Schedules::Random,
    );
    run_shuttle("tasks concurrent_groups", concurrent_groups, Schedules::Pct);
    if let Some([overtaken, timeouts, cancelled]) = CONCURRENT.totals("concurrent_groups") {
        assert!(overtaken > 0, "no group ever overtook another");
        assert!(timeouts > 0, "no group ever timed out");
        assert_eq!(cancelled, 0, "shutdown waits: nothing is cancelled");
    }
}

#[test]
fn one_slot_publishes_in_submission_order() {
    run_shuttle("tasks one_slot", one_slot_is_fifo, Schedules::Random);
    if let Some([overtaken, timeouts, _]) = ONE_SLOT.totals("one_slot") {
        assert_eq!(overtaken, 0, "checked per group too");
        assert!(timeouts > 0, "no group ever timed out");
    }
}

#[test]
fn shutdown_cancels_hung_and_queued_groups() {
    run_shuttle(
        "tasks shutdown_cancels",
        shutdown_cancels_hung_groups,
        Schedules::Random,
    );
    if let Some([_, timeouts, cancelled]) = CANCELLING.totals("shutdown_cancels") {
        assert_eq!(timeouts, 0, "no timeout configured");
        assert!(cancelled > 0, "no group was ever cancelled");
    }
}
