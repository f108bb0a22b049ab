//! kvtier: a verified concurrency core for KV-cache tiering.
//!
//! An LLM server asks, every scheduler step and without blocking, whether a
//! secondary tier (file system, object store) holds the KV blocks a waiting
//! request could load, and saves blocks to it in the background. kvtier is
//! organised by those jobs:
//!
//! - [`lookup`]: async lookup. [`Lookup`] is the scheduler's side — `lookup`,
//!   `flush`, `mark_miss`, `cleanup` — over a [`LookupTable`](lookup::LookupTable)
//!   that holds every rule as a sans-IO state machine (per-key generations,
//!   request groups, stale-result filtering, `mark_miss` tickets, cleanup
//!   with in-flight probe sharing), and a [`Prober`](lookup::Prober) that
//!   probes the tier off the scheduler thread: a worker thread, tokio tasks
//!   (feature `tokio`), or your own.
//! - [`save`]: deferred save completion. [`SaveScheduler`] and
//!   [`SaveTracker`] free a finished request's blocks only once no save
//!   reads them; connectors compose several trackers and workers.
//! - [`tier`]: the block tiers both use, [`FsTier`] (feature
//!   `fs`) and [`ObjectTier`] (feature `object-store`: S3,
//!   S3-compatible servers, local files, memory); [`block`] is their checked
//!   block format.
//! - [`capacity`]: a tier's byte budget, as a sans-IO ledger: room
//!   reserved before a write and committed after it, blocks pinned while
//!   read, victims chosen by LRU or S3-FIFO.
//! - [`offload`]: KV blocks copied between an engine's KV cache and a
//!   host-memory offload region on native threads (vLLM's tiering on CPU
//!   machines).
//!
//! The names most users need are re-exported here. Every synchronisation
//! primitive comes from one internal shim, so the same code runs under
//! [loom](https://docs.rs/loom) (`--cfg kvtier_loom`) and
//! [shuttle](https://docs.rs/shuttle) (`--cfg kvtier_shuttle`). See
//! `docs/design.md` for the state machines and their invariants.
//!
//! ```
//! use kvtier::{Lookup, Verdict};
//!
//! let tier = |keys: &[u64], _request: &u64| keys.iter().map(|k| *k < 100).collect();
//! let mut lookup = Lookup::threaded(tier)?;
//! assert_eq!(lookup.lookup(&42, &1), Verdict::Pending);
//! lookup.flush()?;
//! lookup.wait_idle()?;
//! assert!(lookup.lookup(&42, &1).is_hit());
//! # Ok::<(), kvtier::LookupError>(())
//! ```

#![warn(missing_docs)]

pub mod capacity;
mod counters;
mod fault;
mod invariant;
pub mod lookup;
#[cfg(fs_tier)]
pub mod offload;
mod publish;
pub mod save;
pub mod settings;
mod sync;
#[cfg(tiers)]
pub mod tier;
mod worker;

pub use lookup::{Lookup, LookupError, Request, Ticket, Verdict};
/// The publication stack's two-producer loom model (`publish.rs`), for the
/// models' loom tests.
#[cfg(kvtier_loom)]
#[doc(hidden)]
pub use publish::two_producers_racing_their_pushes as loom_publication_two_producers;
pub use save::{SaveScheduler, SaveStep, SaveTracker, StoreTask, TaskId};
#[cfg(fs_tier)]
pub use tier::FsTier;
#[cfg(object_tier)]
pub use tier::ObjectTier;
#[cfg(tiers)]
pub use tier::{BlockKey, TierError};

/// kvtier's checked block format, as the tiers store it: a 16-byte header
/// (`KVT1` magic, payload length as u64 little-endian, CRC-32 of the
/// payload as u32 little-endian), then the payload. For reading and writing
/// blocks outside the tiers (another store, a tool, a fuzzer).
#[cfg(tiers)]
pub mod block {
    pub use crate::tier::Corruption;
    pub use crate::tier::format::{HEADER_LEN, decode, encode, payload_length};
}

/// Compiles and runs the README's example as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
