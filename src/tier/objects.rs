//! One request to an object store, with its error named after the
//! operation and the object.

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::error::TierError;
use super::format;

/// Whether the object is there.
pub(super) async fn head(
    store: &dyn ObjectStore,
    location: &ObjectPath,
) -> Result<bool, TierError> {
    match store.head(location).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(error) => Err(store_error("head", location, error)),
    }
}

/// Writes the block's stored form (header and payload).
pub(super) async fn put(
    store: &dyn ObjectStore,
    location: &ObjectPath,
    payload: &[u8],
) -> Result<(), TierError> {
    store
        .put(location, format::encode(payload).into())
        .await
        .map(drop)
        .map_err(|error| store_error("put", location, error))
}

/// A store's error as the tier's, naming the operation and the object.
pub(super) fn store_error(
    op: &'static str,
    location: &ObjectPath,
    error: object_store::Error,
) -> TierError {
    TierError::Store {
        op,
        location: location.to_string(),
        source: Box::new(error),
    }
}
