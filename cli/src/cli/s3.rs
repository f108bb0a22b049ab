//! An S3 tier for `probe` and `trim`: the URL parsed into options and a
//! namespace, and the endpoint reached once before any work, so that bad
//! input exits with 2 and an endpoint that does not answer with 3.

use std::time::Duration;

use kvtier::{ObjectTier, tier::S3Options};
use tokio::runtime::Runtime;

use super::failure::Failure;

/// The tier a `s3://BUCKET[/NAMESPACE][?endpoint=URL&region=R]` URL names,
/// and its namespace. Builds the client only (no request is made).
pub(crate) fn connect(url: &str) -> Result<(ObjectTier, String), Failure> {
    let (options, namespace) =
        S3Options::from_url(url).map_err(|error| Failure::input(error.to_string()))?;
    let tier =
        ObjectTier::s3(&options, &namespace).map_err(|error| Failure::input(error.to_string()))?;
    Ok((tier, namespace))
}

/// A runtime for the command's own requests (one thread: the command waits
/// on each).
pub(crate) fn runtime() -> Result<Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| Failure::run(error.to_string()))
}

/// One request to the bucket, answered within `limit`, or exit code 3.
pub(crate) fn reach(
    runtime: &Runtime,
    tier: &ObjectTier,
    url: &str,
    limit: Duration,
) -> Result<(), Failure> {
    let reached =
        runtime.block_on(async { tokio::time::timeout(limit, tier.check_reachable()).await });
    match reached {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(Failure::unreachable(format!("cannot reach {url}: {error}"))),
        Err(_) => Err(Failure::unreachable(format!(
            "cannot reach {url}: no answer within {} ms",
            limit.as_millis()
        ))),
    }
}
