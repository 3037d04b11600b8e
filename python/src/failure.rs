//! `Failure(code, detail)`: the one exception the format API's native half raises;
//! `cozytensors/_api.py` raises it again as its `Error` subclass of that code.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    Failure,
    PyException,
    "A failure of the format API: args are (code, detail); `cozytensors` raises it as the \
     `Error` subclass of that code."
);

/// A failure with its code (`not_found`, `invalid`, `integrity`, `unknown_scheme`, `decode`,
/// `io`, `format`, `full`, `network`, `unsupported`: the reference's families) and what happened.
pub fn failure(code: &str, detail: impl Into<String>) -> PyErr {
    Failure::new_err((code.to_owned(), detail.into()))
}
