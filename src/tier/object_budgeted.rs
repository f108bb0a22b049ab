//! The byte budget of an [`ObjectTier`]: set at start (a listing, stale
//! uploads aborted), reconciled with listings, trimmed; and the prefix's
//! usage. The budget itself (its ledger and its deletions) is
//! `object_budget.rs`'s.

use object_store::path::Path as ObjectPath;

use super::error::{ReconcileReport, ScanReport, TierError};
use super::names::kvtier_entry;
use super::object::ObjectTier;
use super::object_budget::ObjectBudget;
use super::s3::uploads::{StaleUploads, abort_stale};
use crate::capacity::CapacityStats;
use crate::settings::BudgetConfig;
use crate::sync::Arc;

impl ObjectTier {
    /// Bounds the bytes of this tier's blocks (its namespace: a bucket
    /// prefix) to the budget's capacity. Lists the namespace now (the
    /// startup scan): the newest blocks that fit are counted, older ones
    /// deleted. From then on every store gets room first, deleting blocks
    /// by the budget's policy (a store that cannot is
    /// [`TierError::NoRoom`], nothing lost), and every load pins its block.
    /// Clones share the budget.
    ///
    /// The budget counts what this tier found and wrote. Other processes
    /// or hosts writing to the same prefix are counted by a reconcile
    /// ([`reconcile`](Self::reconcile)): with a `rescan_interval` the
    /// budget runs one that often on a task of the current tokio runtime,
    /// until the tier and its clones are dropped, so the prefix stays
    /// within the capacity plus about one interval of the others' writes
    /// (see docs/design.md, "Capacity across processes").
    ///
    /// ```
    /// use kvtier::ObjectTier;
    /// use kvtier::settings::BudgetConfig;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let tier = ObjectTier::memory("ns")?.with_budget(BudgetConfig::new(200)?).await?;
    /// for key in 0u64..4 {
    ///     tier.store(&key, vec![0; 84]).await?; // 100 bytes with the header
    /// }
    /// assert!(!tier.contains(&0u64).await? && !tier.contains(&1u64).await?);
    /// let stats = tier.capacity_stats().expect("a budget");
    /// assert_eq!((stats.resident_bytes, stats.evictions), (200, 2));
    /// # Ok::<(), kvtier::TierError>(())
    /// # }).unwrap();
    /// ```
    pub async fn with_budget(mut self, budget: BudgetConfig) -> Result<Self, TierError> {
        if self.budget.is_some() {
            return Err(TierError::Config(
                "the tier has a byte budget already".into(),
            ));
        }
        let prefix = ObjectPath::from(self.namespace.as_str());
        let books = Arc::new(
            ObjectBudget::scan(
                &*self.store,
                &prefix,
                budget.capacity().get(),
                budget.policy(),
                kvtier_entry,
            )
            .await?,
        );
        // Uploads a writer killed mid-way left, once older than the
        // budget's stale_temp_age (a failed listing is logged: the budget
        // holds anyway).
        // guard: O17-a-budget-start-aborts-stale-uploads
        if let Err(error) = self.abort_stale_uploads(budget.sweep_age()).await {
            tracing::warn!(%error, namespace = %self.namespace, "cannot list the multipart uploads");
        }
        if let Some(interval) = budget.rescan_interval() {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return Err(TierError::Config(
                    "rescan_interval needs a tokio runtime to reconcile on".into(),
                ));
            };
            let (books, store) = (Arc::downgrade(&books), self.store.clone());
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    // The tier and its clones are gone: so is the task.
                    let Some(books) = books.upgrade() else { return };
                    if let Err(error) = books.reconcile(&*store, &prefix).await {
                        tracing::warn!(%error, %prefix, "cannot reconcile the budget with the bucket");
                    }
                }
            });
        }
        self.budget = Some(books);
        Ok(self)
    }

    /// Lists the namespace and reconciles the budget with it, now: blocks
    /// other processes or hosts wrote are counted, those they deleted
    /// forgotten, and the least valuable deleted until the books fit the
    /// capacity. An error without a budget, or when the listing fails.
    pub async fn reconcile(&self) -> Result<ReconcileReport, TierError> {
        let Some(budget) = &self.budget else {
            return Err(TierError::Config("the tier has no byte budget".into()));
        };
        let prefix = ObjectPath::from(self.namespace.as_str());
        budget.reconcile(&*self.store, &prefix).await
    }

    /// What the tier's namespace holds now: its block objects and their
    /// bytes, read with one listing (paged by the store) and nothing
    /// deleted. With or without a budget; it includes what other processes
    /// wrote, which a budget's books do not.
    ///
    /// ```
    /// use kvtier::ObjectTier;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let tier = ObjectTier::memory("ns")?;
    /// tier.store(&7u64, vec![0; 84]).await?;
    /// let usage = tier.usage().await?;
    /// assert_eq!((usage.blocks, usage.bytes, usage.trimmed), (1, 100, 0));
    /// # Ok::<(), kvtier::TierError>(())
    /// # }).unwrap();
    /// ```
    pub async fn usage(&self) -> Result<ScanReport, TierError> {
        let prefix = ObjectPath::from(self.namespace.as_str());
        super::object_budget::usage(&*self.store, &prefix, kvtier_entry).await
    }

    /// The byte budget's counters and gauges (`None` without one).
    pub fn capacity_stats(&self) -> Option<CapacityStats> {
        #[cfg(fleet_index)]
        if let Some(index) = &self.index {
            return index.stats(); // the last upkeep's: no request
        }
        self.budget.as_ref().map(|budget| budget.stats())
    }

    /// What the budget's startup scan found (`None` without one).
    pub fn scan_report(&self) -> Option<ScanReport> {
        self.budget.as_ref().map(|budget| budget.report().clone())
    }

    /// Sets the budget to `capacity_bytes` and deletes blocks until the
    /// books fit it (blocks being read or written stay until those end);
    /// returns how many were deleted. An error without a budget.
    pub async fn trim(&self, capacity_bytes: u64) -> Result<usize, TierError> {
        match &self.budget {
            Some(budget) => Ok(budget.trim(&*self.store, capacity_bytes).await),
            None => Err(TierError::Config(
                "the tier has no byte budget (with_capacity)".into(),
            )),
        }
    }

    /// Aborts the unfinished multipart uploads of this tier's blocks (its
    /// layout's names below its namespace) that began at least
    /// `older_than` ago: writers that died mid-upload left them (a live
    /// writer's is younger; this tier writes each block with one `PUT` and
    /// leaves none). Nothing to do off S3. A budget's start does it with
    /// the budget's `stale_temp_age`.
    pub async fn abort_stale_uploads(
        &self,
        older_than: std::time::Duration,
    ) -> Result<StaleUploads, TierError> {
        let Some(uploads) = &self.uploads else {
            return Ok(StaleUploads::default());
        };
        let prefix = format!("{}/", self.prefix);
        abort_stale(uploads, &prefix, older_than, |key| {
            let Some(relative) = key.strip_prefix(&prefix) else {
                return false;
            };
            let mut parts = relative.split('/');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some(fan_out), Some(shard), Some(name), None) => {
                    kvtier_entry(fan_out, shard, name) == super::names::Entry::Block
                }
                _ => false,
            }
        })
        .await
    }
}
