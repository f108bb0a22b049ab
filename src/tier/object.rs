//! A block tier on any `object_store` backend: S3 and S3-compatible servers,
//! a local directory, or memory.

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};

use super::TierError;
use super::format::{self, HEADER_LEN};
use super::key::{BlockKey, check_namespace, push_block_path};
use crate::lookup::AsyncLookupBackend;
use crate::save::{CompletionTask, StoreTask, TaskError};
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

/// How to reach an S3 or S3-compatible bucket.
///
/// Credentials left `None` are read from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`),
/// as are region and endpoint (`AWS_REGION`, `AWS_ENDPOINT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Options {
    /// The bucket.
    pub bucket: String,
    /// An S3-compatible server's URL (`http://127.0.0.1:9000`); `None`: AWS.
    pub endpoint: Option<String>,
    /// The region (S3-compatible servers usually accept any).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Allow plain `http://` endpoints (loopback test servers, private
    /// networks). Default: allowed exactly when the endpoint is `http://`.
    pub allow_http: bool,
    /// Per-request timeout. Default 5 s.
    pub request_timeout: Duration,
    /// Connection timeout. Default 2 s.
    pub connect_timeout: Duration,
    /// Retries of a failed request (with backoff, within
    /// `request_timeout` × (retries + 1)). Default 2.
    pub max_retries: usize,
}

impl S3Options {
    /// Options for `bucket` with the defaults.
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            allow_http: false,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_retries: 2,
        }
    }

    /// Parses `s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]` into the
    /// options and the namespace (default `kvtier`); `http://` endpoints
    /// are allowed.
    ///
    /// ```
    /// use kvtier::S3Options;
    ///
    /// let (options, namespace) =
    ///     S3Options::from_url("s3://kv-cache/llama/rank0?endpoint=http://127.0.0.1:9000")?;
    /// assert_eq!(options.bucket, "kv-cache");
    /// assert_eq!(options.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    /// assert!(options.allow_http);
    /// assert_eq!(namespace, "llama/rank0");
    /// # Ok::<(), kvtier::TierError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<(Self, String), TierError> {
        let bad = |reason: String| TierError::Config(format!("S3 URL {url:?}: {reason}"));
        let parsed = url::Url::parse(url).map_err(|error| bad(error.to_string()))?;
        if parsed.scheme() != "s3" {
            return Err(bad(format!(
                "the scheme is {:?}; expected s3://BUCKET[/NAMESPACE][?endpoint=URL]",
                parsed.scheme()
            )));
        }
        let bucket = parsed
            .host_str()
            .filter(|bucket| !bucket.is_empty())
            .ok_or_else(|| bad("no bucket".into()))?;
        let mut options = Self::new(bucket);
        for (name, value) in parsed.query_pairs() {
            match &*name {
                "endpoint" => {
                    let endpoint = url::Url::parse(&value)
                        .map_err(|error| bad(format!("endpoint {value:?}: {error}")))?;
                    if !matches!(endpoint.scheme(), "http" | "https") {
                        return Err(bad(format!("endpoint {value:?} is not http(s)")));
                    }
                    options.allow_http = endpoint.scheme() == "http";
                    options.endpoint = Some(value.into_owned());
                }
                "region" => options.region = Some(value.into_owned()),
                other => return Err(bad(format!("unknown parameter {other:?}"))),
            }
        }
        let namespace = parsed.path().trim_matches('/');
        let namespace = if namespace.is_empty() {
            "kvtier".to_owned()
        } else {
            namespace.to_owned()
        };
        check_namespace(&namespace).map_err(bad)?;
        Ok((options, namespace))
    }

    fn build(&self) -> Result<object_store::aws::AmazonS3, TierError> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_allow_http(self.allow_http)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(self.request_timeout)
                    .with_connect_timeout(self.connect_timeout)
                    .with_allow_http(self.allow_http),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: self.max_retries,
                retry_timeout: self.request_timeout * (self.max_retries as u32 + 1),
            });
        if let Some(endpoint) = &self.endpoint {
            // Path-style requests: what S3-compatible servers expect.
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        } else if self.endpoint.is_some() {
            builder = builder.with_region("us-east-1");
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        builder
            .build()
            .map_err(|error| TierError::Config(error.to_string()))
    }
}

/// Counters of an [`ObjectTier`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectTierStats {
    /// `head` requests answered (found or not found).
    pub lookups: u64,
    /// `head` requests that failed with anything but "not found"; each made
    /// its key a miss.
    pub lookup_errors: u64,
}

/// A block tier on an [`ObjectStore`]: existence by `head`, save by `put`
/// (objects appear whole, so no temporary names are needed), load by `get`
/// with the same checked block format as [`FsTier`](crate::FsTier).
///
/// As an [`AsyncLookupBackend`] it answers a group with concurrent `head`
/// requests: "not found" is a miss; any other error is a miss too, logged
/// and counted in [`stats`](Self::stats) — a tier that cannot be reached
/// never holds up the scheduler beyond the driver's group timeout.
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
    store: Arc<dyn ObjectStore>,
    namespace: String,
    /// The namespace as a location (percent-encoded where it must be).
    prefix: String,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    lookups: AtomicU64,
    lookup_errors: AtomicU64,
}

/// How many `head` requests one group keeps in flight.
const HEADS_IN_FLIGHT: usize = 32;

impl ObjectTier {
    /// A tier on `store`, below `namespace`.
    pub fn new(store: Arc<dyn ObjectStore>, namespace: &str) -> Result<Self, TierError> {
        check_namespace(namespace).map_err(TierError::Namespace)?;
        Ok(Self {
            store,
            namespace: namespace.to_owned(),
            prefix: ObjectPath::from(namespace).as_ref().to_owned(),
            counters: Default::default(),
        })
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

    /// A tier in an S3 or S3-compatible bucket.
    pub fn s3(options: &S3Options, namespace: &str) -> Result<Self, TierError> {
        Self::new(Arc::new(options.build()?), namespace)
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
        self.store
            .list_with_delimiter(Some(&prefix))
            .await
            .map(drop)
            .map_err(|error| store_error("list", &prefix, error))
    }

    /// Whether the tier holds a block for `key` (one `head`).
    pub async fn contains(&self, key: &(impl BlockKey + ?Sized)) -> Result<bool, TierError> {
        head(&*self.store, &self.location_of(key)).await
    }

    /// The block for `key`: `None` if there is none; an error if it cannot
    /// be fetched or is not a whole, intact kvtier block.
    pub async fn load(&self, key: &(impl BlockKey + ?Sized)) -> Result<Option<Vec<u8>>, TierError> {
        let location = self.location_of(key);
        let fetched = match self.store.get(&location).await {
            Ok(result) => result.bytes().await,
            Err(error) => Err(error),
        };
        let bytes = match fetched {
            Ok(bytes) => bytes,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(store_error("get", &location, error)),
        };
        match format::decode(&bytes) {
            Ok(_) => Ok(Some(bytes[HEADER_LEN..].to_vec())),
            Err(kind) => Err(TierError::Corrupt {
                location: location.to_string(),
                kind,
            }),
        }
    }

    /// Stores `payload` as the block for `key` (one `put`).
    pub async fn store(
        &self,
        key: &(impl BlockKey + ?Sized),
        payload: Vec<u8>,
    ) -> Result<(), TierError> {
        put(&*self.store, &self.location_of(key), &payload).await
    }

    /// Stores `payload` as the block for `key` on `runtime`; the returned
    /// task (for the [`SaveTracker`](crate::SaveTracker)) completes when the
    /// `put` has succeeded or failed. If the runtime shuts down first, the
    /// task ends as [`TaskError::Abandoned`].
    pub fn save(
        &self,
        key: &(impl BlockKey + ?Sized),
        payload: Vec<u8>,
        runtime: &tokio::runtime::Handle,
    ) -> ObjectSaveTask {
        let location = self.location_of(key);
        let (task, completer) = CompletionTask::new(());
        let store = self.store.clone();
        let job_location = location.clone();
        runtime.spawn(async move {
            match put(&*store, &job_location, &payload).await {
                Ok(()) => completer.succeed(),
                Err(error) => completer.fail(TaskError::Failed(Box::new(error))),
            }
        });
        ObjectSaveTask { location, task }
    }
}

async fn head(store: &dyn ObjectStore, location: &ObjectPath) -> Result<bool, TierError> {
    match store.head(location).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(error) => Err(store_error("head", location, error)),
    }
}

async fn put(
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

fn store_error(op: &'static str, location: &ObjectPath, error: object_store::Error) -> TierError {
    TierError::Store {
        op,
        location: location.to_string(),
        source: Box::new(error),
    }
}

/// A `put` running on a tokio runtime: a [`StoreTask`] for the
/// [`SaveTracker`](crate::SaveTracker).
#[derive(Debug)]
pub struct ObjectSaveTask {
    location: ObjectPath,
    task: CompletionTask<()>,
}

impl ObjectSaveTask {
    /// The object being written.
    pub fn location(&self) -> &ObjectPath {
        &self.location
    }
}

impl StoreTask for ObjectSaveTask {
    fn check(&self) -> bool {
        self.task.check()
    }

    fn wait(self) -> Result<(), TaskError> {
        self.task.wait()
    }
}

impl<K, R> AsyncLookupBackend<K, R> for ObjectTier
where
    K: BlockKey + Sync,
    R: Sync,
{
    type Error = TierError;

    async fn batch_lookup(&self, keys: &[K], _request: &R) -> Result<Vec<bool>, TierError> {
        // Up to HEADS_IN_FLIGHT heads at once, polled inside this group's
        // future: concurrent on the network without a task per key (a
        // spawned task per head cost more than the head itself in memory).
        let store = &*self.store;
        let mut heads = stream::iter(0..keys.len())
            .map(|i| {
                let location = self.location_of(&keys[i]);
                async move { (i, head(store, &location).await) }
            })
            .buffer_unordered(HEADS_IN_FLIGHT);
        let mut answers = vec![false; keys.len()];
        let mut first_error = None;
        let mut errors = 0u64;
        while let Some((i, answer)) = heads.next().await {
            match answer {
                Ok(found) => answers[i] = found,
                Err(error) => {
                    errors += 1;
                    first_error.get_or_insert(error);
                }
            }
        }
        self.counters
            .lookups
            .fetch_add(keys.len() as u64 - errors, Ordering::Relaxed);
        if let Some(error) = first_error {
            self.counters
                .lookup_errors
                .fetch_add(errors, Ordering::Relaxed);
            tracing::warn!(
                keys = keys.len(),
                errors,
                %error,
                "object store lookups failed; those keys are misses"
            );
        }
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
