//! The lookup table's state: its fields, and what reads them whole.

use std::collections::VecDeque;
use std::hash::Hash;
use std::mem;
use std::time::Instant;

use hashbrown::HashMap;

use crate::invariant::InvariantViolation;
use crate::lookup::limits::LookupLimits;
use crate::lookup::stats::LookupStats;
use crate::lookup::submission::{Group, GroupBuffers, GroupOutcome, Interest};
use crate::lookup::types::{Request, TableId};
use crate::sync::Arc;

use super::keys::KeyStore;
use super::step::StepMark;
use super::storage::{NONE, Overflow, Slot};

/// The scheduler-owned state of the async lookup protocol.
///
/// Plain `&mut self` methods, no threads, clocks or I/O: whoever owns the
/// table decides when keys go to a backend and when answers come back. The
/// [`Lookup`](crate::Lookup) is one such owner; a test, a
/// model checker or a custom driver can be another.
///
/// The cycle of one scheduler step:
///
/// ```
/// use kvtier::{lookup::LookupTable, Verdict};
///
/// let mut table: LookupTable<u64, String> = LookupTable::new();
/// let request = "req-1".to_string();
///
/// // Unknown keys are pending until the tier has been asked.
/// assert_eq!(table.lookup(&7, &request), Verdict::Pending);
/// assert_eq!(table.lookup(&8, &request), Verdict::Pending);
///
/// // End of step: the new keys, grouped by request, go to a backend ...
/// let submission = table.take_submission().expect("two new keys");
/// for group in submission.into_groups() {
///     let answers: Vec<bool> = group.keys().iter().map(|key| key % 2 == 1).collect();
///     // ... and each group's answers come back, possibly much later.
///     table.apply(group.answered(answers));
/// }
///
/// let Verdict::Hit(ticket) = table.lookup(&7, &request) else { panic!("7 is odd") };
/// assert_eq!(table.lookup(&8, &request), Verdict::Miss);
///
/// // Loading block 7 failed: stop offering it, without re-probing.
/// assert!(table.mark_miss(&ticket));
/// assert_eq!(table.lookup(&7, &request), Verdict::Miss);
///
/// table.cleanup(&request);
/// assert!(table.is_empty());
/// ```
pub struct LookupTable<K, R: Request> {
    /// Carried by every ticket, group and result this table hands out.
    pub(super) id: TableId,
    /// Every tracked key and its state.
    pub(super) keys: KeyStore<K>,
    /// Live request ids and their slots.
    pub(super) slot_of: HashMap<R::Id, u32>,
    pub(super) slots: Vec<Slot<R::Id>>,
    pub(super) free_slots: Vec<u32>,
    /// Half the live requests at the last compaction (or since): the next
    /// one waits until fewer are live (see [`LookupTable::shrink_if_sparse`]).
    pub(super) compact_below: usize,
    /// The slot of the last request that called `lookup`: a scheduler asks
    /// about one request's keys in a row, so this saves hashing the id.
    pub(super) last_slot: u32,
    pub(super) overflow: Overflow,
    /// This step's new keys, grouped by request in first-appearance order.
    pub(super) batch: Vec<Group<K, R>>,
    /// The vectors of applied results, emptied, for the next groups (at
    /// most [`SPARE_GROUPS`]): a group's keys, generations and answers
    /// reuse allocations instead of growing new ones every step.
    pub(super) spare_buffers: Vec<GroupBuffers<K>>,
    /// Index in `batch` of each request's group. Kept apart from the slots
    /// so a request cleaned up and seen again within one step still gets
    /// one group.
    pub(super) batch_groups: HashMap<R::Id, usize>,
    /// Bumped by every `take_submission`: slots' cached group indices from
    /// an earlier batch are then stale.
    pub(super) batch_epoch: u64,
    /// Generations below this were created before the last flush: an
    /// unresolved state below it is in flight, one at or above it pending.
    pub(super) flushed_below: u64,
    /// Generations of batched (pending) states that cleanup removed before
    /// the flush; the flush leaves them out.
    pub(super) dropped_pending: hashbrown::HashSet<u64>,
    pub(super) next_generation: u64,
    /// The deadline and admission bounds.
    pub(super) limits: LookupLimits,
    /// Keys in this step's batch (pending states).
    pub(super) batched_keys: usize,
    /// Keys and groups handed out by `take_submission` whose results have
    /// not been applied yet.
    pub(super) outstanding_keys: usize,
    pub(super) outstanding_groups: usize,
    /// Steps ended (`take_submission` calls) so far.
    pub(super) steps: u64,
    /// When the current step started: the time of the last timed flush.
    pub(super) step_started: Option<Instant>,
    /// The ended steps whose keys are not overdue yet, oldest first, while
    /// a deadline is set.
    pub(super) marks: VecDeque<StepMark>,
    /// Unresolved states created before this generation are overdue: their
    /// step's pending budget ran out.
    pub(super) overdue_below: u64,
    /// The interest of each group out, by group number (an [`Entry`]'s
    /// `group`), while unwanted groups are skipped: one entry a group, made
    /// at the flush and dropped when the group's result is applied.
    pub(super) interest_of: HashMap<u32, Arc<Interest>>,
    /// The number the next batch group gets (numbers of groups out are
    /// skipped when it wraps).
    pub(super) next_group: u32,
    pub(super) stats: LookupStats,
    /// `(seq, outcome)` of every applied group, in application order, while
    /// recording is on (see [`LookupTable::record_applied`]).
    pub(super) applied_log: Option<Vec<(u64, GroupOutcome)>>,
}

/// A summary: how many keys and requests, and the counters.
impl<K, R: Request> std::fmt::Debug for LookupTable<K, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupTable")
            .field("id", &self.id)
            .field("keys", &self.keys.len())
            .field("requests", &self.slot_of.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<K, R: Request> Default for LookupTable<K, R> {
    fn default() -> Self {
        Self {
            id: TableId::new(),
            keys: KeyStore::default(),
            slot_of: HashMap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            compact_below: 0,
            last_slot: NONE,
            overflow: Overflow::default(),
            batch: Vec::new(),
            spare_buffers: Vec::new(),
            batch_groups: HashMap::new(),
            batch_epoch: 0,
            flushed_below: 0,
            dropped_pending: hashbrown::HashSet::new(),
            next_generation: 0,
            limits: LookupLimits::default(),
            batched_keys: 0,
            outstanding_keys: 0,
            outstanding_groups: 0,
            steps: 0,
            step_started: None,
            marks: VecDeque::new(),
            overdue_below: 0,
            interest_of: HashMap::new(),
            next_group: 0,
            stats: LookupStats::default(),
            applied_log: None,
        }
    }
}

impl<K, R> LookupTable<K, R>
where
    K: Eq + Hash + Clone,
    R: Request,
{
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts (or stops) recording which groups are applied, in order, with
    /// their outcomes; [`take_applied`](Self::take_applied) hands the record
    /// over. Off by default. For checkers and debugging: with groups
    /// answered concurrently the record is the only way to know the order in
    /// which answers reached the table. Not part of the stable API.
    #[doc(hidden)]
    pub fn record_applied(&mut self, on: bool) {
        self.applied_log = on.then(Vec::new);
    }

    /// `(seq, outcome)` of every group applied since recording started or
    /// since the last call, in application order (empty when not recording).
    /// Not part of the stable API.
    #[doc(hidden)]
    pub fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.applied_log.as_mut().map(mem::take).unwrap_or_default()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> LookupStats {
        // Every lookup gives exactly one verdict, so the hot path counts
        // the verdicts alone.
        LookupStats {
            lookups: self.stats.hits + self.stats.misses + self.stats.pending,
            ..self.stats
        }
    }

    /// Number of keys tracked (including orphaned in-flight probes).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Number of live requests (looked up at least one key, not cleaned up).
    pub fn request_count(&self) -> usize {
        self.slot_of.len()
    }

    /// True when the table tracks no key and no request: the state after every
    /// request was cleaned up and every submitted group's result applied.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.slot_of.is_empty()
    }

    /// Checks the table's structural invariants (reverse index and
    /// requester lists agree, no state is left without requesters unless its
    /// probe is in flight). For tests and models; not part of the stable
    /// API.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_structure().map_err(InvariantViolation)
    }
}
