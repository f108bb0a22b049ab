//! How a scripted save task ends: what the reference model and the
//! scripted store both speak of.

use arbitrary::Arbitrary;

/// How a scripted task's `wait` (or `check`) ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Arbitrary)]
pub enum Ending {
    /// Success.
    Ok,
    /// `TaskError::Failed`.
    Fails,
    /// `TaskError::TimedOut`.
    TimesOut,
    /// `TaskError::Abandoned`.
    Abandoned,
    /// `wait` panics.
    PanicsInWait,
    /// `check` panics (its `wait` succeeds).
    PanicsInCheck,
}
