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

/// A bucket's budget, as the home's stores and loads take it.
#[cfg(object_tier)]
pub(super) use super::bucket_budget::BucketBudget;
/// No bucket without the object store.
#[cfg(not(object_tier))]
#[derive(Clone, Copy)]
pub(super) enum BucketBudget<'a> {
    #[allow(dead_code)]
    Never(std::convert::Infallible, std::marker::PhantomData<&'a ()>),
}

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

    /// Starts `future` on the runtime (a reconcile loop); abort it with
    /// the handle.
    pub(super) fn spawn<F>(&self, future: F) -> tokio::task::AbortHandle
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.spawn(future).abort_handle(),
            None => unreachable!("the runtime is taken only by drop"),
        }
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
                "the transfers keep their blocks in an object store, not in a directory".into(),
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

    /// Stores one block: a directory's without a budget (the transfers
    /// keep a directory's budget), a bucket's with its budget if it has one.
    #[cfg_attr(not(object_tier), allow(unused_variables))]
    pub(super) fn store(
        &self,
        key: &[u8],
        block: &[u8],
        budget: Option<BucketBudget<'_>>,
    ) -> Result<Stored, TierError> {
        match self {
            Self::Dir(layout) => store_block(&layout.path_of(key)?, block),
            #[cfg(object_tier)]
            Self::Bucket(bucket) => bucket.run(bucket.layout.store_block(key, block, budget)),
        }
    }

    /// Loads one block, as [`store`](Self::store) stores it.
    #[cfg_attr(not(object_tier), allow(unused_variables))]
    pub(super) fn load(
        &self,
        key: &[u8],
        into: &mut [u8],
        budget: Option<BucketBudget<'_>>,
    ) -> Result<(), TierError> {
        match self {
            Self::Dir(layout) => load_block(&layout.path_of(key)?, into),
            #[cfg(object_tier)]
            Self::Bucket(bucket) => bucket.run(bucket.layout.load_block(key, into, budget)),
        }
    }
}
