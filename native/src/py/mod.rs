//! Python bindings (`monarch_kernel._native`). The only place pyo3 appears.
//!
//! Arguments are converted first, then every wait, copy or network call runs with the
//! GIL released ([`detach`]). PY-1: runtime threads enter Python only through
//! [`enter_python`]. PY-2: once the interpreter exits (our last atexit handler ran), a
//! thread other than the exiting one never enters Python again: a wait that ends then
//! parks its thread for good (the process is ending), and a runtime thread's callback
//! is dropped. CPython 3.11 ends such a thread with `pthread_exit`, whose unwinding
//! through Rust frames aborts the process ("FATAL: exception not rethrown").

mod agent;
mod client;
mod errors;
mod server;
mod tls;
mod transfer;

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;

/// Set by [`shutdown_runtime`] (PY-2), with the thread that is exiting.
static EXITING: AtomicBool = AtomicBool::new(false);
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Whether this thread may not enter Python again (PY-2).
fn shut_out() -> bool {
    EXITING.load(Ordering::SeqCst) && EXIT_THREAD.get() != Some(&std::thread::current().id())
}

/// Runs `f` with the GIL released, as `py.detach`, but a thread that is not the
/// exiting one and returns after the interpreter began to exit parks for good (PY-2).
pub(crate) fn detach<T: Send, F: Send + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    py.detach(|| {
        let out = f();
        while shut_out() {
            std::thread::park();
        }
        out
    })
}

/// The one audited path from a runtime thread into Python: runs `cb()` with the GIL,
/// reporting (never propagating) its exception.
pub(crate) fn enter_python(cb: Py<PyAny>) {
    if shut_out() {
        return std::mem::forget(cb); // no Python to run it in, nor to drop it (PY-2)
    }
    Python::attach(|py| {
        if let Err(e) = cb.call0(py) {
            e.write_unraisable(py, Some(cb.bind(py)));
        }
    });
}

/// Stops this process's runtime (called from Python's atexit).
#[pyfunction]
fn shutdown_runtime(py: Python<'_>) {
    let _ = EXIT_THREAD.set(std::thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| crate::node::shutdown(std::time::Duration::from_millis(200)));
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register_python_bindings(m)?;
    client::register_python_bindings(m)?;
    server::register_python_bindings(m)?;
    agent::register_python_bindings(m)?;
    tls::register_python_bindings(m)?;
    transfer::register_python_bindings(m)?;
    m.add_function(wrap_pyfunction!(shutdown_runtime, m)?)?;
    m.add("MAX_MESSAGE_BYTES", crate::rpc::MAX_MESSAGE_BYTES)?;
    Ok(())
}
