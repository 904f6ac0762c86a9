//! The one mapping of native errors to Python exceptions.
//!
//! The exception classes are Python's own, from `monarch_kernel.errors`, so that
//! every error the native core raises is a `MonarchKernelError` (one exception root):
//! `NativeError` and its `ConnectionLost` and `TransferError`, `MeshAuthError` for a
//! rejected token, `MeshTLSError` for a failed TLS handshake, `MessageTooLargeError`
//! for a message above the limit. They are
//! looked up once, when the module is initialised, and exported under the names the
//! module always had (`_native.AuthError is errors.MeshAuthError`).

use crate::rpc::RpcError;
use crate::transfer::XferError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The classes the native core raises.
struct Classes {
    native: Py<PyType>,
    lost: Py<PyType>,
    auth: Py<PyType>,
    tls: Py<PyType>,
    too_large: Py<PyType>,
    transfer: Py<PyType>,
}

/// Filled once by [`register_python_bindings`] (module initialisation).
static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn load(py: Python<'_>) -> PyResult<Classes> {
    let m = py.import("monarch_kernel.errors")?;
    let get = |name: &str| -> PyResult<Py<PyType>> {
        Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind())
    };
    Ok(Classes {
        native: get("NativeError")?,
        lost: get("ConnectionLost")?,
        auth: get("MeshAuthError")?,
        tls: get("MeshTLSError")?,
        too_large: get("MessageTooLargeError")?,
        transfer: get("TransferError")?,
    })
}

/// An exception of the class `pick` chooses, with `msg`.
fn raise(pick: impl Fn(&Classes) -> &Py<PyType>, msg: String) -> PyErr {
    Python::attach(|py| match CLASSES.get_or_try_init(py, || load(py)) {
        Ok(c) => PyErr::from_type(pick(c).bind(py).clone(), msg),
        Err(e) => e, // monarch_kernel.errors cannot be imported: that error says why
    })
}

/// Converts a control-plane error into its Python exception.
pub fn to_py(e: RpcError) -> PyErr {
    let msg = e.to_string();
    match e {
        RpcError::ConnectionLost { .. } => raise(|c| &c.lost, msg),
        RpcError::Auth(_) => raise(|c| &c.auth, msg),
        RpcError::TooLarge { .. } => raise(|c| &c.too_large, msg),
        RpcError::Tls { .. } => raise(|c| &c.tls, msg),
        RpcError::Address(_) | RpcError::TlsConfig(_) => PyValueError::new_err(msg),
        RpcError::Status { .. } | RpcError::Io(_) => raise(|c| &c.native, msg),
    }
}

/// A `NativeError` saying `msg` (a native failure that is no control-plane error).
pub fn native_error(msg: String) -> PyErr {
    raise(|c| &c.native, msg)
}

/// Converts a data-plane error into its Python exception.
pub fn xfer_to_py(e: XferError) -> PyErr {
    match e {
        XferError::Invalid(m) => PyValueError::new_err(m),
        other => raise(|c| &c.transfer, other.to_string()),
    }
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let c = CLASSES.get_or_try_init(py, || load(py))?;
    m.add("NativeError", c.native.bind(py))?;
    m.add("ConnectionLost", c.lost.bind(py))?;
    m.add("AuthError", c.auth.bind(py))?;
    m.add("MessageTooLarge", c.too_large.bind(py))?;
    m.add("TransferError", c.transfer.bind(py))?;
    Ok(())
}
