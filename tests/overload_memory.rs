//! Memory under sustained overload, bounded and unbounded, measured with a
//! counting allocator (its own test binary: the allocator is global, and
//! the other memory test must not see these allocations).

use std::sync::atomic::Ordering;

use kvtier::lookup::LookupTable;

#[path = "common/counting.rs"]
mod counting;

use counting::LIVE;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// A scheduler step loop against a tier that answers one group per step,
/// offered ten requests of 16 keys a step (10x its capacity); a request
/// leaves once none of its keys is pending. Returns the most bytes allocated
/// (table, the tier's queue and the live requests) at the end of a step in
/// the second quarter of the `early` first steps, and in the last quarter of
/// all `late` steps: peaks, since a map may grow or shrink between samples
/// (the tables' hashers are seeded at random, so when differs run to run).
fn overloaded(limits: kvtier::lookup::LookupLimits, early: u64, late: u64) -> (usize, usize) {
    use kvtier::lookup::Group;
    use std::collections::VecDeque;

    let before = LIVE.load(Ordering::Relaxed);
    let mut table: LookupTable<u64, u64> = LookupTable::with_limits(limits).unwrap();
    let mut queue: VecDeque<Group<u64, u64>> = VecDeque::new();
    let mut live: Vec<u64> = Vec::new();
    let mut verdicts = Vec::new();
    let mut keys = Vec::with_capacity(16);
    let mut sizes = (0, 0);
    for step in 0..late {
        live.extend((0..10).map(|i| step * 10 + i));
        live.retain(|&request| {
            keys.clear();
            keys.extend((0..16).map(|block| (request << 4) | block));
            table.lookup_all(&keys, &request, &mut verdicts);
            let done = !verdicts.iter().any(|verdict| verdict.is_pending());
            if done {
                table.cleanup(&request);
            }
            !done
        });
        if let Some(submission) = table.take_submission() {
            queue.extend(submission.into_groups());
        }
        // The tier: one group a step, unless nobody wants it any more.
        if let Some(group) = queue.pop_front() {
            let result = if group.claim() {
                let answers: Vec<bool> = group.keys().iter().map(|k| k % 2 == 0).collect();
                group.answered(answers)
            } else {
                group.abandoned()
            };
            table.apply(result);
        }
        let now = LIVE.load(Ordering::Relaxed) - before;
        if (early / 4..early / 2).contains(&step) {
            sizes.0 = sizes.0.max(now);
        }
        if step >= late - late / 4 {
            sizes.1 = sizes.1.max(now);
        }
    }
    table.check_invariants().unwrap();
    sizes
}

/// L14 and L13 together: under sustained 10x overload, with a budget and
/// admission bounds, the peak over steps 12,000–16,000 is within half again
/// the peak over steps 1,000–2,000 (one map doubling between them, no more;
/// a leak of ten bytes a step would show); without them memory keeps
/// growing (which shows the check can fail; fewer steps there, as every
/// waiting request is looked up every step).
#[test]
fn under_sustained_overload_bounded_memory_stays_flat_and_unbounded_memory_grows() {
    let bounded = kvtier::lookup::LookupLimits::default()
        .pending_steps(Some(20))
        .max_outstanding_keys(1024)
        .max_outstanding_groups(64);
    let (early, late) = overloaded(bounded, 4_000, 16_000);
    println!("bounded: peak {early} bytes in steps 1,000-2,000, {late} in 12,000-16,000");
    assert!(
        late <= early + early / 2,
        "bounded memory grew from {early} to {late} bytes"
    );
    let (early, late) = overloaded(kvtier::lookup::LookupLimits::unbounded(), 200, 400);
    println!("unbounded: peak {early} bytes in steps 50-100, {late} in 300-400");
    assert!(
        late > 3 * early,
        "unbounded memory did not grow: {early} → {late}"
    );
}
