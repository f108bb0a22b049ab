//! vLLM's layout in an object store: the blocks of one rank below a bucket
//! prefix, named as vLLM's object-store tier names them, in vLLM's raw
//! format (exactly the block's bytes, no header), so vLLM's obj tier and
//! kvtier read each other's objects.
//!
//! vLLM's obj tier names a block
//! `{prefix}//{model}_{cfghash}_r0/{hex[0:3]}/{hex[3:5]}_g{group}/{hex}.bin`:
//! its `FileMapper` joins the root `prefix + "/"` and the base with another
//! `/`, so the key holds an empty segment after the prefix (or starts with
//! `/` when the prefix is empty). The `object_store` client kvtier uses
//! cannot address an empty segment (its paths drop them), so kvtier names
//! the same block `{prefix}/{model}_{cfghash}_r0/…`: the same name with the
//! empty segment left out (see docs/design.md, "vLLM's object keys").
//!
//! A lookup is one `HEAD` per key, a group's keys concurrently; a store
//! `HEAD`s first and `PUT`s only a block that is not there whole (objects
//! appear whole, so nothing partial is ever visible); a load `GET`s the
//! object straight into the primary region and refuses one that is not
//! exactly one block long (and deletes it: every block of a rank prefix has
//! one size, so another length can only be damage).

use futures_util::StreamExt;
use futures_util::stream;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::super::key::check_namespace;
use super::super::objects::store_error;
use super::super::s3::S3Options;
use super::super::s3::uploads::{StaleUploads, Uploads, abort_stale};
use super::blocks::Stored;
use super::layout::{block_key, push_vllm_path, vllm_entry};
use crate::capacity::Policy;
use crate::tier::error::ScanReport;
use std::time::Duration;

use super::bucket_budget::BucketBudget;
use crate::settings::{ObjectTarget, ReachFault, SettingError};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::task::{Semaphore, SemaphorePermit};
use crate::tier::error::TierError;
use crate::tier::format::Corruption;
use crate::tier::object_budget::ObjectBudget;

/// How many `HEAD` requests one lookup group keeps in flight.
const HEADS_IN_FLIGHT: usize = 32;

/// Requests in flight at once over all groups by default.
const DEFAULT_IN_FLIGHT: usize = 64;

/// The blocks vLLM's layout keeps for one rank below a bucket prefix.
///
/// ```
/// use kvtier::tier::VllmObjectLayout;
///
/// let layout = VllmObjectLayout::memory("kv/llama_0123456789ab_r0")?;
/// // Block hash 0xabcdef01, KV-cache group 2.
/// let key = [0xab, 0xcd, 0xef, 0x01, 0, 0, 0, 2];
/// assert_eq!(
///     layout.location_of(&key)?.as_ref(),
///     "kv/llama_0123456789ab_r0/abc/de_g2/abcdef01.bin"
/// );
/// # Ok::<(), kvtier::TierError>(())
/// ```
///
/// As an [`AsyncBackend`](crate::lookup::AsyncBackend) it answers a group
/// with concurrent `HEAD`s (at most 32 per group, and at most the layout's
/// bound on requests in flight over every group): "not found" is a miss,
/// a key that cannot name a block is a miss on its own, any other error
/// fails the group (its keys become misses, and the prober counts it).
#[derive(Clone, Debug)]
pub struct VllmObjectLayout {
    store: Arc<dyn ObjectStore>,
    /// `<prefix>/<model>_<cfghash>_r<rank>`, without a trailing `/`.
    rank_prefix: String,
    requests: Arc<Semaphore>,
    counters: Arc<Counters>,
    /// Multipart uploads' requests (on S3 only).
    uploads: Option<Arc<Uploads>>,
    /// The fleet's books, which answer the lookups instead of `HEAD`s.
    #[cfg(fleet_index)]
    pub(super) index: Option<crate::tier::fleet::FleetBudget>,
    /// What the layout's own books run on (`with_own_index`), kept alive.
    #[cfg(fleet_index)]
    pub(super) own_books: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

#[derive(Debug, Default)]
struct Counters {
    heads: AtomicU64,
    head_errors: AtomicU64,
}

/// Counters of a [`VllmObjectLayout`]'s lookups (shared by its clones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VllmObjectStats {
    /// `HEAD` requests the lookups sent (one per key probed).
    pub heads: u64,
    /// Those that failed with anything but "not found" (each failed its
    /// group).
    pub head_errors: u64,
}

impl VllmObjectLayout {
    /// The layout below `rank_prefix` (`<prefix>/<model>_<cfghash>_r<rank>`,
    /// segments without `.`, `..` or empty ones) of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, rank_prefix: &str) -> Result<Self, TierError> {
        check_namespace(rank_prefix).map_err(TierError::Namespace)?;
        Ok(Self {
            store,
            rank_prefix: ObjectPath::from(rank_prefix).as_ref().to_owned(),
            requests: Arc::new(Semaphore::new(DEFAULT_IN_FLIGHT)),
            counters: Arc::default(),
            uploads: None,
            #[cfg(fleet_index)]
            index: None,
            #[cfg(fleet_index)]
            own_books: None,
        })
    }

    /// The layout below `rank_prefix` of the bucket `options` reach.
    pub fn s3(options: &S3Options, rank_prefix: &str) -> Result<Self, TierError> {
        let mut layout = Self::new(Arc::new(options.build()?), rank_prefix)?;
        layout.uploads = Some(Arc::new(options.uploads()?));
        Ok(layout)
    }

    /// Aborts the unfinished multipart uploads of this layout's blocks that
    /// began at least `older_than` ago (a writer that died mid-upload left
    /// them; a live writer's is younger). Nothing to do off S3.
    pub async fn abort_stale_uploads(
        &self,
        older_than: Duration,
    ) -> Result<StaleUploads, TierError> {
        let Some(uploads) = &self.uploads else {
            return Ok(StaleUploads::default());
        };
        // The raw prefix: vLLM's obj tier's keys have an empty segment
        // before the model's directory, which a listing below
        // `<prefix>/<model…>` would miss, so everything below the prefix's
        // first segment is listed and each key judged by its name.
        let first = self.rank_prefix.split('/').next().unwrap_or_default();
        abort_stale(uploads, first, older_than, |key| {
            let Some(relative) = key
                .strip_prefix(&self.rank_prefix)
                .and_then(|rest| rest.strip_prefix('/'))
            else {
                return false;
            };
            let mut parts = relative.split('/');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some(fan_out), Some(shard), Some(name), None) => {
                    block_key(fan_out, shard, name).is_some()
                }
                _ => false,
            }
        })
        .await
    }

    /// The layout in memory (for tests and examples).
    pub fn memory(rank_prefix: &str) -> Result<Self, TierError> {
        Self::new(Arc::new(InMemory::new()), rank_prefix)
    }

    /// Bounds the requests in flight at once over every group of this
    /// layout and its clones: 1 to 65,536 (default 64).
    pub fn with_max_in_flight(mut self, requests: usize) -> Result<Self, TierError> {
        if !(1..=1 << 16).contains(&requests) {
            return Err(TierError::Config(format!(
                "max_in_flight is {requests}; it must be 1 to 65536"
            )));
        }
        self.requests = Arc::new(Semaphore::new(requests));
        Ok(self)
    }

    /// The lookups' counters.
    pub fn stats(&self) -> VllmObjectStats {
        VllmObjectStats {
            heads: self.counters.heads.load(Ordering::Relaxed),
            head_errors: self.counters.head_errors.load(Ordering::Relaxed),
        }
    }

    /// The rank's prefix.
    pub fn rank_prefix(&self) -> &str {
        &self.rank_prefix
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Where the block named by `key` is (whether or not it exists). A key
    /// of fewer than five bytes holds no hash and is refused.
    pub fn location_of(&self, key: &[u8]) -> Result<ObjectPath, TierError> {
        let mut name = String::with_capacity(self.rank_prefix.len() + 2 * key.len() + 24);
        name.push_str(&self.rank_prefix);
        name.push('/');
        push_vllm_path(key, &mut name)?;
        // Every segment is hex, `_g` and digits, or the checked prefix.
        Ok(ObjectPath::from(name.as_str()))
    }

    /// The key whose block is stored at `location`, the inverse of
    /// [`location_of`](Self::location_of): `None` for any other object.
    pub fn key_of(&self, location: &ObjectPath) -> Option<Vec<u8>> {
        let relative = location
            .as_ref()
            .strip_prefix(&self.rank_prefix)?
            .strip_prefix('/')?;
        let mut parts = relative.split('/');
        let (fan_out, shard, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        block_key(fan_out, shard, name)
    }

    /// What the rank prefix holds now: its block objects (vLLM's names
    /// only) and their bytes, with one listing and nothing deleted.
    pub async fn usage(&self) -> Result<ScanReport, TierError> {
        let prefix = ObjectPath::from(self.rank_prefix.as_str());
        crate::tier::object_budget::usage(&*self.store, &prefix, vllm_entry).await
    }

    /// Lists the rank prefix and deletes the oldest blocks (by last
    /// modified) until the newest that fit `capacity` bytes remain, as a
    /// budget's start does; only vLLM's block names are counted or
    /// deleted. Returns what was kept and deleted.
    pub async fn trim_to(&self, capacity: u64, policy: Policy) -> Result<ScanReport, TierError> {
        let prefix = ObjectPath::from(self.rank_prefix.as_str());
        let budget =
            ObjectBudget::scan(&*self.store, &prefix, capacity, policy, vllm_entry).await?;
        Ok(budget.report().clone())
    }

    /// Checks that the store answers, takes the credentials and has the
    /// bucket: lists the rank prefix (one request, at most one page). A
    /// `HEAD` alone cannot tell a missing bucket from a missing block.
    pub async fn check_reachable(&self) -> Result<(), TierError> {
        let prefix = ObjectPath::from(self.rank_prefix.as_str());
        let _permit = self.permit().await;
        self.store
            .list_with_delimiter(Some(&prefix))
            .await
            .map(drop)
            .map_err(|error| store_error("list", &prefix, error))
    }

    /// The layout below `rank_prefix` of `target`'s bucket, once one
    /// listing showed that the server answers, takes the credentials and
    /// has the bucket; otherwise the error names the setting to fix (see
    /// [`ObjectTarget::unreachable`]). Waits at most the request timeout
    /// times the tries, and a second; blocking, so it refuses to run on a
    /// tokio runtime's thread (call it from `spawn_blocking` there).
    pub fn open_checked(target: &ObjectTarget, rank_prefix: &str) -> Result<Self, SettingError> {
        let layout = Self::s3(target.options(), rank_prefix)
            .map_err(|error| target.unreachable(ReachFault::of(&error), error))?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SettingError::new(
                "open_checked",
                "is called on a tokio runtime's thread; it blocks, so call it from spawn_blocking",
            ));
        }
        let options = target.options();
        let limit = options.get_request_timeout().saturating_mul(
            u32::try_from(options.get_max_retries())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        ) + Duration::from_secs(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| target.unreachable(ReachFault::Endpoint, error))?;
        // The timer is made inside the runtime: it needs its clock.
        let checked =
            runtime.block_on(async { tokio::time::timeout(limit, layout.check_reachable()).await });
        match checked {
            Ok(Ok(())) => Ok(layout),
            Ok(Err(error)) => Err(target.unreachable(ReachFault::of(&error), error)),
            Err(_) => {
                Err(target.unreachable(ReachFault::Endpoint, format!("no answer within {limit:?}")))
            }
        }
    }

    /// A slot for one request; `None` only if the semaphore were closed,
    /// which this layout never does.
    pub(super) async fn permit(&self) -> Option<SemaphorePermit<'_>> {
        self.requests.acquire().await.ok()
    }

    /// Whether the block named by `key` is stored.
    pub async fn contains(&self, key: &[u8]) -> Result<bool, TierError> {
        let Ok(location) = self.location_of(key) else {
            return Ok(false);
        };
        let _permit = self.permit().await;
        head(&*self.store, &location).await
    }

    /// Stores `block` under `key` unless an object of exactly its length is
    /// there already (anything else there is replaced). The object appears
    /// whole or not at all. With a budget, the store gets room first
    /// (evicting by the budget's policy) and the room is committed once
    /// the object is written.
    pub(crate) async fn store_block(
        &self,
        key: &[u8],
        block: &[u8],
        budget: Option<BucketBudget<'_>>,
    ) -> Result<Stored, TierError> {
        let budget = match budget {
            None => None,
            Some(BucketBudget::Ledger(ledger)) => Some(ledger),
            #[cfg(fleet_index)]
            Some(BucketBudget::Fleet(fleet)) => return self.store_indexed(key, block, fleet).await,
        };
        let location = self.location_of(key)?;
        // guard: O9-bucket-stores-get-room-before-they-write
        let room = match budget {
            None => None,
            Some(budget) => match budget
                .admit(&*self.store, &location, block.len() as u64)
                .await?
            {
                // Resident, and its object still there.
                None => return Ok(Stored::Present),
                Some(room) => Some(room),
            },
        };
        let _permit = self.permit().await;
        if room.is_none() {
            match self.store.head(&location).await {
                // guard: O1-a-present-object-is-not-written-again
                Ok(meta) if meta.size == block.len() as u64 => return Ok(Stored::Present),
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(store_error("head", &location, error)),
            }
        }
        self.store
            .put(&location, block.to_vec().into())
            .await
            .map_err(|error| store_error("put", &location, error))?;
        if let Some(room) = room {
            room.commit();
        }
        Ok(Stored::Written)
    }

    /// Loads the block named by `key` into `into`, which is exactly one
    /// block long, chunk by chunk as the object arrives. An object of
    /// another length is refused and deleted (see the module docs). With a
    /// budget the block is pinned while it loads, and a block that failed
    /// to load leaves the books.
    pub(crate) async fn load_block(
        &self,
        key: &[u8],
        into: &mut [u8],
        budget: Option<BucketBudget<'_>>,
    ) -> Result<(), TierError> {
        let budget = match budget {
            None => None,
            Some(BucketBudget::Ledger(ledger)) => Some(ledger),
            #[cfg(fleet_index)]
            Some(BucketBudget::Fleet(fleet)) => return self.load_indexed(key, into, fleet).await,
        };
        let location = self.location_of(key)?;
        let pin = budget.and_then(|budget| budget.pin(&location));
        let loaded = self.load_object(&location, into).await;
        if let (Err(_), Some(budget)) = (&loaded, budget) {
            budget.lose(&location);
        }
        drop(pin);
        loaded
    }

    pub(super) async fn load_object(
        &self,
        location: &ObjectPath,
        into: &mut [u8],
    ) -> Result<(), TierError> {
        let _permit = self.permit().await;
        let got = self
            .store
            .get(location)
            .await
            .map_err(|error| store_error("get", location, error))?;
        let expected = into.len() as u64;
        let corrupt = |found| TierError::Corrupt {
            location: location.to_string(),
            kind: Corruption::BlockSize { expected, found },
        };
        // guard: O2-a-load-refuses-an-object-of-another-length
        if got.meta.size != expected {
            let found = got.meta.size;
            drop(got);
            self.delete_damaged(location).await;
            return Err(corrupt(found));
        }
        let mut chunks = got.into_stream();
        let mut filled = 0usize;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|error| store_error("get", location, error))?;
            let end = filled + chunk.len();
            // A server that sends more than it announced is damage too.
            let Some(slot) = into.get_mut(filled..end) else {
                return Err(corrupt(end as u64));
            };
            slot.copy_from_slice(&chunk);
            filled = end;
        }
        if filled != into.len() {
            return Err(corrupt(filled as u64));
        }
        Ok(())
    }

    async fn delete_damaged(&self, location: &ObjectPath) {
        match self.store.delete(location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => {
                tracing::warn!(%location, %error, "cannot delete a damaged block object");
            }
        }
    }
}

/// Whether the object is there.
async fn head(store: &dyn ObjectStore, location: &ObjectPath) -> Result<bool, TierError> {
    match store.head(location).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(error) => Err(store_error("head", location, error)),
    }
}

impl<K, R> crate::lookup::AsyncBackend<K, R> for VllmObjectLayout
where
    K: AsRef<[u8]> + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        #[cfg(fleet_index)]
        if let Some(index) = &self.index {
            return self.lookup_indexed(keys, index).await;
        }
        // Up to HEADS_IN_FLIGHT heads at once, polled inside this group's
        // future (no task per key), each under a request slot.
        let store = &*self.store;
        let mut heads = stream::iter(0..keys.len())
            .map(|i| {
                // guard: O3-a-bad-key-misses-alone
                let location = self.location_of(keys[i].as_ref()).ok();
                async move {
                    let Some(location) = location else {
                        return (i, Ok(false));
                    };
                    let _permit = self.permit().await;
                    self.counters.heads.fetch_add(1, Ordering::Relaxed);
                    (i, head(store, &location).await)
                }
            })
            .buffer_unordered(HEADS_IN_FLIGHT);
        let mut answers = vec![false; keys.len()];
        while let Some((i, answer)) = heads.next().await {
            match answer {
                Ok(found) => answers[i] = found,
                // An error other than "not found" fails the group (its keys
                // become misses, counted by the prober), and the heads
                // still running are dropped: an outage costs one failed
                // request per group, not one per key.
                Err(error) => {
                    self.counters.head_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(error);
                }
            }
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(hash: &[u8], group: u32) -> Vec<u8> {
        let mut key = hash.to_vec();
        key.extend_from_slice(&group.to_be_bytes());
        key
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn a_block_round_trips_and_is_written_once() {
        let layout = VllmObjectLayout::memory("kv/m_0123_r0").expect("layout");
        let key = key(&[0xab, 0xcd, 0xef], 1);
        runtime().block_on(async {
            assert!(!layout.contains(&key).await.unwrap());
            assert_eq!(
                layout.store_block(&key, b"12345678", None).await.unwrap(),
                Stored::Written
            );
            assert_eq!(
                layout.store_block(&key, b"xxxxxxxx", None).await.unwrap(),
                Stored::Present
            );
            let mut block = [0u8; 8];
            layout.load_block(&key, &mut block, None).await.unwrap();
            assert_eq!(&block, b"12345678", "raw bytes, the first store kept");
            let raw = layout
                .store
                .get(&layout.location_of(&key).unwrap())
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(&raw[..], b"12345678", "no header");
        });
    }

    #[test]
    fn an_object_of_another_length_is_refused_deleted_and_rewritten() {
        let layout = VllmObjectLayout::memory("kv/m_0123_r0").expect("layout");
        let key = key(&[0xab, 0xcd, 0xef], 0);
        let location = layout.location_of(&key).unwrap();
        runtime().block_on(async {
            layout
                .store
                .put(&location, b"1234".to_vec().into())
                .await
                .unwrap();
            let mut block = [0u8; 8];
            let error = layout.load_block(&key, &mut block, None).await.unwrap_err();
            assert!(matches!(
                error,
                TierError::Corrupt {
                    kind: Corruption::BlockSize {
                        expected: 8,
                        found: 4
                    },
                    ..
                }
            ));
            assert!(!layout.contains(&key).await.unwrap(), "deleted");
            layout
                .store
                .put(&location, b"1234".to_vec().into())
                .await
                .unwrap();
            assert_eq!(
                layout.store_block(&key, b"12345678", None).await.unwrap(),
                Stored::Written,
                "a wrong-sized object is replaced by a store"
            );
        });
    }

    #[test]
    fn lookups_answer_in_order_and_a_bad_key_misses_alone() {
        use crate::lookup::AsyncBackend;
        let layout = VllmObjectLayout::memory("kv/m_0123_r0").expect("layout");
        let keys: Vec<Vec<u8>> = (0u8..40).map(|i| key(&[i, 7, 9], 0)).collect();
        runtime().block_on(async {
            for stored in keys.iter().step_by(3) {
                layout.store_block(stored, b"x", None).await.unwrap();
            }
            let mut probe = keys.clone();
            probe.push(vec![1, 2]); // too short to hold a hash
            let answers = AsyncBackend::batch_lookup(&layout, &probe, &())
                .await
                .unwrap();
            let expected: Vec<bool> = (0..40).map(|i| i % 3 == 0).chain([false]).collect();
            assert_eq!(answers, expected);
        });
    }

    #[test]
    fn a_bad_prefix_is_refused() {
        for bad in ["", "a//b", "a/../b", "/a"] {
            assert!(VllmObjectLayout::memory(bad).is_err(), "{bad:?}");
        }
    }
}
