//! The error the structural self-checks return.

use std::fmt;

/// A structure broke one of its own invariants: returned by the
/// `check_invariants` self-checks of [`LookupTable`](crate::lookup::LookupTable)
/// and [`SaveTracker`](crate::save::SaveTracker), which tests and models call
/// after every step. Never produced unless kvtier has a bug; the message
/// names what is inconsistent.
#[derive(Clone, PartialEq, Eq)]
pub struct InvariantViolation(pub(crate) String);

impl InvariantViolation {
    /// What is inconsistent.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InvariantViolation({:?})", self.0)
    }
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant violated: {}", self.0)
    }
}

impl std::error::Error for InvariantViolation {}
