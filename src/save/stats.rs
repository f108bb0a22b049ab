//! Counters of the save-completion protocol.

use crate::counters::counters;

counters! {
    /// A snapshot of a [`SaveTracker`](crate::SaveTracker)'s counters (one
    /// worker's view).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct SaveStats {
        /// Steps begun ([`SaveTracker::begin_step`](crate::SaveTracker::begin_step)).
        pub steps: u64,
        /// Requests that started being tracked (their free is delayed).
        pub recorded: u64,
        /// Tasks accepted by [`submit`](crate::SaveTracker::submit).
        pub tasks_submitted: u64,
        /// Submissions the store refused ([`submit_failed`](crate::SaveTracker::submit_failed)).
        pub submit_failures: u64,
        /// Tasks found complete by a non-blocking check and reaped.
        pub tasks_reaped: u64,
        /// Tasks waited for while still running: by a blocking `get_finished`, a
        /// preemption fence or [`wait_all`](crate::SaveTracker::wait_all).
        pub tasks_waited: u64,
        /// Tasks whose wait returned [`TaskError::Failed`](crate::save::TaskError::Failed).
        pub task_failures: u64,
        /// Tasks whose wait returned [`TaskError::TimedOut`](crate::save::TaskError::TimedOut).
        pub task_timeouts: u64,
        /// Tasks whose wait returned [`TaskError::Abandoned`](crate::save::TaskError::Abandoned).
        pub tasks_abandoned: u64,
        /// Panics caught in a task's `check` or `wait`.
        pub task_panics: u64,
        /// Requests reported by `get_finished` (each exactly once).
        pub reported: u64,
        /// Finished requests that could not be reported in the call that passed
        /// them (a task was still running); they are reported by a later call.
        pub deferred: u64,
        /// Finished ids that were never recorded as saving: not reported, since
        /// the scheduler did not delay their free.
        pub not_delayed: u64,
        /// Finished ids passed again after they had already finished (ignored).
        pub repeated_finishes: u64,
        /// Request ids submitted with a task although no step recorded them. The
        /// scheduler did not delay their free, so their blocks may be released
        /// while the task reads them: a bug in the caller, logged and counted.
        pub unrecorded_saves: u64,
        /// Preemption fences run: [`handle_preemptions`](crate::SaveTracker::handle_preemptions)
        /// calls, and steps with preempted requests.
        pub preemption_fences: u64,
    }
}

/// How long saves took, as a histogram with power-of-two buckets: bucket `i`
/// counts saves of less than 2^i microseconds (and at least 2^(i-1) for
/// `i > 0`); the last bucket also takes everything longer. Fixed-size and
/// `Copy`; it travels beside [`SaveStats`] (see
/// [`SaveTracker::latency`](crate::SaveTracker::latency)) and merges across workers by adding
/// buckets; a back-pressure policy can read a quantile from it.
///
/// A save's time runs from [`submit`](crate::SaveTracker::submit) to the
/// moment the tracker closed it: a task reaped by a poll counts up to that
/// poll, so the figure is an upper bound within the polling interval.
///
/// ```
/// use std::time::Duration;
/// use kvtier::save::SaveLatency;
///
/// let mut latency = SaveLatency::default();
/// for ms in [1, 2, 2, 3, 40] {
///     latency.record(Duration::from_millis(ms));
/// }
/// assert_eq!(latency.count(), 5);
/// // The median save took at most 2.048 ms (its bucket's upper bound).
/// assert_eq!(latency.quantile(0.5), Some(Duration::from_micros(2048)));
/// assert!(latency.max() >= Duration::from_millis(40));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveLatency {
    pub(crate) buckets: [u64; SaveLatency::BUCKETS],
}

impl Default for SaveLatency {
    fn default() -> Self {
        Self {
            buckets: [0; Self::BUCKETS],
        }
    }
}

impl SaveLatency {
    /// How many buckets: the last starts at 2^(BUCKETS-2) µs, about 76 hours.
    pub const BUCKETS: usize = 40;

    /// Counts one save that took `elapsed`.
    pub fn record(&mut self, elapsed: std::time::Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        // Bucket i holds [2^(i-1), 2^i) µs: the bit length of the value.
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        let bucket = bucket.min(Self::BUCKETS - 1);
        self.buckets[bucket] = self.buckets[bucket].saturating_add(1);
    }

    /// The saves counted.
    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |sum, count| sum.saturating_add(*count))
    }

    /// The per-bucket counts; bucket `i` holds saves shorter than
    /// [`bucket_bound(i)`](Self::bucket_bound).
    pub fn buckets(&self) -> &[u64; Self::BUCKETS] {
        &self.buckets
    }

    /// The exclusive upper bound of bucket `i`: 2^i µs (the last bucket has
    /// none; its bound is where it starts, doubled, as for the others).
    pub fn bucket_bound(i: usize) -> std::time::Duration {
        std::time::Duration::from_micros(1u64 << i.min(63))
    }

    /// An upper bound on the `q`-quantile (`q` in `[0, 1]`, clamped): the
    /// bound of the bucket holding it; `None` when nothing was counted.
    pub fn quantile(&self, q: f64) -> Option<std::time::Duration> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        // The rank of the quantile, 1-based: at least the first save.
        let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
        let mut seen = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            seen = seen.saturating_add(*bucket);
            if seen >= rank {
                return Some(Self::bucket_bound(i));
            }
        }
        Some(Self::bucket_bound(Self::BUCKETS - 1))
    }

    /// An upper bound on the longest save counted (zero when none was).
    pub fn max(&self) -> std::time::Duration {
        match self.buckets.iter().rposition(|count| *count > 0) {
            Some(i) => Self::bucket_bound(i),
            None => std::time::Duration::ZERO,
        }
    }

    /// Adds `other`'s counts (another worker's, another snapshot's delta).
    pub fn merge(&mut self, other: &SaveLatency) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_save_lands_in_the_bucket_of_its_bit_length() {
        let mut latency = SaveLatency::default();
        latency.record(Duration::ZERO);
        latency.record(Duration::from_micros(1));
        latency.record(Duration::from_micros(3));
        latency.record(Duration::from_micros(4));
        latency.record(Duration::from_secs(1 << 40));
        let buckets = latency.buckets();
        assert_eq!(&buckets[..4], &[1, 1, 1, 1]);
        assert_eq!(
            buckets[SaveLatency::BUCKETS - 1],
            1,
            "the last bucket takes the rest"
        );
        assert_eq!(latency.count(), 5);
        assert_eq!(latency.quantile(0.0), Some(Duration::from_micros(1)));
        assert_eq!(latency.quantile(0.6), Some(Duration::from_micros(4)));
        assert_eq!(
            latency.quantile(f64::NAN),
            Some(SaveLatency::bucket_bound(39))
        );
        assert_eq!(SaveLatency::default().quantile(0.5), None);
        assert_eq!(SaveLatency::default().max(), Duration::ZERO);
    }

    #[test]
    fn merging_adds_the_buckets() {
        let mut a = SaveLatency::default();
        let mut b = SaveLatency::default();
        a.record(Duration::from_millis(1));
        b.record(Duration::from_millis(1));
        b.record(Duration::from_millis(100));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.max(), SaveLatency::bucket_bound(17));
    }
}
