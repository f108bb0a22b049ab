//! How long groups wait for their verdicts, for a driver that exports it
//! (a metrics endpoint): the time from the flush that submitted a group to
//! the call that applied its answers to the table, that is, until the
//! scheduler could see them. The table stays clock-free; this sits in the
//! [`Lookup`](super::Lookup) driver and is off until asked for.

use std::collections::VecDeque;
use std::time::Instant;

/// The flushes remembered: a group submitted earlier than the oldest of
/// them is applied untimed. Far more than any prober keeps in flight.
const FLUSHES_KEPT: usize = 1024;

/// Samples kept between two [`take`](VerdictClock::take)s; more are
/// counted as dropped, not kept (memory stays bounded when nobody reads).
pub(crate) const SAMPLES_KEPT: usize = 16_384;

/// The flushes' instants and the samples taken since the last read.
#[derive(Debug, Default)]
pub(crate) struct VerdictClock {
    /// (sequence number of the first group submitted, when), oldest first.
    flushes: VecDeque<(u64, Instant)>,
    samples: Vec<f64>,
    dropped: u64,
}

impl VerdictClock {
    /// A flush submitted groups numbered from `first_seq` on.
    pub(crate) fn flushed(&mut self, first_seq: u64, at: Instant) {
        if self.flushes.len() == FLUSHES_KEPT {
            self.flushes.pop_front();
        }
        self.flushes.push_back((first_seq, at));
    }

    /// The group numbered `seq` was applied `at`.
    pub(crate) fn applied(&mut self, seq: u64, at: Instant) {
        // The last flush that submitted a group numbered seq or lower
        // submitted this one: group numbers only grow.
        let after = self.flushes.partition_point(|&(first, _)| first <= seq);
        let Some(&(_, flushed)) = after.checked_sub(1).and_then(|i| self.flushes.get(i)) else {
            return;
        };
        if self.samples.len() < SAMPLES_KEPT {
            self.samples
                .push(at.saturating_duration_since(flushed).as_secs_f64());
        } else {
            self.dropped += 1;
        }
    }

    /// The seconds each group applied since the last call waited for its
    /// verdict, and how many more were not kept.
    pub(crate) fn take(&mut self) -> (Vec<f64>, u64) {
        (
            std::mem::take(&mut self.samples),
            std::mem::take(&mut self.dropped),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_group_is_timed_from_the_flush_that_submitted_it() {
        let mut clock = VerdictClock::default();
        let start = Instant::now();
        clock.applied(0, start); // before any flush: untimed
        clock.flushed(0, start); // groups 0 and 1
        clock.flushed(2, start + Duration::from_millis(10)); // group 2
        clock.applied(2, start + Duration::from_millis(15));
        clock.applied(1, start + Duration::from_millis(20));
        let (samples, dropped) = clock.take();
        assert_eq!(dropped, 0);
        let millis: Vec<u64> = samples
            .iter()
            .map(|s| (s * 1000.0).round() as u64)
            .collect();
        assert_eq!(millis, [5, 20]);
        assert!(clock.take().0.is_empty(), "taken once");
    }

    #[test]
    fn memory_stays_bounded_when_nobody_reads() {
        let mut clock = VerdictClock::default();
        let now = Instant::now();
        for seq in 0..(FLUSHES_KEPT as u64 + 10) {
            clock.flushed(seq, now);
        }
        assert_eq!(clock.flushes.len(), FLUSHES_KEPT);
        for seq in 0..(SAMPLES_KEPT as u64 + 5) {
            clock.applied(seq + 10, now);
        }
        let (samples, dropped) = clock.take();
        assert_eq!((samples.len(), dropped), (SAMPLES_KEPT, 5));
    }
}
