//! A backend call that never returns holds up neither a thread prober with
//! a shutdown grace (its shutdown and drop return after the grace, leaving
//! the worker behind) nor a caller that waits in slices (`wait_idle_for`).

mod common;

use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::req;
use kvtier::lookup::{ThreadLookup, ThreadProber};
use kvtier::{Lookup, LookupError};

const GRACE: Duration = Duration::from_millis(200);

/// A lookup whose backend blocks on `release` once it was called, and says
/// so on the returned receiver.
fn stuck(
    grace: Option<Duration>,
) -> (
    ThreadLookup<u64, String>,
    Receiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let (entered_tx, entered) = channel();
    let (release, release_rx) = channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let backend = move |keys: &[u64], _: &String| {
        entered_tx.send(()).ok();
        release_rx.lock().unwrap().recv().ok();
        vec![true; keys.len()]
    };
    let lookup = Lookup::try_with_prober(|results| {
        ThreadProber::spawn(backend, results, "kvtier-stuck").map(|p| p.with_shutdown_grace(grace))
    })
    .unwrap();
    (lookup, entered, release)
}

#[test]
fn a_stuck_call_makes_a_graced_shutdown_give_up_instead_of_joining() {
    let (mut lookup, entered, release) = stuck(Some(GRACE));
    lookup.lookup(&1, &req("a"));
    lookup.flush().unwrap();
    lookup.lookup(&2, &req("b"));
    lookup.flush().unwrap();
    entered.recv().unwrap();
    assert_eq!(
        lookup.wait_idle_for(Duration::from_millis(20)).unwrap(),
        None
    );
    let started = Instant::now();
    // On another thread, so a shutdown that joins the stuck worker fails the
    // test (and `release` is dropped, which lets the worker go) instead of
    // hanging it.
    let (stopped_tx, stopped_rx) = channel();
    std::thread::spawn(move || stopped_tx.send(lookup.shutdown()).ok());
    let stopped = stopped_rx
        .recv_timeout(GRACE * 25)
        .expect("shutdown returned within its grace");
    let took = started.elapsed();
    let error = stopped.expect_err("the call never returned");
    let (error, table) = error.into_parts();
    assert!(
        matches!(error, LookupError::Stuck { groups } if groups >= 1),
        "{error}"
    );
    assert!(took >= GRACE, "gave up after {took:?}, before the grace");
    assert!(took < GRACE * 25, "took {took:?}");
    assert!(
        !table.is_empty(),
        "the unpublished keys stay in the final table"
    );
    // The detached worker comes back and exits on its own.
    release.send(()).unwrap();
}

#[test]
fn a_stuck_call_bounds_a_graced_drop_too() {
    let (mut lookup, entered, release) = stuck(Some(GRACE));
    lookup.lookup(&1, &req("a"));
    lookup.flush().unwrap();
    entered.recv().unwrap();
    let started = Instant::now();
    let (dropped_tx, dropped_rx) = channel();
    std::thread::spawn(move || {
        drop(lookup);
        dropped_tx.send(()).ok()
    });
    dropped_rx
        .recv_timeout(GRACE * 25)
        .expect("the drop returned within its grace");
    assert!(
        started.elapsed() < GRACE * 25,
        "took {:?}",
        started.elapsed()
    );
    release.send(()).unwrap();
}

#[test]
fn without_a_grace_shutdown_waits_for_the_call_and_gets_its_answers() {
    let (mut lookup, entered, release) = stuck(None);
    lookup.lookup(&1, &req("a"));
    lookup.flush().unwrap();
    entered.recv().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(GRACE);
        release.send(()).unwrap();
    });
    let table = lookup.shutdown().expect("the call returned");
    assert_eq!(table.stats().hits, 0);
    releaser.join().unwrap();
}

#[test]
fn waiting_in_slices_sees_the_group_published() {
    let (mut lookup, entered, release) = stuck(Some(GRACE));
    lookup.lookup(&1, &req("a"));
    lookup.flush().unwrap();
    entered.recv().unwrap();
    assert_eq!(lookup.wait_idle_for(Duration::ZERO).unwrap(), None);
    release.send(()).unwrap();
    let mut applied = None;
    for _ in 0..500 {
        applied = lookup.wait_idle_for(Duration::from_millis(20)).unwrap();
        if applied.is_some() {
            break;
        }
    }
    assert_eq!(applied, Some(1));
    assert!(lookup.lookup(&1, &req("a")).is_hit());
}

#[test]
fn a_thread_name_with_a_nul_is_a_configuration_error() {
    let refused = ThreadLookup::<u64, String>::threaded_named(
        |keys: &[u64], _: &String| vec![true; keys.len()],
        "kv\0tier",
    );
    assert!(
        matches!(refused, Err(LookupError::Config(_))),
        "{:?}",
        refused.err()
    );
}
