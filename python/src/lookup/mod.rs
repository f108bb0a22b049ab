//! `kvtier.Lookup`: the scheduler's async lookup, with `bytes` keys and
//! `str` request ids, over a native prober (kvtier's fs tier, vLLM's fs
//! layout, an object store) or a Python backend.

mod books;
mod handle;
mod methods;

pub(crate) use handle::LookupInspector;
pub(crate) use methods::register;
