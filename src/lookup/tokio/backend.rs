//! The async backend trait, and the fault-proof call a runner makes for
//! each group: within the timeout, with panics caught.

use std::fmt::Display;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;

use crate::fault::take_panic;
use crate::lookup::backend::CallEnd;
use crate::lookup::submission::{Group, collect_answers};
use crate::lookup::types::Request;
use crate::sync::task;

/// A tier that answers groups of keys asynchronously: what the
/// [`TokioProber`](super::TokioProber) probes.
///
/// `batch_lookup` takes `&self`: with `max_concurrent_groups` above 1,
/// several groups are probed at once. Faults become misses, as with a blocking
/// [`Backend`](crate::lookup::Backend): an `Err`, a panic while the
/// future is created or polled, fewer or more answers than keys, and a call
/// that outlives the prober's per-group timeout (its future is dropped).
///
/// ```
/// use std::collections::HashSet;
/// use kvtier::lookup::AsyncBackend;
///
/// struct Resident(HashSet<u64>);
///
/// impl AsyncBackend<u64, String> for Resident {
///     type Error = std::convert::Infallible;
///
///     async fn batch_lookup(&self, keys: &[u64], _request: &String) -> Result<Vec<bool>, Self::Error> {
///         Ok(keys.iter().map(|key| self.0.contains(key)).collect())
///     }
/// }
/// ```
pub trait AsyncBackend<K, R>: Send + Sync + 'static {
    /// Why a whole group could not be answered.
    type Error: Display;

    /// Says, for each of `keys`, whether the tier holds it: one answer per
    /// key, in key order. `request` is the request whose lookups created the
    /// group, as context.
    fn batch_lookup(
        &self,
        keys: &[K],
        request: &R,
    ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send;
}

/// One backend call for `group`, within `timeout`, with panics caught.
pub(super) async fn probe<K, R, B>(
    backend: &B,
    group: &Group<K, R>,
    mut found: Vec<bool>,
    timeout: Option<Duration>,
) -> (Vec<bool>, CallEnd)
where
    R: Request,
    B: AsyncBackend<K, R>,
{
    // Creating the backend's future runs backend code too, so it happens
    // inside the first (panic-guarded) poll; so does formatting its error.
    let call = catch_unwind(async {
        backend
            .batch_lookup(group.keys(), group.request())
            .await
            .map_err(|error| error.to_string())
    });
    // guard: T4-group-timeout
    match task::timeout(timeout, call).await {
        None => (found, CallEnd::TimedOut),
        Some(Err(message)) => (found, CallEnd::Panic(message)),
        Some(Ok(Err(error))) => (found, CallEnd::Error(error)),
        Some(Ok(Ok(answers))) => {
            let surplus = collect_answers(answers, group.len(), &mut found);
            (found, CallEnd::Answers { surplus })
        }
    }
}

/// `future`'s output, or the message of a panic raised while polling it.
/// A future that panicked is not polled again.
async fn catch_unwind<F: Future>(future: F) -> Result<F::Output, String> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(move |cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(take_panic(payload))),
        }
    })
    .await
}
