//! `check_settings(values, where=None)`: the one door the Python layers
//! (`FsTier`, `ObjectTier`, the connector, `CpuTieringSpec`) pass their
//! settings through before they build anything. It knows each setting's
//! kind, refuses a budget setting without `capacity_bytes` and an object
//! store's settings without `url` or `store_config`, and returns the values
//! as the bindings take them.

use kvtier::settings::region_bytes;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::config;
use crate::objects::{PyObjectTarget, TARGET_SETTINGS, target_of};
use crate::settings::{
    Spelling, budget_of, count_of, groups_of, index_of, seconds_of, thread_share_of, threads_of,
};

/// The kind of each setting `check_settings` knows.
enum Kind {
    Seconds,
    SecondsOrNone,
    Threads,
    ThreadShare,
    Groups,
    RegionBytes,
    Budget,
    /// `url`, `store_config`, `prefix` and the requests' timeouts and
    /// retries: an object store (`objects.rs`).
    Target,
    /// `index` and `index_lease`: the fleet's books.
    Index,
}

fn kind(name: &str) -> Option<Kind> {
    Some(match name {
        "shutdown_grace" => Kind::Seconds,
        "lookup_timeout" | "group_timeout" => Kind::SecondsOrNone,
        "n_read_threads" | "n_write_threads" | "load_threads" | "store_threads" => {
            Kind::ThreadShare
        }
        "copy_threads" | "io_threads" | "threads" => Kind::Threads,
        "lookup_concurrency" | "concurrency" => Kind::Groups,
        "staging_bytes" => Kind::RegionBytes,
        "capacity_bytes" | "eviction_policy" | "stale_temp_age" | "rescan_interval" => Kind::Budget,
        "index" | "index_lease" => Kind::Index,
        name if TARGET_SETTINGS.contains(&name) => Kind::Target,
        _ => return None,
    })
}

/// Checks `values` (settings by name; `None` where a setting allows it)
/// and returns them as the bindings take them: seconds as `float`, counts
/// as `int`, `eviction_policy` as its name, and an object store's settings
/// (`url`, or `store_config` and `prefix`, with `request_timeout`,
/// `connect_timeout`, `max_retries`) as one `ObjectTarget` under
/// `object_target`. Errors name each setting as
/// `where[...]` when `where` is given (`kv_connector_extra_config`), by
/// its name otherwise.
#[pyfunction]
#[pyo3(signature = (values, r#where = None))]
pub(crate) fn check_settings<'py>(
    values: &Bound<'py, PyDict>,
    r#where: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let py = values.py();
    let spelling = Spelling(r#where);
    let out = PyDict::new(py);
    for (key, value) in values.iter() {
        let name: String = key.extract()?;
        let spelled = spelling.of(&name);
        match kind(&name) {
            None => {
                return Err(config(format!("{spelled} is not a setting kvtier knows")));
            }
            Some(Kind::Budget | Kind::Target | Kind::Index) => {}
            Some(Kind::Seconds) => {
                out.set_item(&name, seconds_of(&spelled, &value)?.as_secs_f64())?
            }
            Some(Kind::SecondsOrNone) if value.is_none() => out.set_item(&name, py.None())?,
            Some(Kind::SecondsOrNone) => {
                out.set_item(&name, seconds_of(&spelled, &value)?.as_secs_f64())?
            }
            Some(Kind::Threads) => out.set_item(&name, threads_of(&spelled, &value)?)?,
            Some(Kind::ThreadShare) => out.set_item(&name, thread_share_of(&spelled, &value)?)?,
            Some(Kind::Groups) => out.set_item(&name, groups_of(&spelled, &value)?)?,
            Some(Kind::RegionBytes) => {
                out.set_item(&name, count_of(&spelled, &value, region_bytes)?)?
            }
        }
    }
    // guard: O5-the-object-store-settings-pass-the-door
    let target = target_of(spelling, values)?;
    let has_target = target.is_some();
    if let Some(target) = target {
        out.set_item(
            "object_target",
            Bound::new(py, PyObjectTarget { inner: target })?,
        )?;
    }
    let item = |name: &str| values.get_item(name);
    let index = index_of(
        spelling,
        item("index")?.as_ref(),
        item("index_lease")?.as_ref(),
    )?;
    if let Some(index) = &index {
        let capacity = item("capacity_bytes")?.filter(|value| !value.is_none());
        let mut missing = Vec::new();
        if !has_target {
            missing.push(format!(
                "{} or {}",
                spelling.of("url"),
                spelling.of("store_config")
            ));
        }
        if capacity.is_none() {
            missing.push(spelling.of("capacity_bytes"));
        }
        // guard: G17-an-index-needs-a-bucket-and-a-capacity
        if !missing.is_empty() {
            return Err(config(format!(
                "{} is set without {}: the fleet's books bound a bucket prefix's bytes",
                spelling.of("index"),
                missing.join(" and ")
            )));
        }
        out.set_item("index", index.url())?;
        out.set_item("index_lease", index.lease().as_secs_f64())?;
    }
    let (capacity, policy, stale, rescan) = (
        item("capacity_bytes")?,
        item("eviction_policy")?,
        item("stale_temp_age")?,
        item("rescan_interval")?,
    );
    let budget = budget_of(
        spelling,
        capacity.as_ref(),
        policy.as_ref(),
        stale
            .as_ref()
            .map(|age| Some(age).filter(|age| !age.is_none())),
        rescan.as_ref(),
    )?;
    if let Some(stale) = &stale {
        let age = if stale.is_none() {
            None
        } else {
            Some(seconds_of(&spelling.of("stale_temp_age"), stale)?.as_secs_f64())
        };
        out.set_item("stale_temp_age", age)?;
    }
    match budget {
        None => {
            for (name, given) in [
                ("capacity_bytes", &capacity),
                ("eviction_policy", &policy),
                ("rescan_interval", &rescan),
            ] {
                if given.is_some() {
                    out.set_item(name, py.None())?;
                }
            }
        }
        Some(budget) => {
            out.set_item("capacity_bytes", budget.capacity().get())?;
            out.set_item("eviction_policy", budget.policy().name())?;
            if rescan.is_some() {
                out.set_item(
                    "rescan_interval",
                    budget.rescan_interval().map(|d| d.as_secs_f64()),
                )?;
            }
        }
    }
    Ok(out)
}
