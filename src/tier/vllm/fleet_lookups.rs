//! The fleet's books for a process that only looks blocks up (feature
//! `fleet`): vLLM's KV connector asks in its scheduler's process whether
//! blocks are in the bucket, while its transfers run in the workers'. That
//! process gets a connection of its own, on a runtime of its own, and an
//! upkeep task that follows the books (a restart, a rebuild) and touches
//! the hits its lookups noted. docs/design.md, "The fleet's books in
//! Valkey".

use std::time::Duration;

use object_store::path::Path as ObjectPath;

use super::bucket::VllmObjectLayout;
use super::layout::vllm_entry;
use crate::settings::{BudgetConfig, IndexConfig};
use crate::sync::Arc;
use crate::tier::error::TierError;
use crate::tier::fleet::FleetBudget;
use crate::tier::object_budget::is_block_below;

/// The runtime a layout's own books run on, and their upkeep task; both
/// stop when the last clone of the layout goes.
pub(super) struct OwnBooks {
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    upkeep: tokio::task::AbortHandle,
}

impl std::fmt::Debug for OwnBooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnBooks").finish_non_exhaustive()
    }
}

impl Drop for OwnBooks {
    fn drop(&mut self) {
        self.upkeep.abort();
        if let Some(runtime) = self.runtime.take() {
            // Also from inside another runtime (a lookup's task).
            runtime.shutdown_background();
        }
    }
}

impl VllmObjectLayout {
    /// Whether the fleet's books answer the lookups (not `HEAD`s).
    pub fn answers_from_books(&self) -> bool {
        self.index.is_some()
    }

    /// Answers the lookups from the fleet's books at `index`, over a
    /// connection of this layout's own (for a process without transfers;
    /// with transfers, use theirs:
    /// [`VllmTransfers::fleet_budget`](crate::tier::VllmTransfers::fleet_budget)
    /// and [`with_index`](Self::with_index)). Connects now (an unreachable
    /// index is an error); `config`'s capacity makes the books if no host
    /// has yet. Every third of a lease a task on a thread of its own
    /// (`kvtier-books`) touches the hits and follows the books; it stops
    /// with the last clone of the layout.
    pub fn with_own_index(
        self,
        config: &BudgetConfig,
        index: &IndexConfig,
    ) -> Result<Self, TierError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kvtier-books")
            .enable_all()
            .build()
            .map_err(|error| TierError::Index {
                op: "connect",
                detail: format!("cannot start the books' runtime: {error}"),
            })?;
        let namespace = format!("{}/{}", self.store(), self.rank_prefix());
        let fleet = runtime.block_on(FleetBudget::connect(
            index,
            &namespace,
            config.capacity().get(),
        ))?;
        let upkeep = runtime
            .spawn(keep_up(fleet.clone(), self.clone(), index.lease() / 3))
            .abort_handle();
        let mut layout = self.with_index(fleet);
        layout.own_books = Some(Arc::new(OwnBooks {
            runtime: Some(runtime),
            upkeep,
        }));
        Ok(layout)
    }
}

/// The lookups' upkeep: every `every`, one round of
/// [`FleetBudget::maintain`] (this process holds no entries: it touches
/// hits, follows the epoch, settles expired entries like any host).
async fn keep_up(fleet: FleetBudget, layout: VllmObjectLayout, every: Duration) {
    let prefix = ObjectPath::from(layout.rank_prefix());
    loop {
        tokio::time::sleep(every).await;
        let classify = |location: &ObjectPath| is_block_below(&prefix, location, vllm_entry);
        if let Err(error) = fleet.maintain(&**layout.store(), &prefix, classify).await {
            tracing::warn!(%error, "cannot keep up the fleet's books for the lookups");
        }
    }
}
