//! Behaviour of the tokio driver: concurrent groups published as they finish,
//! FIFO with one slot, per-group timeouts, faults, shutdown that never hangs,
//! and the shared generation rules. Each test that could hang on a bug runs
//! under a watchdog that fails it instead (a bound for hangs, not a speed
//! target: nothing here asserts how long anything takes).
#![cfg(all(feature = "tokio", not(any(kvtier_loom, kvtier_shuttle))))]

use std::collections::HashMap;
use std::future::Future;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier::{
    LookupError, Verdict, lookup::AsyncBackend, lookup::GroupOutcome, lookup::Phase,
    lookup::TokioConfig, lookup::TokioLookup,
};
use tokio::sync::Notify;

/// What the test backend does for a request's group.
#[derive(Clone)]
enum Act {
    /// Even keys are stored.
    Answer,
    /// Waits for the gate, then answers like `Answer`.
    Gated(Arc<Notify>),
    /// Never answers.
    Hang,
    Error,
    /// Panics before returning a future.
    PanicOnCall,
    /// Panics on the first poll.
    PanicOnPoll,
    /// Answers half the keys.
    Short,
    /// Answers every key and one more.
    Surplus,
}

/// Acts per request (default `Answer`) and reports each call as it starts.
struct Backend {
    acts: HashMap<String, Act>,
    started: Mutex<Sender<String>>,
}

impl AsyncBackend<u64, String> for Backend {
    type Error = String;

    fn batch_lookup(
        &self,
        keys: &[u64],
        request: &String,
    ) -> impl Future<Output = Result<Vec<bool>, String>> + Send {
        let act = self.acts.get(request).cloned().unwrap_or(Act::Answer);
        let _ = self.started.lock().unwrap().send(request.clone());
        if let Act::PanicOnCall = act {
            panic!("backend exploded while starting {request}");
        }
        let even = || keys.iter().map(|key| key % 2 == 0).collect::<Vec<bool>>();
        async move {
            match act {
                Act::Answer => Ok(even()),
                Act::Gated(gate) => {
                    gate.notified().await;
                    Ok(even())
                }
                Act::Hang => std::future::pending().await,
                Act::Error => Err(format!("bucket unreachable for {request}")),
                Act::PanicOnCall => unreachable!(),
                Act::PanicOnPoll => panic!("backend exploded while probing {request}"),
                Act::Short => Ok(even()[..keys.len() / 2].to_vec()),
                Act::Surplus => {
                    let mut answers = even();
                    answers.push(true);
                    Ok(answers)
                }
            }
        }
    }
}

fn backend(acts: &[(&str, Act)]) -> (Backend, Receiver<String>) {
    let (started, rx) = channel();
    let backend = Backend {
        acts: acts
            .iter()
            .map(|(request, act)| (request.to_string(), act.clone()))
            .collect(),
        started: Mutex::new(started),
    };
    (backend, rx)
}

fn req(name: &str) -> String {
    name.to_owned()
}

/// Runs `test` on a thread and fails if it has not finished after 60 s.
fn watchdog(test: impl FnOnce() + Send + 'static) {
    let (done, finished) = channel();
    let worker = std::thread::spawn(move || {
        test();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => worker.join().unwrap(),
        // The test panicked (and dropped the sender): report its panic.
        Err(RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(worker.join().unwrap_err())
        }
        Err(RecvTimeoutError::Timeout) => panic!("hung: the test did not finish within 60 s"),
    }
}

/// Asks for `key` until it is no longer pending (the driver publishes in
/// the background); fails after 30 s.
fn settle(
    driver: &mut TokioLookup<u64, String, Backend>,
    key: u64,
    request: &String,
) -> Verdict<u64> {
    for _ in 0..30_000 {
        let verdict = driver.lookup(&key, request);
        if !verdict.is_pending() {
            return verdict;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("key {key} still pending after 30 s");
}

#[test]
fn a_fast_group_queued_behind_a_slow_one_is_published_first() {
    watchdog(|| {
        let gate = Arc::new(Notify::new());
        let (backend, started) = backend(&[("slow", Act::Gated(gate.clone()))]);
        let config = TokioConfig::default()
            .max_concurrent_groups(2)
            .group_timeout(None);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.record_applied(true);
        let (slow, fast) = (req("slow"), req("fast"));
        assert!(driver.lookup(&2, &slow).is_pending());
        assert!(driver.lookup(&4, &fast).is_pending());
        assert_eq!(driver.flush().unwrap(), 2);

        // The fast group (submitted second) resolves while the slow one is
        // still held at its gate.
        assert!(settle(&mut driver, 4, &fast).is_hit());
        assert_eq!(driver.lookup(&2, &slow), Verdict::Pending);
        assert_eq!(driver.prober().outstanding_groups(), 1);
        let mut calls: Vec<String> = started.try_iter().collect();
        calls.sort();
        assert_eq!(calls, ["fast", "slow"]);

        gate.notify_one();
        assert!(settle(&mut driver, 2, &slow).is_hit());
        assert_eq!(
            driver.take_applied(),
            [(1, GroupOutcome::Answered), (0, GroupOutcome::Answered)],
            "group 1 (fast) reached the table before group 0 (slow)"
        );
        let final_table = driver.shutdown().unwrap();
        assert_eq!(final_table.stats().anomalies, 0);
    });
}

#[test]
fn with_one_slot_groups_are_probed_and_published_in_submission_order() {
    watchdog(|| {
        let gate = Arc::new(Notify::new());
        let (backend, started) = backend(&[("slow", Act::Gated(gate.clone()))]);
        let config = TokioConfig::default()
            .max_concurrent_groups(1)
            .group_timeout(None);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.record_applied(true);
        let (slow, fast) = (req("slow"), req("fast"));
        driver.lookup(&2, &slow);
        driver.lookup(&4, &fast);
        driver.flush().unwrap();
        // A second step's group queues behind both.
        driver.lookup(&6, &fast);
        driver.flush().unwrap();

        assert_eq!(started.recv().unwrap(), "slow");
        // While the slow group is held, nothing behind it starts.
        std::thread::sleep(Duration::from_millis(50));
        assert!(started.try_recv().is_err(), "a second group started early");
        assert_eq!(driver.lookup(&4, &fast), Verdict::Pending);

        gate.notify_one();
        driver.wait_idle().unwrap();
        assert_eq!(started.try_iter().collect::<Vec<_>>(), ["fast", "fast"]);
        assert_eq!(
            driver.take_applied(),
            [
                (0, GroupOutcome::Answered),
                (1, GroupOutcome::Answered),
                (2, GroupOutcome::Answered)
            ]
        );
        assert!(driver.lookup(&6, &fast).is_hit());
    });
}

#[test]
fn a_group_that_outlives_its_timeout_becomes_misses_and_is_counted() {
    watchdog(|| {
        let (backend, _started) = backend(&[("hung", Act::Hang)]);
        let config = TokioConfig::default()
            .max_concurrent_groups(2)
            .group_timeout(Some(Duration::from_millis(50)));
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        let (hung, fine) = (req("hung"), req("fine"));
        driver.lookup(&2, &hung);
        driver.lookup(&4, &hung);
        driver.lookup(&6, &fine);
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&2, &hung).is_miss());
        assert!(driver.lookup(&4, &hung).is_miss());
        assert!(driver.lookup(&6, &fine).is_hit());
        let stats = driver.stats();
        assert_eq!(stats.timeouts, 1);
        assert_eq!(stats.groups_applied, 2);
        driver.shutdown().unwrap();
    });
}

#[test]
fn backend_faults_become_misses_and_are_counted_and_the_driver_keeps_serving() {
    watchdog(|| {
        let (backend, _started) = backend(&[
            ("error", Act::Error),
            ("panic-call", Act::PanicOnCall),
            ("panic-poll", Act::PanicOnPoll),
            ("short", Act::Short),
            ("surplus", Act::Surplus),
        ]);
        let mut driver = TokioLookup::tokio(backend, TokioConfig::default()).unwrap();
        for (i, name) in ["error", "panic-call", "panic-poll", "short", "surplus"]
            .into_iter()
            .enumerate()
        {
            let base = 10 * i as u64;
            driver.lookup(&base, &req(name));
            driver.lookup(&(base + 2), &req(name));
        }
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        let verdicts = |driver: &mut TokioLookup<u64, String, Backend>, name: &str, base: u64| {
            [
                driver.lookup(&base, &req(name)).is_hit(),
                driver.lookup(&(base + 2), &req(name)).is_hit(),
            ]
        };
        assert_eq!(verdicts(&mut driver, "error", 0), [false, false]);
        assert_eq!(verdicts(&mut driver, "panic-call", 10), [false, false]);
        assert_eq!(verdicts(&mut driver, "panic-poll", 20), [false, false]);
        assert_eq!(verdicts(&mut driver, "short", 30), [true, false]);
        assert_eq!(verdicts(&mut driver, "surplus", 40), [true, true]);
        let stats = driver.stats();
        assert_eq!(stats.backend_errors, 1);
        assert_eq!(stats.backend_panics, 2);
        assert_eq!(stats.short_results, 1);
        assert_eq!(stats.surplus_results, 1);

        // Still serving after the panics.
        driver.lookup(&100, &req("later"));
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&100, &req("later")).is_hit());
        driver.shutdown().unwrap();
    });
}

#[test]
fn defect_6_shutdown_cancels_a_hung_backend_instead_of_waiting_for_it() {
    watchdog(|| {
        let (backend, started) = backend(&[("hung", Act::Hang)]);
        // No timeout at all: only shutdown's grace bounds the wait.
        let config = TokioConfig::default()
            .max_concurrent_groups(1)
            .group_timeout(None)
            .shutdown_grace(Duration::from_millis(100));
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.lookup(&2, &req("hung"));
        driver.lookup(&4, &req("queued"));
        driver.flush().unwrap();
        assert_eq!(started.recv().unwrap(), "hung");
        assert_eq!(driver.prober().outstanding_groups(), 2);

        let final_table = driver.shutdown().unwrap();
        let stats = final_table.stats();
        assert_eq!(
            stats.cancelled, 2,
            "the hung group and the one queued behind it"
        );
        assert_eq!(stats.groups_applied, stats.groups_submitted);
        for key in [2, 4] {
            let state = final_table.key_state(&key).unwrap();
            assert_eq!(state.phase, Phase::Resolved { found: false });
        }
    });
}

#[test]
fn shutdown_lets_outstanding_groups_finish_within_the_grace_period() {
    watchdog(|| {
        let gate = Arc::new(Notify::new());
        let (backend, started) = backend(&[("slow", Act::Gated(gate.clone()))]);
        let config = TokioConfig::default().shutdown_grace(Duration::from_secs(30));
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.lookup(&2, &req("slow"));
        driver.flush().unwrap();
        assert_eq!(started.recv().unwrap(), "slow");
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            gate.notify_one();
        });
        let final_table = driver.shutdown().unwrap();
        opener.join().unwrap();
        assert_eq!(final_table.stats().cancelled, 0);
        assert_eq!(
            final_table.key_state(&2).unwrap().phase,
            Phase::Resolved { found: true }
        );
    });
}

#[test]
fn generation_rules_are_the_tables_a_new_request_joins_an_in_flight_probe_and_an_orphan_is_dropped()
{
    watchdog(|| {
        let first = Arc::new(Notify::new());
        let second = Arc::new(Notify::new());
        let (backend, started) = backend(&[
            ("old", Act::Gated(first.clone())),
            ("gone", Act::Gated(second.clone())),
        ]);
        let mut driver = TokioLookup::tokio(backend, TokioConfig::default()).unwrap();
        // Every probe runs to its end here: with unwanted groups skipped,
        // the cleanup of "old" could give its running probe up before "new"
        // joins it (see the running-probe tests below).
        let probe_all = kvtier::lookup::LookupLimits::default().skip_unwanted(false);
        driver.set_limits(probe_all).unwrap();
        driver.lookup(&2, &req("old"));
        driver.lookup(&4, &req("gone"));
        driver.flush().unwrap();
        let mut calls = vec![started.recv().unwrap(), started.recv().unwrap()];
        calls.sort();
        assert_eq!(calls, ["gone", "old"]);
        // "old" ends while its probe is in flight and "new" asks for the same
        // key: it joins the probe instead of starting another.
        driver.cleanup(&req("old"));
        assert_eq!(driver.lookup(&2, &req("new")), Verdict::Pending);
        assert_eq!(driver.flush().unwrap(), 0);
        // "gone" ends and nobody joins: its answer is an orphan.
        driver.cleanup(&req("gone"));
        first.notify_one();
        second.notify_one();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&2, &req("new")).is_hit());
        assert!(driver.table().key_state(&4).is_none(), "orphan removed");
        // A later request for key 4 probes afresh, under a new generation.
        assert_eq!(driver.lookup(&4, &req("later")), Verdict::Pending);
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&4, &req("later")).is_hit());
        assert_eq!(started.try_iter().collect::<Vec<_>>(), ["later"]);
        let stats = driver.stats();
        assert_eq!(stats.orphans_dropped, 1);
        assert_eq!(stats.anomalies, 0);
        driver.shutdown().unwrap();
    });
}

#[test]
fn groups_run_on_the_callers_runtime_and_are_cancelled_if_it_goes_away() {
    watchdog(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (backend, started) = backend(&[("hung", Act::Hang)]);
        let config = TokioConfig::default().group_timeout(None);
        let mut driver = TokioLookup::tokio_on(backend, config, runtime.handle().clone()).unwrap();
        driver.lookup(&2, &req("fine"));
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&2, &req("fine")).is_hit());

        driver.lookup(&4, &req("hung"));
        driver.flush().unwrap();
        assert_eq!(started.recv().unwrap(), "fine");
        assert_eq!(started.recv().unwrap(), "hung");
        // The embedder's runtime shuts down under the driver: its tasks are
        // dropped, and the hung group is published as cancelled.
        drop(runtime);
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&4, &req("hung")).is_miss());
        // Later groups cannot run at all; they are cancelled, not stranded.
        driver.lookup(&6, &req("after"));
        driver.flush().unwrap();
        driver.wait_idle().unwrap();
        assert!(driver.lookup(&6, &req("after")).is_miss());
        assert_eq!(driver.stats().cancelled, 2);
        driver.shutdown().unwrap();
    });
}

#[test]
fn dropping_the_driver_inside_an_async_context_does_not_hang() {
    watchdog(|| {
        let (backend, _started) = backend(&[("hung", Act::Hang)]);
        let config = TokioConfig::default()
            .group_timeout(None)
            .shutdown_grace(Duration::ZERO);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.lookup(&2, &req("hung"));
        driver.flush().unwrap();
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        outer.block_on(async move { drop(driver) });
    });
}

#[test]
fn invalid_settings_are_refused_with_a_reason() {
    let refuse = |config: TokioConfig| {
        let (backend, _) = backend(&[]);
        match TokioLookup::<u64, String, Backend>::tokio(backend, config) {
            Err(LookupError::Config(reason)) => reason,
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("accepted"),
        }
    };
    assert!(refuse(TokioConfig::default().max_concurrent_groups(0)).contains("1 to 65536"));
    // A caller's number never sizes the semaphore unchecked.
    assert!(refuse(TokioConfig::default().max_concurrent_groups(1 << 62)).contains("1 to 65536"));
    assert!(refuse(TokioConfig::default().group_timeout(Some(Duration::ZERO))).contains("zero"));
    assert!(refuse(TokioConfig::default().worker_threads(0)).contains("worker_threads"));
    // A million threads would abort the process on memory.
    assert!(refuse(TokioConfig::default().worker_threads(1_000_000)).contains("1 to 1024"));
}

/// Durations too long to add to an `Instant` are waits without an end, not
/// an overflow panic in `shutdown` or `Drop`.
#[test]
fn the_longest_durations_do_not_overflow() {
    watchdog(|| {
        let config = TokioConfig::default()
            .shutdown_grace(Duration::MAX)
            .group_timeout(Some(Duration::MAX));
        let (probe, _) = backend(&[]);
        let mut driver = TokioLookup::tokio(probe, config.clone()).unwrap();
        driver.lookup(&2, &req("a"));
        driver.flush().unwrap();
        let table = driver
            .shutdown()
            .expect("the group finishes within an endless grace");
        assert!(table.key_state(&2).is_some());
        assert_eq!(table.stats().groups_applied, 1);
        let (probe, _) = backend(&[]);
        let mut dropped = TokioLookup::tokio(probe, config).unwrap();
        dropped.lookup(&4, &req("b"));
        dropped.flush().unwrap();
        drop(dropped);
    });
}

/// On a runtime without timers every group would be cancelled by its
/// timeout and every stored key read as a miss: refused at construction.
#[test]
fn a_runtime_without_timers_is_refused_when_groups_have_a_timeout() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    let (probe, _) = backend(&[]);
    match TokioLookup::tokio_on(probe, TokioConfig::default(), runtime.handle().clone()) {
        Err(LookupError::Config(reason)) => assert!(reason.contains("time driver"), "{reason}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("accepted a runtime without timers"),
    }
    // Without a timeout, no timer is needed and lookups work.
    let (probe, _) = backend(&[]);
    let config = TokioConfig::default().group_timeout(None);
    let mut driver = TokioLookup::tokio_on(probe, config, runtime.handle().clone()).unwrap();
    driver.lookup(&2, &req("a"));
    driver.flush().unwrap();
    driver.wait_idle().unwrap();
    assert!(driver.lookup(&2, &req("a")).is_hit());
    driver.shutdown().unwrap();
}

#[test]
fn shutdown_hands_back_the_final_table() {
    let (backend, _) = backend(&[]);
    let mut driver = TokioLookup::tokio(backend, TokioConfig::default()).unwrap();
    driver.lookup(&2, &req("a"));
    driver.flush().unwrap();
    let final_table = driver.shutdown().unwrap();
    assert_eq!(final_table.stats().groups_applied, 1);
    assert_eq!(final_table.len(), 1);
}

#[test]
fn a_queued_group_whose_request_was_cleaned_up_is_not_probed() {
    watchdog(|| {
        let gate = Arc::new(Notify::new());
        let (backend, started) = backend(&[("slow", Act::Gated(gate.clone()))]);
        let config = TokioConfig::default()
            .max_concurrent_groups(1)
            .group_timeout(None);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.record_applied(true);
        let (slow, gone) = (req("slow"), req("gone"));
        driver.lookup(&2, &slow);
        driver.lookup(&4, &gone);
        driver.flush().unwrap();
        assert_eq!(started.recv().unwrap(), "slow");
        // "gone" waits behind "slow" and is cleaned up while it waits.
        driver.cleanup(&gone);
        gate.notify_one();
        driver.wait_idle().unwrap();
        assert!(
            started.try_iter().next().is_none(),
            "the backend was called for a group nobody wants"
        );
        assert_eq!(
            driver.take_applied(),
            [(0, GroupOutcome::Answered), (1, GroupOutcome::Abandoned)]
        );
        assert_eq!(driver.stats().abandoned, 1);
        assert!(driver.lookup(&2, &slow).is_hit());
        driver.cleanup(&slow);
        assert!(driver.shutdown().unwrap().is_empty());
    });
}

#[test]
fn a_running_probe_whose_request_was_cleaned_up_is_dropped() {
    watchdog(|| {
        let (backend, started) = backend(&[("hung", Act::Hang)]);
        // No timeout: only the cleanup can end this probe (the watchdog
        // fails the test if nothing does).
        let config = TokioConfig::default().group_timeout(None);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        driver.record_applied(true);
        let hung = req("hung");
        driver.lookup(&2, &hung);
        driver.flush().unwrap();
        assert_eq!(started.recv().unwrap(), "hung");
        // The backend never answers; its only request leaves.
        driver.cleanup(&hung);
        driver.wait_idle().unwrap();
        assert_eq!(driver.take_applied(), [(0, GroupOutcome::Abandoned)]);
        let stats = driver.stats();
        assert_eq!(
            (stats.abandoned, stats.timeouts, stats.cancelled),
            (1, 0, 0)
        );
        assert!(driver.shutdown().unwrap().is_empty());
    });
}

#[test]
fn a_running_probe_that_another_request_joined_is_kept() {
    watchdog(|| {
        let gate = Arc::new(Notify::new());
        let (backend, started) = backend(&[("first", Act::Gated(gate.clone()))]);
        let config = TokioConfig::default().group_timeout(None);
        let mut driver = TokioLookup::tokio(backend, config).unwrap();
        let (first, second) = (req("first"), req("second"));
        driver.lookup(&2, &first);
        driver.flush().unwrap();
        // A bound for a probe given up before it starts, not a speed target.
        let call = started.recv_timeout(Duration::from_secs(20));
        assert_eq!(call.as_deref(), Ok("first"), "the backend was never called");
        driver.lookup(&2, &second); // joins the running probe
        driver.cleanup(&first);
        gate.notify_one();
        assert!(settle(&mut driver, 2, &second).is_hit());
        assert_eq!(driver.stats().abandoned, 0);
        driver.cleanup(&second);
        assert!(driver.shutdown().unwrap().is_empty());
    });
}
