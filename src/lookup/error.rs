//! Why a lookup driver or one of its probers could not do what was asked.

/// Why a [`Lookup`](super::Lookup) or one of its probers could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The operating system refused to start a worker thread or runtime.
    #[error("could not start the lookup worker")]
    Spawn(#[source] std::io::Error),
    /// The prober's worker is gone. Backend panics are caught, so with the
    /// built-in probers this is a kvtier bug. Groups it refused were answered
    /// as cancelled (their keys are misses); groups it had taken stay in
    /// flight.
    #[error("the lookup worker stopped unexpectedly: {0}")]
    WorkerLost(String),
    /// A setting is out of range; the message says which and why.
    #[error("invalid lookup configuration: {0}")]
    Config(String),
    /// Shutdown gave up on groups whose backend calls ignored cancellation
    /// (a backend blocking its thread inside a future); their keys stay in
    /// flight in the final table.
    #[error("{groups} lookup groups did not stop after being cancelled")]
    Stuck {
        /// Groups never published.
        groups: u64,
    },
    /// A call that waits for the prober's worker was made on that worker,
    /// from inside a backend call: it would wait for itself forever. The
    /// field names the call.
    #[error("{0} was called from inside a backend call, on the worker it would wait for")]
    OnWorker(&'static str),
}
