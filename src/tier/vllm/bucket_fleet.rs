//! A bucket's stores, loads and lookups through the fleet's books in
//! Valkey (feature `fleet`). docs/design.md, "The fleet's books in Valkey".

use object_store::ObjectStoreExt;

use super::blocks::Stored;
use super::bucket::VllmObjectLayout;
use crate::tier::error::TierError;
use crate::tier::fleet::{Admission, FleetBudget};

impl VllmObjectLayout {
    /// Answers lookups from the fleet's books (one round trip per group)
    /// instead of one `HEAD` per key.
    pub fn with_index(mut self, index: FleetBudget) -> Self {
        self.index = Some(index);
        self
    }

    /// Stores `block` through the fleet's books: room first (victims
    /// deleted), then one put, then the commit; a block the books hold is
    /// not written again, and a put that fails gives the room back.
    pub(super) async fn store_indexed(
        &self,
        key: &[u8],
        block: &[u8],
        fleet: &FleetBudget,
    ) -> Result<Stored, TierError> {
        let location = self.location_of(key)?;
        let write = match fleet
            .admit(&**self.store(), &location, block.len() as u64)
            .await?
        {
            Admission::Present => return Ok(Stored::Present),
            Admission::Write(write) => write,
        };
        let put = {
            let _permit = self.permit().await;
            self.store().put(&location, block.to_vec().into()).await
        };
        if let Err(error) = put {
            // The object may have landed (a timeout after the server took
            // it): the room stays held until a sweeper settles it.
            drop(write);
            return Err(crate::tier::objects::store_error("put", &location, error));
        }
        write.commit(&**self.store()).await?;
        Ok(Stored::Written)
    }

    /// Loads the block named by `key` through the fleet's books: pinned
    /// while it is fetched (a block the books do not hold is a failed
    /// load); an object found missing leaves the books.
    pub(super) async fn load_indexed(
        &self,
        key: &[u8],
        into: &mut [u8],
        fleet: &FleetBudget,
    ) -> Result<(), TierError> {
        let location = self.location_of(key)?;
        let Some(pin) = fleet.pin(&location).await? else {
            return Err(TierError::Index {
                op: "pin",
                detail: format!("{location} is not in the fleet's books"),
            });
        };
        let loaded = self.load_object(&location, into).await;
        if let Err(TierError::Store { source, .. }) = &loaded
            && source
                .downcast_ref::<object_store::Error>()
                .is_some_and(|error| matches!(error, object_store::Error::NotFound { .. }))
        {
            let _ = fleet.forget(&location).await;
        }
        let _ = pin.release().await;
        loaded
    }

    /// One verdict per key from the fleet's books, one round trip; a key
    /// that names no block misses alone. Hits are touched in a batch.
    pub(super) async fn lookup_indexed<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        fleet: &FleetBudget,
    ) -> Result<Vec<bool>, TierError> {
        let mut answers = vec![false; keys.len()];
        let mut asked = Vec::with_capacity(keys.len());
        let mut locations = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            if let Ok(location) = self.location_of(key.as_ref()) {
                asked.push(i);
                locations.push(location);
            }
        }
        if locations.is_empty() {
            return Ok(answers);
        }
        let verdicts = fleet.lookup(&locations).await?;
        let mut hits = Vec::new();
        for ((i, location), hit) in asked.into_iter().zip(locations).zip(verdicts) {
            answers[i] = hit;
            if hit {
                hits.push(location);
            }
        }
        fleet.note_hits(hits);
        Ok(answers)
    }
}
