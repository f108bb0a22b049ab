//! The async secondary-tier lookup protocol.
//!
//! Which piece does what:
//!
//! - [`Lookup`] is what a scheduler calls: `lookup`, `flush`, `mark_miss`,
//!   `cleanup` and the rest, written once over a [`Prober`].
//! - [`LookupTable`] holds every rule of the protocol as a sans-IO state
//!   machine (no threads, clocks or I/O); a [`Lookup`] owns one.
//! - A [`Prober`] probes the groups a flush hands it, off the scheduler
//!   thread, and answers each through its [`Publisher`]:
//!   [`ThreadProber`] (a worker thread over a blocking [`Backend`]) and,
//!   with the `tokio` feature, [`TokioProber`] (tokio tasks over an
//!   `AsyncBackend`, several groups at once, each within a timeout). A
//!   prober for another executor is an `impl`; [`Group`] has a constructor
//!   for every outcome a built-in prober produces.
//!
//! See `docs/design.md` for the state machine and the invariants L1–L15.

mod backend;
mod error;
mod limits;
mod scheduler;
mod stats;
mod submission;
mod table;
mod thread;
#[cfg(tokio_driver)]
mod tokio;
mod types;
mod verdict_clock;

pub use crate::invariant::InvariantViolation;
pub use backend::Backend;
pub use error::LookupError;
pub use limits::LookupLimits;
pub use scheduler::{Lookup, Prober, Publisher, Refused, ShutdownError};
pub use stats::LookupStats;
pub use submission::{Group, GroupOutcome, GroupResult, Submission};
pub use table::LookupTable;
pub use thread::{ThreadLookup, ThreadProber};
#[cfg(tokio_driver)]
pub use tokio::{AsyncBackend, TokioConfig, TokioLookup, TokioProber};
pub use types::{Generation, KeyState, Phase, Request, TableId, Ticket, Verdict};
