//! The async secondary-tier lookup protocol.
//!
//! [`LookupTable`] holds every rule (sans-IO); [`AsyncLookup`] drives it with
//! a worker thread and a [`LookupBackend`]. See `docs/design.md` for the state
//! machine and the invariants L1–L9.

mod backend;
mod driver;
mod stats;
mod submission;
mod table;
mod types;

pub use backend::LookupBackend;
pub use driver::{AsyncLookup, LookupError};
pub use stats::Stats;
pub use submission::{Group, GroupOutcome, GroupResult, Submission};
pub use table::LookupTable;
pub use types::{Generation, KeyState, Phase, Request, Ticket, Verdict};
