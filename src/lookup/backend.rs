//! The storage side of a lookup: the blocking backend trait, the
//! fault-proof call the thread prober makes for each group, and the one
//! place where every built-in prober turns how a call ended into a result.

use std::convert::Infallible;
use std::fmt::Display;
use std::panic::{self, AssertUnwindSafe};

use super::submission::{Group, GroupOutcome, GroupResult, collect_answers};
use super::types::Request;
use crate::fault::take_panic;

/// A blocking tier that can say whether it holds blocks, one request group
/// at a time: what the [`ThreadProber`](super::ThreadProber) probes.
///
/// Called from the prober's worker thread, never from the scheduler. The
/// answers may be any iterator (a `Vec<bool>`, or a lazy iterator that does
/// I/O as it is consumed); the worker consumes at most one answer more than
/// there are keys.
///
/// Faults never reach the scheduler as anything but misses: an `Err` makes
/// every key of the group a miss; a panic, in the call or while its answers
/// are consumed, is caught and makes every unanswered key a miss (the worker
/// keeps serving with the same backend value, so a backend that can be left
/// inconsistent by a panic should recover on its next call); fewer answers
/// than keys make the rest misses; surplus answers are ignored. Each fault is
/// logged and counted in [`LookupStats`](super::LookupStats).
///
/// ```
/// use std::collections::HashSet;
/// use kvtier::lookup::Backend;
///
/// /// A tier that holds a fixed set of block hashes.
/// struct Resident(HashSet<u64>);
///
/// impl Backend<u64, String> for Resident {
///     type Answers = Vec<bool>;
///     type Error = std::convert::Infallible;
///
///     fn batch_lookup(&mut self, keys: &[u64], _request: &String) -> Result<Vec<bool>, Self::Error> {
///         Ok(keys.iter().map(|key| self.0.contains(key)).collect())
///     }
/// }
/// ```
pub trait Backend<K, R> {
    /// One answer per key, in key order.
    type Answers: IntoIterator<Item = bool>;
    /// Why a whole group could not be answered.
    type Error: Display;

    /// Says, for each of `keys`, whether the tier holds it. `request` is the
    /// request whose lookups created the group, as context.
    fn batch_lookup(&mut self, keys: &[K], request: &R) -> Result<Self::Answers, Self::Error>;

    /// Runs `group`: one group's [`batch_lookup`](Self::batch_lookup) and
    /// the publication of its answers to the scheduler, as one piece. The
    /// default runs it as it is.
    ///
    /// A backend whose effects others observe under a lock of its own
    /// overrides this to hold that lock across the whole piece, so that
    /// whoever sees what a call did also sees the group's answers: kvtier's
    /// Python backend holds the GIL, so a Python scheduler that sees an
    /// event its `batch_lookup` set finds the answers at its next lookup, as
    /// vLLM's own tests expect (L17).
    ///
    /// The override must call `group` once, on the calling thread. If it
    /// panics first or never calls it, the group's keys become misses;
    /// a panic after the call is caught and logged.
    fn around_group(&mut self, group: impl FnOnce(&mut Self))
    where
        Self: Sized,
    {
        group(self);
    }
}

/// Any closure `FnMut(&[K], &R) -> Vec<bool>` is an infallible backend.
impl<K, R, F> Backend<K, R> for F
where
    F: FnMut(&[K], &R) -> Vec<bool>,
{
    type Answers = Vec<bool>;
    type Error = Infallible;

    fn batch_lookup(&mut self, keys: &[K], request: &R) -> Result<Vec<bool>, Infallible> {
        Ok(self(keys, request))
    }
}

/// How one backend call for a group ended, before it becomes a result.
pub(crate) enum CallEnd {
    /// The call returned answers (collected into `found`); `surplus` says
    /// whether there were more than keys.
    Answers { surplus: bool },
    /// The call returned an error, formatted.
    Error(String),
    /// The call, or consuming its answers, panicked; the panic's message.
    Panic(String),
    /// The call did not finish within the driver's timeout (only the tasks
    /// driver has one).
    #[cfg_attr(not(tokio_driver), allow(dead_code))]
    TimedOut,
}

// guard: L6-catch-panics
/// Probes one group, turning every fault into misses (see [`Backend`]).
pub(crate) fn probe_group<K, R, B>(backend: &mut B, mut group: Group<K, R>) -> GroupResult<K>
where
    R: Request,
    B: Backend<K, R>,
{
    let limit = group.len();
    let mut found = group.found_buffer();
    // guard: L6-catch-panics
    let call = panic::catch_unwind(AssertUnwindSafe(|| {
        // Everything that runs backend code stays inside this closure: the
        // call, consuming a lazy answer iterator, dropping it, and formatting
        // the error.
        match backend.batch_lookup(group.keys(), group.request()) {
            Ok(answers) => CallEnd::Answers {
                surplus: collect_answers(answers, limit, &mut found),
            },
            Err(error) => CallEnd::Error(error.to_string()),
        }
    }));
    let end = call.unwrap_or_else(|payload| CallEnd::Panic(take_panic(payload)));
    settle(group, found, end)
}

/// Probes one group through the backend's [`Backend::around_group`] and
/// hands the result to `publish` inside it (L17), so the backend decides
/// what the call and its publication happen under. A group the override
/// never ran (it panicked first, or did not call it) is published as a
/// panic: its keys are misses, as for any fault. A panic of the override
/// after the group was published is logged. A panic between (not the
/// backend's: `probe_group` catches those, so kvtier's own code or the
/// request's) goes on unwinding, as it would without the override.
pub(crate) fn probe_and_publish<K, R, B>(
    backend: &mut B,
    group: Group<K, R>,
    publish: impl FnOnce(GroupResult<K>),
) where
    R: Request,
    B: Backend<K, R>,
{
    let mut pending = Some((group, publish));
    let mut published = false;
    // guard: L17-publish-inside-around-group
    let run = panic::catch_unwind(AssertUnwindSafe(|| {
        backend.around_group(|backend| {
            if let Some((group, publish)) = pending.take() {
                publish(probe_group(backend, group));
                published = true;
            }
        });
    }));
    match (pending.take(), run) {
        (Some((group, publish)), run) => {
            let why = match run {
                Ok(()) => "the backend's around_group did not run the group".to_owned(),
                Err(payload) => take_panic(payload),
            };
            publish(settle(group, Vec::new(), CallEnd::Panic(why)));
        }
        (None, Err(payload)) if published => tracing::error!(
            panic = %take_panic(payload),
            "backend panicked in around_group after its group was published"
        ),
        (None, Err(payload)) => panic::resume_unwind(payload),
        (None, Ok(())) => {}
    }
}

/// Turns how a call ended into the group's result, logging each fault where
/// its outcome is decided, so the log and the counters the table keeps from
/// the outcome cannot disagree. Every driver ends every call here.
pub(crate) fn settle<K, R: Request>(
    group: Group<K, R>,
    found: Vec<bool>,
    end: CallEnd,
) -> GroupResult<K> {
    let request = group.request().id();
    let limit = group.len();
    let outcome = match end {
        CallEnd::Answers { surplus } => {
            let outcome = GroupOutcome::of_answers(found.len(), limit, surplus);
            match outcome {
                GroupOutcome::Short { answered } => tracing::warn!(
                    ?request,
                    keys = limit,
                    answered,
                    "backend gave fewer answers than keys; the rest are misses"
                ),
                GroupOutcome::Surplus => tracing::warn!(
                    ?request,
                    keys = limit,
                    "backend gave more answers than keys; the surplus is ignored"
                ),
                _ => {}
            }
            outcome
        }
        CallEnd::Error(error) => {
            tracing::warn!(
                ?request, keys = limit, %error,
                "backend lookup failed; the group's keys are misses"
            );
            GroupOutcome::BackendError
        }
        CallEnd::Panic(message) => {
            let answered = found.len().min(limit);
            tracing::error!(
                ?request, keys = limit, answered, panic = %message,
                "backend panicked; unanswered keys are misses"
            );
            GroupOutcome::BackendPanic { answered }
        }
        CallEnd::TimedOut => {
            tracing::warn!(
                ?request,
                keys = limit,
                "backend did not answer within the group timeout; the group's keys are misses"
            );
            GroupOutcome::TimedOut
        }
    };
    group.finish(found, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lookup::types::Generation;

    /// Probes keys 1 and 2 for request 9 with `backend`; returns the outcome
    /// and what was logged.
    fn probe_logged(mut backend: impl Backend<u64, u64>) -> (GroupOutcome, String) {
        let mut group = Group::new(crate::lookup::types::TableId::new(), 9u64, 0);
        group.keys = vec![1, 2];
        group.generations = vec![Generation(0), Generation(1)];
        crate::fault::logged(|| probe_group(&mut backend, group).outcome())
    }

    #[test]
    fn each_fault_is_logged_with_its_outcome_and_a_clean_answer_is_not() {
        let (outcome, log) = probe_logged(|_: &[u64], _: &u64| vec![true, false]);
        assert_eq!(outcome, GroupOutcome::Answered);
        assert_eq!(log, "");

        let (outcome, log) = probe_logged(|_: &[u64], _: &u64| vec![true]);
        assert_eq!(outcome, GroupOutcome::Short { answered: 1 });
        assert!(
            log.contains("fewer answers than keys") && log.contains("WARN"),
            "{log}"
        );

        let (outcome, log) = probe_logged(|_: &[u64], _: &u64| vec![true, true, true]);
        assert_eq!(outcome, GroupOutcome::Surplus);
        assert!(log.contains("more answers than keys"), "{log}");

        let (outcome, log) =
            probe_logged(|_: &[u64], _: &u64| -> Vec<bool> { panic!("disk on fire") });
        assert_eq!(outcome, GroupOutcome::BackendPanic { answered: 0 });
        assert!(
            log.contains("backend panicked") && log.contains("disk on fire"),
            "{log}"
        );
    }

    /// A backend whose `around_group` does `how` instead of simply running
    /// the group.
    struct Around(&'static str);

    impl Backend<u64, u64> for Around {
        type Answers = Vec<bool>;
        type Error = Infallible;

        fn batch_lookup(&mut self, keys: &[u64], _: &u64) -> Result<Vec<bool>, Infallible> {
            Ok(vec![true; keys.len()])
        }

        fn around_group(&mut self, group: impl FnOnce(&mut Self)) {
            match self.0 {
                "skips" => {}
                "panics first" => panic!("lock poisoned"),
                "panics after" => {
                    group(self);
                    panic!("unlock failed");
                }
                _ => group(self),
            }
        }
    }

    /// Probes keys 1 and 2 for request 9 through `probe_and_publish`; the
    /// outcome published (exactly once) and what was logged.
    fn published_logged(mut backend: Around) -> (GroupOutcome, String) {
        let mut group = Group::new(crate::lookup::types::TableId::new(), 9u64, 0);
        group.keys = vec![1, 2];
        group.generations = vec![Generation(0), Generation(1)];
        crate::fault::logged(|| {
            let mut published = Vec::new();
            probe_and_publish(&mut backend, group, |result| {
                published.push(result.outcome())
            });
            assert_eq!(published.len(), 1, "published {published:?}");
            published[0]
        })
    }

    #[test]
    fn a_group_is_published_once_however_around_group_behaves() {
        assert_eq!(
            published_logged(Around("runs")),
            (GroupOutcome::Answered, String::new())
        );

        // Never run: published as a fault, its keys misses.
        for how in ["skips", "panics first"] {
            let (outcome, log) = published_logged(Around(how));
            assert_eq!(outcome, GroupOutcome::BackendPanic { answered: 0 }, "{how}");
            assert!(log.contains("backend panicked"), "{how}: {log}");
        }
        let (_, log) = published_logged(Around("skips"));
        assert!(log.contains("did not run the group"), "{log}");
        let (_, log) = published_logged(Around("panics first"));
        assert!(log.contains("lock poisoned"), "{log}");

        // Run, then a panic: the answers stand, the panic is logged.
        let (outcome, log) = published_logged(Around("panics after"));
        assert_eq!(outcome, GroupOutcome::Answered);
        assert!(
            log.contains("after its group was published") && log.contains("unlock failed"),
            "{log}"
        );
    }

    struct Failing;

    impl Backend<u64, u64> for Failing {
        type Answers = Vec<bool>;
        type Error = &'static str;

        fn batch_lookup(&mut self, _: &[u64], _: &u64) -> Result<Vec<bool>, &'static str> {
            Err("bucket gone")
        }
    }

    #[test]
    fn a_backend_error_is_logged_with_its_text() {
        let (outcome, log) = probe_logged(Failing);
        assert_eq!(outcome, GroupOutcome::BackendError);
        assert!(
            log.contains("backend lookup failed") && log.contains("bucket gone"),
            "{log}"
        );
    }
}
