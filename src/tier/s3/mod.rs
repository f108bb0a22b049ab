//! How to reach an S3 or S3-compatible bucket, checked where it enters: the
//! options, the `s3://` URL and the environment.
//!
//! `object_store` accepts endpoint strings that its request path later
//! panics on, and sends a query or fragment of an endpoint in front of the
//! object's path (so a `HEAD` of a block becomes a `HEAD` of the bucket,
//! which answers 200). Everything is therefore checked here, before a store
//! is built, and refused with a [`TierError::Config`] that says why.

use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use super::error::TierError;
use super::key::check_namespace;
use checks::{check_bucket, check_credential, check_region, has_credential_source, namespace_of};

mod checks;
pub(crate) mod profile;
pub(crate) mod uploads;

pub(crate) use checks::check_endpoint;

/// The longest request or connection timeout accepted: a day. Longer ones
/// overflow the deadlines of the HTTP client.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The region of an endpoint given without one (S3-compatible servers
/// accept any).
const DEFAULT_REGION: &str = "us-east-1";

/// The most retries accepted for one request.
const MAX_RETRIES: usize = 100;

/// How to reach an S3 or S3-compatible bucket.
///
/// Credentials left `None` are read from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or a
/// web-identity or container credential source), as are region and
/// endpoint (`AWS_REGION`, `AWS_ENDPOINT`, `AWS_ENDPOINT_URL_S3`), else from
/// the AWS shared credentials and config files' profile (`AWS_PROFILE`,
/// `AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`). When none
/// is found, building the tier fails with "no credentials found" instead of
/// asking the cloud instance-metadata address, unless
/// [`allow_instance_metadata`](Self::allow_instance_metadata) is set.
///
/// Every setting is checked when a tier is built (see
/// [`validate`](Self::validate)). `Debug` shows the secret access key as
/// `<redacted>`.
///
/// ```
/// use std::time::Duration;
/// use kvtier::tier::S3Options;
///
/// let options = S3Options::new("kv-cache")
///     .endpoint("http://127.0.0.1:9000")
///     .allow_http(true)
///     .credentials("test", "test-secret")
///     .request_timeout(Duration::from_secs(2));
/// assert!(options.validate().is_ok());
/// assert!(!format!("{options:?}").contains("test-secret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct S3Options {
    bucket: String,
    endpoint: Option<String>,
    region: Option<String>,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    session_token: Option<String>,
    ca_bundle: Option<std::path::PathBuf>,
    allow_http: bool,
    allow_instance_metadata: bool,
    request_timeout: Duration,
    connect_timeout: Duration,
    max_retries: usize,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            // guard: F10-debug-redacts-the-secret
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_bundle", &self.ca_bundle)
            .field("allow_http", &self.allow_http)
            .field("allow_instance_metadata", &self.allow_instance_metadata)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

impl S3Options {
    /// Options for `bucket` (3 to 63 lowercase letters, digits, `.` and
    /// `-`, beginning and ending with a letter or digit) with the defaults:
    /// AWS or the environment's endpoint, region and credentials, https
    /// only, no instance metadata, a 5 s request and a 2 s connection
    /// timeout, 2 retries.
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            ca_bundle: None,
            allow_http: false,
            allow_instance_metadata: false,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_retries: 2,
        }
    }

    /// An S3-compatible server's URL (`http://127.0.0.1:9000`): `http` or
    /// `https`, a host, an optional port, nothing else.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = Some(url.into());
        self
    }

    /// The region (S3-compatible servers usually accept any).
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// The access key id and secret access key, instead of the environment's.
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.access_key_id = Some(access_key_id.into());
        self.secret_access_key = Some(secret_access_key.into());
        self
    }

    /// A session token, with temporary [`credentials`](Self::credentials).
    pub fn session_token(mut self, token: impl Into<String>) -> Self {
        self.session_token = Some(token.into());
        self
    }

    /// A file of PEM certificates to trust besides the system's (a private
    /// certificate authority of an `https` endpoint). Read when the store
    /// is built; a file that cannot be read or holds no certificate is a
    /// [`TierError::Config`] then.
    pub fn ca_bundle(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ca_bundle = Some(path.into());
        self
    }

    /// Allow plain `http://` endpoints (loopback test servers, private
    /// networks). [`from_url`](Self::from_url) sets it exactly when the
    /// endpoint is `http://`.
    pub fn allow_http(mut self, allow: bool) -> Self {
        self.allow_http = allow;
        self
    }

    /// Ask the cloud instance-metadata service for credentials when no other
    /// source has them (on a cloud VM with an instance role). Off by
    /// default: off a cloud VM that request goes to an address outside this
    /// machine and fails only after its timeout.
    pub fn allow_instance_metadata(mut self, allow: bool) -> Self {
        self.allow_instance_metadata = allow;
        self
    }

    /// Per-request timeout, above zero and at most a day.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Connection timeout, above zero and at most a day.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Retries of a failed request (with backoff, within
    /// `request_timeout` × (retries + 1)), at most 100.
    pub fn max_retries(mut self, retries: usize) -> Self {
        self.max_retries = retries;
        self
    }

    /// The bucket.
    pub fn get_bucket(&self) -> &str {
        &self.bucket
    }

    /// The endpoint, if one is set.
    pub fn get_endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// The region, if one is set.
    pub fn get_region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// The access key id, if credentials are set.
    pub fn get_access_key_id(&self) -> Option<&str> {
        self.access_key_id.as_deref()
    }

    /// Whether `http://` endpoints are allowed.
    pub fn get_allow_http(&self) -> bool {
        self.allow_http
    }

    /// Whether the instance-metadata service may be asked.
    pub fn get_allow_instance_metadata(&self) -> bool {
        self.allow_instance_metadata
    }

    /// The per-request timeout.
    pub fn get_request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The connection timeout.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The retries of a failed request.
    pub fn get_max_retries(&self) -> usize {
        self.max_retries
    }

    /// Parses `s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]` into the
    /// options and the namespace (default `kvtier`); `http://` endpoints
    /// are allowed.
    ///
    /// The namespace is percent-decoded once, segment by segment, so
    /// `s3://kv/my%20ns` names the namespace `my ns`, the same prefix as
    /// `ObjectTier::s3(&options, "my ns")`. Empty segments, `.` and `..`
    /// are refused, not resolved.
    ///
    /// ```
    /// use kvtier::tier::S3Options;
    ///
    /// let (options, namespace) =
    ///     S3Options::from_url("s3://kv-cache/llama/rank0?endpoint=http://127.0.0.1:9000")?;
    /// assert_eq!(options.get_bucket(), "kv-cache");
    /// assert_eq!(options.get_endpoint(), Some("http://127.0.0.1:9000"));
    /// assert!(options.get_allow_http());
    /// assert_eq!(namespace, "llama/rank0");
    ///
    /// // An endpoint with a query would address the bucket, not the block.
    /// assert!(S3Options::from_url("s3://kv-cache?endpoint=http://127.0.0.1:9000?x=1").is_err());
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
        if parsed.fragment().is_some() {
            return Err(bad(
                "a fragment (`#...`) is not part of an S3 URL; write `#` in a namespace as %23"
                    .into(),
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() || parsed.port().is_some() {
            return Err(bad(
                "the part after s3:// is the bucket alone (no user, password or port)".into(),
            ));
        }
        let bucket = parsed
            .host_str()
            .filter(|bucket| !bucket.is_empty())
            .ok_or_else(|| bad("no bucket".into()))?;
        let mut options = Self::new(bucket);
        let mut seen = Vec::new();
        for (name, value) in parsed.query_pairs() {
            if seen.contains(&name) {
                return Err(bad(format!("parameter {name:?} is given twice")));
            }
            match &*name {
                "endpoint" => {
                    check_endpoint(&value)
                        .map_err(|reason| bad(format!("endpoint {value:?} {reason}")))?;
                    options.allow_http = value.starts_with("http://");
                    options.endpoint = Some(value.clone().into_owned());
                }
                "region" => options.region = Some(value.clone().into_owned()),
                other => return Err(bad(format!("unknown parameter {other:?}"))),
            }
            seen.push(name);
        }
        let namespace = namespace_of(url).map_err(bad)?;
        check_namespace(&namespace).map_err(bad)?;
        options.check_fields().map_err(bad)?;
        Ok((options, namespace))
    }

    /// Checks every field without building anything: the bucket name, the
    /// endpoint (see [`from_url`](Self::from_url)), the region, the
    /// timeouts and the retry count. Building a tier calls it, and checks
    /// the environment's endpoint and credentials too.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kvtier::tier::S3Options;
    ///
    /// let options = S3Options::new("kv-cache");
    /// assert!(options.clone().endpoint("http://127.0.0.1:9000/#frag").validate().is_err());
    /// let options = options.endpoint("http://127.0.0.1:9000");
    /// assert!(options.validate().is_ok());
    /// assert!(options.request_timeout(Duration::MAX).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), TierError> {
        self.check_fields()
            .map_err(|reason| TierError::Config(format!("S3 options: {reason}")))
    }

    fn check_fields(&self) -> Result<(), String> {
        check_bucket(&self.bucket)?;
        if let Some(endpoint) = &self.endpoint {
            check_endpoint(endpoint).map_err(|reason| format!("endpoint {endpoint:?} {reason}"))?;
        }
        if let Some(region) = &self.region {
            check_region(region)?;
        }
        // A credential goes into an HTTP header: a CR, LF or other control
        // byte there would make every request fail inside the client.
        // guard: H4-credentials-checked
        for (name, value) in [
            ("access_key_id", &self.access_key_id),
            ("secret_access_key", &self.secret_access_key),
            ("session_token", &self.session_token),
        ] {
            if let Some(value) = value {
                check_credential(name, value)?;
            }
        }
        if self.session_token.is_some() && self.access_key_id.is_none() {
            return Err(
                "a session_token goes with an access key and secret, which are not set".into(),
            );
        }
        if self.access_key_id.is_none() {
            for name in [
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
            ] {
                if let Some(value) = std::env::var_os(name) {
                    check_credential(name, &value.to_string_lossy())?;
                }
            }
        }
        for (name, timeout) in [
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if timeout.is_zero() || timeout > MAX_TIMEOUT {
                return Err(format!(
                    "{name} is {timeout:?}; it must be above zero and at most {MAX_TIMEOUT:?}"
                ));
            }
        }
        if self.max_retries > MAX_RETRIES {
            return Err(format!(
                "max_retries is {}; at most {MAX_RETRIES} are allowed",
                self.max_retries
            ));
        }
        Ok(())
    }

    /// The HTTP client's options: timeouts, http allowed, the CA bundle.
    pub(super) fn client_options(&self) -> Result<ClientOptions, TierError> {
        let mut client = ClientOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_allow_http(self.allow_http);
        if let Some(path) = &self.ca_bundle {
            for certificate in read_ca_bundle(path)? {
                client = client.with_root_certificate(certificate);
            }
        }
        Ok(client)
    }

    /// The multipart uploads' requests of the bucket (see `uploads.rs`).
    pub(crate) fn uploads(&self) -> Result<uploads::Uploads, TierError> {
        uploads::Uploads::new(
            self.build()?,
            &self.client_options()?,
            self.get_endpoint(),
            self.get_bucket(),
            self.effective_region(),
        )
    }

    /// The region requests are signed for: the one set, the environment's
    /// (`AWS_REGION`, `AWS_DEFAULT_REGION`), else `us-east-1`.
    pub(super) fn effective_region(&self) -> String {
        self.region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| DEFAULT_REGION.to_owned())
    }

    pub(super) fn build(&self) -> Result<object_store::aws::AmazonS3, TierError> {
        self.validate()?;
        let retries = self.max_retries as u32; // at most MAX_RETRIES
        let client = self.client_options()?;
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_allow_http(self.allow_http)
            .with_client_options(client)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: self.max_retries,
                retry_timeout: self.request_timeout.saturating_mul(retries + 1),
            });
        if let Some(endpoint) = &self.endpoint {
            // Path-style requests: what S3-compatible servers expect. The
            // S3-specific key is set too, since the environment's
            // AWS_ENDPOINT_URL_S3 would otherwise take precedence.
            builder = builder
                .with_endpoint(endpoint)
                .with_config(AmazonS3ConfigKey::S3Endpoint, endpoint)
                .with_virtual_hosted_style_request(false);
        }
        for key in [AmazonS3ConfigKey::S3Endpoint, AmazonS3ConfigKey::Endpoint] {
            if let Some(endpoint) = builder.get_config_value(&key) {
                check_endpoint(&endpoint).map_err(|reason| {
                    TierError::Config(format!(
                        "the environment's endpoint ({}) {endpoint:?} {reason}",
                        key.as_ref().to_ascii_uppercase()
                    ))
                })?;
            }
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        } else if self.endpoint.is_some() {
            builder = builder.with_region(DEFAULT_REGION);
        }
        if let Some(region) = builder.get_config_value(&AmazonS3ConfigKey::Region) {
            check_region(&region).map_err(TierError::Config)?;
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(token) = &self.session_token {
            builder = builder.with_token(token);
        }
        // No credentials given and none in the environment's variables:
        // the AWS shared files' profile, as the AWS SDKs read them.
        let unset = self.access_key_id.is_none() && std::env::var_os("AWS_ACCESS_KEY_ID").is_none();
        if unset && let Some(found) = profile::environment_profile() {
            builder = with_profile(builder, &found)?;
        }
        if !self.allow_instance_metadata && !has_credential_source(&builder) {
            return Err(TierError::Config(format!(
                "no credentials found (looked in S3Options, AWS_ACCESS_KEY_ID / \
                 AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, \
                 AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI, AWS_SKIP_SIGNATURE) \
                 for bucket {:?}; set them, or allow the instance-metadata service",
                self.bucket
            )));
        }
        builder
            .build()
            .map_err(|error| TierError::Config(error.to_string()))
    }
}

/// `builder` with a shared files' profile's credentials, and its region
/// where the builder has none.
fn with_profile(
    mut builder: AmazonS3Builder,
    found: &profile::Profile,
) -> Result<AmazonS3Builder, TierError> {
    // guard: O19-the-shared-files-credentials-are-used
    if let (Some(key), Some(secret)) = (&found.access_key_id, &found.secret_access_key) {
        for (name, value) in [
            ("aws_access_key_id", key),
            ("aws_secret_access_key", secret),
        ] {
            check_credential(name, value).map_err(TierError::Config)?;
        }
        builder = builder
            .with_access_key_id(key)
            .with_secret_access_key(secret);
        if let Some(token) = &found.session_token {
            check_credential("aws_session_token", token).map_err(TierError::Config)?;
            builder = builder.with_token(token);
        }
    }
    let no_region = builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .is_none();
    if no_region && let Some(region) = &found.region {
        check_region(region).map_err(TierError::Config)?;
        builder = builder.with_region(region);
    }
    Ok(builder)
}

/// The certificates of a PEM bundle file.
fn read_ca_bundle(path: &std::path::Path) -> Result<Vec<object_store::Certificate>, TierError> {
    let bad = |reason: String| TierError::Config(format!("ca_bundle {}: {reason}", path.display()));
    let pem = std::fs::read(path).map_err(|error| bad(error.to_string()))?;
    let certificates =
        object_store::Certificate::from_pem_bundle(&pem).map_err(|error| bad(error.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests;
