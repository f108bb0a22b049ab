//! Keyword arguments whose absence differs from `None`.

use pyo3::prelude::*;

/// An optional keyword whose absence differs from `None`: `Unset(None)`
/// when left out, `Unset(Some(None))` for an explicit `None`.
#[derive(Default)]
pub(crate) struct Unset<T>(pub(crate) Option<T>);

impl<'a, 'py, T: FromPyObject<'a, 'py>> FromPyObject<'a, 'py> for Unset<T> {
    type Error = T::Error;

    fn extract(object: Borrowed<'a, 'py, PyAny>) -> Result<Self, Self::Error> {
        T::extract(object).map(|value| Unset(Some(value)))
    }
}
