//! The threaded driver against scripted backends. Tests wait for the worker
//! through channels from the backend or `wait_idle`, never by sleeping.

mod common;

use std::sync::mpsc::channel;

use common::{Call, Harness, next_call, req};
use kvtier::{LookupError, Verdict, lookup::Backend, lookup::ThreadLookup};

#[test]
fn keys_resolve_as_the_backend_answers() {
    let harness = Harness::new([2, 4]);
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    let a = req("a");
    for key in [1, 2, 3, 4] {
        assert_eq!(lookup.lookup(&key, &a), Verdict::Pending);
    }
    assert_eq!(lookup.flush().unwrap(), 4);
    lookup.wait_idle().unwrap();
    let verdicts: Vec<bool> = [1, 2, 3, 4]
        .iter()
        .map(|key| lookup.lookup(key, &a).is_hit())
        .collect();
    assert_eq!(verdicts, [false, true, false, true]);
    assert_eq!(
        harness.started.try_iter().collect::<Vec<_>>(),
        vec![Call {
            request: a.clone(),
            keys: vec![1, 2, 3, 4]
        }]
    );
}

#[test]
fn one_backend_call_per_request_group_in_first_appearance_order() {
    let harness = Harness::new([]);
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&1, &req("b"));
    lookup.lookup(&2, &req("a"));
    lookup.lookup(&3, &req("b"));
    lookup.lookup(&2, &req("b")); // known key: not probed again
    lookup.flush().unwrap();
    assert_eq!(lookup.flush().unwrap(), 0, "nothing new: nothing submitted");
    lookup.wait_idle().unwrap();
    let calls: Vec<(String, Vec<u64>)> = harness
        .started
        .try_iter()
        .map(|c| (c.request, c.keys))
        .collect();
    assert_eq!(calls, vec![(req("b"), vec![1, 3]), (req("a"), vec![2])]);
    assert_eq!(lookup.stats().groups_submitted, 2);
}

#[test]
fn seed_000_a_finished_group_is_visible_while_a_later_group_is_still_probing() {
    let mut harness = Harness::new([1, 2]);
    let release_slow = harness.gate("slow");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&1, &req("fast"));
    lookup.lookup(&2, &req("slow"));
    lookup.flush().unwrap();
    assert_eq!(next_call(&harness.started).request, "fast");
    // The worker publishes "fast" before it calls the backend for "slow".
    assert_eq!(next_call(&harness.started).request, "slow");
    assert!(lookup.lookup(&1, &req("fast")).is_hit());
    assert!(lookup.lookup(&2, &req("slow")).is_pending());
    release_slow.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&2, &req("slow")).is_hit());
}

#[test]
fn defect_3_answers_published_mid_step_are_seen_by_the_next_lookup() {
    // The reference only looked at published answers on the first lookup
    // after a flush. Here the answer lands after that first lookup, and the
    // very next lookup in the same step, with no flush in between, sees it.
    let mut harness = Harness::new([7]);
    let release = harness.gate("a");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&7, &req("a"));
    lookup.flush().unwrap();
    lookup.lookup(&8, &req("b"));
    lookup.flush().unwrap(); // the step's last flush
    assert_eq!(next_call(&harness.started).request, "a");
    assert!(
        lookup.lookup(&7, &req("a")).is_pending(),
        "first lookup after the flush"
    );
    release.send(()).unwrap();
    // b's call starts only after a's answer was published.
    assert_eq!(next_call(&harness.started).request, "b");
    assert!(
        lookup.lookup(&7, &req("a")).is_hit(),
        "second lookup, same step"
    );
}

#[test]
fn answers_from_several_steps_all_become_visible() {
    let mut harness = Harness::new([1, 2, 3]);
    let release = harness.gate("s1");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    for (step, key) in [("s1", 1), ("s2", 2), ("s3", 3)] {
        lookup.lookup(&key, &req(step));
        lookup.flush().unwrap();
    }
    release.send(()).unwrap();
    assert_eq!(lookup.wait_idle().unwrap(), 3);
    for (step, key) in [("s1", 1), ("s2", 2), ("s3", 3)] {
        assert!(lookup.lookup(&key, &req(step)).is_hit());
    }
}

#[test]
fn cleanup_in_flight_lets_the_next_request_join_the_probe() {
    let mut harness = Harness::new([5]);
    let release = harness.gate("a");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&5, &req("a"));
    lookup.flush().unwrap();
    next_call(&harness.started);
    lookup.cleanup(&req("a"));
    assert!(lookup.lookup(&5, &req("b")).is_pending());
    assert_eq!(lookup.flush().unwrap(), 0, "b joins a's probe");
    release.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&5, &req("b")).is_hit());
    assert_eq!(lookup.stats().keys_submitted, 1);
}

#[test]
fn an_orphaned_answer_is_discarded_and_a_later_lookup_probes_afresh() {
    let mut harness = Harness::new([5]);
    let release = harness.gate("a");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&5, &req("a"));
    lookup.flush().unwrap();
    next_call(&harness.started);
    lookup.cleanup(&req("a"));
    release.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.table().is_empty());
    assert_eq!(lookup.stats().orphans_dropped, 1);
    assert!(lookup.lookup(&5, &req("b")).is_pending());
    assert_eq!(lookup.flush().unwrap(), 1, "probed afresh");
}

#[test]
fn defect_1_late_mark_miss_after_recreate_leaves_the_new_lookup_intact() {
    let mut harness = Harness::new([9]);
    let release = harness.gate("b");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&9, &req("a"));
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    assert_eq!(next_call(&harness.started).request, "a");
    let Verdict::Hit(ticket) = lookup.lookup(&9, &req("a")) else {
        panic!("9 is stored")
    };
    // The load of gen 0 starts; a finishes; b looks 9 up again (gen 1, in flight).
    lookup.cleanup(&req("a"));
    lookup.lookup(&9, &req("b"));
    lookup.flush().unwrap();
    assert_eq!(next_call(&harness.started).request, "b");
    // The gen-0 load fails now, while gen 1 is in flight.
    assert!(!lookup.mark_miss(&ticket));
    assert_eq!(lookup.mark_miss_keys([&9]), 0);
    release.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&9, &req("b")).is_hit(), "gen 1's own answer");
    // And once gen 1 resolved, a stale ticket still cannot flip it.
    assert!(!lookup.mark_miss(&ticket));
    assert!(lookup.lookup(&9, &req("b")).is_hit());
    assert_eq!(lookup.stats().anomalies, 0);
}

#[test]
fn mark_miss_stops_the_failed_load_livelock_without_reprobing() {
    let harness = Harness::new([3]);
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&3, &req("a"));
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    let Verdict::Hit(ticket) = lookup.lookup(&3, &req("a")) else {
        panic!("3 is stored")
    };
    assert!(lookup.mark_miss(&ticket));
    assert!(lookup.lookup(&3, &req("a")).is_miss());
    assert_eq!(lookup.flush().unwrap(), 0);
    assert_eq!(harness.started.try_iter().count(), 1);
}

/// A backend whose faults are scripted per request id.
struct Faulty;

impl Backend<u64, String> for Faulty {
    type Answers = Box<dyn Iterator<Item = bool>>;
    type Error = String;

    fn batch_lookup(&mut self, keys: &[u64], request: &String) -> Result<Self::Answers, String> {
        let n = keys.len();
        match request.as_str() {
            "error" => Err("object store unreachable".to_owned()),
            "panic-in-call" => panic!("backend bug in the call"),
            // Lazy: the first answer is produced, then consuming panics.
            "panic-while-consumed" => Ok(Box::new((0..n).map(|i| {
                if i == 0 {
                    true
                } else {
                    panic!("backend bug mid-iteration")
                }
            }))),
            "short" => Ok(Box::new(std::iter::repeat_n(true, n - 1))),
            "surplus" => Ok(Box::new(std::iter::repeat(true))),
            _ => Ok(Box::new(std::iter::repeat_n(true, n))),
        }
    }
}

#[test]
fn defects_4_and_5_backend_faults_become_misses_and_the_worker_keeps_serving() {
    let mut lookup = ThreadLookup::threaded(Faulty).unwrap();
    let cases = [
        "error",
        "panic-in-call",
        "panic-while-consumed",
        "short",
        "surplus",
        "healthy",
    ];
    // All faults in one submission: later groups must still be answered.
    for (i, case) in cases.iter().enumerate() {
        for k in 0..3u64 {
            lookup.lookup(&(i as u64 * 10 + k), &req(case));
        }
    }
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    let hits = |lookup: &mut ThreadLookup<u64, String>, i: u64| -> Vec<bool> {
        (0..3)
            .map(|k| {
                let verdict = lookup.lookup(&(i * 10 + k), &req(cases[i as usize]));
                assert!(!verdict.is_pending(), "no key stays in flight");
                verdict.is_hit()
            })
            .collect()
    };
    assert_eq!(hits(&mut lookup, 0), [false, false, false], "error");
    assert_eq!(hits(&mut lookup, 1), [false, false, false], "panic in call");
    assert_eq!(
        hits(&mut lookup, 2),
        [true, false, false],
        "panic while consumed"
    );
    assert_eq!(hits(&mut lookup, 3), [true, true, false], "short");
    assert_eq!(hits(&mut lookup, 4), [true, true, true], "surplus");
    assert_eq!(hits(&mut lookup, 5), [true, true, true], "healthy");
    let stats = lookup.stats();
    assert_eq!(stats.backend_errors, 1);
    assert_eq!(stats.backend_panics, 2);
    assert_eq!(stats.short_results, 1);
    assert_eq!(stats.surplus_results, 1);

    // The worker survived: a later step is served.
    lookup.lookup(&100, &req("healthy"));
    lookup.flush().unwrap();
    lookup.wait_idle().unwrap();
    assert!(lookup.lookup(&100, &req("healthy")).is_hit());

    for case in cases {
        lookup.cleanup(&req(case));
    }
    let final_table = lookup.shutdown().unwrap();
    assert!(final_table.is_empty(), "no state leaked");
}

#[test]
fn shutdown_finishes_queued_work_and_hands_back_the_final_table() {
    let mut harness = Harness::new([1, 2]);
    let release = harness.gate("s1");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&1, &req("s1"));
    lookup.flush().unwrap();
    lookup.lookup(&2, &req("s2"));
    lookup.flush().unwrap();
    next_call(&harness.started); // s1 in flight, s2 queued
    release.send(()).unwrap();
    let final_table = lookup.shutdown().unwrap();
    assert_eq!(
        final_table.stats().groups_applied,
        2,
        "queued work done and applied"
    );
    assert_eq!(harness.started.try_iter().count(), 1, "s2 was probed too");
    // The table is still readable.
    assert_eq!(final_table.len(), 2);
}

#[test]
fn dropping_the_driver_lets_the_worker_finish_and_joins_it() {
    let (done_tx, done_rx) = channel();
    let backend = move |keys: &[u64], _request: &String| {
        done_tx.send(keys.to_vec()).unwrap();
        vec![true; keys.len()]
    };
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    for step in 0..3u64 {
        lookup.lookup(&step, &req("a"));
        lookup.flush().unwrap();
    }
    drop(lookup);
    // Joined: the backend (and its sender) is gone, after all three calls.
    assert_eq!(
        done_rx.iter().collect::<Vec<_>>(),
        vec![vec![0], vec![1], vec![2]]
    );
}

#[test]
fn drain_applies_published_answers_without_a_lookup() {
    let harness = Harness::new([4]);
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup.lookup(&4, &req("a"));
    lookup.flush().unwrap();
    lookup.lookup(&5, &req("b"));
    lookup.flush().unwrap();
    // Both calls started; the first one was published before the second began.
    next_call(&harness.started);
    next_call(&harness.started);
    assert!(lookup.drain() >= 1);
    assert_eq!(
        lookup.table().key_state(&4).unwrap().phase,
        kvtier::lookup::Phase::Resolved { found: true }
    );
}

/// A request whose id panics on the worker thread: a hostile `Request` impl
/// is the one way (besides a kvtier bug) to kill the worker, since backend
/// panics are caught.
#[derive(Clone, Debug)]
struct PanicsOnTheWorker(u64);

impl kvtier::Request for PanicsOnTheWorker {
    type Id = u64;

    fn id(&self) -> &u64 {
        if std::thread::current().name() == Some("kvtier-lookup") {
            panic!("request id read on the worker");
        }
        &self.0
    }
}

#[test]
fn a_lost_worker_is_reported_instead_of_hanging_the_scheduler() {
    let backend = |keys: &[u64], _request: &PanicsOnTheWorker| vec![true; keys.len()];
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    lookup.lookup(&1, &PanicsOnTheWorker(7));
    lookup.flush().unwrap();
    // The worker dies on this group; waiting for it must end with an error.
    assert!(matches!(
        lookup.wait_idle(),
        Err(LookupError::WorkerLost(_))
    ));
    lookup.lookup(&2, &PanicsOnTheWorker(7));
    assert!(matches!(lookup.flush(), Err(LookupError::WorkerLost(_))));
    // Shutdown joins the dead worker and reports its panic.
    let table = match lookup.shutdown() {
        Err(error) => {
            let (error, table) = error.into_parts();
            let LookupError::WorkerLost(reason) = error else {
                panic!("expected WorkerLost, got {error:?}");
            };
            assert!(reason.contains("request id read on the worker"), "{reason}");
            table
        }
        Ok(table) => panic!("expected WorkerLost, got {table:?}"),
    };
    // The group the worker took stays in flight (documented on
    // WorkerLost); the one it refused was answered as cancelled.
    assert_eq!(
        table.key_state(&1).unwrap().phase,
        kvtier::lookup::Phase::InFlight
    );
    assert_eq!(
        table.key_state(&2).unwrap().phase,
        kvtier::lookup::Phase::Resolved { found: false }
    );
    assert_eq!(table.stats().cancelled, 1);
}

/// A payload a backend panics with whose own `Drop` panics too.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("the panic payload's drop panics");
    }
}

/// A backend may panic with any value, including one whose `Drop` panics:
/// the worker survives it, the group's keys become misses, later groups are
/// probed, and the table empties.
#[test]
fn a_panic_payload_whose_drop_panics_does_not_kill_the_worker() {
    let backend = |keys: &[u64], request: &String| -> Vec<bool> {
        if request == "hostile" {
            std::panic::panic_any(PanicsWhenDropped);
        }
        keys.iter().map(|_| true).collect()
    };
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    lookup.lookup(&1, &req("hostile"));
    lookup.flush().unwrap();
    lookup.wait_idle().expect("the worker is alive");
    assert!(lookup.lookup(&1, &req("hostile")).is_miss());
    lookup.lookup(&2, &req("fine"));
    lookup.flush().unwrap();
    lookup.wait_idle().expect("the worker is still alive");
    assert!(lookup.lookup(&2, &req("fine")).is_hit());
    assert_eq!(lookup.stats().backend_panics, 1);
    lookup.cleanup(&req("hostile"));
    lookup.cleanup(&req("fine"));
    let final_table = lookup.shutdown().unwrap();
    assert!(final_table.is_empty());
}

/// The batched call picks up what the worker published, as a single lookup
/// does, and counts the leading hits a scheduler can load.
#[test]
fn the_batched_lookup_applies_published_answers_and_counts_leading_hits() {
    let backend = |keys: &[u64], _request: &String| keys.iter().map(|k| k % 4 != 3).collect();
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    let keys = [1, 2, 3, 5];
    let mut verdicts = Vec::new();
    assert_eq!(lookup.lookup_all(&keys, &req("a"), &mut verdicts), 0);
    assert!(verdicts.iter().all(|v| v.is_pending()));
    lookup.flush().unwrap();
    // Wait without draining: the answers are published, not yet applied.
    while lookup.prober().outstanding_submissions() > 0 {
        std::thread::yield_now();
    }
    assert_eq!(lookup.lookup_all(&keys, &req("a"), &mut verdicts), 2);
    assert!(verdicts[2].is_miss() && verdicts[3].is_hit());
    assert_eq!(lookup.stats().lookups, 8);
}

#[test]
fn a_queued_group_whose_request_was_cleaned_up_is_not_probed() {
    let mut harness = Harness::new([2]);
    let release_slow = harness.gate("slow");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    let (slow, gone) = (req("slow"), req("gone"));
    lookup.lookup(&2, &slow);
    lookup.lookup(&4, &gone);
    lookup.flush().unwrap();
    assert_eq!(next_call(&harness.started).request, "slow");
    // "gone" waits behind "slow" and is cleaned up while it waits.
    lookup.cleanup(&gone);
    release_slow.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(
        harness.started.try_iter().next().is_none(),
        "the backend was called for a group nobody wants"
    );
    assert_eq!(lookup.stats().abandoned, 1);
    assert!(lookup.lookup(&2, &slow).is_hit());
    lookup.cleanup(&slow);
    assert!(lookup.shutdown().unwrap().is_empty());
}

#[test]
fn with_a_time_budget_the_flush_reads_the_clock_and_a_stuck_key_becomes_a_miss() {
    let mut harness = Harness::new([1]);
    let release = harness.gate("a");
    let mut lookup = ThreadLookup::threaded(harness.backend).unwrap();
    lookup
        .set_limits(
            kvtier::lookup::LookupLimits::default()
                .pending_time(Some(std::time::Duration::from_millis(1))),
        )
        .unwrap();
    let a = req("a");
    lookup.lookup(&1, &a);
    lookup.flush().unwrap(); // step 0 ends; step 1 starts now
    assert_eq!(next_call(&harness.started).request, "a");
    // The backend is held; the clock moves on past the budget.
    std::thread::sleep(std::time::Duration::from_millis(5));
    lookup.flush().unwrap();
    assert_eq!(lookup.lookup(&1, &a), Verdict::Miss);
    assert_eq!(lookup.stats().deadline_misses, 1);
    release.send(()).unwrap();
    lookup.wait_idle().unwrap();
    assert!(
        lookup.lookup(&1, &a).is_hit(),
        "the late answer still resolves it"
    );
    assert_eq!(lookup.stats().late_answers, 1);
}

/// The lookup a backend can reach from inside its own calls, as a Python
/// backend does through the manager that owns both.
type Shared = std::sync::Arc<std::sync::Mutex<Option<ThreadLookup<u64, String>>>>;

/// Sends once when dropped: a backend holding one lets go of it as its
/// worker exits.
struct SignalsWhenDropped(std::sync::mpsc::Sender<()>);

impl Drop for SignalsWhenDropped {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Found by a Python test: the last owner of a lookup let go of it inside a
/// backend call, so the lookup was dropped on its own worker thread, whose
/// shutdown joined itself and panicked ("Resource deadlock avoided"). Now
/// it asks the worker to stop after the call and returns; the worker
/// finishes the queue (a group whose owner is gone still gets its call)
/// and exits.
#[test]
fn a_lookup_dropped_inside_its_own_backend_call_does_not_join_itself() {
    let shared: Shared = Default::default();
    let (calls_tx, calls_rx) = channel();
    let (dropped_tx, dropped_rx) = channel();
    let (gone_tx, gone_rx) = channel();
    let owner = shared.clone();
    let exit_signal = SignalsWhenDropped(gone_tx);
    let backend = move |keys: &[u64], request: &String| {
        let _held = &exit_signal;
        calls_tx.send(keys.to_vec()).unwrap();
        if request == "drops" {
            let lookup = owner.lock().unwrap().take();
            assert!(lookup.is_some());
            // Dropped here, on the worker, inside this call.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(lookup)));
            dropped_tx.send(outcome.is_ok()).unwrap();
        }
        vec![true; keys.len()]
    };
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    lookup.lookup(&1, &req("drops"));
    lookup.lookup(&2, &req("queued"));
    *shared.lock().unwrap() = Some(lookup);
    shared.lock().unwrap().as_mut().unwrap().flush().unwrap();
    let patience = std::time::Duration::from_secs(10);
    assert_eq!(
        dropped_rx.recv_timeout(patience),
        Ok(true),
        "dropping the lookup on its worker returned without panicking"
    );
    assert_eq!(
        gone_rx.recv_timeout(patience),
        Ok(()),
        "the worker exited after the queue"
    );
    assert_eq!(calls_rx.try_iter().collect::<Vec<_>>(), [vec![1], vec![2]]);
}

/// `wait_idle` from inside a backend call would wait for the call making
/// it: it is refused instead of hanging the worker for good.
#[test]
fn waiting_for_the_worker_from_inside_a_backend_call_is_refused() {
    let shared: Shared = Default::default();
    let (waited_tx, waited_rx) = channel();
    let owner = shared.clone();
    let backend = move |keys: &[u64], _request: &String| {
        if let Some(lookup) = owner.lock().unwrap().as_mut() {
            waited_tx.send(lookup.wait_idle()).unwrap();
        }
        vec![true; keys.len()]
    };
    let mut lookup = ThreadLookup::threaded(backend).unwrap();
    lookup.lookup(&1, &req("a"));
    *shared.lock().unwrap() = Some(lookup);
    shared.lock().unwrap().as_mut().unwrap().flush().unwrap();
    let patience = std::time::Duration::from_secs(10);
    let waited = waited_rx
        .recv_timeout(patience)
        .expect("wait_idle returned");
    assert!(
        matches!(waited, Err(LookupError::OnWorker(_))),
        "{waited:?}"
    );
    let mut lookup = shared.lock().unwrap().take().unwrap();
    lookup.wait_idle().unwrap();
    assert!(
        lookup.lookup(&1, &req("a")).is_hit(),
        "the call still answered"
    );
}
