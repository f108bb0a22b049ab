//! `kvtier._native.ObjectTarget`: a bucket and prefix, and how to reach
//! them, from kvtier's `url` or vLLM's obj tier's `store_config` and
//! `prefix` (checked by `kvtier::settings::ObjectTarget`), with the
//! timeouts and retries of its requests. `check_settings` builds it; the
//! object tier's lookups and transfers are opened from it.

use kvtier::settings::{ObjectTarget, SettingError};
use kvtier::tier::VllmObjectLayout;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use crate::errors::{config, guard};
use crate::settings::{Spelling, seconds_of, setting_error};

/// The settings an object target is built from.
pub(crate) const TARGET_SETTINGS: [&str; 6] = [
    "url",
    "store_config",
    "prefix",
    "request_timeout",
    "connect_timeout",
    "max_retries",
];

/// A bucket and the prefix below it (see the module docs). Its `repr`
/// never shows a secret.
#[pyclass(module = "kvtier._native", name = "ObjectTarget", frozen)]
pub(crate) struct PyObjectTarget {
    pub(crate) inner: ObjectTarget,
}

fn text_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if !value.is_instance_of::<PyString>() {
        return Err(config(format!(
            "{name} is a string, not {}",
            value.get_type().name()?
        )));
    }
    value.extract()
}

/// The target of `values` (the six settings above, by name; others are
/// ignored), or `None` when neither `url` nor `store_config` is given (then
/// `prefix` and the request settings are refused: they would do nothing).
pub(crate) fn target_of(
    spelling: Spelling<'_>,
    values: &Bound<'_, PyDict>,
) -> PyResult<Option<ObjectTarget>> {
    let given = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(values.get_item(name)?.filter(|value| !value.is_none()))
    };
    let (url, store_config) = (given("url")?, given("store_config")?);
    let mut target = match (url, store_config) {
        (Some(_), Some(_)) => {
            return Err(config(format!(
                "{} and {} are both set; give one (the URL, or vLLM's store_config and prefix)",
                spelling.of("url"),
                spelling.of("store_config")
            )));
        }
        (Some(url), None) => {
            if given("prefix")?.is_some() {
                return Err(config(format!(
                    "{} is set with {}: the URL's path is the prefix",
                    spelling.of("prefix"),
                    spelling.of("url")
                )));
            }
            let name = spelling.of("url");
            ObjectTarget::from_url(&name, &text_of(&name, &url)?).map_err(setting_error)?
        }
        (None, Some(store_config)) => {
            let name = spelling.of("store_config");
            let Ok(entries) = store_config.cast::<PyDict>() else {
                return Err(config(format!(
                    "{name} is a dict (vLLM's obj tier's store_config), not {}",
                    store_config.get_type().name()?
                )));
            };
            let mut pairs = Vec::with_capacity(entries.len());
            for (key, value) in entries.iter() {
                let key = text_of(&format!("a key of {name}"), &key)?;
                let value = text_of(&format!("{name}['{key}']"), &value)?;
                pairs.push((key, value));
            }
            let prefix = match given("prefix")? {
                Some(prefix) => text_of(&spelling.of("prefix"), &prefix)?,
                None => String::new(),
            };
            ObjectTarget::from_store_config(&name, pairs, &prefix)
                .map_err(|error| setting_error(respell_prefix(error, spelling)))?
        }
        (None, None) => {
            for name in &TARGET_SETTINGS[2..] {
                if given(name)?.is_some() {
                    return Err(config(format!(
                        "{} is set without {} or {}: it applies to an object store",
                        spelling.of(name),
                        spelling.of("url"),
                        spelling.of("store_config")
                    )));
                }
            }
            return Ok(None);
        }
    };
    if let Some(value) = given("request_timeout")? {
        let name = spelling.of("request_timeout");
        let seconds = seconds_of(&name, &value)?.as_secs_f64();
        target = target
            .with_request_timeout(&name, seconds)
            .map_err(setting_error)?;
    }
    if let Some(value) = given("connect_timeout")? {
        let name = spelling.of("connect_timeout");
        let seconds = seconds_of(&name, &value)?.as_secs_f64();
        target = target
            .with_connect_timeout(&name, seconds)
            .map_err(setting_error)?;
    }
    if let Some(value) = given("max_retries")? {
        let name = spelling.of("max_retries");
        if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
            return Err(config(format!("{name} is a whole number, not {value}")));
        }
        let retries = value.extract::<u64>().unwrap_or(u64::MAX);
        target = target
            .with_max_retries(&name, retries)
            .map_err(setting_error)?;
    }
    Ok(Some(target))
}

/// The core names the prefix `prefix`; the caller may spell it otherwise.
fn respell_prefix(error: SettingError, spelling: Spelling<'_>) -> SettingError {
    if error.setting == "prefix" {
        let spelled = spelling.of("prefix");
        error.spelled(spelled)
    } else {
        error
    }
}

#[pymethods]
impl PyObjectTarget {
    /// The bucket.
    #[getter]
    fn bucket(&self) -> &str {
        self.inner.options().get_bucket()
    }

    /// The prefix below the bucket (`""` for its top).
    #[getter]
    fn prefix(&self) -> &str {
        self.inner.prefix()
    }

    /// The endpoint, if one is set.
    #[getter]
    fn endpoint(&self) -> Option<&str> {
        self.inner.options().get_endpoint()
    }

    /// `below` under the prefix.
    fn join(&self, below: &str) -> String {
        self.inner.join(below)
    }

    /// Lists `rank_prefix` once (within the request timeout, retries
    /// included) to see that the server answers, takes the credentials and
    /// has the bucket; raises a `ConfigError` naming the setting to fix.
    /// The GIL is released while it waits.
    fn check_reachable(&self, py: Python<'_>, rank_prefix: &str) -> PyResult<()> {
        guard(|| {
            py.detach(|| VllmObjectLayout::open_checked(&self.inner, rank_prefix).map(drop))
                .map_err(setting_error)
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}
