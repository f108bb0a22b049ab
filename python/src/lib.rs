//! kvtier for Python: the extension module `kvtier._native`.
//!
//! What Python sees is written here: `lookup` (the scheduler's async lookup
//! over a native prober or a Python backend), `save` (deferred save
//! completion with Python store tasks, and the wire form of steps and
//! reports), `transfers` (vLLM's tier stores and loads), `copier` (KV blocks
//! between an engine's KV cache and an offload region) and `errors` (the
//! exception types and the panic guard every entry point goes through). The Python package around
//! it (`python/kvtier/`) adds the vLLM-shaped adapter and the layout's base
//! path.
//!
//! The GIL rule: native probers run on threads that never touch Python;
//! every call that can wait releases the GIL while it waits; a Python
//! backend or store task is called with the GIL taken on the calling
//! thread, and never once the interpreter is shutting down.

// Under the model checkers kvtier has no tiers (their I/O is outside what
// loom and shuttle model): the bindings are left out of such builds.
#![cfg(not(any(kvtier_loom, kvtier_shuttle)))]

use pyo3::prelude::*;

mod args;
mod capacity;
mod copier;
mod door;
mod errors;
mod inspect;
mod live;
mod lookup;
mod objects;
mod probers;
mod request;
mod save;
mod settings;
mod slot;
mod transfers;

/// The extension module. Its names are re-exported by the `kvtier` package.
#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(module)?;
    slot::register(module)?;
    copier::register(module)?;
    lookup::register(module)?;
    save::register(module)?;
    transfers::register(module)?;
    module.add_function(wrap_pyfunction!(door::check_settings, module)?)?;
    module.add_class::<objects::PyObjectTarget>()?;
    module.add_class::<lookup::LookupInspector>()?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
