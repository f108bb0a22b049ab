//! The primary tier's memory, as vLLM's transfers reach it: `blocks()`
//! blocks of `block_bytes()` bytes each (vLLM's chunk ids index them), and a
//! claim per block, so two transfers of one tier never touch a block at once
//! in a way that could race: any number of stores may read a block, a load
//! writes it alone.
//!
//! The memory is the engine's (vLLM's CPU KV cache, handed over through
//! Python's buffer protocol) or the region's own ([`PrimaryRegion::zeroed`]).
//! Either way the transfers read and write it on I/O threads, without the
//! GIL; the claims are what makes that sound: a block is only turned into a
//! slice while its claim is held.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;

use crate::sync::Arc;
use crate::sync::atomic::{AtomicU32, Ordering};
use crate::tier::error::TierError;

/// A block's claim held by a load: no other transfer may touch the block.
const WRITER: u32 = u32::MAX;

/// How a transfer touches its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// A store reads them (shared with other stores).
    Read,
    /// A load writes them (alone).
    Write,
}

/// Who owns the region's bytes.
enum Memory {
    /// Allocated by [`PrimaryRegion::zeroed`], freed on drop.
    Owned,
    /// The caller's; this keeps it alive (dropped after the last access).
    Foreign(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
}

/// The primary tier's memory for vLLM's transfers (see the module docs).
///
/// ```
/// use kvtier::tier::PrimaryRegion;
///
/// let region = PrimaryRegion::zeroed(4, 16)?; // 4 blocks of 16 bytes
/// region.write_block(2, &[7; 16])?;
/// assert_eq!(region.read_block(2)?, vec![7; 16]);
/// assert!(region.read_block(4).is_err(), "there are 4 blocks");
/// # Ok::<(), kvtier::TierError>(())
/// ```
pub struct PrimaryRegion {
    base: NonNull<u8>,
    len: usize,
    block_bytes: usize,
    /// Per block: how many stores read it, or [`WRITER`] while a load
    /// writes it.
    claims: Box<[AtomicU32]>,
    memory: Memory,
}

// SAFETY: the region hands out access to its bytes only through claims
// (`Claim`), which exclude a writer from every other access to its block,
// across threads; the bytes themselves are plain memory valid for the
// region's life (`from_raw_parts`'s contract, or owned).
unsafe impl Send for PrimaryRegion {}
// SAFETY: as for `Send`: shared access goes through the atomic claims.
unsafe impl Sync for PrimaryRegion {}

impl PrimaryRegion {
    /// A region of `blocks` zeroed blocks of `block_bytes` bytes that owns
    /// its memory: for tests, tools and engines written in Rust.
    pub fn zeroed(blocks: usize, block_bytes: usize) -> Result<Self, TierError> {
        let len = Self::checked_len(blocks, block_bytes)?;
        let memory: Box<[u8]> = vec![0; len].into_boxed_slice();
        let base = NonNull::new(Box::into_raw(memory).cast::<u8>()).unwrap_or(NonNull::dangling());
        Ok(Self::with_memory(base, len, block_bytes, Memory::Owned))
    }

    /// A region over `len` bytes at `base` that someone else owns, in
    /// blocks of `block_bytes` bytes (`len` must be a whole number of
    /// blocks); `keep_alive` is held until the region is dropped.
    ///
    /// # Safety
    ///
    /// - `base` is valid for reads and writes of `len` bytes for as long as
    ///   `keep_alive` is alive (it is dropped last, with the region), and
    ///   does not move;
    /// - while a transfer of this region holds a block (from its submission
    ///   until its report), nothing outside this region writes that block,
    ///   and nothing outside it reads a block a load holds. vLLM's tier
    ///   manager guarantees this by pinning a transfer's blocks.
    pub unsafe fn from_raw_parts(
        base: *mut u8,
        len: usize,
        block_bytes: usize,
        keep_alive: Box<dyn Any + Send + Sync>,
    ) -> Result<Self, TierError> {
        if block_bytes == 0 || !len.is_multiple_of(block_bytes) {
            return Err(TierError::Config(format!(
                "{len} bytes are not a whole number of {block_bytes}-byte blocks"
            )));
        }
        let Some(base) = NonNull::new(base) else {
            return Err(TierError::Config(
                "the primary region's address is null".into(),
            ));
        };
        Ok(Self::with_memory(
            base,
            len,
            block_bytes,
            Memory::Foreign(keep_alive),
        ))
    }

    fn checked_len(blocks: usize, block_bytes: usize) -> Result<usize, TierError> {
        if block_bytes == 0 {
            return Err(TierError::Config("a block is at least one byte".into()));
        }
        blocks
            .checked_mul(block_bytes)
            .filter(|&len| len <= isize::MAX as usize)
            .ok_or_else(|| {
                TierError::Config(format!(
                    "{blocks} blocks of {block_bytes} bytes do not fit in memory"
                ))
            })
    }

    fn with_memory(base: NonNull<u8>, len: usize, block_bytes: usize, memory: Memory) -> Self {
        let blocks = len / block_bytes;
        Self {
            base,
            len,
            block_bytes,
            claims: (0..blocks).map(|_| AtomicU32::new(0)).collect(),
            memory,
        }
    }

    /// How many blocks the region holds.
    pub fn blocks(&self) -> usize {
        self.claims.len()
    }

    /// Bytes per block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// A copy of block `block` (claimed for reading meanwhile).
    pub fn read_block(&self, block: usize) -> Result<Vec<u8>, TierError> {
        let claim = self.claim_one(block, Access::Read)?;
        // SAFETY: the read claim excludes every writer of `block`.
        let bytes = unsafe { self.slice(block) }.to_vec();
        self.release(claim, Access::Read);
        Ok(bytes)
    }

    /// Overwrites block `block` with `bytes`, which must be one block long
    /// (claimed for writing meanwhile).
    pub fn write_block(&self, block: usize, bytes: &[u8]) -> Result<(), TierError> {
        if bytes.len() != self.block_bytes {
            return Err(TierError::Config(format!(
                "{} bytes are not one {}-byte block",
                bytes.len(),
                self.block_bytes
            )));
        }
        let claim = self.claim_one(block, Access::Write)?;
        // SAFETY: the write claim excludes every other access to `block`.
        unsafe { self.slice_mut(block) }.copy_from_slice(bytes);
        self.release(claim, Access::Write);
        Ok(())
    }

    /// Claims every block of `blocks` for `access`, all or none: a block
    /// out of range, or one another transfer holds in a way `access`
    /// excludes, refuses the whole claim.
    pub(crate) fn claim(
        self: &Arc<Self>,
        blocks: &[usize],
        access: Access,
    ) -> Result<Claim, TierError> {
        for (taken, &block) in blocks.iter().enumerate() {
            if let Err(error) = self.claim_one(block, access) {
                for &held in &blocks[..taken] {
                    self.release(held, access);
                }
                return Err(error);
            }
        }
        Ok(Claim {
            region: self.clone(),
            blocks: blocks.to_vec(),
            access,
        })
    }

    fn claim_one(&self, block: usize, access: Access) -> Result<usize, TierError> {
        let Some(claim) = self.claims.get(block) else {
            return Err(TierError::Config(format!(
                "block {block} is outside the primary region's {} blocks",
                self.blocks()
            )));
        };
        let taken = match access {
            // guard: V1-a-load-writes-its-block-alone
            Access::Write => claim
                .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok(),
            Access::Read => claim
                .fetch_update(Ordering::Acquire, Ordering::Relaxed, |readers| {
                    // guard: V1-stores-never-read-a-block-being-loaded
                    (readers < WRITER - 1).then(|| readers + 1)
                })
                .is_ok(),
        };
        if taken {
            Ok(block)
        } else {
            Err(TierError::Config(format!(
                "block {block} of the primary region is in use by another transfer{}",
                match access {
                    Access::Read => " (a load writes it)",
                    Access::Write => "",
                }
            )))
        }
    }

    fn release(&self, block: usize, access: Access) {
        let claim = &self.claims[block];
        match access {
            Access::Write => claim.store(0, Ordering::Release),
            Access::Read => {
                claim.fetch_sub(1, Ordering::Release);
            }
        }
    }

    /// # Safety
    /// The caller holds a claim on `block` (`block < blocks()`).
    unsafe fn slice(&self, block: usize) -> &[u8] {
        // SAFETY: `block` is in range, so the block lies within the `len`
        // valid bytes at `base`; a claim excludes writers.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(block * self.block_bytes),
                self.block_bytes,
            )
        }
    }

    /// # Safety
    /// The caller holds the write claim on `block` (`block < blocks()`).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self, block: usize) -> &mut [u8] {
        // SAFETY: in range as for `slice`; the write claim excludes every
        // other access, so this is the only reference to these bytes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(block * self.block_bytes),
                self.block_bytes,
            )
        }
    }
}

impl Drop for PrimaryRegion {
    fn drop(&mut self) {
        if let Memory::Owned = self.memory {
            let bytes = std::ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.len);
            // SAFETY: `base` and `len` came from `Box::into_raw` in `zeroed`
            // (a zero-length box has a dangling pointer, which `from_raw`
            // takes back as it gave it), and nothing accesses the bytes any
            // more: every claim holds an `Arc` of the region.
            drop(unsafe { Box::from_raw(bytes) });
        }
    }
}

impl fmt::Debug for PrimaryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimaryRegion")
            .field("blocks", &self.blocks())
            .field("block_bytes", &self.block_bytes)
            .finish_non_exhaustive()
    }
}

/// A transfer's hold on its blocks; released when dropped.
pub(crate) struct Claim {
    region: Arc<PrimaryRegion>,
    blocks: Vec<usize>,
    access: Access,
}

impl Claim {
    /// The blocks claimed, in the transfer's order.
    pub(crate) fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    /// The bytes of the `i`th block claimed.
    pub(crate) fn block(&self, i: usize) -> &[u8] {
        // SAFETY: this claim holds `blocks[i]`, which `claim` checked is in
        // range.
        unsafe { self.region.slice(self.blocks[i]) }
    }

    /// The bytes of the `i`th block claimed, to write: `None` unless the
    /// claim is a load's.
    pub(crate) fn block_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        if self.access != Access::Write {
            return None;
        }
        // SAFETY: this claim holds the write claim on `blocks[i]` (in
        // range), which no other claim can share; `&mut self` keeps this the
        // only slice of it from this claim.
        Some(unsafe { self.region.slice_mut(self.blocks[i]) })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        for &block in &self.blocks {
            self.region.release(block, self.access);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::thread;

    fn region(blocks: usize) -> Arc<PrimaryRegion> {
        Arc::new(PrimaryRegion::zeroed(blocks, 8).expect("region"))
    }

    #[test]
    fn stores_share_a_block_and_a_load_has_it_alone() {
        let region = region(4);
        let store = region.claim(&[0, 1], Access::Read).expect("store");
        let second_store = region.claim(&[1, 2], Access::Read).expect("stores share");
        assert!(
            region.claim(&[3, 1], Access::Write).is_err(),
            "block 1 is being read"
        );
        let load = region.claim(&[3], Access::Write).expect("block 3 is free");
        assert!(
            region.claim(&[3], Access::Read).is_err(),
            "block 3 is being written"
        );
        assert!(region.claim(&[3], Access::Write).is_err());
        drop((store, second_store, load));
        let all = region
            .claim(&[0, 1, 2, 3], Access::Write)
            .expect("all released");
        drop(all);
    }

    #[test]
    fn a_refused_claim_holds_nothing_and_a_duplicate_load_is_refused() {
        let region = region(3);
        let held = region.claim(&[2], Access::Write).expect("load");
        assert!(region.claim(&[0, 1, 2], Access::Write).is_err());
        drop(held);
        let load = region
            .claim(&[0, 1, 2], Access::Write)
            .expect("0 and 1 were given back");
        drop(load);
        assert!(
            region.claim(&[1, 1], Access::Write).is_err(),
            "one block loaded twice"
        );
        assert!(region.claim(&[5], Access::Read).is_err(), "out of range");
        region
            .claim(&[1, 1], Access::Read)
            .expect("a block stored twice is read twice");
    }

    #[test]
    fn bytes_written_through_a_claim_are_read_back() {
        let region = region(2);
        let mut load = region.claim(&[1], Access::Write).expect("load");
        load.block_mut(0)
            .expect("a load writes")
            .copy_from_slice(b"abcdefgh");
        drop(load);
        let store = region.claim(&[1], Access::Read).expect("store");
        assert_eq!(store.block(0), b"abcdefgh");
        let mut store = store;
        assert!(store.block_mut(0).is_none(), "a store only reads");
        assert_eq!(region.read_block(0).unwrap(), vec![0; 8]);
        assert!(region.write_block(0, b"short").is_err());
    }

    #[test]
    fn sizes_are_checked() {
        assert!(PrimaryRegion::zeroed(1, 0).is_err());
        assert!(PrimaryRegion::zeroed(usize::MAX, 2).is_err());
        let empty = PrimaryRegion::zeroed(0, 8).expect("no blocks");
        assert_eq!(empty.blocks(), 0);
        let mut bytes = vec![0u8; 12];
        // SAFETY: `bytes` outlives the region, and nothing else touches it.
        let refused =
            unsafe { PrimaryRegion::from_raw_parts(bytes.as_mut_ptr(), 12, 8, Box::new(())) };
        assert!(refused.is_err(), "12 bytes are not whole 8-byte blocks");
    }

    #[test]
    fn concurrent_loads_of_one_block_never_both_hold_it() {
        let region = region(1);
        let holders = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (region, holders) = (region.clone(), holders.clone());
                thread::Builder::new()
                    .spawn(move || {
                        for _ in 0..2_000 {
                            if let Ok(claim) = region.claim(&[0], Access::Write) {
                                assert_eq!(
                                    holders.fetch_add(1, Ordering::SeqCst),
                                    0,
                                    "two loads hold block 0"
                                );
                                holders.fetch_sub(1, Ordering::SeqCst);
                                drop(claim);
                            }
                        }
                    })
                    .expect("a test thread starts")
            })
            .collect();
        for thread in threads {
            thread.join().expect("no two holders");
        }
    }
}
