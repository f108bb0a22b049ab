//! Which books answer `Lookup.vllm_objects`: per-key `HEAD`s, the fleet's
//! books of the transfers it is given, or (`index`) the fleet's books over
//! a connection of the lookup's own, for a process without transfers (the
//! KV connector's scheduler).

use kvtier::tier::VllmObjectLayout;
use pyo3::prelude::*;

use crate::errors::{config, tier_error};
use crate::settings::{Spelling, budget_of, index_of};
use crate::transfers::PyVllmTransfers;

pub(super) fn answered_by_books<'py>(
    py: Python<'py>,
    layout: VllmObjectLayout,
    transfers: Option<&Bound<'py, PyVllmTransfers>>,
    (index, index_lease): (Option<&Bound<'py, PyAny>>, Option<&Bound<'py, PyAny>>),
    capacity_bytes: Option<&Bound<'py, PyAny>>,
) -> PyResult<VllmObjectLayout> {
    let own = index_of(Spelling(None), index, index_lease)?;
    let capacity_given = capacity_bytes.is_some_and(|v| !v.is_none());
    match (transfers, own) {
        (Some(_), Some(_)) => Err(config(
            "index and transfers are exclusive: the transfers' books answer their lookups",
        )),
        (_, None) if capacity_given => Err(config(
            "capacity_bytes is set without index: a lookup bounds nothing",
        )),
        (Some(transfers), None) => Ok(match transfers.borrow().fleet_budget()? {
            Some(fleet) => layout.with_index(fleet),
            None => layout,
        }),
        (None, None) => Ok(layout),
        (None, Some(own)) => {
            let budget = budget_of(Spelling(None), capacity_bytes, None, None, None)?
                .ok_or_else(|| {
                    config(
                        "index is set without capacity_bytes: the fleet's books bound a bucket prefix's bytes",
                    )
                })?;
            // Connecting (and a first look at the books) runs without the GIL.
            py.detach(|| layout.with_own_index(&budget, &own))
                .map_err(tier_error)
        }
    }
}
