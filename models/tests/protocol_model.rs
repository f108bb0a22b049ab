//! Exhaustive exploration of the abstract protocol model
//! ([`kvtier_models::protocol`]): every reachable state within the bounds,
//! safety on every transition, liveness from every state. Then each guard of
//! the design switched off in turn: the explorer must find a counterexample
//! (or the guard is shown redundant, and says so).
//!
//! Run: `cargo test -p kvtier-models --release --test protocol_model -- --nocapture`.
//! Deeper: `KVTIER_PROTOCOL_BOUNDS=keys,requests,generations` (default 2,2,4;
//! 2,2,3 in unoptimised builds), and for the bounded design (deadlines,
//! admission, groups given up) `KVTIER_PROTOCOL_BOUNDED=keys,requests,generations,max_outstanding`
//! (default 2,2,3,2).

use std::time::Instant;

use kvtier_models::protocol::{Bounds, Protocol, Report, Rules};

/// Enough for every bound this file uses; a run that reaches it fails.
const MAX_STATES: usize = 20_000_000;

fn bounds() -> Bounds {
    // Unoptimised builds (the plain `cargo test`) explore a smaller space;
    // `cargo test --release` (as .ci/run does) the full default.
    let default = Bounds::plain(2, 2, if cfg!(debug_assertions) { 3 } else { 4 });
    let Ok(text) = std::env::var("KVTIER_PROTOCOL_BOUNDS") else {
        return default;
    };
    let parts: Vec<u8> = text
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("KVTIER_PROTOCOL_BOUNDS=keys,requests,generations")
        })
        .collect();
    assert_eq!(
        parts.len(),
        3,
        "KVTIER_PROTOCOL_BOUNDS=keys,requests,generations"
    );
    Bounds::plain(parts[0], parts[1], parts[2])
}

fn explore(name: &str, rules: Rules, bounds: Bounds) -> Report {
    let started = Instant::now();
    let report = Protocol::new(rules, bounds).explore(MAX_STATES);
    println!(
        "protocol model {name} {bounds:?}: {} states, {} transitions, {:.2?}{}",
        report.states,
        report.transitions,
        started.elapsed(),
        match &report.violation {
            Some(v) => format!("\n  violation: {v}"),
            None => String::new(),
        }
    );
    assert!(
        report.states < MAX_STATES,
        "state bound reached: raise MAX_STATES"
    );
    report
}

#[test]
fn every_reachable_state_is_safe_and_live() {
    let report = explore("full design", Rules::default(), bounds());
    if let Some(violation) = report.violation {
        panic!("{violation}");
    }
    assert!(report.states > 1_000, "the model explored almost nothing");
}

/// Runs the model with one guard off and returns the property that broke.
fn without(name: &str, rules: Rules) -> Option<String> {
    // Small bounds suffice for a counterexample, and keep this quick.
    explore(name, rules, Bounds::plain(2, 2, 3))
        .violation
        .map(|v| v.property)
}

/// The bounded design (deadlines, admission, groups given up) within small
/// bounds: two keys, two requests, three generations, at most two keys
/// outstanding (174,000 states, 3 s). Deeper:
/// `KVTIER_PROTOCOL_BOUNDED=2,2,4,2` (2.7 million states, about 70 s and
/// several GiB).
fn bounded() -> Bounds {
    let Ok(text) = std::env::var("KVTIER_PROTOCOL_BOUNDED") else {
        // Unoptimised builds (the plain `cargo test`) explore less.
        return Bounds::bounded(2, 2, if cfg!(debug_assertions) { 2 } else { 3 }, 2);
    };
    let usage = "KVTIER_PROTOCOL_BOUNDED=keys,requests,generations,max_outstanding";
    let parts: Vec<u8> = text
        .split(',')
        .map(|n| n.trim().parse().expect(usage))
        .collect();
    assert_eq!(parts.len(), 4, "{usage}");
    Bounds::bounded(parts[0], parts[1], parts[2], parts[3])
}

/// [`without`] for the bounded design.
fn without_bounded(name: &str, rules: Rules) -> Option<String> {
    explore(name, rules, Bounds::bounded(2, 2, 3, 2))
        .violation
        .map(|v| v.property)
}

#[test]
fn without_in_flight_retention_a_recreated_key_is_probed_twice_at_once() {
    let broke = without(
        "without in-flight retention",
        Rules {
            keep_in_flight_orphans: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    // Safety still holds (the generation check drops the old answer), but
    // the probe is not shared: the recreated key is probed again while the
    // first probe is out.
    assert!(broke.contains("probed 2 times at once"), "{broke}");
}

#[test]
fn the_generation_check_when_applying_is_redundant_while_in_flight_states_are_retained() {
    // Stale answers cannot arise: a state in flight is never removed by a
    // cleanup, so it is never recreated while its probe is out. The check is
    // defence in depth; this test records that finding.
    let broke = without(
        "without the generation check when applying",
        Rules {
            apply_checks_generation: false,
            ..Rules::default()
        },
    );
    assert_eq!(broke, None);
}

#[test]
fn without_retention_and_the_generation_check_a_stale_answer_is_read() {
    let broke = without(
        "without retention and the generation check",
        Rules {
            apply_checks_generation: false,
            keep_in_flight_orphans: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(
        broke.starts_with("anomaly") || broke.contains("probed 2 times"),
        "{broke}"
    );
}

#[test]
fn without_orphan_removal_answers_pile_up_for_nobody() {
    let broke = without(
        "without orphan removal",
        Rules {
            remove_answered_orphans: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("liveness"), "{broke}");
}

#[test]
fn without_skipping_stale_batch_entries_a_generation_is_probed_twice() {
    let broke = without(
        "without skipping stale batch entries",
        Rules {
            flush_skips_stale_entries: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    // The old generation's entry is probed beside the new one's.
    assert!(broke.contains("probed 2 times at once"), "{broke}");
}

#[test]
fn without_the_ticket_generation_a_late_mark_miss_corrupts_a_newer_lookup() {
    let broke = without(
        "without the ticket's generation",
        Rules {
            ticket_checks_generation: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("stale verdict"), "{broke}");
}

#[test]
fn without_the_known_key_rule_a_key_is_probed_twice() {
    let broke = without(
        "without the known-key rule",
        Rules {
            known_keys_not_rebatched: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("key"), "{broke}");
}

#[test]
fn with_deadlines_admission_and_given_up_groups_every_reachable_state_is_safe_and_live() {
    let report = explore("bounded design", Rules::default(), bounded());
    if let Some(violation) = report.violation {
        panic!("{violation}");
    }
    assert!(report.states > 1_000, "the model explored almost nothing");
}

#[test]
fn with_deadlines_the_generation_check_when_applying_is_no_longer_redundant() {
    // An overdue orphan is removed at cleanup and the key recreated while
    // the old probe is out: its late answer must not resolve the new state.
    let broke = without_bounded(
        "bounded, without the generation check when applying",
        Rules {
            apply_checks_generation: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(
        broke.starts_with("stale verdict") || broke.starts_with("anomaly"),
        "{broke}"
    );
}

#[test]
fn without_admission_the_outstanding_keys_exceed_their_bound() {
    let broke = without_bounded(
        "bounded, without admission",
        Rules {
            admission_bounds_outstanding: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("outstanding"), "{broke}");
}

#[test]
fn without_removing_overdue_orphans_a_deadline_miss_outlives_its_requests() {
    let broke = without_bounded(
        "bounded, keeping overdue orphans",
        Rules {
            remove_overdue_orphans: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("deadline miss outlives"), "{broke}");
}

#[test]
fn giving_up_a_wanted_group_gives_a_miss_the_tier_never_said() {
    let broke = without_bounded(
        "bounded, giving up wanted groups",
        Rules {
            give_up_only_unwanted: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("stale verdict"), "{broke}");
}

#[test]
fn joining_a_given_up_probe_gives_a_miss_the_tier_never_said() {
    let broke = without_bounded(
        "bounded, joining probes let go",
        Rules {
            join_after_release_starts_afresh: false,
            ..Rules::default()
        },
    )
    .expect("a counterexample");
    assert!(broke.starts_with("stale verdict"), "{broke}");
}
