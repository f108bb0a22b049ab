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

/// Victims handed out for deletion and not reported yet, from
/// [`SharedLedger::reserve`]: delete each [`next`](Self::next) one, then
/// report it with [`done`](Self::done). Whatever is left when this is
/// dropped (a deletion panicked, an async caller was cancelled) is reported
/// as not deleted, so no victim stays evicting for ever.
pub struct Victims<K: Clone + Eq + Hash> {
    ledger: SharedLedger<K>,
    victims: Vec<Victim<K>>,
    deleted: usize,
}

impl<K: Clone + Eq + Hash> Victims<K> {
    /// The key of the next victim to delete; `None` when all are reported.
    pub fn next(&self) -> Option<&K> {
        self.victims.last().map(Victim::key)
    }

    /// Reports the [`next`](Self::next) victim: `gone` when its block is
    /// deleted (or was already), `false` when it could not be (it stays
    /// resident). Does nothing when none is left.
    pub fn done(&mut self, gone: bool) {
        // Popped only once reported: a panic before this leaves it to `drop`.
        let Some(victim) = self.victims.pop() else {
            return;
        };
        let mut ledger = self.ledger.inner.lock();
        // Handed out once, reported once.
        let _ = if gone {
            self.deleted += 1;
            ledger.evicted(victim)
        } else {
            ledger.eviction_failed(victim)
        };
    }

    /// Reports the [`next`](Self::next) victim and every one after it as
    /// not deleted because the store could not be reached: they stay
    /// resident where they were in the eviction order (see
    /// [`CapacityLedger::eviction_deferred`](crate::capacity::CapacityLedger::eviction_deferred)).
    pub fn defer_rest(&mut self) {
        let mut ledger = self.ledger.inner.lock();
        // Popped warmest first: each goes to the eviction end, so the
        // coldest ends up there again.
        while let Some(victim) = self.victims.pop() {
            let _ = ledger.eviction_deferred(victim);
        }
    }

    /// Victims reported deleted so far.
    pub fn deleted(&self) -> usize {
        self.deleted
    }
}

impl<K: Clone + Eq + Hash> Drop for Victims<K> {
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

/// One answer of [`SharedLedger::reserve`].
#[must_use = "a write guard aborts its reservation and victims are reported not deleted when dropped"]
pub enum Reserved<K: Clone + Eq + Hash> {
    /// Room is reserved: write the block, then [`WriteGuard::commit`].
    Write(WriteGuard<K>),
    /// The block is already resident.
    Present,
    /// Delete these, then ask again.
    Evict(Victims<K>),
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

    /// A ledger of `capacity` bytes seeded with the blocks a tier found
    /// when it opened, newest first (see [`CapacityLedger::seed`]), and the
    /// older blocks that did not fit: victims to delete (startup trims).
    pub fn seeded(
        capacity: u64,
        policy: Policy,
        newest_first: impl IntoIterator<Item = (K, u64)>,
    ) -> (Self, Vec<Victim<K>>) {
        let mut ledger = CapacityLedger::new(capacity, policy);
        let victims = newest_first
            .into_iter()
            .filter_map(|(key, bytes)| ledger.seed(key, bytes))
            .collect();
        (Self::from_ledger(ledger), victims)
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
            match self.reserve(key.clone(), bytes)? {
                Reserved::Write(write) => return Ok(Admitted::Write(write)),
                Reserved::Present => return Ok(Admitted::Present),
                Reserved::Evict(mut victims) => {
                    while let Some(victim) = victims.next() {
                        let gone = delete(victim);
                        victims.done(gone);
                    }
                }
            }
        }
        Err(Rejection::Busy)
    }

    /// One round of [`admit`](Self::admit), for a caller that deletes
    /// victims its own way (an async store): room, "present", or victims
    /// to delete before asking again. A busy block is [`Reserved::Evict`]
    /// with no victims (ask again); other refusals are errors.
    pub fn reserve(&self, key: K, bytes: u64) -> Result<Reserved<K>, Rejection> {
        let answer = self.inner.lock().reserve(key, bytes);
        match answer {
            Admission::Granted(reservation) => Ok(Reserved::Write(WriteGuard {
                ledger: self.clone(),
                reservation: Some(reservation),
            })),
            Admission::Present => Ok(Reserved::Present),
            Admission::Rejected(Rejection::Busy) => Ok(Reserved::Evict(self.victims(Vec::new()))),
            Admission::Rejected(rejection) => Err(rejection),
            Admission::Evict(victims) => Ok(Reserved::Evict(self.victims(victims))),
        }
    }

    /// Takes charge of `victims` (this ledger's, from a reservation, a
    /// trim, a seed or an ENOSPC), to be deleted and reported.
    pub fn victims(&self, victims: Vec<Victim<K>>) -> Victims<K> {
        Victims {
            ledger: self.clone(),
            victims,
            deleted: 0,
        }
    }

    /// Deletes `victims` with `delete`, called without the lock (`true`:
    /// the file is gone, or was already), and reports each one as evicted
    /// or not; returns how many were deleted. Victims a panicking `delete`
    /// leaves are reported as not deleted.
    pub fn delete_victims(
        &self,
        victims: Vec<Victim<K>>,
        mut delete: impl FnMut(&K) -> bool,
    ) -> usize {
        let mut victims = self.victims(victims);
        while let Some(victim) = victims.next() {
            let gone = delete(victim);
            victims.done(gone);
        }
        victims.deleted()
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
