//! The fleet's books' settings: `index` (the Valkey or Redis URL) and
//! `index_lease` (how long a reservation, eviction or pin holds without
//! being renewed). docs/design.md, "The fleet's books in Valkey".

use std::fmt;
use std::time::Duration;

use super::error::SettingError;

/// Where the fleet's books are and how long their leases last.
///
/// ```
/// use std::time::Duration;
/// use kvtier::settings::IndexConfig;
///
/// let index = IndexConfig::new("redis://127.0.0.1:6379/0")?
///     .with_lease(Duration::from_secs(10))?;
/// assert_eq!(index.lease(), Duration::from_secs(10));
/// assert!(IndexConfig::new("http://127.0.0.1:6379").is_err());
/// assert_eq!(
///     format!("{:?}", IndexConfig::new("redis://:hunter2@10.0.0.5:6379")?),
///     "IndexConfig { url: \"redis://:***@10.0.0.5:6379\", lease: 30s }"
/// );
/// # Ok::<(), kvtier::settings::SettingError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct IndexConfig {
    url: String,
    lease: Duration,
}

/// The URL schemes the client speaks.
const SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
];

impl IndexConfig {
    /// Leases by default: long enough for a slow put and a few missed
    /// renewals (every third of a lease), short enough that a dead host's
    /// space comes back within a minute.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The shortest lease: a renewal every third of it must reach the
    /// server in time.
    pub const MIN_LEASE: Duration = Duration::from_millis(300);
    /// The longest lease (a dead host's space is held this long).
    pub const MAX_LEASE: Duration = Duration::from_secs(3600);

    /// The books at `url` (`redis://`, `rediss://`, `valkey://`,
    /// `valkeys://` or a Unix socket's `redis+unix://`), leases of
    /// [`DEFAULT_LEASE`](Self::DEFAULT_LEASE).
    pub fn new(url: &str) -> Result<Self, SettingError> {
        let refuse = |problem: String| SettingError::new("index", problem);
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(refuse(format!(
                "is {}; it must be a URL such as redis://host:6379",
                shown(url)
            )));
        };
        // guard: G13-the-index-url-is-checked
        if !SCHEMES.contains(&scheme) {
            return Err(refuse(format!(
                "is {}; its scheme must be one of {}",
                shown(url),
                SCHEMES.join(", ")
            )));
        }
        let host = rest.split(['/', '?']).next().unwrap_or("");
        let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
        if host.is_empty() && !scheme.ends_with("unix") {
            return Err(refuse(format!("is {}; it names no host", shown(url))));
        }
        Ok(Self {
            url: url.to_string(),
            lease: Self::DEFAULT_LEASE,
        })
    }

    /// Leases of `lease`, between [`MIN_LEASE`](Self::MIN_LEASE) and
    /// [`MAX_LEASE`](Self::MAX_LEASE).
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, SettingError> {
        if !(Self::MIN_LEASE..=Self::MAX_LEASE).contains(&lease) {
            return Err(SettingError::new(
                "index_lease",
                format!(
                    "is {lease:?}; it must be between {:?} and {:?}",
                    Self::MIN_LEASE,
                    Self::MAX_LEASE
                ),
            ));
        }
        self.lease = lease;
        Ok(self)
    }

    /// The URL, as given (with any password: for the client, not logs).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL with any password replaced by `***`, for logs.
    pub fn shown_url(&self) -> String {
        shown(&self.url)
    }

    /// How long a lease holds unrenewed.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

impl fmt::Debug for IndexConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexConfig")
            .field("url", &self.shown_url())
            .field("lease", &self.lease)
            .finish()
    }
}

/// `url` with the password of its user part replaced by `***`.
fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "a URL without a scheme".to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_never_shown() {
        for good in [
            "redis://127.0.0.1:6379",
            "rediss://cache.internal:6380/2",
            "valkey://user:pw@10.0.0.1",
            "redis+unix:///run/valkey.sock",
        ] {
            assert!(IndexConfig::new(good).is_ok(), "{good}");
        }
        for bad in ["", "127.0.0.1:6379", "http://h:1", "redis://", "redis:///0"] {
            let error = IndexConfig::new(bad).unwrap_err();
            assert_eq!(error.setting, "index", "{bad}");
        }
        let error = IndexConfig::new("http://u:secret@h").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
        assert_eq!(shown("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
    }

    #[test]
    fn leases_have_a_range() {
        let index = IndexConfig::new("redis://h").unwrap();
        assert_eq!(index.lease(), IndexConfig::DEFAULT_LEASE);
        assert!(
            index
                .clone()
                .with_lease(Duration::from_millis(299))
                .is_err()
        );
        assert!(index.clone().with_lease(Duration::from_secs(3601)).is_err());
        let error = index.with_lease(Duration::ZERO).unwrap_err();
        assert_eq!(error.setting, "index_lease");
    }
}
