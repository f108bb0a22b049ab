//! Why a worker's tracker refused a step.

/// Why [`SaveTracker::begin_step`](super::SaveTracker::begin_step) refused a step. A refused step changes
/// nothing: the tracker still expects the step it expected before, so a
/// step that arrived early can be offered again once the missing ones came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// Steps before this one never arrived: taking it would lose their saving
    /// requests, whose blocks the scheduler then keeps until they are
    /// reported — which this worker could never do.
    #[error("step {got} arrived while step {expected} was due: {} step(s) missing", got - expected)]
    Skipped {
        /// The step the tracker expected.
        expected: u64,
        /// The step offered.
        got: u64,
    },
    /// The step was already taken (a step sent twice, or an old one replayed).
    #[error("step {got} arrived again (step {expected} was due)")]
    Repeated {
        /// The step the tracker expected.
        expected: u64,
        /// The step offered.
        got: u64,
    },
    /// A wait at the step's preemption fence was interrupted (see
    /// [`Interrupted`](crate::save::Interrupted)): the fence did not pass and the step was not taken;
    /// [`SaveTracker::take_interruption`](crate::save::SaveTracker::take_interruption) has the cause. Offer the step
    /// again to retry.
    #[error("the preemption fence was interrupted; the step was not taken")]
    Interrupted,
}
