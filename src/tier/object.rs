//! A block tier on any `object_store` backend: S3 and S3-compatible servers,
//! a local directory, or memory.

use futures_util::stream::{self, StreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::error::TierError;
use super::format::{self, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use super::object_budget::ObjectBudget;
use super::objects::{head, put, store_error};
use super::s3::S3Options;
use super::s3::uploads::Uploads;
use super::save::{SaveTask, finish};
use crate::lookup::AsyncBackend;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::task::{Semaphore, SemaphorePermit};

/// Counters of an [`ObjectTier`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectTierStats {
    /// `head` requests answered (found or not found).
    pub lookups: u64,
    /// `head` requests that failed with anything but "not found"; each
    /// failed its group (every key of it a miss).
    pub lookup_errors: u64,
}

/// A block tier on an [`ObjectStore`]: existence by `head`, save by `put`
/// (objects appear whole, so no temporary names are needed), load by `get`
/// with the same checked block format as [`FsTier`](crate::FsTier).
///
/// As an [`AsyncBackend`] it answers a group with concurrent `head`
/// requests: "not found" is a miss; any other error fails the group, as an
/// I/O error does on [`FsTier`](crate::FsTier): its keys become misses, the
/// prober logs it and counts it in
/// [`LookupStats::backend_errors`](crate::lookup::LookupStats::backend_errors),
/// and the failed head is counted in [`stats`](Self::stats). A tier that
/// cannot be reached never holds up the scheduler beyond the prober's group
/// timeout.
///
/// ```
/// use kvtier::ObjectTier;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let tier = ObjectTier::memory("model-a/rank0")?;
/// assert!(!tier.contains(&7u64).await?);
/// tier.store(&7u64, b"kv block".to_vec()).await?;
/// assert!(tier.contains(&7u64).await?);
/// assert_eq!(tier.load(&7u64).await?.as_deref(), Some(&b"kv block"[..]));
/// # Ok::<(), kvtier::TierError>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct ObjectTier {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) namespace: String,
    /// The namespace as a location (percent-encoded where it must be).
    pub(super) prefix: String,
    counters: Arc<Counters>,
    /// One permit per request in flight, shared by every group, save and
    /// load of this tier (and its clones): many groups probed at once must
    /// not multiply into more requests than the store can take.
    requests: Arc<Semaphore>,
    max_in_flight: usize,
    /// The byte budget, once [`with_capacity`](Self::with_capacity) set one.
    pub(super) budget: Option<Arc<ObjectBudget>>,
    /// Multipart uploads' requests (on S3 only).
    pub(super) uploads: Option<Arc<Uploads>>,
    /// The fleet's books, once [`with_index`](Self::with_index) set them.
    #[cfg(fleet_index)]
    pub(super) index: Option<Arc<super::object_fleet::TierIndex>>,
}

#[derive(Debug, Default)]
struct Counters {
    lookups: AtomicU64,
    lookup_errors: AtomicU64,
    /// Saves started, for their ids.
    saves: AtomicU64,
}

/// How many `head` requests one group keeps in flight.
const HEADS_IN_FLIGHT: usize = 32;

/// Requests a tier keeps in flight at once by default, over all groups.
pub(crate) const DEFAULT_IN_FLIGHT: usize = 64;

/// The largest bound on requests in flight [`ObjectTier::with_max_in_flight`] takes.
const MAX_IN_FLIGHT: usize = 1 << 16;

impl ObjectTier {
    /// A tier on `store`, below `namespace`.
    pub fn new(store: Arc<dyn ObjectStore>, namespace: &str) -> Result<Self, TierError> {
        check_namespace(namespace).map_err(TierError::Namespace)?;
        Ok(Self {
            store,
            namespace: namespace.to_owned(),
            prefix: ObjectPath::from(namespace).as_ref().to_owned(),
            counters: Default::default(),
            requests: Arc::new(Semaphore::new(DEFAULT_IN_FLIGHT)),
            max_in_flight: DEFAULT_IN_FLIGHT,
            budget: None,
            uploads: None,
            #[cfg(fleet_index)]
            index: None,
        })
    }

    /// Bounds the requests this tier (with all its clones) has in flight at
    /// once, over every lookup group, save and load: 1 to 65536. Default 64.
    /// A driver probing many groups at once then queues their requests here
    /// instead of sending them all to the store.
    ///
    /// ```
    /// use kvtier::ObjectTier;
    ///
    /// let tier = ObjectTier::memory("ns")?.with_max_in_flight(8)?;
    /// assert_eq!(tier.max_in_flight(), 8);
    /// assert!(ObjectTier::memory("ns")?.with_max_in_flight(0).is_err());
    /// # Ok::<(), kvtier::TierError>(())
    /// ```
    pub fn with_max_in_flight(mut self, requests: usize) -> Result<Self, TierError> {
        if !(1..=MAX_IN_FLIGHT).contains(&requests) {
            return Err(TierError::Config(format!(
                "max_in_flight is {requests}; it must be 1 to {MAX_IN_FLIGHT}"
            )));
        }
        self.requests = Arc::new(Semaphore::new(requests));
        self.max_in_flight = requests;
        Ok(self)
    }

    /// The bound on requests in flight.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// A tier in memory (tests, demos).
    pub fn memory(namespace: &str) -> Result<Self, TierError> {
        Self::new(Arc::new(InMemory::new()), namespace)
    }

    /// A tier in a local directory, through `object_store`'s file backend.
    pub fn local(root: impl AsRef<std::path::Path>, namespace: &str) -> Result<Self, TierError> {
        let root = root.as_ref();
        if !root.is_dir() {
            return Err(TierError::MissingRoot(root.to_path_buf()));
        }
        let store = object_store::local::LocalFileSystem::new_with_prefix(root)
            .map_err(|error| TierError::Config(error.to_string()))?;
        Self::new(Arc::new(store), namespace)
    }

    /// A tier in an S3 or S3-compatible bucket. The options, and the
    /// environment's endpoint and credentials, are checked here (see
    /// [`S3Options::validate`]): a bad endpoint or no credentials is an
    /// error now, not a panic or a timeout on the first request.
    pub fn s3(options: &S3Options, namespace: &str) -> Result<Self, TierError> {
        let mut tier = Self::new(Arc::new(options.build()?), namespace)?;
        tier.uploads = Some(Arc::new(options.uploads()?));
        Ok(tier)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Where the block for `key` lives.
    pub fn location_of(&self, key: &(impl BlockKey + ?Sized)) -> ObjectPath {
        let mut location = String::with_capacity(self.prefix.len() + 48);
        location.push_str(&self.prefix);
        location.push('/');
        let name = location.len();
        push_block_path(key, &mut location);
        // A hex name needs no encoding and the prefix is encoded already,
        // so checking the parts is enough (`ObjectPath::from` encodes part
        // by part, which cost more than the `head` on an in-memory store).
        // A key type whose name breaks the hex contract takes that path.
        if location[name..]
            .bytes()
            // guard: F4-only-hex-names-skip-encoding
            .all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b'.')
            && let Ok(location) = ObjectPath::parse(&location)
        {
            return location;
        }
        ObjectPath::from(format!("{}/{}", self.namespace, &location[name..]))
    }

    /// Counters of lookups and their errors.
    pub fn stats(&self) -> ObjectTierStats {
        ObjectTierStats {
            lookups: self.counters.lookups.load(Ordering::Relaxed),
            lookup_errors: self.counters.lookup_errors.load(Ordering::Relaxed),
        }
    }

    /// Checks that the store answers and its bucket exists: lists the
    /// namespace (one request). A `head` alone cannot tell a missing bucket
    /// from a missing block.
    pub async fn check_reachable(&self) -> Result<(), TierError> {
        let prefix = ObjectPath::from(self.namespace.as_str());
        let _permit = self.permit().await;
        self.store
            .list_with_delimiter(Some(&prefix))
            .await
            .map(drop)
            .map_err(|error| store_error("list", &prefix, error))
    }

    /// Whether the tier holds a block for `key` (one `head`).
    pub async fn contains(&self, key: &(impl BlockKey + ?Sized)) -> Result<bool, TierError> {
        let _permit = self.permit().await;
        head(&*self.store, &self.location_of(key)).await
    }

    /// Waits for a request slot; held until the request is done.
    async fn permit(&self) -> Option<SemaphorePermit<'_>> {
        // The semaphore is never closed, so `acquire` only fails if that
        // changes; a request then goes ahead unbounded rather than failing.
        self.requests.acquire().await.ok()
    }

    /// The block for `key`: `None` if there is none; an error if it cannot
    /// be fetched or is not a whole, intact kvtier block.
    pub async fn load(&self, key: &(impl BlockKey + ?Sized)) -> Result<Option<Vec<u8>>, TierError> {
        let location = self.location_of(key);
        #[cfg(fleet_index)]
        if let Some(index) = &self.index {
            let _permit = self.permit().await;
            return super::object_fleet::get_indexed(&*self.store, &index.fleet, &location).await;
        }
        // guard: E27-object-loads-pin-their-blocks
        let _pin = self
            .budget
            .as_ref()
            .and_then(|budget| budget.pin(&location));
        let _permit = self.permit().await;
        let fetched = match self.store.get(&location).await {
            Ok(result) => result.bytes().await,
            Err(error) => Err(error),
        };
        let bytes = match fetched {
            Ok(bytes) => bytes,
            Err(object_store::Error::NotFound { .. }) => {
                if let Some(budget) = &self.budget {
                    budget.lose(&location); // gone behind the tier's back
                }
                return Ok(None);
            }
            Err(error) => return Err(store_error("get", &location, error)),
        };
        match format::decode(&bytes) {
            Ok(_) => Ok(Some(bytes[HEADER_LEN..].to_vec())),
            Err(kind) => {
                if let Some(budget) = &self.budget {
                    // Off the books and out of the store, so the next
                    // store writes it whole.
                    budget.lose(&location);
                    let _ = self.store.delete(&location).await;
                }
                Err(TierError::Corrupt {
                    location: location.to_string(),
                    kind,
                })
            }
        }
    }

    /// Stores `payload` as the block for `key` (one `put`). Under a byte
    /// budget ([`with_budget`](Self::with_budget)) room is made first,
    /// and on a tokio runtime the put and its commit run on a task of
    /// their own: dropping this future does not cancel them, so the books
    /// always count what the store holds.
    pub async fn store(
        &self,
        key: &(impl BlockKey + ?Sized),
        payload: Vec<u8>,
    ) -> Result<(), TierError> {
        let location = self.location_of(key);
        #[cfg(fleet_index)]
        if let Some(index) = &self.index {
            let _permit = self.permit().await;
            return super::object_fleet::put_indexed(
                &*self.store,
                &index.fleet,
                &location,
                &payload,
            )
            .await;
        }
        // guard: E29-a-budgeted-store-outlives-its-caller
        let runtime = tokio::runtime::Handle::try_current();
        if let (Some(budget), Ok(runtime)) = (&self.budget, runtime) {
            // Under a budget the put and its commit run together to their
            // end even if the caller stops waiting: a put cancelled after
            // the store received it would leave an object the books do not
            // count.
            let (store, budget, requests) =
                (self.store.clone(), budget.clone(), self.requests.clone());
            let job_location = location.clone();
            let job = runtime.spawn(async move {
                let _permit = requests.acquire().await.ok();
                put_within(&*store, Some(&budget), &job_location, &payload).await
            });
            return job.await.unwrap_or_else(|stopped| {
                Err(TierError::Store {
                    op: "put",
                    location: location.to_string(),
                    source: Box::new(stopped),
                })
            });
        }
        let _permit = self.permit().await;
        put_within(&*self.store, self.budget.as_deref(), &location, &payload).await
    }

    /// Stores `payload` as the block for `key` on `runtime`; the returned
    /// task (for the [`SaveTracker`](crate::SaveTracker)) completes when the
    /// `put` has succeeded or failed. If the runtime shuts down first, the
    /// task ends as [`TaskError::Abandoned`](crate::save::TaskError::Abandoned).
    pub fn save(
        &self,
        key: &(impl BlockKey + ?Sized),
        payload: Vec<u8>,
        runtime: &tokio::runtime::Handle,
    ) -> ObjectSaveTask {
        let location = self.location_of(key);
        let id = self.counters.saves.fetch_add(1, Ordering::Relaxed);
        let store = self.store.clone();
        let budget = self.budget.clone();
        let requests = self.requests.clone();
        let job_location = location.clone();
        let (task, completer) = SaveTask::start(id, location);
        #[cfg(fleet_index)]
        let index = self.index.clone();
        runtime.spawn(async move {
            let _permit = requests.acquire().await.ok();
            #[cfg(fleet_index)]
            if let Some(index) = index {
                let stored = super::object_fleet::put_indexed(
                    &*store,
                    &index.fleet,
                    &job_location,
                    &payload,
                )
                .await;
                finish(completer, stored);
                return;
            }
            let stored = put_within(&*store, budget.as_deref(), &job_location, &payload).await;
            finish(completer, stored);
        });
        task
    }
}

/// A `put` under `budget` (if any): room first (deleting victims), then
/// the object; the room is committed when the `put` succeeded and given
/// back when it failed or was cancelled. A block the budget holds whose
/// object is still there is not written again.
async fn put_within(
    store: &dyn ObjectStore,
    budget: Option<&ObjectBudget>,
    location: &ObjectPath,
    payload: &[u8],
) -> Result<(), TierError> {
    // guard: E28-object-stores-get-room-before-they-put
    let Some(budget) = budget else {
        return put(store, location, payload).await;
    };
    let bytes = (HEADER_LEN + payload.len()) as u64;
    let Some(room) = budget.admit(store, location, bytes).await? else {
        return Ok(());
    };
    put(store, location, payload).await?;
    room.commit();
    Ok(())
}

/// A `put` running on an [`ObjectTier`]; its location is the object's.
/// If the runtime it runs on shuts down first, it ends as
/// [`TaskError::Abandoned`](crate::save::TaskError::Abandoned).
pub type ObjectSaveTask = SaveTask<ObjectPath>;

impl<K, R> AsyncBackend<K, R> for ObjectTier
where
    K: BlockKey + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        #[cfg(fleet_index)]
        if let Some(index) = &self.index {
            let locations = keys.iter().map(|key| self.location_of(key)).collect();
            let answered = super::object_fleet::lookup_indexed(&index.fleet, locations).await;
            self.counters
                .lookups
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
            return answered;
        }
        // Up to HEADS_IN_FLIGHT heads at once, polled inside this group's
        // future: concurrent on the network without a task per key (a
        // spawned task per head cost more than the head itself in memory).
        let store = &*self.store;
        let mut heads = stream::iter(0..keys.len())
            .map(|i| {
                let location = self.location_of(&keys[i]);
                async move {
                    let _permit = self.permit().await;
                    (i, head(store, &location).await)
                }
            })
            .buffer_unordered(HEADS_IN_FLIGHT);
        let mut answers = vec![false; keys.len()];
        let mut answered = 0u64;
        while let Some((i, answer)) = heads.next().await {
            match answer {
                Ok(found) => {
                    answers[i] = found;
                    answered += 1;
                }
                // guard: F9-a-failed-head-fails-the-group
                Err(error) => {
                    // As on a file system: an error other than "not found"
                    // fails the group (its keys become misses, counted in
                    // the lookup's backend_errors), and the heads still
                    // running are dropped, so an outage costs one failed
                    // request per group, not one per key.
                    self.counters.lookups.fetch_add(answered, Ordering::Relaxed);
                    self.counters.lookup_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(error);
                }
            }
        }
        self.counters.lookups.fetch_add(answered, Ordering::Relaxed);
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key type whose name is whatever it is given.
    struct Named(&'static str);

    impl BlockKey for Named {
        fn hex(&self) -> String {
            self.0.to_owned()
        }
    }

    /// Locations as the first version spelled them: stored blocks must keep
    /// their names.
    fn formatted(namespace: &str, key: &impl BlockKey) -> ObjectPath {
        let hex = key.hex();
        let padded = format!("{hex:0>5}");
        ObjectPath::from(format!(
            "{namespace}/{}/{}/{hex}.bin",
            padded.chars().take(3).collect::<String>(),
            padded.chars().skip(3).take(2).collect::<String>(),
        ))
    }

    #[test]
    fn locations_are_the_formatted_locations() {
        let namespaces = ["m/rank0", "a b/c%d/~x#y", ".x/..y/{z}", "ünï/çødé"];
        for namespace in namespaces {
            let tier = ObjectTier::memory(namespace).unwrap();
            for key in [0u64, 0xabcdef, u64::MAX] {
                assert_eq!(tier.location_of(&key), formatted(namespace, &key));
            }
            assert_eq!(
                tier.location_of(&[1u8; 32]),
                formatted(namespace, &[1u8; 32])
            );
            for odd in [".", "..", ".....", "", "a%b", "x/y", "äöüßé", "..b.."] {
                let key = Named(odd);
                assert_eq!(
                    tier.location_of(&key),
                    formatted(namespace, &key),
                    "{odd:?}"
                );
            }
        }
    }
}
