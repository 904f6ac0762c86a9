//! This process's connections, one per (address, token) (CLIENT-2), and the opening of
//! a new one: its endpoint (TLS or not, TLS-2), its client and its connection task.

use super::link::Link;
use super::pending::Pending;
use super::{epoch_cell, WorkerConn};
use crate::proto::v1::worker_client::WorkerClient;
use crate::proto::v1::Call;
use crate::rpc::auth::TokenAttach;
use crate::rpc::resume;
use crate::rpc::{RpcError, MAX_MESSAGE_BYTES};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};
use tonic::transport::Endpoint;

/// This process's open connections, by address and token (CLIENT-2).
type ConnTable = Mutex<HashMap<(String, String), Arc<WorkerConn>>>;

/// The connections of [`WorkerConn::get`].
static CONNS: OnceLock<ConnTable> = OnceLock::new();
/// The connections of [`WorkerConn::get_relay`].
static RELAY_CONNS: OnceLock<ConnTable> = OnceLock::new();

impl WorkerConn {
    /// Returns this process's connection to `addr`, opening it (lazily) if needed, if
    /// the previous one was lost (CLIENT-2), or if the mesh's CA changed since (TLS-2).
    pub fn get(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(&CONNS, rt, addr, token, true)
    }

    /// [`WorkerConn::abandon`]s this process's connection to `addr` (CLIENT-2), if it
    /// has one; whether it had.
    pub fn abandon_at(addr: &str, token: &str, err: RpcError) -> bool {
        Self::abandon_in(&CONNS, addr, token, err)
    }

    /// [`WorkerConn::abandon_at`] for a relay's connection ([`WorkerConn::get_relay`]):
    /// its agent saw the worker exit.
    pub fn abandon_relay_at(addr: &str, token: &str, err: RpcError) -> bool {
        Self::abandon_in(&RELAY_CONNS, addr, token, err)
    }

    fn abandon_in(table: &OnceLock<ConnTable>, addr: &str, token: &str, err: RpcError) -> bool {
        let conns = table.get_or_init(Default::default);
        let key = (addr.to_string(), token.to_string());
        let conn = lock(conns).get(&key).cloned();
        conn.map(|c| c.abandon(err)).is_some()
    }

    /// A relay's connection to a worker of its host (shared like [`WorkerConn::get`]):
    /// replies pass through untouched, their buffers are not pulled here.
    pub fn get_relay(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(&RELAY_CONNS, rt, addr, token, false)
    }

    fn shared(
        table: &'static OnceLock<ConnTable>,
        rt: &Handle,
        addr: &str,
        token: &str,
        prefetch: bool,
    ) -> Result<Arc<WorkerConn>, RpcError> {
        let conns = table.get_or_init(Default::default);
        let key = (addr.to_string(), token.to_string());
        let mut map = lock(conns);
        if let Some(c) = map.get(&key) {
            let same_ca = match (&c.ca, crate::rpc::tls::mesh_ca(token)) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, &b),
                _ => false,
            };
            if c.lost().is_none() && same_ca {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(Self::open_with(rt, addr, token, prefetch)?);
        map.insert(key, c.clone());
        Ok(c)
    }

    /// Opens a new connection (not shared): TLS if this process has the mesh's CA.
    pub fn open(rt: &Handle, addr: &str, token: &str) -> Result<WorkerConn, RpcError> {
        Self::open_with(rt, addr, token, true)
    }

    /// `prefetch`: whether replies' buffers are pulled as they arrive (XFER-2); a
    /// relay passes them on untouched instead.
    fn open_with(
        rt: &Handle,
        addr: &str,
        token: &str,
        prefetch: bool,
    ) -> Result<WorkerConn, RpcError> {
        let attach = TokenAttach::new(token).map_err(|e| RpcError::Auth(e.to_string()))?;
        let ca = crate::rpc::tls::mesh_ca(token);
        let scheme = if ca.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| RpcError::Address(format!("{addr}: {e}")))?;
        if let Some(ca) = &ca {
            crate::rpc::tls::install_provider();
            endpoint = endpoint
                .tls_config(crate::rpc::tls::client_config(ca))
                .map_err(|e| RpcError::TlsConfig(format!("the mesh's CA cannot be used: {e}")))?;
        }
        let endpoint = endpoint
            .tcp_nodelay(true)
            .initial_stream_window_size(crate::rpc::STREAM_WINDOW)
            .initial_connection_window_size(crate::rpc::CONNECTION_WINDOW)
            .connect_timeout(Duration::from_secs(3))
            // The gRPC default never notices a silent peer (docs/architecture.md, "Supervision").
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        let _guard = rt.enter();
        let channel = endpoint.connect_lazy();
        let client = WorkerClient::with_interceptor(channel, attach)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::unbounded_channel::<Call>();
        let pending = Arc::new(Mutex::new(Pending::default()));
        let answered = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(Notify::new());
        let link = Link {
            addr: addr.to_string(),
            client: client.clone(),
            pending: pending.clone(),
            answered: answered.clone(),
            plaintext: ca.is_none(),
            prefetch,
            token: Arc::from(token),
            caller: resume::random_id(),
            abandoned: abandoned.clone(),
        };
        rt.spawn(link.run(rx));
        Ok(WorkerConn {
            addr: addr.to_string(),
            token: token.to_string(),
            client,
            tx,
            pending,
            epoch: epoch_cell(token),
            ca,
            answered,
            abandoned,
        })
    }
}
