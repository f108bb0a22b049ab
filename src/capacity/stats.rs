//! Counters and gauges of a capacity ledger.

use crate::counters::counters;

counters! {
    /// A snapshot of a [`CapacityLedger`](super::CapacityLedger)'s gauges and
    /// counters, each kept up to date as the ledger changes (reading them does
    /// not scan the ledger).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct CapacityStats {
        /// The budget, in bytes.
        pub capacity_bytes: u64,
        /// Bytes of committed blocks, including those being evicted (their
        /// files are on disk until [`evicted`](super::CapacityLedger::evicted)).
        pub resident_bytes: u64,
        /// Bytes reserved by stores whose blocks are being written.
        pub reserved_bytes: u64,
        /// Blocks known to the ledger: resident, being written or being evicted.
        pub entries: u64,
        /// Blocks pinned by at least one read.
        pub pinned_entries: u64,
        /// Reservations granted.
        pub admitted: u64,
        /// Reservations committed (their blocks became resident).
        pub committed: u64,
        /// Reservations given back because their write failed.
        pub aborted: u64,
        /// Stores refused: the block is larger than the whole capacity.
        pub rejected_too_large: u64,
        /// Stores refused: not enough bytes could be evicted (the rest is
        /// pinned, reserved or already being evicted).
        pub rejected_no_room: u64,
        /// Stores refused: the block is being written or deleted by another
        /// operation.
        pub rejected_busy: u64,
        /// Stores not needed: the block was already resident.
        pub already_resident: u64,
        /// Victims named to make room for a store.
        pub victims: u64,
        /// Blocks evicted (their files deleted), by admission or by a trim.
        pub evictions: u64,
        /// Bytes of those blocks.
        pub evicted_bytes: u64,
        /// Evictions whose deletion failed (the block stayed resident).
        pub eviction_failures: u64,
        /// Blocks found on disk at startup that did not fit the capacity and
        /// were trimmed.
        pub startup_trims: u64,
        /// Blocks trimmed later, by a lowered capacity.
        pub trims: u64,
        /// Blocks dropped because their file was found missing or damaged.
        pub lost: u64,
        /// Writes that failed for want of space on the device (ENOSPC), as the
        /// tier reports them.
        pub enospc: u64,
        /// Reads that found their block resident and pinned it.
        pub pins: u64,
        /// Reads that found no resident block.
        pub pin_misses: u64,
        /// Changes dropped from a full change log before a tier's lookups took
        /// them (see [`CapacityLedger::record_changes`](super::CapacityLedger::record_changes)).
        pub changes_dropped: u64,
        /// Reconciles with a listing of the directory (see
        /// [`CapacityLedger::reconcile`](super::CapacityLedger::reconcile)).
        pub reconciles: u64,
        /// Blocks counted by a reconcile: another process wrote them.
        pub adopted: u64,
        /// Blocks dropped by a reconcile: another process deleted them.
        pub forgotten: u64,
    }
}
