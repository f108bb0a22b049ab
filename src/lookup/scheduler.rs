//! The scheduler's side of a lookup, written once: [`Lookup`] over any
//! [`Prober`].
//!
//! A [`Lookup`] owns the [`LookupTable`] and the receiving end of the
//! publication stack. Each scheduler call first applies what probers
//! published (one atomic load when nothing was), then asks the table; a
//! flush hands the step's [`Submission`] to the prober, which probes its
//! groups however it likes and publishes each group's result through its
//! [`Publisher`]. So publication, generation checks and stale-result
//! filtering are one piece of code whichever way the groups are probed: on a
//! worker thread ([`ThreadProber`](super::ThreadProber)), as tokio tasks
//! ([`TokioProber`](super::TokioProber)), or on a user's own executor.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::error::LookupError;
use super::limits::LookupLimits;
use super::stats::LookupStats;
use super::submission::{GroupOutcome, GroupResult, Submission};
use super::table::LookupTable;
use super::types::{Request, Ticket, Verdict};
use super::verdict_clock::VerdictClock;
use crate::publish::PublishStack;
use crate::sync::Arc;

/// Where a prober publishes the result of each group it was given.
///
/// Cheap to clone and `Send + Sync` (for `K: Send`): give one to every
/// thread or task that finishes groups. Publishing never blocks and never
/// waits for the scheduler; the result is applied by the scheduler's next
/// call. Each group must be published exactly once: a group never published
/// leaves its keys pending (until the key's requests are cleaned up), and a
/// second result for one group is counted as an anomaly and ignored.
pub struct Publisher<K> {
    stack: Arc<PublishStack<GroupResult<K>>>,
}

impl<K> Publisher<K> {
    /// Hands `result` to the scheduler.
    pub fn publish(&self, result: GroupResult<K>) {
        self.stack.push(result);
    }
}

impl<K> Clone for Publisher<K> {
    fn clone(&self) -> Self {
        Self {
            stack: self.stack.clone(),
        }
    }
}

impl<K> fmt::Debug for Publisher<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

/// A submission a prober could not take, handed back with the reason.
///
/// [`Lookup::flush`] answers every group of it as
/// [`GroupOutcome::Cancelled`] (its keys become misses, none stays in flight)
/// and returns the error.
#[derive(Debug)]
pub struct Refused<K, R> {
    /// The groups that were not taken.
    pub submission: Submission<K, R>,
    /// Why.
    pub error: LookupError,
}

/// How a [`Lookup`] has its groups probed: the seam between the sans-IO
/// table and whatever runs backend calls.
///
/// [`Lookup`] calls these methods from the scheduler thread, and calls
/// [`shutdown`](Self::shutdown) exactly once (from [`Lookup::shutdown`] or
/// from its `Drop`); no method is called after it. The prober answers every
/// group it takes, exactly once, through the [`Publisher`] it was built with,
/// using the constructors on [`Group`](super::Group) (`answered`, `failed`,
/// `timed_out`, `cancelled`, `panicked`).
///
/// A prober that runs groups on a caller-supplied executor:
///
/// ```
/// use std::sync::mpsc;
/// use kvtier::lookup::{Group, Lookup, LookupError, Prober, Publisher, Refused, Submission};
///
/// /// Probes every group inline at flush: "even keys are stored".
/// struct Inline(Publisher<u64>);
///
/// impl Prober<u64, u64> for Inline {
///     fn submit(&mut self, submission: Submission<u64, u64>) -> Result<(), Refused<u64, u64>> {
///         for group in submission.into_groups() {
///             let answers: Vec<bool> = group.keys().iter().map(|k| k % 2 == 0).collect();
///             self.0.publish(group.answered(answers));
///         }
///         Ok(())
///     }
///     fn wait_idle(&mut self) -> Result<(), LookupError> {
///         Ok(()) // everything is published by the time submit returns
///     }
///     fn shutdown(&mut self) -> Result<(), LookupError> {
///         Ok(())
///     }
/// }
///
/// let mut lookup = Lookup::with_prober(Inline);
/// assert!(lookup.lookup(&4, &1).is_pending());
/// lookup.flush()?;
/// assert!(lookup.lookup(&4, &1).is_hit());
/// assert!(lookup.lookup(&5, &1).is_pending());
/// # Ok::<(), LookupError>(())
/// ```
pub trait Prober<K, R> {
    /// Takes one step's groups. Must not wait for the backend. A prober
    /// that cannot take them (its worker is gone) hands them back.
    fn submit(&mut self, submission: Submission<K, R>) -> Result<(), Refused<K, R>>;

    /// Blocks until every group taken so far has been published.
    fn wait_idle(&mut self) -> Result<(), LookupError>;

    /// [`wait_idle`](Self::wait_idle) for at most about `limit`: `Ok(true)`
    /// once idle, `Ok(false)` if groups are still unpublished. A caller
    /// that must stay responsive (to a signal, say) waits in slices. The
    /// default waits without a limit.
    fn wait_idle_for(&mut self, limit: Duration) -> Result<bool, LookupError> {
        let _ = limit;
        self.wait_idle().map(|()| true)
    }

    /// Stops probing: every group taken is published (answered, or
    /// cancelled) unless the error says otherwise. Called exactly once.
    fn shutdown(&mut self) -> Result<(), LookupError>;
}

/// Async secondary-tier lookup for a scheduler: a [`LookupTable`] whose
/// request groups a [`Prober`] probes off the scheduler thread.
///
/// The scheduler thread owns this value and, every step:
///
/// - calls [`lookup`](Self::lookup) for each block a waiting request could
///   load: [`Verdict::Hit`] (load it), [`Verdict::Miss`] (compute it) or
///   [`Verdict::Pending`] (ask again next step);
/// - calls [`flush`](Self::flush) once at the end of the step, which hands
///   the keys looked up for the first time to the prober;
/// - calls [`mark_miss`](Self::mark_miss) when loading a hit failed, and
///   [`cleanup`](Self::cleanup) when a request ends.
///
/// None of these waits for the backend: probers publish each group's answers
/// as soon as that group is done, and every call applies whatever was
/// published first. [`wait_idle`](Self::wait_idle) and
/// [`shutdown`](Self::shutdown) do wait; they are for tests, demos and
/// orderly stops. Dropping the value shuts it down as `shutdown` does.
///
/// The built-in probers: [`Lookup::threaded`] (a worker thread probing a
/// blocking [`Backend`](super::Backend) one group at a time) and, with the
/// `tokio` feature, [`Lookup::tokio`] (several groups at once, each within a
/// timeout, over an [`AsyncBackend`](super::AsyncBackend)).
///
/// ```
/// use kvtier::{Lookup, Verdict};
///
/// // A backend is anything that answers a group of keys; here, "even keys are stored".
/// let backend = |keys: &[u64], _request: &String| keys.iter().map(|k| k % 2 == 0).collect();
/// let mut lookup = Lookup::threaded(backend)?;
/// let request = "req-1".to_string();
///
/// assert_eq!(lookup.lookup(&4, &request), Verdict::Pending);
/// assert_eq!(lookup.lookup(&5, &request), Verdict::Pending);
/// lookup.flush()?; // end of step: the worker probes the new keys
///
/// // A real scheduler just asks again next step; a test can wait instead.
/// lookup.wait_idle()?;
/// assert!(lookup.lookup(&4, &request).is_hit());
/// assert!(lookup.lookup(&5, &request).is_miss());
///
/// lookup.cleanup(&request);
/// let table = lookup.shutdown()?;
/// assert!(table.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Lookup<K, R: Request, P: Prober<K, R>> {
    table: LookupTable<K, R>,
    published: Publisher<K>,
    prober: P,
    /// False once the prober was shut down (by `shutdown`; `Drop` then
    /// leaves it alone).
    open: bool,
    /// Times groups from flush to verdict, once asked to
    /// ([`time_verdicts`](Self::time_verdicts)).
    verdict_clock: Option<Box<VerdictClock>>,
}

impl<K, R, P> Lookup<K, R, P>
where
    K: Eq + Hash + Clone,
    R: Request,
    P: Prober<K, R>,
{
    /// A lookup whose groups `make`'s prober probes; `make` gets the
    /// publisher the prober answers through.
    pub fn with_prober(make: impl FnOnce(Publisher<K>) -> P) -> Self {
        match Self::try_with_prober(|results| Ok::<P, std::convert::Infallible>(make(results))) {
            Ok(lookup) => lookup,
            Err(never) => match never {},
        }
    }

    /// [`with_prober`](Self::with_prober) for a prober whose start can fail.
    pub fn try_with_prober<E>(make: impl FnOnce(Publisher<K>) -> Result<P, E>) -> Result<Self, E> {
        let table = LookupTable::new();
        let published = Publisher {
            stack: Arc::new(PublishStack::new()),
        };
        let prober = make(published.clone())?;
        Ok(Self {
            table,
            published,
            prober,
            open: true,
            verdict_clock: None,
        })
    }

    /// What the tier knows about `key`, recording that `request` asked (see
    /// [`LookupTable::lookup`]). Applies everything published first, so an
    /// answer published mid-step is seen by the very next call.
    #[inline(always)]
    pub fn lookup(&mut self, key: &K, request: &R) -> Verdict<K> {
        // guard: L7-lookup-applies-published
        self.drain();
        self.table.lookup(key, request)
    }

    /// Looks up a request's `keys` in one call: their verdicts into
    /// `verdicts` (cleared first; reuse it across calls), and how many of the
    /// leading keys are hits — the blocks the request can load before the
    /// first one it must compute or wait for. The same as a
    /// [`lookup`](Self::lookup) per key, except that what was published is
    /// applied once, first (an answer published during the call is applied
    /// by the next one). For callers that pay per call, such as a
    /// scheduler across an FFI boundary.
    ///
    /// ```
    /// use kvtier::Lookup;
    ///
    /// let tier = |keys: &[u64], _request: &u64| keys.iter().map(|k| *k != 3).collect();
    /// let mut lookup = Lookup::threaded(tier)?;
    /// let mut verdicts = Vec::new();
    /// assert_eq!(lookup.lookup_all(&[1, 2, 3, 4], &9, &mut verdicts), 0);
    /// lookup.flush()?;
    /// lookup.wait_idle()?;
    /// // 1 and 2 can be loaded; 3 is not stored, so the request computes from there.
    /// assert_eq!(lookup.lookup_all(&[1, 2, 3, 4], &9, &mut verdicts), 2);
    /// assert!(verdicts[3].is_hit());
    /// # Ok::<(), kvtier::LookupError>(())
    /// ```
    #[inline]
    pub fn lookup_all(&mut self, keys: &[K], request: &R, verdicts: &mut Vec<Verdict<K>>) -> usize {
        // guard: L12-batched-lookup-applies-published
        self.drain();
        self.table.lookup_all(keys, request, verdicts)
    }

    /// Ends the step: hands the keys looked up for the first time since the
    /// last flush to the prober (nothing when there are none). Never waits
    /// for the backend. Returns how many keys were handed over.
    ///
    /// When the prober refuses them (its worker is gone), every refused
    /// group is answered as cancelled — its keys become misses, so nothing
    /// is left pending on a prober that will never answer — and its error is
    /// returned.
    ///
    /// With a pending budget in time (see [`LookupLimits`]) the flush reads
    /// the clock once: keys whose budget ran out become misses from the
    /// next lookup on.
    pub fn flush(&mut self) -> Result<usize, LookupError> {
        self.drain();
        // guard: L13-flush-reads-the-clock-for-a-time-budget
        let submission = if self.table.limits().pending_time.is_some() {
            self.table.take_submission_at(std::time::Instant::now())
        } else {
            self.table.take_submission()
        };
        let Some(submission) = submission else {
            return Ok(0);
        };
        if let (Some(clock), Some(first)) = (&mut self.verdict_clock, submission.groups().first()) {
            clock.flushed(first.seq(), std::time::Instant::now());
        }
        let keys = submission.key_count();
        match self.prober.submit(submission) {
            Ok(()) => Ok(keys),
            Err(Refused { submission, error }) => {
                // guard: L8-refused-groups-are-cancelled
                for group in submission.into_groups() {
                    self.table.apply(group.cancelled());
                }
                Err(error)
            }
        }
    }

    /// Whether group results were published that no call has applied yet.
    /// One atomic load; for compatibility views and tools (every scheduler
    /// call applies them first anyway).
    #[doc(hidden)]
    pub fn has_published(&self) -> bool {
        !self.published.stack.is_empty()
    }

    /// Applies every group result published so far; returns how many.
    #[inline]
    pub fn drain(&mut self) -> usize {
        // L5: one atomic load when nothing was published.
        if self.published.stack.is_empty() {
            return 0;
        }
        self.apply_all()
    }

    #[inline(never)]
    fn apply_all(&mut self) -> usize {
        let results = self.published.stack.take_all();
        let applied = results.len();
        let now = self.verdict_clock.is_some().then(std::time::Instant::now);
        for result in results {
            if let (Some(clock), Some(now)) = (&mut self.verdict_clock, now) {
                clock.applied(result.seq(), now);
            }
            self.table.apply(result);
        }
        applied
    }

    /// Blocks until the prober has published every group it was given, then
    /// applies the answers; returns how many group results were applied.
    ///
    /// Not for the scheduler's hot path (it waits for the backend, forever
    /// if the backend hangs and the prober has no timeout): for tests, demos
    /// and orderly pauses.
    pub fn wait_idle(&mut self) -> Result<usize, LookupError> {
        self.prober.wait_idle()?;
        Ok(self.drain())
    }

    /// [`wait_idle`](Self::wait_idle) for at most about `limit` (with a
    /// prober that supports it, see [`Prober::wait_idle_for`]): the groups
    /// applied once idle, or `None` if the prober is still busy (what was
    /// published is applied by the next call).
    pub fn wait_idle_for(&mut self, limit: Duration) -> Result<Option<usize>, LookupError> {
        if self.prober.wait_idle_for(limit)? {
            Ok(Some(self.drain()))
        } else {
            Ok(None)
        }
    }

    /// Turns the hit recorded by `ticket` into a miss after loading its
    /// block failed. Only the ticket's generation is affected: a ticket of
    /// an older generation (the key was cleaned up and looked up again
    /// since) changes nothing, so a late failure never corrupts a newer
    /// lookup. Returns whether the state changed (see
    /// [`LookupTable::mark_miss`]).
    pub fn mark_miss(&mut self, ticket: &Ticket<K>) -> bool {
        self.drain();
        self.table.mark_miss(ticket)
    }

    /// Turns the resolved hits of `keys` into misses, whatever their
    /// generation; returns how many changed (see
    /// [`LookupTable::mark_miss_keys`]). Prefer [`mark_miss`](Self::mark_miss)
    /// with the hit's ticket.
    pub fn mark_miss_keys<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>) -> usize
    where
        K: 'k,
    {
        self.drain();
        self.table.mark_miss_keys(keys)
    }

    /// Tells the lookups that the tier now holds (`present`) or no longer
    /// holds the blocks of `keys`, after a store completed or an eviction
    /// removed them; returns how many key states changed (see
    /// [`LookupTable::settle`]). A probe in flight for one of them answers
    /// too late to override this.
    pub fn settle<'k>(&mut self, keys: impl IntoIterator<Item = &'k K>, present: bool) -> usize
    where
        K: 'k,
    {
        self.drain();
        self.table.settle(keys, present)
    }

    /// Forgets request `id`: keys no other request asked for are dropped,
    /// and a late answer for them is discarded (see [`LookupTable::cleanup`]).
    pub fn cleanup(&mut self, id: &R::Id) {
        self.drain();
        self.table.cleanup(id);
    }

    /// Sets the deadline and admission bounds (see [`LookupLimits`] and
    /// [`LookupTable::set_limits`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kvtier::Lookup;
    /// use kvtier::lookup::LookupLimits;
    ///
    /// let tier = |keys: &[u64], _request: &u64| vec![true; keys.len()];
    /// let mut lookup = Lookup::threaded(tier)?;
    /// lookup.set_limits(
    ///     LookupLimits::default()
    ///         .pending_time(Some(Duration::from_millis(200)))
    ///         .max_outstanding_keys(50_000),
    /// )?;
    /// # Ok::<(), kvtier::LookupError>(())
    /// ```
    pub fn set_limits(&mut self, limits: LookupLimits) -> Result<(), LookupError> {
        self.table.set_limits(limits)
    }

    /// Counters of everything applied so far.
    pub fn stats(&self) -> LookupStats {
        self.table.stats()
    }

    /// The table, read-only.
    pub fn table(&self) -> &LookupTable<K, R> {
        &self.table
    }

    /// The prober, read-only (for its own counters and settings).
    pub fn prober(&self) -> &P {
        &self.prober
    }

    /// Stops the prober, applies its last answers and hands back the final
    /// table (with its [`stats`](LookupTable::stats)). What the prober does
    /// with groups still outstanding is its own rule: the thread prober
    /// finishes them, the tokio prober lets them finish within a grace
    /// period and then cancels them.
    ///
    /// On error the final table is in the [`ShutdownError`].
    pub fn shutdown(mut self) -> Result<LookupTable<K, R>, ShutdownError<K, R>> {
        // guard: L8-prober-shut-down-once
        self.open = false;
        // guard: L8-shutdown-applies-last-answers
        let stopped = self.prober.shutdown();
        self.drain();
        let table = std::mem::take(&mut self.table);
        match stopped {
            Ok(()) => Ok(table),
            Err(error) => Err(ShutdownError {
                error,
                table: Box::new(table),
            }),
        }
    }

    /// Starts (or stops) timing each group from the flush that submitted it
    /// to the call that applied its answers: what
    /// [`take_verdict_times`](Self::take_verdict_times) hands out, for a
    /// metrics exporter. Off by default: a flush then reads no clock.
    pub fn time_verdicts(&mut self, on: bool) {
        self.verdict_clock = on.then(Box::default);
    }

    /// The seconds each group applied since the last call waited for its
    /// verdict (empty unless [`time_verdicts`](Self::time_verdicts) is on),
    /// and how many more were applied and not kept (at most 16,384 are
    /// kept between two calls).
    pub fn take_verdict_times(&mut self) -> (Vec<f64>, u64) {
        self.verdict_clock
            .as_mut()
            .map_or_else(Default::default, |clock| clock.take())
    }

    /// Starts or stops recording the order in which group results are
    /// applied (see [`LookupTable::record_applied`]). For checkers and tools.
    #[doc(hidden)]
    pub fn record_applied(&mut self, on: bool) {
        self.table.record_applied(on);
    }

    /// The applied groups recorded since the last call (see
    /// [`LookupTable::take_applied`]). For checkers and tools.
    #[doc(hidden)]
    pub fn take_applied(&mut self) -> Vec<(u64, GroupOutcome)> {
        self.table.take_applied()
    }
}

impl<K, R: Request, P: Prober<K, R>> Drop for Lookup<K, R, P> {
    fn drop(&mut self) {
        if self.open {
            self.open = false;
            if let Err(error) = self.prober.shutdown() {
                tracing::error!(%error, "lookup prober failed to shut down");
            }
        }
    }
}

impl<K, R, P> fmt::Debug for Lookup<K, R, P>
where
    K: Eq + Hash + Clone,
    R: Request,
    P: Prober<K, R> + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lookup")
            .field("keys", &self.table.len())
            .field("requests", &self.table.request_count())
            .field("prober", &self.prober)
            .finish_non_exhaustive()
    }
}

/// [`Lookup::shutdown`] failed; the final table is here all the same.
pub struct ShutdownError<K, R: Request> {
    error: LookupError,
    table: Box<LookupTable<K, R>>,
}

impl<K, R: Request> ShutdownError<K, R> {
    /// Why shutting down failed.
    pub fn error(&self) -> &LookupError {
        &self.error
    }

    /// The final table: every published answer applied, the keys of groups
    /// that were never answered still in flight.
    pub fn table(&self) -> &LookupTable<K, R> {
        &self.table
    }

    /// The error and the final table.
    pub fn into_parts(self) -> (LookupError, LookupTable<K, R>) {
        (self.error, *self.table)
    }
}

impl<K, R: Request> fmt::Debug for ShutdownError<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShutdownError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<K, R: Request> fmt::Display for ShutdownError<K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<K, R: Request> std::error::Error for ShutdownError<K, R> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<K, R: Request> From<ShutdownError<K, R>> for LookupError {
    fn from(error: ShutdownError<K, R>) -> Self {
        error.error
    }
}
