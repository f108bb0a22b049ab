//! A tier's byte budget: which blocks may be written, which stay, which go.
//!
//! [`CapacityLedger`] is a sans-IO state machine (no threads, no clock, no
//! I/O) that a tier consults around every write, read and deletion:
//!
//! - **Reserve, then commit or abort.** A store first
//!   [`reserve`](CapacityLedger::reserve)s its block's bytes. The bytes
//!   count as *reserved* while the block is written; when its file is in
//!   place the store [`commit`](CapacityLedger::commit)s them (they become
//!   *resident*), and when the write fails it [`abort`](CapacityLedger::abort)s
//!   them. A [`Reservation`] is a token consumed by either call, so it is
//!   released exactly once.
//! - **Room is made by evicting.** A reservation that does not fit names
//!   [`Victim`]s: resident blocks the policy gives up. Until the tier has
//!   deleted a victim's file and said so ([`evicted`](CapacityLedger::evicted)),
//!   its bytes stay resident; then the store asks again. So resident plus
//!   reserved bytes never exceed the capacity, also while files are being
//!   deleted.
//! - **Reads pin.** A load [`pin`](CapacityLedger::pin)s its block and
//!   [`unpin`](CapacityLedger::unpin)s it afterwards; a pinned, reserved or
//!   already evicting block is never chosen as a victim.
//! - **Policies.** [`Policy::Lru`] evicts the least recently used block;
//!   [`Policy::S3Fifo`] keeps new blocks on probation in a small queue and
//!   admits to the main queue those read again, which resists a scan of
//!   blocks read once (see `docs/performance.md` for the comparison).
//!
//! [`SharedLedger`] is the ledger for a tier's threads: one lock, victims
//! deleted outside it, and guards ([`WriteGuard`], [`PinGuard`]) that
//! release their tokens exactly once, also when a write fails or a panic
//! unwinds.
//!
//! With [`record_changes`](CapacityLedger::record_changes) on, the ledger
//! logs which blocks became resident and which left, in order, for a tier's
//! lookups to [`settle`](crate::lookup::LookupTable::settle).
//!
//! Processes sharing one directory each keep a ledger; a tier that lists
//! the directory from time to time [`reconcile`](CapacityLedger::reconcile)s
//! its ledger with what it finds: blocks other processes wrote are counted,
//! blocks they deleted forgotten, and what is over the capacity evicted.
//!
//! The counters ([`CapacityStats`]) are kept as the ledger changes, so
//! reading them costs the same at any size.
//!
//! ```
//! use kvtier::capacity::{Admission, CapacityLedger, Policy};
//!
//! let mut ledger = CapacityLedger::new(100, Policy::Lru);
//! let Admission::Granted(first) = ledger.reserve("a", 60) else { unreachable!() };
//! ledger.commit(first)?; // the file of "a" is in place
//! // 60 + 60 > 100: "a" must go first.
//! let Admission::Evict(victims) = ledger.reserve("b", 60) else { unreachable!() };
//! assert_eq!(victims[0].key(), &"a");
//! for victim in victims {
//!     // ... delete the victim's file, then:
//!     ledger.evicted(victim)?;
//! }
//! let Admission::Granted(second) = ledger.reserve("b", 60) else { unreachable!() };
//! ledger.commit(second)?;
//! assert_eq!(ledger.stats().resident_bytes, 60);
//! assert_eq!(ledger.stats().evictions, 1);
//! # Ok::<(), kvtier::capacity::LedgerError>(())
//! ```

mod audit;
mod changes;
mod fleet_host;
mod ledger;
mod listings;
mod policy;
mod reconcile;
mod recording;
mod residency;
mod shared;
mod stats;

pub use changes::MAX_CHANGES;
pub use fleet_host::{FleetHost, MAX_TOUCHES};
pub use ledger::{
    Admission, CapacityLedger, Cause, LedgerError, Pin, Rejection, Reservation, Victim,
};
pub use listings::Listing;
pub use policy::Policy;
pub use reconcile::Reconciled;
pub use shared::{ADMIT_ROUNDS, Admitted, PinGuard, Reserved, SharedLedger, Victims, WriteGuard};
pub use stats::CapacityStats;

#[cfg(test)]
mod tests;
