//! Python bindings (`monarch_kernel._native`). The only place pyo3 appears.
//!
//! Arguments are converted first, then every wait, copy or network call runs with the
//! GIL released ([`detach`]). PY-1: runtime threads enter Python only through
//! [`enter_python`]. PY-2: once the interpreter exits (our last atexit handler ran), a
//! thread other than the exiting one never enters Python again: a wait that ends then
//! parks its thread for good (the process is ending), a runtime thread's callback is
//! dropped, and the threads already on their way back into Python get there before
//! Python finalises (the exit gate). CPython 3.11 ends a thread that enters a
//! finalising interpreter with `pthread_exit`, whose unwinding through Rust frames
//! aborts the process ("FATAL: exception not rethrown").

mod agent;
mod agent_conn;
mod client;
mod errors;
mod fanout;
mod pending;
mod plain;
mod server;
mod tls;
mod transfer;

use pyo3::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The exit gate (PY-2): its top bit is set by [`shutdown_runtime`]; the rest counts
/// the threads between the end of a native wait and holding the GIL again (and the
/// runtime threads running a Python callback). A thread passes only while the bit is
/// clear; the exiting thread lets those that passed finish before Python finalises,
/// so none re-enters a finalising interpreter (CPython 3.11 ends such a thread with
/// `pthread_exit`, whose unwinding through Rust frames aborts the process).
static GATE: AtomicU64 = AtomicU64::new(0);
const EXITING: u64 = 1 << 63;
/// The thread that runs the interpreter's exit (it passes the gate always).
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// Passes the gate: true, counted (leave with [`leave_gate`]); false once exiting.
fn enter_gate() -> bool {
    let mut now = GATE.load(Ordering::SeqCst);
    loop {
        if now & EXITING != 0 {
            return false;
        }
        match GATE.compare_exchange(now, now + 1, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(seen) => now = seen,
        }
    }
}

fn leave_gate() {
    GATE.fetch_sub(1, Ordering::SeqCst);
}

fn is_exit_thread() -> bool {
    EXIT_THREAD.get() == Some(&std::thread::current().id())
}

/// Runs `f` with the GIL released, as `py.detach`; a thread that comes back after the
/// interpreter began to exit parks for good instead of holding the GIL again (PY-2).
pub(crate) fn detach<T: Send, F: Send + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    let (out, counted) = py.detach(|| {
        let out = f();
        if is_exit_thread() {
            return (out, false);
        }
        if !enter_gate() {
            loop {
                std::thread::park(); // the process is ending
            }
        }
        (out, true)
    });
    if counted {
        leave_gate(); // the GIL is held again
    }
    out
}

/// The one audited path from a runtime thread into Python: runs `cb()` with the GIL,
/// reporting (never propagating) its exception.
pub(crate) fn enter_python(cb: Py<PyAny>) {
    if !enter_gate() {
        return std::mem::forget(cb); // no Python to run it in, nor to drop it (PY-2)
    }
    Python::attach(|py| {
        if let Err(e) = cb.call0(py) {
            e.write_unraisable(py, Some(cb.bind(py)));
        }
    });
    leave_gate();
}

/// Stops this process's runtime (called from Python's atexit, last): closes the exit
/// gate, lets the threads that passed it hold the GIL again (it is free meanwhile),
/// then stops the runtime.
#[pyfunction]
fn shutdown_runtime(py: Python<'_>) {
    let _ = EXIT_THREAD.set(std::thread::current().id());
    GATE.fetch_or(EXITING, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while GATE.load(Ordering::SeqCst) & !EXITING != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        crate::node::shutdown(Duration::from_millis(200))
    });
}

/// NODE-2: how many threads run the native runtime's tasks; only before its first
/// use (False after).
#[pyfunction]
fn set_runtime_threads(n: usize) -> bool {
    crate::node::set_threads(n)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register_python_bindings(m)?;
    client::register_python_bindings(m)?;
    fanout::register_python_bindings(m)?;
    server::register_python_bindings(m)?;
    agent::register_python_bindings(m)?;
    agent_conn::register_python_bindings(m)?;
    tls::register_python_bindings(m)?;
    transfer::register_python_bindings(m)?;
    m.add_function(wrap_pyfunction!(shutdown_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(set_runtime_threads, m)?)?;
    m.add("MAX_MESSAGE_BYTES", crate::rpc::MAX_MESSAGE_BYTES)?;
    Ok(())
}
