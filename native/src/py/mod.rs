//! Python bindings (`monarch_kernel._native`). The only place pyo3 appears.
//!
//! Arguments are converted first, then every wait, copy or network call runs with the
//! GIL released (`py.detach`). PY-1: runtime threads enter Python only through
//! [`enter_python`].

mod agent;
mod client;
mod errors;
mod server;
mod transfer;

use pyo3::prelude::*;

/// The one audited path from a runtime thread into Python: runs `cb()` with the GIL,
/// reporting (never propagating) its exception.
pub(crate) fn enter_python(cb: Py<PyAny>) {
    Python::attach(|py| {
        if let Err(e) = cb.call0(py) {
            e.write_unraisable(py, Some(cb.bind(py)));
        }
    });
}

/// Stops this process's runtime (called from Python's atexit).
#[pyfunction]
fn shutdown_runtime(py: Python<'_>) {
    py.detach(|| crate::node::shutdown(std::time::Duration::from_millis(200)));
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register_python_bindings(m)?;
    client::register_python_bindings(m)?;
    server::register_python_bindings(m)?;
    agent::register_python_bindings(m)?;
    transfer::register_python_bindings(m)?;
    m.add_function(wrap_pyfunction!(shutdown_runtime, m)?)?;
    m.add("MAX_MESSAGE_BYTES", crate::rpc::MAX_MESSAGE_BYTES)?;
    Ok(())
}
