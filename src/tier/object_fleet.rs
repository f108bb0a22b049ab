//! The steps of an [`ObjectTier`](super::ObjectTier) whose budget is the
//! fleet's books in Valkey (feature `fleet`; set up in `object_indexed.rs`):
//! stores reserve and commit in the books, loads pin there, and lookups
//! are one round trip per group. docs/design.md, "The fleet's books in
//! Valkey".

use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use super::error::TierError;
use super::fleet::{Admission, FleetBudget};
use super::format::{self, HEADER_LEN};
use super::objects::{put, store_error};
use crate::capacity::CapacityStats;

/// The books a tier and its clones share; its upkeep task stops with the
/// last of them.
#[derive(Debug)]
pub(super) struct TierIndex {
    pub(super) fleet: FleetBudget,
}

impl TierIndex {
    /// The books' figures as the last upkeep read them (no request).
    pub(super) fn stats(&self) -> Option<CapacityStats> {
        Some(self.fleet.last_status()?.capacity_stats())
    }
}

/// One verdict per location from the books, one round trip; hits noted
/// for the next touch.
pub(super) async fn lookup_indexed(
    fleet: &FleetBudget,
    locations: Vec<ObjectPath>,
) -> Result<Vec<bool>, TierError> {
    let verdicts = fleet.lookup(&locations).await?;
    let hits = locations
        .into_iter()
        .zip(&verdicts)
        .filter_map(|(location, hit)| hit.then_some(location));
    fleet.note_hits(hits);
    Ok(verdicts)
}

/// A store through the books: room first (victims deleted), one put, then
/// the commit; a block the books hold is not written again, and a put
/// that fails gives the room back.
pub(super) async fn put_indexed(
    store: &dyn object_store::ObjectStore,
    fleet: &FleetBudget,
    location: &ObjectPath,
    payload: &[u8],
) -> Result<(), TierError> {
    let bytes = (HEADER_LEN + payload.len()) as u64;
    // guard: G25-an-indexed-store-is-admitted-by-the-books
    let write = match fleet.admit(store, location, bytes).await? {
        Admission::Present => return Ok(()),
        Admission::Write(write) => write,
    };
    if let Err(error) = put(store, location, payload).await {
        // The object may have landed (a timeout after the server took it):
        // the room stays held until its lease ends and a sweeper settles it.
        drop(write);
        return Err(error);
    }
    write.commit(store).await
}

/// A load through the books: pinned while it is fetched; a block the books
/// do not hold is absent, and an object found missing or damaged leaves
/// the books.
pub(super) async fn get_indexed(
    store: &dyn object_store::ObjectStore,
    fleet: &FleetBudget,
    location: &ObjectPath,
) -> Result<Option<Vec<u8>>, TierError> {
    let Some(pin) = fleet.pin(location).await? else {
        return Ok(None);
    };
    let fetched = match store.get(location).await {
        Ok(result) => result.bytes().await,
        Err(error) => Err(error),
    };
    let loaded = match fetched {
        Ok(bytes) => match format::decode(&bytes) {
            Ok(_) => Ok(Some(bytes[HEADER_LEN..].to_vec())),
            Err(kind) => {
                let _ = fleet.forget(location).await;
                let _ = store.delete(location).await;
                Err(TierError::Corrupt {
                    location: location.to_string(),
                    kind,
                })
            }
        },
        Err(object_store::Error::NotFound { .. }) => {
            let _ = fleet.forget(location).await;
            Ok(None)
        }
        Err(error) => Err(store_error("get", location, error)),
    };
    let _ = pin.release().await;
    loaded
}
