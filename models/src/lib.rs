//! Everything that checks kvtier against a formal model.
//!
//! - [`reference`](mod@reference): the lookup protocol as a short, sequential
//!   specification, the oracle of every other check here.
//! - [`conformance`]: compares a real [`kvtier::lookup::LookupTable`] with the
//!   specification's state.
//! - [`scripted`]: a deterministic backend whose contents change from call to
//!   call and whose faults are scripted per call.
//! - [`checked`]: the real threaded driver with the specification alongside,
//!   compared after every operation (the oracle of the loom, shuttle and
//!   driver-fuzz models).
//! - [`checked_tasks`]: the concurrent-group [`kvtier::lookup::TokioLookup`] driver
//!   with the specification alongside; groups may be applied in any order,
//!   so it replays the order the driver records (its shuttle models and its
//!   stress test on tokio).
//! - [`lockstep`]: the table and the specification driven by one operation
//!   sequence (the differential test and the table fuzz target).
//! - [`fuzzing`]: the bodies of the cargo-fuzz targets, replayed on stable by
//!   tests/fuzz_corpus.rs.
//! - [`save_reference`], [`save_scripted`], [`save_lockstep`]: the same
//!   for deferred save completion — its specification, a deterministic store
//!   whose log witnesses S1–S6, and the real halves run against both.
//! - [`capacity_reference`], [`capacity_lockstep`]: the capacity protocol (reservations, pins,
//!   eviction) as a specification, and the real ledger in lockstep with it.
//! - [`fleet_reference`]: the fleet's books (Valkey) as a specification,
//!   the oracle of the script's differential test.
//! - [`protocol`]: an abstract model of the protocol, explored exhaustively
//!   (tests/protocol_model.rs).
//! - `coherence` (under the model checkers' cfgs): a budgeted tier's
//!   lookups against its store threads (tests/loom_coherence.rs,
//!   tests/shuttle_coherence.rs).
//! - `shared_dir` (under the model checkers' cfgs): processes sharing one
//!   directory, each with its own budget, reconciling with listings
//!   (tests/loom_shared_dir.rs, tests/shuttle_shared_dir.rs).
//! - [`checkers`]: how the loom and shuttle files run their models (bounds,
//!   iterations, replay), compiled under the matching cfg.
//! - `tests/loom_*.rs` (built with `RUSTFLAGS="--cfg kvtier_loom"`) and
//!   `tests/shuttle_*.rs` (`--cfg kvtier_shuttle`): the real threaded driver
//!   under the model checkers.

pub mod capacity_lockstep;
pub mod capacity_reference;
pub mod checked;
#[cfg(not(kvtier_loom))]
pub mod checked_tasks;
pub mod checkers;
#[cfg(any(kvtier_loom, kvtier_shuttle))]
pub mod coherence;
pub mod conformance;
mod driver_state;
#[cfg(not(any(kvtier_loom, kvtier_shuttle)))]
pub mod fleet_reference;
pub mod fuzzing;
pub mod lockstep;
pub mod protocol;
pub mod reference;
pub mod save_ending;
pub mod save_lockstep;
pub mod save_reference;
pub mod save_scripted;
pub mod scripted;
#[cfg(any(kvtier_loom, kvtier_shuttle))]
pub mod shared_dir;
