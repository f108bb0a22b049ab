//! The async secondary-tier lookup protocol.
//!
//! [`LookupTable`] holds every rule (sans-IO); [`AsyncLookup`] drives it with
//! a worker thread and a [`LookupBackend`]. See `docs/design.md` for the state
//! machine and the invariants L1–L9.

mod backend;
mod driver;
mod front;
mod stats;
mod submission;
mod table;
#[cfg(any(
    all(feature = "tokio", not(any(kvtier_loom, kvtier_shuttle))),
    all(kvtier_shuttle, not(kvtier_loom))
))]
mod tasks;
mod types;

pub use backend::LookupBackend;
pub use driver::{AsyncLookup, LookupError};
pub use stats::Stats;
pub use submission::{Group, GroupOutcome, GroupResult, Submission};
pub use table::LookupTable;
#[cfg(any(
    all(feature = "tokio", not(any(kvtier_loom, kvtier_shuttle))),
    all(kvtier_shuttle, not(kvtier_loom))
))]
pub use tasks::{AsyncLookupBackend, TokioConfig, TokioLookup};
pub use types::{Generation, KeyState, Phase, Request, TableId, Ticket, Verdict};
