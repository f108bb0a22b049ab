//! The sans-IO table on its own: the reference's pinned behaviours and its
//! defects, step by step, with the test playing the worker.

use kvtier::{
    Verdict, lookup::GroupOutcome, lookup::GroupResult, lookup::LookupTable, lookup::Phase,
};

type Table = LookupTable<u64, String>;

fn req(id: &str) -> String {
    id.to_owned()
}

/// The test as worker: takes the step's submission and returns each group's
/// result (answering "even keys are stored"), without applying it yet.
fn probe_even(table: &mut Table) -> Vec<GroupResult<u64>> {
    let Some(submission) = table.take_submission() else {
        return Vec::new();
    };
    submission
        .into_groups()
        .into_iter()
        .map(|group| {
            let answers: Vec<bool> = group.keys().iter().map(|key| key % 2 == 0).collect();
            group.answered(answers)
        })
        .collect()
}

fn step(table: &mut Table) {
    for result in probe_even(table) {
        table.apply(result);
    }
}

fn assert_clean(table: &Table) {
    table.check_invariants().unwrap();
    assert_eq!(table.stats().anomalies, 0);
}

#[test]
fn new_keys_are_pending_then_resolve_independently() {
    let mut table = Table::new();
    let a = req("a");
    for key in [1, 2, 3, 4] {
        assert_eq!(table.lookup(&key, &a), Verdict::Pending);
    }
    step(&mut table);
    assert!(table.lookup(&2, &a).is_hit());
    assert!(table.lookup(&4, &a).is_hit());
    assert!(table.lookup(&1, &a).is_miss());
    assert!(table.lookup(&3, &a).is_miss());
    let stats = table.stats();
    assert_eq!((stats.hits, stats.misses, stats.pending), (2, 2, 4));
    assert_clean(&table);
}

#[test]
fn a_key_looked_up_twice_in_a_step_is_submitted_once() {
    let mut table = Table::new();
    table.lookup(&7, &req("a"));
    table.lookup(&7, &req("a"));
    table.lookup(&7, &req("b"));
    let submission = table.take_submission().unwrap();
    assert_eq!(submission.key_count(), 1);
    assert_eq!(submission.groups()[0].request(), "a");
    assert_eq!(table.key_state(&7).unwrap().requesters, 2);
    // In flight and resolved keys are not submitted again either.
    table.lookup(&7, &req("c"));
    assert!(table.take_submission().is_none());
}

#[test]
fn keys_are_grouped_by_request_in_first_appearance_order() {
    let mut table = Table::new();
    table.lookup(&1, &req("b"));
    table.lookup(&2, &req("a"));
    table.lookup(&3, &req("b"));
    table.lookup(&1, &req("a")); // known: joins, not re-batched
    let submission = table.take_submission().unwrap();
    let groups: Vec<(&str, &[u64])> = submission
        .groups()
        .iter()
        .map(|g| (g.request().as_str(), g.keys()))
        .collect();
    assert_eq!(groups, vec![("b", &[1, 3][..]), ("a", &[2][..])]);
}

#[test]
fn a_flush_with_nothing_new_submits_nothing() {
    let mut table = Table::new();
    assert!(table.take_submission().is_none());
    table.lookup(&1, &req("a"));
    assert!(table.take_submission().is_some());
    assert!(table.take_submission().is_none());
    assert_eq!(table.stats().groups_submitted, 1);
}

#[test]
fn cleanup_of_the_last_request_removes_the_key_and_shared_keys_survive() {
    let mut table = Table::new();
    table.lookup(&1, &req("a"));
    table.lookup(&1, &req("b"));
    table.lookup(&2, &req("a"));
    step(&mut table);
    table.cleanup(&req("a"));
    assert!(table.key_state(&2).is_none());
    assert_eq!(table.key_state(&1).unwrap().requesters, 1);
    table.cleanup(&req("nobody")); // unknown: no-op
    assert_eq!(table.len(), 1);
    table.cleanup(&req("b"));
    assert!(table.is_empty());
    assert_clean(&table);
}

#[test]
fn results_from_several_steps_all_become_visible() {
    let mut table = Table::new();
    table.lookup(&2, &req("a"));
    let first = probe_even(&mut table);
    table.lookup(&3, &req("a"));
    let second = probe_even(&mut table);
    for result in second.into_iter().chain(first) {
        table.apply(result);
    }
    assert!(table.lookup(&2, &req("a")).is_hit());
    assert!(table.lookup(&3, &req("a")).is_miss());
    assert_clean(&table);
}

#[test]
fn mark_miss_turns_a_hit_into_a_miss_without_reprobing() {
    let mut table = Table::new();
    let a = req("a");
    table.lookup(&2, &a);
    step(&mut table);
    let Verdict::Hit(ticket) = table.lookup(&2, &a) else {
        panic!("2 is stored")
    };
    assert!(table.mark_miss(&ticket));
    assert!(!table.mark_miss(&ticket), "already a miss");
    assert!(table.lookup(&2, &a).is_miss());
    assert!(table.take_submission().is_none(), "no second probe");
    // The key stays tied to its request until cleanup.
    assert_eq!(table.key_state(&2).unwrap().requesters, 1);
    assert_eq!(table.mark_miss_keys(&[99]), 0, "unknown key: no-op");
    table.cleanup(&a);
    assert!(table.is_empty());
    assert_eq!(table.stats().marked_miss, 1);
}

#[test]
fn mark_miss_keys_touches_resolved_hits_only() {
    let mut table = Table::new();
    let a = req("a");
    table.lookup(&2, &a);
    table.lookup(&4, &a);
    step(&mut table);
    table.lookup(&6, &a); // pending
    table.lookup(&8, &a);
    let in_flight = probe_even(&mut table); // 8: in flight
    table.lookup(&6, &a);
    assert_eq!(table.mark_miss_keys(&[2, 4, 8]), 2);
    assert_eq!(table.key_state(&8).unwrap().phase, Phase::InFlight);
    for result in in_flight {
        table.apply(result);
    }
    assert!(table.lookup(&8, &a).is_hit());
    assert_clean(&table);
}

#[test]
fn cleanup_in_flight_keeps_the_probe_and_the_next_request_joins_it() {
    let mut table = Table::new();
    table.lookup(&2, &req("a"));
    let a_results = probe_even(&mut table);
    table.cleanup(&req("a"));
    // In flight and unrequested: kept as an orphan so a later request can share it.
    assert_eq!(table.key_state(&2).unwrap().requesters, 0);
    assert_eq!(table.key_state(&2).unwrap().phase, Phase::InFlight);
    assert_eq!(table.lookup(&2, &req("b")), Verdict::Pending);
    assert!(table.take_submission().is_none(), "b shares a's probe");
    for result in a_results {
        table.apply(result);
    }
    assert!(table.lookup(&2, &req("b")).is_hit());
    assert_eq!(table.stats().keys_submitted, 1);
    assert_clean(&table);
}

#[test]
fn an_orphaned_result_is_discarded_and_a_later_lookup_probes_afresh() {
    let mut table = Table::new();
    table.lookup(&2, &req("a"));
    let a_results = probe_even(&mut table);
    let old_generation = table.key_state(&2).unwrap().generation;
    table.cleanup(&req("a"));
    for result in a_results {
        table.apply(result);
    }
    assert!(
        table.key_state(&2).is_none(),
        "nobody joined: the orphan is removed"
    );
    assert_eq!(table.stats().orphans_dropped, 1);
    assert!(table.is_empty());

    assert_eq!(table.lookup(&2, &req("b")), Verdict::Pending);
    assert!(table.key_state(&2).unwrap().generation > old_generation);
    assert_eq!(
        table.take_submission().unwrap().key_count(),
        1,
        "probed afresh"
    );
}

#[test]
fn a_key_cleaned_up_and_recreated_before_the_flush_is_submitted_once_with_its_current_generation() {
    let mut table = Table::new();
    table.lookup(&2, &req("a"));
    table.cleanup(&req("a")); // pending and unrequested: removed
    assert!(
        table.take_submission().is_none(),
        "a removed key is not probed"
    );

    table.lookup(&2, &req("a"));
    table.cleanup(&req("a"));
    table.lookup(&2, &req("b")); // recreated in the same step: a newer generation
    let current = table.key_state(&2).unwrap().generation;
    let submission = table.take_submission().unwrap();
    assert_eq!(submission.key_count(), 1, "the older entry is skipped");
    let group = submission.into_groups().remove(0);
    assert_eq!(group.request(), "b");
    let result = group.answered([true]);
    assert_eq!(result.entries().next().unwrap().1, current);
    table.apply(result);
    assert!(table.lookup(&2, &req("b")).is_hit());
    assert_eq!(table.stats().stale_results, 0);
    assert_clean(&table);
}

#[test]
fn defect_1_stale_ticket_after_recreate_cannot_touch_the_newer_lookup() {
    // A late mark_miss against every stage of the recreated key's generation 1.
    for gen1_phase in ["pending", "in flight", "resolved"] {
        let mut table = Table::new();
        table.lookup(&2, &req("a"));
        step(&mut table);
        let Verdict::Hit(old_ticket) = table.lookup(&2, &req("a")) else {
            panic!("gen 0 resolves as a hit")
        };
        // The load starts and later fails; meanwhile a finishes and the key is reused.
        table.cleanup(&req("a"));
        table.lookup(&2, &req("b"));
        let mut in_flight = Vec::new();
        if gen1_phase != "pending" {
            in_flight = probe_even(&mut table);
        }
        if gen1_phase == "resolved" {
            for result in in_flight.drain(..) {
                table.apply(result);
            }
        }
        // The old load's failure arrives late, by ticket and by key.
        assert!(
            !table.mark_miss(&old_ticket),
            "{gen1_phase}: stale ticket is a no-op"
        );
        if gen1_phase != "resolved" {
            assert_eq!(
                table.mark_miss_keys(&[2]),
                0,
                "{gen1_phase}: not resolved, untouched"
            );
        }
        // gen 1 goes on normally: its own answer applies, no anomaly.
        in_flight.extend(probe_even(&mut table));
        for result in in_flight {
            table.apply(result);
        }
        assert!(
            table.lookup(&2, &req("b")).is_hit(),
            "{gen1_phase}: gen 1's hit intact"
        );
        assert_eq!(table.stats().anomalies, 0, "{gen1_phase}");
        assert_eq!(table.stats().marked_miss, 0, "{gen1_phase}");
        table.cleanup(&req("b"));
        assert!(table.is_empty());
    }
}

#[test]
fn defect_5_short_and_surplus_answers_leave_no_key_in_flight() {
    let mut table = Table::new();
    for key in [2, 4, 6] {
        table.lookup(&key, &req("a"));
    }
    let group = table.take_submission().unwrap().into_groups().remove(0);
    let result = group.answered([true]);
    assert_eq!(result.outcome(), GroupOutcome::Short { answered: 1 });
    table.apply(result);
    assert!(table.lookup(&2, &req("a")).is_hit());
    assert!(table.lookup(&4, &req("a")).is_miss());
    assert!(table.lookup(&6, &req("a")).is_miss());

    table.lookup(&8, &req("a"));
    let group = table.take_submission().unwrap().into_groups().remove(0);
    // An endless answer iterator is cut after one surplus answer.
    let result = group.answered(std::iter::repeat(true));
    assert_eq!(result.outcome(), GroupOutcome::Surplus);
    table.apply(result);
    assert!(table.lookup(&8, &req("a")).is_hit());

    table.lookup(&10, &req("a"));
    let group = table.take_submission().unwrap().into_groups().remove(0);
    table.apply(group.failed());
    assert!(table.lookup(&10, &req("a")).is_miss());

    let stats = table.stats();
    assert_eq!(
        (
            stats.short_results,
            stats.surplus_results,
            stats.backend_errors
        ),
        (1, 1, 1)
    );
    table.cleanup(&req("a"));
    assert!(table.is_empty());
}

#[test]
fn the_table_is_empty_once_everything_is_cleaned_up_and_applied() {
    // A deterministic mixed workload: overlapping requests, answers applied
    // out of order and late, cleanups in flight, key reuse.
    let mut table = Table::new();
    let mut held = Vec::new();
    for step_no in 0..40u64 {
        for r in 0..4u64 {
            let request = format!("r{}", (step_no + r) % 7);
            for k in 0..6u64 {
                table.lookup(&((step_no * 3 + r * 5 + k) % 23), &request);
            }
        }
        held.extend(probe_even(&mut table));
        if step_no % 3 == 0 {
            // Apply the older half now, keep the rest in flight.
            let keep = held.split_off(held.len() / 2);
            for result in std::mem::replace(&mut held, keep) {
                table.apply(result);
            }
        }
        table.cleanup(&format!("r{}", step_no % 7));
        table.check_invariants().unwrap();
    }
    for r in 0..7 {
        table.cleanup(&format!("r{r}"));
    }
    assert!(
        !table.is_empty(),
        "in-flight orphans wait for their answers"
    );
    for result in held {
        table.apply(result);
    }
    assert!(table.is_empty());
    let stats = table.stats();
    assert_eq!(stats.anomalies, 0);
    assert!(stats.orphans_dropped > 0);
}

#[test]
fn a_request_cleaned_up_and_seen_again_within_a_step_still_gets_one_group() {
    // Found by the differential test against the specification.
    let mut table = Table::new();
    table.lookup(&1, &req("a"));
    table.lookup(&2, &req("b"));
    table.cleanup(&req("a"));
    table.lookup(&3, &req("a"));
    let submission = table.take_submission().unwrap();
    let groups: Vec<(&str, &[u64])> = submission
        .groups()
        .iter()
        .map(|g| (g.request().as_str(), g.keys()))
        .collect();
    // a's group keeps its place (a asked first), holding only the live key.
    assert_eq!(groups, vec![("a", &[3][..]), ("b", &[2][..])]);
}

/// Every table numbers its generations from 0, so a ticket or a group result
/// carried to another table would otherwise look like that table's own: it
/// would flip another table's hit, or be applied as the answer while the
/// real answer is then dropped. Both are refused and counted as foreign.
#[test]
fn tickets_and_results_are_tied_to_the_table_that_issued_them() {
    let mut ours = Table::new();
    let mut theirs = Table::new();
    let mut stranger = Table::new();
    for table in [&mut ours, &mut theirs, &mut stranger] {
        assert_eq!(table.lookup(&4, &req("a")), Verdict::Pending);
    }
    assert_eq!(
        ours.key_state(&4).unwrap().generation,
        stranger.key_state(&4).unwrap().generation,
        "the same generation in both tables"
    );
    let our_results = probe_even(&mut ours);
    let strange_results = probe_even(&mut stranger);
    assert_ne!(our_results[0].table(), strange_results[0].table());

    // Another table's result applied here is refused whole; our key stays
    // in flight for our own answer, which is then applied normally.
    for result in strange_results {
        ours.apply(result);
    }
    assert_eq!(ours.stats().foreign, 1);
    assert_eq!(ours.stats().groups_applied, 0);
    assert_eq!(ours.key_state(&4).unwrap().phase, Phase::InFlight);
    for result in our_results {
        ours.apply(result);
    }
    assert_eq!(
        ours.stats().anomalies,
        0,
        "our own answer is not a duplicate"
    );
    let Verdict::Hit(our_ticket) = ours.lookup(&4, &req("a")) else {
        panic!("4 is even");
    };

    // Their table has its own hit for 4, of the same generation; our
    // ticket does not flip it.
    step(&mut theirs);
    assert_eq!(
        theirs.key_state(&4).unwrap().generation,
        our_ticket.generation()
    );
    assert!(!theirs.mark_miss(&our_ticket));
    assert_eq!(theirs.stats().foreign, 1);
    assert!(theirs.lookup(&4, &req("a")).is_hit(), "their hit stands");
    assert!(
        ours.mark_miss(&our_ticket),
        "the ticket works where it was issued"
    );
    assert_clean(&ours);
    assert_clean(&theirs);
}

/// What a verdict says, without the table identity its ticket carries.
fn seen(verdict: &Verdict<u64>) -> (char, Option<u64>) {
    match verdict {
        Verdict::Hit(ticket) => ('H', Some(ticket.generation().get())),
        Verdict::Miss => ('M', None),
        Verdict::Pending => ('P', None),
    }
}

/// `lookup_all` is `lookup` key by key: two tables driven through the same
/// random steps (shared keys, repeated keys, answers held back a step,
/// cleanups, failed loads), one with the batched call and one with single
/// calls, give the same verdicts, the same counters and the same states; the
/// returned count is the leading run of hits.
#[test]
fn the_batched_lookup_is_the_single_lookup_key_by_key() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let mut batched = Table::new();
    let mut single = Table::new();
    let mut verdicts = Vec::new();
    let mut held: Vec<(GroupResult<u64>, GroupResult<u64>)> = Vec::new();
    let mut leading_runs = [0usize; 2];
    for _ in 0..400 {
        for request in 0..4 {
            let id = format!("r{request}");
            let keys: Vec<u64> = (0..next(12)).map(|_| next(40)).collect();
            let leading = batched.lookup_all(&keys, &id, &mut verdicts);
            let one_by_one: Vec<Verdict<u64>> =
                keys.iter().map(|key| single.lookup(key, &id)).collect();
            let expected = one_by_one.iter().take_while(|v| v.is_hit()).count();
            assert_eq!(leading, expected, "keys {keys:?}");
            assert_eq!(
                verdicts.iter().map(seen).collect::<Vec<_>>(),
                one_by_one.iter().map(seen).collect::<Vec<_>>()
            );
            leading_runs[usize::from(leading > 0 && leading < keys.len())] += 1;
            // A failed load of the first hit, now and then, on both.
            if next(5) == 0
                && let (Some(Verdict::Hit(a)), Some(Verdict::Hit(b))) = (
                    verdicts.iter().find(|v| v.is_hit()),
                    one_by_one.iter().find(|v| v.is_hit()),
                )
            {
                assert_eq!(batched.mark_miss(a), single.mark_miss(b));
            }
        }
        // Answers come back now or a step later, the same on both tables.
        let answer = |key: &u64| !key.is_multiple_of(3);
        let results = |table: &mut Table| -> Vec<GroupResult<u64>> {
            table.take_submission().map_or_else(Vec::new, |submission| {
                submission
                    .into_groups()
                    .into_iter()
                    .map(|group| {
                        let answers: Vec<bool> = group.keys().iter().map(answer).collect();
                        group.answered(answers)
                    })
                    .collect()
            })
        };
        let fresh: Vec<_> = results(&mut batched)
            .into_iter()
            .zip(results(&mut single))
            .collect();
        for (a, b) in held.drain(..) {
            batched.apply(a);
            single.apply(b);
        }
        if next(2) == 0 {
            held = fresh;
        } else {
            for (a, b) in fresh {
                batched.apply(a);
                single.apply(b);
            }
        }
        if next(3) == 0 {
            let id = format!("r{}", next(4));
            batched.cleanup(&id);
            single.cleanup(&id);
        }
        assert_eq!(batched.stats(), single.stats());
        assert_eq!(batched.len(), single.len());
        assert_eq!(batched.request_count(), single.request_count());
        batched.check_invariants().unwrap();
    }
    assert!(
        leading_runs[1] > 50,
        "runs that end in the middle: {leading_runs:?}"
    );
    for key in 0..40 {
        let state = |table: &Table| table.key_state(&key).map(|s| (s.generation, s.phase));
        assert_eq!(state(&batched), state(&single), "key {key}");
    }
}

// ----- Bounds: deadlines (L13), admission (L14), unwanted groups (L15) -----

fn bounded(limits: kvtier::lookup::LookupLimits) -> Table {
    Table::with_limits(limits).expect("valid limits")
}

fn limits() -> kvtier::lookup::LookupLimits {
    kvtier::lookup::LookupLimits::default()
}

#[test]
fn an_overdue_key_is_a_miss_and_its_late_answer_still_serves_later_lookups() {
    let mut table = bounded(limits().pending_steps(Some(2)));
    let a = req("a");
    assert!(table.lookup(&4, &a).is_pending()); // step 0
    let group = table.take_submission().unwrap().into_groups().remove(0);
    assert!(
        table.lookup(&4, &a).is_pending(),
        "step 1: within the budget"
    );
    assert!(table.take_submission().is_none());
    // Step 2: two steps ended unanswered.
    assert_eq!(table.lookup(&4, &a), Verdict::Miss);
    assert_eq!(table.key_state(&4).unwrap().phase, Phase::Overdue);
    assert_eq!(table.stats().deadline_misses, 1);
    // The probe went on; its answer resolves the key for later lookups.
    table.apply(group.answered([true]));
    assert!(table.lookup(&4, &a).is_hit());
    assert_eq!(table.stats().late_answers, 1);
    table.cleanup(&a);
    assert!(table.is_empty());
    assert_clean(&table);
}

#[test]
fn the_time_budget_counts_from_the_start_of_the_step_that_asked() {
    use std::time::{Duration, Instant};
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let mut table = bounded(limits().pending_time(Some(ms(100))));
    let a = req("a");
    assert!(table.take_submission_at(t0).is_none()); // step 1 starts at t0
    table.lookup(&4, &a);
    // The step runs long: the key is handed over only at t0 + 60 ms, and
    // then queued behind slower groups; its budget counts from t0.
    let group = table.take_submission_at(t0 + ms(60)).unwrap();
    assert!(table.lookup(&4, &a).is_pending());
    assert!(table.take_submission_at(t0 + ms(99)).is_none());
    assert!(
        table.lookup(&4, &a).is_pending(),
        "99 ms: within the budget"
    );
    assert!(table.take_submission_at(t0 + ms(100)).is_none());
    assert_eq!(
        table.lookup(&4, &a),
        Verdict::Miss,
        "100 ms after its step started"
    );
    drop(group);
    assert_clean(&table);
}

#[test]
fn a_late_answer_of_an_older_generation_stays_stale_after_the_deadline() {
    let mut table = bounded(limits().pending_steps(Some(1)));
    let (a, b) = (req("a"), req("b"));
    table.lookup(&4, &a);
    let old = table.take_submission().unwrap().into_groups().remove(0);
    assert_eq!(table.lookup(&4, &a), Verdict::Miss);
    // The request gives up the overdue key: nothing of it stays behind.
    table.cleanup(&a);
    assert!(
        table.is_empty(),
        "an overdue key without requesters is removed"
    );
    // A new request asks: a new generation with a probe of its own.
    assert!(table.lookup(&4, &b).is_pending());
    let new = table.take_submission().unwrap().into_groups().remove(0);
    table.apply(old.answered([true])); // late, and for the old generation
    assert_eq!(table.stats().stale_results, 1);
    assert_eq!(table.key_state(&4).unwrap().phase, Phase::Overdue);
    assert_eq!(
        table.lookup(&4, &b),
        Verdict::Miss,
        "no hit from the old answer"
    );
    table.apply(new.answered([false]));
    assert_eq!(table.lookup(&4, &b), Verdict::Miss);
    table.cleanup(&b);
    assert!(table.is_empty());
    assert_clean(&table);
}

#[test]
fn admission_sheds_new_keys_beyond_the_bounds_and_keeps_no_state_for_them() {
    let mut table = bounded(limits().max_outstanding_keys(2));
    let a = req("a");
    assert!(table.lookup(&1, &a).is_pending());
    assert!(table.lookup(&2, &a).is_pending());
    assert_eq!(table.lookup(&3, &a), Verdict::Miss, "no room: shed");
    assert!(table.key_state(&3).is_none());
    let group = table.take_submission().unwrap().into_groups().remove(0);
    assert_eq!(table.outstanding_keys(), 2);
    assert_eq!(table.lookup(&3, &a), Verdict::Miss, "still no room");
    assert!(table.lookup(&1, &a).is_pending(), "known keys are not shed");
    // The answer frees the room.
    table.apply(group.answered([true, true]));
    assert_eq!(table.outstanding_keys(), 0);
    assert!(table.lookup(&3, &a).is_pending());
    assert_eq!(table.stats().shed, 2);
    table.cleanup(&a);
    let _ = table.take_submission();
    assert_clean(&table);
}

#[test]
fn admission_bounds_the_groups_of_requests_too() {
    let mut table = bounded(limits().max_outstanding_groups(1));
    let (a, b) = (req("a"), req("b"));
    assert!(table.lookup(&1, &a).is_pending());
    assert_eq!(table.lookup(&2, &b), Verdict::Miss, "a second group: shed");
    assert!(table.lookup(&3, &a).is_pending(), "a's group has room");
    let group = table.take_submission().unwrap().into_groups().remove(0);
    assert_eq!(
        table.lookup(&2, &b),
        Verdict::Miss,
        "a's group is still out"
    );
    table.apply(group.answered([false, false]));
    assert!(table.lookup(&2, &b).is_pending());
    assert_eq!(table.stats().shed, 2);
    // The shed request is registered like any other until cleaned up.
    table.cleanup(&a);
    table.cleanup(&b);
    let _ = table.take_submission();
    assert!(table.is_empty());
    assert_clean(&table);
}

#[test]
fn a_group_whose_keys_all_lost_their_requests_is_given_up_unprobed() {
    let mut table = Table::new();
    let (a, b) = (req("a"), req("b"));
    table.lookup(&1, &a);
    table.lookup(&2, &a);
    table.lookup(&3, &b);
    let mut groups = table.take_submission().unwrap().into_groups();
    let b_group = groups.pop().unwrap();
    let a_group = groups.pop().unwrap();
    table.cleanup(&a);
    assert!(!a_group.claim(), "nobody wants a's answers any more");
    assert!(b_group.claim(), "b is still waiting");
    table.apply(a_group.abandoned());
    assert_eq!(table.stats().abandoned, 1);
    assert_eq!(table.len(), 1, "a's orphans are gone");
    table.apply(b_group.answered([true]));
    assert!(table.lookup(&3, &b).is_hit());
    assert_clean(&table);
}

#[test]
fn a_request_joining_an_orphan_before_the_claim_keeps_its_probe() {
    let mut table = Table::new();
    let (a, b) = (req("a"), req("b"));
    table.lookup(&1, &a);
    table.lookup(&2, &a);
    let group = table.take_submission().unwrap().into_groups().remove(0);
    table.cleanup(&a);
    assert!(
        table.lookup(&2, &b).is_pending(),
        "b shares the probe in flight"
    );
    assert!(table.take_submission().is_none(), "no second probe");
    assert!(group.claim(), "b wants key 2");
    table.apply(group.answered([true, true]));
    assert!(table.lookup(&2, &b).is_hit());
    assert_eq!(table.len(), 1, "key 1's orphan went with the answer");
    assert_clean(&table);
}

#[test]
fn a_request_joining_a_probe_already_given_up_gets_a_new_one() {
    let mut table = Table::new();
    let (a, b) = (req("a"), req("b"));
    table.lookup(&1, &a);
    let group = table.take_submission().unwrap().into_groups().remove(0);
    table.cleanup(&a);
    assert!(!group.claim());
    // The prober gave up; its result is not applied yet when b asks.
    assert!(table.lookup(&1, &b).is_pending());
    let again = table.take_submission().expect("a new probe for b");
    assert_eq!(again.groups()[0].keys(), &[1]);
    table.apply(group.abandoned());
    assert_eq!(
        table.stats().stale_results,
        1,
        "the given-up probe is stale"
    );
    assert!(
        table.lookup(&1, &b).is_pending(),
        "b waits for its own probe"
    );
    for group in again.into_groups() {
        assert!(group.claim());
        table.apply(group.answered([true]));
    }
    assert!(table.lookup(&1, &b).is_hit());
    assert_clean(&table);
}

#[test]
fn without_skipping_every_group_is_claimed() {
    let mut table = bounded(limits().skip_unwanted(false));
    let a = req("a");
    table.lookup(&1, &a);
    let group = table.take_submission().unwrap().into_groups().remove(0);
    table.cleanup(&a);
    assert!(group.claim());
    table.apply(group.answered([true]));
    assert_eq!(table.stats().orphans_dropped, 1);
    assert!(table.is_empty());
}
