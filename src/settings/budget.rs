//! A byte budget's settings: the one way every tier takes them.

use std::num::NonZeroU64;
use std::time::Duration;

use super::error::SettingError;
use super::values::{duration, rescan_interval};
use crate::capacity::Policy;

/// A tier's byte budget: its capacity (at least one byte), the policy that
/// picks victims, how old a temporary file must be for a scan to delete it
/// as a dead writer's, and how often the books are reconciled with the
/// store (`None`: only at start). Built checked, so a tier that takes one
/// ([`FsOptions::budget`](crate::tier::FsOptions::budget),
/// `ObjectTier::with_budget`, `VllmTransfers::set_budget`) checks nothing
/// again.
///
/// ```
/// use std::time::Duration;
/// use kvtier::settings::BudgetConfig;
///
/// let budget = BudgetConfig::new(1 << 30)?.with_stale_temp_age(Some(Duration::from_secs(60)))?;
/// assert_eq!(budget.stale_temp_age(), Some(Duration::from_secs(60)));
/// assert_eq!(budget.rescan_interval(), None);
/// let error = BudgetConfig::new(0).unwrap_err();
/// assert_eq!(error.to_string(), "capacity_bytes is 0; it must be at least 1 byte");
/// # Ok::<(), kvtier::settings::SettingError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetConfig {
    capacity: NonZeroU64,
    policy: Policy,
    stale_temp_age: Option<Duration>,
    rescan_interval: Option<Duration>,
}

impl BudgetConfig {
    /// How old a temporary file is before a scan deletes it, by default:
    /// 10 minutes, longer than the slowest store on a mount.
    pub const DEFAULT_STALE_TEMP_AGE: Duration = Duration::from_secs(600);

    /// A budget of `capacity_bytes` (at least 1), LRU, temporary files
    /// swept after [`DEFAULT_STALE_TEMP_AGE`](Self::DEFAULT_STALE_TEMP_AGE),
    /// no rescans.
    pub fn new(capacity_bytes: u64) -> Result<Self, SettingError> {
        // guard: H9-a-budget-holds-a-byte
        let capacity = NonZeroU64::new(capacity_bytes).ok_or_else(|| {
            SettingError::new("capacity_bytes", "is 0; it must be at least 1 byte")
        })?;
        Ok(Self {
            capacity,
            policy: Policy::Lru,
            stale_temp_age: Some(Self::DEFAULT_STALE_TEMP_AGE),
            rescan_interval: None,
        })
    }

    /// The policy that picks victims.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How old a temporary file must be for a scan (at start, at each
    /// reconcile) to delete it as a dead writer's; `None`: never (a
    /// younger file may be a live writer's in another process). At most a
    /// day.
    pub fn with_stale_temp_age(mut self, age: Option<Duration>) -> Result<Self, SettingError> {
        self.stale_temp_age = age.map(|age| duration("stale_temp_age", age)).transpose()?;
        Ok(self)
    }

    /// How often the books are reconciled with the store on a thread of
    /// the tier's own (`None`: only at start): set it when several
    /// processes share the store with the same budget. From
    /// [`MIN_RESCAN_INTERVAL`](super::MIN_RESCAN_INTERVAL) to a day.
    pub fn with_rescan_interval(
        mut self,
        interval: Option<Duration>,
    ) -> Result<Self, SettingError> {
        self.rescan_interval = interval
            .map(|interval| rescan_interval("rescan_interval", interval))
            .transpose()?;
        Ok(self)
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> NonZeroU64 {
        self.capacity
    }

    /// The eviction policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The stale-temporary-file age (`None`: never swept).
    pub fn stale_temp_age(&self) -> Option<Duration> {
        self.stale_temp_age
    }

    /// The rescan interval (`None`: only at start).
    pub fn rescan_interval(&self) -> Option<Duration> {
        self.rescan_interval
    }

    /// The age past which a scan deletes a temporary file (a duration no
    /// file reaches when none is).
    pub fn sweep_age(&self) -> Duration {
        self.stale_temp_age.unwrap_or(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_holds_a_byte_and_its_durations_a_day() {
        let zero = BudgetConfig::new(0).unwrap_err();
        assert_eq!(zero.setting, "capacity_bytes");
        let budget = BudgetConfig::new(1).expect("one byte is a budget");
        assert_eq!(budget.capacity().get(), 1);
        assert_eq!(budget.sweep_age(), BudgetConfig::DEFAULT_STALE_TEMP_AGE);
        let never = budget.with_stale_temp_age(None).unwrap();
        assert_eq!(never.sweep_age(), Duration::MAX);
        let day = Duration::from_secs(86_400);
        assert!(budget.with_stale_temp_age(Some(day)).is_ok());
        let error = budget
            .with_stale_temp_age(Some(day + Duration::from_secs(1)))
            .unwrap_err();
        assert_eq!(error.setting, "stale_temp_age");
        assert!(budget.with_rescan_interval(Some(day)).is_ok());
        assert!(budget.with_rescan_interval(Some(Duration::ZERO)).is_err());
    }
}
