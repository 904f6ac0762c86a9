//! Bindings of calls in flight: `PendingCall` (wait, cancel, done callbacks), `Calls`
//! (the calls of one fan-out, as one object), a call's `Reply`, and `wait_all` over
//! many calls with one deadline.

use super::client::buffers_to_py;
use super::detach;
use super::errors::to_py;
use crate::node;
use crate::proto::v1::Reply;
use crate::rpc::client::{Sent, WorkerConn};
use crate::rpc::slot::{Bell, Outcome, Slot};
use pyo3::exceptions::{PyIndexError, PyTimeoutError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PySlice, PyTuple};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A call in flight: one of its own, or one of a fan-out's [`Calls`] (a view that
/// shares them: TREE-1's per-rank cost was one of these made, waited on and freed per
/// proc of every call).
#[pyclass(frozen, name = "PendingCall", module = "monarch_kernel._native")]
pub struct PendingCall {
    call: One,
}

enum One {
    Own(Sent),
    Of(Arc<Batch>, usize),
}

/// The calls of one fan-out (`Fanout.call`), in the order of its procs.
pub(super) struct Batch {
    sent: Vec<Sent>,
    /// The call's connections, shared by its relayed calls (for a worker's address).
    conns: Conns,
}

impl Drop for Batch {
    /// Replies that were never taken (the Future dropped without `get()`): what was
    /// pulled for them ahead of time (XFER-2) is freed with them.
    fn drop(&mut self) {
        for s in &self.sent {
            discard_pulled(&s.slot);
        }
    }
}

/// The calls of one fan-out to many procs as one Python object: a sequence of
/// `PendingCall`s (each made when asked for), which `wait_all` and the transfer
/// hooks read whole, with no object per proc.
#[pyclass(frozen, sequence, name = "Calls", module = "monarch_kernel._native")]
pub struct PyCalls {
    batch: Arc<Batch>,
}

impl PyCalls {
    pub(super) fn new(sent: Vec<Sent>, conns: Conns) -> Self {
        PyCalls {
            batch: Arc::new(Batch { sent, conns }),
        }
    }

    /// The call at index `at` (within bounds).
    fn at(&self, at: isize) -> PendingCall {
        PendingCall {
            call: One::Of(self.batch.clone(), at as usize),
        }
    }
}

#[pymethods]
impl PyCalls {
    fn __len__(&self) -> usize {
        self.batch.sent.len()
    }

    /// The call at index `i` (from the end if negative), or the calls of a slice, as
    /// a list.
    fn __getitem__(&self, py: Python<'_>, i: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let n = self.batch.sent.len() as isize;
        if let Ok(s) = i.cast::<PySlice>() {
            let ix = s.indices(n)?;
            let picked = (0..ix.slicelength as isize).map(|k| self.at(ix.start + k * ix.step));
            return Ok(PyList::new(py, picked)?.unbind().into_any());
        }
        let i: isize = i.extract()?;
        let at = if i < 0 { i + n } else { i };
        if !(0..n).contains(&at) {
            return Err(PyIndexError::new_err("call index out of range"));
        }
        Ok(Py::new(py, self.at(at))?.into_any())
    }

    fn __iter__(&self) -> CallsIter {
        CallsIter {
            batch: self.batch.clone(),
            next: 0,
        }
    }

    /// True once every call is done (replied or failed).
    fn done(&self) -> bool {
        self.batch.sent.iter().all(|s| s.slot.is_done())
    }
}

/// Iterates the `PendingCall`s of a [`PyCalls`].
#[pyclass(name = "CallsIterator", module = "monarch_kernel._native")]
pub struct CallsIter {
    batch: Arc<Batch>,
    next: usize,
}

#[pymethods]
impl CallsIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self) -> Option<PendingCall> {
        (self.next < self.batch.sent.len()).then(|| {
            self.next += 1;
            PendingCall {
                call: One::Of(self.batch.clone(), self.next - 1),
            }
        })
    }
}

/// Calls as Python passes them to a wait or a hook: a [`PyCalls`] (read whole), or
/// any sequence of `PendingCall`s.
pub(crate) enum CallsArg<'py> {
    Batch(Arc<Batch>),
    Each(Vec<PyRef<'py, PendingCall>>),
}

impl<'py> FromPyObject<'_, 'py> for CallsArg<'py> {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(c) = ob.cast::<PyCalls>() {
            return Ok(CallsArg::Batch(c.get().batch.clone()));
        }
        ob.extract::<Vec<PyRef<'py, PendingCall>>>()
            .map(CallsArg::Each)
            .map_err(|_| PyTypeError::new_err("expected Calls or a sequence of PendingCall"))
    }
}

impl CallsArg<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            CallsArg::Batch(b) => b.sent.len(),
            CallsArg::Each(v) => v.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each call, in order.
    pub(crate) fn each(&self) -> impl Iterator<Item = &Sent> {
        let (batch, each) = match self {
            CallsArg::Batch(b) => (Some(b.sent.iter()), None),
            CallsArg::Each(v) => (None, Some(v.iter().map(|c| c.sent()))),
        };
        batch
            .into_iter()
            .flatten()
            .chain(each.into_iter().flatten())
    }
}

/// The connections of a call to many procs, shared by its calls (`Batch`).
pub(super) type Conns = Arc<[Arc<WorkerConn>]>;

/// A call's reply: its kind (`REPLY_RESULT`, `REPLY_EXCEPTION`, `REPLY_REJECTED`,
/// `REPLY_FENCED`), the pickled payload (or, rejected or fenced, the reason in UTF-8)
/// and its out-of-band buffers (a list; none: the empty tuple).
#[pyclass(frozen, get_all, name = "Reply", module = "monarch_kernel._native")]
pub struct PyReply {
    kind: i32,
    payload: Py<PyBytes>,
    buffers: Py<PyAny>,
}

/// A reply's buffers for Python: most replies have none, and share the empty tuple
/// (1,024 empty lists per call to 1,024 procs were two runs of the collector).
fn reply_buffers(py: Python<'_>, r: &Reply) -> PyResult<Py<PyAny>> {
    if r.buffers.is_empty() {
        return Ok(PyTuple::empty(py).unbind().into_any());
    }
    Ok(PyList::new(py, buffers_to_py(py, &r.payload, &r.buffers)?)?
        .unbind()
        .into_any())
}

fn reply_to_py(py: Python<'_>, r: &Reply) -> PyResult<PyReply> {
    reply_with_payload(py, r, PyBytes::new(py, &r.payload).unbind())
}

/// `r` for Python, with `payload` (its payload's bytes object, maybe shared).
fn reply_with_payload(py: Python<'_>, r: &Reply, payload: Py<PyBytes>) -> PyResult<PyReply> {
    Ok(PyReply {
        kind: r.kind,
        payload,
        buffers: reply_buffers(py, r)?,
    })
}

fn outcome_to_py(py: Python<'_>, o: Outcome) -> PyResult<PyReply> {
    match o {
        Ok(r) => reply_to_py(py, &r),
        Err(e) => Err(to_py(e)),
    }
}

/// Waits for `slot`, releasing the GIL, waking every 50 ms to let Python run signal
/// handlers (so Ctrl-C / a kernel interrupt reaches a blocked `.get()`).
fn wait_slot(py: Python<'_>, slot: &Arc<Slot>, deadline: Option<Instant>) -> PyResult<Outcome> {
    if let Some(o) = slot.outcome() {
        return Ok(o); // done: no need to let go of the GIL (1,024 of them per call)
    }
    loop {
        let chunk = match deadline {
            None => Duration::from_millis(50),
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50)),
        };
        if let Some(o) = detach(py, || slot.wait(Some(chunk))) {
            return Ok(o);
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PyTimeoutError::new_err("timed out waiting for the reply"));
        }
    }
}

fn deadline(timeout: Option<f64>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)))
}

/// What was pulled ahead of time (XFER-2) for `slot`'s reply, freed: its reply is
/// let go untaken.
fn discard_pulled(slot: &Slot) {
    // (only a reply with buffers can have had any pulled: the others, 1,024 of them
    // after a call to 1,024 procs, are let go without a copy)
    let pulled = slot.peek(|o| match o {
        Some(Ok(r)) if !r.buffers.is_empty() => Some((r.payload.clone(), r.buffers.clone())),
        _ => None,
    });
    if let Some((payload, buffers)) = pulled {
        crate::transfer::discard_message(&payload, &buffers);
    }
}

impl Drop for PendingCall {
    /// A reply that was never taken (its Future dropped without `get()`): what was
    /// pulled for it ahead of time (XFER-2) is freed with it (one of a fan-out's
    /// calls: with the fan-out's, once nothing holds any of them).
    fn drop(&mut self) {
        if let One::Own(s) = &self.call {
            discard_pulled(&s.slot);
        }
    }
}

impl PendingCall {
    pub(super) fn new(slot: Arc<Slot>, call_id: u64, conn: Arc<WorkerConn>) -> Self {
        PendingCall {
            call: One::Own(Sent {
                call_id,
                slot,
                conn,
                relayed: None,
            }),
        }
    }

    fn sent(&self) -> &Sent {
        match &self.call {
            One::Own(s) => s,
            One::Of(b, i) => &b.sent[*i],
        }
    }

    /// The slot its reply completes: the transfer bindings hook the end of the
    /// registrations a call carries on it, and wait on it.
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.sent().slot
    }
}

#[pymethods]
impl PendingCall {
    /// Waits for the reply: `(kind, payload, buffers)`. Raises TimeoutError,
    /// ConnectionLost, AuthError or MessageTooLarge.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyReply> {
        let o = wait_slot(py, self.slot(), deadline(timeout))?;
        outcome_to_py(py, o)
    }

    /// This call alone: one that holds its own reply and nothing of the other calls
    /// of its fan-out (what an interrupt keeps, INTERRUPT-2, so that the replies of a
    /// call to 1,024 procs, and what was pulled for them, are not kept with it).
    fn detached(slf: &Bound<'_, Self>) -> PyResult<Py<PendingCall>> {
        let One::Of(b, i) = &slf.get().call else {
            return Ok(slf.clone().unbind());
        };
        let batch = Batch {
            sent: vec![b.sent[*i].clone()],
            conns: b.conns.clone(),
        };
        Py::new(
            slf.py(),
            PendingCall {
                call: One::Of(Arc::new(batch), 0),
            },
        )
    }

    /// True once the reply (or the failure) is in.
    fn done(&self) -> bool {
        self.slot().is_done()
    }

    /// Calls `fn()` once the call completes: on a runtime thread, or at once here if
    /// it already has.
    fn add_done_callback(&self, cb: Py<PyAny>) {
        self.slot()
            .on_done(Box::new(move || super::enter_python(cb)));
    }

    /// Asks the worker to cancel this call.
    fn cancel(&self) {
        let s = self.sent();
        let proc = s.relayed.map(|r| r.1);
        s.conn.cancel(node::handle(), s.call_id, proc);
    }

    #[getter]
    fn call_id(&self) -> u64 {
        self.sent().call_id
    }

    /// What tells this call from every other in flight in this process, whichever
    /// object stands for it (a fan-out's are made as they are read): the address of
    /// the slot its reply completes, which lives as long as any of them. (Not its id:
    /// the calls of one message to a relay share one, and a spawn's or a stop's is 0.)
    #[getter]
    fn key(&self) -> usize {
        Arc::as_ptr(self.slot()) as usize
    }

    /// The worker's address (also for a call that went through its host's agent).
    #[getter]
    fn addr(&self) -> String {
        match (&self.call, self.sent().relayed) {
            (One::Of(b, _), Some((i, _))) => b.conns[i].addr().to_string(),
            _ => self.sent().conn.addr().to_string(),
        }
    }
}

/// Waits for every call, with one deadline for all. Returns, in order, each `Reply`
/// or the exception instance that call failed with; raises TimeoutError if the
/// deadline passes first. With `fail_fast`, it returns as soon as one call has
/// failed (its worker died: a reply from a live worker, even an exception, is not a
/// failure), with None for the calls still running, so a dead rank is known at once
/// whatever the others do. Consecutive equal replies without buffers (1,024 ranks
/// that return the same value) are one `Reply` object, repeated.
#[pyfunction]
#[pyo3(signature = (calls, timeout=None, fail_fast=false))]
fn wait_all(
    py: Python<'_>,
    calls: CallsArg<'_>,
    timeout: Option<f64>,
    fail_fast: bool,
) -> PyResult<Vec<Py<PyAny>>> {
    let d = deadline(timeout);
    let early = fail_fast && calls.len() > 1;
    if early {
        wait_first_failure(py, &calls, d)?;
    }
    let mut out = Vec::with_capacity(calls.len());
    // TREE-1: consecutive replies with the same payload (1,024 ranks returning the
    // same value) share one bytes object, made once; and, when they also have the
    // same kind and no buffers, one `Reply` (frozen): the caller reads it once for
    // all of them (`_actor_mesh._plain_values`).
    let mut last: Option<(bytes::Bytes, Py<PyBytes>)> = None;
    let mut last_reply: Option<(i32, Py<PyAny>)> = None;
    for c in calls.each() {
        // (the same reply as the last, the common case, is known under the slot's
        // lock, with no copy of it made and no second look at the slot)
        if let (Some((bytes, _)), Some((kind, obj))) = (&last, &last_reply) {
            let same = c.slot.peek(|o| {
                matches!(o, Some(Ok(r)) if r.kind == *kind && r.buffers.is_empty() && r.payload == *bytes)
            });
            if same {
                out.push(obj.clone_ref(py));
                continue;
            }
        }
        if early && !c.slot.is_done() {
            out.push(py.None());
            continue;
        }
        let reply = match wait_slot(py, &c.slot, d)? {
            Ok(r) => r,
            Err(e) => {
                out.push(to_py(e).into_value(py).into_any());
                continue;
            }
        };
        let payload = match &last {
            Some((bytes, obj)) if *bytes == reply.payload => {
                if let Some((kind, obj)) = &last_reply {
                    if *kind == reply.kind && reply.buffers.is_empty() {
                        out.push(obj.clone_ref(py));
                        continue;
                    }
                }
                obj.clone_ref(py)
            }
            _ => {
                let obj = PyBytes::new(py, &reply.payload).unbind();
                last = Some((reply.payload.clone(), obj.clone_ref(py)));
                obj
            }
        };
        let obj = Py::new(py, reply_with_payload(py, &reply, payload)?)?.into_any();
        last_reply = reply
            .buffers
            .is_empty()
            .then(|| (reply.kind, obj.clone_ref(py)));
        out.push(obj);
    }
    Ok(out)
}

/// Waits until every call is done or one has failed (or the deadline passes:
/// TimeoutError), with the GIL released and signals checked every 50 ms. Each slot
/// rings one [`Bell`] as it completes, and only the last one (or a failure) wakes
/// the wait: 1,024 replies arriving in a relay's batches wake it once, not once per
/// batch with a look at every slot each time, and no callback is made per slot
/// (TREE-1's per-reply cost).
fn wait_first_failure(
    py: Python<'_>,
    calls: &CallsArg<'_>,
    deadline: Option<Instant>,
) -> PyResult<()> {
    let bell = Bell::new(calls.len());
    for c in calls.each() {
        c.slot.ring_when_done(&bell);
    }
    loop {
        let chunk = match deadline {
            None => Duration::from_millis(50),
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50)),
        };
        if bell.settled() || detach(py, || bell.wait(chunk)) {
            return Ok(());
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PyTimeoutError::new_err("timed out waiting for the reply"));
        }
    }
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PendingCall>()?;
    m.add_class::<PyCalls>()?;
    m.add_class::<CallsIter>()?;
    m.add_class::<PyReply>()?;
    m.add_function(wrap_pyfunction!(wait_all, m)?)?;
    Ok(())
}
