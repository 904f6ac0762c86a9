//! A controller's hold on its host agents, in the native runtime (WATCH-1): each
//! agent's `Watch` stream (the controller's lease, AGENT-2) and the heartbeat's
//! `PingWorkers` (SUPERVISE-2). Through grpcio each stream was a Python thread that
//! woke ten times a second to look for an event (grpcio's wait loop) and kept a
//! polling thread of its channel awake, and each heartbeat's futures started such
//! threads again: at 64 agents, about a thousand wake-ups a second that each took
//! the GIL. Here a stream that has nothing to say costs nothing (its task waits in
//! the runtime; the thread that reads it waits with the GIL released), and a
//! heartbeat is one call from Python for every agent.

use super::detach;
use crate::node;
use crate::proto::v1::host_agent_client::HostAgentClient;
use crate::proto::v1::{PingWorkersRequest, WatchRequest};
use crate::rpc::auth::TokenAttach;
use crate::rpc::{tls, Keepalive, MAX_MESSAGE_BYTES};
use crate::sync::lock;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tonic::transport::{Channel, Endpoint};

/// gRPC's status codes that the end of a stream reports (tonic's numbering).
const OK: i32 = 0;
const CANCELLED: i32 = 1;
const UNAVAILABLE: i32 = 14;

/// Events read from the stream and not yet taken: past this the stream is not read
/// until they are, so a controller that falls behind slows its agent's stream (which
/// then tells it how many lines it missed) instead of buffering without bound.
const BUFFERED: usize = 256;

/// How a stream ended: gRPC's status code and message.
type Ended = Arc<Mutex<Option<(i32, String)>>>;

/// The `Watch` stream of the agent at `addr`, for the mesh of `token`: TLS checked
/// against `ca_pem` when given (TLS-2), with the keepalive of a lease (a silent agent
/// ends the stream within seconds).
#[pyclass(frozen, name = "AgentWatch", module = "monarch_kernel._native")]
pub struct PyAgentWatch {
    /// Encoded `AgentEvent`s.
    rx: Mutex<mpsc::Receiver<Vec<u8>>>,
    ended: Ended,
    stop: Arc<Notify>,
}

#[pymethods]
impl PyAgentWatch {
    #[new]
    #[pyo3(signature = (addr, token, ca_pem=None))]
    fn new(addr: &str, token: &str, ca_pem: Option<&str>) -> PyResult<Self> {
        let attach = TokenAttach::new(token).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let endpoint = endpoint(addr, ca_pem)?;
        let (tx, rx) = mpsc::channel(BUFFERED);
        let stop = Arc::new(Notify::new());
        let ended = Ended::default();
        node::handle().spawn(pump(endpoint, attach, tx, stop.clone(), ended.clone()));
        Ok(PyAgentWatch {
            rx: Mutex::new(rx),
            ended,
            stop,
        })
    }

    /// The next event (an encoded `AgentEvent`), waiting for it with the GIL
    /// released; None once the stream has ended (then see `ended`).
    fn next<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let event = detach(py, || lock(&self.rx).blocking_recv())?;
        Some(PyBytes::new(py, &event))
    }

    /// How the stream ended, once `next` returned None: ``(code, message)``, gRPC's
    /// status code (0: the agent closed it; 1: `cancel()`).
    #[getter]
    fn ended(&self) -> Option<(i32, String)> {
        let ended = lock(&self.ended).clone();
        // (the runtime stopped before the stream's task could say how it ended)
        ended.or(Some((CANCELLED, "the native runtime stopped".to_string())))
    }

    /// Ends the stream (the agent sees its watcher go); `next` then returns None.
    fn cancel(&self) {
        self.stop.notify_one();
    }
}

impl Drop for PyAgentWatch {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// An agent's endpoint: TLS checked against `ca_pem` when given (TLS-2), with the
/// keepalive of a lease (a silent agent is noticed within seconds).
fn endpoint(addr: &str, ca_pem: Option<&str>) -> PyResult<Endpoint> {
    let scheme = if ca_pem.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| PyValueError::new_err(format!("{addr}: {e}")))?;
    if let Some(ca) = ca_pem {
        tls::install_provider();
        endpoint = endpoint
            .tls_config(tls::client_config(ca))
            .map_err(|e| PyValueError::new_err(format!("the mesh's CA cannot be used: {e}")))?;
    }
    let (every, within) = Keepalive::Watchful.times();
    Ok(endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(3))
        .http2_keep_alive_interval(every)
        .keep_alive_timeout(within)
        .keep_alive_while_idle(true))
}

type AgentKey = (String, String, Option<String>);

/// This process's connection to each agent it pings (shared, opened on first use).
fn agent_channel(key: &AgentKey) -> PyResult<Channel> {
    static CHANNELS: OnceLock<Mutex<HashMap<AgentKey, Channel>>> = OnceLock::new();
    let mut map = lock(CHANNELS.get_or_init(Default::default));
    if let Some(c) = map.get(key) {
        return Ok(c.clone());
    }
    let _guard = node::handle().enter();
    let channel = endpoint(&key.0, key.2.as_deref())?.connect_lazy();
    map.insert(key.clone(), channel.clone());
    Ok(channel)
}

/// SUPERVISE-2's heartbeat, one message per host, all at once (WATCH-1): each agent
/// of `agents` (address, token, CA) pings its workers with `epoch`; per agent, its
/// encoded `PingWorkersReply`, or None when it did not answer within `timeout_s`
/// (plus a second) or failed. The GIL is released while they run.
#[pyfunction]
#[pyo3(signature = (agents, epoch, timeout_s, usage=false))]
fn ping_agents<'py>(
    py: Python<'py>,
    agents: Vec<AgentKey>,
    epoch: u64,
    timeout_s: f64,
    usage: bool,
) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
    let rt = node::handle();
    let request = PingWorkersRequest {
        epoch,
        timeout_ms: (timeout_s * 1000.0).clamp(10.0, u32::MAX as f64) as u32,
        usage,
    };
    let within = Duration::from_secs_f64(timeout_s.max(0.0) + 1.0);
    let mut calls = Vec::with_capacity(agents.len());
    for key in &agents {
        let attach = TokenAttach::new(&key.1).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut client = HostAgentClient::with_interceptor(agent_channel(key)?, attach);
        calls.push(rt.spawn(async move {
            match tokio::time::timeout(within, client.ping_workers(request)).await {
                Ok(Ok(reply)) => Some(reply.into_inner().encode_to_vec()),
                _ => None,
            }
        }));
    }
    let replies: Vec<Option<Vec<u8>>> = detach(py, || {
        rt.block_on(async {
            let mut out = Vec::with_capacity(calls.len());
            for call in calls {
                out.push(call.await.ok().flatten());
            }
            out
        })
    });
    Ok(replies
        .into_iter()
        .map(|r| r.map(|b| PyBytes::new(py, &b)))
        .collect())
}

/// Reads the stream into `tx` until it ends or `stop` is told; says how it ended in
/// `ended`, then closes `tx` (the reader's `next` returns None once it has the rest).
async fn pump(
    endpoint: Endpoint,
    attach: TokenAttach,
    tx: mpsc::Sender<Vec<u8>>,
    stop: Arc<Notify>,
    ended: Ended,
) {
    let end = tokio::select! {
        _ = stop.notified() => (CANCELLED, "cancelled by this process".to_string()),
        end = forward(endpoint, attach, &tx) => end,
    };
    *lock(&ended) = Some(end);
}

/// Forwards the stream's events to `tx` until it ends: how it ended.
async fn forward(
    endpoint: Endpoint,
    attach: TokenAttach,
    tx: &mpsc::Sender<Vec<u8>>,
) -> (i32, String) {
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            let why = match tls::failure(&e) {
                Some(t) => format!("TLS handshake failed: {t}"),
                None => connect_error(&e),
            };
            return (UNAVAILABLE, why);
        }
    };
    let mut client = HostAgentClient::with_interceptor(channel, attach)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let mut events = match client.watch(WatchRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) => return (s.code() as i32, s.message().to_string()),
    };
    loop {
        match events.message().await {
            Ok(Some(event)) => {
                if tx.send(event.encode_to_vec()).await.is_err() {
                    return (CANCELLED, "nobody reads the stream".to_string());
                }
            }
            Ok(None) => return (OK, String::new()),
            Err(s) => return (s.code() as i32, s.message().to_string()),
        }
    }
}

/// A connection error and what caused it, in one line.
fn connect_error(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    parts.join(": ")
}

pub fn register_python_bindings(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyAgentWatch>()?;
    m.add_function(wrap_pyfunction!(ping_agents, m)?)
}
