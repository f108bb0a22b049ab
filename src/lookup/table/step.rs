//! What the table keeps of a step once it ended, and of a group's
//! interest: shared by the bounds, the release and the settle paths.

use std::time::Instant;

use hashbrown::HashMap;

use crate::lookup::submission::Interest;
use crate::sync::Arc;

/// An ended step whose keys are not overdue yet: its keys are the
/// generations from `first_generation` up to the next mark's.
#[derive(Clone, Copy, Debug)]
pub(super) struct StepMark {
    pub(super) first_generation: u64,
    /// The step's index (the number of steps ended before it).
    pub(super) step: u64,
    /// When the step started, if a flush said so.
    pub(super) started: Option<Instant>,
}

/// One of the keys of group `group` lost its last requester.
pub(super) fn lose_interest(interest_of: &HashMap<u32, Arc<Interest>>, group: u32) {
    if let Some(interest) = interest_of.get(&group) {
        // guard: L15-cleanup-loses-interest
        interest.lose();
    }
}
