//! Every setting a caller gives kvtier, checked once, where its typed value
//! is built, against one set of limits.
//!
//! A setting family is a type: a [`BudgetConfig`] (a non-zero capacity,
//! an eviction policy, the stale-temporary-file age and the rescan
//! interval), a duration ([`seconds`], [`duration`]), a thread count
//! ([`thread_count`]), a byte size ([`parse_bytes`]) and (feature
//! `object-store`) a bucket and prefix ([`ObjectTarget`]), and the fleet's
//! books ([`IndexConfig`]). Each tier takes
//! them the same way (`FsOptions::budget`, `ObjectTier::with_budget`,
//! `VllmTransfers::set_budget`), and the Python bindings build them with
//! these same functions, naming the setting as the caller wrote it (a
//! keyword argument, a vLLM config key): a [`SettingError`] names it.
//!
//! ```
//! use std::time::Duration;
//! use kvtier::capacity::Policy;
//! use kvtier::settings::{BudgetConfig, parse_bytes};
//!
//! let budget = BudgetConfig::new(parse_bytes("capacity", "64GiB")?)?
//!     .with_policy(Policy::S3Fifo)
//!     .with_rescan_interval(Some(Duration::from_secs(30)))?;
//! assert_eq!(budget.capacity().get(), 64 << 30);
//! assert!(BudgetConfig::new(0).is_err());
//! assert!(parse_bytes("capacity", "5GIBIB").is_err());
//! # Ok::<(), kvtier::settings::SettingError>(())
//! ```

mod budget;
mod error;
mod index;
#[cfg(object_tier)]
mod object;
mod values;

pub use budget::BudgetConfig;
pub use error::SettingError;
pub use index::IndexConfig;
#[cfg(object_tier)]
pub use object::{ObjectTarget, ReachFault};
pub use values::{
    MAX_CONCURRENT_GROUPS, MAX_DURATION, MAX_IO_THREADS, MAX_REGION_BYTES, MAX_RESCAN_INTERVAL,
    MIN_RESCAN_INTERVAL, duration, group_count, parse_bytes, policy_named, region_bytes,
    rescan_interval, seconds, thread_count, thread_share,
};
