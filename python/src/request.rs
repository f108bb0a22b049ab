//! A request's id as the bindings take it: a `str`, or an object with a
//! `req_id` attribute (vLLM's request context).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// The id of `request`: a `str`, or an object with a `req_id` attribute
/// (vLLM's request context).
pub(crate) fn request_id(request: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = request.cast::<PyString>() {
        return Ok(text.to_cow()?.into_owned());
    }
    let field = match request.getattr("req_id") {
        Ok(field) => field,
        // guard: P12-req-id-errors-propagate
        Err(error) if error.is_instance_of::<pyo3::exceptions::PyAttributeError>(request.py()) => {
            return Err(PyTypeError::new_err(format!(
                "a request is a str id or has a req_id attribute, not {}",
                request.get_type().name()?
            )));
        }
        // A property that raised (KeyboardInterrupt, say): its own error.
        Err(error) => return Err(error),
    };
    let field = field
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err("req_id must be a str"))?;
    Ok(field.to_cow()?.into_owned())
}
