//! A host's upkeep of the fleet's books: leases renewed, hits touched,
//! expired entries settled, lost books rebuilt from a listing.

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;

use super::budget::{FleetBudget, delete_objects, index_error, random_bits};
use super::ops::{HeldKind, Op, Reply};
use crate::tier::error::TierError;

/// Blocks per `rebuild_add` call.
const REBUILD_BATCH: usize = 512;
/// Expired entries one sweep claims.
const SWEEP_BATCH: u64 = 64;

impl FleetBudget {
    /// The periodic work, every third of a lease: attaches (rebuilding
    /// lost books from a listing of `prefix`, `classify` choosing the
    /// layout's blocks), renews this host's leases, touches the hits noted
    /// since the last call, and settles expired entries (deletes their
    /// objects, releases them). Returns what it did.
    pub async fn maintain(
        &self,
        store: &dyn ObjectStore,
        prefix: &ObjectPath,
        classify: impl Fn(&ObjectPath) -> bool,
    ) -> Result<Maintained, TierError> {
        let mut done = Maintained::default();
        // The books' state first, every round: a restart or a flush since
        // the last one shows here, before any step is taken on them.
        self.attach().await?;
        if self.epoch().is_none() {
            done.rebuilt = self.rebuild(store, prefix, &classify).await?;
            if !done.rebuilt {
                return Ok(done);
            }
        }
        let keys: Vec<String> = self.inner.host.held_keys();
        if !keys.is_empty() {
            let op = Op::Renew {
                token: self.inner.token.clone(),
                lease_ms: self.lease_ms(),
                keys,
            };
            if let Reply::Renewed(n) = self.step(&op).await? {
                done.renewed = n;
            }
        }
        let touches = self.inner.host.take_touches();
        if !touches.is_empty()
            && let Reply::Touched(n) = self.step(&Op::Touch { keys: touches }).await?
        {
            done.touched = n;
        }
        let op = Op::ClaimExpired {
            token: self.inner.token.clone(),
            lease_ms: self.lease_ms(),
            limit: SWEEP_BATCH,
        };
        let epoch = self.epoch();
        if let Reply::Claimed(claimed) = self.step(&op).await? {
            let keys: Vec<String> = claimed.iter().map(|(key, _, _)| key.clone()).collect();
            for key in &keys {
                self.hold(key);
            }
            let deleted = self.delete_in_epoch(store, &keys, &epoch).await;
            done.settled = deleted.len() as u64;
            // Expired evictions' blocks were committed: now gone. Expired
            // reservations' never were.
            let evicted: Vec<String> = claimed
                .iter()
                .filter(|(key, kind, _)| *kind == HeldKind::Evicting && deleted.contains(key))
                .map(|(key, _, _)| key.clone())
                .collect();
            self.note_gone(&evicted);
            done.claimed_reservations = claimed
                .iter()
                .filter(|(_, kind, _)| *kind == HeldKind::Reserved)
                .count() as u64;
            self.release(&deleted).await?;
        }
        // The figures read every step come from here (`last_status`).
        self.attach().await?;
        Ok(done)
    }

    /// Deletes the orphans below `prefix`: block objects (`classify`) the
    /// books neither commit nor hold, last modified more than `older_than`
    /// ago (a write still between its put and its commit is younger). They
    /// are writes whose books were lost after the rebuild's listing, and
    /// writers that died between a put and a refused commit. Returns how
    /// many were deleted; nothing while the books are not ready.
    pub async fn sweep_orphans(
        &self,
        store: &dyn ObjectStore,
        prefix: &ObjectPath,
        classify: impl Fn(&ObjectPath) -> bool,
        older_than: std::time::Duration,
    ) -> Result<u64, TierError> {
        use futures_util::StreamExt;
        if self.epoch().is_none() {
            return Ok(0);
        }
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let mut old = Vec::new();
        let mut listing = store.list(Some(prefix));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|error| TierError::Store {
                op: "list",
                location: prefix.to_string(),
                source: Box::new(error),
            })?;
            // guard: G20-only-old-orphans-are-swept
            if classify(&meta.location) && meta.last_modified < cutoff {
                old.push(meta.location.to_string());
            }
        }
        let mut deleted = 0;
        for batch in old.chunks(REBUILD_BATCH) {
            let keys = batch.to_vec();
            let Reply::Verdicts(orphans) = self.step(&Op::Unlisted { keys: keys.clone() }).await?
            else {
                continue;
            };
            let orphans: Vec<String> = keys
                .into_iter()
                .zip(orphans)
                .filter_map(|(key, orphan)| orphan.then_some(key))
                .collect();
            deleted += delete_objects(store, &orphans).await.len() as u64;
        }
        Ok(deleted)
    }

    /// Rebuilds lost books from a listing if this host gets the lock:
    /// blocks oldest first, those that do not fit deleted. False when
    /// another host rebuilds (or the books are ready again).
    async fn rebuild(
        &self,
        store: &dyn ObjectStore,
        prefix: &ObjectPath,
        classify: &impl Fn(&ObjectPath) -> bool,
    ) -> Result<bool, TierError> {
        let epoch = format!("e{:016x}", random_bits());
        let holder = self.inner.token.clone();
        let begin = Op::BeginRebuild {
            holder: holder.clone(),
            // The lock outlives a listing of a large prefix; a holder that
            // dies holds the fleet's stores off for this long.
            lease_ms: self.lease_ms().saturating_mul(4),
            epoch: epoch.clone(),
            capacity: self.inner.capacity,
        };
        let reply = self
            .inner
            .books
            .call("", &begin)
            .await
            .map_err(|error| index_error("begin_rebuild", error))?;
        match reply {
            Reply::Rebuild(_) => {}
            Reply::Ready(epoch) => {
                self.adopt(Some(epoch));
                return Ok(false);
            }
            _ => return Ok(false),
        }
        let mut found = Vec::new();
        let mut listing = store.list(Some(prefix));
        use futures_util::StreamExt;
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|error| TierError::Store {
                op: "list",
                location: prefix.to_string(),
                source: Box::new(error),
            })?;
            if classify(&meta.location) {
                found.push(meta);
            }
        }
        // Oldest first: the newest end up the most recent.
        found.sort_by(|a, b| (a.last_modified, &a.location).cmp(&(b.last_modified, &b.location)));
        let mut left = Vec::new();
        for batch in found.chunks(REBUILD_BATCH) {
            let op = Op::RebuildAdd {
                holder: holder.clone(),
                blocks: batch
                    .iter()
                    .map(|meta| (meta.location.to_string(), meta.size))
                    .collect(),
            };
            match self.inner.books.call(&epoch, &op).await {
                Ok(Reply::Added(rest)) => left.extend(rest),
                Ok(_) => return Ok(false),
                Err(error) => return Err(index_error("rebuild_add", error)),
            }
        }
        // What did not fit goes before the books open.
        delete_objects(store, &left).await;
        let end = Op::RebuildEnd { holder };
        match self.inner.books.call(&epoch, &end).await {
            Ok(Reply::Ready(epoch)) => {
                self.adopt(Some(epoch));
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(error) => Err(index_error("rebuild_end", error)),
        }
    }
}

/// What one [`FleetBudget::maintain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Maintained {
    /// This host rebuilt lost books.
    pub rebuilt: bool,
    /// Leases renewed.
    pub renewed: u64,
    /// Committed blocks touched.
    pub touched: u64,
    /// Expired entries whose objects were deleted and released.
    pub settled: u64,
    /// Of those, reservations (a writer died or stalled).
    pub claimed_reservations: u64,
}
