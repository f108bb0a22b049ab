//! KV blocks between an engine's KV cache and an offload region in host
//! memory: the copies an engine's offloading worker makes when no device
//! copy engine does them (vLLM's tiering on a CPU machine).
//!
//! - [`plan`]: which bytes go where for a job's block ids, worked out and
//!   checked against the memory's extents with nothing touched (sans-IO);
//! - [`copier`]: [`BlockCopier`] runs the copies on native threads and
//!   reports each job once its bytes are in place (the save core's books).

pub mod copier;
pub mod plan;

pub use copier::{BlockCopier, CopyError, FinishedCopy};
pub use plan::{CacheTensor, Copy, CopyLayout, Direction, Extent, LayerRef, PlanError, Transfer};
