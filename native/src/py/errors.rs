//! The one mapping of native errors to Python exceptions.

use crate::rpc::RpcError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    NativeError,
    PyException,
    "Base of the native core's errors."
);
create_exception!(
    _native,
    ConnectionLost,
    NativeError,
    "The peer process went away before replying."
);
create_exception!(
    _native,
    AuthError,
    NativeError,
    "The peer rejected the mesh token, or the token is unusable."
);
create_exception!(
    _native,
    MessageTooLarge,
    NativeError,
    "A message is above the control plane's size limit."
);

create_exception!(
    _native,
    TransferError,
    NativeError,
    "A data-plane transfer failed: the sender died, the token was wrong, or the buffer is gone."
);

/// Converts a control-plane error into its Python exception.
pub fn to_py(e: RpcError) -> PyErr {
    let msg = e.to_string();
    match e {
        RpcError::ConnectionLost { .. } => ConnectionLost::new_err(msg),
        RpcError::Auth(_) => AuthError::new_err(msg),
        RpcError::TooLarge { .. } => MessageTooLarge::new_err(msg),
        RpcError::Address(_) => pyo3::exceptions::PyValueError::new_err(msg),
        RpcError::Status { .. } | RpcError::Io(_) => NativeError::new_err(msg),
    }
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeError", py.get_type::<NativeError>())?;
    m.add("ConnectionLost", py.get_type::<ConnectionLost>())?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add("MessageTooLarge", py.get_type::<MessageTooLarge>())?;
    m.add("TransferError", py.get_type::<TransferError>())?;
    Ok(())
}
