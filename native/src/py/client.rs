//! Bindings of the `Worker` and `Relay` client: connections, calls and their fan-out
//! across hosts, pending calls.

use super::detach;
use super::errors::to_py;
use super::pending::PendingCall;
use crate::node;
use crate::proto::v1::{CallCommand, PortMessage};
use crate::rpc::client::{Target, WorkerConn};
use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};
use std::sync::Arc;
use std::time::Duration;

/// A connection to one worker (shared per address and token within the process).
#[pyclass(frozen, name = "WorkerConn", module = "monarch_kernel._native")]
pub struct PyWorkerConn {
    pub(super) inner: Arc<WorkerConn>,
}

/// Copies Python buffer-protocol objects (format "B") into owned bytes.
pub(crate) fn to_bytes_vec(py: Python<'_>, bufs: &[PyBuffer<u8>]) -> PyResult<Vec<Bytes>> {
    bufs.iter()
        .map(|b| Ok(Bytes::from(b.to_vec(py)?)))
        .collect()
}

/// Out-of-band buffers as writable bytearrays (tensors refuse read-only memory); a
/// buffer pulled as its message arrived (XFER-2) is the `RecvBuffer` it landed in,
/// in place of its descriptor, so it lives as long as the message.
pub(crate) fn buffers_to_py(
    py: Python<'_>,
    payload: &[u8],
    bufs: &[Bytes],
) -> PyResult<Vec<Py<PyAny>>> {
    let fetched = crate::transfer::take_message(payload, bufs);
    bufs.iter()
        .zip(fetched)
        .map(|(b, f)| match f {
            Some(region) => Ok(Py::new(py, super::transfer::RecvBuffer::new(region))?.into_any()),
            None => Ok(PyByteArray::new(py, b).unbind().into_any()),
        })
        .collect()
}

impl PyWorkerConn {
    /// The connection a new command goes on (CLIENT-3: never a lost one).
    fn conn(&self) -> PyResult<Arc<WorkerConn>> {
        self.inner.current(node::handle()).map_err(to_py)
    }
}

#[pymethods]
impl PyWorkerConn {
    #[new]
    fn new(py: Python<'_>, addr: &str, token: &str) -> PyResult<Self> {
        let inner = detach(py, || WorkerConn::get(node::handle(), addr, token)).map_err(to_py)?;
        Ok(PyWorkerConn { inner })
    }

    /// This process's connection to the relay of the host agent at `addr` (RELAY-1):
    /// it speaks the agent's `Relay` service, which carries fanned-out calls only.
    #[staticmethod]
    fn relay(py: Python<'_>, addr: &str, token: &str) -> PyResult<Self> {
        let inner = detach(py, || WorkerConn::relay(node::handle(), addr, token)).map_err(to_py)?;
        Ok(PyWorkerConn { inner })
    }

    #[getter]
    fn addr(&self) -> String {
        self.inner.addr().to_string()
    }

    /// Whether it talks TLS (this process had the mesh's CA when it opened; TLS-2).
    #[getter]
    fn tls(&self) -> bool {
        self.inner.is_tls()
    }

    /// Why the connection was lost, or None while it is up.
    fn lost(&self) -> Option<String> {
        self.inner.lost().map(|e| e.to_string())
    }

    /// Creates (or replaces) actor `name` from a pickled (class, args, kwargs).
    #[pyo3(signature = (name, payload, buffers, origin=""))]
    fn spawn_actor(
        &self,
        py: Python<'_>,
        name: &str,
        payload: &[u8],
        buffers: Vec<PyBuffer<u8>>,
        origin: &str,
    ) -> PyResult<PendingCall> {
        let bufs = to_bytes_vec(py, &buffers)?;
        let conn = self.conn()?;
        let slot = conn.spawn_actor(
            node::handle(),
            name,
            Bytes::copy_from_slice(payload),
            bufs,
            origin,
        );
        Ok(PendingCall::new(slot, 0, conn))
    }

    /// Sends a message for port `port` of the server at the other end: `payload` and
    /// `buffers` are the pickled value alone; `rank` is the sender's (None outside an
    /// actor's message), `is_exception` says the value is an exception to raise. Its
    /// reply is the receiver's acknowledgement (`REPLY_RESULT`) or refusal
    /// (`REPLY_REJECTED`, the reason in UTF-8).
    #[pyo3(signature = (port, rank, is_exception, payload, buffers, *, origin=""))]
    #[allow(clippy::too_many_arguments)] // six from Python, self and the GIL token
    fn send_port(
        &self,
        py: Python<'_>,
        port: u64,
        rank: Option<u32>,
        is_exception: bool,
        payload: &[u8],
        buffers: Vec<PyBuffer<u8>>,
        origin: &str,
    ) -> PyResult<PendingCall> {
        let bufs = to_bytes_vec(py, &buffers)?;
        let payload = Bytes::copy_from_slice(payload);
        let conn = self.conn()?;
        let header = PortMessage {
            port,
            rank,
            is_exception,
        };
        let (id, slot) = detach(py, || conn.send_port(header, &payload, &bufs, origin));
        Ok(PendingCall::new(slot, id, conn))
    }

    /// Stops actor `name`.
    fn stop_actor(&self, name: &str) -> PyResult<PendingCall> {
        let conn = self.conn()?;
        let slot = conn.stop_actor(node::handle(), name);
        Ok(PendingCall::new(slot, 0, conn))
    }

    /// Round trip through the worker's native runtime; returns (pid, the worker's epoch).
    #[pyo3(signature = (timeout=5.0))]
    fn ping(&self, py: Python<'_>, timeout: f64) -> PyResult<(u32, u64)> {
        let inner = self.conn()?;
        let r = detach(py, || {
            node::handle().block_on(async move {
                tokio::time::timeout(Duration::from_secs_f64(timeout), inner.ping()).await
            })
        });
        match r {
            Ok(r) => r.map_err(to_py),
            Err(_) => Err(PyTimeoutError::new_err(format!(
                "worker at {} did not answer a ping within {timeout} s",
                self.inner.addr()
            ))),
        }
    }

    /// The worker's counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.conn()?;
        let s = detach(py, || {
            node::handle().block_on(async move { inner.stats().await })
        })
        .map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("pid", s.pid)?;
        d.set_item("calls_received", s.calls_received)?;
        d.set_item("calls_in_flight", s.calls_in_flight)?;
        d.set_item("rejected_auth", s.rejected_auth)?;
        Ok(d)
    }
}

/// What a call is addressed to: an endpoint of an actor mesh laid out over `dims` of
/// `sizes`. Made once per endpoint (converted once), used by every call to it.
#[pyclass(frozen, name = "Endpoint", module = "monarch_kernel._native")]
pub struct PyEndpoint {
    actor: String,
    method: String,
    dims: Vec<String>,
    sizes: Vec<u32>,
    /// What a call to it does: call `method`, or spawn or stop `actor` (SPAWN-1).
    command: CallCommand,
}

impl PyEndpoint {
    fn command_to(actor: String, command: CallCommand) -> Self {
        PyEndpoint {
            actor,
            method: String::new(),
            dims: Vec::new(),
            sizes: Vec::new(),
            command,
        }
    }

    /// A call of this endpoint with `payload` and `buffers`.
    pub(super) fn target<'a>(
        &'a self,
        payload: &'a Bytes,
        buffers: &'a [Bytes],
        oneway: bool,
        origin: &'a str,
    ) -> Target<'a> {
        Target {
            actor: &self.actor,
            method: &self.method,
            payload,
            buffers,
            oneway,
            dims: &self.dims,
            sizes: &self.sizes,
            origin,
            command: self.command,
        }
    }
}

#[pymethods]
impl PyEndpoint {
    #[new]
    #[pyo3(signature = (actor, method, dims=Vec::new(), sizes=Vec::new()))]
    fn new(actor: String, method: String, dims: Vec<String>, sizes: Vec<u32>) -> PyResult<Self> {
        if dims.len() != sizes.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "dims and sizes differ in length",
            ));
        }
        Ok(PyEndpoint {
            actor,
            method,
            dims,
            sizes,
            command: CallCommand::Endpoint,
        })
    }

    /// SPAWN-1: what a spawn of actor `actor` sent as a call is addressed to: its
    /// payload is the pickled (class, args, kwargs), and each reply says the
    /// constructor returned, as `WorkerConn.spawn_actor`'s.
    #[staticmethod]
    fn spawning(actor: String) -> Self {
        Self::command_to(actor, CallCommand::Spawn)
    }

    /// SPAWN-1: what a stop of actor `actor` sent as a call is addressed to (an empty
    /// payload; each reply says the actor ended, as `WorkerConn.stop_actor`'s).
    #[staticmethod]
    fn stopping(actor: String) -> Self {
        Self::command_to(actor, CallCommand::Stop)
    }

    #[getter]
    fn actor(&self) -> &str {
        &self.actor
    }

    #[getter]
    fn method(&self) -> &str {
        &self.method
    }
}

/// Sends one call of `endpoint` to every connection in `conns` (one Python call, one
/// GIL release); `ranks[i]` is the index of `conns[i]` within the called mesh.
/// Returns the pending calls in the same order, or an empty list if `oneway`.
#[pyfunction]
#[pyo3(signature = (endpoint, conns, ranks, payload, buffers, oneway=false, origin=""))]
#[allow(clippy::too_many_arguments)] // seven from Python, and the GIL token
fn call(
    py: Python<'_>,
    endpoint: PyRef<'_, PyEndpoint>,
    conns: Vec<PyRef<'_, PyWorkerConn>>,
    ranks: Vec<u32>,
    payload: &[u8],
    buffers: Vec<PyBuffer<u8>>,
    oneway: bool,
    origin: &str,
) -> PyResult<Vec<PendingCall>> {
    if ranks.len() != conns.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "conns and ranks differ in length",
        ));
    }
    let bufs = to_bytes_vec(py, &buffers)?;
    let payload = Bytes::copy_from_slice(payload);
    let targets = conns
        .iter()
        .map(|c| c.conn())
        .collect::<PyResult<Vec<_>>>()?;
    let t = endpoint.target(&payload, &bufs, oneway, origin);
    let sent = detach(py, || {
        targets
            .iter()
            .zip(&ranks)
            .map(|(c, &r)| {
                let (id, slot) = c.call(&t, r);
                (id, slot, c.clone())
            })
            .collect::<Vec<_>>()
    });
    Ok(sent
        .into_iter()
        .filter_map(|(id, slot, c)| slot.map(|s| PendingCall::new(s, id, c)))
        .collect())
}

/// How many call messages this process has sent (a fanned-out call counts once).
#[pyfunction]
fn calls_sent() -> u64 {
    crate::rpc::client::CALLS_SENT.load(std::sync::atomic::Ordering::Relaxed)
}

/// `(messages, replies)` this process's call connections have received (a relay's batch: one).
#[pyfunction]
fn replies_received() -> (u64, u64) {
    use crate::rpc::client::{REPLIES as R, REPLY_BATCHES as B};
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    (B.load(relaxed), R.load(relaxed))
}

/// Sets the epoch that this process's commands to the mesh with `token` carry
/// (fencing: the controller that attached last owns the mesh).
#[pyfunction]
fn set_epoch(token: &str, epoch: u64) {
    crate::rpc::client::epoch_cell(token).store(epoch, std::sync::atomic::Ordering::SeqCst);
}

/// SUPERVISE-2: this process's supervision watches the workers of the mesh with
/// `token` through their agents' heartbeats; its connections to them opened from now
/// on ping every 15 s, not every second.
#[pyfunction]
fn watch_through_agents(token: &str) {
    crate::rpc::client::watch_through_agents(token);
}

/// Fails every call this process waits for from the worker (or relay) at `addr` of
/// the mesh with `token`, with `reason`, and stops resuming its connection (RESUME-1):
/// supervision declared it gone while it cannot be reached. Whether there was one.
#[pyfunction]
fn abandon_calls(addr: &str, token: &str, reason: &str) -> bool {
    let err = crate::rpc::RpcError::ConnectionLost {
        addr: addr.to_string(),
        reason: reason.to_string(),
    };
    crate::rpc::client::WorkerConn::abandon_at(addr, token, err)
}

/// Fails every call this process waits for from the procs `procs` (proc ranks) of the
/// mesh with `token` through any relay (TREE-1: through another host's agent too),
/// with `reason`. Whether any was waiting.
#[pyfunction]
fn abandon_relayed_calls(token: &str, procs: Vec<u32>, reason: &str) -> bool {
    let err = crate::rpc::RpcError::ConnectionLost {
        addr: "a relay".to_string(),
        reason: reason.to_string(),
    };
    crate::rpc::client::WorkerConn::abandon_procs(token, &procs, err)
}

/// Sets how long this process's connections try to resume a broken stream before
/// their calls fail as lost (RESUME-5); `None`: for as long as it takes (a controller,
/// whose supervision abandons the calls of hosts it declares lost).
#[pyfunction]
#[pyo3(signature = (seconds=None))]
fn set_resume_limit(seconds: Option<f64>) {
    crate::rpc::client::set_resume_limit(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))));
}

/// Pings every connection at once (heartbeats): for each, `(pid, epoch)`, `None` if
/// it did not answer within `timeout` seconds, or the exception that says why it failed.
#[pyfunction]
fn ping_all(
    py: Python<'_>,
    conns: Vec<PyRef<'_, PyWorkerConn>>,
    timeout: f64,
) -> PyResult<Vec<Py<PyAny>>> {
    let inners = conns
        .iter()
        .map(|c| c.conn())
        .collect::<PyResult<Vec<_>>>()?;
    let limit = Duration::from_secs_f64(timeout.max(0.0));
    let results = detach(py, || {
        node::handle().block_on(async move {
            let tasks: Vec<_> = inners
                .into_iter()
                .map(|c| tokio::spawn(async move { tokio::time::timeout(limit, c.ping()).await }))
                .collect();
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await.unwrap_or_else(|_| {
                    Ok(Err(crate::rpc::RpcError::Io("ping task failed".into())))
                }));
            }
            out
        })
    });
    results
        .into_iter()
        .map(|r| {
            Ok(match r {
                Err(_) => py.None(),
                Ok(Ok(v)) => v.into_pyobject(py)?.into_any().unbind(),
                Ok(Err(e)) => to_py(e).into_value(py).into_any(),
            })
        })
        .collect()
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ping_all, m)?)?;
    m.add_function(wrap_pyfunction!(set_epoch, m)?)?;
    m.add_function(wrap_pyfunction!(watch_through_agents, m)?)?;
    m.add_function(wrap_pyfunction!(abandon_calls, m)?)?;
    m.add_function(wrap_pyfunction!(abandon_relayed_calls, m)?)?;
    m.add_function(wrap_pyfunction!(set_resume_limit, m)?)?;
    m.add_class::<PyWorkerConn>()?;
    m.add_class::<PyEndpoint>()?;
    m.add_function(wrap_pyfunction!(call, m)?)?;
    m.add_function(wrap_pyfunction!(calls_sent, m)?)?;
    m.add_function(wrap_pyfunction!(replies_received, m)?)?;
    super::pending::register_python_bindings(m)?;
    Ok(())
}
