//! The capacity protocol as a short, sequential specification: a list of
//! blocks in recency order, every sum recomputed by a scan. Written for
//! clarity, not speed; [`CapacityLockstep`](crate::capacity_lockstep::CapacityLockstep) drives the real
//! [`kvtier::capacity::CapacityLedger`] and this specification with one
//! operation sequence and compares them after every operation.
//!
//! What it states:
//! - a store is refused when the block exceeds the capacity (too large),
//!   when the block is being written or deleted (busy), when the bytes
//!   that could be evicted do not cover the shortfall (no room; busy if
//!   evictions under way would);
//! - otherwise it is granted when it fits, or it names victims: resident,
//!   unpinned blocks, no more than needed (without the last one they would
//!   not cover the shortfall); under LRU, the least recently used such
//!   blocks, in order;
//! - resident (including evicting) plus reserved bytes never exceed the
//!   capacity, unless the capacity was lowered and has not been met since;
//! - tokens are released exactly once; every counter is as the operations
//!   say;
//! - a reconcile with a listing adopts the listed blocks the books do not
//!   hold, unless they left the books while the listing ran; forgets the
//!   unlisted blocks that stayed resident throughout the listing (neither
//!   committed, adopted nor gone since it began); and names victims like a
//!   lowered capacity.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpecState {
    Reserved,
    Resident { pins: u32, lost: bool },
    Evicting,
}

#[derive(Clone, Debug)]
pub(crate) struct SpecBlock {
    pub(crate) key: u8,
    pub(crate) bytes: u64,
    pub(crate) state: SpecState,
}

/// The specification's state.
#[derive(Clone, Debug, Default)]
pub struct CapacitySpec {
    pub(crate) capacity: u64,
    /// Oldest use first.
    pub(crate) blocks: Vec<SpecBlock>,
    /// Set when the capacity is lowered below what is held; cleared once
    /// resident plus reserved fit again.
    pub(crate) lowered: bool,
}

impl CapacitySpec {
    pub(crate) fn find(&self, key: u8) -> Option<usize> {
        self.blocks.iter().position(|b| b.key == key)
    }

    pub(crate) fn sum(&self, pick: impl Fn(&SpecBlock) -> bool) -> u64 {
        self.blocks
            .iter()
            .filter(|b| pick(b))
            .map(|b| b.bytes)
            .sum()
    }

    pub(crate) fn resident(&self) -> u64 {
        self.sum(|b| !matches!(b.state, SpecState::Reserved))
    }

    pub(crate) fn reserved(&self) -> u64 {
        self.sum(|b| b.state == SpecState::Reserved)
    }

    pub(crate) fn evictable(b: &SpecBlock) -> bool {
        b.state
            == SpecState::Resident {
                pins: 0,
                lost: false,
            }
    }

    pub(crate) fn touch(&mut self, index: usize) {
        let block = self.blocks.remove(index);
        self.blocks.push(block);
    }
}

/// One operation; indexes pick among the outstanding tokens (modulo their
/// count), keys and sizes are small so that blocks collide.
#[derive(Clone, Debug)]
pub enum CapacityOp {
    /// Reserve `bytes` for `key`.
    Reserve { key: u8, bytes: u8 },
    /// Commit an outstanding reservation.
    Commit { pick: u8 },
    /// Abort one.
    Abort { pick: u8 },
    /// Pin a block.
    Pin { key: u8 },
    /// Unpin an outstanding pin.
    Unpin { pick: u8 },
    /// Report a victim deleted.
    Evicted { pick: u8 },
    /// Report a victim's deletion failed.
    EvictionFailed { pick: u8 },
    /// A read found the block's file gone.
    Lose { key: u8 },
    /// Set the capacity.
    SetCapacity { capacity: u16 },
    /// Begin a listing of the directory.
    BeginListing,
    /// Reconcile an open listing with the blocks in `listed` (a bit per
    /// key; a block's bytes are [`listed_bytes`]).
    Reconcile { pick: u8, listed: u16 },
    /// Abandon an open listing.
    AbandonListing { pick: u8 },
}

/// The bytes of block `key` as another process wrote it.
pub fn listed_bytes(key: u8) -> u64 {
    5 + u64::from(key) * 7 % 50
}
