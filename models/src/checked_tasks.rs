//! The real concurrent-group driver ([`TokioLookup`]), checked against the
//! specification after every operation: the oracle of its shuttle models and
//! of its stress test on a real tokio runtime.
//!
//! With several groups probed at once, groups reach the table in any order,
//! so the prefix rule of [`CheckedDriver`](crate::checked::CheckedDriver)
//! does not apply. Instead the driver records which group results it applied
//! and in what order (`record_applied`), and after every real call the
//! checker replays exactly that sequence on the [`Reference`] — checking on
//! the way that each group is applied once, was really submitted, ended in
//! an outcome its scripted behaviour allows, and, with one slot, arrives in
//! submission order — then performs the same operation on the specification
//! and demands the same verdict, table and counters. A group lost,
//! duplicated, answered with another group's answers or applied with the
//! wrong generation shows up as a difference.
//!
//! The backend's answers depend on the key and the request (not on call
//! order, which is not deterministic here); its behaviour is scripted per
//! request. It counts the calls in progress and fails the model if there are
//! ever more than `max_concurrent_groups`.

use std::collections::HashMap;
use std::time::Duration;

type Table = kvtier::lookup::LookupTable<Key, Req>;
use kvtier::lookup::{
    AsyncBackend, GroupOutcome, LookupStats, TokioConfig, TokioLookup, TokioProber,
};

use crate::conformance::{check_state, check_verdict};
use crate::driver_state::DriverState;
use crate::reference::{Key, ModelGroup, Reference, Req};

#[cfg(kvtier_shuttle)]
use shuttle::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(kvtier_shuttle))]
use std::sync::atomic::{AtomicUsize, Ordering};

/// What the backend does with a request's groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum Act {
    /// Answers at once.
    Answer,
    /// Yields to the executor a few times, then answers: may time out, and
    /// lets later groups overtake it.
    Slow,
    /// Returns an error.
    Error,
    /// Answers the first half of the keys (rounded down).
    Short,
    /// Answers every key and one more.
    Surplus,
    /// Never answers: only a timeout or shutdown ends it.
    Hang,
}

/// Whether `key` is stored, as seen by a probe for request `req`: about half
/// the keys, and a key probed again for a new request (a new generation) may
/// get the other answer.
pub fn stored(key: Key, req: Req) -> bool {
    crate::scripted::mixed(key, req)
}

/// The scripted backend: behaviour per request (`acts[req % len]`).
#[derive(Debug)]
pub struct ActBackend {
    acts: Vec<Act>,
    max_concurrent: usize,
    in_progress: AtomicUsize,
}

impl ActBackend {
    fn act(acts: &[Act], req: Req) -> Act {
        if acts.is_empty() {
            Act::Answer
        } else {
            acts[(req % acts.len() as u64) as usize]
        }
    }
}

/// Counts a call in progress for as long as its future lives.
struct InProgress<'a>(&'a AtomicUsize);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn yield_now() {
    #[cfg(kvtier_shuttle)]
    shuttle::future::yield_now().await;
    #[cfg(not(kvtier_shuttle))]
    tokio::task::yield_now().await;
}

impl AsyncBackend<Key, Req> for ActBackend {
    type Error = String;

    async fn batch_lookup(&self, keys: &[Key], request: &Req) -> Result<Vec<bool>, String> {
        let now = self.in_progress.fetch_add(1, Ordering::SeqCst) + 1;
        let _guard = InProgress(&self.in_progress);
        assert!(
            now <= self.max_concurrent,
            "{now} backend calls at once, max_concurrent_groups is {}",
            self.max_concurrent
        );
        let answers = || {
            keys.iter()
                .map(|&key| stored(key, *request))
                .collect::<Vec<_>>()
        };
        match Self::act(&self.acts, *request) {
            Act::Answer => Ok(answers()),
            Act::Slow => {
                for _ in 0..3 {
                    yield_now().await;
                }
                Ok(answers())
            }
            Act::Error => Err(format!("scripted error for request {request}")),
            Act::Short => Ok(answers()[..keys.len() / 2].to_vec()),
            Act::Surplus => {
                let mut all = answers();
                all.push(true);
                Ok(all)
            }
            Act::Hang => std::future::pending().await,
        }
    }
}

/// How a checked run is set up.
#[derive(Clone, Debug)]
pub struct TasksSetup {
    /// Behaviour per request (`acts[req % len]`; empty: always answer).
    pub acts: Vec<Act>,
    /// The driver's concurrency.
    pub max_concurrent_groups: usize,
    /// Whether groups have a timeout (its length only matters on tokio;
    /// under shuttle a timeout is a race).
    pub timeout: bool,
    /// Whether shutdown cancels at once (`true`) or waits for every group
    /// (`false`: needs a timeout when a request may hang).
    pub cancel_at_shutdown: bool,
}

/// What a checked run saw, so a test can demand that its runs exercised
/// what they are meant to (overtaking, timeouts, cancellation).
#[derive(Clone, Copy, Debug)]
pub struct Observed {
    /// The driver's final counters.
    pub stats: LookupStats,
    /// Groups applied after a group submitted later than them.
    pub overtaken: u64,
}

/// Counters the oracle derives from the applied outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct OutcomeCounts {
    errors: u64,
    short: u64,
    surplus: u64,
    timeouts: u64,
    cancelled: u64,
}

/// A [`TokioLookup`] over an [`ActBackend`], with the specification
/// alongside. Every method panics with a description when the driver and the
/// specification disagree.
pub struct CheckedTasks {
    state: DriverState<TokioProber<Key, Req, ActBackend>>,
    spec: Reference,
    setup: TasksSetup,
    /// Submitted groups not applied yet, by sequence number.
    unapplied: HashMap<u64, ModelGroup>,
    next_seq: u64,
    /// The last group applied, for the one-slot FIFO check.
    last_applied: Option<u64>,
    /// The highest sequence number applied so far.
    highest_applied: Option<u64>,
    /// Groups applied after a group submitted later than them.
    overtaken: u64,
    counts: OutcomeCounts,
    shutting_down: bool,
}

impl CheckedTasks {
    /// Starts the driver (on shuttle's executor under `--cfg kvtier_shuttle`,
    /// on a runtime of its own otherwise).
    pub fn new(setup: TasksSetup) -> Self {
        assert!(
            setup.timeout || setup.cancel_at_shutdown || !setup.acts.contains(&Act::Hang),
            "a hanging request needs a timeout or cancellation at shutdown"
        );
        let backend = ActBackend {
            acts: setup.acts.clone(),
            max_concurrent: setup.max_concurrent_groups,
            in_progress: AtomicUsize::new(0),
        };
        let config = TokioConfig::default()
            .max_concurrent_groups(setup.max_concurrent_groups)
            .group_timeout(setup.timeout.then_some(Duration::from_millis(20)))
            .shutdown_grace(if setup.cancel_at_shutdown {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            });
        let mut driver = TokioLookup::tokio(backend, config).expect("start the driver");
        driver.record_applied(true);
        Self {
            state: DriverState::Open(driver),
            spec: Reference::new(),
            setup,
            unapplied: HashMap::new(),
            next_seq: 0,
            last_applied: None,
            highest_applied: None,
            overtaken: 0,
            counts: OutcomeCounts::default(),
            shutting_down: false,
        }
    }

    /// `lookup(key, req)`; checks the verdict.
    pub fn lookup(&mut self, key: Key, req: Req) {
        let real = self.driver().lookup(&key, &req);
        self.catch_up();
        self.notice_given_up(key);
        let expected = self.spec.lookup(key, req);
        if let Err(why) = check_verdict(&real, expected) {
            panic!("lookup({key}, {req}): {why}");
        }
        self.check("lookup");
    }

    /// `flush()`; checks how many keys were handed over.
    pub fn flush(&mut self) {
        let handed = self.driver().flush().expect("driver open");
        self.catch_up();
        let groups = self.spec.take_submission();
        let expected: usize = groups.iter().map(|(_, entries)| entries.len()).sum();
        assert_eq!(handed, expected, "flush handed over {handed} keys");
        for group in groups {
            self.unapplied.insert(self.next_seq, group);
            self.next_seq += 1;
        }
        self.check("flush");
    }

    /// `drain()`.
    pub fn drain(&mut self) {
        self.driver().drain();
        self.catch_up();
        self.check("drain");
    }

    /// `wait_idle()`: afterwards every submitted group has been applied.
    pub fn wait_idle(&mut self) {
        self.driver().wait_idle().expect("driver open");
        self.catch_up();
        assert!(self.unapplied.is_empty(), "wait_idle returned early");
        self.check("wait_idle");
    }

    /// `cleanup(req)`.
    pub fn cleanup(&mut self, req: Req) {
        self.driver().cleanup(&req);
        self.catch_up();
        self.spec.cleanup(req);
        self.check("cleanup");
    }

    /// `mark_miss_keys(keys)`.
    pub fn mark_miss_keys(&mut self, keys: &[Key]) {
        let changed = self.driver().mark_miss_keys(keys);
        self.catch_up();
        assert_eq!(
            changed,
            self.spec.mark_miss_keys(keys),
            "mark_miss_keys({keys:?})"
        );
        self.check("mark_miss_keys");
    }

    /// `shutdown()`: afterwards every submitted group has been applied
    /// (answered, timed out or cancelled).
    pub fn shutdown(&mut self) {
        self.shutting_down = true;
        self.state.shut_down();
        self.catch_up();
        assert!(
            self.unapplied.is_empty(),
            "shutdown lost {} groups",
            self.unapplied.len()
        );
        self.check("shutdown");
        if !self.setup.cancel_at_shutdown {
            assert_eq!(
                self.counts.cancelled, 0,
                "groups cancelled although shutdown waits"
            );
        }
    }

    /// Ends the run: cleans up every live request and shuts down, then
    /// checks that no anomaly happened, every group was applied once and
    /// nothing is left in flight.
    pub fn finish(mut self) -> Observed {
        if self.state.is_open() {
            for req in self.spec.requests() {
                self.cleanup(req);
            }
            self.shutdown();
        }
        let stats = self.table().stats();
        assert_eq!(stats.anomalies, 0, "anomalies");
        assert_eq!(
            stats.groups_applied, stats.groups_submitted,
            "every group applied once"
        );
        for key in self.spec.keys.keys() {
            assert_ne!(
                self.table().key_state(key).map(|s| s.phase),
                Some(kvtier::lookup::Phase::InFlight),
                "key {key} still in flight after shutdown"
            );
        }
        if self.spec.requests().is_empty() {
            assert!(self.table().is_empty(), "keys leaked");
        }
        Observed {
            stats,
            overtaken: self.overtaken,
        }
    }

    /// The driver, while it runs.
    fn driver(&mut self) -> &mut TokioLookup<Key, Req, ActBackend> {
        self.state.driver()
    }

    /// The driver's table (its final table once shut down).
    fn table(&self) -> &Table {
        self.state.table()
    }

    /// Replays on the specification the groups the driver applied since the
    /// last call, in the driver's order, checking each one.
    fn catch_up(&mut self) {
        let applied = self.state.take_applied();
        for (seq, outcome) in applied {
            let (req, entries) = self
                .unapplied
                .remove(&seq)
                .unwrap_or_else(|| panic!("group {seq} applied twice, or never submitted"));
            if self.setup.max_concurrent_groups == 1 {
                let expected = self.last_applied.map_or(0, |last| last + 1);
                assert_eq!(
                    seq, expected,
                    "one slot: groups must arrive in submission order"
                );
            }
            self.last_applied = Some(seq);
            if self.highest_applied.is_some_and(|highest| highest > seq) {
                self.overtaken += 1;
            }
            self.highest_applied = self.highest_applied.max(Some(seq));
            let act = ActBackend::act(&self.setup.acts, req);
            let allowed = match (act, outcome) {
                (Act::Answer | Act::Slow, GroupOutcome::Answered)
                | (Act::Error, GroupOutcome::BackendError)
                | (Act::Surplus, GroupOutcome::Surplus) => true,
                (Act::Short, GroupOutcome::Short { answered }) => answered == entries.len() / 2,
                (Act::Slow | Act::Hang, GroupOutcome::TimedOut) => self.setup.timeout,
                (_, GroupOutcome::Cancelled) => self.shutting_down,
                // L15: given up unprobed, which the specification must
                // agree nobody wanted.
                (_, GroupOutcome::Abandoned) => !self.spec.claim(&entries),
                _ => false,
            };
            assert!(
                allowed,
                "group {seq} of request {req} ({act:?}) ended {outcome:?}"
            );
            let answered = match outcome {
                GroupOutcome::Answered | GroupOutcome::Surplus => entries.len(),
                GroupOutcome::Short { answered } => answered,
                _ => 0,
            };
            let found: Vec<bool> = (0..entries.len())
                .map(|i| i < answered && stored(entries[i].0, req))
                .collect();
            self.spec
                .apply_group(&entries, &found, outcome == GroupOutcome::Abandoned);
            let counts = &mut self.counts;
            match outcome {
                GroupOutcome::BackendError => counts.errors += 1,
                GroupOutcome::Short { .. } => counts.short += 1,
                GroupOutcome::Surplus => counts.surplus += 1,
                GroupOutcome::TimedOut => counts.timeouts += 1,
                GroupOutcome::Cancelled => counts.cancelled += 1,
                _ => {}
            }
        }
    }

    /// A lookup of `key` that found an orphan's probe given up (see
    /// [`Reference::notice_given_up`]).
    fn notice_given_up(&mut self, key: Key) {
        let real = self.table().key_state(&key).map(|s| s.generation.get());
        let groups = self
            .unapplied
            .values()
            .map(|(_, entries)| entries.as_slice());
        if let Err(why) = self.spec.notice_given_up(key, real, groups) {
            panic!("{why}");
        }
    }

    fn check(&self, after: &str) {
        if let Err(why) = check_state(self.table(), &self.spec) {
            panic!("after {after}: {why}");
        }
        let stats = self.table().stats();
        let seen = OutcomeCounts {
            errors: stats.backend_errors,
            short: stats.short_results,
            surplus: stats.surplus_results,
            timeouts: stats.timeouts,
            cancelled: stats.cancelled,
        };
        assert_eq!(seen, self.counts, "outcome counters after {after}");
        assert_eq!(stats.backend_panics, 0, "no request panics in this model");
        assert_eq!(
            stats.groups_applied,
            self.next_seq - self.unapplied.len() as u64,
            "groups applied after {after}"
        );
    }
}

/// Keys are drawn from `0..WORKLOAD_KEYS`.
pub const WORKLOAD_KEYS: u64 = 12;

/// A scheduler over a few steps, drawn from `rand` (`rand(n)` is uniform in
/// `0..n`): four live requests share a prefix and add keys of their own;
/// between lookups the scheduler sometimes drains, marks a key a failed
/// load, or ends a request mid-step; after each flush one or two requests end
/// and new ones look up the keys they held (joins of in-flight probes,
/// orphans, fresh generations). Half the runs then wait for every answer
/// (when nothing can hang forever); every run ends with all requests cleaned
/// up and the driver shut down, checked by [`CheckedTasks::finish`].
pub fn workload(rand: &mut dyn FnMut(u64) -> u64, setup: TasksSetup) -> Observed {
    let can_wait = setup.timeout || !setup.acts.contains(&Act::Hang);
    let mut checker = CheckedTasks::new(setup);
    let mut live: Vec<Req> = (0..4).collect();
    let mut next_request = 4;
    for _ in 0..2 + rand(3) {
        let prefix: Vec<Key> = (0..1 + rand(3)).map(|_| rand(WORKLOAD_KEYS)).collect();
        for slot in 0..live.len() {
            let mut keys = prefix.clone();
            keys.extend((0..1 + rand(3)).map(|_| rand(WORKLOAD_KEYS)));
            for key in keys {
                match rand(12) {
                    0 => checker.drain(),
                    1 => checker.mark_miss_keys(&[key]),
                    2 => {
                        let gone = rand(live.len() as u64) as usize;
                        checker.cleanup(live[gone]);
                        live[gone] = next_request;
                        next_request += 1;
                    }
                    _ => {}
                }
                checker.lookup(key, live[slot]);
            }
        }
        checker.flush();
        for _ in 0..1 + rand(2) {
            let gone = live.swap_remove(rand(live.len() as u64) as usize);
            checker.cleanup(gone);
            live.push(next_request);
            next_request += 1;
        }
    }
    if can_wait && rand(2) == 0 {
        checker.wait_idle();
        for &request in &live {
            for key in 0..WORKLOAD_KEYS {
                if checker.table().key_state(&key).is_some() {
                    checker.lookup(key, request);
                }
            }
        }
    }
    checker.finish()
}

/// Behaviour for `requests` requests, drawn from `rand`: mostly answers,
/// with slow ones, errors, short and surplus answers and, if `hangs`, hung
/// calls.
pub fn random_acts(rand: &mut dyn FnMut(u64) -> u64, requests: usize, hangs: bool) -> Vec<Act> {
    (0..requests)
        .map(|_| match rand(12) {
            0..=2 => Act::Slow,
            3 => Act::Error,
            4 => Act::Short,
            5 => Act::Surplus,
            6 if hangs => Act::Hang,
            _ => Act::Answer,
        })
        .collect()
}
