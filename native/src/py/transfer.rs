//! Bindings of the transfer engine ([`crate::transfer`]): registering buffers, the
//! `Descriptor` that names one (decoded once, then read, written or released
//! through its methods), the `RecvBuffer` a transfer lands in, and the waits that
//! tie registrations to calls (XFER-1, XFER-2).

use super::detach;
use super::pending::CallsArg;
use crate::rpc::client::WorkerConn;
use crate::rpc::slot::Slot;
use crate::transfer::{engine, Descriptor, Engine, Waited, DEFAULT_STREAMS, HEADER, STREAMS_ENV};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::errors::xfer_to_py as to_py;

/// This process's engine; a `TransferError` saying what failed and what to do if it
/// cannot start (it is tried again on next use).
fn started() -> PyResult<&'static Engine> {
    engine().map_err(to_py)
}

/// Seconds as a duration; `None` for no limit (and for limits too large to mean
/// anything else, such as infinity).
fn seconds(s: Option<f64>) -> Option<Duration> {
    s.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
}

/// Registers `obj`'s memory (any C-contiguous buffer) under the mesh `token`;
/// returns its descriptor. It stays registered (and `obj` alive) until `readers`
/// releases (0: until `xfer_drop`), or `ttl` seconds (None: no limit).
/// `own_token`: `token` is this registration's alone (a handle's capability,
/// XFER-6), forgotten when it ends.
#[pyfunction]
#[pyo3(signature = (obj, token, readers=1, ttl=Some(300.0), writable=false, own_token=false))]
fn xfer_register(
    obj: &Bound<'_, PyAny>,
    token: &str,
    readers: u32,
    ttl: Option<f64>,
    writable: bool,
    own_token: bool,
) -> PyResult<PyDescriptor> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "the buffer is not contiguous; make it so first",
        ));
    }
    if writable && buf.readonly() {
        return Err(PyValueError::new_err(
            "the buffer is read-only, so it cannot be written to",
        ));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    let e = started()?;
    // SAFETY: the PyBuffer keeps the exporter's memory valid (and pinned) until it is
    // released, which happens when the registration ends and drops it.
    let d = unsafe {
        e.register(
            ptr,
            len,
            writable,
            token.as_bytes(),
            own_token,
            readers,
            seconds(ttl),
            Box::new(buf),
        )
    };
    Ok(PyDescriptor::from(d))
}

/// A registered buffer's descriptor, decoded once: what a message carries in place
/// of the buffer. Its bytes (buffer protocol, `bytes(d)`) are the wire form, so it
/// travels among a message's out-of-band buffers as it is; it pickles as those
/// bytes.
#[pyclass(frozen, name = "Descriptor", module = "monarch_kernel._native")]
pub struct PyDescriptor {
    d: Descriptor,
    /// The wire form: what the buffer protocol exposes, and the key of a buffer
    /// pulled as its message arrived (XFER-2). Never changes, never moves.
    raw: Box<[u8]>,
}

impl From<Descriptor> for PyDescriptor {
    fn from(d: Descriptor) -> Self {
        let raw = d.encode().into_boxed_slice();
        PyDescriptor { d, raw }
    }
}

/// `obj`'s writable (`write`) or readable contiguous memory, and the view that
/// keeps it valid while it is held.
fn contiguous(obj: &Bound<'_, PyAny>, write: bool) -> PyResult<(PyBuffer<u8>, usize, usize)> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() || (write && buf.readonly()) {
        return Err(PyValueError::new_err(if write {
            "the destination must be a writable, contiguous buffer"
        } else {
            "the source must be contiguous"
        }));
    }
    let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
    Ok((buf, ptr, len))
}

#[pymethods]
impl PyDescriptor {
    /// Decodes the wire form `data` (any bytes-like object); ValueError if it is
    /// not a descriptor.
    #[new]
    fn new(data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let raw = match data.cast::<PyBytes>() {
            Ok(b) => b.as_bytes().to_vec(),
            Err(_) => PyBuffer::<u8>::get(data)?.to_vec(data.py())?,
        };
        let d = Descriptor::decode(&raw).map_err(to_py)?;
        Ok(PyDescriptor {
            d,
            raw: raw.into_boxed_slice(),
        })
    }

    /// The registration id (what `xfer_drop` takes, where it was registered).
    #[getter]
    fn id(&self) -> u64 {
        self.d.id
    }

    /// The byte length of the buffer it names.
    #[getter]
    fn len(&self) -> u64 {
        self.d.len
    }

    /// SHA-256 of the mesh token the buffer is registered under.
    #[getter]
    fn token_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.d.token_id)
    }

    /// The owner's engine, `HOST:PORT`.
    #[getter]
    fn addr(&self) -> &str {
        &self.d.addr
    }

    /// Reads the buffer into `dst` (writable, contiguous, exactly its size), then
    /// releases it (with `handle`: confirms it, for a `TransferBuffer`'s
    /// registration, which stays); the GIL is released meanwhile.
    #[pyo3(signature = (token, dst, streams=DEFAULT_STREAMS, handle=false))]
    fn fetch(
        &self,
        py: Python<'_>,
        token: &str,
        dst: &Bound<'_, PyAny>,
        streams: usize,
        handle: bool,
    ) -> PyResult<()> {
        let (_held, ptr, len) = contiguous(dst, true)?;
        let e = started()?;
        detach(py, || {
            // SAFETY: `_held` (held across this call) keeps the destination valid.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            e.fetch_as(&self.d, token.as_bytes(), dst, streams, handle)
        })
        .map_err(to_py)
    }

    /// Pulls the buffer into new memory (a `RecvBuffer`), then releases it; what was
    /// pulled as its message arrived (XFER-2) is taken as it is.
    #[pyo3(signature = (token, streams=DEFAULT_STREAMS))]
    fn fetch_new(&self, py: Python<'_>, token: &str, streams: usize) -> PyResult<RecvBuffer> {
        if let Some(region) = crate::transfer::take_prefetched(&self.raw) {
            return Ok(RecvBuffer { region });
        }
        let e = started()?;
        let region =
            detach(py, || e.fetch_new(&self.d, token.as_bytes(), streams)).map_err(to_py)?;
        Ok(RecvBuffer { region })
    }

    /// Writes `src` (contiguous) into the buffer, which must be writable, at `offset`.
    #[pyo3(signature = (token, src, offset=0))]
    fn write(
        &self,
        py: Python<'_>,
        token: &str,
        src: &Bound<'_, PyAny>,
        offset: u64,
    ) -> PyResult<()> {
        let (_held, ptr, len) = contiguous(src, false)?;
        let e = started()?;
        detach(py, || {
            // SAFETY: `_held` keeps the source valid during the call.
            let src = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            e.write_into(&self.d, token.as_bytes(), offset, src)
        })
        .map_err(to_py)
    }

    /// Ends the registration, wherever it lives (any process of its mesh may).
    fn release(&self, py: Python<'_>, token: &str) -> PyResult<()> {
        let e = started()?;
        detach(py, || e.release_remote(&self.d, token.as_bytes())).map_err(to_py)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.raw)
    }

    /// Pickles as a decode of the wire form.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, (Bound<'py, PyBytes>,)) {
        (slf.get_type(), (PyBytes::new(slf.py(), &slf.get().raw),))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyDescriptor>()
            .is_ok_and(|o| o.get().raw == self.raw)
    }

    fn __hash__(&self) -> isize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.raw.hash(&mut h);
        h.finish() as isize
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor id={} of {} bytes at {}>",
            self.d.id, self.d.len, self.d.addr
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let raw = &slf.get().raw;
        // SAFETY: fills `view` for our read-only bytes (a writable request fails);
        // the view holds a reference to `slf`, and `raw` never changes or moves.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                raw.as_ptr() as *mut std::os::raw::c_void,
                raw.len() as isize,
                1,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Memory a transfer landed in (writable, buffer protocol); its pages go back to a
/// pool when it is released, so the next transfer of that size finds them there.
#[pyclass(name = "RecvBuffer", module = "monarch_kernel._native")]
pub struct RecvBuffer {
    region: crate::transfer::recv::Region,
}

// SAFETY: the region is plain memory owned by this object.
unsafe impl Send for RecvBuffer {}

impl RecvBuffer {
    pub(crate) fn new(region: crate::transfer::recv::Region) -> Self {
        RecvBuffer { region }
    }
}
unsafe impl Sync for RecvBuffer {}

#[pymethods]
impl RecvBuffer {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (ptr, len) = {
            let me = slf.borrow();
            (me.region.ptr(), me.region.len())
        };
        // SAFETY: fills `view` for our memory; the view holds a reference to `slf`,
        // so the region outlives every view.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut std::os::raw::c_void,
                len as isize,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.region.len()
    }
}

/// Ends registration `id` of this process now; True if it was registered.
#[pyfunction]
fn xfer_drop(py: Python<'_>, id: u64) -> bool {
    // Without an engine nothing was registered.
    engine().is_ok_and(|e| detach(py, || e.drop_id(id)))
}

/// How often a wait with the GIL released takes it back for a moment, to let
/// Python run signal handlers (Ctrl-C, a kernel interrupt).
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// XFER-1 for calls: once every one of `calls` has its reply (or failed), its
/// receivers are done with the registrations `ids`, released or not (a receiver that
/// died never releases): they end. Hooked on the calls' completion in the native
/// runtime: nothing runs in Python.
#[pyfunction]
fn xfer_drop_when_done(py: Python<'_>, calls: CallsArg<'_>, ids: Vec<u64>) {
    if ids.is_empty() || calls.is_empty() {
        return;
    }
    let slots: Vec<Arc<Slot>> = calls.each().map(|c| c.slot.clone()).collect();
    let ids: Arc<[u64]> = ids.into();
    let left = Arc::new(AtomicUsize::new(slots.len()));
    // A call that has already ended runs its hook here, at once.
    detach(py, || {
        for slot in &slots {
            let (ids, left) = (ids.clone(), left.clone());
            // Runs on the runtime thread that completes the call. The entries'
            // keep-alives (Python buffers) are released there: pyo3 takes the GIL
            // for that, as the engine's connection threads do when a reader releases.
            slot.on_done(Box::new(move || {
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    if let Ok(e) = engine() {
                        for id in ids.iter() {
                            e.drop_id(*id);
                        }
                    }
                }
            }));
        }
    });
}

/// True once `calls` say their receivers will read no more: all of them ended, or
/// one's connection is lost (a dead receiver never reads; stopping a mesh closes its
/// connections).
fn calls_ended(calls: &[(Arc<Slot>, Arc<WorkerConn>)]) -> bool {
    !calls.is_empty()
        && (calls.iter().all(|(s, _)| s.is_done()) || calls.iter().any(|(_, c)| c.lost().is_some()))
}

/// XFER-2: waits until the registrations `ids` of this process have ended (the
/// receivers pull a message's buffers as it arrives), so that the sender may then
/// change the memory without changing what it sent; or until `calls` (if any) have
/// all ended or one of their connections is lost; or until `gone()` is true; or
/// `limit` seconds (None: no limit). True if the registrations ended.
///
/// The GIL is released while waiting; every 50 ms it is taken back to run signal
/// handlers (a KeyboardInterrupt is raised from here) and to ask `gone()`.
#[pyfunction]
#[pyo3(signature = (ids, calls=None, limit=None, gone=None))]
fn xfer_wait_read(
    py: Python<'_>,
    ids: Vec<u64>,
    calls: Option<CallsArg<'_>>,
    limit: Option<f64>,
    gone: Option<Bound<'_, PyAny>>,
) -> PyResult<bool> {
    if ids.is_empty() {
        return Ok(true);
    }
    let Ok(e) = engine() else {
        return Ok(true); // without an engine nothing was registered
    };
    let deadline = seconds(limit).and_then(|d| Instant::now().checked_add(d));
    let watched: Vec<(Arc<Slot>, Arc<WorkerConn>)> = calls
        .iter()
        .flat_map(|c| c.each().map(|s| (s.slot.clone(), s.conn.clone())))
        .collect();
    detach(py, || {
        for (slot, _) in &watched {
            // The wait looks at the calls again as soon as one ends.
            slot.on_done(Box::new(|| {
                if let Ok(e) = engine() {
                    e.wake();
                }
            }));
        }
    });
    loop {
        let chunk = deadline.map_or(SIGNAL_CHECK, |d| {
            d.saturating_duration_since(Instant::now())
                .min(SIGNAL_CHECK)
        });
        match detach(py, || e.wait_until(&ids, chunk, || calls_ended(&watched))) {
            Waited::Gone => return Ok(true),
            Waited::Stopped => return Ok(false),
            Waited::TimedOut => {}
        }
        py.check_signals()?;
        if let Some(gone) = &gone {
            if gone.call0()?.is_truthy()? {
                return Ok(false);
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
    }
}

/// This process's engine: address, live registrations and counters.
#[pyfunction]
fn xfer_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let e = started()?;
    let d = PyDict::new(py);
    d.set_item("addr", e.addr())?;
    d.set_item("registered", detach(py, || e.registered()))?;
    d.set_item("prefetched", crate::transfer::prefetched_count())?;
    let s = &e.stats;
    d.set_item("rejected_frames", s.rejected_frames.load(Ordering::Relaxed))?;
    d.set_item("denied", s.denied.load(Ordering::Relaxed))?;
    d.set_item("bytes_sent", s.bytes_sent.load(Ordering::Relaxed))?;
    d.set_item("bytes_local", s.bytes_local.load(Ordering::Relaxed))?;
    d.set_item("bytes_tcp", s.bytes_tcp.load(Ordering::Relaxed))?;
    d.set_item(
        "refused_connections",
        s.refused_connections.load(Ordering::Relaxed),
    )?;
    d.set_item("open_connections", crate::transfer::open_connections())?;
    Ok(d)
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Formats Rust owns, so that Python re-exports them instead of repeating them.
    m.add("MESSAGE_HEADER", PyBytes::new(m.py(), HEADER))?;
    m.add("TRANSFER_STREAMS_ENV", STREAMS_ENV)?;
    m.add("DEFAULT_TRANSFER_STREAMS", DEFAULT_STREAMS)?;
    m.add("XFER_HANDLE", crate::transfer::HANDLE)?;
    m.add_class::<PyDescriptor>()?;
    m.add_class::<RecvBuffer>()?;
    m.add_function(wrap_pyfunction!(xfer_register, m)?)?;
    m.add_function(wrap_pyfunction!(xfer_drop, m)?)?;
    m.add_function(wrap_pyfunction!(xfer_drop_when_done, m)?)?;
    m.add_function(wrap_pyfunction!(xfer_wait_read, m)?)?;
    m.add_function(wrap_pyfunction!(xfer_stats, m)?)?;
    Ok(())
}
