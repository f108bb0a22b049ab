//! The model's transitions: one scheduler operation or worker delivery each, checked as it is taken.

use std::collections::BTreeSet;

use super::model::*;

impl Protocol {
    /// Takes one transition; `Err` names a safety property it violates.
    pub(super) fn step(&self, state: &mut State, action: &Action) -> Result<(), String> {
        let rules = self.rules;
        match *action {
            Action::Lookup { key, request } => {
                if rules.join_after_release_starts_afresh
                    && let Some(entry) = state.keys.get(&key)
                    && entry.requesters.is_empty()
                    && (entry.phase == Phase::Overdue
                        || state.given_up.contains(&(key, entry.generation)))
                {
                    // A probe let go is not shared: the key starts afresh.
                    state.released.insert((key, entry.generation));
                    state.keys.remove(&key);
                }
                let known = state.keys.contains_key(&key);
                if !known
                    && rules.admission_bounds_outstanding
                    && self
                        .bounds
                        .max_outstanding
                        .is_some_and(|bound| Self::outstanding(state) >= usize::from(bound))
                {
                    return Ok(()); // shed: a miss, and no state
                }
                if !known {
                    let generation = state.next_generation;
                    state.next_generation += 1;
                    state.keys.insert(
                        key,
                        KeyState {
                            generation,
                            phase: Phase::Pending,
                            requesters: BTreeSet::new(),
                        },
                    );
                    state.batch.push((request, key, generation));
                } else if !rules.known_keys_not_rebatched {
                    let entry = &state.keys[&key];
                    let already = state
                        .batch
                        .iter()
                        .any(|&(_, k, g)| k == key && g == entry.generation);
                    if !entry.requesters.contains(&request) && !already {
                        state.batch.push((request, key, entry.generation));
                    }
                }
                let entry = state.keys.get_mut(&key).expect("present");
                entry.requesters.insert(request);
                state.reverse.entry(request).or_default().insert(key);
                let generation = entry.generation;
                match entry.phase {
                    // Overdue: a miss, which is always safe.
                    Phase::Pending | Phase::InFlight | Phase::Overdue => {}
                    Phase::Resolved(found) => {
                        let answer = state.answers.get(&(key, generation)).copied();
                        let marked = state.marked.contains(&(key, generation));
                        let allowed = answer == Some(found) || (marked && !found);
                        if !allowed {
                            return Err(format!(
                                "stale verdict: key {key} generation {generation} reads found={found}, \
                                 the backend answered {answer:?} for it (marked: {marked})"
                            ));
                        }
                        if found {
                            state.tickets.insert((key, generation));
                        }
                    }
                }
            }
            Action::Flush => {
                let mut groups: Vec<(u8, Vec<(u8, u8)>)> = Vec::new();
                for (request, key, generation) in std::mem::take(&mut state.batch) {
                    let Some(entry) = state.keys.get_mut(&key) else {
                        if rules.flush_skips_stale_entries {
                            continue;
                        }
                        push_entry(&mut groups, request, key, generation);
                        continue;
                    };
                    let current = entry.generation == generation && entry.phase == Phase::Pending;
                    if current {
                        entry.phase = Phase::InFlight;
                    } else if rules.flush_skips_stale_entries {
                        continue;
                    }
                    push_entry(&mut groups, request, key, generation);
                }
                state
                    .worker
                    .extend(groups.into_iter().map(|(_, entries)| entries));
                state.worker.sort();
            }
            Action::Deliver { group, ref found } => {
                let entries = state.worker.remove(group);
                for (&(key, generation), &found) in entries.iter().zip(found) {
                    state.answers.insert((key, generation), found);
                    state.published.push((key, generation, found, false));
                }
            }
            Action::GiveUp { group } => {
                let entries = state.worker.remove(group);
                for &(key, generation) in &entries {
                    state.given_up.insert((key, generation));
                    state.published.push((key, generation, false, true));
                }
            }
            Action::Expire { key } => {
                if let Some(entry) = state.keys.get_mut(&key)
                    && entry.phase == Phase::InFlight
                {
                    entry.phase = Phase::Overdue;
                }
            }
            Action::Apply => {
                for (key, generation, found, given_up) in std::mem::take(&mut state.published) {
                    state.given_up.remove(&(key, generation));
                    state.released.remove(&(key, generation));
                    let _ = given_up;
                    let Some(entry) = state.keys.get_mut(&key) else {
                        continue; // stale: the key is gone
                    };
                    if rules.apply_checks_generation && entry.generation != generation {
                        continue; // stale: another incarnation
                    }
                    if entry.generation == generation
                        && !matches!(entry.phase, Phase::InFlight | Phase::Overdue)
                    {
                        return Err(format!(
                            "anomaly: answer for key {key} generation {generation} meets phase {:?}",
                            entry.phase
                        ));
                    }
                    if rules.remove_answered_orphans && entry.requesters.is_empty() {
                        state.keys.remove(&key);
                    } else {
                        // With the generation check off this may be another
                        // incarnation's answer: the ghost check at the next
                        // lookup compares it with the state's own.
                        entry.phase = Phase::Resolved(found);
                    }
                }
            }
            Action::Cleanup { request } => {
                for key in state.reverse.remove(&request).unwrap_or_default() {
                    let Some(entry) = state.keys.get_mut(&key) else {
                        continue;
                    };
                    entry.requesters.remove(&request);
                    let keep = match entry.phase {
                        Phase::InFlight => rules.keep_in_flight_orphans,
                        Phase::Overdue => !rules.remove_overdue_orphans,
                        _ => false,
                    };
                    if entry.requesters.is_empty() && !keep {
                        if entry.phase == Phase::Overdue {
                            state.released.insert((key, entry.generation));
                        }
                        state.keys.remove(&key);
                    } else if entry.requesters.is_empty() && entry.phase == Phase::Overdue {
                        return Err(format!(
                            "deadline miss outlives its requests: key {key} generation {} stays \
                             overdue with none",
                            entry.generation
                        ));
                    }
                }
            }
            Action::MarkMiss { key, generation } => {
                if let Some(entry) = state.keys.get_mut(&key) {
                    let same = !rules.ticket_checks_generation || entry.generation == generation;
                    if same && entry.phase == Phase::Resolved(true) {
                        entry.phase = Phase::Resolved(false);
                        state.marked.insert((key, generation));
                    }
                }
            }
            Action::MarkMissKey { key } => {
                if let Some(entry) = state.keys.get_mut(&key)
                    && entry.phase == Phase::Resolved(true)
                {
                    entry.phase = Phase::Resolved(false);
                    state.marked.insert((key, entry.generation));
                }
            }
        }
        Ok(())
    }
}
