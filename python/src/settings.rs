//! Settings from Python, checked by the core's rules (`kvtier::settings`)
//! and nothing else: a value of the wrong kind (a `bool` where a number
//! goes, a `str` where an int goes) is refused here, its range there, and
//! every error names the setting as the caller wrote it.
//!
//! `check_settings` (in `door.rs`) is the one door the Python layers pass
//! their settings through; these are the extractors it and the bindings
//! use.

use std::time::Duration;

use kvtier::settings::{
    self, BudgetConfig, IndexConfig, SettingError, group_count, policy_named, thread_count,
    thread_share,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use crate::errors::config;

/// A refused setting as the `ConfigError` Python sees.
pub(crate) fn setting_error(error: SettingError) -> PyErr {
    config(error.to_string())
}

/// How a layer above spells a setting: `None` for keyword arguments,
/// `kv_connector_extra_config` for vLLM's extra-config keys.
#[derive(Clone, Copy)]
pub(crate) struct Spelling<'a>(pub(crate) Option<&'a str>);

impl Spelling<'_> {
    pub(crate) fn of(&self, name: &str) -> String {
        match self.0 {
            None => name.to_owned(),
            Some(holder) => format!("{holder}[{name:?}]").replace('"', "'"),
        }
    }
}

fn kind_error(name: &str, kind: &str, value: &Bound<'_, PyAny>) -> PyErr {
    let type_name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    config(format!("{name} is {kind}, not {type_name} ({value})"))
}

/// A number of seconds: an `int` or a `float`, never a `bool`.
pub(crate) fn seconds_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    // guard: P18-booleans-are-not-settings
    if value.is_instance_of::<PyBool>()
        || !(value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>())
    {
        return Err(kind_error(name, "a number of seconds", value));
    }
    settings::seconds(name, value.extract::<f64>()?).map_err(setting_error)
}

/// A whole number: an `int`, never a `bool`; `None` past 2^64 - 1 or
/// below 0 (the caller's range check then names the value).
fn whole_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Result<u64, String>> {
    // guard: P17-capacity-bytes-checked
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(kind_error(name, "a whole number", value));
    }
    Ok(value.extract::<u64>().map_err(|_| value.to_string()))
}

/// A count checked by `check` (its range), from a Python `int`.
pub(crate) fn count_of<T>(
    name: &str,
    value: &Bound<'_, PyAny>,
    check: impl Fn(&str, u64) -> Result<T, SettingError>,
) -> PyResult<T> {
    match whole_of(name, value)? {
        Ok(count) => check(name, count).map_err(setting_error),
        // Negative or past 64 bits: the range check's message, for 0.
        Err(shown) => Err(setting_error(match check(name, 0) {
            Err(error) => SettingError::new(
                name,
                error.problem.replacen("is 0", &format!("is {shown}"), 1),
            ),
            Ok(_) => SettingError::new(name, format!("is {shown}; it is out of range")),
        })),
    }
}

/// A capacity in bytes: an `int` from 1 to 2^64 - 1, never a `bool`.
pub(crate) fn capacity_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<u64> {
    let bytes = match whole_of(name, value)? {
        Ok(bytes) => bytes,
        Err(shown) => {
            return Err(config(format!(
                "{name} is {shown}; it must be 1 to {} bytes",
                u64::MAX
            )));
        }
    };
    BudgetConfig::new(bytes)
        .map(|budget| budget.capacity().get())
        .map_err(|error| setting_error(error.spelled(name)))
}

/// A thread count: 1 to `kvtier.settings`' cap.
pub(crate) fn threads_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_of(name, value, thread_count)
}

/// One side's share of a pool's threads (0 allowed; the pool checks the
/// sum).
pub(crate) fn thread_share_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_of(name, value, thread_share)
}

/// Groups probed at once.
pub(crate) fn groups_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    count_of(name, value, group_count)
}

/// A byte budget from its four settings (`None` without a capacity; then
/// a policy or a rescan interval is refused, as it would do nothing).
/// `stale_temp_age`: `None` when not given (the default age), `Some(None)`
/// for Python's `None` (never swept).
pub(crate) fn budget_of(
    spelling: Spelling<'_>,
    capacity: Option<&Bound<'_, PyAny>>,
    policy: Option<&Bound<'_, PyAny>>,
    stale_temp_age: Option<Option<&Bound<'_, PyAny>>>,
    rescan_interval: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<BudgetConfig>> {
    fn given<'a, 'py>(value: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
        value.filter(|v| !v.is_none())
    }
    let (capacity, policy, stale, rescan) = (
        given(capacity),
        given(policy),
        given(stale_temp_age.flatten()),
        given(rescan_interval),
    );
    let policy = match policy {
        None => None,
        Some(value) => {
            let name = spelling.of("eviction_policy");
            if !value.is_instance_of::<PyString>() {
                return Err(kind_error(&name, "\"lru\" or \"s3fifo\"", value));
            }
            Some(policy_named(&name, &value.extract::<String>()?).map_err(setting_error)?)
        }
    };
    let stale = stale
        .map(|value| seconds_of(&spelling.of("stale_temp_age"), value))
        .transpose()?;
    let rescan = rescan
        .map(|value| {
            let name = spelling.of("rescan_interval");
            settings::rescan_interval(&name, seconds_of(&name, value)?).map_err(setting_error)
        })
        .transpose()?;
    let Some(capacity) = capacity else {
        // guard: P19-budget-settings-need-a-capacity
        for (set, name) in [
            (policy.is_some(), "eviction_policy"),
            (rescan.is_some(), "rescan_interval"),
        ] {
            if set {
                return Err(config(format!(
                    "{} is set without {}: it applies to a byte budget; set {} too, or remove it",
                    spelling.of(name),
                    spelling.of("capacity_bytes"),
                    spelling.of("capacity_bytes"),
                )));
            }
        }
        return Ok(None);
    };
    let mut budget = BudgetConfig::new(capacity_of(&spelling.of("capacity_bytes"), capacity)?)
        .map_err(setting_error)?;
    if let Some(policy) = policy {
        budget = budget.with_policy(policy);
    }
    // `stale_temp_age=None` sweeps nothing; absent, the default age.
    if stale_temp_age.is_some() {
        budget = budget.with_stale_temp_age(stale).map_err(setting_error)?;
    }
    budget
        .with_rescan_interval(rescan)
        .map_err(setting_error)
        .map(Some)
}

/// The fleet's books: `index` (a `redis://` or `valkey://` URL) and
/// `index_lease` (seconds), `None` without an index. A lease without an
/// index is an error.
pub(crate) fn index_of<'py>(
    spelling: Spelling<'_>,
    index: Option<&Bound<'py, PyAny>>,
    lease: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<IndexConfig>> {
    let (index, lease) = (
        index.filter(|v| !v.is_none()),
        lease.filter(|v| !v.is_none()),
    );
    let Some(index) = index else {
        if lease.is_some() {
            return Err(config(format!(
                "{} is set without {}: leases are the fleet's books'",
                spelling.of("index_lease"),
                spelling.of("index")
            )));
        }
        return Ok(None);
    };
    let name = spelling.of("index");
    if !index.is_instance_of::<PyString>() {
        return Err(kind_error(
            &name,
            "a URL such as \"redis://host:6379\"",
            index,
        ));
    }
    let mut config_ = IndexConfig::new(&index.extract::<String>()?)
        .map_err(|error| setting_error(error.spelled(name)))?;
    if let Some(lease) = lease {
        let name = spelling.of("index_lease");
        config_ = config_
            .with_lease(seconds_of(&name, lease)?)
            .map_err(|error| setting_error(error.spelled(name)))?;
    }
    Ok(Some(config_))
}
