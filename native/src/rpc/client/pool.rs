//! This process's connections, one per (address, token) in each table (CLIENT-2): to
//! workers, to host agents' relays, and (in an agent) its relay's to its workers; and
//! the opening of a new one: its endpoint (TLS or not, TLS-2), its client and its
//! connection task.

use super::link::Link;
use super::pending::Pending;
use super::service::Client;
use super::{epoch_cell, Peer, WorkerConn};
use crate::proto::v1::Call;
use crate::rpc::auth::TokenAttach;
use crate::rpc::resume;
use crate::rpc::RpcError;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};
use tonic::transport::Endpoint;

/// This process's open connections to one kind of peer, by address and token (CLIENT-2).
type ConnTable = Mutex<HashMap<(String, String), Arc<WorkerConn>>>;

/// The table of `peer`'s connections.
fn table(peer: Peer) -> &'static ConnTable {
    static WORKERS: OnceLock<ConnTable> = OnceLock::new();
    static RELAYS: OnceLock<ConnTable> = OnceLock::new();
    static RELAYED: OnceLock<ConnTable> = OnceLock::new();
    static BRANCHES: OnceLock<ConnTable> = OnceLock::new();
    match peer {
        Peer::Worker => &WORKERS,
        Peer::Relay => &RELAYS,
        Peer::Relayed => &RELAYED,
        Peer::Branch => &BRANCHES,
    }
    .get_or_init(Default::default)
}

impl WorkerConn {
    /// Returns this process's connection to the worker at `addr`, opening it (lazily)
    /// if needed, if the previous one was lost (CLIENT-2), or if the mesh's CA changed
    /// since (TLS-2).
    pub fn get(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(Peer::Worker, rt, addr, token)
    }

    /// This process's connection to the relay at `addr` (a host agent's `Relay`
    /// service, RELAY-1), shared like [`WorkerConn::get`].
    pub fn relay(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(Peer::Relay, rt, addr, token)
    }

    /// A relay's connection to a worker of its host (shared like [`WorkerConn::get`]):
    /// replies pass through untouched, their buffers are not pulled here.
    pub fn relayed(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(Peer::Relayed, rt, addr, token)
    }

    /// A relay's connection to another host agent's relay, to forward the part of a
    /// call that goes to its subtree (TREE-1); shared like [`WorkerConn::get`].
    pub fn branch(rt: &Handle, addr: &str, token: &str) -> Result<Arc<WorkerConn>, RpcError> {
        Self::shared(Peer::Branch, rt, addr, token)
    }

    /// Whether this process's connection to the relay at `addr` is known lost (its
    /// agent refused or closed it, or supervision declared its host gone): TREE-1
    /// forwards through another agent of its group while it is.
    pub fn relay_lost(addr: &str, token: &str) -> bool {
        let key = (addr.to_string(), token.to_string());
        let conn = lock(table(Peer::Relay)).get(&key).cloned();
        conn.is_some_and(|c| c.lost().is_some())
    }

    /// Fails the calls this process waits for through any relay of the mesh with
    /// `token` from the workers `procs` (proc ranks), with `err` (TREE-1: a call to a
    /// host's workers may go through another host's agent, whose connection lives on
    /// when that host is lost). Whether any call was waiting.
    pub fn abandon_procs(token: &str, procs: &[u32], err: RpcError) -> bool {
        let conns: Vec<Arc<WorkerConn>> = lock(table(Peer::Relay))
            .iter()
            .filter(|((_, t), _)| t == token)
            .map(|(_, c)| c.clone())
            .collect();
        let mut any = false;
        for c in conns {
            any |= super::pending::fail_procs(&c.pending, procs, &err);
        }
        any
    }

    /// [`WorkerConn::abandon`]s this process's connection to the worker or the relay
    /// at `addr` (CLIENT-2), if it has one; whether it had.
    pub fn abandon_at(addr: &str, token: &str, err: RpcError) -> bool {
        let worker = Self::abandon_in(Peer::Worker, addr, token, err.clone());
        Self::abandon_in(Peer::Relay, addr, token, err) || worker
    }

    /// [`WorkerConn::abandon_at`] for a relay's connection ([`WorkerConn::relayed`]):
    /// its agent saw the worker exit.
    pub fn abandon_relayed_at(addr: &str, token: &str, err: RpcError) -> bool {
        Self::abandon_in(Peer::Relayed, addr, token, err)
    }

    fn abandon_in(peer: Peer, addr: &str, token: &str, err: RpcError) -> bool {
        let key = (addr.to_string(), token.to_string());
        let conn = lock(table(peer)).get(&key).cloned();
        conn.map(|c| c.abandon(err)).is_some()
    }

    /// The connection of `peer`'s table to `addr` (see [`WorkerConn::get`]).
    pub(super) fn shared(
        peer: Peer,
        rt: &Handle,
        addr: &str,
        token: &str,
    ) -> Result<Arc<WorkerConn>, RpcError> {
        let key = (addr.to_string(), token.to_string());
        let mut map = lock(table(peer));
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
        let c = Arc::new(Self::open_as(peer, rt, addr, token)?);
        map.insert(key, c.clone());
        Ok(c)
    }

    /// Opens a new connection to the worker at `addr` (not shared): TLS if this
    /// process has the mesh's CA.
    pub fn open(rt: &Handle, addr: &str, token: &str) -> Result<WorkerConn, RpcError> {
        Self::open_as(Peer::Worker, rt, addr, token)
    }

    /// Opens a new connection to `peer` at `addr` (not shared).
    fn open_as(peer: Peer, rt: &Handle, addr: &str, token: &str) -> Result<WorkerConn, RpcError> {
        let attach = TokenAttach::new(token).map_err(|e| RpcError::Auth(e.to_string()))?;
        // The gRPC default never notices a silent peer (docs/architecture.md,
        // "Supervision"); an agent's connection to a worker of its own host needs no
        // more than its exit, which the agent sees, and a worker whose agent pings it
        // for this process no more than that heartbeat (SUPERVISE-2).
        let relaxed =
            peer == Peer::Relayed || (peer == Peer::Worker && super::watched_through_agents(token));
        let keepalive = if relaxed {
            crate::rpc::Keepalive::Relaxed
        } else {
            crate::rpc::Keepalive::Watchful
        };
        let ca = crate::rpc::tls::mesh_ca(token);
        let endpoint = endpoint(addr, ca.as_deref(), keepalive)?;
        let _guard = rt.enter();
        let channel = endpoint.connect_lazy();
        let client = Client::new(channel, attach, matches!(peer, Peer::Relay | Peer::Branch));
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
            // XFER-2; a relay passes replies on untouched instead.
            prefetch: matches!(peer, Peer::Worker | Peer::Relay),
            token: Arc::from(token),
            caller: resume::random_id(),
            abandoned: abandoned.clone(),
            // LINK-1: a worker's connection opens with its first call. A relay's opens
            // at once: its keepalive is how a lost head is noticed (TREE-1).
            lazy: peer == Peer::Worker,
        };
        // PIPE-1: a relay's calls to a worker of its host go on the worker's pipe when
        // it has one (cancels, spawns and stops keep `client`; pings take the pipe too: PIPE-3).
        let piped = (peer == Peer::Relayed)
            .then(|| super::pipe::connect(addr))
            .flatten();
        let pipe = match piped {
            Some(stream) => super::pipe::run(
                rt,
                stream,
                addr.to_string(),
                token,
                rx,
                pending.clone(),
                abandoned.clone(),
            ),
            None => {
                rt.spawn(link.run(rx));
                None
            }
        };
        Ok(WorkerConn {
            addr: addr.to_string(),
            token: token.to_string(),
            peer,
            client,
            tx,
            pending,
            epoch: epoch_cell(token),
            ca,
            answered,
            abandoned,
            pipe,
        })
    }
}

/// The endpoint of a connection to `addr`: TLS checked against the mesh's CA `ca`
/// (TLS-2; None: plaintext), pinged as `keepalive` says, with the control plane's
/// windows.
pub(super) fn endpoint(
    addr: &str,
    ca: Option<&str>,
    keepalive: crate::rpc::Keepalive,
) -> Result<Endpoint, RpcError> {
    let scheme = if ca.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| RpcError::Address(format!("{addr}: {e}")))?;
    if let Some(ca) = ca {
        crate::rpc::tls::install_provider();
        endpoint = endpoint
            .tls_config(crate::rpc::tls::client_config(ca))
            .map_err(|e| RpcError::TlsConfig(format!("the mesh's CA cannot be used: {e}")))?;
    }
    let (every, within) = keepalive.times();
    let endpoint = endpoint
        .tcp_nodelay(true)
        .initial_stream_window_size(crate::rpc::STREAM_WINDOW)
        .initial_connection_window_size(crate::rpc::CONNECTION_WINDOW)
        .connect_timeout(Duration::from_secs(3))
        .http2_keep_alive_interval(every)
        .keep_alive_timeout(within)
        .keep_alive_while_idle(true);
    Ok(endpoint)
}
