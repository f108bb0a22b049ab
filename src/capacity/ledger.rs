//! The capacity ledger: every block's bytes, from reservation to eviction.

use std::collections::HashMap;
use std::hash::Hash;

use super::changes::ChangeLog;
use super::listings::Listings;
use super::policy::{Order, Policy};
use super::stats::CapacityStats;

/// Why a store gets no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// The block is larger than the whole capacity.
    TooLarge,
    /// Not enough bytes can be evicted: the rest is pinned by reads or
    /// reserved by writes.
    NoRoom,
    /// The block is being written or deleted by another operation, or room
    /// is being made by evictions not yet done: ask again later.
    Busy,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TooLarge => "the block is larger than the whole capacity",
            Self::NoRoom => "the other blocks are pinned by reads or reserved by writes",
            Self::Busy => "the block, or the room it needs, is being written or deleted",
        })
    }
}

/// A reservation's answer.
#[derive(Debug)]
#[must_use = "a granted reservation must be committed or aborted, and victims evicted"]
pub enum Admission<K> {
    /// Room is reserved: write the block, then
    /// [`commit`](CapacityLedger::commit) or [`abort`](CapacityLedger::abort).
    Granted(Reservation<K>),
    /// Room must be made first: delete each victim's file, report it with
    /// [`evicted`](CapacityLedger::evicted) (or
    /// [`eviction_failed`](CapacityLedger::eviction_failed)), then reserve
    /// again.
    Evict(Vec<Victim<K>>),
    /// The block is already resident: nothing to write.
    Present,
    /// No room for this block: the store is unsuccessful, nothing else is
    /// lost.
    Rejected(Rejection),
}

/// Bytes reserved for one block's write. Consumed by
/// [`commit`](CapacityLedger::commit) or [`abort`](CapacityLedger::abort).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation must be committed or aborted"]
pub struct Reservation<K> {
    key: K,
    bytes: u64,
    incarnation: u64,
}

impl<K> Reservation<K> {
    /// The block's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// One read's hold on a resident block. Consumed by
/// [`unpin`](CapacityLedger::unpin).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a pin must be unpinned"]
pub struct Pin<K> {
    pub(super) key: K,
    pub(super) incarnation: u64,
}

impl<K> Pin<K> {
    /// The block's key.
    pub fn key(&self) -> &K {
        &self.key
    }
}

/// Why a block is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// To make room for a store.
    Admission,
    /// The capacity was lowered.
    Trim,
    /// Found on disk at startup, beyond the capacity.
    StartupTrim,
    /// Over the capacity once the blocks other processes wrote were
    /// counted ([`reconcile`](CapacityLedger::reconcile)).
    Reconcile,
}

/// A block whose file the tier must delete. Consumed by
/// [`evicted`](CapacityLedger::evicted) or
/// [`eviction_failed`](CapacityLedger::eviction_failed).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a victim's deletion must be reported"]
pub struct Victim<K> {
    pub(super) key: K,
    pub(super) bytes: u64,
    pub(super) incarnation: u64,
    pub(super) cause: Cause,
}

impl<K> Victim<K> {
    /// The block's key.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The block's bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Why it is evicted.
    pub fn cause(&self) -> Cause {
        self.cause
    }
}

/// A token the ledger does not know: released twice, or of an earlier life
/// of its block.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum LedgerError {
    /// The reservation, pin or victim was already released, or belongs to
    /// an earlier life of its block.
    #[error("no such {0} in this ledger (released twice, or of an earlier life of its block)")]
    Unknown(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Being written.
    Reserved,
    /// On disk; `pins` reads hold it; `lost`: its file was found missing or
    /// damaged while pinned, dropped at the last unpin.
    Resident { pins: u32, lost: bool },
    /// Chosen as a victim; its file is being deleted.
    Evicting,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) bytes: u64,
    pub(super) state: State,
    /// Which life of the key this is: tokens of an earlier one are refused.
    pub(super) incarnation: u64,
    /// The listing clock when the block became resident: a listing begun
    /// later must have seen its file (see `reconcile.rs`).
    pub(super) since: u64,
}

/// A byte budget over a tier's blocks (see the [module docs](super)).
///
/// Invariants, checked by [`audit`](Self::audit) and by the models in
/// `models/` (docs/design.md, "Capacity"):
/// - resident plus reserved bytes never exceed the capacity, except after
///   the capacity was lowered, when nothing is admitted until they fit;
/// - a pinned, reserved or evicting block is never a victim;
/// - each reservation, pin and victim is released exactly once.
pub struct CapacityLedger<K> {
    capacity: u64,
    pub(super) entries: HashMap<K, Entry>,
    pub(super) order: Order<K>,
    /// Resident blocks with no pin: what eviction can free.
    pub(super) evictable_bytes: u64,
    /// Resident blocks being evicted (part of resident bytes).
    pub(super) evicting_bytes: u64,
    next_incarnation: u64,
    /// Listings begun (see `reconcile.rs`).
    pub(super) clock: u64,
    /// Listings under way and the blocks that left meanwhile.
    pub(super) listings: Listings<K>,
    pub(super) stats: CapacityStats,
    /// Which blocks came and went, while a consumer asked for it (see
    /// `changes.rs`).
    pub(super) changes: Option<ChangeLog<K>>,
}

impl<K: Clone + Eq + Hash> CapacityLedger<K> {
    /// An empty ledger of `capacity` bytes.
    pub fn new(capacity: u64, policy: Policy) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
            order: Order::new(policy, capacity),
            evictable_bytes: 0,
            evicting_bytes: 0,
            next_incarnation: 1,
            clock: 0,
            listings: Listings::default(),
            stats: CapacityStats {
                capacity_bytes: capacity,
                ..CapacityStats::default()
            },
            changes: None,
        }
    }

    /// The counters and gauges, in constant time.
    pub fn stats(&self) -> CapacityStats {
        self.stats
    }

    /// The budget, in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether `key` is resident (committed, not being evicted).
    pub fn is_resident(&self, key: &K) -> bool {
        matches!(
            self.entries.get(key),
            Some(Entry {
                state: State::Resident { lost: false, .. },
                ..
            })
        )
    }

    pub(super) fn incarnation(&mut self) -> u64 {
        self.next_incarnation += 1;
        self.next_incarnation - 1
    }

    pub(super) fn used(&self) -> u64 {
        self.stats.resident_bytes + self.stats.reserved_bytes
    }

    /// Asks for `bytes` of room to write `key`'s block (see [`Admission`]).
    pub fn reserve(&mut self, key: K, bytes: u64) -> Admission<K> {
        // guard: E1-a-block-larger-than-the-capacity-is-refused
        if bytes > self.capacity {
            self.stats.rejected_too_large += 1;
            return Admission::Rejected(Rejection::TooLarge);
        }
        match self.entries.get(&key).map(|e| e.state) {
            Some(State::Resident { lost: false, .. }) => {
                self.stats.already_resident += 1;
                return Admission::Present;
            }
            Some(_) => {
                // guard: E2-one-operation-per-block
                self.stats.rejected_busy += 1;
                return Admission::Rejected(Rejection::Busy);
            }
            None => {}
        }
        let used = self.used();
        // guard: E4-reserve-only-what-fits
        if used + bytes <= self.capacity {
            let incarnation = self.incarnation();
            self.entries.insert(
                key.clone(),
                Entry {
                    bytes,
                    state: State::Reserved,
                    incarnation,
                    since: self.clock,
                },
            );
            self.stats.reserved_bytes += bytes;
            self.stats.entries += 1;
            self.stats.admitted += 1;
            return Admission::Granted(Reservation {
                key,
                bytes,
                incarnation,
            });
        }
        // What must go; more than `bytes` while a lowered capacity is not
        // met yet.
        let needed = used + bytes - self.capacity;
        // guard: E10-victims-only-when-they-make-the-room
        if self.evictable_bytes < needed {
            // Evictions under way may make the room; otherwise there is none.
            let reason = if self.evictable_bytes + self.evicting_bytes >= needed {
                self.stats.rejected_busy += 1;
                Rejection::Busy
            } else {
                self.stats.rejected_no_room += 1;
                Rejection::NoRoom
            };
            return Admission::Rejected(reason);
        }
        let victims = self.choose_victims(needed, Cause::Admission);
        if victims.is_empty() {
            self.stats.rejected_no_room += 1;
            return Admission::Rejected(Rejection::NoRoom);
        }
        Admission::Evict(victims)
    }

    /// Victims of at least `needed` bytes (fewer if the order runs out),
    /// each moved to evicting.
    pub(super) fn choose_victims(&mut self, needed: u64, cause: Cause) -> Vec<Victim<K>> {
        let mut victims = Vec::new();
        let mut freed = 0;
        while freed < needed {
            let entries = &self.entries;
            // guard: E5-only-unpinned-resident-blocks-are-victims
            let evictable = |key: &K| {
                matches!(
                    entries.get(key),
                    Some(Entry {
                        state: State::Resident { pins: 0, .. },
                        ..
                    })
                )
            };
            let Some(key) = self.order.next_victim(evictable) else {
                break;
            };
            let entry = self
                .entries
                .get_mut(&key)
                .expect("the order holds resident blocks only");
            entry.state = State::Evicting;
            self.evictable_bytes -= entry.bytes;
            self.evicting_bytes += entry.bytes;
            freed += entry.bytes;
            self.stats.victims += 1;
            victims.push(Victim {
                key,
                bytes: entry.bytes,
                incarnation: entry.incarnation,
                cause,
            });
        }
        victims
    }

    /// The reserved block's file is in place: its bytes become resident.
    /// Returns the block's incarnation (which life of the key it is).
    pub fn commit(&mut self, reservation: Reservation<K>) -> Result<u64, LedgerError> {
        let clock = self.clock;
        let entry = self.reserved_entry(&reservation)?;
        entry.state = State::Resident {
            pins: 0,
            lost: false,
        };
        entry.since = clock;
        let incarnation = entry.incarnation;
        self.stats.reserved_bytes -= reservation.bytes;
        self.stats.resident_bytes += reservation.bytes;
        self.evictable_bytes += reservation.bytes;
        self.stats.committed += 1;
        self.order.insert(&reservation.key, reservation.bytes);
        // guard: E23-a-commit-is-logged-present
        self.note(&reservation.key, true);
        Ok(incarnation)
    }

    /// The reserved block's write failed: its bytes are given back.
    pub fn abort(&mut self, reservation: Reservation<K>) -> Result<(), LedgerError> {
        self.reserved_entry(&reservation)?;
        self.entries.remove(&reservation.key);
        self.stats.reserved_bytes -= reservation.bytes;
        self.stats.entries -= 1;
        self.stats.aborted += 1;
        Ok(())
    }

    fn reserved_entry(&mut self, reservation: &Reservation<K>) -> Result<&mut Entry, LedgerError> {
        match self.entries.get_mut(&reservation.key) {
            // guard: E6-a-reservation-is-released-once
            Some(entry)
                if entry.state == State::Reserved
                    && entry.incarnation == reservation.incarnation =>
            {
                Ok(entry)
            }
            _ => Err(LedgerError::Unknown("reservation")),
        }
    }

    /// Holds `key`'s block for a read: it is not evicted until
    /// [`unpin`](Self::unpin). `None` when the block is not resident.
    pub fn pin(&mut self, key: &K) -> Option<Pin<K>> {
        let Some(entry) = self.entries.get_mut(key) else {
            self.stats.pin_misses += 1;
            return None;
        };
        let State::Resident { pins, lost: false } = &mut entry.state else {
            self.stats.pin_misses += 1;
            return None;
        };
        if *pins == 0 {
            self.evictable_bytes -= entry.bytes;
            self.stats.pinned_entries += 1;
        }
        *pins += 1;
        self.stats.pins += 1;
        let pin = Pin {
            key: key.clone(),
            incarnation: entry.incarnation,
        };
        self.order.touch(key);
        Some(pin)
    }

    /// Releases a read's hold.
    pub fn unpin(&mut self, pin: Pin<K>) -> Result<(), LedgerError> {
        let entry = match self.entries.get_mut(&pin.key) {
            Some(entry) if entry.incarnation == pin.incarnation => entry,
            _ => return Err(LedgerError::Unknown("pin")),
        };
        let State::Resident { pins, lost } = &mut entry.state else {
            return Err(LedgerError::Unknown("pin"));
        };
        // guard: E7-a-pin-is-released-once
        if *pins == 0 {
            return Err(LedgerError::Unknown("pin"));
        }
        *pins -= 1;
        if *pins > 0 {
            return Ok(());
        }
        let (lost, bytes) = (*lost, entry.bytes);
        self.stats.pinned_entries -= 1;
        if lost {
            self.entries.remove(&pin.key);
            self.stats.resident_bytes -= bytes;
            self.stats.entries -= 1;
        } else {
            self.evictable_bytes += bytes;
        }
        Ok(())
    }

    /// The victim's file is deleted (or was already gone): its bytes leave.
    pub fn evicted(&mut self, victim: Victim<K>) -> Result<(), LedgerError> {
        match victim.cause {
            Cause::StartupTrim => {
                // Never counted: it did not fit when the ledger was seeded.
                if victim.incarnation != 0 {
                    return Err(LedgerError::Unknown("victim"));
                }
                self.stats.startup_trims += 1;
            }
            cause => {
                self.evicting_entry(&victim)?;
                self.entries.remove(&victim.key);
                self.evicting_bytes -= victim.bytes;
                self.stats.resident_bytes -= victim.bytes;
                self.stats.entries -= 1;
                if cause == Cause::Trim {
                    self.stats.trims += 1;
                }
            }
        }
        self.stats.evictions += 1;
        self.stats.evicted_bytes += victim.bytes;
        // guard: E24-a-deleted-victim-is-logged-gone
        self.note(&victim.key, false);
        self.depart(&victim.key);
        Ok(())
    }

    /// The victim's file could not be deleted: it stays resident (and goes
    /// to the back of the eviction order).
    pub fn eviction_failed(&mut self, victim: Victim<K>) -> Result<(), LedgerError> {
        self.restore_victim(victim, false)
    }

    /// The victim's store could not be reached to delete it: it stays
    /// resident at the eviction end of the order, where it was, so an
    /// outage of the store does not reorder the blocks' recency (each
    /// failed deletion would otherwise send the next-oldest block to the
    /// back). For a failure of this one block, use
    /// [`eviction_failed`](Self::eviction_failed).
    pub fn eviction_deferred(&mut self, victim: Victim<K>) -> Result<(), LedgerError> {
        self.restore_victim(victim, true)
    }

    /// A victim not deleted becomes resident again: at the eviction end
    /// (`keep_place`) or at the back of the order.
    fn restore_victim(&mut self, victim: Victim<K>, keep_place: bool) -> Result<(), LedgerError> {
        self.stats.eviction_failures += 1;
        if victim.cause == Cause::StartupTrim {
            return Ok(());
        }
        let entry = self.evicting_entry(&victim)?;
        entry.state = State::Resident {
            pins: 0,
            lost: false,
        };
        self.evicting_bytes -= victim.bytes;
        self.evictable_bytes += victim.bytes;
        // guard: E36-a-deferred-victim-keeps-its-place
        if keep_place {
            self.order.insert_cold(&victim.key, victim.bytes);
        } else {
            self.order.insert(&victim.key, victim.bytes);
        }
        Ok(())
    }

    fn evicting_entry(&mut self, victim: &Victim<K>) -> Result<&mut Entry, LedgerError> {
        match self.entries.get_mut(&victim.key) {
            // guard: E8-a-victim-is-released-once
            Some(entry)
                if entry.state == State::Evicting && entry.incarnation == victim.incarnation =>
            {
                Ok(entry)
            }
            _ => Err(LedgerError::Unknown("victim")),
        }
    }

    /// A read found `key`'s file missing or damaged: the block leaves the
    /// ledger (at its last unpin, if pinned). Returns whether it was
    /// resident.
    pub fn lose(&mut self, key: &K) -> bool {
        let unlost = matches!(
            self.entries.get(key).map(|entry| &entry.state),
            Some(State::Resident { lost: false, .. })
        );
        if unlost {
            self.stats.lost += 1;
        }
        unlost && self.leave_resident(key)
    }

    /// A block found on disk when the tier opens, newest first: it is
    /// counted if it fits, older than every block counted before it;
    /// otherwise it is a victim to delete (a startup trim). `None` also for
    /// a key the ledger already holds.
    pub fn seed(&mut self, key: K, bytes: u64) -> Option<Victim<K>> {
        if self.entries.contains_key(&key) {
            return None;
        }
        if bytes > self.capacity.saturating_sub(self.used()) {
            self.stats.victims += 1;
            return Some(Victim {
                key,
                bytes,
                incarnation: 0,
                cause: Cause::StartupTrim,
            });
        }
        self.enter_resident(key, bytes, true);
        None
    }

    /// Sets a new capacity and names the victims that bring resident plus
    /// reserved bytes under it (as many as are evictable: pinned and
    /// reserved blocks stay, and nothing is admitted until they fit).
    pub fn set_capacity(&mut self, capacity: u64) -> Vec<Victim<K>> {
        self.capacity = capacity;
        self.stats.capacity_bytes = capacity;
        self.order.set_capacity(capacity);
        let over = self.used().saturating_sub(capacity);
        let pending = self.evicting_bytes;
        if over <= pending {
            return Vec::new();
        }
        self.choose_victims(over - pending, Cause::Trim)
    }

    /// Counts a write that failed for want of space on the device (ENOSPC:
    /// the device is full below the capacity) and names victims of at least
    /// `bytes` (fewer if not enough are evictable) whose deletion makes room
    /// on the device for the write to be tried again. The capacity is
    /// unchanged; the victims are reported like an admission's.
    pub fn note_enospc(&mut self, bytes: u64) -> Vec<Victim<K>> {
        self.stats.enospc += 1;
        self.choose_victims(bytes, Cause::Admission)
    }
}
