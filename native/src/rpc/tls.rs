//! TLS of the control plane (docs/architecture.md, "Security"): a mesh's identity,
//! how its servers present it and how its clients check it.
//!
//! TLS-1: a mesh has one TLS identity, made by its controller ([`MeshIdentity::generate`]):
//! a CA of its own, whose private key is dropped once it has signed, and one server
//! certificate for the fixed name [`DOMAIN`] (no host address is in it), which every
//! server of the mesh (agents and workers, on every host) presents. A client checks
//! the server against that mesh's CA and nothing else (no system roots), so a server
//! of another mesh, or an impostor, fails the handshake.
//!
//! TLS-2: a process talks TLS to a mesh exactly when it knows the mesh's CA
//! ([`set_mesh_ca`], by token, like the epoch cell); to other meshes (one host, the
//! default) it talks plaintext, at no cost. A handshake that fails (another mesh's
//! CA, a plaintext peer, or a plaintext client at a TLS server: [`speaks_tls`])
//! fails the call at once with [`RpcError::Tls`](super::RpcError::Tls), naming the
//! address, never a hang. One that has not finished waits as a plaintext connection
//! does (a worker still starting, or stopped): a silent peer is supervision's
//! business (heartbeats), not a TLS failure.
//!
//! TLS-3: the server's private key reaches agents and workers only over the
//! allocator's channel (the agent's configuration on its stdin, then each worker's
//! stdin), never in argv, the environment or a file.

use crate::sync::lock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The one name in every mesh's server certificate, and the name clients check.
/// `.invalid` is reserved (RFC 2606): it never resolves, so it names nothing else.
pub const DOMAIN: &str = "monarch-mesh.invalid";

/// How long a server waits for a client's TLS handshake once it has accepted the
/// connection (the client has sent its hello by then, unless it is no TLS client).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS identity cannot be made or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    /// Key generation or signing failed.
    #[error("cannot make the mesh's TLS identity: {0}")]
    Generate(String),
    /// A certificate or key given to us does not parse.
    #[error("{0}")]
    Pem(String),
}

/// What a server of a mesh presents: the mesh's server certificate and its key (PEM).
#[derive(Clone)]
pub struct ServerIdentity {
    /// The server certificate, signed by the mesh's CA.
    pub cert_pem: String,
    /// Its private key (PKCS#8). TLS-3: handed on over stdin only.
    pub key_pem: String,
}

impl std::fmt::Debug for ServerIdentity {
    /// Never prints the key (configurations are logged).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerIdentity { .. }")
    }
}

impl ServerIdentity {
    /// Checks that both parse (so a bad one fails where it is given, not at the
    /// first connection).
    pub fn new(cert_pem: String, key_pem: String) -> Result<Self, TlsError> {
        check_certs(&cert_pem, "server certificate")?;
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Pem(format!("the TLS private key does not parse: {e}")))?;
        Ok(ServerIdentity { cert_pem, key_pem })
    }

    /// The server side of a listener: tonic's TLS configuration (TLS-1).
    pub fn server_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// A mesh's TLS identity (TLS-1): its CA certificate (for clients) and the server
/// identity every server of the mesh presents.
pub struct MeshIdentity {
    /// The CA certificate (PEM); its key is gone.
    pub ca_pem: String,
    /// The server certificate and key.
    pub server: ServerIdentity,
}

impl MeshIdentity {
    /// A new CA (ECDSA P-256), and a server certificate for [`DOMAIN`] signed by it.
    /// The CA's key is dropped on return, so no other certificate can ever be made
    /// for this mesh. The certificates keep rcgen's validity (1975 to 4096): a named
    /// mesh may run for months, and hosts' clocks need not agree.
    pub fn generate() -> Result<Self, TlsError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let err = |e: rcgen::Error| TlsError::Generate(e.to_string());
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        // A name of its own (from its key), so that a client with another mesh's CA
        // is told "unknown issuer", not "bad signature".
        let tag: String = ca_key.public_key_raw()[1..9]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        ca.distinguished_name
            .push(DnType::CommonName, format!("monarch-kernel mesh CA {tag}"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec![DOMAIN.to_string()]).map_err(err)?;
        server.distinguished_name.push(DnType::CommonName, DOMAIN);
        server.use_authority_key_identifier_extension = true;
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().map_err(err)?;
        let server_cert = server.signed_by(&server_key, &issuer).map_err(err)?;
        Ok(MeshIdentity {
            ca_pem: ca_cert.pem(),
            server: ServerIdentity {
                cert_pem: server_cert.pem(),
                key_pem: server_key.serialize_pem(),
            },
        })
    }
}

/// Checks that `ca_pem` holds a PEM certificate.
pub fn check_ca(ca_pem: &str) -> Result<(), TlsError> {
    check_certs(ca_pem, "CA certificate")
}

fn check_certs(pem: &str, what: &str) -> Result<(), TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(format!("the TLS {what} does not parse: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Pem(format!(
            "the TLS {what} holds no PEM certificate"
        )));
    }
    Ok(())
}

/// Installs ring as this process's rustls crypto provider, once (rustls's server
/// side needs a process default). One already installed (by anyone) is kept.
pub fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The CA of each mesh this process talks TLS to, by token (TLS-2).
fn cas() -> std::sync::MutexGuard<'static, HashMap<String, Arc<str>>> {
    static CAS: OnceLock<Mutex<HashMap<String, Arc<str>>>> = OnceLock::new();
    lock(CAS.get_or_init(Default::default))
}

/// From now on, this process's connections to the mesh with `token` are TLS, checked
/// against `ca_pem` (None: plaintext again). A connection already open stays as it
/// is until it is replaced ([`super::client::WorkerConn::get`] replaces it).
pub fn set_mesh_ca(token: &str, ca_pem: Option<&str>) -> Result<(), TlsError> {
    match ca_pem {
        Some(ca) => {
            check_ca(ca)?;
            cas().insert(token.to_string(), Arc::from(ca));
        }
        None => {
            cas().remove(token);
        }
    }
    Ok(())
}

/// The CA this process checks the mesh with `token` against, if it talks TLS to it.
pub fn mesh_ca(token: &str) -> Option<Arc<str>> {
    cas().get(token).cloned()
}

/// The client side of a connection checked against `ca_pem` (TLS-1).
pub fn client_config(ca_pem: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(DOMAIN)
}

/// How long [`speaks_tls`] waits for a server's first answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a TLS server listens at `addr`: a handshake that trusts no CA at all
/// fails on the certificate the server presents, and only a TLS server presents
/// one. False for anything else (refused, plaintext, silent for `within`). A
/// plaintext client only sees its connection closed by a TLS server (as by a dead
/// one), so this tells the two apart (TLS-2); it runs only on that failure.
pub async fn speaks_tls(addr: &str, within: Duration) -> bool {
    install_provider();
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions() else {
        return false;
    };
    let config = builder
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let Ok(name) = rustls::pki_types::ServerName::try_from(DOMAIN) else {
        return false;
    };
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let out = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await;
        Some(match out {
            Ok(_) => true,
            Err(e) => e
                .get_ref()
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .is_some_and(|r| matches!(r, rustls::Error::InvalidCertificate(_))),
        })
    };
    matches!(
        tokio::time::timeout(within, handshake).await,
        Ok(Some(true))
    )
}

/// What the TLS layer said, if `err` (or what caused it) is a TLS failure: a rustls
/// error (a certificate that does not verify, a peer that does not speak TLS).
pub fn failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            // io::Error's `source` skips the error it wraps: look at it directly.
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r.to_string());
            }
        }
        let text = e.to_string();
        // tonic's own error is a private type: known by its text.
        if text == "HTTP/2 was not negotiated." {
            return Some("the peer did not offer HTTP/2 over TLS (ALPN h2)".into());
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mesh_identity_parses_and_names_the_mesh_domain() {
        let id = MeshIdentity::generate().unwrap();
        check_certs(&id.ca_pem, "CA").unwrap();
        let server = ServerIdentity::new(id.server.cert_pem, id.server.key_pem).unwrap();
        assert!(server.key_pem.contains("PRIVATE KEY"));
        assert_eq!(format!("{server:?}"), "ServerIdentity { .. }");
        // Two meshes never share a CA.
        assert_ne!(MeshIdentity::generate().unwrap().ca_pem, id.ca_pem);
    }

    #[test]
    fn a_bad_pem_is_refused_where_it_is_given() {
        assert!(set_mesh_ca("t", Some("not a certificate")).is_err());
        assert!(mesh_ca("t").is_none());
        assert!(ServerIdentity::new("x".into(), "y".into()).is_err());
    }
}
