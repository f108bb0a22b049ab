//! A tier's byte budget as Python sees it: its counters, its startup scan
//! and its reconciles as dicts (its settings: `settings.rs`).

use kvtier::capacity::CapacityStats;
use kvtier::tier::{ReconcileReport, ScanReport};
use pyo3::prelude::*;
use pyo3::types::PyDict;

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
