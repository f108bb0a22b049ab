//! The bounds a [`LookupTable`](super::LookupTable) keeps on what waits for
//! a tier: how long a key may stay pending, and how much may be outstanding.

use std::time::Duration;

use super::error::LookupError;

/// Bounds on a lookup: a pending budget (deadline) and admission limits.
///
/// - **Deadline.** A key whose probe has not been answered within its
///   budget — counted in scheduler steps (flushes), in time, or both,
///   from the step that first looked it up, so time spent queued in front
///   of the backend counts — is answered [`Verdict::Miss`](super::Verdict::Miss)
///   from then on (counted in [`LookupStats::deadline_misses`](super::LookupStats::deadline_misses)):
///   the scheduler computes the block instead of waiting. The probe goes
///   on; its answer, if it comes, resolves the key for later lookups.
///   Off by default: a budget depends on the scheduler's step length.
/// - **Admission.** At most `max_outstanding_keys` keys and
///   `max_outstanding_groups` groups are pending or with the prober at once.
///   A new key that does not fit is answered `Miss` at once and leaves no
///   state (counted in [`LookupStats::shed`](super::LookupStats::shed)), so
///   the table and the prober's queue stay bounded however far the tier
///   falls behind. On by default, with generous bounds.
/// - **Unwanted groups.** A group all of whose keys lost their requests
///   before its probe started is not probed, and the tokio prober drops a
///   running probe that becomes unwanted (counted in
///   [`LookupStats::abandoned`](super::LookupStats::abandoned)). On by default.
///
/// A scheduler stepping every 20 ms that gives the tier at most 250 ms, and
/// lets at most 10,000 keys wait for it:
///
/// ```
/// use std::time::Duration;
/// use kvtier::lookup::LookupLimits;
///
/// let limits = LookupLimits::default()
///     .pending_time(Some(Duration::from_millis(250)))
///     .max_outstanding_keys(10_000);
/// assert!(limits.validate().is_ok());
/// assert_eq!(limits.get_pending_steps(), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupLimits {
    pub(crate) pending_steps: Option<u64>,
    pub(crate) pending_time: Option<Duration>,
    pub(crate) max_outstanding_keys: usize,
    pub(crate) max_outstanding_groups: usize,
    pub(crate) skip_unwanted: bool,
}

/// The largest budget in steps, and the longest in time, a setting may
/// have: beyond them a budget is a typo, not a bound.
pub(crate) const MAX_PENDING_STEPS: u64 = 1 << 32;
pub(crate) const MAX_PENDING_TIME: Duration = Duration::from_secs(24 * 60 * 60);
/// The most keys outstanding a setting may allow: the interest counters of
/// groups are 32-bit.
pub(crate) const MAX_OUTSTANDING: usize = (u32::MAX - 1) as usize;

impl Default for LookupLimits {
    /// No deadline; at most 2^20 keys and 2^16 groups outstanding;
    /// unwanted groups are not probed.
    fn default() -> Self {
        Self {
            pending_steps: None,
            pending_time: None,
            max_outstanding_keys: 1 << 20,
            max_outstanding_groups: 1 << 16,
            skip_unwanted: true,
        }
    }
}

impl LookupLimits {
    /// No bounds at all: no deadline, unlimited admission, every group
    /// probed. What a table did before it had limits; for comparisons.
    pub fn unbounded() -> Self {
        Self {
            pending_steps: None,
            pending_time: None,
            max_outstanding_keys: MAX_OUTSTANDING,
            max_outstanding_groups: MAX_OUTSTANDING,
            skip_unwanted: false,
        }
    }

    /// The budget in steps (1 to 2^32): a key first looked up in step `s`
    /// and still unanswered at the end of step `s + steps - 1` is a miss
    /// from step `s + steps` on. With 1, a key is pending only in the step
    /// that first looked it up. `None`: no budget in steps.
    pub fn pending_steps(mut self, steps: Option<u64>) -> Self {
        self.pending_steps = steps;
        self
    }

    /// The budget in time (above zero, at most a day), measured from the
    /// start of the step that first looked the key up, and checked at each
    /// flush: a verdict comes at most one step after the budget ran out.
    /// Needs the flushes to say when they happen
    /// ([`Lookup::flush`](crate::Lookup::flush) reads the clock when this is
    /// set; [`LookupTable::take_submission_at`](super::LookupTable::take_submission_at)
    /// takes the time). `None`: no budget in time.
    pub fn pending_time(mut self, budget: Option<Duration>) -> Self {
        self.pending_time = budget;
        self
    }

    /// The most keys pending or with the prober at once (at least 1).
    pub fn max_outstanding_keys(mut self, keys: usize) -> Self {
        self.max_outstanding_keys = keys;
        self
    }

    /// The most request groups pending or with the prober at once (at least 1).
    pub fn max_outstanding_groups(mut self, groups: usize) -> Self {
        self.max_outstanding_groups = groups;
        self
    }

    /// Whether a group nobody wants any more is left unprobed (see the type's docs).
    pub fn skip_unwanted(mut self, skip: bool) -> Self {
        self.skip_unwanted = skip;
        self
    }

    /// The budget in steps.
    pub fn get_pending_steps(&self) -> Option<u64> {
        self.pending_steps
    }

    /// The budget in time.
    pub fn get_pending_time(&self) -> Option<Duration> {
        self.pending_time
    }

    /// The bound on outstanding keys.
    pub fn get_max_outstanding_keys(&self) -> usize {
        self.max_outstanding_keys
    }

    /// The bound on outstanding groups.
    pub fn get_max_outstanding_groups(&self) -> usize {
        self.max_outstanding_groups
    }

    /// Whether unwanted groups are left unprobed.
    pub fn get_skip_unwanted(&self) -> bool {
        self.skip_unwanted
    }

    /// Whether some deadline is set.
    pub(crate) fn has_deadline(&self) -> bool {
        self.pending_steps.is_some() || self.pending_time.is_some()
    }

    /// Checks every setting; the error says which is out of range and why.
    /// The table checks them too when it is given them.
    pub fn validate(&self) -> Result<(), LookupError> {
        if let Some(steps) = self.pending_steps
            && !(1..=MAX_PENDING_STEPS).contains(&steps)
        {
            return Err(LookupError::Config(format!(
                "pending_steps is {steps}; it must be 1 to {MAX_PENDING_STEPS}"
            )));
        }
        if let Some(budget) = self.pending_time
            && (budget.is_zero() || budget > MAX_PENDING_TIME)
        {
            return Err(LookupError::Config(format!(
                "pending_time is {budget:?}; it must be above zero and at most a day"
            )));
        }
        for (name, value) in [
            ("max_outstanding_keys", self.max_outstanding_keys),
            ("max_outstanding_groups", self.max_outstanding_groups),
        ] {
            if !(1..=MAX_OUTSTANDING).contains(&value) {
                return Err(LookupError::Config(format!(
                    "{name} is {value}; it must be 1 to {MAX_OUTSTANDING}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_settings_are_refused_with_their_name() {
        let cases = [
            (
                LookupLimits::default().pending_steps(Some(0)),
                "pending_steps",
            ),
            (
                LookupLimits::default().pending_steps(Some(MAX_PENDING_STEPS + 1)),
                "pending_steps",
            ),
            (
                LookupLimits::default().pending_time(Some(Duration::ZERO)),
                "pending_time",
            ),
            (
                LookupLimits::default().pending_time(Some(MAX_PENDING_TIME * 2)),
                "pending_time",
            ),
            (
                LookupLimits::default().max_outstanding_keys(0),
                "max_outstanding_keys",
            ),
            (
                LookupLimits::default().max_outstanding_groups(usize::MAX),
                "max_outstanding_groups",
            ),
        ];
        for (limits, name) in cases {
            let error = limits.validate().expect_err(name).to_string();
            assert!(error.contains(name), "{error}");
        }
        assert!(LookupLimits::default().validate().is_ok());
        assert!(LookupLimits::unbounded().validate().is_ok());
        let edges = LookupLimits::default()
            .pending_steps(Some(1))
            .pending_time(Some(MAX_PENDING_TIME))
            .max_outstanding_keys(1)
            .max_outstanding_groups(MAX_OUTSTANDING);
        assert!(edges.validate().is_ok());
    }
}
