//! Binding of the fan-out (`rpc/client/fanout.rs`): calls to the procs of a mesh
//! across hosts, through their hosts' relays (RELAY-1, TREE-1), by the paths ORDER-1
//! allows.

use super::client::{to_bytes_vec, PyEndpoint, PyWorkerConn};
use super::detach;
use super::errors::to_py;
use super::pending::{Conns, PyCalls};
use crate::node;
use crate::rpc::client::Fanout;
use crate::sync::lock;
use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::sync::{Arc, Mutex};

/// How a mesh's procs lie on its hosts, to call procs across hosts (RELAY-1) by the
/// paths ORDER-1 allows: made once per mesh (converted once); every fan-out of one
/// mesh token in this process keeps one order (`rpc/client/order.rs`).
#[pyclass(frozen, name = "Fanout", module = "monarch_kernel._native")]
pub struct PyFanout {
    inner: Fanout,
    /// The list of connections it was last called with, held (so that its identity
    /// is no other list's), and that list converted: a mesh's calls pass the same
    /// list each time (`ActorMesh._conns()`, made once per generation and never
    /// changed), and converting 1,024 connections per call touched 1,024 cold objects.
    last: Mutex<Option<(Py<PyList>, Conns)>>,
    /// The tuples of proc ranks and of mesh indices it was last called with, held,
    /// and converted: a call to a whole mesh passes that mesh's own tuples each time
    /// (`Shape.ranks`, `ActorMesh._everyone()`: immutable), and converting 1,024
    /// integers twice per call was a cost per rank on the calling thread (TREE-1).
    indices: [Mutex<Option<KeptIndices>>; 2],
}

/// Proc ranks or mesh indices, converted (shared with the cache that keeps them).
type Indices = Arc<[u32]>;

/// A tuple of them, held, and its conversion.
type KeptIndices = (Py<PyTuple>, Indices);

impl PyFanout {
    /// `conns` converted: the last list's conversion if it is that list again.
    fn conns(&self, conns: &Bound<'_, PyAny>) -> PyResult<Conns> {
        let list = conns.cast::<PyList>().ok();
        if let (Some(list), Some((held, done))) = (list, &*lock(&self.last)) {
            if held.is(list) && done.len() == list.len() {
                return Ok(done.clone());
            }
        }
        let done: Conns = conns
            .extract::<Vec<PyRef<'_, PyWorkerConn>>>()?
            .iter()
            .map(|c| c.inner.clone())
            .collect();
        if let Some(list) = list {
            *lock(&self.last) = Some((list.clone().unbind(), done.clone()));
        }
        Ok(done)
    }

    /// `seq` (integers) converted, through cache `which` of [`PyFanout::indices`]:
    /// the last tuple's conversion if it is that tuple again.
    fn indices(&self, which: usize, seq: &Bound<'_, PyAny>) -> PyResult<Indices> {
        let tuple = seq.cast::<PyTuple>().ok();
        let cache = &self.indices[which];
        if let (Some(t), Some((held, done))) = (tuple, &*lock(cache)) {
            if held.is(t) {
                return Ok(done.clone());
            }
        }
        let done: Indices = seq.extract::<Vec<u32>>()?.into();
        if let Some(t) = tuple {
            *lock(cache) = Some((t.clone().unbind(), done.clone()));
        }
        Ok(done)
    }
}

#[pymethods]
impl PyFanout {
    /// `hosts`: each host's agent address (its relay), first proc rank and number of
    /// procs.
    #[new]
    fn new(token: &str, hosts: Vec<(String, u32, u32)>) -> PyResult<Self> {
        if hosts.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a fan-out needs the mesh's hosts",
            ));
        }
        Ok(PyFanout {
            inner: Fanout::new(token, &hosts),
            last: Mutex::new(None),
            indices: Default::default(),
        })
    }

    /// Sends one call of `endpoint` to the procs `procs`, each by the path ORDER-1
    /// allows: direct on `conns[i]` (the connection to `procs[i]`), or with the other
    /// procs of its host through the host's agent (RELAY-1). `ranks[i]` is the index
    /// of `procs[i]` within the called mesh. Returns the pending calls in the order of
    /// `procs` (none if `oneway`), as one `Calls`.
    #[pyo3(signature = (endpoint, conns, procs, ranks, payload, buffers, oneway=false, origin=""))]
    #[allow(clippy::too_many_arguments)] // eight from Python, and the GIL token
    fn call(
        &self,
        py: Python<'_>,
        endpoint: PyRef<'_, PyEndpoint>,
        conns: &Bound<'_, PyAny>,
        procs: &Bound<'_, PyAny>,
        ranks: &Bound<'_, PyAny>,
        payload: &[u8],
        buffers: Vec<PyBuffer<u8>>,
        oneway: bool,
        origin: &str,
    ) -> PyResult<PyCalls> {
        let conns = self.conns(conns)?;
        let (procs, ranks) = (self.indices(0, procs)?, self.indices(1, ranks)?);
        if procs.len() != ranks.len() || procs.len() != conns.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "conns, procs and ranks differ in length",
            ));
        }
        let bufs = to_bytes_vec(py, &buffers)?;
        let payload = Bytes::copy_from_slice(payload);
        let t = endpoint.target(&payload, &bufs, oneway, origin);
        let sent = detach(py, || {
            self.inner.send(node::handle(), &t, &conns, &procs, &ranks)
        })
        .map_err(to_py)?;
        Ok(PyCalls::new(sent, conns))
    }
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFanout>()?;
    Ok(())
}
