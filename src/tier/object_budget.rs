//! A byte budget over an object tier's blocks: a bucket prefix bounded the
//! way `budget.rs` bounds a directory, with the store's requests awaited.
//!
//! The startup scan lists the prefix (one listing, paged by the store): the
//! newest objects (by their last-modified time) that fit are counted, older
//! ones deleted. A store gets room first, deleting its victims with one
//! `delete` each, outside the ledger's lock; a victim whose deletion fails
//! stays resident. Loads pin; an object found missing or damaged leaves the
//! books (a damaged one is deleted). A store cancelled mid-way (its future
//! dropped) gives back its room and reports its victims as not deleted: the
//! ledger's guards do that on drop.

use std::time::Instant;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::error::{ReconcileReport, ScanReport, TierError};
use super::names::Entry;
use crate::capacity::{
    ADMIT_ROUNDS, CapacityStats, PinGuard, Policy, Rejection, Reserved, SharedLedger, Victims,
    WriteGuard,
};

/// Which names below a prefix are blocks: `(fan_out, shard, name)` →
/// [`Entry`] (kvtier's layout, or vLLM's).
pub(crate) type Classify = fn(&str, &str, &str) -> Entry;

/// The budget of one [`ObjectTier`](crate::ObjectTier) (shared by its
/// clones), or of vLLM's transfers on a bucket.
pub(crate) struct ObjectBudget {
    ledger: SharedLedger<ObjectPath>,
    report: ScanReport,
    classify: Classify,
}

impl std::fmt::Debug for ObjectBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBudget")
            .field("stats", &self.ledger.stats())
            .finish_non_exhaustive()
    }
}

impl ObjectBudget {
    /// Lists the blocks below `prefix` and seeds a ledger of `capacity`
    /// bytes with the newest that fit; deletes the rest. A listing that
    /// fails is an error (the tier cannot know its usage).
    pub(crate) async fn scan(
        store: &dyn ObjectStore,
        prefix: &ObjectPath,
        capacity: u64,
        policy: Policy,
        classify: Classify,
    ) -> Result<Self, TierError> {
        let started = Instant::now();
        let mut found = list_blocks(store, prefix, classify).await?;
        // Newest first: the ledger counts what fits and names the rest.
        // guard: E25-the-object-scan-keeps-the-newest-blocks
        found.sort_unstable_by(|a, b| {
            (b.last_modified.cmp(&a.last_modified)).then_with(|| a.location.cmp(&b.location))
        });
        let found = found.into_iter().map(|meta| (meta.location, meta.size));
        let (ledger, victims) = SharedLedger::seeded(capacity, policy, found);
        let seeded = ledger.stats();
        let mut report = ScanReport {
            blocks: seeded.entries,
            bytes: seeded.resident_bytes,
            ..ScanReport::default()
        };
        report.trimmed = delete_all(store, ledger.victims(victims), Some(&mut report))
            .await
            .0 as u64;
        report.elapsed = started.elapsed();
        Ok(Self {
            ledger,
            report,
            classify,
        })
    }

    /// Lists `prefix` and reconciles the books with it (see
    /// [`CapacityLedger::reconcile`](crate::capacity::CapacityLedger::reconcile)):
    /// the blocks other hosts wrote are counted, those they deleted
    /// forgotten, and the least valuable deleted until the books fit the
    /// capacity. The ledger's lock is held while the listing is merged, not
    /// while the store is listed. A listing that fails changes nothing.
    pub(crate) async fn reconcile(
        &self,
        store: &dyn ObjectStore,
        prefix: &ObjectPath,
    ) -> Result<ReconcileReport, TierError> {
        let started = Instant::now();
        let listing = self.ledger.with(|ledger| ledger.begin_listing());
        let found = match list_blocks(store, prefix, self.classify).await {
            Ok(found) => found,
            Err(error) => {
                self.ledger.with(|ledger| ledger.abandon(listing));
                return Err(error);
            }
        };
        // guard: O8-a-reconcile-adopts-what-other-hosts-wrote
        let done = self.ledger.with(|ledger| {
            ledger.reconcile(
                listing,
                found.into_iter().map(|meta| (meta.location, meta.size)),
            )
        });
        let evicted = delete_all(store, self.ledger.victims(done.victims), None)
            .await
            .0 as u64;
        let report = ReconcileReport {
            adopted: done.adopted,
            forgotten: done.forgotten,
            evicted,
            swept: 0,
            elapsed: started.elapsed(),
        };
        if report.adopted + report.forgotten + report.evicted > 0 {
            tracing::debug!(
                adopted = report.adopted,
                forgotten = report.forgotten,
                evicted = report.evicted,
                %prefix,
                "reconciled the budget with the bucket"
            );
        }
        Ok(report)
    }

    #[cfg_attr(not(fs_tier), allow(dead_code))] // vLLM's transfers' lookups
    /// Starts (or stops) logging which blocks came and went (see
    /// [`CapacityLedger::record_changes`](crate::capacity::CapacityLedger::record_changes)).
    pub(crate) fn record_changes(&self, on: bool) {
        self.ledger.with(|ledger| ledger.record_changes(on));
    }

    /// Moves the changes logged since the last call into `into`, in order.
    #[cfg_attr(not(fs_tier), allow(dead_code))]
    pub(crate) fn take_changes(&self, into: &mut Vec<(ObjectPath, bool)>) {
        self.ledger.with(|ledger| ledger.take_changes(into));
    }

    pub(crate) fn stats(&self) -> CapacityStats {
        self.ledger.stats()
    }

    pub(crate) fn report(&self) -> &ScanReport {
        &self.report
    }

    /// Room for the block at `location` of `bytes`: `Ok(None)` when the
    /// block is resident and its object still there (nothing to write).
    pub(crate) async fn admit(
        &self,
        store: &dyn ObjectStore,
        location: &ObjectPath,
        bytes: u64,
    ) -> Result<Option<WriteGuard<ObjectPath>>, TierError> {
        let refused = |reason| TierError::NoRoom {
            path: location.to_string(),
            bytes,
            capacity: self.ledger.with(|ledger| ledger.capacity()),
            reason,
        };
        for _ in 0..ADMIT_ROUNDS {
            match self
                .ledger
                .reserve(location.clone(), bytes)
                .map_err(refused)?
            {
                Reserved::Write(write) => return Ok(Some(write)),
                Reserved::Present => {
                    // guard: E26-a-resident-object-that-went-is-written-again
                    if super::objects::head(store, location).await? {
                        return Ok(None);
                    }
                    self.ledger.lose(location);
                }
                Reserved::Evict(victims) => {
                    // An unreachable store: the write would fail too, and
                    // another round would only try the next victim.
                    // guard: O20-an-unreachable-store-ends-the-admission
                    if let (_, Some(error)) = delete_all(store, victims, None).await {
                        return Err(error);
                    }
                }
            }
        }
        Err(refused(Rejection::Busy))
    }

    pub(crate) fn pin(&self, location: &ObjectPath) -> Option<PinGuard<ObjectPath>> {
        self.ledger.pin(location)
    }

    pub(crate) fn lose(&self, location: &ObjectPath) {
        self.ledger.lose(location);
    }

    /// Sets the capacity and deletes blocks until the books fit it;
    /// returns how many were deleted.
    pub(crate) async fn trim(&self, store: &dyn ObjectStore, capacity: u64) -> usize {
        let victims = self.ledger.with(|ledger| ledger.set_capacity(capacity));
        delete_all(store, self.ledger.victims(victims), None)
            .await
            .0
    }
}

/// The block objects below `prefix` (one listing, paged by the store).
async fn list_blocks(
    store: &dyn ObjectStore,
    prefix: &ObjectPath,
    classify: Classify,
) -> Result<Vec<ObjectMeta>, TierError> {
    let mut found = Vec::new();
    let mut listing = store.list(Some(prefix));
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|error| super::objects::store_error("list", prefix, error))?;
        if is_block_below(prefix, &meta.location, classify) {
            found.push(meta);
        }
    }
    Ok(found)
}

/// Whether `location` is a block the tier stores below `prefix`:
/// `<prefix>/<xxx>/<yy>/<hex>.bin` as kvtier's layout names it, not any
/// object whose name ends in `.bin`.
pub(crate) fn is_block_below(
    prefix: &ObjectPath,
    location: &ObjectPath,
    classify: Classify,
) -> bool {
    let Some(mut parts) = location.prefix_match(prefix) else {
        return false;
    };
    let (Some(fan_out), Some(shard), Some(name), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    // guard: E35-the-object-scan-counts-only-the-layouts-blocks
    classify(fan_out.as_ref(), shard.as_ref(), name.as_ref()) == Entry::Block
}

/// What `prefix` holds, read with one listing and nothing deleted.
pub(crate) async fn usage(
    store: &dyn ObjectStore,
    prefix: &ObjectPath,
    classify: Classify,
) -> Result<ScanReport, TierError> {
    let started = Instant::now();
    let found = list_blocks(store, prefix, classify).await?;
    Ok(ScanReport {
        blocks: found.len() as u64,
        bytes: found.iter().map(|meta| meta.size).sum(),
        elapsed: started.elapsed(),
        ..ScanReport::default()
    })
}

/// Deletes every victim (a missing object counts as deleted) and reports
/// each; returns how many are gone, and the error that stopped it. A
/// deletion refused for its object alone (permission) is logged, counted
/// and named in `report` when given, and the victim goes to the back of the
/// eviction order; any other failure means the store is not answering: that
/// victim and the rest keep their places and nothing more is tried (an
/// outage must not reorder the blocks' recency). Dropped mid-way, the rest
/// are reported as not deleted.
async fn delete_all(
    store: &dyn ObjectStore,
    mut victims: Victims<ObjectPath>,
    mut report: Option<&mut ScanReport>,
) -> (usize, Option<TierError>) {
    while let Some(location) = victims.next().cloned() {
        match store.delete(&location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => victims.done(true),
            Err(error) => {
                tracing::warn!(%location, %error, "an evicted block could not be deleted");
                if let Some(report) = report.as_deref_mut() {
                    report.failed_to_delete(&location, &error);
                }
                if refused_for_the_object(&error) {
                    victims.done(false);
                } else {
                    victims.defer_rest();
                    return (
                        victims.deleted(),
                        Some(super::objects::store_error("delete", &location, error)),
                    );
                }
            }
        }
    }
    (victims.deleted(), None)
}

/// Whether a failed request was refused for its object (a permission on
/// the key) rather than because the store did not answer as a store.
fn refused_for_the_object(error: &object_store::Error) -> bool {
    matches!(
        error,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Precondition { .. }
    )
}
