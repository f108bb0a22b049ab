//! A tier's byte budget as Python sees it: its settings checked into typed
//! errors, its counters and its startup scan as dicts.

use kvtier::capacity::{CapacityStats, Policy};
use kvtier::tier::{ReconcileReport, ScanReport};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::errors::config;

/// `capacity_bytes`: `None` (no budget) or a whole number of bytes >= 1.
pub(crate) fn capacity_of(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    // guard: P17-capacity-bytes-checked
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(config(format!(
            "capacity_bytes is a whole number of bytes, not {}",
            value.get_type().name()?
        )));
    }
    match value.extract::<u64>() {
        Ok(bytes) if bytes >= 1 => Ok(Some(bytes)),
        _ => Err(config(format!(
            "capacity_bytes is {value}; it must be 1 to {} bytes",
            u64::MAX
        ))),
    }
}

/// `eviction_policy`: `"lru"` or `"s3fifo"`.
pub(crate) fn policy_of(name: &str) -> PyResult<Policy> {
    Policy::from_name(name).ok_or_else(|| {
        config(format!(
            "eviction_policy is {name:?}; it must be \"lru\" or \"s3fifo\""
        ))
    })
}

/// The budget's counters and gauges, by name.
pub(crate) fn stats_dict<'py>(
    py: Python<'py>,
    stats: &CapacityStats,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in stats.counters() {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

/// What the startup scan found and did.
pub(crate) fn scan_dict<'py>(py: Python<'py>, report: &ScanReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("blocks", report.blocks)?;
    dict.set_item("bytes", report.bytes)?;
    dict.set_item("trimmed", report.trimmed)?;
    dict.set_item("swept", report.swept)?;
    dict.set_item("failed", report.failed)?;
    dict.set_item("seconds", report.elapsed.as_secs_f64())?;
    Ok(dict)
}

/// A reconcile's report as a dict.
pub(crate) fn reconcile_dict<'py>(
    py: Python<'py>,
    report: &ReconcileReport,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("adopted", report.adopted)?;
    dict.set_item("forgotten", report.forgotten)?;
    dict.set_item("evicted", report.evicted)?;
    dict.set_item("swept", report.swept)?;
    dict.set_item("seconds", report.elapsed.as_secs_f64())?;
    Ok(dict)
}
