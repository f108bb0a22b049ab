//! The lookup table gives memory back after large cleanups, measured with a
//! counting allocator (its own test binary: the allocator is global).

use std::sync::atomic::Ordering;

use kvtier::lookup::LookupTable;

#[path = "common/counting.rs"]
mod counting;

use counting::LIVE;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// 10^5 requests of 8 keys each come and go; what the table holds
/// afterwards must be a small fraction of what it held at its peak, and
/// the same again after a second wave (nothing accumulates).
#[test]
fn memory_is_given_back_after_a_large_cleanup() {
    let requests = 100_000u64;
    let mut table: LookupTable<u64, u64> = LookupTable::new();
    let before = LIVE.load(Ordering::Relaxed);
    let mut after_waves = Vec::new();
    let mut peaks = Vec::new();
    for wave in 0..2u64 {
        for request in 0..requests {
            for block in 0..8 {
                table.lookup(&((wave << 40) | (request << 3) | block), &request);
            }
        }
        if let Some(submission) = table.take_submission() {
            for group in submission.into_groups() {
                let answers: Vec<bool> = group.keys().iter().map(|k| k % 2 == 0).collect();
                table.apply(group.answered(answers));
            }
        }
        peaks.push(LIVE.load(Ordering::Relaxed) - before);
        for request in 0..requests {
            table.cleanup(&request);
        }
        table.check_invariants().unwrap();
        assert!(table.is_empty());
        after_waves.push(LIVE.load(Ordering::Relaxed).saturating_sub(before));
    }
    println!("peak {peaks:?} bytes, after cleanup {after_waves:?} bytes");
    for (peak, after) in peaks.iter().zip(&after_waves) {
        assert!(*peak > 20 << 20, "the peak holds 8 * 10^5 keys: {peak}");
        assert!(
            *after < 1 << 20,
            "{after} bytes stay allocated after every request was cleaned up (peak {peak})"
        );
    }
}
