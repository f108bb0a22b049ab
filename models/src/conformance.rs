//! Comparing the real table with the specification.

use kvtier::{Verdict, lookup::LookupTable, lookup::Phase as RealPhase};

use crate::reference::{Expected, Key, Phase, Reference, Req};

/// The table under test: `u64` keys and requests, like the model.
pub type Table = LookupTable<Key, Req>;

/// Checks that a real verdict is the one the specification expects.
pub fn check_verdict(real: &Verdict<Key>, expected: Expected) -> Result<(), String> {
    let agrees = match (real, expected) {
        (Verdict::Hit(ticket), Expected::Hit(generation)) => {
            ticket.generation().get() == generation
        }
        (Verdict::Miss, Expected::Miss) | (Verdict::Pending, Expected::Pending) => true,
        _ => false,
    };
    if agrees {
        Ok(())
    } else {
        Err(format!(
            "verdict {real:?}, specification expects {expected:?}"
        ))
    }
}

/// Checks that the table tracks exactly the specification's keys, each in
/// the same generation and phase with the same number of requesters, the same
/// live requests, every counter the specification determines (lookups and
/// their verdicts, submissions, stale answers, orphans, marked misses,
/// deadline misses, late answers, shed keys, abandoned groups, what is
/// outstanding), no anomaly, and intact internal invariants (which include
/// the admission bounds).
pub fn check_state(table: &Table, spec: &Reference) -> Result<(), String> {
    table.check_invariants().map_err(|why| why.to_string())?;
    if table.len() != spec.keys.len() {
        return Err(format!(
            "table tracks {} keys, specification {}",
            table.len(),
            spec.keys.len()
        ));
    }
    for (key, model) in &spec.keys {
        let Some(real) = table.key_state(key) else {
            return Err(format!("key {key} missing from the table"));
        };
        let phase = match real.phase {
            RealPhase::Pending => Phase::Pending,
            RealPhase::InFlight => Phase::InFlight,
            RealPhase::Overdue => Phase::Overdue,
            RealPhase::Resolved { found } => Phase::Resolved(found),
        };
        if real.generation.get() != model.generation
            || phase != model.phase
            || real.requesters != model.requesters.len()
        {
            return Err(format!(
                "key {key}: table {real:?}, specification {model:?}"
            ));
        }
    }
    if table.request_count() != spec.requests().len() {
        return Err(format!(
            "table holds {} requests, specification {}",
            table.request_count(),
            spec.requests().len()
        ));
    }
    let stats = table.stats();
    let counts = [
        stats.lookups,
        stats.hits,
        stats.misses,
        stats.pending,
        stats.keys_submitted,
        stats.groups_submitted,
        stats.stale_results,
        stats.orphans_dropped,
        stats.marked_miss,
        stats.deadline_misses,
        stats.late_answers,
        stats.shed,
        stats.abandoned,
        stats.settled_hits,
        stats.settled_misses,
        table.outstanding_keys() as u64,
        table.outstanding_groups() as u64,
    ];
    let c = spec.counts;
    let expected = [
        c.lookups,
        c.hits,
        c.misses,
        c.pending,
        c.keys_submitted,
        c.groups_submitted,
        c.stale_results,
        c.orphans_dropped,
        c.marked_miss,
        c.deadline_misses,
        c.late_answers,
        c.shed,
        c.abandoned,
        c.settled_hits,
        c.settled_misses,
        spec.outstanding_keys as u64,
        spec.outstanding_groups as u64,
    ];
    if counts != expected {
        return Err(format!(
            "counters (lookups, hits, misses, pending, keys submitted, groups submitted, \
             stale, orphans, marked miss, deadline misses, late answers, shed, abandoned, \
             settled hits, settled misses, outstanding keys, outstanding groups): table {counts:?}, specification {expected:?}"
        ));
    }
    if stats.anomalies != 0 {
        return Err(format!("{} anomalies", stats.anomalies));
    }
    Ok(())
}
