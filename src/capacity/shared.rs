//! The ledger shared by a tier's threads: one lock around it, deletions
//! run outside the lock, and every token held by a guard that releases it
//! exactly once (on commit, or when dropped: a failed write, an error, a
//! panic unwinding through the caller).

use std::hash::Hash;

use super::ledger::{Admission, CapacityLedger, Pin, Rejection, Reservation, Victim};
use super::policy::Policy;
use super::stats::CapacityStats;
use crate::sync::{Arc, Mutex};

/// Rounds of "evict, then ask again" a store makes before it gives up as
/// [`Rejection::Busy`] (other stores kept taking the room it made).
pub const ADMIT_ROUNDS: usize = 8;

/// A [`CapacityLedger`] shared by threads (cloning shares it).
///
/// ```
/// use kvtier::capacity::{Admitted, Policy, SharedLedger};
///
/// let ledger = SharedLedger::new(100, Policy::Lru);
/// let Ok(Admitted::Write(write)) = ledger.admit("a", 60, |_| true) else { unreachable!() };
/// write.commit(); // the file of "a" is in place
/// // "b" needs "a"'s room: the closure deletes "a"'s file.
/// let mut deleted = Vec::new();
/// let Ok(Admitted::Write(write)) = ledger.admit("b", 60, |key| { deleted.push(*key); true }) else {
///     unreachable!()
/// };
/// drop(write); // the write failed: its room is given back
/// assert_eq!(deleted, ["a"]);
/// assert_eq!(ledger.stats().resident_bytes, 0);
/// assert_eq!(ledger.stats().aborted, 1);
/// ```
pub struct SharedLedger<K> {
    inner: Arc<Mutex<CapacityLedger<K>>>,
}

impl<K> Clone for SharedLedger<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// What [`SharedLedger::admit`] grants.
#[must_use = "a write guard aborts its reservation when dropped"]
pub enum Admitted<K: Clone + Eq + Hash> {
    /// Room is reserved: write the block, then [`WriteGuard::commit`].
    Write(WriteGuard<K>),
    /// The block is already resident.
    Present,
}

/// A reserved write: [`commit`](Self::commit) once the block's file is in
/// place; dropped uncommitted, the room is given back.
pub struct WriteGuard<K: Clone + Eq + Hash> {
    ledger: SharedLedger<K>,
    reservation: Option<Reservation<K>>,
}

/// A read's pin: the block is not evicted until this guard is dropped.
pub struct PinGuard<K: Clone + Eq + Hash> {
    ledger: SharedLedger<K>,
    pin: Option<Pin<K>>,
}

/// Victims handed out for deletion and not reported yet: whatever is left
/// when it is dropped (the delete closure panicked) is reported as not
/// deleted, so no victim stays evicting for ever.
struct Pending<'a, K: Clone + Eq + Hash> {
    ledger: &'a SharedLedger<K>,
    victims: Vec<Victim<K>>,
}

impl<K: Clone + Eq + Hash> Drop for Pending<'_, K> {
    fn drop(&mut self) {
        if self.victims.is_empty() {
            return;
        }
        // guard: E13-victims-left-by-a-panic-are-reported
        let mut ledger = self.ledger.inner.lock();
        for victim in self.victims.drain(..) {
            // The victim is this ledger's, handed out once.
            let _ = ledger.eviction_failed(victim);
        }
    }
}

impl<K: Clone + Eq + Hash> SharedLedger<K> {
    /// An empty ledger of `capacity` bytes.
    pub fn new(capacity: u64, policy: Policy) -> Self {
        Self::from_ledger(CapacityLedger::new(capacity, policy))
    }

    /// Shares `ledger` (seeded by a startup scan, say).
    pub fn from_ledger(ledger: CapacityLedger<K>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(ledger)),
        }
    }

    /// The counters and gauges.
    pub fn stats(&self) -> CapacityStats {
        self.inner.lock().stats()
    }

    /// Runs `f` on the ledger, under its lock (for what the guards do not
    /// cover: seeding, trims, audits).
    pub fn with<T>(&self, f: impl FnOnce(&mut CapacityLedger<K>) -> T) -> T {
        f(&mut self.inner.lock())
    }

    /// Gets room for `key`'s block of `bytes`. Victims are deleted by
    /// `delete` (called without the lock; `true`: the file is gone, or was
    /// already), then the ledger is asked again, up to [`ADMIT_ROUNDS`]
    /// times.
    pub fn admit(
        &self,
        key: K,
        bytes: u64,
        mut delete: impl FnMut(&K) -> bool,
    ) -> Result<Admitted<K>, Rejection> {
        for _ in 0..ADMIT_ROUNDS {
            let answer = self.inner.lock().reserve(key.clone(), bytes);
            match answer {
                Admission::Granted(reservation) => {
                    return Ok(Admitted::Write(WriteGuard {
                        ledger: self.clone(),
                        reservation: Some(reservation),
                    }));
                }
                Admission::Present => return Ok(Admitted::Present),
                Admission::Rejected(Rejection::Busy) => continue,
                Admission::Rejected(rejection) => return Err(rejection),
                Admission::Evict(victims) => {
                    self.delete_victims(victims, &mut delete);
                }
            }
        }
        Err(Rejection::Busy)
    }

    /// Deletes `victims` (this ledger's, from a reservation, a trim, a seed
    /// or an ENOSPC) with `delete`, called without the lock (`true`: the
    /// file is gone, or was already), and reports each one as evicted or
    /// not; returns how many were deleted. Victims a panicking `delete`
    /// leaves are reported as not deleted.
    pub fn delete_victims(
        &self,
        victims: Vec<Victim<K>>,
        mut delete: impl FnMut(&K) -> bool,
    ) -> usize {
        let mut pending = Pending {
            ledger: self,
            victims,
        };
        let mut deleted = 0;
        while let Some(victim) = pending.victims.last() {
            // Popped only once deleted: a panic in `delete` leaves it to
            // `Pending`'s drop.
            let gone = delete(victim.key());
            let victim = pending.victims.pop().expect("the victim just looked at");
            let mut ledger = self.inner.lock();
            // Handed out once, reported once.
            let _ = if gone {
                deleted += 1;
                ledger.evicted(victim)
            } else {
                ledger.eviction_failed(victim)
            };
        }
        deleted
    }

    /// Pins `key`'s block for a read; `None` when it is not resident.
    pub fn pin(&self, key: &K) -> Option<PinGuard<K>> {
        let pin = self.inner.lock().pin(key)?;
        Some(PinGuard {
            ledger: self.clone(),
            pin: Some(pin),
        })
    }

    /// A read found `key`'s file missing or damaged (see
    /// [`CapacityLedger::lose`]).
    pub fn lose(&self, key: &K) -> bool {
        self.inner.lock().lose(key)
    }
}

impl<K: Clone + Eq + Hash> WriteGuard<K> {
    /// The block's file is in place: its bytes become resident.
    pub fn commit(mut self) {
        if let Some(reservation) = self.reservation.take() {
            // Held by this guard alone: released here, once.
            let _ = self.ledger.inner.lock().commit(reservation);
        }
    }

    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.reservation.as_ref().map_or(0, |r| r.bytes())
    }
}

impl<K: Clone + Eq + Hash> Drop for WriteGuard<K> {
    fn drop(&mut self) {
        // guard: E11-an-uncommitted-write-gives-its-room-back
        if let Some(reservation) = self.reservation.take() {
            let _ = self.ledger.inner.lock().abort(reservation);
        }
    }
}

impl<K: Clone + Eq + Hash> Drop for PinGuard<K> {
    fn drop(&mut self) {
        // guard: E12-a-dropped-pin-is-released
        if let Some(pin) = self.pin.take() {
            let _ = self.ledger.inner.lock().unpin(pin);
        }
    }
}
