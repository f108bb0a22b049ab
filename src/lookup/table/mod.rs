//! The sans-IO lookup table: every rule of the protocol, no threads inside.
//!
//! `state` holds the table's fields; `read` the lookup path; `write` the
//! step's submission and its answers; `release` cleanup; `bounds` the
//! limits; `settle` the tier's own news; `keys` the slab of key records and its index;
//! `storage` the per-key entries, requester lists and request slots; `check`
//! the structural self-check the tests and models run.
//!
//! Layout (see docs/performance.md for what it costs): each key is stored
//! once, with its 24-byte [`Entry`], in a slab cell found through a hash
//! index of `u32` cell numbers; live requests are interned into a slab of
//! [`Slot`]s, so a link is a `u32` both ways (a key's requesters are slot
//! numbers, a request's keys are cell numbers), never a copy of a key or a
//! request id; the requesters of shared keys beyond the first sit in
//! reusable overflow lists. Hashing is hashbrown's default (foldhash): fast
//! on the short keys a KV cache uses, and seeded per table, unlike an
//! unseeded FxHash.

mod bounds;
mod check;
mod inspect;
mod keys;
mod read;
mod release;
mod settle;
mod state;
mod step;
mod storage;
#[cfg(test)]
mod tests;
mod write;

pub use state::LookupTable;
