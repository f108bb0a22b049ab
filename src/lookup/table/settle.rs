//! What the tier itself says about a key: a store that completed or an
//! eviction that removed the block settles the key's state without a probe.
//!
//! The rule (invariant L18 in docs/design.md): a settled state that changes
//! gets a new generation, so everything issued for the old one is stale.
//! A probe in flight answers for the old generation (dropped by the L2
//! check), a batched key's old generation is left out of the flush (the
//! L1 mechanism), and a ticket of the old hit no longer marks anything a
//! miss (L4). What the tier said last wins, whatever the order in which
//! older answers arrive.

use std::hash::Hash;

use super::state::LookupTable;
use super::step::lose_interest;
use crate::lookup::types::{Generation, Phase, Request};

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// Tells the table that the tier now holds (`present`) or no longer
    /// holds (`!present`) the blocks of `keys`: a store of them completed,
    /// or an eviction removed them. Returns how many states changed.
    ///
    /// For each key the table tracks:
    ///
    /// - pending, in flight or overdue: resolved now, as a hit when
    ///   present and a miss when not, under a new generation; the probe's
    ///   answer, whenever it comes, is stale. A key nobody asks for any more
    ///   (an orphaned probe) is forgotten instead;
    /// - resolved the other way: turned around, under a new generation (a
    ///   ticket of the old hit can no longer mark it a miss);
    /// - resolved the same way: unchanged, its tickets still valid.
    ///
    /// Keys the table does not track are ignored: a later lookup probes
    /// them. Feed the tier's changes in the order they happened; the last
    /// one said for a key is what later lookups see.
    ///
    /// ```
    /// use kvtier::Verdict;
    /// use kvtier::lookup::LookupTable;
    ///
    /// let mut table: LookupTable<u64, u64> = LookupTable::new();
    /// assert_eq!(table.lookup(&5, &1), Verdict::Pending);
    /// let submission = table.take_submission().unwrap(); // the probe of 5 starts
    ///
    /// table.settle([&5], true); // meanwhile a save of block 5 completes
    /// assert!(table.lookup(&5, &1).is_hit());
    ///
    /// // The probe looked before the save: its "absent" is stale.
    /// for group in submission.into_groups() {
    ///     table.apply(group.answered([false]));
    /// }
    /// let Verdict::Hit(ticket) = table.lookup(&5, &1) else { panic!("still a hit") };
    ///
    /// table.settle([&5], false); // the tier evicts block 5
    /// assert_eq!(table.lookup(&5, &1), Verdict::Miss);
    /// assert!(!table.mark_miss(&ticket)); // the old hit's ticket is stale
    /// ```
    pub fn settle<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>, present: bool) -> usize
    where
        K: 'k,
    {
        let mut changed = 0;
        for key in keys {
            if self.settle_one(key, present) {
                changed += 1;
            }
        }
        if present {
            self.stats.settled_hits += changed as u64;
        } else {
            self.stats.settled_misses += changed as u64;
        }
        changed
    }

    fn settle_one(&mut self, key: &K, present: bool) -> bool {
        let hash = self.keys.hash(key);
        let Some(cell) = self.keys.find(hash, key) else {
            return false; // untracked: a later lookup probes it
        };
        let entry = self.keys.entry_mut(cell);
        let state = *entry;
        let phase = state.phase(self.flushed_below, self.overdue_below);
        match phase {
            // guard: L18-the-same-answer-keeps-its-generation
            Phase::Resolved { found } if found == present => return false,
            Phase::Resolved { .. } => {}
            Phase::Pending => {
                // The flush leaves its old generation out (L1).
                // guard: L18-a-settled-batched-key-leaves-the-batch
                self.dropped_pending.insert(state.generation);
                self.batched_keys -= 1;
            }
            Phase::InFlight | Phase::Overdue => {
                // guard: L18-a-settled-orphan-is-forgotten
                if !state.has_requesters() {
                    // Nobody asks: its answer, when it comes, finds no key.
                    self.keys.remove(hash, cell);
                    return true;
                }
                // The probe's answer is no longer wanted by this key.
                lose_interest(&self.interest_of, state.group);
            }
        }
        // guard: L18-a-settled-state-gets-a-new-generation
        let generation = Generation(self.next_generation);
        self.next_generation += 1;
        let entry = self.keys.entry_mut(cell);
        entry.generation = generation.0;
        entry.resolve(present);
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::Verdict;
    use crate::lookup::types::Phase;
    use crate::lookup::{LookupLimits, LookupTable, Submission};

    type Table = LookupTable<u64, u64>;

    fn probing(table: &mut Table, keys: &[u64], request: u64) -> Submission<u64, u64> {
        for key in keys {
            assert_eq!(table.lookup(key, &request), Verdict::Pending);
        }
        table.take_submission().expect("new keys")
    }

    fn answer_all(table: &mut Table, submission: Submission<u64, u64>, found: bool) {
        for group in submission.into_groups() {
            let answers = vec![found; group.len()];
            table.apply(group.answered(answers));
        }
    }

    fn checked(table: &Table) {
        table.check_invariants().expect("structure holds");
        assert_eq!(table.stats().anomalies, 0);
    }

    #[test]
    fn a_store_completing_during_the_probe_wins_over_its_late_absence() {
        let mut table = Table::new();
        let submission = probing(&mut table, &[5, 6], 1);
        assert_eq!(table.settle([&5], true), 1);
        assert!(table.lookup(&5, &1).is_hit(), "waiting lookups hit at once");
        assert_eq!(table.lookup(&6, &1), Verdict::Pending);
        answer_all(&mut table, submission, false);
        assert!(table.lookup(&5, &1).is_hit(), "the late absence is stale");
        assert_eq!(table.lookup(&6, &1), Verdict::Miss);
        assert_eq!(table.stats().stale_results, 1);
        assert_eq!(table.stats().settled_hits, 1);
        checked(&table);
    }

    #[test]
    fn an_eviction_during_the_probe_wins_over_its_late_presence() {
        let mut table = Table::new();
        let submission = probing(&mut table, &[5], 1);
        table.settle([&5], false);
        answer_all(&mut table, submission, true);
        assert_eq!(table.lookup(&5, &1), Verdict::Miss);
        assert_eq!(table.stats().settled_misses, 1);
        checked(&table);
    }

    #[test]
    fn a_batched_key_settled_before_the_flush_is_not_probed() {
        let mut table = Table::new();
        table.lookup(&5, &1);
        table.lookup(&6, &1);
        table.settle([&5], true);
        assert_eq!(table.batched_keys(), 1);
        let submission = table.take_submission().expect("6 is still new");
        let groups = submission.into_groups();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].keys(), &[6]);
        assert!(table.lookup(&5, &1).is_hit());
        // Settling the only key leaves nothing to submit.
        table.lookup(&7, &2);
        table.settle([&7], false);
        assert!(table.take_submission().is_none());
        assert_eq!(table.lookup(&7, &2), Verdict::Miss);
        checked(&table);
    }

    #[test]
    fn an_evicted_hit_misses_and_its_old_ticket_is_stale() {
        let mut table = Table::new();
        let submission = probing(&mut table, &[5], 1);
        answer_all(&mut table, submission, true);
        let Verdict::Hit(old) = table.lookup(&5, &1) else {
            panic!("found")
        };
        assert_eq!(table.settle([&5], false), 1);
        assert_eq!(table.lookup(&5, &1), Verdict::Miss);
        assert_eq!(table.settle([&5], true), 1, "stored again");
        let Verdict::Hit(new) = table.lookup(&5, &1) else {
            panic!("stored")
        };
        assert_ne!(old.generation(), new.generation());
        assert!(!table.mark_miss(&old), "a failed load of the evicted copy");
        assert!(table.lookup(&5, &1).is_hit(), "the newer store stands");
        checked(&table);
    }

    #[test]
    fn the_same_answer_again_changes_nothing_and_keeps_tickets_valid() {
        let mut table = Table::new();
        let submission = probing(&mut table, &[5, 6], 1);
        answer_all(&mut table, submission, true);
        table.settle([&6], false);
        let Verdict::Hit(ticket) = table.lookup(&5, &1) else {
            panic!("found")
        };
        assert_eq!(table.settle([&5], true), 0);
        assert_eq!(table.settle([&6], false), 0);
        assert_eq!(table.settle([&99], true), 0, "untracked keys are ignored");
        assert!(table.key_state(&99).is_none());
        assert!(table.mark_miss(&ticket));
        assert_eq!(table.stats().settled_hits, 0);
        assert_eq!(table.stats().settled_misses, 1);
        checked(&table);
    }

    #[test]
    fn a_settled_orphan_is_forgotten_and_its_answer_finds_no_key() {
        let mut table = Table::new();
        let submission = probing(&mut table, &[5], 1);
        table.cleanup(&1);
        assert_eq!(table.len(), 1, "kept as an orphan while in flight");
        assert_eq!(table.settle([&5], true), 1);
        assert_eq!(table.len(), 0);
        answer_all(&mut table, submission, false);
        assert!(table.is_empty());
        assert_eq!(table.stats().stale_results, 1);
        checked(&table);
    }

    #[test]
    fn an_overdue_key_is_settled_like_one_in_flight() {
        let limits = LookupLimits::default().pending_steps(Some(1));
        let mut table = Table::with_limits(limits).unwrap();
        let submission = probing(&mut table, &[5], 1);
        assert_eq!(table.key_state(&5).unwrap().phase, Phase::Overdue);
        table.settle([&5], true);
        assert!(table.lookup(&5, &1).is_hit());
        answer_all(&mut table, submission, false);
        assert!(table.lookup(&5, &1).is_hit());
        assert_eq!(table.stats().late_answers, 0);
        checked(&table);
    }

    #[test]
    fn a_group_whose_keys_are_all_settled_is_no_longer_wanted() {
        let mut table = Table::new();
        let groups = probing(&mut table, &[5, 6], 1).into_groups();
        table.settle([&5, &6], true);
        assert!(!groups[0].claim(), "nobody waits for these answers");
        let mut table = Table::new();
        let groups = probing(&mut table, &[5, 6], 1).into_groups();
        table.settle([&5], true);
        assert!(groups[0].claim(), "6 is still wanted");
    }
}
