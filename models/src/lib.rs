//! Everything that checks kvtier against a formal model.
//!
//! - [`reference`](mod@reference): the lookup protocol as a short, sequential specification,
//!   the oracle for the differential tests (and, later, proptest and fuzzing).
//! - [`conformance`]: compares a real [`kvtier::LookupTable`] with the
//!   specification's state.
//! - `tests/loom_*.rs` (built with `RUSTFLAGS="--cfg kvtier_loom"`) and
//!   `tests/shuttle_*.rs` (`--cfg kvtier_shuttle`): the real threaded driver
//!   under the model checkers.

pub mod conformance;
pub mod reference;
