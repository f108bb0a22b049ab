//! The real threaded driver, checked against the specification after every
//! operation: the oracle of the loom, shuttle and driver-fuzz models.
//!
//! The worker answers groups in submission order and the scheduler applies
//! them in publication order, so at any moment the driver has applied some
//! prefix of the submitted groups. [`LookupStats::groups_applied`] says how long a
//! prefix. After each real call the checker applies the same prefix to the
//! [`Reference`] (with the answers the [`Script`] determines) and then the
//! same operation, and demands the same verdict, the same submission size,
//! the same table contents and the same counters. A group lost, duplicated,
//! reordered or answered with another generation's answer shows up as a
//! difference; so does any verdict the specification does not allow.

use std::collections::VecDeque;

use kvtier::lookup::{GroupOutcome, LookupStats, ThreadLookup, ThreadProber};
use kvtier::{Ticket, Verdict};

use crate::conformance::{check_state, check_verdict};
use crate::driver_state::DriverState;
use crate::reference::{Key, ModelGroup, ModelLimits, Reference, Req};
use crate::scripted::{Fault, Script};

/// The driver under test.
pub type Driver = ThreadLookup<Key, Req>;

/// The table of the driver under test.
pub type Table = kvtier::lookup::LookupTable<Key, Req>;

/// Fault counters the script determines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FaultCounts {
    errors: u64,
    panics: u64,
    short: u64,
    surplus: u64,
}

/// A [`ThreadLookup`] over a [`ScriptedBackend`](crate::scripted::ScriptedBackend), with the specification
/// alongside. Every method panics with a description when the driver and the
/// specification disagree: that is the model's failure.
pub struct CheckedDriver {
    state: DriverState<ThreadProber<Key, Req>>,
    spec: Reference,
    script: Script,
    /// Submitted groups the driver has not applied yet, oldest first.
    unapplied: VecDeque<ModelGroup>,
    /// Backend calls made so far: the worker calls the backend for its
    /// groups in order, except those it gives up (L15).
    calls: u64,
    faults: FaultCounts,
    tickets: Vec<Ticket<Key>>,
}

impl CheckedDriver {
    /// Starts a driver whose backend follows `script`, with the default
    /// bounds.
    pub fn new(script: Script) -> Self {
        Self::with_limits(script, ModelLimits::default())
    }

    /// Starts a driver whose backend follows `script`, with these bounds.
    pub fn with_limits(script: Script, limits: ModelLimits) -> Self {
        let mut driver = ThreadLookup::threaded(script.backend()).expect("start the lookup worker");
        driver
            .set_limits(limits.to_real())
            .expect("valid model limits");
        driver.record_applied(true);
        Self {
            state: DriverState::Open(driver),
            spec: Reference::with_limits(limits),
            script,
            unapplied: VecDeque::new(),
            calls: 0,
            faults: FaultCounts::default(),
            tickets: Vec::new(),
        }
    }

    /// `lookup(key, req)`; checks the verdict. Hits' tickets are kept for
    /// [`mark_miss_ticket`](Self::mark_miss_ticket).
    pub fn lookup(&mut self, key: Key, req: Req) -> Verdict<Key> {
        let real = self.driver().lookup(&key, &req);
        self.catch_up();
        self.notice_given_up(key);
        let expected = self.spec.lookup(key, req);
        if let Err(why) = check_verdict(&real, expected) {
            panic!("lookup({key}, {req}): {why}");
        }
        if let Verdict::Hit(ticket) = &real {
            self.tickets.push(ticket.clone());
        }
        self.check("lookup");
        real
    }

    /// `flush()`; checks how many keys were handed over.
    pub fn flush(&mut self) -> usize {
        let handed = self.driver().flush().expect("driver open");
        self.catch_up();
        let groups = self.spec.take_submission();
        let expected: usize = groups.iter().map(|(_, entries)| entries.len()).sum();
        assert_eq!(handed, expected, "flush handed over {handed} keys");
        self.unapplied.extend(groups);
        self.check("flush");
        handed
    }

    /// `drain()`.
    pub fn drain(&mut self) -> usize {
        let applied = self.driver().drain();
        self.catch_up();
        self.check("drain");
        applied
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

    /// `mark_miss(ticket)`; checks whether it changed anything.
    pub fn mark_miss(&mut self, ticket: &Ticket<Key>) -> bool {
        let changed = self.driver().mark_miss(ticket);
        self.catch_up();
        let expected = self
            .spec
            .mark_miss(*ticket.key(), ticket.generation().get());
        assert_eq!(changed, expected, "mark_miss({ticket:?})");
        self.check("mark_miss");
        changed
    }

    /// `mark_miss` with the `index`-th hit ticket seen so far (modulo their
    /// number); `None` when no hit was seen yet.
    pub fn mark_miss_ticket(&mut self, index: usize) -> Option<bool> {
        if self.tickets.is_empty() {
            return None;
        }
        let ticket = self.tickets[index % self.tickets.len()].clone();
        Some(self.mark_miss(&ticket))
    }

    /// `mark_miss_keys(keys)`.
    pub fn mark_miss_keys(&mut self, keys: &[Key]) -> usize {
        let changed = self.driver().mark_miss_keys(keys);
        self.catch_up();
        assert_eq!(
            changed,
            self.spec.mark_miss_keys(keys),
            "mark_miss_keys({keys:?})"
        );
        self.check("mark_miss_keys");
        changed
    }

    /// `shutdown()`: every submitted group has been applied afterwards.
    /// (That no call follows is the type system's business: `shutdown`
    /// consumes the driver.)
    pub fn shutdown(&mut self) {
        self.state.shut_down();
        self.catch_up();
        assert!(self.unapplied.is_empty(), "shutdown lost submitted groups");
        self.check("shutdown");
    }

    /// Ends the model: cleans up every live request and shuts down (if not
    /// shut down yet), then checks that no anomaly happened, every group was
    /// applied once, nothing is left in flight, and nothing is left at all
    /// unless a request is still live.
    pub fn finish(mut self) -> LookupStats {
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
        let table = self.table();
        for (key, model) in &self.spec.keys {
            assert!(
                !model.requesters.is_empty(),
                "key {key} outlived its requests"
            );
            assert_ne!(
                table.key_state(key).map(|s| s.phase),
                Some(kvtier::lookup::Phase::InFlight),
                "key {key} still in flight after shutdown"
            );
        }
        if self.spec.requests().is_empty() {
            assert!(table.is_empty(), "{} keys leaked", table.len());
        }
        stats
    }

    /// The driver, while it runs.
    fn driver(&mut self) -> &mut Driver {
        self.state.driver()
    }

    /// The driver's table (its final table once shut down).
    pub fn table(&self) -> &Table {
        self.state.table()
    }

    /// Applies to the specification the groups the driver has applied since
    /// the last call, in the order it applied them (submission order): a
    /// group the worker gave up as unwanted, which the specification must
    /// agree nobody wanted, or the next backend call's answers.
    fn catch_up(&mut self) {
        let applied = self.state.take_applied();
        for (_, outcome) in applied {
            let (_, entries) = self
                .unapplied
                .pop_front()
                .expect("the driver applied a group that was never submitted");
            if outcome == GroupOutcome::Abandoned {
                assert!(
                    !self.spec.claim(&entries),
                    "the worker gave up {entries:?}, which a request still wanted"
                );
                self.spec.apply_group(&entries, &[], true);
                continue;
            }
            let call = self.calls;
            self.calls += 1;
            let keys: Vec<Key> = entries.iter().map(|&(key, _)| key).collect();
            let found = self.script.expected(&keys, call);
            self.spec.apply_group(&entries, &found, false);
            match self.script.fault(call) {
                Fault::None => {}
                Fault::Error => self.faults.errors += 1,
                Fault::PanicInCall | Fault::PanicMidway => self.faults.panics += 1,
                Fault::Short => self.faults.short += 1,
                Fault::Surplus => self.faults.surplus += 1,
            }
        }
    }

    /// A lookup of `key` that found an orphan's probe given up (see
    /// [`Reference::notice_given_up`]).
    fn notice_given_up(&mut self, key: Key) {
        let real = self.table().key_state(&key).map(|s| s.generation.get());
        let groups = self.unapplied.iter().map(|(_, entries)| entries.as_slice());
        if let Err(why) = self.spec.notice_given_up(key, real, groups) {
            panic!("{why}");
        }
    }

    fn check(&self, after: &str) {
        if let Err(why) = check_state(self.table(), &self.spec) {
            panic!("after {after}: {why}");
        }
        let stats = self.table().stats();
        let seen = FaultCounts {
            errors: stats.backend_errors,
            panics: stats.backend_panics,
            short: stats.short_results,
            surplus: stats.surplus_results,
        };
        assert_eq!(seen, self.faults, "fault counters after {after}");
    }
}
