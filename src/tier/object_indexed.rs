//! An [`ObjectTier`] whose budget is the fleet's books in Valkey (feature
//! `fleet`): every process writing into the namespace shares one capacity
//! and one recency. Set up and kept up here; the steps are
//! `object_fleet.rs`'s. docs/design.md, "The fleet's books in Valkey".

use std::time::Duration;

use object_store::path::Path as ObjectPath;

use super::error::TierError;
use super::fleet::{BooksStatus, FleetBooks, FleetBudget, IndexTimeouts, Op, Reply, index_error};
use super::names::kvtier_entry;
use super::object::ObjectTier;
use super::object_budget::is_block_below;
use super::object_fleet::TierIndex;
use crate::settings::{BudgetConfig, IndexConfig};
use crate::sync::Arc;

impl ObjectTier {
    /// Bounds the namespace with the fleet's books at `index` instead of
    /// this process's own books ([`with_budget`](Self::with_budget)): every
    /// process writing into it shares `budget`'s capacity (the books keep
    /// the one the process that made them gave) and one recency. Connects
    /// now (an unreachable index is an error), attaches to the books or
    /// rebuilds them from a listing, and keeps them up every third of a
    /// lease on a task of the current tokio runtime (needed), which ends
    /// with the tier's last clone. Lookups are then one round trip per
    /// group; while the books do not answer, lookups fail (misses) and
    /// stores are refused.
    pub async fn with_index(
        mut self,
        budget: BudgetConfig,
        index: IndexConfig,
    ) -> Result<Self, TierError> {
        if self.budget.is_some() || self.index.is_some() {
            return Err(TierError::Config(
                "the tier has a byte budget already".into(),
            ));
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(TierError::Config(
                "the fleet's books need a tokio runtime to be kept up on".into(),
            ));
        };
        let fleet =
            FleetBudget::connect(&index, &self.books_namespace(), budget.capacity().get()).await?;
        let tier_index = Arc::new(TierIndex { fleet });
        // Attached, or the books rebuilt, before the first store.
        if let Err(error) = self.keep_up(&tier_index.fleet).await {
            tracing::warn!(%error, "the fleet's books are not ready yet");
        }
        let (weak, store, prefix) = (
            Arc::downgrade(&tier_index),
            self.store.clone(),
            ObjectPath::from(self.namespace.as_str()),
        );
        let every = index.lease() / 3;
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                // The tier and its clones are gone: so is the task.
                let Some(tier_index) = weak.upgrade() else {
                    return;
                };
                let classify =
                    |location: &ObjectPath| is_block_below(&prefix, location, kvtier_entry);
                if let Err(error) = tier_index.fleet.maintain(&*store, &prefix, classify).await {
                    tracing::warn!(%error, "cannot keep up the fleet's books");
                }
            }
        });
        self.index = Some(tier_index);
        Ok(self)
    }

    /// The state of the fleet's books at `index` for this tier's namespace,
    /// read only (nothing is made or rebuilt): `None` when there are none
    /// ready (never made, lost, or being rebuilt).
    pub async fn books_status(
        &self,
        index: &IndexConfig,
    ) -> Result<Option<BooksStatus>, TierError> {
        let books = FleetBooks::connect(
            index.url(),
            &self.books_namespace(),
            IndexTimeouts::default(),
        )
        .await
        .map_err(|error| index_error("connect", error))?;
        match books.call("", &Op::Status).await {
            Ok(Reply::Status(status)) => Ok(Some(status)),
            Ok(_) => Ok(None),
            Err(error) => Err(index_error("status", error)),
        }
    }

    /// The books' namespace: the store and the namespace's location.
    fn books_namespace(&self) -> String {
        format!("{}/{}", self.store, self.prefix)
    }

    /// One round of the books' upkeep, now (attach or rebuild, renew,
    /// touch, settle expired entries), and a sweep of the orphans older
    /// than `orphan_age`; returns how many expired entries and orphans
    /// were deleted. An error without an index.
    pub async fn keep_up_books(&self, orphan_age: Duration) -> Result<u64, TierError> {
        let Some(index) = &self.index else {
            return Err(TierError::Config("the tier has no index".into()));
        };
        let settled = self.keep_up(&index.fleet).await?;
        let prefix = ObjectPath::from(self.namespace.as_str());
        let classify = |location: &ObjectPath| is_block_below(&prefix, location, kvtier_entry);
        let swept = index
            .fleet
            .sweep_orphans(&*self.store, &prefix, classify, orphan_age)
            .await?;
        Ok(settled + swept)
    }

    async fn keep_up(&self, fleet: &FleetBudget) -> Result<u64, TierError> {
        let prefix = ObjectPath::from(self.namespace.as_str());
        let classify = |location: &ObjectPath| is_block_below(&prefix, location, kvtier_entry);
        Ok(fleet
            .maintain(&*self.store, &prefix, classify)
            .await?
            .settled)
    }
}
