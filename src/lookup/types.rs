//! The vocabulary of the lookup protocol: requests, generations, tickets, verdicts.

use std::fmt::Debug;
use std::hash::Hash;

/// A scheduler request that asks the tier about keys.
///
/// The table groups a step's new keys by request, hands the request value to
/// the backend as context for its group, and forgets everything a request
/// asked when [`cleanup`](crate::lookup::LookupTable::cleanup) is called with its id.
///
/// Implemented for `String` and `u64` (the request *is* its id). A richer
/// request type implements it by pointing at its id field:
///
/// ```
/// use kvtier::Request;
///
/// #[derive(Clone)]
/// struct SchedulerRequest {
///     id: String,
///     lora: Option<u32>,
/// }
///
/// impl Request for SchedulerRequest {
///     type Id = String;
///     fn id(&self) -> &String {
///         &self.id
///     }
/// }
/// ```
pub trait Request: Clone {
    /// Identifies the request for grouping and cleanup.
    type Id: Eq + Hash + Clone + Debug;

    /// This request's id.
    fn id(&self) -> &Self::Id;
}

impl Request for String {
    type Id = String;

    fn id(&self) -> &String {
        self
    }
}

impl Request for u64 {
    type Id = u64;

    fn id(&self) -> &u64 {
        self
    }
}

/// One incarnation of a key's lookup state.
///
/// Every time a key's state is created it takes the next value of one
/// monotonic counter, so a generation is never reused within a table: a
/// result or ticket carrying an older generation can be recognised as stale
/// after the key was cleaned up and looked up again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub(crate) u64);

impl Generation {
    /// The counter value (for logs and models).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Proof that a lookup answered [`Verdict::Hit`] for one generation of a key.
///
/// Give it back to [`mark_miss`](crate::lookup::LookupTable::mark_miss) when loading
/// the block failed: only that exact generation is turned into a miss, so a
/// late failure can never corrupt a newer lookup of the same key. A ticket
/// belongs to the table that issued it: every table numbers its generations
/// from 0, so a ticket also carries its table's identity, and another
/// table's ticket is refused whatever its generation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket<K> {
    pub(crate) key: K,
    pub(crate) generation: Generation,
    pub(crate) table: TableId,
}

/// The identity of one [`LookupTable`](crate::lookup::LookupTable), unique in the
/// process: carried by its tickets, groups and group results, so that one
/// from another table is recognised whatever its generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId(pub(crate) u64);

impl TableId {
    /// A new identity, never handed out before in this process.
    pub(crate) fn new() -> Self {
        Self(crate::sync::unique_id())
    }
}

impl<K> Ticket<K> {
    /// The key whose hit this ticket records.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The generation that resolved as a hit.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The table that issued the ticket.
    pub fn table(&self) -> TableId {
        self.table
    }
}

/// What the tier knows about a key right now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict<K> {
    /// The tier holds the block: start loading it. Keep the ticket for
    /// [`mark_miss`](crate::lookup::LookupTable::mark_miss) in case the load fails.
    Hit(Ticket<K>),
    /// The tier does not hold the block (or the probe failed).
    Miss,
    /// Not known yet: ask again next step.
    Pending,
}

impl<K> Verdict<K> {
    /// True for [`Verdict::Hit`].
    pub fn is_hit(&self) -> bool {
        matches!(self, Verdict::Hit(_))
    }

    /// True for [`Verdict::Miss`].
    pub fn is_miss(&self) -> bool {
        matches!(self, Verdict::Miss)
    }

    /// True for [`Verdict::Pending`].
    pub fn is_pending(&self) -> bool {
        matches!(self, Verdict::Pending)
    }
}

/// Where a key's lookup stands (see [`LookupTable::key_state`](crate::lookup::LookupTable::key_state)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Looked up this step; goes to the worker at the next flush.
    Pending,
    /// Submitted to the worker; its result has not been applied yet.
    InFlight,
    /// In flight past its pending budget (see
    /// [`LookupLimits`](crate::lookup::LookupLimits)): looked up as a miss;
    /// a late answer still resolves it.
    Overdue,
    /// The result is known.
    Resolved {
        /// Whether the tier holds the block.
        found: bool,
    },
}

/// A read-only view of one key's state, for tests, models and diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The incarnation of the key's state.
    pub generation: Generation,
    /// Where the lookup stands.
    pub phase: Phase,
    /// How many live requests asked for the key (0 for an orphaned in-flight probe).
    pub requesters: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_verdict_answers_exactly_one_question() {
        let hit = Verdict::Hit(Ticket {
            key: 1u64,
            generation: Generation(0),
            table: TableId::new(),
        });
        let verdicts = [hit, Verdict::Miss, Verdict::Pending];
        let answers: Vec<[bool; 3]> = verdicts
            .iter()
            .map(|v| [v.is_hit(), v.is_miss(), v.is_pending()])
            .collect();
        assert_eq!(
            answers,
            [
                [true, false, false],
                [false, true, false],
                [false, false, true]
            ]
        );
    }
}
