//! The fleet's books: one bucket prefix's capacity ledger shared by every
//! host writing into it, kept in Valkey (or Redis) and changed only by one
//! server-side script, so that each protocol step (reserve, commit,
//! release, pin, touch, evict, rebuild) is one atomic operation.
//!
//! - [`ops`]: the operations and their replies, apart from any client
//!   library (the reference model in models/ answers the same ones).
//! - `books` (feature `fleet`): the client on redis-rs.
//! - [`FleetHost`](crate::capacity::FleetHost): what a host keeps beside
//!   the books (holds, touches, changes), without I/O: checked under loom.
//! - `budget` (feature `fleet`): a host's side: room, commits, pins,
//!   lookups, leases renewed, hits touched, expired entries swept, lost
//!   books rebuilt from a listing.
//!
//! docs/design.md, "The fleet's books in Valkey", states the protocol.

#[cfg(fleet_index)]
mod books;
#[cfg(fleet_index)]
mod budget;
pub mod ops;
#[cfg(fleet_index)]
mod upkeep;

#[cfg(fleet_index)]
pub use books::{BOOKS_SCRIPT, FleetBooks, FleetError, IndexTimeouts, books_keys};
#[cfg(fleet_index)]
pub(crate) use budget::index_error;
#[cfg(fleet_index)]
pub use budget::{Admission, FleetBudget, FleetPin, FleetWrite};
pub use ops::{BadReply, BooksStatus, Frame, HeldKind, Op, Reply};
#[cfg(fleet_index)]
pub use upkeep::Maintained;
