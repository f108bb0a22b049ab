//! The ledger's rules, one scenario each; `models/` checks them against a
//! reference model on random sequences.

use super::*;

fn granted<K: std::fmt::Debug>(admission: Admission<K>) -> Reservation<K> {
    match admission {
        Admission::Granted(reservation) => reservation,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn victims<K: std::fmt::Debug>(admission: Admission<K>) -> Vec<Victim<K>> {
    match admission {
        Admission::Evict(victims) => victims,
        other => panic!("expected victims, got {other:?}"),
    }
}

/// Stores `key` of `bytes`, evicting as asked; the victims' keys.
fn store(ledger: &mut CapacityLedger<u32>, key: u32, bytes: u64) -> Vec<u32> {
    let mut gone = Vec::new();
    loop {
        match ledger.reserve(key, bytes) {
            Admission::Granted(r) => {
                ledger.commit(r).unwrap();
                ledger.audit().unwrap();
                return gone;
            }
            Admission::Evict(victims) => {
                for victim in victims {
                    gone.push(*victim.key());
                    ledger.evicted(victim).unwrap();
                }
            }
            other => panic!("store of {key}: {other:?}"),
        }
        ledger.audit().unwrap();
    }
}

#[test]
fn lru_evicts_the_least_recently_used_block_and_only_as_many_as_needed() {
    let mut ledger = CapacityLedger::new(300, Policy::Lru);
    for key in 1..=3 {
        assert!(store(&mut ledger, key, 100).is_empty());
    }
    // A read makes 1 the most recently used.
    let pin = ledger.pin(&1).unwrap();
    ledger.unpin(pin).unwrap();
    assert_eq!(store(&mut ledger, 4, 100), vec![2]);
    assert_eq!(store(&mut ledger, 5, 150), vec![3, 1]);
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.resident_bytes,
            stats.entries,
            stats.evictions,
            stats.evicted_bytes
        ),
        (250, 2, 3, 300)
    );
}

#[test]
fn pinned_reserved_and_evicting_blocks_are_never_victims() {
    let mut ledger = CapacityLedger::new(300, Policy::Lru);
    store(&mut ledger, 1, 100);
    store(&mut ledger, 2, 100);
    let pin = ledger.pin(&1).unwrap();
    let writing = granted(ledger.reserve(3, 100));
    // Only 2 can go.
    let gone = victims(ledger.reserve(4, 100));
    assert_eq!(gone.iter().map(|v| *v.key()).collect::<Vec<_>>(), vec![2]);
    // While 2 is being deleted, its room is not there yet, and nothing else
    // can go: ask again later.
    assert_eq!(format!("{:?}", ledger.reserve(5, 100)), "Rejected(Busy)");
    for victim in gone {
        ledger.evicted(victim).unwrap();
    }
    let fourth = granted(ledger.reserve(4, 100));
    // Everything is pinned or reserved now.
    assert_eq!(format!("{:?}", ledger.reserve(5, 100)), "Rejected(NoRoom)");
    assert_eq!(ledger.stats().rejected_no_room, 1);
    assert_eq!(ledger.stats().rejected_busy, 1);
    ledger.unpin(pin).unwrap();
    ledger.commit(writing).unwrap();
    ledger.abort(fourth).unwrap();
    ledger.audit().unwrap();
    assert_eq!(ledger.stats().reserved_bytes, 0);
    assert_eq!(ledger.stats().resident_bytes, 200);
}

#[test]
fn resident_plus_reserved_stays_within_the_capacity_while_victims_are_deleted() {
    let mut ledger = CapacityLedger::new(250, Policy::Lru);
    store(&mut ledger, 1, 100);
    store(&mut ledger, 2, 100);
    let gone = victims(ledger.reserve(3, 100));
    // The victim's file is still there: its bytes still count.
    assert_eq!(ledger.stats().resident_bytes, 200);
    assert_eq!(ledger.stats().reserved_bytes, 0);
    for victim in gone {
        ledger.evicted(victim).unwrap();
    }
    let third = granted(ledger.reserve(3, 100));
    let stats = ledger.stats();
    assert!(stats.resident_bytes + stats.reserved_bytes <= 250);
    ledger.commit(third).unwrap();
}

#[test]
fn a_block_larger_than_the_capacity_and_a_busy_block_are_refused_and_a_resident_one_is_present() {
    let mut ledger = CapacityLedger::new(100, Policy::Lru);
    assert_eq!(
        format!("{:?}", ledger.reserve(1, 101)),
        "Rejected(TooLarge)"
    );
    let first = granted(ledger.reserve(1, 50));
    // A second store of the same block while the first writes it.
    assert_eq!(format!("{:?}", ledger.reserve(1, 50)), "Rejected(Busy)");
    ledger.commit(first).unwrap();
    assert_eq!(format!("{:?}", ledger.reserve(1, 50)), "Present");
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.rejected_too_large,
            stats.rejected_busy,
            stats.already_resident
        ),
        (1, 1, 1)
    );
}

#[test]
fn tokens_are_released_once_and_only_in_their_own_ledger() {
    let mut one = CapacityLedger::new(100, Policy::Lru);
    let mut two = CapacityLedger::new(100, Policy::Lru);
    let a = granted(one.reserve(7, 10));
    let b = granted(two.reserve(7, 10));
    // Both ledgers' first incarnation: the token matches by key and life.
    // A token of a later life of the key is refused.
    two.abort(b).unwrap();
    let b2 = granted(two.reserve(7, 10));
    assert_eq!(one.commit(b2), Err(LedgerError::Unknown("reservation")));
    one.commit(a).unwrap();
    let pin = one.pin(&7).unwrap();
    let forged = Pin {
        key: 7,
        incarnation: 99,
    };
    assert_eq!(one.unpin(forged), Err(LedgerError::Unknown("pin")));
    one.unpin(pin).unwrap();
    let again = Pin {
        key: 7,
        incarnation: 1,
    };
    assert_eq!(one.unpin(again), Err(LedgerError::Unknown("pin")));
    one.audit().unwrap();
}

#[test]
fn a_victim_is_reported_once_and_only_while_it_is_evicted() {
    let mut ledger = CapacityLedger::new(100, Policy::Lru);
    store(&mut ledger, 1, 60);
    let mut gone = victims(ledger.reserve(2, 60));
    let victim = gone.pop().unwrap();
    let copy = Victim {
        key: 1,
        bytes: 60,
        incarnation: victim.incarnation,
        cause: Cause::Admission,
    };
    ledger.evicted(victim).unwrap();
    assert_eq!(ledger.evicted(copy), Err(LedgerError::Unknown("victim")));
    // Written again and chosen again: a victim token of its earlier life is
    // refused, the current one taken.
    store(&mut ledger, 1, 30);
    let mut again = victims(ledger.reserve(3, 80));
    let current = again.pop().unwrap();
    assert_eq!(current.key(), &1);
    let stale = || Victim {
        key: 1,
        bytes: 30,
        incarnation: 1,
        cause: Cause::Admission,
    };
    assert_eq!(ledger.evicted(stale()), Err(LedgerError::Unknown("victim")));
    assert_eq!(
        ledger.eviction_failed(stale()),
        Err(LedgerError::Unknown("victim"))
    );
    ledger.evicted(current).unwrap();
    let stats = ledger.stats();
    assert_eq!((stats.resident_bytes, stats.evictions), (0, 2));
    ledger.audit().unwrap();
}

#[test]
fn a_block_lost_while_pinned_leaves_at_its_last_unpin() {
    let mut ledger = CapacityLedger::new(100, Policy::Lru);
    store(&mut ledger, 1, 40);
    let first = ledger.pin(&1).unwrap();
    let second = ledger.pin(&1).unwrap();
    assert!(ledger.lose(&1));
    assert!(!ledger.is_resident(&1));
    assert!(ledger.pin(&1).is_none());
    ledger.unpin(first).unwrap();
    assert_eq!(ledger.stats().resident_bytes, 40);
    ledger.unpin(second).unwrap();
    ledger.audit().unwrap();
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.resident_bytes,
            stats.entries,
            stats.lost,
            stats.pin_misses
        ),
        (0, 0, 1, 1)
    );
}

#[test]
fn seeding_keeps_the_newest_blocks_that_fit_and_trims_the_rest() {
    let mut ledger = CapacityLedger::new(250, Policy::Lru);
    // Newest first, as a startup scan sorted by file time hands them over.
    assert!(ledger.seed(30, 100).is_none());
    assert!(ledger.seed(20, 100).is_none());
    let trimmed = ledger.seed(10, 100).expect("no room for the oldest");
    assert_eq!((trimmed.key(), trimmed.cause()), (&10, Cause::StartupTrim));
    ledger.evicted(trimmed).unwrap();
    assert!(ledger.seed(5, 50).is_none());
    ledger.audit().unwrap();
    // The oldest seeded block goes first; a new store is newer than all.
    assert_eq!(store(&mut ledger, 40, 100), vec![5, 20]);
    let stats = ledger.stats();
    assert_eq!((stats.startup_trims, stats.evictions), (1, 3));
}

#[test]
fn a_lowered_capacity_trims_what_it_can_and_admits_nothing_until_it_fits() {
    let mut ledger = CapacityLedger::new(300, Policy::Lru);
    for key in 1..=3 {
        store(&mut ledger, key, 100);
    }
    let pin = ledger.pin(&1).unwrap();
    let trims = ledger.set_capacity(100);
    assert_eq!(
        trims.iter().map(|v| *v.key()).collect::<Vec<_>>(),
        vec![2, 3]
    );
    for victim in trims {
        ledger.evicted(victim).unwrap();
    }
    assert_eq!(ledger.stats().trims, 2);
    assert_eq!(format!("{:?}", ledger.reserve(9, 10)), "Rejected(NoRoom)");
    ledger.unpin(pin).unwrap();
    assert_eq!(store(&mut ledger, 9, 10), vec![1]);
    ledger.audit().unwrap();
}

#[test]
fn a_failed_deletion_keeps_the_block_resident() {
    let mut ledger = CapacityLedger::new(200, Policy::Lru);
    store(&mut ledger, 1, 100);
    store(&mut ledger, 2, 100);
    let gone = victims(ledger.reserve(3, 100));
    for victim in gone {
        ledger.eviction_failed(victim).unwrap();
    }
    assert!(ledger.is_resident(&1));
    assert_eq!(ledger.stats().eviction_failures, 1);
    // It went to the back of the line: 2 goes next.
    assert_eq!(store(&mut ledger, 3, 100), vec![2]);
}

/// A hot set read again and again, then a scan of blocks read once:
/// S3-FIFO keeps the hot set, LRU does not.
#[test]
fn s3fifo_keeps_a_hot_set_through_a_scan_that_flushes_lru() {
    let survivors = |policy| {
        let mut ledger = CapacityLedger::new(100 * 20, policy);
        for round in 0..3 {
            for key in 0..10 {
                if round == 0 {
                    store(&mut ledger, key, 100);
                } else {
                    let pin = ledger.pin(&key).unwrap();
                    ledger.unpin(pin).unwrap();
                }
            }
        }
        for key in 1000..1030 {
            store(&mut ledger, key, 100);
        }
        (0..10).filter(|key| ledger.is_resident(key)).count()
    };
    assert_eq!(survivors(Policy::Lru), 0);
    assert_eq!(survivors(Policy::S3Fifo), 10);
}

#[test]
fn policies_are_named_in_configurations() {
    assert_eq!(Policy::from_name("lru"), Some(Policy::Lru));
    assert_eq!(Policy::from_name("s3fifo"), Some(Policy::S3Fifo));
    // One spelling: the names an error lists are the names accepted.
    assert_eq!(Policy::from_name("LRU"), None);
    assert_eq!(Policy::from_name("s3-fifo"), None);
    assert_eq!(Policy::from_name("clock"), None);
    assert_eq!(Policy::S3Fifo.name(), "s3fifo");
}

#[test]
fn guards_release_their_tokens_once_on_commit_on_drop_and_on_a_panic() {
    let ledger = SharedLedger::new(100, Policy::Lru);
    let Ok(Admitted::Write(write)) = ledger.admit(1u32, 60, |_| true) else {
        panic!("no room")
    };
    write.commit();
    assert!(matches!(
        ledger.admit(1, 60, |_| true),
        Ok(Admitted::Present)
    ));
    let pin = ledger.pin(&1).unwrap();
    // Pinned: nothing can make room for 2.
    assert_eq!(ledger.admit(2, 60, |_| true).err(), Some(Rejection::NoRoom));
    drop(pin);
    // A delete that panics: the victim is reported as not deleted, and the
    // block stays resident.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = ledger.admit(2, 60, |_| panic!("the disk went away"));
    }));
    assert!(unwound.is_err());
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.resident_bytes,
            stats.eviction_failures,
            stats.pinned_entries
        ),
        (60, 1, 0)
    );
    // A write that fails (its guard dropped) gives its room back.
    let Ok(Admitted::Write(write)) = ledger.admit(2, 60, |_| true) else {
        panic!("no room")
    };
    assert_eq!(write.bytes(), 60);
    drop(write);
    let stats = ledger.stats();
    assert_eq!(
        (
            stats.resident_bytes,
            stats.reserved_bytes,
            stats.aborted,
            stats.evictions
        ),
        (0, 0, 1, 1)
    );
    ledger.with(|l| l.audit()).unwrap();
}

// Real threads on std's scoped threads, which the shim does not offer (the
// model checkers run this race as models/tests/loom_capacity.rs and
// shuttle_capacity.rs): not built under their cfgs.
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
#[test]
fn threads_storing_and_reading_keep_the_budget_and_never_delete_a_pinned_block() {
    use crate::sync::atomic::{AtomicU32, Ordering};
    const KEYS: usize = 16;
    let ledger = SharedLedger::new(500, Policy::S3Fifo);
    ledger.with(|l| l.record_changes(true));
    let readers: Vec<AtomicU32> = (0..KEYS).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|scope| {
        for thread in 0..4u32 {
            let (ledger, readers) = (&ledger, &readers);
            scope.spawn(move || {
                for i in 0..2000u32 {
                    let key = ((i * 7 + thread * 3) % KEYS as u32) as usize;
                    if i % 3 == 0 {
                        if let Some(pin) = ledger.pin(&key) {
                            readers[key].fetch_add(1, Ordering::SeqCst);
                            std::thread::yield_now();
                            readers[key].fetch_sub(1, Ordering::SeqCst);
                            drop(pin);
                        }
                    } else {
                        let admitted = ledger.admit(key, 60 + u64::from(i % 40), |victim| {
                            assert_eq!(
                                readers[*victim].load(Ordering::SeqCst),
                                0,
                                "deleted under a read"
                            );
                            true
                        });
                        if let Ok(Admitted::Write(write)) = admitted {
                            let stats = ledger.stats();
                            assert!(stats.resident_bytes + stats.reserved_bytes <= 500);
                            if i % 11 == 0 {
                                drop(write)
                            } else {
                                write.commit()
                            }
                        }
                    }
                }
            });
        }
    });
    ledger.with(|l| l.audit()).unwrap();
    let stats = ledger.stats();
    assert!(stats.evictions > 0 && stats.committed > 0);
    assert_eq!((stats.reserved_bytes, stats.pinned_entries), (0, 0));
    assert!(stats.resident_bytes <= 500);
    // The log, replayed, says exactly which blocks are resident.
    let mut last = [false; KEYS];
    for (key, present) in ledger.with(|l| {
        let mut changes = Vec::new();
        l.take_changes(&mut changes);
        changes
    }) {
        last[key] = present;
    }
    for (key, present) in last.into_iter().enumerate() {
        assert_eq!(present, ledger.with(|l| l.is_resident(&key)), "block {key}");
    }
}

#[test]
fn the_change_log_says_what_came_and_went_in_order() {
    let mut ledger = CapacityLedger::new(101, Policy::Lru);
    let mut changes = Vec::new();
    store(&mut ledger, 1, 60);
    ledger.take_changes(&mut changes);
    assert!(changes.is_empty(), "nothing logged until asked");
    ledger.record_changes(true);
    store(&mut ledger, 2, 40);
    assert_eq!(store(&mut ledger, 3, 60), [1]);
    // A write that fails and a deletion that fails change no file.
    let aborted = granted(ledger.reserve(4, 1));
    ledger.abort(aborted).unwrap();
    let failed = victims(ledger.reserve(5, 60));
    for victim in failed {
        ledger.eviction_failed(victim).unwrap();
    }
    // A block found damaged while pinned is gone at once for the lookups.
    let pin = ledger.pin(&3).unwrap();
    assert!(ledger.lose(&3));
    ledger.take_changes(&mut changes);
    assert_eq!(
        changes,
        [(2, true), (1, false), (3, true), (3, false)],
        "stored 2, evicted 1, stored 3, lost 3"
    );
    ledger.unpin(pin).unwrap();
    changes.clear();
    ledger.take_changes(&mut changes);
    assert!(changes.is_empty(), "each change is taken once");
    assert_eq!(ledger.stats().changes_dropped, 0);
}
