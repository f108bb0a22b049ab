//! The lookup protocol as a specification: what every operation must do,
//! written for clarity, not speed.
//!
//! Deliberately unlike the real table: ordered maps instead of hash maps, no
//! reverse index (cleanup scans every key), the step's batch as a flat list
//! grouped only when it is taken, a deadline checked key by key (the table
//! moves a watermark), admission counted from the groups handed out, and
//! whether a group is wanted decided by looking at its keys (the table keeps
//! a counter). Only the observable behaviour is shared: verdicts,
//! submissions, key states and the counters that follow from them.

use std::collections::{BTreeMap, BTreeSet};

/// Keys and requests are small integers in the model.
pub type Key = u64;
/// A request id (the request is its id).
pub type Req = u64;

/// Where a key's lookup stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Looked up this step, not yet submitted.
    Pending,
    /// Submitted, no answer applied yet.
    InFlight,
    /// In flight past its pending budget.
    Overdue,
    /// Answered.
    Resolved(bool),
}

/// What a lookup must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// A hit of this generation.
    Hit(u64),
    /// A miss.
    Miss,
    /// Not known yet.
    Pending,
}

/// One key's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyModel {
    /// Unique per incarnation of the key.
    pub generation: u64,
    /// Where its lookup stands.
    pub phase: Phase,
    /// Live requests that asked for it.
    pub requesters: BTreeSet<Req>,
    /// The step that created it.
    pub step: u64,
    /// When that step started (set when the step ends), if known.
    pub started: Option<u64>,
}

/// The bounds of [`LookupLimits`](kvtier::lookup::LookupLimits), with time
/// in abstract ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelLimits {
    /// Budget in steps.
    pub pending_steps: Option<u64>,
    /// Budget in ticks.
    pub pending_time: Option<u64>,
    /// Keys pending or handed out, at most.
    pub max_keys: usize,
    /// Groups pending or handed out, at most.
    pub max_groups: usize,
    /// Groups nobody wants are not probed.
    pub skip_unwanted: bool,
}

impl Default for ModelLimits {
    /// The table's defaults.
    fn default() -> Self {
        Self {
            pending_steps: None,
            pending_time: None,
            max_keys: 1 << 20,
            max_groups: 1 << 16,
            skip_unwanted: true,
        }
    }
}

impl ModelLimits {
    /// The same bounds for the real table, a tick being a millisecond.
    pub fn to_real(self) -> kvtier::lookup::LookupLimits {
        kvtier::lookup::LookupLimits::default()
            .pending_steps(self.pending_steps)
            .pending_time(self.pending_time.map(std::time::Duration::from_millis))
            .max_outstanding_keys(self.max_keys)
            .max_outstanding_groups(self.max_groups)
            .skip_unwanted(self.skip_unwanted)
    }
}

/// A submitted group: the request and its `(key, generation)` entries.
pub type ModelGroup = (Req, Vec<(Key, u64)>);

/// Counters the specification determines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Lookups, and how each was answered.
    pub lookups: u64,
    /// Lookups answered with a hit.
    pub hits: u64,
    /// Lookups answered with a miss.
    pub misses: u64,
    /// Lookups answered "pending".
    pub pending: u64,
    /// Keys submitted.
    pub keys_submitted: u64,
    /// Groups submitted.
    pub groups_submitted: u64,
    /// Answers dropped for a missing key or another generation.
    pub stale_results: u64,
    /// Answers that removed an orphaned in-flight key.
    pub orphans_dropped: u64,
    /// Hits turned into misses.
    pub marked_miss: u64,
    /// Lookups answered a miss because the key was overdue.
    pub deadline_misses: u64,
    /// Answers that resolved an overdue key.
    pub late_answers: u64,
    /// New keys refused by admission.
    pub shed: u64,
    /// Groups given up unprobed.
    pub abandoned: u64,
    /// States a completed store settled.
    pub settled_hits: u64,
    /// States an eviction settled.
    pub settled_misses: u64,
}

/// The specification's state.
#[derive(Clone, Debug, Default)]
pub struct Reference {
    /// Every tracked key.
    pub keys: BTreeMap<Key, KeyModel>,
    next_generation: u64,
    /// This step's new keys, in lookup order.
    batch: Vec<(Req, Key, u64)>,
    /// The bounds.
    pub limits: ModelLimits,
    /// Keys and groups handed out and not answered.
    pub outstanding_keys: usize,
    /// Groups handed out and not answered.
    pub outstanding_groups: usize,
    /// Steps ended so far.
    steps: u64,
    /// The time of the last timed flush.
    step_started: Option<u64>,
    /// `(key, generation)` of every probe a prober gave up.
    given_up: BTreeSet<(Key, u64)>,
    /// Requests that looked up a key which was shed: registered like any
    /// request that asked, until cleaned up.
    shed_requests: BTreeSet<Req>,
    /// Counters.
    pub counts: ModelCounts,
}

impl Reference {
    /// An empty specification state with the table's default bounds.
    pub fn new() -> Self {
        Self::with_limits(ModelLimits::default())
    }

    /// An empty specification state with these bounds.
    pub fn with_limits(limits: ModelLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// A lookup: an orphan whose probe was given up or is overdue is
    /// forgotten first; an unknown key starts a new generation and is
    /// batched, if admission has room (else the answer is a miss and nothing
    /// is kept); the request is recorded; the answer is whatever the key's
    /// phase says.
    pub fn lookup(&mut self, key: Key, req: Req) -> Expected {
        self.counts.lookups += 1;
        if let Some(state) = self.keys.get(&key)
            && state.requesters.is_empty()
            && (state.phase == Phase::Overdue || self.given_up.contains(&(key, state.generation)))
        {
            self.keys.remove(&key);
        }
        if !self.keys.contains_key(&key) {
            let pending = self
                .keys
                .values()
                .filter(|s| s.phase == Phase::Pending)
                .count();
            let batch_groups: BTreeSet<Req> = self.batch.iter().map(|&(r, _, _)| r).collect();
            let room_for_key = pending + self.outstanding_keys < self.limits.max_keys;
            let room_for_group = batch_groups.contains(&req)
                || batch_groups.len() + self.outstanding_groups < self.limits.max_groups;
            if !(room_for_key && room_for_group) {
                self.shed_requests.insert(req);
                self.counts.misses += 1;
                self.counts.shed += 1;
                return Expected::Miss;
            }
            let generation = self.next_generation;
            self.next_generation += 1;
            self.keys.insert(
                key,
                KeyModel {
                    generation,
                    phase: Phase::Pending,
                    requesters: BTreeSet::new(),
                    step: self.steps,
                    started: None,
                },
            );
            self.batch.push((req, key, generation));
        }
        let state = self.keys.get_mut(&key).expect("inserted above");
        state.requesters.insert(req);
        let expected = match state.phase {
            Phase::Pending | Phase::InFlight => Expected::Pending,
            Phase::Resolved(true) => Expected::Hit(state.generation),
            Phase::Resolved(false) | Phase::Overdue => Expected::Miss,
        };
        if state.phase == Phase::Overdue {
            self.counts.deadline_misses += 1;
        }
        match expected {
            Expected::Hit(_) => self.counts.hits += 1,
            Expected::Miss => self.counts.misses += 1,
            Expected::Pending => self.counts.pending += 1,
        }
        expected
    }

    /// A flush: batch entries still current become in flight, grouped by
    /// request; groups are ordered by the request's first new key of the step
    /// (even if that key was cleaned up since), and empty groups are dropped.
    pub fn take_submission(&mut self) -> Vec<ModelGroup> {
        self.take_submission_at(None)
    }

    /// [`take_submission`](Self::take_submission) for a step ending at
    /// tick `now` (if the flush says): then every in-flight key whose step
    /// ended `pending_steps` steps ago, or started `pending_time` ticks ago,
    /// is overdue.
    pub fn take_submission_at(&mut self, now: Option<u64>) -> Vec<ModelGroup> {
        let started = self.step_started.or(now);
        if now.is_some() {
            self.step_started = now;
        }
        let this_step = self.steps;
        self.steps += 1;
        for state in self.keys.values_mut() {
            if state.step == this_step && state.phase == Phase::Pending {
                state.started = started;
            }
            // Keys of steps that ended before any flush said the time count
            // from the first one that does.
            if state.started.is_none() && state.step < this_step {
                state.started = now;
            }
        }
        let mut groups: Vec<ModelGroup> = Vec::new();
        for (req, key, generation) in std::mem::take(&mut self.batch) {
            let index = match groups.iter().position(|(r, _)| *r == req) {
                Some(index) => index,
                None => {
                    groups.push((req, Vec::new()));
                    groups.len() - 1
                }
            };
            let current = self
                .keys
                .get(&key)
                .is_some_and(|s| s.generation == generation && s.phase == Phase::Pending);
            if current {
                self.keys.get_mut(&key).expect("checked").phase = Phase::InFlight;
                groups[index].1.push((key, generation));
            }
        }
        groups.retain(|(_, entries)| !entries.is_empty());
        let keys: usize = groups.iter().map(|(_, e)| e.len()).sum();
        self.counts.groups_submitted += groups.len() as u64;
        self.counts.keys_submitted += keys as u64;
        self.outstanding_groups += groups.len();
        self.outstanding_keys += keys;
        let (steps, limits) = (self.steps, self.limits);
        for state in self.keys.values_mut() {
            let by_steps = limits
                .pending_steps
                .is_some_and(|budget| steps - state.step >= budget);
            let by_time = match (limits.pending_time, state.started, now) {
                (Some(budget), Some(started), Some(now)) => now - started >= budget,
                _ => false,
            };
            if state.phase == Phase::InFlight && (by_steps || by_time) {
                state.phase = Phase::Overdue;
            }
        }
        groups
    }

    /// Whether the prober probes the group with these entries: yes, unless
    /// unwanted groups are skipped and none of its keys still has a
    /// requester in the generation it was submitted for, or it was given up
    /// before (given up for good, then).
    pub fn claim(&mut self, entries: &[(Key, u64)]) -> bool {
        if !self.limits.skip_unwanted {
            return true;
        }
        if entries.iter().any(|entry| self.given_up.contains(entry)) {
            return false;
        }
        let wanted = entries.iter().any(|(key, generation)| {
            self.keys
                .get(key)
                .is_some_and(|s| s.generation == *generation && !s.requesters.is_empty())
        });
        if !wanted {
            self.given_up.extend(entries.iter().copied());
        }
        wanted
    }

    /// The generation of `key`'s state if it is an orphan still in flight:
    /// a probe a prober may give up (see [`claim`](Self::claim)).
    pub fn orphan(&self, key: Key) -> Option<u64> {
        self.keys
            .get(&key)
            .filter(|s| s.requesters.is_empty() && s.phase == Phase::InFlight)
            .map(|s| s.generation)
    }

    /// A concurrent driver's lookup of `key` left the real table at
    /// generation `real` (`None`: no state). Where the specification still
    /// has `key` as an orphan of another generation, the prober had given
    /// that orphan's group (one of `groups`, the ones not applied yet) up
    /// before the join, its result still on its way: the specification must
    /// agree that nobody wanted it. Call before [`lookup`](Self::lookup).
    pub fn notice_given_up<'a>(
        &mut self,
        key: Key,
        real: Option<u64>,
        groups: impl IntoIterator<Item = &'a [(Key, u64)]>,
    ) -> Result<(), String> {
        let Some(generation) = self.orphan(key) else {
            return Ok(());
        };
        if real == Some(generation) {
            return Ok(()); // joined
        }
        let entries = groups
            .into_iter()
            .find(|entries| entries.contains(&(key, generation)))
            .ok_or_else(|| format!("orphan {key} in flight is in no unapplied group"))?
            .to_vec();
        if self.claim(&entries) {
            return Err(format!(
                "a join of key {key} found {entries:?} given up, which a request still wanted"
            ));
        }
        Ok(())
    }

    /// A group's result arriving: answer `i` for entry `i` (a miss where
    /// `found` is short); `abandoned` when the prober gave it up.
    pub fn apply_group(&mut self, entries: &[(Key, u64)], found: &[bool], abandoned: bool) {
        self.outstanding_groups -= 1;
        self.outstanding_keys -= entries.len();
        if abandoned {
            self.counts.abandoned += 1;
        }
        for (i, &(key, generation)) in entries.iter().enumerate() {
            self.apply(key, generation, found.get(i).copied().unwrap_or(false));
        }
    }

    /// One answer arriving for `(key, generation)`.
    fn apply(&mut self, key: Key, generation: u64, found: bool) {
        let Some(state) = self.keys.get_mut(&key) else {
            self.counts.stale_results += 1;
            return;
        };
        if state.generation != generation {
            self.counts.stale_results += 1;
            return;
        }
        assert!(
            matches!(state.phase, Phase::InFlight | Phase::Overdue),
            "spec: one answer per submitted generation"
        );
        if state.requesters.is_empty() {
            self.keys.remove(&key);
            self.counts.orphans_dropped += 1;
        } else {
            if state.phase == Phase::Overdue {
                self.counts.late_answers += 1;
            }
            state.phase = Phase::Resolved(found);
        }
    }

    /// A failed load of the hit of `generation`.
    pub fn mark_miss(&mut self, key: Key, generation: u64) -> bool {
        match self.keys.get_mut(&key) {
            Some(state)
                if state.generation == generation && state.phase == Phase::Resolved(true) =>
            {
                state.phase = Phase::Resolved(false);
                self.counts.marked_miss += 1;
                true
            }
            _ => false,
        }
    }

    /// Failed loads reported by key: resolved hits only.
    pub fn mark_miss_keys(&mut self, keys: &[Key]) -> usize {
        let mut changed = 0;
        for key in keys {
            if let Some(state) = self.keys.get_mut(key)
                && state.phase == Phase::Resolved(true)
            {
                state.phase = Phase::Resolved(false);
                changed += 1;
            }
        }
        self.counts.marked_miss += changed as u64;
        changed
    }

    /// The tier says it holds (`present`) or no longer holds `keys`: a
    /// tracked key not already resolved that way is resolved so under a
    /// new generation (its probe's answer, batched entry and tickets all
    /// become stale), except an orphan still probing, which is forgotten.
    pub fn settle(&mut self, keys: &[Key], present: bool) -> usize {
        let mut changed = 0;
        for key in keys {
            let Some(state) = self.keys.get_mut(key) else {
                continue;
            };
            if state.phase == Phase::Resolved(present) {
                continue;
            }
            changed += 1;
            let probing = matches!(state.phase, Phase::InFlight | Phase::Overdue);
            if probing && state.requesters.is_empty() {
                self.keys.remove(key);
                continue;
            }
            state.generation = self.next_generation;
            self.next_generation += 1;
            state.phase = Phase::Resolved(present);
        }
        if present {
            self.counts.settled_hits += changed as u64;
        } else {
            self.counts.settled_misses += changed as u64;
        }
        changed
    }

    /// A request ends: it leaves every key; keys it leaves alone go, unless
    /// in flight and not overdue.
    pub fn cleanup(&mut self, req: Req) {
        self.shed_requests.remove(&req);
        // Only the keys the request leaves: an orphan that went overdue
        // after its requests left stays until its answer (or a new lookup)
        // removes it.
        self.keys.retain(|_, state| {
            !state.requesters.remove(&req)
                || !state.requesters.is_empty()
                || state.phase == Phase::InFlight
        });
    }

    /// Live requests: those holding at least one key, and those whose
    /// lookups were shed.
    pub fn requests(&self) -> BTreeSet<Req> {
        self.keys
            .values()
            .flat_map(|s| s.requesters.iter().copied())
            .chain(self.shed_requests.iter().copied())
            .collect()
    }
}
