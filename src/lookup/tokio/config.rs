//! Settings of the tokio prober, validated when it starts.

use std::time::Duration;

use crate::lookup::error::LookupError;

/// Settings of a [`TokioProber`](super::TokioProber). Start from `TokioConfig::default()` and
/// change what you need:
///
/// ```
/// use std::time::Duration;
/// use kvtier::lookup::TokioConfig;
///
/// let config = TokioConfig::default()
///     .max_concurrent_groups(8)
///     .group_timeout(Some(Duration::from_millis(500)));
/// assert_eq!(config.get_max_concurrent_groups(), 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokioConfig {
    pub(super) max_concurrent_groups: usize,
    pub(super) group_timeout: Option<Duration>,
    pub(super) shutdown_grace: Duration,
    pub(super) worker_threads: usize,
}

impl Default for TokioConfig {
    /// Four groups at once, a 2 s timeout per group, 1 s of grace at
    /// shutdown, two runtime threads when the driver owns its runtime.
    fn default() -> Self {
        Self {
            max_concurrent_groups: 4,
            group_timeout: Some(Duration::from_secs(2)),
            shutdown_grace: Duration::from_secs(1),
            worker_threads: 2,
        }
    }
}

impl TokioConfig {
    /// How many groups are probed at once (at least 1). With 1, groups are
    /// probed and published strictly in submission order, as by the
    /// [`ThreadProber`](crate::lookup::ThreadProber).
    pub fn max_concurrent_groups(mut self, groups: usize) -> Self {
        self.max_concurrent_groups = groups;
        self
    }

    /// How long one backend call may take; a group that takes longer has
    /// its future dropped and every key becomes a miss (counted in
    /// [`LookupStats::timeouts`](crate::lookup::LookupStats::timeouts)). `None` waits forever, which also makes
    /// shutdown cancel such a call after the grace period instead.
    pub fn group_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.group_timeout = timeout;
        self
    }

    /// How long shutdown lets queued and running groups
    /// finish before it cancels them. Zero cancels at once; a grace too long
    /// to end (`Duration::MAX`) waits for them.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Threads of the runtime [`Lookup::tokio`](crate::Lookup::tokio) builds (1 to 1024);
    /// unused with [`Lookup::tokio_on`](crate::Lookup::tokio_on).
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.worker_threads = threads;
        self
    }

    /// The configured concurrency.
    pub fn get_max_concurrent_groups(&self) -> usize {
        self.max_concurrent_groups
    }

    /// The configured per-group timeout.
    pub fn get_group_timeout(&self) -> Option<Duration> {
        self.group_timeout
    }

    /// The configured shutdown grace period.
    pub fn get_shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    /// The configured runtime threads.
    pub fn get_worker_threads(&self) -> usize {
        self.worker_threads
    }

    /// Checks every setting; the error says which is out of range and why.
    /// [`Lookup::tokio`](crate::Lookup::tokio) and
    /// [`Lookup::tokio_on`](crate::Lookup::tokio_on) check them too.
    pub fn validate(&self) -> Result<(), LookupError> {
        // guard: H6-prober-settings-capped
        if !(1..=MAX_CONCURRENT_GROUPS).contains(&self.max_concurrent_groups) {
            return Err(LookupError::Config(format!(
                "max_concurrent_groups is {}; it must be 1 to {MAX_CONCURRENT_GROUPS}",
                self.max_concurrent_groups
            )));
        }
        if self.group_timeout == Some(Duration::ZERO) {
            return Err(LookupError::Config(
                "a zero group_timeout would make every key a miss; use a positive timeout or None"
                    .into(),
            ));
        }
        if !(1..=MAX_WORKER_THREADS).contains(&self.worker_threads) {
            return Err(LookupError::Config(format!(
                "worker_threads is {}; it must be 1 to {MAX_WORKER_THREADS}",
                self.worker_threads
            )));
        }
        Ok(())
    }
}

/// The most groups probed at once: far more than any tier serves, and a
/// caller's number never sizes a semaphore unchecked.
pub(super) const MAX_CONCURRENT_GROUPS: usize = crate::settings::MAX_CONCURRENT_GROUPS;

/// The most runtime threads [`Lookup::tokio`](crate::Lookup::tokio) starts: more only costs
/// memory (a million of them abort the process).
pub(super) const MAX_WORKER_THREADS: usize = crate::settings::MAX_IO_THREADS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_past_their_caps_are_configuration_errors() {
        let base = TokioConfig::default();
        assert!(base.clone().validate().is_ok());
        let too_far = [
            base.clone().max_concurrent_groups(0),
            base.clone()
                .max_concurrent_groups(MAX_CONCURRENT_GROUPS + 1),
            base.clone().max_concurrent_groups(1 << 62),
            base.clone().group_timeout(Some(Duration::ZERO)),
            base.clone().worker_threads(1 << 40),
        ];
        for config in too_far {
            let refused = config.validate();
            assert!(
                matches!(refused, Err(LookupError::Config(_))),
                "{refused:?}"
            );
        }
        assert!(
            base.max_concurrent_groups(MAX_CONCURRENT_GROUPS)
                .validate()
                .is_ok()
        );
    }
}
