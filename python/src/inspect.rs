//! `Lookup.inspect()`: a read-only view of a lookup's table, for tools and
//! for the compatibility views of `kvtier.vllm` (vLLM's tests read its
//! lookup manager's private state). Nothing here is on a scheduler's path,
//! and nothing here changes the table.

use kvtier::lookup::Phase;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::errors::guard;
use crate::lookup::LookupInspector;
use crate::probers::Key;

/// What `key_state` answers: `(generation, phase, found, requesters)`.
type KeyState = (u64, &'static str, Option<bool>, usize);

fn bytes_list<'py>(py: Python<'py>, keys: &[Key]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, keys.iter().map(|key| PyBytes::new(py, key)))
}

#[pymethods]
impl LookupInspector {
    /// `(generation, phase, found, requesters)` of `key`, or `None` if the
    /// table does not track it. `phase` is `"pending"` (goes out at the
    /// next flush), `"in_flight"`, `"overdue"` (in flight past its budget:
    /// looked up as a miss) or `"resolved"`; `found` is set once resolved.
    fn key_state(&self, py: Python<'_>, key: Vec<u8>) -> PyResult<Option<KeyState>> {
        guard(|| {
            let lookup = self.lookup.bind(py).borrow();
            let Some(state) = lookup.table().and_then(|table| table.key_state(&key)) else {
                return Ok(None);
            };
            let (phase, found) = match state.phase {
                Phase::Pending => ("pending", None),
                Phase::InFlight => ("in_flight", None),
                Phase::Overdue => ("overdue", None),
                Phase::Resolved { found } => ("resolved", Some(found)),
            };
            Ok(Some((
                state.generation.get(),
                phase,
                found,
                state.requesters,
            )))
        })
    }

    /// Every key the table tracks (orphaned in-flight probes included).
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let lookup = self.lookup.bind(py).borrow();
            let keys = lookup
                .table()
                .map(|table| table.tracked_keys())
                .unwrap_or_default();
            bytes_list(py, &keys)
        })
    }

    /// The ids of the live requests.
    fn request_ids(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        guard(|| {
            let lookup = self.lookup.bind(py).borrow();
            Ok(lookup
                .table()
                .map(|table| table.request_ids())
                .unwrap_or_default())
        })
    }

    /// The keys live request `req_id` asked for, in the order it first
    /// asked; `None` for a request the table does not hold.
    fn request_keys<'py>(
        &self,
        py: Python<'py>,
        req_id: String,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        guard(|| {
            let lookup = self.lookup.bind(py).borrow();
            match lookup.table().and_then(|table| table.request_keys(&req_id)) {
                Some(keys) => Ok(Some(bytes_list(py, &keys)?)),
                None => Ok(None),
            }
        })
    }

    /// The keys the next flush hands to the prober, as
    /// `(key, req_id, generation)`, in order.
    fn batched<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        guard(|| {
            let lookup = self.lookup.bind(py).borrow();
            let batched = lookup
                .table()
                .map(|table| table.batched())
                .unwrap_or_default();
            let list = PyList::empty(py);
            for (key, request, generation) in batched {
                list.append((PyBytes::new(py, &key), request, generation.get()))?;
            }
            Ok(list)
        })
    }

    /// Groups submitted to the prober whose answers the table has not
    /// applied yet.
    fn outstanding_groups(&self, py: Python<'_>) -> usize {
        let lookup = self.lookup.bind(py).borrow();
        lookup.table().map_or(0, |table| table.outstanding_groups())
    }

    /// Whether the prober published answers that no call has applied yet.
    fn published(&self, py: Python<'_>) -> bool {
        self.lookup.bind(py).borrow().has_published()
    }

    /// Whether the lookup was shut down.
    fn closed(&self, py: Python<'_>) -> bool {
        self.lookup.bind(py).borrow().table_is_final()
    }
}
