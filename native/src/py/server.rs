//! Bindings of the `Worker` server: the inbox a Python dispatcher drains.

use super::client::{buffers_to_py, to_bytes_vec};
use super::detach;
use super::errors::to_py;
use crate::node;
use crate::proto::v1::ReplyKind;
use crate::rpc::inbox::{Incoming, Kind, Lane, LANE_LOOP};
use crate::rpc::server::WorkerHost;
use bytes::Bytes;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::cell::RefCell;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::Duration;

/// Serves the `Worker` service for this process.
#[pyclass(frozen, name = "WorkerServer", module = "monarch_kernel._native")]
pub struct PyWorkerServer {
    host: WorkerHost,
}

/// One message of a lane: a spawn, a stop, a call, a port message or a cancel. Its
/// fields are Python objects made once, so reading one is a reference, not a
/// conversion (the dispatcher reads several per call).
#[pyclass(frozen, get_all, name = "Incoming", module = "monarch_kernel._native")]
pub struct PyIncoming {
    /// What answers it (`WorkerServer.reply`); 0 for messages with no reply (oneway).
    token: u64,
    /// `KIND_SPAWN`, `KIND_STOP`, `KIND_CALL`, `KIND_PORT` or `KIND_CANCEL`.
    kind: u8,
    /// The caller's id of the call (what a cancel names).
    call_id: u64,
    /// The actor mesh's name.
    actor: Py<PyString>,
    /// The endpoint (calls) or "" (others).
    method: Py<PyString>,
    /// The pickled arguments (or class and arguments, for a spawn).
    payload: Py<PyBytes>,
    /// The out-of-band buffers (pulled already where the transfer engine carried them).
    buffers: Py<PyList>,
    /// The rank of the receiving actor in the caller's (sliced) mesh.
    rank: u32,
    /// `(rank, dims, sizes)`: that rank and the caller's mesh's dims (names, sizes), as
    /// tuples; the same object as the last message's on this thread while it is the same.
    place: Py<PyTuple>,
    /// The origin of the call (the notebook cell that made it), for output routing.
    origin: Py<PyString>,
    /// `KIND_PORT`: the port's number in this process (0 for other kinds).
    port: u64,
    /// `KIND_PORT`: the rank of the actor that sent it, or None (sent from outside
    /// an actor's message).
    sender_rank: Option<u32>,
    /// `KIND_PORT`: the payload is an exception for the receiver to raise.
    is_exception: bool,
}

#[pymethods]
impl PyWorkerServer {
    /// Serves on the inherited listening socket `listen_fd`, or binds `addr`; TLS with
    /// the mesh's server certificate and key (PEM) when given (TLS-1).
    #[new]
    #[pyo3(signature = (token, listen_fd=None, addr="127.0.0.1:0", tls_cert=None, tls_key=None))]
    fn new(
        py: Python<'_>,
        token: &str,
        listen_fd: Option<i32>,
        addr: &str,
        tls_cert: Option<String>,
        tls_key: Option<String>,
    ) -> PyResult<Self> {
        let tls = super::tls::server_identity(tls_cert, tls_key)?;
        let host = detach(py, || match listen_fd {
            // SAFETY: the agent passed us this descriptor to own (MONARCH_LISTEN_FD).
            Some(fd) => WorkerHost::serve(
                node::handle(),
                unsafe { std::net::TcpListener::from_raw_fd(fd) },
                token,
                tls.as_ref(),
            ),
            None => WorkerHost::bind_with(node::handle(), addr, token, tls.as_ref()),
        })
        .map_err(to_py)?;
        Ok(PyWorkerServer { host })
    }

    #[getter]
    fn addr(&self) -> String {
        self.host.addr.clone()
    }

    /// Whether it serves TLS.
    #[getter]
    fn tls(&self) -> bool {
        self.host.tls
    }

    /// How many calls this worker holds unanswered (queued or running), as `Stats` says.
    fn in_flight(&self) -> usize {
        self.host.inbox.in_flight()
    }

    /// An eventfd that is readable while `lane` has items.
    #[pyo3(signature = (lane=LANE_LOOP))]
    fn fileno(&self, lane: usize) -> PyResult<i32> {
        Ok(self.lane(lane)?.fd())
    }

    /// Every message queued in `lane` (`Incoming`). Does not block.
    #[pyo3(signature = (lane=LANE_LOOP))]
    fn take(&self, py: Python<'_>, lane: usize) -> PyResult<Vec<PyIncoming>> {
        to_py_items(py, self.lane(lane)?.take())
    }

    /// Like `take`, but waits up to `timeout` seconds (None: with no limit; GIL
    /// released) while `lane` is empty. Returns early, maybe empty, on `wake(lane)`.
    #[pyo3(signature = (lane, timeout=None))]
    fn take_wait(
        &self,
        py: Python<'_>,
        lane: usize,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyIncoming>> {
        let lane = self.lane(lane)?;
        let t = timeout.map(|t| Duration::from_secs_f64(t.max(0.0)));
        let inbox = &self.host.inbox;
        let items = detach(py, || inbox.take_wait(&lane, t));
        to_py_items(py, items)
    }

    /// FAST-1: waits as `take_wait(lane)` does, then runs what came: a plain call to an
    /// actor of `plain`'s table here, every other item by `handle(runner, item)`.
    /// LANE-2: goes on waiting and running until the lane is woken (`wake`: a job, a
    /// stop, an interrupt), then returns, so the caller's loop runs its jobs; a call's
    /// hot path runs no line of that loop.
    fn serve(
        &self,
        py: Python<'_>,
        lane: usize,
        handle: &Bound<'_, PyAny>,
        runner: &Bound<'_, PyAny>,
        plain: &Bound<'_, super::plain::PlainCalls>,
    ) -> PyResult<()> {
        let lane = self.lane(lane)?;
        let inbox = &self.host.inbox;
        let plain = plain.get();
        let mut kept = super::plain::Kept::default(); // (restored as this returns)
        loop {
            let items = detach(py, || inbox.take_wait(&lane, None));
            if items.is_empty() {
                lane.take_woken(); // (woken with nothing queued)
                return Ok(());
            }
            for i in items {
                if let Some(i) = plain.run(py, inbox, runner, &mut kept, i)? {
                    kept.restore(); // (the dispatcher runs it as it would any item)
                    let item = to_py_items(py, vec![i])?
                        .pop()
                        .expect("one item in, one out");
                    handle.call1((runner, item))?;
                }
            }
            if lane.take_woken() {
                return Ok(());
            }
        }
    }

    /// Wakes a `take_wait` or a `serve` on `lane` (LANE-2).
    fn wake(&self, lane: usize) -> PyResult<()> {
        self.lane(lane)?.wake();
        Ok(())
    }

    /// Opens a lane for one actor's calls; returns its index.
    fn open_lane(&self) -> PyResult<usize> {
        self.host.inbox.open_lane().map_err(to_py)
    }

    /// Closes `lane`; returns the items still queued in it.
    fn close_lane(&self, py: Python<'_>, lane: usize) -> PyResult<Vec<PyIncoming>> {
        to_py_items(py, self.host.inbox.close_lane(lane))
    }

    /// Routes later calls to `actor` to `lane` (None: back to the loop lane).
    #[pyo3(signature = (actor, lane))]
    fn route(&self, actor: &str, lane: Option<usize>) {
        self.host.inbox.route(actor, lane);
    }

    /// Answers the item that carried `token`.
    fn reply(
        &self,
        py: Python<'_>,
        token: u64,
        kind: i32,
        payload: &[u8],
        buffers: Vec<PyBuffer<u8>>,
    ) -> PyResult<()> {
        let kind = ReplyKind::try_from(kind)
            .map_err(|_| PyValueError::new_err(format!("unknown reply kind {kind}")))?;
        let bufs = to_bytes_vec(py, &buffers)?;
        let payload = Bytes::copy_from_slice(payload);
        // Non-blocking (a channel send): no need to release the GIL.
        self.host.inbox.reply(token, kind, payload, bufs);
        Ok(())
    }

    /// Stops serving.
    fn shutdown(&self) {
        self.host.shutdown();
    }
}

impl PyWorkerServer {
    fn lane(&self, lane: usize) -> PyResult<Arc<Lane>> {
        self.host.inbox.lane(lane).ok_or_else(|| {
            PyValueError::new_err(format!("lane {lane} is closed or was never opened"))
        })
    }
}

/// A message's rank, and its caller's mesh's dims and sizes.
pub(super) type Place = (u32, Vec<String>, Vec<u32>);

/// The Python objects of the last message a thread took, reused for the next one where
/// it has the same (an actor's calls mostly come from one caller to one rank): a
/// call's hot path makes no string, and the dispatcher compares places by identity.
#[derive(Default)]
pub(super) struct Last {
    pub(super) actor: Option<(String, Py<PyString>)>,
    pub(super) method: Option<(String, Py<PyString>)>,
    pub(super) origin: Option<(String, Py<PyString>)>,
    place: Option<(Place, Py<PyTuple>)>,
    /// `actor.method` of the last plain call (FAST-1).
    what: Option<((String, String), Py<PyString>)>,
}

thread_local! {
    pub(super) static LAST: RefCell<Last> = RefCell::new(Last::default());
}

/// `text` as a Python string: `last`'s when it holds the same text, else a new one,
/// kept there.
pub(super) fn same_str(
    py: Python<'_>,
    last: &mut Option<(String, Py<PyString>)>,
    text: &str,
) -> Py<PyString> {
    match last {
        Some((t, s)) if t == text => s.clone_ref(py),
        _ => {
            let s = PyString::new(py, text).unbind();
            *last = Some((text.to_string(), s.clone_ref(py)));
            s
        }
    }
}

/// `i`'s `(rank, dims, sizes)`: `last`'s object while it is the same.
pub(super) fn place_of(py: Python<'_>, last: &mut Last, i: &Incoming) -> PyResult<Py<PyTuple>> {
    if let Some((p, t)) = &last.place {
        if p.0 == i.rank && p.1 == i.dims && p.2 == i.sizes {
            return Ok(t.clone_ref(py));
        }
    }
    let t = PyTuple::new(
        py,
        [
            i.rank.into_pyobject(py)?.into_any(),
            PyTuple::new(py, &i.dims)?.into_any(),
            PyTuple::new(py, &i.sizes)?.into_any(),
        ],
    )?
    .unbind();
    last.place = Some(((i.rank, i.dims.clone(), i.sizes.clone()), t.clone_ref(py)));
    Ok(t)
}

/// `actor.method` of `i`: `last`'s string while it is the same.
pub(super) fn what_of(py: Python<'_>, last: &mut Last, i: &Incoming) -> PyResult<Py<PyString>> {
    if let Some(((a, m), s)) = &last.what {
        if *a == i.actor && *m == i.method {
            return Ok(s.clone_ref(py));
        }
    }
    let s = PyString::new(py, &format!("{}.{}", i.actor, i.method)).unbind();
    last.what = Some(((i.actor.clone(), i.method.clone()), s.clone_ref(py)));
    Ok(s)
}

fn to_py_items(py: Python<'_>, items: Vec<Incoming>) -> PyResult<Vec<PyIncoming>> {
    LAST.with(|last| {
        let last = &mut *last.borrow_mut();
        items
            .into_iter()
            .map(|i| {
                let place = place_of(py, last, &i)?;
                Ok(PyIncoming {
                    token: i.token,
                    kind: i.kind as u8,
                    call_id: i.call_id,
                    buffers: PyList::new(py, buffers_to_py(py, &i.payload, &i.buffers)?)?.unbind(),
                    payload: PyBytes::new(py, &i.payload).unbind(),
                    actor: same_str(py, &mut last.actor, &i.actor),
                    method: same_str(py, &mut last.method, &i.method),
                    rank: i.rank,
                    place,
                    origin: same_str(py, &mut last.origin, &i.origin),
                    port: i.port.map_or(0, |p| p.port),
                    sender_rank: i.port.and_then(|p| p.rank),
                    is_exception: i.port.is_some_and(|p| p.is_exception),
                })
            })
            .collect()
    })
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyWorkerServer>()?;
    m.add_class::<PyIncoming>()?;
    m.add_class::<super::plain::PlainCalls>()?;
    m.add("LANE_LOOP", LANE_LOOP)?;
    m.add("KIND_SPAWN", Kind::Spawn as u8)?;
    m.add("KIND_STOP", Kind::Stop as u8)?;
    m.add("KIND_CALL", Kind::Call as u8)?;
    m.add("KIND_CANCEL", Kind::Cancel as u8)?;
    m.add("KIND_PORT", Kind::Port as u8)?;
    m.add("REPLY_RESULT", ReplyKind::Result as i32)?;
    m.add("REPLY_EXCEPTION", ReplyKind::Exception as i32)?;
    m.add("REPLY_REJECTED", ReplyKind::Rejected as i32)?;
    m.add("REPLY_FENCED", ReplyKind::Fenced as i32)?;
    Ok(())
}
