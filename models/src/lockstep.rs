//! The real table and the specification driven by one operation sequence,
//! compared after every operation. Shared by the seeded differential test and
//! the `table_vs_reference` fuzz target.

use arbitrary::Arbitrary;
use kvtier::{Ticket, Verdict, lookup::Group};

use std::time::{Duration, Instant};

use crate::conformance::{Table, check_state, check_verdict};
use crate::reference::{Key, ModelLimits, Reference, Req};

/// One operation on the table. Numbers are reduced into the run's domains
/// (keys, requests, unanswered groups, tickets handed out), so any value is
/// valid; an operation that needs a group or ticket when there is none does
/// nothing.
#[derive(Clone, Debug, Arbitrary)]
pub enum TableOp {
    /// `lookup(key, req)`.
    Lookup {
        /// Reduced modulo the key domain.
        key: u8,
        /// Reduced modulo the request domain.
        req: u8,
    },
    /// `take_submission()`.
    Flush,
    /// `take_submission_at(now)`, `advance` ticks (milliseconds) after the
    /// last timed flush.
    FlushAt {
        /// Time passed since the last timed flush.
        advance: u8,
    },
    /// The prober's [`Group::claim`] on an unanswered group; a group it
    /// gives up is answered `abandoned` at once.
    Claim {
        /// Which unanswered group.
        group: u8,
    },
    /// Answers an unanswered group, in any order: answer `i` is bit `i` of
    /// `bits`; `count` answers are given (modulo the group's length + 2, so
    /// short and surplus answers happen).
    Answer {
        /// Which unanswered group.
        group: u8,
        /// The answers' contents.
        bits: u16,
        /// How many answers.
        count: u8,
    },
    /// `mark_miss` with one of the hit tickets handed out so far.
    MarkMiss {
        /// Which ticket.
        ticket: u8,
    },
    /// `mark_miss_keys(keys)`.
    MarkMissKeys {
        /// Each reduced modulo the key domain.
        keys: Vec<u8>,
    },
    /// `settle(keys, present)`: a store completed or an eviction.
    Settle {
        /// Each reduced modulo the key domain.
        keys: Vec<u8>,
        /// Stored (true) or evicted (false).
        present: bool,
    },
    /// `cleanup(req)`.
    Cleanup {
        /// Reduced modulo the request domain.
        req: u8,
    },
}

/// A group's `(key, generation)` entries, as the specification has them.
type Entries = Vec<(Key, u64)>;

/// A table and the specification side by side.
pub struct Lockstep {
    table: Table,
    spec: Reference,
    keys: u64,
    requests: u64,
    /// Submitted groups not answered yet, in submission order, with their
    /// `(key, generation)` entries.
    unanswered: Vec<(Group<Key, Req>, Entries)>,
    tickets: Vec<Ticket<Key>>,
    /// The clock of timed flushes: tick 0 and the current tick.
    epoch: Instant,
    now: u64,
}

impl Lockstep {
    /// An empty table over `keys` keys and `requests` requests (both ≥ 1),
    /// with the default bounds.
    pub fn new(keys: u64, requests: u64) -> Self {
        Self::with_limits(keys, requests, ModelLimits::default())
    }

    /// An empty table with these bounds (which must be valid).
    pub fn with_limits(keys: u64, requests: u64, limits: ModelLimits) -> Self {
        Self {
            table: Table::with_limits(limits.to_real()).expect("valid model limits"),
            spec: Reference::with_limits(limits),
            keys: keys.max(1),
            requests: requests.max(1),
            unanswered: Vec::new(),
            tickets: Vec::new(),
            epoch: Instant::now(),
            now: 0,
        }
    }

    /// Submitted groups not answered yet.
    pub fn unanswered(&self) -> usize {
        self.unanswered.len()
    }

    /// Length of the `index`-th unanswered group.
    pub fn group_len(&self, index: usize) -> usize {
        self.unanswered
            .get(index)
            .map_or(0, |(group, _)| group.len())
    }

    /// The table under test.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// Hit tickets handed out so far.
    pub fn tickets(&self) -> usize {
        self.tickets.len()
    }

    /// Applies `op` to both sides and compares them.
    pub fn apply(&mut self, op: &TableOp) -> Result<(), String> {
        match op {
            TableOp::Lookup { key, req } => {
                let key = u64::from(*key) % self.keys;
                let req = u64::from(*req) % self.requests;
                let real = self.table.lookup(&key, &req);
                check_verdict(&real, self.spec.lookup(key, req))
                    .map_err(|why| format!("lookup({key}, {req}): {why}"))?;
                if let Verdict::Hit(ticket) = real {
                    self.tickets.push(ticket);
                }
            }
            TableOp::Flush => self.flush(None)?,
            TableOp::FlushAt { advance } => {
                self.now += u64::from(*advance);
                self.flush(Some(self.now))?;
            }
            TableOp::Claim { group } => {
                if !self.unanswered.is_empty() {
                    let index = usize::from(*group) % self.unanswered.len();
                    let (real_group, entries) = &self.unanswered[index];
                    let real = real_group.claim();
                    let spec = self.spec.claim(entries);
                    if real != spec {
                        return Err(format!(
                            "claim of {entries:?}: table {real}, specification {spec}"
                        ));
                    }
                    if !real {
                        let (group, entries) = self.unanswered.remove(index);
                        self.table.apply(group.abandoned());
                        self.spec.apply_group(&entries, &[], true);
                    }
                }
            }
            TableOp::Answer { group, bits, count } => {
                if !self.unanswered.is_empty() {
                    let index = usize::from(*group) % self.unanswered.len();
                    let len = self.group_len(index);
                    let count = usize::from(*count) % (len + 2);
                    let answers = (0..count).map(|i| i < 16 && bits & (1 << i) != 0);
                    self.answer(index, answers.collect())?;
                }
            }
            TableOp::MarkMiss { ticket } => {
                if !self.tickets.is_empty() {
                    let ticket = &self.tickets[usize::from(*ticket) % self.tickets.len()];
                    let real = self.table.mark_miss(ticket);
                    let spec = self
                        .spec
                        .mark_miss(*ticket.key(), ticket.generation().get());
                    if real != spec {
                        return Err(format!(
                            "mark_miss({ticket:?}): table {real}, specification {spec}"
                        ));
                    }
                }
            }
            TableOp::MarkMissKeys { keys } => {
                let keys: Vec<Key> = keys.iter().map(|&k| u64::from(k) % self.keys).collect();
                let real = self.table.mark_miss_keys(&keys);
                let spec = self.spec.mark_miss_keys(&keys);
                if real != spec {
                    return Err(format!(
                        "mark_miss_keys({keys:?}): table {real}, specification {spec}"
                    ));
                }
            }
            TableOp::Settle { keys, present } => {
                let keys: Vec<Key> = keys.iter().map(|&k| u64::from(k) % self.keys).collect();
                let real = self.table.settle(&keys, *present);
                let spec = self.spec.settle(&keys, *present);
                if real != spec {
                    return Err(format!(
                        "settle({keys:?}, {present}): table {real}, specification {spec}"
                    ));
                }
            }
            TableOp::Cleanup { req } => {
                let req = u64::from(*req) % self.requests;
                self.table.cleanup(&req);
                self.spec.cleanup(req);
            }
        }
        check_state(&self.table, &self.spec)
    }

    /// Cleans every request up and answers every group: nothing may remain.
    pub fn finish(&mut self) -> Result<(), String> {
        self.flush(None)?;
        for req in 0..self.requests {
            self.table.cleanup(&req);
            self.spec.cleanup(req);
        }
        while !self.unanswered.is_empty() {
            let len = self.group_len(0);
            self.answer(0, vec![true; len])?;
        }
        check_state(&self.table, &self.spec)?;
        if !self.table.is_empty() {
            return Err(format!("{} keys leaked", self.table.len()));
        }
        Ok(())
    }

    fn flush(&mut self, now: Option<u64>) -> Result<(), String> {
        let expected = self.spec.take_submission_at(now);
        let submission = match now {
            Some(tick) => self
                .table
                .take_submission_at(self.epoch + Duration::from_millis(tick)),
            None => self.table.take_submission(),
        };
        let real: Vec<Group<Key, Req>> = submission.map(|s| s.into_groups()).unwrap_or_default();
        let seen: Vec<(Req, Vec<Key>)> = real
            .iter()
            .map(|g| (*g.request(), g.keys().to_vec()))
            .collect();
        let wanted: Vec<(Req, Vec<Key>)> = expected
            .iter()
            .map(|(r, entries)| (*r, entries.iter().map(|(k, _)| *k).collect()))
            .collect();
        if seen != wanted {
            return Err(format!("submission {seen:?}, specification {wanted:?}"));
        }
        if real.iter().any(Group::is_empty) {
            return Err(format!("an empty group was submitted: {seen:?}"));
        }
        self.unanswered
            .extend(real.into_iter().zip(expected.into_iter().map(|(_, e)| e)));
        Ok(())
    }

    /// Answers one unanswered group; `answers` may be short (the rest miss)
    /// or long (the surplus is ignored).
    fn answer(&mut self, index: usize, answers: Vec<bool>) -> Result<(), String> {
        let (group, model_entries) = self.unanswered.remove(index);
        let result = group.answered(answers.iter().copied());
        // The specification's answer for key i: answer i if given, else a miss.
        let entries: Vec<(Key, u64, bool)> = result
            .entries()
            .enumerate()
            .map(|(i, (key, generation, found))| {
                let expected = answers.get(i).copied().unwrap_or(false);
                (*key, generation.get(), found == expected)
            })
            .collect();
        if let Some((key, ..)) = entries.iter().find(|(_, _, agrees)| !agrees) {
            return Err(format!("answers {answers:?}: key {key} got the wrong one"));
        }
        let submitted: Vec<(Key, u64)> = entries.iter().map(|&(k, g, _)| (k, g)).collect();
        if submitted != model_entries {
            return Err(format!(
                "group entries {submitted:?}, specification {model_entries:?}"
            ));
        }
        self.table.apply(result);
        self.spec.apply_group(&model_entries, &answers, false);
        Ok(())
    }
}
