//! How a command fails: its message and its exit code.

/// A failure with its exit code: 1 during the run, 2 bad input, 3 storage
/// unreachable.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    /// Nothing to report: stdout was closed by its reader.
    pub(crate) fn closed_stdout() -> Self {
        Self {
            code: 0,
            message: String::new(),
        }
    }

    pub(crate) fn input(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    pub(crate) fn unreachable(message: impl Into<String>) -> Self {
        Self {
            code: 3,
            message: message.into(),
        }
    }

    pub(crate) fn run(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
}
