//! The sans-IO lookup table: every rule of the protocol, no threads inside.

use std::collections::HashMap;
use std::hash::Hash;
use std::mem;

use super::stats::Stats;
use super::submission::{Group, GroupOutcome, GroupResult, Submission};
use super::types::{Generation, KeyState, Phase, Request, Ticket, Verdict};

/// One key's lookup state.
struct Entry<I> {
    generation: Generation,
    phase: Phase,
    /// Live requests that asked for the key, each once.
    requesters: Vec<I>,
}

/// What the table remembers of a live request.
struct RequestEntry<K> {
    /// Reverse index: the keys whose `requesters` contain this request, each once.
    keys: Vec<K>,
}

/// The scheduler-owned state of the async lookup protocol.
///
/// Plain `&mut self` methods, no threads, clocks or I/O: whoever owns the
/// table decides when keys go to a backend and when answers come back. The
/// threaded [`AsyncLookup`](crate::AsyncLookup) is one such owner; a test, a
/// model checker or a custom driver can be another.
///
/// The cycle of one scheduler step:
///
/// ```
/// use kvtier::{LookupTable, Verdict};
///
/// let mut table: LookupTable<u64, String> = LookupTable::new();
/// let request = "req-1".to_string();
///
/// // Unknown keys are pending until the tier has been asked.
/// assert_eq!(table.lookup(&7, &request), Verdict::Pending);
/// assert_eq!(table.lookup(&8, &request), Verdict::Pending);
///
/// // End of step: the new keys, grouped by request, go to a backend ...
/// let submission = table.take_submission().expect("two new keys");
/// for group in submission.into_groups() {
///     let answers: Vec<bool> = group.keys().iter().map(|key| key % 2 == 1).collect();
///     // ... and each group's answers come back, possibly much later.
///     table.apply(group.answered(answers));
/// }
///
/// let Verdict::Hit(ticket) = table.lookup(&7, &request) else { panic!("7 is odd") };
/// assert_eq!(table.lookup(&8, &request), Verdict::Miss);
///
/// // Loading block 7 failed: stop offering it, without re-probing.
/// assert!(table.mark_miss(&ticket));
/// assert_eq!(table.lookup(&7, &request), Verdict::Miss);
///
/// table.cleanup(&request);
/// assert!(table.is_empty());
/// ```
pub struct LookupTable<K, R: Request> {
    states: HashMap<K, Entry<R::Id>>,
    requests: HashMap<R::Id, RequestEntry<K>>,
    /// This step's new keys, grouped by request in first-appearance order.
    batch: Vec<Group<K, R>>,
    /// Index in `batch` of each request's group. Kept apart from
    /// `requests` so a request cleaned up and seen again within one step
    /// still gets one group.
    batch_groups: HashMap<R::Id, usize>,
    next_generation: u64,
    stats: Stats,
    /// `(seq, outcome)` of every applied group, in application order, while
    /// recording is on (see [`LookupTable::record_applied`]).
    applied_log: Option<Vec<(u64, GroupOutcome)>>,
}

impl<K, R: Request> Default for LookupTable<K, R> {
    fn default() -> Self {
        Self {
            states: HashMap::new(),
            requests: HashMap::new(),
            batch: Vec::new(),
            batch_groups: HashMap::new(),
            next_generation: 0,
            stats: Stats::default(),
            applied_log: None,
        }
    }
}

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// What the tier knows about `key`, recording that `request` asked.
    ///
    /// An unknown key gets a fresh state (a new [`Generation`]) and joins this
    /// step's batch under `request`'s group; it is [`Verdict::Pending`] until
    /// its result is applied. A known key is never batched again: a second
    /// request asking for it shares the probe already pending or in flight.
    pub fn lookup(&mut self, key: &K, request: &R) -> Verdict<K> {
        self.stats.lookups += 1;
        let id = request.id();
        let (phase, generation) = match self.states.get_mut(key) {
            Some(state) => {
                if !state.requesters.contains(id) {
                    state.requesters.push(id.clone());
                    Self::request_entry(&mut self.requests, id)
                        .keys
                        .push(key.clone());
                }
                (state.phase, state.generation)
            }
            None => {
                let generation = Generation(self.next_generation);
                self.next_generation += 1;
                self.states.insert(
                    key.clone(),
                    Entry {
                        generation,
                        phase: Phase::Pending,
                        requesters: vec![id.clone()],
                    },
                );
                Self::request_entry(&mut self.requests, id)
                    .keys
                    .push(key.clone());
                let batch = &mut self.batch;
                let index = *self.batch_groups.entry(id.clone()).or_insert_with(|| {
                    batch.push(Group::new(request.clone()));
                    batch.len() - 1
                });
                let group = &mut self.batch[index];
                group.keys.push(key.clone());
                group.generations.push(generation);
                (Phase::Pending, generation)
            }
        };
        match phase {
            Phase::Pending | Phase::InFlight => {
                self.stats.pending += 1;
                Verdict::Pending
            }
            Phase::Resolved { found: true } => {
                self.stats.hits += 1;
                Verdict::Hit(Ticket {
                    key: key.clone(),
                    generation,
                })
            }
            Phase::Resolved { found: false } => {
                self.stats.misses += 1;
                Verdict::Miss
            }
        }
    }

    fn request_entry<'a>(
        requests: &'a mut HashMap<R::Id, RequestEntry<K>>,
        id: &R::Id,
    ) -> &'a mut RequestEntry<K> {
        requests
            .entry(id.clone())
            .or_insert_with(|| RequestEntry { keys: Vec::new() })
    }

    /// Ends the step: takes the keys looked up for the first time since the
    /// last call, grouped by request, and marks them in flight.
    ///
    /// Entries whose state was cleaned up (or cleaned up and created anew)
    /// since their lookup are left out; `None` when nothing is left, so an
    /// empty submission never reaches the worker.
    pub fn take_submission(&mut self) -> Option<Submission<K, R>> {
        self.batch_groups.clear();
        let mut groups = mem::take(&mut self.batch);
        groups.retain_mut(|group| {
            let mut kept = 0;
            for i in 0..group.keys.len() {
                let generation = group.generations[i];
                let Some(state) = self.states.get_mut(&group.keys[i]) else {
                    continue; // cleaned up before the flush
                };
                if state.generation != generation {
                    continue; // cleaned up and looked up again: the newer entry stands
                }
                if state.phase != Phase::Pending {
                    // Only this method moves a state out of Pending, and each
                    // generation is batched once, so this cannot happen.
                    self.stats.anomalies += 1;
                    tracing::error!(?generation, phase = ?state.phase, "batched key is not pending");
                    continue;
                }
                state.phase = Phase::InFlight;
                group.keys.swap(kept, i);
                group.generations.swap(kept, i);
                kept += 1;
            }
            group.keys.truncate(kept);
            group.generations.truncate(kept);
            kept > 0
        });
        if groups.is_empty() {
            return None;
        }
        for (seq, group) in (self.stats.groups_submitted..).zip(&mut groups) {
            group.seq = seq;
        }
        self.stats.groups_submitted += groups.len() as u64;
        self.stats.keys_submitted += groups.iter().map(|g| g.len() as u64).sum::<u64>();
        Some(Submission { groups })
    }

    /// Applies one group's answers.
    ///
    /// An answer whose key is gone, or whose generation is not the state's, is
    /// stale and dropped. An answer for a state nobody waits for any more (an
    /// orphan: every requester was cleaned up in flight) removes the state.
    /// Otherwise the state becomes resolved.
    pub fn apply(&mut self, result: GroupResult<K>) {
        self.stats.groups_applied += 1;
        match result.outcome {
            GroupOutcome::Answered => {}
            GroupOutcome::Short { .. } => self.stats.short_results += 1,
            GroupOutcome::Surplus => self.stats.surplus_results += 1,
            GroupOutcome::BackendError => self.stats.backend_errors += 1,
            GroupOutcome::BackendPanic { .. } => self.stats.backend_panics += 1,
            GroupOutcome::TimedOut => self.stats.timeouts += 1,
            GroupOutcome::Cancelled => self.stats.cancelled += 1,
        }
        if let Some(log) = &mut self.applied_log {
            log.push((result.seq, result.outcome));
        }
        let entries = result
            .keys
            .into_iter()
            .zip(result.generations)
            .zip(result.found);
        for ((key, generation), found) in entries {
            let Some(state) = self.states.get_mut(&key) else {
                self.stats.stale_results += 1;
                continue;
            };
            if state.generation != generation {
                // L3: a late answer for an older incarnation of the key.
                self.stats.stale_results += 1;
                continue;
            }
            if state.phase != Phase::InFlight {
                // A generation is submitted once and answered once, and
                // nothing but this method leaves InFlight: unreachable unless
                // a result is applied twice.
                self.stats.anomalies += 1;
                tracing::error!(?generation, phase = ?state.phase, "result for a state that is not in flight");
                continue;
            }
            if state.requesters.is_empty() {
                self.states.remove(&key);
                self.stats.orphans_dropped += 1;
                continue;
            }
            state.phase = Phase::Resolved { found };
        }
    }

    /// Turns the hit recorded by `ticket` into a miss, after its load failed.
    ///
    /// Only the exact generation that resolved as a hit is touched: if the key
    /// was cleaned up and looked up again since, the ticket is stale and this
    /// is a no-op, so a late failure cannot corrupt a newer lookup. Returns
    /// whether the verdict changed.
    pub fn mark_miss(&mut self, ticket: &Ticket<K>) -> bool {
        match self.states.get_mut(&ticket.key) {
            Some(state)
                if state.generation == ticket.generation
                    && state.phase == (Phase::Resolved { found: true }) =>
            {
                state.phase = Phase::Resolved { found: false };
                self.stats.marked_miss += 1;
                true
            }
            _ => false,
        }
    }

    /// Turns resolved hits of `keys` into misses, for callers that only kept
    /// keys. Pending and in-flight states are never touched (their answer is
    /// still to come, for a newer lookup than the failed load). Returns how
    /// many verdicts changed.
    pub fn mark_miss_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> usize
    where
        K: 'k,
    {
        let mut changed = 0;
        for key in keys {
            if let Some(state) = self.states.get_mut(key)
                && state.phase == (Phase::Resolved { found: true })
            {
                state.phase = Phase::Resolved { found: false };
                changed += 1;
            }
        }
        self.stats.marked_miss += changed as u64;
        changed
    }

    /// Forgets request `id`: it no longer holds any key.
    ///
    /// A key left without requesters is removed, unless its probe is in
    /// flight: that state stays (an orphan) so a later request for the same
    /// key shares the probe instead of submitting a second one; if nobody
    /// joins, its answer removes it. Unknown ids are a no-op.
    pub fn cleanup(&mut self, id: &R::Id) {
        let Some(entry) = self.requests.remove(id) else {
            return;
        };
        for key in entry.keys {
            let Some(state) = self.states.get_mut(&key) else {
                continue;
            };
            if let Some(position) = state.requesters.iter().position(|r| r == id) {
                state.requesters.swap_remove(position);
            }
            if state.requesters.is_empty() && state.phase != Phase::InFlight {
                self.states.remove(&key);
            }
        }
    }

    /// Starts (or stops) recording which groups are applied, in order, with
    /// their outcomes; [`take_applied`](Self::take_applied) hands the record
    /// over. Off by default. For checkers and debugging: with groups
    /// answered concurrently the record is the only way to know the order in
    /// which answers reached the table.
    pub fn record_applied(&mut self, on: bool) {
        self.applied_log = on.then(Vec::new);
    }

    /// `(seq, outcome)` of every group applied since recording started or
    /// since the last call, in application order (empty when not recording).
    pub fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.applied_log.as_mut().map(mem::take).unwrap_or_default()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The state of `key`, if the table tracks it.
    pub fn key_state(&self, key: &K) -> Option<KeyState> {
        self.states.get(key).map(|state| KeyState {
            generation: state.generation,
            phase: state.phase,
            requesters: state.requesters.len(),
        })
    }

    /// Number of keys tracked (including orphaned in-flight probes).
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Number of live requests (looked up at least one key, not cleaned up).
    pub fn request_count(&self) -> usize {
        self.requests.len()
    }

    /// True when the table tracks no key and no request: the state after every
    /// request was cleaned up and every submitted group's result applied.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty() && self.requests.is_empty()
    }

    /// Checks the table's structural invariants (reverse index and
    /// requester lists agree, no state is left without requesters unless its
    /// probe is in flight). For tests and models; `Err` names the violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (id, entry) in &self.requests {
            for key in &entry.keys {
                let Some(state) = self.states.get(key) else {
                    return Err(format!("request {id:?} holds a key with no state"));
                };
                if !state.requesters.contains(id) {
                    return Err(format!("request {id:?} holds a key that does not list it"));
                }
            }
        }
        let mut links = 0;
        for state in self.states.values() {
            if state.requesters.is_empty() && state.phase != Phase::InFlight {
                return Err(format!(
                    "state {:?} has no requesters but is {:?}",
                    state.generation, state.phase
                ));
            }
            for id in &state.requesters {
                if !self.requests.contains_key(id) {
                    return Err(format!(
                        "state {:?} lists unknown request {id:?}",
                        state.generation
                    ));
                }
            }
            links += state.requesters.len();
        }
        let reverse_links: usize = self.requests.values().map(|e| e.keys.len()).sum();
        if links != reverse_links {
            return Err(format!(
                "{links} requester links but {reverse_links} reverse-index links (a duplicate)"
            ));
        }
        Ok(())
    }
}

/// Results the public API cannot produce (a duplicate, a foreign
/// generation), built by hand to show the table's last-line guards.
#[cfg(test)]
mod tests {
    use super::*;

    fn result_for(key: u64, generation: Generation, found: bool) -> GroupResult<u64> {
        GroupResult {
            seq: 0,
            keys: vec![key],
            generations: vec![generation],
            found: vec![found],
            outcome: GroupOutcome::Answered,
        }
    }

    fn in_flight(table: &mut LookupTable<u64, u64>, key: u64, request: u64) -> Generation {
        table.lookup(&key, &request);
        table.take_submission().expect("a new key");
        table.key_state(&key).expect("tracked").generation
    }

    #[test]
    fn a_result_for_another_generation_is_dropped_as_stale() {
        let mut table = LookupTable::<u64, u64>::new();
        let current = in_flight(&mut table, 5, 1);
        table.apply(result_for(5, Generation(current.0 + 1), true));
        table.apply(result_for(6, current, true)); // no such key
        assert_eq!(table.stats().stale_results, 2);
        assert_eq!(table.key_state(&5).unwrap().phase, Phase::InFlight);
        table.apply(result_for(5, current, false));
        assert_eq!(table.lookup(&5, &1), Verdict::Miss);
        assert_eq!(table.stats().anomalies, 0);
    }

    #[test]
    fn a_duplicate_result_is_counted_as_an_anomaly_and_changes_nothing() {
        let mut table = LookupTable::<u64, u64>::new();
        let generation = in_flight(&mut table, 5, 1);
        table.apply(result_for(5, generation, true));
        table.apply(result_for(5, generation, false));
        assert_eq!(table.stats().anomalies, 1);
        assert!(table.lookup(&5, &1).is_hit(), "the first answer stands");
    }

    #[test]
    fn a_result_for_a_pending_state_is_an_anomaly() {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        let generation = table.key_state(&5).unwrap().generation;
        table.apply(result_for(5, generation, true));
        assert_eq!(table.stats().anomalies, 1);
        assert_eq!(table.key_state(&5).unwrap().phase, Phase::Pending);
        // The key is still submitted and resolved normally afterwards.
        let group = table.take_submission().unwrap().into_groups().remove(0);
        table.apply(group.answered([true]));
        assert!(table.lookup(&5, &1).is_hit());
    }

    #[test]
    fn a_batched_key_that_is_not_pending_is_an_anomaly_and_not_submitted() {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        table.lookup(&6, &1);
        // Corrupted by hand: only take_submission moves a state out of Pending.
        table.states.get_mut(&5).unwrap().phase = Phase::Resolved { found: true };
        let submission = table.take_submission().expect("key 6 is still new");
        assert_eq!(submission.groups()[0].keys(), [6]);
        assert_eq!(table.stats().anomalies, 1);
    }

    /// A table with two requests sharing key 5 and request 2 holding key 6.
    fn populated() -> LookupTable<u64, u64> {
        let mut table = LookupTable::<u64, u64>::new();
        table.lookup(&5, &1);
        table.lookup(&5, &2);
        table.lookup(&6, &2);
        table.check_invariants().expect("a consistent table");
        table
    }

    #[test]
    fn check_invariants_reports_each_kind_of_corruption() {
        // Corrupted by hand: the public API cannot produce any of these.
        let mut table = populated();
        table.requests.get_mut(&1).unwrap().keys.push(7);
        assert!(table.check_invariants().unwrap_err().contains("no state"));

        let mut table = populated();
        table.states.get_mut(&6).unwrap().requesters.clear();
        let error = table.check_invariants().unwrap_err();
        assert!(error.contains("does not list it"), "{error}");

        let mut table = populated();
        table.requests.remove(&1);
        let error = table.check_invariants().unwrap_err();
        assert!(error.contains("lists unknown request"), "{error}");

        let mut table = populated();
        table.requests.remove(&1);
        table
            .states
            .get_mut(&5)
            .unwrap()
            .requesters
            .retain(|&id| id == 2);
        table.states.get_mut(&6).unwrap().requesters.clear();
        table
            .requests
            .get_mut(&2)
            .unwrap()
            .keys
            .retain(|&key| key == 5);
        let error = table.check_invariants().unwrap_err();
        assert!(error.contains("no requesters"), "{error}");

        let mut table = populated();
        table.states.get_mut(&5).unwrap().requesters.push(2);
        let error = table.check_invariants().unwrap_err();
        assert!(error.contains("a duplicate"), "{error}");
    }
}
