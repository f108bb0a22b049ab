//! Results the public API cannot produce (a duplicate, a foreign
//! generation), built by hand to show the table's last-line guards.

use super::storage::*;
use super::*;
use crate::lookup::{Generation, GroupOutcome, GroupResult, Phase, Verdict};

fn result_for(
    table: &LookupTable<u64, u64>,
    key: u64,
    generation: Generation,
    found: bool,
) -> GroupResult<u64> {
    GroupResult {
        table: table.id,
        seq: 0,
        number: 0,
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
    table.apply(result_for(&table, 5, Generation(current.0 + 1), true));
    table.apply(result_for(&table, 6, current, true)); // no such key
    assert_eq!(table.stats().stale_results, 2);
    assert_eq!(table.key_state(&5).unwrap().phase, Phase::InFlight);
    table.apply(result_for(&table, 5, current, false));
    assert_eq!(table.lookup(&5, &1), Verdict::Miss);
    assert_eq!(table.stats().anomalies, 0);
}

#[test]
fn a_duplicate_result_is_counted_as_an_anomaly_and_changes_nothing() {
    let mut table = LookupTable::<u64, u64>::new();
    let generation = in_flight(&mut table, 5, 1);
    table.apply(result_for(&table, 5, generation, true));
    table.apply(result_for(&table, 5, generation, false));
    assert_eq!(table.stats().anomalies, 1);
    assert!(table.lookup(&5, &1).is_hit(), "the first answer stands");
}

#[test]
fn a_result_for_a_pending_state_is_an_anomaly() {
    let mut table = LookupTable::<u64, u64>::new();
    table.lookup(&5, &1);
    let generation = table.key_state(&5).unwrap().generation;
    table.apply(result_for(&table, 5, generation, true));
    assert_eq!(table.stats().anomalies, 1);
    assert_eq!(table.key_state(&5).unwrap().phase, Phase::Pending);
    // The key is still submitted and resolved normally afterwards.
    let group = table.take_submission().unwrap().into_groups().remove(0);
    table.apply(group.answered([true]));
    assert!(table.lookup(&5, &1).is_hit());
}

#[test]
fn a_flush_leaves_out_exactly_the_batched_keys_cleanup_removed() {
    let mut table = LookupTable::<u64, u64>::new();
    table.lookup(&5, &1);
    table.lookup(&6, &1);
    table.lookup(&6, &2);
    table.lookup(&7, &2);
    table.cleanup(&1); // removes pending 5; 6 is still held by 2
    table.lookup(&5, &3); // a new state for 5, batched again
    let submission = table.take_submission().expect("keys left");
    let batched: Vec<(u64, u64)> = submission
        .groups()
        .iter()
        .flat_map(|g| {
            g.keys
                .iter()
                .zip(&g.generations)
                .map(|(k, gen_)| (*k, gen_.0))
        })
        .collect();
    assert_eq!(batched, [(6, 1), (7, 2), (5, 3)]);
    assert!(table.dropped_pending.is_empty(), "cleared by the flush");
    for key in [5, 6, 7] {
        assert_eq!(table.key_state(&key).unwrap().phase, Phase::InFlight);
    }
    table.lookup(&8, &3);
    assert_eq!(table.key_state(&8).unwrap().phase, Phase::Pending);
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
    fn slot(table: &LookupTable<u64, u64>, id: u64) -> usize {
        table.slot_of[&id] as usize
    }
    fn expect(table: &LookupTable<u64, u64>, needle: &str) {
        let error = table.check_invariants().unwrap_err();
        assert!(error.message().contains(needle), "{error}");
    }
    fn entry(table: &mut LookupTable<u64, u64>, key: u64) -> &mut Entry {
        table.keys.find_mut(&key).unwrap()
    }
    fn cell(table: &LookupTable<u64, u64>, key: u64) -> u32 {
        table.keys.find(table.keys.hash(&key), &key).unwrap()
    }

    let mut table = populated();
    let s1 = slot(&table, 1);
    table.slots[s1].keys.push(7);
    expect(&table, "no state");

    let mut table = populated();
    entry(&mut table, 6).first = NONE;
    expect(&table, "does not list it");

    // The key store: a vacant cell off the free chain, an index entry
    // pointing at another key's cell.
    let mut table = populated();
    table.lookup(&7, &3);
    table.cleanup(&3);
    assert!(table.keys.leak_free_cell());
    expect(&table, "a key cell leaked");

    let mut table = populated();
    let (five, six) = (cell(&table, 5), cell(&table, 6));
    table.keys.misindex(five, six);
    expect(&table, "not indexed under its key");

    let mut table = populated();
    let s1 = slot(&table, 1);
    table.slots[s1].id = None;
    table.slots[s1].keys.clear();
    table.slot_of.remove(&1);
    expect(&table, "lists unknown request");

    let mut table = populated();
    let s2 = slot(&table, 2);
    entry(&mut table, 6).first = NONE;
    let five = cell(&table, 5);
    table.slots[s2].keys.retain(|&cell| cell == five);
    expect(&table, "no requesters");

    let mut table = populated();
    let s2 = slot(&table, 2) as u32;
    let five = table.keys.find_mut(&5).unwrap();
    table.overflow.add(five, s2);
    expect(&table, "a duplicate");

    let mut table = populated();
    let s1 = slot(&table, 1);
    table.slots[s1].id = None;
    expect(&table, "free slot");

    let mut table = populated();
    table.slot_of.insert(1, 7);
    expect(&table, "not indexed at its slot");

    let mut table = populated();
    table.free_slots.push(0);
    expect(&table, "a slot leaked or is listed twice");

    let mut table = populated();
    table.slot_of.insert(9, 0);
    expect(&table, "indexed request ids");

    let mut table = populated();
    let s1 = slot(&table, 1);
    entry(&mut table, 5).first = NONE;
    table.slots[s1].keys.clear();
    expect(&table, "overflow requesters but no first");
}

#[test]
fn requesters_beyond_the_first_come_and_go_through_reused_lists() {
    let mut table = LookupTable::<u64, u64>::new();
    for request in 1..=4 {
        table.lookup(&5, &request);
    }
    assert_eq!(table.key_state(&5).unwrap().requesters, 4);
    assert_eq!(table.overflow.lists.len(), 1);
    // Cleaning up the first requester promotes one from the list.
    table.cleanup(&1);
    table.cleanup(&3);
    assert_eq!(table.key_state(&5).unwrap().requesters, 2);
    table.check_invariants().unwrap();
    table.cleanup(&4);
    // One requester left: the list went back to the free pool.
    assert_eq!(table.overflow.free.len(), 1);
    table.lookup(&6, &2);
    table.lookup(&6, &7);
    assert_eq!(table.overflow.lists.len(), 1, "the freed list was reused");
    table.check_invariants().unwrap();
    table.cleanup(&2);
    table.cleanup(&7);
    assert!(table.key_state(&5).is_none());
    assert!(
        table.key_state(&6).is_none(),
        "pending, not in flight: removed"
    );
    assert!(table.is_empty());
}

/// Compaction after a large cleanup keeps every live request's slot and
/// every in-flight state, and slots are reused afterwards.
#[test]
fn compaction_after_a_large_cleanup_keeps_live_requests_and_probes_in_flight() {
    let mut table = LookupTable::<u64, u64>::new();
    let requests = 3 * SPARE_SLOTS as u64;
    for request in 0..requests {
        table.lookup(&request, &request);
        table.lookup(&(request % 7 + 1_000_000), &request); // shared
    }
    let submission = table.take_submission().unwrap();
    let slots_before = table.slots.len();
    // Keep every 100th request, and the last one (the highest slot).
    for request in (0..requests).filter(|r| r % 100 != 0 && *r != requests - 1) {
        table.cleanup(&request);
    }
    assert!(table.slots.len() <= slots_before);
    assert!(
        table.free_slots.len() < slots_before,
        "compacted: {} free of {}",
        table.free_slots.len(),
        table.slots.len()
    );
    table.check_invariants().unwrap();
    // New requests reuse free slots; answers reach live and orphaned states.
    for request in requests..requests + 50 {
        table.lookup(&request, &request);
    }
    for group in submission.into_groups() {
        let answers = vec![true; group.len()];
        table.apply(group.answered(answers));
    }
    table.check_invariants().unwrap();
    assert!(table.lookup(&0, &0).is_hit());
    assert!(table.lookup(&(requests - 1), &(requests - 1)).is_hit());
    for request in (0..requests + 50).filter(|r| r % 100 == 0 || *r >= requests - 1) {
        table.cleanup(&request);
    }
    if let Some(submission) = table.take_submission() {
        for group in submission.into_groups() {
            table.apply(group.failed());
        }
    }
    table.check_invariants().unwrap();
    assert!(table.is_empty(), "{} keys left", table.len());
    assert!(
        table.slots.len() <= SPARE_SLOTS,
        "{} slots kept for no live request",
        table.slots.len()
    );
    assert_eq!(table.stats().anomalies, 0);
}

/// A key shared by very many requests indexes its requesters: each
/// link and unlink is a hash operation, not a scan of the others.
#[test]
fn a_key_shared_by_many_requests_links_and_unlinks_without_scans() {
    let mut table = LookupTable::<u64, u64>::new();
    let requests = 10_000u64;
    for request in 0..requests {
        table.lookup(&5, &request);
    }
    let entry = *table.keys.find_mut(&5).unwrap();
    assert_eq!(
        table.overflow.positions[&entry.more].len(),
        requests as usize - 1
    );
    assert_eq!(table.key_state(&5).unwrap().requesters, requests as usize);
    table.check_invariants().unwrap();
    // Out of order, so positions move under the index.
    for request in (0..requests).filter(|r| r % 3 == 0) {
        table.cleanup(&request);
    }
    table.check_invariants().unwrap();
    for request in (0..requests).filter(|r| r % 3 != 0) {
        table.cleanup(&request);
    }
    assert!(table.is_empty());
    assert!(
        table.overflow.positions.is_empty(),
        "indexes go with their lists"
    );
}
