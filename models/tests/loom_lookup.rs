//! loom models of the real `ThreadLookup` driver: the scheduler (the model's
//! main thread) against the worker thread and its scripted backend, every
//! interleaving up to the preemption bound.
//!
//! Each model drives a [`CheckedDriver`], which compares the driver with the
//! specification after every call: every verdict the scheduler sees must be
//! the one the specification gives after the groups applied so far, the
//! table must hold exactly the specification's keys, and the counters must
//! agree. Each model ends with `finish`: every request cleaned up, the driver
//! shut down, no anomaly, every group applied once, nothing left in the table.
//!
//! Run: `RUSTFLAGS="--cfg kvtier_loom" cargo test -p kvtier-models --release --test loom_lookup -- --nocapture`
//! Deeper: `LOOM_MAX_PREEMPTIONS=5` (the default bound here is 3), or
//! `KVTIER_LOOM_EXHAUSTIVE=1` for no bound at all.
#![cfg(kvtier_loom)]

use kvtier::{Verdict, lookup::Phase};
use kvtier_models::checked::CheckedDriver;
use kvtier_models::reference::ModelLimits;
use kvtier_models::scripted::Script as DriverScript;

/// The checked driver with every group probed. Unwanted groups given up by
/// the worker (L15) are modelled at the level of the table by
/// [`claim_races_a_join`] and, with the whole driver, by the shuttle models:
/// with them on, these models make loom 0.7.3 trip over its own
/// modification-order bookkeeping for the publication stack's CAS (an
/// internal `assert_ne!` marked "TODO: this sometimes fails", loom issues
/// #252 and #389), on interleavings it explores only when a group is
/// published without a backend call.
fn driver_for(script: DriverScript) -> CheckedDriver {
    let probe_all = ModelLimits {
        skip_unwanted: false,
        ..ModelLimits::default()
    };
    CheckedDriver::with_limits(script, probe_all)
}
use kvtier_models::checkers::explore;
use kvtier_models::scripted::{Fault, Script, even, flipping, quiet_scripted_panics};

fn phase(driver: &CheckedDriver, key: u64) -> Option<Phase> {
    driver.table().key_state(&key).map(|s| s.phase)
}

#[test]
fn two_groups_published_while_the_scheduler_drains_arrive_once_and_in_order() {
    explore("two_groups_published_while_the_scheduler_drains", || {
        let mut driver = driver_for(Script::new(even));
        // Two requests, so two groups: [1] for request 10, then [2] for request 20.
        driver.lookup(1, 10);
        driver.lookup(2, 20);
        assert_eq!(driver.flush(), 2);

        // The scheduler drains while the worker may be publishing either group.
        driver.drain();
        let second_visible = phase(&driver, 2) != Some(Phase::InFlight);
        let first_visible = phase(&driver, 1) != Some(Phase::InFlight);
        assert!(
            !second_visible || first_visible,
            "group 2 applied before group 1"
        );
        // Checked against the groups applied so far.
        driver.lookup(2, 20);
        driver.lookup(1, 10);

        // Cleanup while the probes may still be in flight: orphans until answered.
        driver.cleanup(10);
        driver.cleanup(20);
        let stats = driver.finish();
        assert_eq!(stats.groups_applied, 2, "each group applied exactly once");
    });
}

#[test]
fn cleanup_while_in_flight_then_another_request_shares_the_probe() {
    explore(
        "cleanup_while_in_flight_then_another_request_shares",
        || {
            // Every reprobe of a key gets the opposite answer, so an answer
            // applied to the wrong incarnation of the key shows.
            let mut driver = driver_for(Script::new(flipping));
            driver.lookup(4, 10);
            driver.flush();
            // Request 10 ends while its probe may be running, done, or published.
            driver.cleanup(10);
            // Pending either way: 20 joined the in-flight probe, or the answer had
            // been applied before, the orphan removed, and 20 starts afresh.
            assert_eq!(driver.lookup(4, 20), Verdict::Pending);
            let resubmitted = driver.flush() as u64;
            assert!(resubmitted <= 1);
            driver.wait_idle();
            driver.lookup(4, 20);
            let stats = driver.table().stats();
            // One probe per incarnation of the state, never a second one for the
            // in-flight state 20 joined.
            assert_eq!(stats.keys_submitted, 1 + resubmitted);
            driver.finish();
        },
    );
}

#[test]
fn an_orphaned_answer_is_discarded_and_a_later_lookup_probes_afresh() {
    explore("an_orphaned_answer_is_discarded", || {
        // Every group is probed, so the second call answers the new
        // incarnation.
        let mut driver = driver_for(Script::new(flipping));
        driver.lookup(4, 10);
        driver.lookup(5, 10);
        driver.flush();
        // Request 10 ends, answered or not: nobody joins, so the states go
        // now (answered) or as orphans when their answers arrive.
        driver.cleanup(10);
        driver.drain();
        driver.wait_idle();
        assert!(driver.table().is_empty(), "orphans removed");
        // A new incarnation: probed afresh, answered by the second call.
        assert_eq!(driver.lookup(4, 20), Verdict::Pending);
        assert_eq!(driver.flush(), 1);
        driver.wait_idle();
        assert_eq!(driver.lookup(4, 20), Verdict::Miss, "flipped since call 0");
        driver.finish();
    });
}

#[test]
fn a_reused_key_never_gets_an_older_generations_answer() {
    explore(
        "a_reused_key_never_gets_an_older_generations_answer",
        || {
            let mut driver = driver_for(Script::new(flipping));
            // Step 1: key 5 in flight for request 10 (call 0: stored).
            driver.lookup(5, 10);
            driver.flush();
            // Step 2, while call 0 may be anywhere: key 6 is created, dropped
            // before the flush and recreated; only the new generation is sent.
            driver.lookup(6, 20);
            driver.cleanup(20);
            driver.lookup(6, 30);
            assert_eq!(driver.flush(), 1);
            // Request 10 ends; 40 asks for key 5: joins the old probe or, if its
            // orphan was already removed, starts a new generation (call 2: not
            // stored). The checker knows which answer belongs to which.
            driver.cleanup(10);
            driver.lookup(5, 40);
            driver.flush();
            driver.drain();
            driver.lookup(5, 40);
            driver.lookup(6, 30);
            let stats = driver.finish();
            assert_eq!(stats.stale_results, 0, "no late answer reached a state");
        },
    );
}

#[test]
fn seed_001_late_mark_miss_after_recreate_leaves_the_new_verdict_intact() {
    explore("seed_001_late_mark_miss_after_recreate", || {
        let mut driver = driver_for(Script::new(even));
        driver.lookup(2, 10);
        driver.flush();
        driver.wait_idle();
        let Verdict::Hit(old) = driver.lookup(2, 10) else {
            panic!("key 2 is stored")
        };
        // The request ends; the key is recreated by another request and its
        // new probe runs while the first request's load fails late.
        driver.cleanup(10);
        assert_eq!(driver.lookup(2, 20), Verdict::Pending);
        driver.flush();
        assert!(!driver.mark_miss(&old), "stale ticket changed something");
        driver.drain();
        assert!(!driver.mark_miss(&old), "stale ticket changed something");
        driver.wait_idle();
        let Verdict::Hit(new) = driver.lookup(2, 20) else {
            panic!("the new generation's hit was lost")
        };
        assert_ne!(new.generation(), old.generation());
        assert_eq!(driver.table().stats().marked_miss, 0);
        driver.finish();
    });
}

#[test]
fn backend_error_and_panics_mid_submission_become_misses_and_later_groups_publish() {
    quiet_scripted_panics();
    explore("backend_error_and_panics_mid_submission", || {
        // One submission of four groups: the first errors, the second panics
        // after answering its first key, the third panics in the call, the
        // fourth answers normally.
        let script = Script::new(even).with_faults([
            Fault::Error,
            Fault::PanicMidway,
            Fault::PanicInCall,
            Fault::None,
        ]);
        let mut driver = driver_for(script);
        driver.lookup(2, 10);
        driver.lookup(4, 20);
        driver.lookup(6, 20);
        driver.lookup(8, 30);
        driver.lookup(10, 40);
        assert_eq!(driver.flush(), 5);
        driver.drain();
        driver.wait_idle();
        // The worker survived: a later submission is served too.
        driver.lookup(12, 50);
        driver.flush();
        driver.wait_idle();
        assert!(driver.lookup(2, 10).is_miss(), "error: miss");
        assert!(driver.lookup(4, 20).is_hit(), "answered before the panic");
        assert!(driver.lookup(6, 20).is_miss(), "unanswered at the panic");
        assert!(driver.lookup(8, 30).is_miss(), "panic in the call: miss");
        assert!(driver.lookup(10, 40).is_hit(), "later group published");
        assert!(driver.lookup(12, 50).is_hit(), "later submission served");
        let stats = driver.finish();
        assert_eq!((stats.backend_errors, stats.backend_panics), (1, 2));
    });
}

#[test]
fn shutdown_with_work_queued_and_in_flight_serves_it_all_and_joins() {
    explore("shutdown_with_work_queued_and_in_flight", || {
        let mut driver = driver_for(Script::new(even));
        driver.lookup(1, 10);
        driver.flush();
        driver.lookup(2, 20);
        driver.lookup(3, 20);
        driver.flush();
        // The first submission may be queued, in flight or done; the second
        // is queued or in flight. Request 10 ends meanwhile (its key becomes
        // an orphan unless already answered); 20 stays. Shutdown must serve
        // both submissions, join, and apply every answer.
        driver.cleanup(10);
        driver.shutdown();
        assert_eq!(driver.table().stats().groups_applied, 2);
        assert_eq!(phase(&driver, 1), None, "the orphan's answer removed it");
        assert_eq!(phase(&driver, 2), Some(Phase::Resolved { found: true }));
        assert_eq!(phase(&driver, 3), Some(Phase::Resolved { found: false }));
        let stats = driver.finish();
        assert_eq!(stats.keys_submitted, 3);
    });
}

#[test]
fn seed_000_a_finished_group_is_visible_while_a_later_group_is_still_probing() {
    explore("seed_000_a_finished_group_is_visible", || {
        // The backend's call for request 20 waits until the scheduler has
        // seen request 10's answer: that can only end if group 10 is
        // published before group 20 is done. (Test-side loom primitives: the
        // backend is the test's, not kvtier's.)
        let seen =
            loom::sync::Arc::new((loom::sync::Mutex::new(false), loom::sync::Condvar::new()));
        let backend_seen = seen.clone();
        let backend = move |keys: &[u64], request: &u64| {
            if *request == 20 {
                let (lock, signal) = &*backend_seen;
                let mut ok = lock.lock().unwrap();
                while !*ok {
                    ok = signal.wait(ok).unwrap();
                }
            }
            keys.iter().map(|key| key % 2 == 0).collect::<Vec<bool>>()
        };
        let mut lookup = kvtier::lookup::ThreadLookup::threaded(backend).unwrap();
        lookup.lookup(&2, &10);
        lookup.lookup(&3, &20);
        assert_eq!(lookup.flush().unwrap(), 2);
        // A scheduler's steps: ask again until group 10's answer is in.
        while !lookup.lookup(&2, &10).is_hit() {
            loom::thread::yield_now();
        }
        let state = |key: u64| lookup.table().key_state(&key).map(|s| s.phase);
        assert_eq!(state(3), Some(Phase::InFlight), "group 20 is still probing");
        let (lock, signal) = &*seen;
        *lock.lock().unwrap() = true;
        signal.notify_one();
        lookup.cleanup(&10);
        lookup.cleanup(&20);
        let final_table = lookup.shutdown().unwrap();
        let stats = final_table.stats();
        assert_eq!((stats.groups_applied, stats.anomalies), (2, 0));
        assert!(final_table.is_empty());
    });
}

/// L17: a backend whose effects others see under a lock of its own (the
/// GIL, for a Python backend) holds it across the call and the publication
/// (`Backend::around_group`), so a scheduler that saw what the call did
/// finds the answer at its very next lookup. The lock is the test's (loom
/// primitives); the call's effect, a flag, becomes visible when the lock is
/// released, as a Python object's state does when the GIL is.
#[test]
fn a_scheduler_that_saw_a_calls_effect_finds_its_answer() {
    use loom::sync::{Arc, Condvar, Mutex};

    struct Locked {
        /// The backend's lock and the effect its calls leave under it.
        lock: Arc<(Mutex<bool>, Condvar)>,
        called: bool,
    }

    impl kvtier::lookup::Backend<u64, u64> for Locked {
        type Answers = Vec<bool>;
        type Error = std::convert::Infallible;

        fn batch_lookup(&mut self, keys: &[u64], _: &u64) -> Result<Vec<bool>, Self::Error> {
            self.called = true;
            Ok(vec![true; keys.len()])
        }

        fn around_group(&mut self, group: impl FnOnce(&mut Self)) {
            let lock = self.lock.clone();
            let (effect, signal) = &*lock;
            let mut effect = effect.lock().unwrap();
            group(self);
            *effect = self.called;
            drop(effect);
            signal.notify_one();
        }
    }

    explore(
        "a_scheduler_that_saw_a_calls_effect_finds_its_answer",
        || {
            let lock = Arc::new((Mutex::new(false), Condvar::new()));
            let backend = Locked {
                lock: lock.clone(),
                called: false,
            };
            let mut lookup = kvtier::lookup::ThreadLookup::threaded(backend).unwrap();
            assert!(lookup.lookup(&1, &10).is_pending());
            assert_eq!(lookup.flush().unwrap(), 1);
            let (effect, signal) = &*lock;
            let mut seen = effect.lock().unwrap();
            while !*seen {
                seen = signal.wait(seen).unwrap();
            }
            drop(seen);
            assert!(
                lookup.lookup(&1, &10).is_hit(),
                "the call's effect was visible before its answer"
            );
            lookup.cleanup(&10);
            let final_table = lookup.shutdown().unwrap();
            assert_eq!(final_table.stats().anomalies, 0);
            assert!(final_table.is_empty());
        },
    );
}

/// L15 at the level of the atomics: the prober's claim of a group whose only
/// key lost its request races a new request joining that orphan, in every
/// interleaving. Exactly one side wins: the join keeps the probe (the claim
/// then says probe it, and its answer reaches the joiner), or the claim gives
/// it up (the join then starts a new generation with a probe of its own).
/// Either way nobody waits on a probe that will never run, and the table
/// checks that the interest counts exactly the keys with requesters.
#[test]
fn claim_races_a_join() {
    explore("claim_races_a_join", || {
        let mut table: kvtier::lookup::LookupTable<u64, u64> = kvtier::lookup::LookupTable::new();
        table.lookup(&4, &10);
        let group = table.take_submission().unwrap().into_groups().remove(0);
        let first = table.key_state(&4).unwrap().generation;
        table.cleanup(&10);
        let prober = loom::thread::spawn(move || {
            let probe = group.claim();
            (probe, group)
        });
        assert!(table.lookup(&4, &20).is_pending());
        table.check_invariants().unwrap();
        let (probed, group) = prober.join().unwrap();
        let joined = table.key_state(&4).unwrap().generation == first;
        assert_eq!(probed, joined, "the claim and the join disagree");
        if probed {
            assert!(table.take_submission().is_none(), "the probe is shared");
            table.apply(group.answered([true]));
        } else {
            let again = table.take_submission().expect("a probe of its own");
            table.apply(group.abandoned());
            for group in again.into_groups() {
                assert!(group.claim());
                table.apply(group.answered([true]));
            }
        }
        assert!(table.lookup(&4, &20).is_hit());
        table.check_invariants().unwrap();
        table.cleanup(&20);
        assert!(table.is_empty());
    });
}

/// L15: the claim races the cleanup that leaves the group's only key
/// without requesters. Claimed first, the group is probed and its answer
/// removes the orphan; cleaned up first, it is given up. Either way the
/// table ends empty and the interest always counts the keys with
/// requesters.
#[test]
fn claim_races_the_last_cleanup() {
    explore("claim_races_the_last_cleanup", || {
        let mut table: kvtier::lookup::LookupTable<u64, u64> = kvtier::lookup::LookupTable::new();
        table.lookup(&4, &10);
        let group = table.take_submission().unwrap().into_groups().remove(0);
        let prober = loom::thread::spawn(move || {
            let probe = group.claim();
            (probe, group)
        });
        table.cleanup(&10);
        table.check_invariants().unwrap();
        let (probed, group) = prober.join().unwrap();
        if probed {
            table.apply(group.answered([true]));
            assert_eq!(table.stats().orphans_dropped, 1);
        } else {
            table.apply(group.abandoned());
            assert_eq!(table.stats().abandoned, 1);
        }
        table.check_invariants().unwrap();
        assert!(table.is_empty());
    });
}

/// L13 and L14 through the real driver: a budget of one step and room for
/// two keys, while the worker answers in the background. Whatever the
/// interleaving, the checker demands the specification's verdicts: the third
/// key is shed, a key unanswered at the end of its step is a miss from then
/// on (and its late answer still resolves it), and the answered ones hit.
#[test]
fn a_bounded_driver_sheds_and_misses_deadlines_as_specified() {
    explore("a_bounded_driver_sheds_and_misses_deadlines", || {
        let limits = ModelLimits {
            pending_steps: Some(1),
            max_keys: 2,
            max_groups: 2,
            skip_unwanted: false,
            ..ModelLimits::default()
        };
        let mut driver = CheckedDriver::with_limits(Script::new(even), limits);
        driver.lookup(2, 10);
        driver.lookup(4, 10);
        assert_eq!(driver.lookup(6, 10), Verdict::Miss, "no room: shed");
        driver.flush();
        // Answered by now, or overdue: never pending after its step.
        assert!(!driver.lookup(2, 20).is_pending());
        driver.drain();
        driver.lookup(4, 20);
        driver.finish();
    });
}
