//! kvtier: a verified concurrency core for KV-cache tiering.
//!
//! An LLM server asks, every scheduler step and without blocking, whether a
//! secondary tier (file system, object store) holds the KV blocks a waiting
//! request could load. kvtier answers through two layers:
//!
//! - [`LookupTable`]: the whole protocol as a deterministic, sans-IO state
//!   machine — per-key generations, request groups, stale-result filtering,
//!   `mark_miss` tickets, cleanup with in-flight probe sharing. No threads,
//!   clocks or I/O: tests, the reference model and model checkers drive it
//!   directly.
//! - [`AsyncLookup`]: a thin driver that runs a [`LookupBackend`] on a worker
//!   thread, publishes each request group's answers as soon as it is done
//!   through a lock-free stack, and turns every backend fault into misses.
//! - `TokioLookup` (feature `tokio`): the same scheduler side and publication
//!   path, with each group probed by a tokio task — several at once, each
//!   within a timeout — and a shutdown that never waits on a hung backend.
//! - [`SaveScheduler`] and [`SaveTracker`]: deferred save completion — a
//!   finished request's blocks are freed only once no save reads them.
//! - `FsTier` (feature `fs`) and `ObjectTier` (feature `object-store`): block
//!   tiers on a directory tree and on S3 / S3-compatible / local / in-memory
//!   object stores, usable by both lookup drivers and the save tracker.
//!
//! Every synchronisation primitive comes from one internal shim, so the same
//! driver code runs under [loom](https://docs.rs/loom) (`--cfg kvtier_loom`)
//! and [shuttle](https://docs.rs/shuttle) (`--cfg kvtier_shuttle`). See
//! `docs/design.md` for the state machine and its invariants.
//!
//! ```
//! use kvtier::{AsyncLookup, Verdict};
//!
//! let tier = |keys: &[u64], _request: &u64| keys.iter().map(|k| *k < 100).collect();
//! let mut lookup = AsyncLookup::new(tier)?;
//! assert_eq!(lookup.lookup(&42, &1)?, Verdict::Pending);
//! lookup.flush()?;
//! lookup.wait_idle()?;
//! assert!(lookup.lookup(&42, &1)?.is_hit());
//! # Ok::<(), kvtier::LookupError>(())
//! ```

#![warn(missing_docs)]

mod fault;
mod lookup;
mod publish;
mod save;
mod sync;
#[cfg(all(
    any(feature = "fs", feature = "object-store"),
    not(any(kvtier_loom, kvtier_shuttle))
))]
mod tier;

pub use lookup::{
    AsyncLookup, Generation, Group, GroupOutcome, GroupResult, KeyState, LookupBackend,
    LookupError, LookupTable, Phase, Request, Stats, Submission, TableId, Ticket, Verdict,
};
#[cfg(any(
    all(feature = "tokio", not(any(kvtier_loom, kvtier_shuttle))),
    all(kvtier_shuttle, not(kvtier_loom))
))]
pub use lookup::{AsyncLookupBackend, TokioConfig, TokioLookup};
pub use save::{
    Completer, CompletionMode, CompletionTask, MultiConnector, Report, ReportAggregator,
    ReportError, SaveScheduler, SaveStats, SaveStep, SaveTracker, SchedulerConnector,
    SchedulerSaveStats, StoreTask, TaskError, TaskId, WorkerConnector,
};

#[cfg(all(
    any(feature = "fs", feature = "object-store"),
    not(any(kvtier_loom, kvtier_shuttle))
))]
pub use tier::{BlockKey, Corruption, TierError};
#[cfg(all(feature = "fs", not(any(kvtier_loom, kvtier_shuttle))))]
pub use tier::{FsOptions, FsSaveTask, FsTier};
#[cfg(all(feature = "object-store", not(any(kvtier_loom, kvtier_shuttle))))]
pub use tier::{ObjectSaveTask, ObjectTier, ObjectTierStats, S3Options};

/// kvtier's checked block format, as the tiers store it: a 16-byte header
/// (`KVT1` magic, payload length as u64 little-endian, CRC-32 of the
/// payload as u32 little-endian), then the payload. For reading and writing
/// blocks outside the tiers (another store, a tool, a fuzzer).
#[cfg(all(
    any(feature = "fs", feature = "object-store"),
    not(any(kvtier_loom, kvtier_shuttle))
))]
pub mod block {
    pub use crate::tier::Corruption;
    pub use crate::tier::format::{HEADER_LEN, decode, encode, payload_length};
}

/// Compiles and runs the README's example as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
