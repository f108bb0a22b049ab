//! Where an object-store tier keeps its blocks, from either spelling a
//! caller has: kvtier's URL (`s3://bucket/prefix?endpoint=…`) or vLLM's obj
//! tier's `store_config` and `prefix`, plus the requests' timeouts and
//! retries. Credentials come from `store_config`, or from the environment
//! when it has none; they are never shown (`Debug` redacts them).

use std::time::Duration;

use super::error::SettingError;
use super::values::seconds;
use crate::tier::S3Options;

/// The longest request timeout: a minute (a lookup or a block that takes
/// longer is better recomputed).
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A request's timeout: seconds above zero, at most a minute.
fn request_seconds(name: &str, value: f64) -> Result<Duration, SettingError> {
    let timeout = seconds(name, value)?;
    if timeout.is_zero() || timeout > MAX_REQUEST_TIMEOUT {
        return Err(SettingError::new(
            name,
            format!(
                "is {value}; it must be above 0 and at most {} seconds",
                MAX_REQUEST_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(timeout)
}

/// A bucket and the prefix below it, with how to reach it.
///
/// ```
/// use kvtier::settings::ObjectTarget;
///
/// let target = ObjectTarget::from_url("url", "s3://kv-cache/fleet?endpoint=http://127.0.0.1:9000")?;
/// assert_eq!((target.options().get_bucket(), target.prefix()), ("kv-cache", "fleet"));
///
/// // vLLM's obj tier's settings name the same place.
/// let config = [("bucket", "kv-cache"), ("endpoint_override", "127.0.0.1:9000"),
///               ("access_key", "k"), ("secret_key", "s")];
/// let target = ObjectTarget::from_store_config("store_config", config, "/fleet/")?;
/// assert_eq!(target.options().get_endpoint(), Some("http://127.0.0.1:9000"));
/// assert_eq!(target.prefix(), "fleet");
/// assert!(!format!("{target:?}").contains("\"s\""));
///
/// let error = ObjectTarget::from_store_config("store_config", [("bucket", "kv-cache"), ("scheme", "ftp")], "")
///     .unwrap_err();
/// assert_eq!(error.setting, "store_config['scheme']");
/// # Ok::<(), kvtier::settings::SettingError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectTarget {
    options: S3Options,
    prefix: String,
    /// The setting it came from, for errors: `url` or `store_config`
    /// (as the caller spells it), and whether credentials were given there.
    source: String,
    url_form: bool,
    explicit_credentials: bool,
}

/// Which part of an [`ObjectTarget`] a failed first request points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReachFault {
    /// The server refused the credentials (401 or 403).
    Credentials,
    /// The bucket does not exist (404 to a listing).
    Bucket,
    /// No answer: the endpoint is wrong, down, or too slow.
    Endpoint,
}

impl ReachFault {
    /// The fault a failed first request's error points at: the store's
    /// error kind where it has one, else S3's error code in the server's
    /// answer (object_store reports a refused listing as a generic error
    /// with the answer's text), else the endpoint.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        let mut text = String::new();
        let mut next = Some(error);
        while let Some(error) = next {
            match error.downcast_ref::<object_store::Error>() {
                Some(
                    object_store::Error::Unauthenticated { .. }
                    | object_store::Error::PermissionDenied { .. },
                ) => return Self::Credentials,
                Some(object_store::Error::NotFound { .. }) => return Self::Bucket,
                _ => {}
            }
            text.push_str(&error.to_string());
            text.push('\n');
            next = error.source();
        }
        // guard: O7-a-refused-first-request-names-its-setting
        if CREDENTIAL_CODES.iter().any(|code| text.contains(code)) {
            Self::Credentials
        } else if text.contains("NoSuchBucket") {
            Self::Bucket
        } else {
            Self::Endpoint
        }
    }
}

/// S3's error codes (and kvtier's own message) for credentials a server
/// refused or a client could not find.
const CREDENTIAL_CODES: [&str; 7] = [
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "AccessDenied",
    "ExpiredToken",
    "InvalidToken",
    "InvalidClientTokenId",
    "no credentials found",
];

impl ObjectTarget {
    /// From kvtier's URL, `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`
    /// (see [`S3Options::from_url`]); errors name the setting `name`.
    pub fn from_url(name: &str, url: &str) -> Result<Self, SettingError> {
        let (options, prefix) = S3Options::from_url(url)
            .map_err(|error| SettingError::new(name, format!("is not usable: {error}")))?;
        Ok(Self {
            options,
            prefix,
            source: name.to_owned(),
            url_form: true,
            explicit_credentials: false,
        })
    }

    /// From vLLM's obj tier's `store_config` entries (`bucket`, required;
    /// `endpoint_override`, `host:port` or a URL; `scheme`, `http` (the
    /// default, as vLLM's) or `https`; `region`; `access_key` and
    /// `secret_key`, both or neither; `session_token`; `ca_bundle`, a PEM
    /// file) and its `prefix`. An empty entry counts as absent, as in
    /// vLLM. Empty segments of the prefix are dropped (vLLM's key has one
    /// after the prefix, which this client cannot address; see
    /// docs/design.md, "vLLM's object keys"); `.` and `..` are refused.
    /// Errors name the entry as `name['entry']`.
    pub fn from_store_config<K, V>(
        name: &str,
        entries: impl IntoIterator<Item = (K, V)>,
        prefix: &str,
    ) -> Result<Self, SettingError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let entry = |key: &str| format!("{name}['{key}']");
        let mut fields: [Option<String>; 8] = Default::default();
        const KEYS: [&str; 8] = [
            "bucket",
            "endpoint_override",
            "access_key",
            "secret_key",
            "session_token",
            "region",
            "scheme",
            "ca_bundle",
        ];
        for (key, value) in entries {
            let (key, value) = (key.as_ref(), value.as_ref());
            // guard: O4-store-config-keys-are-vllms
            let Some(slot) = KEYS.iter().position(|known| *known == key) else {
                return Err(SettingError::new(
                    entry(key),
                    format!("is not a store_config key (they are {})", KEYS.join(", ")),
                ));
            };
            if !value.is_empty() {
                fields[slot] = Some(value.to_owned());
            }
        }
        let [
            bucket,
            endpoint,
            access,
            secret,
            token,
            region,
            scheme,
            ca_bundle,
        ] = fields;
        let Some(bucket) = bucket else {
            return Err(SettingError::new(
                entry("bucket"),
                "is not set; it names the bucket",
            ));
        };
        let scheme = scheme.unwrap_or_else(|| "http".into());
        if scheme != "http" && scheme != "https" {
            return Err(SettingError::new(
                entry("scheme"),
                format!("is {scheme:?}; it must be \"http\" or \"https\""),
            ));
        }
        let mut options = S3Options::new(bucket);
        if let Some(endpoint) = endpoint {
            let url = if endpoint.contains("://") {
                endpoint
            } else {
                format!("{scheme}://{endpoint}")
            };
            options = options.allow_http(url.starts_with("http://")).endpoint(url);
        }
        let explicit_credentials = access.is_some();
        match (access, secret) {
            (Some(access), Some(secret)) => options = options.credentials(access, secret),
            (None, None) => {}
            (Some(_), None) => {
                return Err(SettingError::new(
                    entry("secret_key"),
                    "is not set, but access_key is",
                ));
            }
            (None, Some(_)) => {
                return Err(SettingError::new(
                    entry("access_key"),
                    "is not set, but secret_key is",
                ));
            }
        }
        if let Some(token) = token {
            options = options.session_token(token);
        }
        if let Some(region) = region {
            options = options.region(region);
        }
        if let Some(path) = ca_bundle {
            options = options.ca_bundle(path);
        }
        options
            .validate()
            .map_err(|error| SettingError::new(name, format!("is not usable: {error}")))?;
        let mut segments = Vec::new();
        for segment in prefix.split('/').filter(|segment| !segment.is_empty()) {
            if segment == "." || segment == ".." {
                return Err(SettingError::new(
                    "prefix",
                    format!("is {prefix:?}; `.` and `..` segments are refused, not resolved"),
                ));
            }
            segments.push(segment);
        }
        Ok(Self {
            options,
            prefix: segments.join("/"),
            source: name.to_owned(),
            url_form: false,
            explicit_credentials,
        })
    }

    /// The request timeout (seconds, above zero, at most a minute; default
    /// 5 s). Errors name the setting `name`.
    pub fn with_request_timeout(mut self, name: &str, value: f64) -> Result<Self, SettingError> {
        self.options = self.options.request_timeout(request_seconds(name, value)?);
        Ok(self)
    }

    /// The connection timeout, as [`with_request_timeout`](Self::with_request_timeout)
    /// (default 2 s).
    pub fn with_connect_timeout(mut self, name: &str, value: f64) -> Result<Self, SettingError> {
        self.options = self.options.connect_timeout(request_seconds(name, value)?);
        Ok(self)
    }

    /// Retries of a failed request, with backoff: 0 to 10 (default 2).
    pub fn with_max_retries(mut self, name: &str, retries: u64) -> Result<Self, SettingError> {
        if retries > 10 {
            return Err(SettingError::new(
                name,
                format!("is {retries}; it must be 0 to 10"),
            ));
        }
        self.options = self.options.max_retries(retries as usize);
        Ok(self)
    }

    /// The error of a first request that failed with `fault`, naming the
    /// setting to fix; `detail` is the store's own message.
    ///
    /// ```
    /// use kvtier::settings::{ObjectTarget, ReachFault};
    ///
    /// let target = ObjectTarget::from_store_config("store_config", [("bucket", "kv-cache")], "")?;
    /// let error = target.unreachable(ReachFault::Bucket, "404 NoSuchBucket");
    /// assert_eq!(error.setting, "store_config['bucket']");
    /// # Ok::<(), kvtier::settings::SettingError>(())
    /// ```
    pub fn unreachable(&self, fault: ReachFault, detail: impl std::fmt::Display) -> SettingError {
        let source = &self.source;
        let entry = |key: &str| {
            if self.url_form {
                source.clone()
            } else {
                format!("{source}['{key}']")
            }
        };
        let bucket = self.options.get_bucket();
        let endpoint = self.options.get_endpoint().unwrap_or("AWS's endpoint");
        match fault {
            ReachFault::Credentials if self.explicit_credentials => SettingError::new(
                format!("{} / {}", entry("access_key"), entry("secret_key")),
                format!("is refused by {endpoint} for bucket {bucket:?}: {detail}"),
            ),
            ReachFault::Credentials => SettingError::new(
                "the credentials",
                format!(
                    "(from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the AWS config files, \
                     environment, for {source}) are missing or refused by {endpoint} for bucket {bucket:?}: {detail}"
                ),
            ),
            ReachFault::Bucket => SettingError::new(
                entry("bucket"),
                format!("is {bucket:?}, which {endpoint} does not have: {detail}"),
            ),
            ReachFault::Endpoint => SettingError::new(
                entry("endpoint_override"),
                format!("is {endpoint}, which does not answer: {detail}"),
            ),
        }
    }

    /// How to reach the bucket.
    pub fn options(&self) -> &S3Options {
        &self.options
    }

    /// The prefix below the bucket (`""` for the bucket's top).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `below` under the prefix: `<prefix>/<below>`, or `below` alone for
    /// an empty prefix.
    pub fn join(&self, below: &str) -> String {
        match self.prefix.as_str() {
            "" => below.to_owned(),
            prefix => format!("{prefix}/{below}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<ObjectTarget, SettingError> {
        ObjectTarget::from_store_config("store_config", pairs.iter().copied(), "")
    }

    #[test]
    fn the_endpoint_takes_the_scheme_and_a_url_keeps_its_own() {
        let target = config(&[
            ("bucket", "kvb"),
            ("endpoint_override", "h:1"),
            ("scheme", "https"),
        ])
        .unwrap();
        assert_eq!(target.options().get_endpoint(), Some("https://h:1"));
        assert!(!target.options().get_allow_http());
        let target = config(&[("bucket", "kvb"), ("endpoint_override", "http://h:1")]).unwrap();
        assert_eq!(target.options().get_endpoint(), Some("http://h:1"));
        assert!(target.options().get_allow_http());
    }

    #[test]
    fn bad_entries_are_named() {
        for (pairs, setting) in [
            (
                &[("bucket", "kvb"), ("acess_key", "x")][..],
                "store_config['acess_key']",
            ),
            (
                &[("endpoint_override", "h:1")][..],
                "store_config['bucket']",
            ),
            (
                &[("bucket", "kvb"), ("access_key", "x")][..],
                "store_config['secret_key']",
            ),
            (
                &[("bucket", "kvb"), ("secret_key", "x")][..],
                "store_config['access_key']",
            ),
            (&[("bucket", "Bad_Bucket")][..], "store_config"),
            (
                &[("bucket", "kvb"), ("endpoint_override", "h:1/x?y")][..],
                "store_config",
            ),
        ] {
            assert_eq!(config(pairs).unwrap_err().setting, setting, "{pairs:?}");
        }
        assert_eq!(
            ObjectTarget::from_store_config("c", [("bucket", "kvb")], "a/../b")
                .unwrap_err()
                .setting,
            "prefix"
        );
        assert_eq!(
            ObjectTarget::from_url("url", "s3://").unwrap_err().setting,
            "url"
        );
    }

    #[test]
    fn empty_prefix_segments_are_dropped_and_join_follows() {
        let target = ObjectTarget::from_store_config("c", [("bucket", "kvb")], "//a//b/").unwrap();
        assert_eq!(target.prefix(), "a/b");
        assert_eq!(target.join("m_r0"), "a/b/m_r0");
        let top = ObjectTarget::from_store_config("c", [("bucket", "kvb")], "").unwrap();
        assert_eq!(top.join("m_r0"), "m_r0");
    }

    #[test]
    fn secrets_are_not_shown() {
        let target = config(&[
            ("bucket", "kvb"),
            ("access_key", "AKIDVISIBLE"),
            ("secret_key", "hidden-secret"),
            ("session_token", "hidden-token"),
        ])
        .unwrap();
        let shown = format!("{target:?}");
        assert!(shown.contains("AKIDVISIBLE"));
        assert!(!shown.contains("hidden-secret") && !shown.contains("hidden-token"));
    }

    #[test]
    fn a_refused_first_request_is_told_by_its_s3_code() {
        let answer = |text: &str| std::io::Error::other(text.to_owned());
        for (text, fault) in [
            (
                "403 Forbidden: <Code>SignatureDoesNotMatch</Code>",
                ReachFault::Credentials,
            ),
            (
                "403 Forbidden: <Code>InvalidAccessKeyId</Code>",
                ReachFault::Credentials,
            ),
            (
                "no credentials found (looked in S3Options...)",
                ReachFault::Credentials,
            ),
            (
                "404 Not Found: <Code>NoSuchBucket</Code>",
                ReachFault::Bucket,
            ),
            (
                "error sending request: connection refused",
                ReachFault::Endpoint,
            ),
        ] {
            assert_eq!(ReachFault::of(&answer(text)), fault, "{text}");
        }
    }

    #[test]
    fn timeouts_and_retries_have_ranges() {
        let target = config(&[("bucket", "kvb")]).unwrap();
        assert!(
            target
                .clone()
                .with_request_timeout("request_timeout", 0.0)
                .is_err()
        );
        assert!(
            target
                .clone()
                .with_request_timeout("request_timeout", 61.0)
                .is_err()
        );
        assert!(
            target
                .clone()
                .with_connect_timeout("connect_timeout", f64::NAN)
                .is_err()
        );
        assert!(target.clone().with_max_retries("max_retries", 11).is_err());
        let target = target.with_request_timeout("request_timeout", 0.5).unwrap();
        assert_eq!(
            target.options().get_request_timeout(),
            Duration::from_millis(500)
        );
    }
}
