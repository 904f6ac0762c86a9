//! Bindings of a controller's native client of the host agents (WATCH-1): a
//! connection per agent, its `Watch` streams, the heartbeat's `PingWorkers` to all.

use super::detach;
use super::errors::to_py;
use crate::node;
use crate::rpc::client::{AgentConn, AgentWatch, WatchItem};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::time::Duration;

/// WATCH-1: a connection to one host agent for its `Watch` streams and the heartbeat's
/// `PingWorkers` (the rest of that service is grpcio's, in Python).
#[pyclass(frozen, name = "AgentConn", module = "monarch_kernel._native")]
pub struct PyAgentConn {
    inner: AgentConn,
}

#[pymethods]
impl PyAgentConn {
    #[new]
    #[pyo3(signature = (addr, token, ca_pem=None))]
    fn new(addr: &str, token: &str, ca_pem: Option<&str>) -> PyResult<Self> {
        let inner = AgentConn::open(node::handle(), addr, token, ca_pem).map_err(to_py)?;
        Ok(PyAgentConn { inner })
    }

    /// Opens a `Watch` stream (the controller's lease on the mesh, and its events).
    fn watch(&self) -> PyAgentWatch {
        PyAgentWatch {
            inner: self.inner.watch(node::handle()),
        }
    }
}

/// An agent's answer, or its failure as `(grpc status code, text)`.
fn answer_to_py(py: Python<'_>, answer: Result<Vec<u8>, (i32, String)>) -> Py<PyAny> {
    match answer {
        Ok(data) => PyBytes::new(py, &data).into_any().unbind(),
        Err(status) => status
            .into_pyobject(py)
            .map(|t| t.into_any().unbind())
            .unwrap_or_else(|_| py.None()),
    }
}

/// SUPERVISE-2: every agent of `conns` pings its running workers (passing `epoch`,
/// waiting `timeout_ms` for each; with `usage`, reading what each uses, VIEW-2); one
/// wait, with the GIL released, for every answer (at most `timeout_ms` and a second):
/// by agent, its `PingWorkersReply` encoded, or `(grpc status code, text)`.
#[pyfunction]
fn ping_agents(
    py: Python<'_>,
    conns: Vec<PyRef<'_, PyAgentConn>>,
    epoch: u64,
    timeout_ms: u32,
    usage: bool,
) -> Vec<Py<PyAny>> {
    let conns: Vec<AgentConn> = conns.iter().map(|c| c.inner.clone()).collect();
    let req = crate::proto::v1::PingWorkersRequest {
        epoch,
        timeout_ms,
        usage,
    };
    let limit = Duration::from_millis(u64::from(timeout_ms) + 1000);
    let answers = detach(py, || {
        crate::rpc::client::ping_workers(node::handle(), &conns, req, limit)
    });
    answers.into_iter().map(|a| answer_to_py(py, a)).collect()
}

/// WATCH-1: a controller's `Watch` stream on a host agent, read by the runtime; the
/// thread that handles its events waits in [`next`](PyAgentWatch::next) with the GIL
/// released.
#[pyclass(frozen, name = "AgentWatch", module = "monarch_kernel._native")]
pub struct PyAgentWatch {
    inner: AgentWatch,
}

#[pymethods]
impl PyAgentWatch {
    /// The next event (an encoded `AgentEvent`), waiting for it; at the end, None (the
    /// agent closed the stream, or it was cancelled) or `(grpc status code, text)`.
    fn next(&self, py: Python<'_>) -> Py<PyAny> {
        match detach(py, || self.inner.next_blocking()) {
            WatchItem::Event(data) => answer_to_py(py, Ok(data)),
            WatchItem::End(None) => py.None(),
            WatchItem::End(Some(status)) => answer_to_py(py, Err(status)),
        }
    }

    /// Closes the stream (ends the lease it holds); `next` gives its end after the
    /// events already read.
    fn cancel(&self) {
        self.inner.cancel();
    }
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAgentConn>()?;
    m.add_class::<PyAgentWatch>()?;
    m.add_function(wrap_pyfunction!(ping_agents, m)?)?;
    Ok(())
}
