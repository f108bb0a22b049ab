//! Counters of the lookup protocol.

use crate::counters::counters;

counters! {
    /// A snapshot of the lookup counters.
    ///
    /// All counters are owned by the scheduler-side table: backend faults are
    /// counted when the worker's result for the group is applied, not when the
    /// worker sees them, so reading stats never synchronises with the worker.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct LookupStats {
        /// `lookup` calls.
        pub lookups: u64,
        /// Lookups answered [`Verdict::Hit`](super::Verdict::Hit).
        pub hits: u64,
        /// Lookups answered [`Verdict::Miss`](super::Verdict::Miss).
        pub misses: u64,
        /// Lookups answered [`Verdict::Pending`](super::Verdict::Pending).
        pub pending: u64,
        /// Keys handed to the worker.
        pub keys_submitted: u64,
        /// Request groups handed to the worker.
        pub groups_submitted: u64,
        /// Group results applied to the table.
        pub groups_applied: u64,
        /// Results dropped because their key was cleaned up, or cleaned up and
        /// looked up again (a newer generation) while the probe was in flight.
        pub stale_results: u64,
        /// Results of probes nobody waited for any more (every requester was
        /// cleaned up while in flight and nobody joined); the state was removed.
        pub orphans_dropped: u64,
        /// Events the protocol rules out by construction (a second result for one
        /// generation, a result for a state that is not in flight). Always 0
        /// unless kvtier has a bug; the models assert it.
        pub anomalies: u64,
        /// Group results and tickets of another table, refused whole (a driver
        /// bug: a ticket or result carried to the wrong table). A result's keys
        /// are not counted as stale results.
        pub foreign: u64,
        /// Resolved hits turned into misses by `mark_miss` / `mark_miss_keys`.
        pub marked_miss: u64,
        /// Groups whose backend call returned an error (all keys became misses).
        pub backend_errors: u64,
        /// Groups whose backend call, or the consumption of its answers,
        /// panicked (unanswered keys became misses).
        pub backend_panics: u64,
        /// Groups answered with fewer answers than keys (the rest became misses).
        pub short_results: u64,
        /// Groups answered with more answers than keys (the surplus was ignored).
        pub surplus_results: u64,
        /// Groups the backend did not answer within the per-group timeout of the
        /// [`TokioProber`](super::TokioProber) (all keys became misses).
        pub timeouts: u64,
        /// Groups cancelled unanswered at shutdown, or because the runtime
        /// running them went away (all keys became misses).
        pub cancelled: u64,
        /// Lookups answered [`Verdict::Miss`](super::Verdict::Miss) because
        /// their key's probe was overdue: unanswered past the pending budget of
        /// the [`LookupLimits`](super::LookupLimits) (included in `misses`).
        pub deadline_misses: u64,
        /// Answers that resolved an overdue key: the probe went on past the
        /// budget and its answer serves later lookups.
        pub late_answers: u64,
        /// Lookups of new keys answered [`Verdict::Miss`](super::Verdict::Miss)
        /// at once because the outstanding keys or groups were at their bound
        /// (included in `misses`; no state was created).
        pub shed: u64,
        /// Groups left unprobed because nobody wanted their answers any more
        /// (see [`Group::claim`](super::Group::claim)), or whose running probe
        /// the tokio prober dropped for that reason.
        pub abandoned: u64,
        /// Key states a completed store resolved as hits, or turned from
        /// misses into hits (see
        /// [`LookupTable::settle`](super::LookupTable::settle)); orphaned
        /// probes it made moot, forgotten, are included.
        pub settled_hits: u64,
        /// Key states an eviction resolved as misses, or turned from hits into
        /// misses; orphaned probes it made moot are included.
        pub settled_misses: u64,
    }
}
