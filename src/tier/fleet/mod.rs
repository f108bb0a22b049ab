//! The fleet's books: one bucket prefix's capacity ledger shared by every
//! host writing into it, kept in Valkey (or Redis) and changed only by one
//! server-side script, so that each protocol step (reserve, commit,
//! release, pin, touch, evict, rebuild) is one atomic operation.
//!
//! - [`ops`]: the operations and their replies, apart from any client
//!   library (the reference model in models/ answers the same ones).
//! - `books` (feature `fleet`): the client on redis-rs.
//!
//! docs/design.md, "The fleet's books in Valkey", states the protocol.

#[cfg(fleet_index)]
mod books;
pub mod ops;

#[cfg(fleet_index)]
pub use books::{BOOKS_SCRIPT, FleetBooks, FleetError, IndexTimeouts, books_keys};
pub use ops::{BadReply, BooksStatus, Frame, HeldKind, Op, Reply};
