//! Bindings of the host agent: start one in this process and wait for it to stop.

use super::detach;
use crate::agent::{self, AgentConfig, AgentHandle};
use crate::node;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use std::time::Duration;

/// A host agent running in this process.
#[pyclass(frozen, name = "Agent", module = "monarch_kernel._native")]
pub struct PyAgent {
    handle: AgentHandle,
}

#[pymethods]
impl PyAgent {
    #[getter]
    fn addr(&self) -> String {
        self.handle.addr.clone()
    }

    /// True once the agent has begun to stop (a shutdown, or its idle timeout).
    #[getter]
    fn stopping(&self) -> bool {
        self.handle.agent.is_stopping()
    }

    /// Blocks (GIL released) until the agent has stopped its workers and itself.
    fn wait(&self, py: Python<'_>) {
        detach(py, || self.handle.wait(node::handle()));
    }
}

/// Starts a host agent on `bind_host` (127.0.0.1 unless given) and `port` (0: a free
/// one; a pod of its own takes a fixed one, which its readiness probe knows); its
/// workers listen there too. With `tls_cert` and `tls_key` (the mesh's server
/// certificate and key, PEM) the agent and its workers serve TLS, and with `tls_ca`
/// the workers check the mesh's other workers against it (TLS-1, TLS-2).
#[pyfunction]
#[pyo3(signature = (name, token, log_dir, idle_timeout_s, first_attach_timeout_s=30.0, meta=String::new(), bind_host=String::from("127.0.0.1"), tls_cert=None, tls_key=None, tls_ca=None, port=0))]
#[allow(clippy::too_many_arguments)] // eleven from Python, and the GIL token
fn start_agent(
    py: Python<'_>,
    name: String,
    token: String,
    log_dir: String,
    idle_timeout_s: f64,
    first_attach_timeout_s: f64,
    meta: String,
    bind_host: String,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_ca: Option<String>,
    port: u16,
) -> PyResult<PyAgent> {
    let tls = super::tls::server_identity(tls_cert, tls_key)?;
    if let Some(ca) = &tls_ca {
        // The same check set_mesh_ca makes, here where it is given.
        crate::rpc::tls::check_ca(ca).map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    let cfg = AgentConfig {
        name,
        token,
        log_dir: log_dir.into(),
        idle_timeout: Duration::from_secs_f64(idle_timeout_s.max(0.0)),
        first_attach_timeout: Duration::from_secs_f64(first_attach_timeout_s.max(0.0)),
        meta,
        bind_host,
        tls,
        tls_ca,
        relay_hold: agent::relay::hold_from_env(),
    };
    let handle = detach(py, || {
        let l = std::net::TcpListener::bind((cfg.bind_host.as_str(), port))
            .map_err(agent::AgentError::from)?;
        agent::start(node::handle(), cfg, l)
    })
    .map_err(|e| PyOSError::new_err(format!("cannot start the host agent: {e}")))?;
    Ok(PyAgent { handle })
}

/// Worker side of AGENT-1: exits this process at once when stdin reaches EOF (the
/// agent closed it or died). Call after reading the token line.
#[pyfunction]
fn exit_when_stdin_closes() {
    std::thread::Builder::new()
        .name("monarch-stdin-watch".into())
        .spawn(|| {
            let mut buf = [0u8; 64];
            loop {
                // SAFETY: reads into a valid local buffer from fd 0.
                let n = unsafe { libc::read(0, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
                if n == 0
                    || (n < 0
                        && std::io::Error::last_os_error().kind()
                            != std::io::ErrorKind::Interrupted)
                {
                    // SAFETY: _exit ends the process without running any more code.
                    unsafe { libc::_exit(70) };
                }
            }
        })
        .ok();
}

/// FORK-1, in a worker the template forked: this process gets SIGKILL when its parent
/// (the template) ends, as one the agent started gets when the agent does (AGENT-1).
/// False if the parent is already gone (`parent` is not the parent any more).
#[pyfunction]
fn die_with_parent(parent: i32) -> bool {
    // SAFETY: prctl and getppid have no memory-safety preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::getppid() == parent
    }
}

/// How the host agent reads a worker's output line: `(origin, text)` (for the test
/// that Python's worker writes what the agent parses).
#[pyfunction]
fn split_origin<'py>(py: Python<'py>, line: &[u8]) -> (String, Bound<'py, pyo3::types::PyBytes>) {
    let (origin, text) = crate::agent::process::split_origin(line);
    (origin, pyo3::types::PyBytes::new(py, text))
}

/// How the host agent classifies a worker's output line (without its origin tag):
/// `(kind, payload)`, the kind as `LogLine.Kind`'s number (for the test that what
/// Python's worker writes is read as the kind it means).
#[pyfunction]
fn classify_line<'py>(py: Python<'py>, line: &[u8]) -> (i32, Bound<'py, pyo3::types::PyBytes>) {
    let (kind, payload) = crate::agent::marks::classify(line);
    (kind as i32, pyo3::types::PyBytes::new(py, payload))
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use crate::agent::marks::{
        ACTOR_FAILURE_MARK, DISPLAY_MARK, FLUSH_MARK, INPUT_MARK, PROMPT_MARK,
    };
    use crate::agent::process::{ORIGIN_END, ORIGIN_START};
    m.add_class::<PyAgent>()?;
    m.add_function(wrap_pyfunction!(split_origin, m)?)?;
    m.add_function(wrap_pyfunction!(classify_line, m)?)?;
    for (name, mark) in [
        ("FLUSH_MARK", FLUSH_MARK),
        ("PROMPT_MARK", PROMPT_MARK),
        ("INPUT_MARK", INPUT_MARK),
        ("DISPLAY_MARK", DISPLAY_MARK),
        ("ACTOR_FAILURE_MARK", ACTOR_FAILURE_MARK),
    ] {
        m.add(name, String::from_utf8_lossy(mark).into_owned())?;
    }
    m.add("ORIGIN_START", char::from(ORIGIN_START).to_string())?;
    m.add("ORIGIN_END", char::from(ORIGIN_END).to_string())?;
    m.add_function(wrap_pyfunction!(start_agent, m)?)?;
    m.add_function(wrap_pyfunction!(exit_when_stdin_closes, m)?)?;
    m.add_function(wrap_pyfunction!(die_with_parent, m)?)?;
    Ok(())
}
