//! Bindings of the control plane's TLS (`rpc/tls.rs`): a mesh's identity, and the
//! CA this process checks a mesh's servers against.

use crate::rpc::tls::{self, MeshIdentity, ServerIdentity};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The server identity from optional PEM strings: both or neither.
pub(crate) fn server_identity(
    cert: Option<String>,
    key: Option<String>,
) -> PyResult<Option<ServerIdentity>> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => ServerIdentity::new(cert, key)
            .map(Some)
            .map_err(|e| PyValueError::new_err(e.to_string())),
        _ => Err(PyValueError::new_err(
            "tls_cert and tls_key go together: give both (TLS) or neither (plaintext)",
        )),
    }
}

/// A new TLS identity for one mesh (TLS-1): `(ca_pem, cert_pem, key_pem)`, its CA
/// certificate, and the server certificate (for `monarch-mesh.invalid`) and key every
/// server of the mesh presents. The CA's own key is gone.
#[pyfunction]
fn tls_identity(py: Python<'_>) -> PyResult<(String, String, String)> {
    let id = super::detach(py, MeshIdentity::generate)
        .map_err(|e| super::errors::native_error(e.to_string()))?;
    Ok((id.ca_pem, id.server.cert_pem, id.server.key_pem))
}

/// From now on, this process's connections to the mesh with `token` are TLS, checked
/// against `ca_pem` (None: plaintext again) (TLS-2). Call it before the first
/// connection; one already open is replaced when next looked up.
#[pyfunction]
#[pyo3(signature = (token, ca_pem))]
fn set_mesh_ca(token: &str, ca_pem: Option<&str>) -> PyResult<()> {
    tls::set_mesh_ca(token, ca_pem).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The CA this process checks the mesh with `token` against, or None (plaintext).
#[pyfunction]
fn mesh_ca(token: &str) -> Option<String> {
    tls::mesh_ca(token).map(|ca| ca.to_string())
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(tls_identity, m)?)?;
    m.add_function(wrap_pyfunction!(set_mesh_ca, m)?)?;
    m.add_function(wrap_pyfunction!(mesh_ca, m)?)?;
    m.add("TLS_DOMAIN", tls::DOMAIN)?;
    Ok(())
}
