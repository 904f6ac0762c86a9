//! WATCH-1: a controller's client of the `HostAgent` service for what it does all the
//! time: its `Watch` stream on each host agent (its lease on the mesh, and the agent's
//! events: exits, output lines, a stop) and the heartbeat's `PingWorkers` to every
//! agent (SUPERVISE-2), run by the node runtime. The rest of that service (spawns,
//! listings, attach) stays with grpcio, in Python (`control/_agent_client.py`).
//!
//! Both were grpcio's: a Python thread per host reading its stream, which grpcio wakes
//! ten times a second to look for an interrupt, beside a thread per channel that polls
//! its completion queue while a call is open, and started anew for each heartbeat's
//! call: at 64 hosts, 64 threads started a second and most of an idle controller's CPU.
//! Here one HTTP/2 connection per agent ([`AgentConn`]) carries both; the runtime reads
//! every stream, and the thread that handles one host's events waits on
//! [`AgentWatch::next_blocking`] with nothing to poll: it wakes when an event comes. A
//! heartbeat is one wait, with the GIL released, for every agent's answer.
//!
//! A stream's events pass through a bounded queue: while its reader is behind, the
//! runtime stops reading the stream, and the agent's own queue for that watcher fills
//! and drops lines (it says how many, `AgentEvent.dropped`), as it did with grpcio.

use super::pool::endpoint;
use crate::proto::v1::host_agent_client::HostAgentClient;
use crate::proto::v1::{PingWorkersRequest, WatchRequest};
use crate::rpc::auth::TokenAttach;
use crate::rpc::{Keepalive, RpcError, MAX_MESSAGE_BYTES};
use crate::sync::lock;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};

type Client = HostAgentClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, TokenAttach>,
>;

/// One connection to one host agent (opened with its first RPC, opened again after a
/// break with the next), with the mesh token on every request; dropped with its last
/// user.
#[derive(Clone)]
pub struct AgentConn {
    client: Client,
}

impl AgentConn {
    /// A connection to the agent at `addr` of the mesh with `token`: TLS checked
    /// against the mesh's CA `ca` (TLS-1; None: plaintext), as the caller's grpcio
    /// channel to it (a process that only looks at a mesh, as the panel's server,
    /// has its CA from the mesh's record, not in this process's table); pinged every
    /// second, so that a partition ends its streams within seconds (SUPERVISE-4 then
    /// waits for the host), as grpcio's channel was.
    pub fn open(rt: &Handle, addr: &str, token: &str, ca: Option<&str>) -> Result<Self, RpcError> {
        let attach = TokenAttach::new(token).map_err(|e| RpcError::Auth(e.to_string()))?;
        let endpoint = endpoint(addr, ca, Keepalive::Watchful)?;
        // HTTP/2's own stream window, not the control plane's wide one: a controller
        // that falls behind the events must stop the stream soon, so that the agent's
        // queue for it fills and drops lines and says so (`AgentEvent.dropped`), rather
        // than megabytes of lines waiting here unseen. The connection's window is wide
        // (see `EVENT_CONNECTION_WINDOW`).
        let endpoint = endpoint
            .initial_stream_window_size(EVENT_WINDOW)
            .initial_connection_window_size(EVENT_CONNECTION_WINDOW);
        let _guard = rt.enter();
        let client = HostAgentClient::with_interceptor(endpoint.connect_lazy(), attach)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(AgentConn { client })
    }

    /// Opens a `Watch` stream on the agent; a failure to connect ends it, as an item.
    pub fn watch(&self, rt: &Handle) -> AgentWatch {
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let cancelled = Arc::new(Notify::new());
        let stop = cancelled.clone();
        let client = self.client.clone();
        rt.spawn(async move {
            let end = tokio::select! {
                _ = stop.notified() => None,
                end = read(client, &tx) => end,
            };
            let _ = tx.send(WatchItem::End(end)).await;
        });
        AgentWatch {
            rx: Mutex::new(rx),
            cancelled,
        }
    }
}

/// SUPERVISE-2, one message per host: asks each agent of `conns` to ping its running
/// workers (`req`) and waits for every answer, each for at most `limit`: by agent, its
/// `PingWorkersReply` encoded, or the gRPC status code and text of its failure.
pub fn ping_workers(
    rt: &Handle,
    conns: &[AgentConn],
    req: PingWorkersRequest,
    limit: Duration,
) -> Vec<Result<Vec<u8>, (i32, String)>> {
    let asks: Vec<_> = conns
        .iter()
        .map(|c| {
            let mut client = c.client.clone();
            rt.spawn(async move {
                match tokio::time::timeout(limit, client.ping_workers(req)).await {
                    Ok(Ok(r)) => Ok(r.into_inner().encode_to_vec()),
                    Ok(Err(s)) => Err(status_of(&s)),
                    Err(_) => Err((
                        tonic::Code::DeadlineExceeded as i32,
                        "Deadline Exceeded".to_string(),
                    )),
                }
            })
        })
        .collect();
    rt.block_on(async {
        let mut out = Vec::with_capacity(asks.len());
        for ask in asks {
            out.push(
                ask.await
                    .unwrap_or_else(|e| Err((tonic::Code::Internal as i32, e.to_string()))),
            );
        }
        out
    })
}

/// The flow-control window of an agent connection's streams (HTTP/2's default): what
/// a stream holds unread here at most.
const EVENT_WINDOW: u32 = 65_535;

/// The window of the whole agent connection. Not for its bytes (a stream holds at
/// most [`EVENT_WINDOW`]), for the count of its frames: h2 ends a connection whose
/// peer sent more small DATA frames (under 256 bytes, each one costing 256 less its
/// size) than half this window while they wait unread (`ENHANCE_YOUR_CALM`,
/// "too_many_data_frames"), and each output line is a frame of its own. With the
/// stream window as the connection's, about 150 lines unread ended the connection,
/// and the mesh was reported lost, when the notebook was busy for a moment. A full
/// stream window of the smallest events (7 bytes: a gRPC prefix and a `dropped`)
/// costs ~2.3 MB; half of this window is 8 MiB.
const EVENT_CONNECTION_WINDOW: u32 = 16 << 20;

/// Events read ahead of the thread that handles them.
const READ_AHEAD: usize = 64;

/// What a watch gives, in order: its events, then its end once.
#[derive(Debug)]
pub enum WatchItem {
    /// An `AgentEvent`, encoded (the Python side decodes it with its own classes).
    Event(Vec<u8>),
    /// The stream ended: `None` when the agent closed it or it was cancelled here, else
    /// the gRPC status code and what the transport or the agent said.
    End(Option<(i32, String)>),
}

/// One open `Watch` stream; dropping it (or [`cancel`](Self::cancel)) closes the stream,
/// which ends the lease it holds.
pub struct AgentWatch {
    rx: Mutex<mpsc::Receiver<WatchItem>>,
    cancelled: Arc<Notify>,
}

impl AgentWatch {
    /// The next item, waiting for it (from a thread outside the runtime); after the
    /// end, `End(None)`.
    pub fn next_blocking(&self) -> WatchItem {
        lock(&self.rx)
            .blocking_recv()
            .unwrap_or(WatchItem::End(None))
    }

    /// Closes the stream; its end (`None`) follows the events already read.
    pub fn cancel(&self) {
        self.cancelled.notify_one(); // (a permit: a cancel before the task waits counts)
    }
}

/// Reads the stream into `tx` until it ends; how it ended (None: closed by the agent,
/// or nobody reads any more).
async fn read(mut client: Client, tx: &mpsc::Sender<WatchItem>) -> Option<(i32, String)> {
    let mut stream = match client.watch(WatchRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Some(status_of(&s)),
    };
    loop {
        match stream.message().await {
            Ok(Some(ev)) => {
                if tx.send(WatchItem::Event(ev.encode_to_vec())).await.is_err() {
                    return None;
                }
            }
            Ok(None) => return None,
            Err(s) => return Some(status_of(&s)),
        }
    }
}

/// A status as its code and its text, with the transport's causes (tonic's message
/// alone says "transport error").
fn status_of(s: &tonic::Status) -> (i32, String) {
    let mut text = s.message().to_string();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text = if text.is_empty() {
                more
            } else {
                format!("{text}: {more}")
            };
        }
        cause = e.source();
    }
    (s.code() as i32, text)
}
