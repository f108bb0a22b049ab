//! One vLLM transfer job: its kind, what its I/O thread tells the owner
//! (blocks done, time, blocks already there), and the I/O itself, block by
//! block, between the region and the job's home.

use std::fmt;

use super::blocks::{Stored, load_block, store_block};
use super::books::Books;
use super::home::Home;
use super::region::{Access, Claim};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex};
use crate::tier::error::TierError;

/// Whether a job stores blocks into the tier or loads them out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferKind {
    /// Primary region → tier (vLLM's `submit_store`, a cascade).
    Store,
    /// Tier → primary region (vLLM's `submit_load`, a promotion).
    Load,
}

impl TransferKind {
    /// The pool lane of the kind: loads are lane 0, served first by the
    /// load threads.
    pub(super) fn lane(self) -> usize {
        match self {
            Self::Load => 0,
            Self::Store => 1,
        }
    }

    pub(super) fn access(self) -> Access {
        match self {
            Self::Load => Access::Write,
            Self::Store => Access::Read,
        }
    }
}

/// What the I/O thread tells the owner about a job, besides its outcome.
pub(super) struct Progress {
    /// Blocks done, in the job's order, before the first that failed.
    pub(super) done: AtomicUsize,
    /// Time spent in the job's I/O.
    pub(super) nanos: AtomicU64,
    /// Stores without a budget: the indices (ascending) of blocks that
    /// were in the tier already, so nothing was written for them.
    pub(super) present: Mutex<Vec<usize>>,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            done: AtomicUsize::new(0),
            nanos: AtomicU64::new(0),
            present: Mutex::new(Vec::new()),
        }
    }
}

/// A job as the tracker holds it: equal, and hashed, by id alone.
#[derive(Clone)]
pub(super) struct Job {
    pub(super) id: u64,
    pub(super) kind: TransferKind,
    pub(super) keys: Arc<[Vec<u8>]>,
    pub(super) progress: Arc<Progress>,
}

impl Job {
    pub(super) fn new(id: u64, kind: TransferKind, keys: Vec<Vec<u8>>) -> Self {
        Self {
            id,
            kind,
            keys: keys.into(),
            progress: Arc::default(),
        }
    }
}

identified_by_id!(Job);

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} job {} ({} blocks)",
            self.kind,
            self.id,
            self.keys.len()
        )
    }
}

/// Moves the job's blocks in order, stopping at the first that fails;
/// gives the claim back when done.
pub(super) fn transfer(
    home: &Home,
    books: Option<&Books>,
    job: &Job,
    mut claim: Claim,
) -> Result<(), TierError> {
    // A directory's budget is kept here; a bucket's, by the home.
    let budget = books.and_then(Books::dir);
    let objects = books.and_then(Books::bucket);
    for (i, key) in job.keys.iter().enumerate() {
        let budgeted = match (budget, home) {
            (Some(budget), Home::Dir(layout)) => Some((budget, layout.path_of(key)?)),
            _ => None,
        };
        match job.kind {
            // guard: E20-vllm-stores-get-room-before-they-write
            TransferKind::Store => match budgeted {
                None => {
                    if home.store(key, claim.block(i), objects)? == Stored::Present {
                        job.progress.present.lock().push(i);
                    }
                }
                Some((budget, path)) => {
                    let block = claim.block(i);
                    budget.store(&path, block.len() as u64, || {
                        store_block(&path, block).map(drop)
                    })?;
                }
            },
            TransferKind::Load => {
                let Some(block) = claim.block_mut(i) else {
                    unreachable!("V1: a load holds the write claim on its blocks");
                };
                let loaded = match budgeted {
                    None => home.load(key, block, objects),
                    Some((budget, path)) => {
                        // guard: E21-vllm-loads-pin-their-blocks
                        let pin = budget.pin(&path);
                        let loaded = load_block(&path, block);
                        if loaded.is_err() {
                            // Missing, or damaged (and then removed): off
                            // the books.
                            budget.lose(&path);
                        }
                        drop(pin);
                        loaded
                    }
                };
                // guard: V4-loads-stop-at-the-first-failure
                loaded?;
            }
        }
        job.progress.done.store(i + 1, Ordering::Release);
    }
    debug_assert_eq!(claim.blocks().len(), job.keys.len());
    drop(claim);
    Ok(())
}
