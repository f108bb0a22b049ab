//! Where vLLM's transfers keep their blocks: one rank's directory of vLLM's
//! fs layout, or (feature `object-store`) one rank's prefix of vLLM's
//! layout in an object store, reached from the I/O threads through a tokio
//! runtime of the transfers' own.

use super::blocks::{Stored, load_block, store_block};
#[cfg(object_tier)]
use super::bucket::VllmObjectLayout;
use super::layout::VllmFsLayout;
#[cfg(object_tier)]
use crate::sync::Arc;
use crate::tier::error::TierError;

/// A rank directory or a rank prefix.
#[derive(Clone, Debug)]
pub(super) enum Home {
    Dir(VllmFsLayout),
    #[cfg(object_tier)]
    Bucket(Arc<Bucket>),
}

/// An object-store home: the layout, and the runtime its requests run on.
#[cfg(object_tier)]
pub(super) struct Bucket {
    pub(super) layout: VllmObjectLayout,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

#[cfg(object_tier)]
impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("rank_prefix", &self.layout.rank_prefix())
            .finish_non_exhaustive()
    }
}

#[cfg(object_tier)]
impl Bucket {
    /// The layout, with a runtime of `threads` worker threads (named
    /// `kvtier-vllm-s3`) for its connections and timers.
    pub(super) fn new(layout: VllmObjectLayout, threads: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("kvtier-vllm-s3")
            .enable_all()
            .build()?;
        Ok(Self {
            layout,
            runtime: Some(runtime),
        })
    }

    /// Runs `future` to its end on the calling (I/O) thread.
    pub(super) fn run<F: std::future::Future>(&self, future: F) -> F::Output {
        match &self.runtime {
            Some(runtime) => runtime.block_on(future),
            None => unreachable!("the runtime is taken only by drop"),
        }
    }
}

#[cfg(object_tier)]
impl Drop for Bucket {
    /// The last owner is the transfers after their I/O threads stopped:
    /// nothing runs on the runtime any more, and its threads are let go
    /// without waiting for idle connections.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Home {
    /// The rank directory, for what only a directory has (its budget).
    pub(super) fn dir(&self) -> Result<&VllmFsLayout, TierError> {
        match self {
            Self::Dir(layout) => Ok(layout),
            #[cfg(object_tier)]
            Self::Bucket(_) => Err(TierError::Config(
                "a byte budget for vLLM's transfers on an object store is not available yet".into(),
            )),
        }
    }

    /// Where the home is, for logs.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Dir(layout) => layout.rank_dir().display().to_string(),
            #[cfg(object_tier)]
            Self::Bucket(bucket) => bucket.layout.rank_prefix().to_owned(),
        }
    }

    /// Stores one block (no budget).
    pub(super) fn store(&self, key: &[u8], block: &[u8]) -> Result<Stored, TierError> {
        match self {
            Self::Dir(layout) => store_block(&layout.path_of(key)?, block),
            #[cfg(object_tier)]
            Self::Bucket(bucket) => bucket.run(bucket.layout.store_block(key, block)),
        }
    }

    /// Loads one block (no budget).
    pub(super) fn load(&self, key: &[u8], into: &mut [u8]) -> Result<(), TierError> {
        match self {
            Self::Dir(layout) => load_block(&layout.path_of(key)?, into),
            #[cfg(object_tier)]
            Self::Bucket(bucket) => bucket.run(bucket.layout.load_block(key, into)),
        }
    }
}
