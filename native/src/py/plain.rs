//! FAST-1: a sync actor's plain calls, run by the worker's native server on the
//! actor's thread (`WorkerServer.serve`) without the Python dispatcher.

use super::server::{place_of, same_str, what_of, LAST};
use crate::proto::v1::ReplyKind;
use crate::rpc::inbox::{Incoming, Kind};
use bytes::Bytes;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

/// FAST-1: what a sync actor's thread needs to run a plain call without the Python
/// dispatcher (`_sync_actors.run_sync_item` does the same for every other item): the
/// actors it may take (`table`: name -> (instance, place, context, the dispatcher's
/// entry), filled by the dispatcher as it runs a call, emptied of an actor that fails
/// or ends), and the dispatcher's objects it uses.
#[pyclass(frozen, name = "PlainCalls", module = "monarch_kernel._native")]
pub struct PlainCalls {
    table: Py<pyo3::types::PyDict>,
    /// The dispatcher's cancels of calls not started (a call in it goes the long way).
    early_cancels: Py<PyAny>,
    actor_var: Py<PyAny>,
    origin_var: Py<PyAny>,
    /// `(instance, method, payload) -> result`: unpickles and calls (a Python frame,
    /// so an exception's traceback starts as the dispatcher's does).
    call: Py<PyAny>,
    /// `(table entry, token, exception, what)`: an exception of the call (DISPATCH-2, -4).
    failed: Py<PyAny>,
    /// `(token, result, what)`: replies with a result that is no scalar.
    finish: Py<PyAny>,
    dumps: Py<PyAny>,
}

#[pymethods]
impl PlainCalls {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        table: Py<pyo3::types::PyDict>,
        early_cancels: Py<PyAny>,
        actor_var: Py<PyAny>,
        origin_var: Py<PyAny>,
        call: Py<PyAny>,
        failed: Py<PyAny>,
        finish: Py<PyAny>,
        dumps: Py<PyAny>,
    ) -> Self {
        PlainCalls {
            table,
            early_cancels,
            actor_var,
            origin_var,
            call,
            failed,
            finish,
            dumps,
        }
    }
}

// The context-variable calls of CPython's C API (in every CPython since 3.7, with the
// same signatures; pyo3 leaves them out of the limited API's declarations).
extern "C" {
    fn PyContextVar_Set(
        var: *mut pyo3::ffi::PyObject,
        value: *mut pyo3::ffi::PyObject,
    ) -> *mut pyo3::ffi::PyObject;
    fn PyContextVar_Reset(var: *mut pyo3::ffi::PyObject, token: *mut pyo3::ffi::PyObject) -> i32;
}

/// LANE-2: what a run of plain calls (one `serve` between wakes) keeps set on its
/// thread between calls. A call sets the actor's context and its origin, as the
/// dispatcher does, but only where they differ from what the run's last call set
/// (an actor's calls mostly come from one caller at one place), and `running_what`
/// likewise; the variables go back to their values before the run when it ends or
/// hands an item to the dispatcher (`restore`), so nothing else on the thread sees
/// them. Lives in `serve`'s frame, which holds the GIL but while it waits (and it is
/// not touched there).
#[derive(Default)]
pub(super) struct Kept {
    actor: Option<KeptVar>,
    origin: Option<KeptVar>,
    /// The `running_what` this run set last (the thread's runner is this run's alone).
    what: Option<Py<PyAny>>,
}

/// A context variable a run set: the token of its first set (what `restore` resets
/// to) and the value it holds now.
struct KeptVar {
    var: *mut pyo3::ffi::PyObject,
    token: *mut pyo3::ffi::PyObject,
    value: Py<PyAny>,
}

impl Kept {
    /// `var` (a ContextVar of `PlainCalls`, which outlives the run) holds `value`.
    fn set(
        py: Python<'_>,
        kept: &mut Option<KeptVar>,
        var: &Py<PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if kept.as_ref().is_some_and(|k| k.value.is(value)) {
            return Ok(());
        }
        // SAFETY: `var` is a ContextVar (a wrong object makes PyContextVar_Set fail,
        // which is handled); the GIL is held.
        let token = unsafe { PyContextVar_Set(var.as_ptr(), value.as_ptr()) };
        if token.is_null() {
            return Err(PyErr::fetch(py));
        }
        match kept {
            Some(k) => {
                // (the first set's token is the one `restore` resets to)
                // SAFETY: the new reference PyContextVar_Set gave, released once.
                unsafe { pyo3::ffi::Py_DECREF(token) };
                k.value = value.clone().unbind();
            }
            None => {
                *kept = Some(KeptVar {
                    var: var.as_ptr(),
                    token,
                    value: value.clone().unbind(),
                })
            }
        }
        Ok(())
    }

    /// The variables back to their values before the run; `running_what` set anew by
    /// the next call.
    pub(super) fn restore(&mut self) {
        self.what = None;
        for k in [self.origin.take(), self.actor.take()]
            .into_iter()
            .flatten()
        {
            // SAFETY: the GIL is held (see `Kept`); `token` is the new reference the
            // first PyContextVar_Set gave, in this thread's context, reset and released
            // once. A reset fails only for a token of another context or used already.
            unsafe {
                if PyContextVar_Reset(k.var, k.token) != 0 {
                    pyo3::ffi::PyErr_Clear();
                }
                pyo3::ffi::Py_DECREF(k.token);
            }
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.restore();
    }
}

impl PlainCalls {
    /// Runs `i` if it is a plain call this thread may take (no buffers, a plain pickle,
    /// to an actor of the table, at the place of its kept context, no early cancel
    /// pending: the dispatcher then looks whether it is this call's); else gives it
    /// back for the dispatcher.
    /// What the run sets on its thread is kept in `kept` between its calls.
    pub(super) fn run(
        &self,
        py: Python<'_>,
        inbox: &crate::rpc::inbox::Inbox,
        runner: &Bound<'_, PyAny>,
        kept: &mut Kept,
        i: Incoming,
    ) -> PyResult<Option<Incoming>> {
        if i.kind != Kind::Call
            || !i.buffers.is_empty()
            || i.payload.starts_with(crate::transfer::HEADER)
        {
            return Ok(Some(i));
        }
        let (actor, method, origin, place, what) = LAST.with(|last| {
            let last = &mut *last.borrow_mut();
            Ok::<_, PyErr>((
                same_str(py, &mut last.actor, &i.actor),
                same_str(py, &mut last.method, &i.method),
                same_str(py, &mut last.origin, &i.origin),
                place_of(py, last, &i)?,
                what_of(py, last, &i)?,
            ))
        })?;
        let Some(entry) = self.table.bind(py).get_item(&actor)? else {
            return Ok(Some(i));
        };
        let entry = entry.cast_into::<PyTuple>()?;
        if !entry.get_item(1)?.is(&place) {
            return Ok(Some(i));
        }
        let (instance, context) = (entry.get_item(0)?, entry.get_item(2)?);
        if !kept.what.as_ref().is_some_and(|w| w.is(&what)) {
            runner.setattr(intern!(py, "running_what"), &what)?;
            kept.what = Some(what.clone_ref(py).into_any());
        }
        runner.setattr(intern!(py, "running_call"), i.call_id)?; // a cancel from now on gets a reply
        if self.early_cancels.bind(py).is_truthy()? {
            // (after `running_call`, as the dispatcher looks: a cancel comes either
            // before, and is in there, or after, and interrupts the call)
            runner.setattr(intern!(py, "running_call"), py.None())?;
            return Ok(Some(i));
        }
        Kept::set(py, &mut kept.actor, &self.actor_var, &context)?;
        Kept::set(py, &mut kept.origin, &self.origin_var, origin.bind(py))?;
        let result = {
            let payload = PyBytes::new(py, &i.payload);
            let called = self.call.bind(py).call1((instance, &method, payload));
            runner.setattr(intern!(py, "running_call"), py.None())?;
            match called {
                Ok(r) => r,
                Err(e) => {
                    self.failed
                        .bind(py)
                        .call1((&entry, i.token, e.value(py), &what))?;
                    return Ok(None);
                }
            }
        };
        let scalar = result.is_none()
            || result.is_exact_instance_of::<pyo3::types::PyBool>()
            || result.is_exact_instance_of::<pyo3::types::PyInt>()
            || result.is_exact_instance_of::<pyo3::types::PyFloat>();
        if !scalar {
            kept.restore(); // (a reply that waits runs as the dispatcher's: outside the call)
            self.finish.bind(py).call1((i.token, result, &what))?;
        } else if i.token != 0 {
            let data = match small_pickle(&result) {
                Some(data) => data,
                None => {
                    let data = self.dumps.bind(py).call1((result, 5))?;
                    Bytes::copy_from_slice(data.cast::<PyBytes>()?.as_bytes())
                }
            };
            inbox.reply(i.token, ReplyKind::Result, data, Vec::new());
        }
        Ok(None)
    }
}

/// The bytes `pickle.dumps(value, 5)` makes for the commonest results (None, a bool,
/// an int from 0 to 255), without a pickler; None for any other value.
fn small_pickle(value: &Bound<'_, PyAny>) -> Option<Bytes> {
    if value.is_none() {
        return Some(Bytes::from_static(b"\x80\x05N."));
    }
    if value.is_exact_instance_of::<pyo3::types::PyBool>() {
        let truth = value.is_truthy().ok()?;
        return Some(Bytes::from_static(if truth {
            b"\x80\x05\x88."
        } else {
            b"\x80\x05\x89."
        }));
    }
    if !value.is_exact_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    let byte = value.extract::<u8>().ok()?;
    Some(Bytes::copy_from_slice(&[0x80, 5, b'K', byte, b'.']))
}
