//! The gRPC control plane: token authentication ([`auth`]), TLS across hosts
//! ([`tls`]), the completion slots that carry replies to waiting threads ([`slot`]),
//! the `Worker` service ([`server`]) and its one client ([`client`]).

pub mod auth;
pub mod batch;
pub mod client;
pub mod inbox;
pub mod lane;
pub mod pipe;
pub mod pipe_in;
pub mod resume;
pub mod server;
pub mod slot;
pub mod tls;

/// Largest gRPC message in either direction (payload plus out-of-band buffers).
/// Larger values must go through the data plane.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// HTTP/2 flow-control windows. The defaults (64 KiB per stream) stall a pipeline of
/// small calls on window updates long before the peer is busy.
pub const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
/// See [`STREAM_WINDOW`]; the connection's window spans all its streams.
pub const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;

/// How often a server or client pings a quiet connection, and how long it waits for
/// the answer before it drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keepalive {
    /// 1 s and 3 s: a silent peer is noticed within seconds (docs/architecture.md,
    /// "Supervision"): the agents' servers (a controller's lease, AGENT-2) and the
    /// connections of a process that must see a partition.
    Watchful,
    /// 15 s and 20 s: a worker's server, and an agent's connections to its own
    /// workers. Their callers watch the connection themselves (the controller pings
    /// its side every second; an agent sees its workers exit), and 1,024 workers each
    /// pinging every caller every second cost a core of this machine (TREE-1's scale).
    Relaxed,
}

impl Keepalive {
    /// (interval, timeout).
    pub fn times(self) -> (std::time::Duration, std::time::Duration) {
        use std::time::Duration;
        match self {
            Keepalive::Watchful => (Duration::from_secs(1), Duration::from_secs(3)),
            Keepalive::Relaxed => (Duration::from_secs(15), Duration::from_secs(20)),
        }
    }
}

/// The settings every gRPC server of the node runtime shares: keepalive (`keepalive`)
/// and wide flow-control windows.
pub fn server_builder(keepalive: Keepalive) -> tonic::transport::Server {
    let (every, within) = keepalive.times();
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(every))
        .http2_keepalive_timeout(Some(within))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
}

/// [`server_builder`], serving TLS with `tls` when given (TLS-1), plaintext otherwise.
pub fn server_builder_with(
    tls: Option<&tls::ServerIdentity>,
    keepalive: Keepalive,
) -> Result<tonic::transport::Server, RpcError> {
    let builder = server_builder(keepalive);
    let Some(id) = tls else { return Ok(builder) };
    tls::install_provider();
    builder.tls_config(id.server_config()).map_err(|e| {
        RpcError::TlsConfig(format!(
            "the TLS server certificate or key cannot be used: {e}"
        ))
    })
}

/// The connections accepted on `listener`, with Nagle's algorithm off. The builder's
/// `tcp_nodelay` only applies to listeners tonic binds itself; without this, a reply
/// written in two pieces waits for the peer's delayed ACK (40 ms).
pub fn incoming(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        let s = s?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

/// Errors of the control plane.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The peer went away (process exited, connection reset) before replying.
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost {
        /// The peer's address.
        addr: String,
        /// What the transport said.
        reason: String,
    },
    /// The peer rejected our token.
    #[error("{0}")]
    Auth(String),
    /// The message is above [`MAX_MESSAGE_BYTES`].
    #[error("message of {size} bytes is over the {limit}-byte limit of the control plane")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Any other gRPC failure.
    #[error("gRPC error from {addr}: {status}")]
    Status {
        /// The peer's address.
        addr: String,
        /// The gRPC status text.
        status: String,
    },
    /// The TLS handshake with the peer failed (TLS-2): it presented a certificate
    /// that the mesh's CA did not sign, or does not speak TLS while we do.
    #[error(
        "TLS with {addr} failed: {reason}. Across hosts, every server of a mesh presents the \
         mesh's certificate and this process checks it against the mesh's CA: either {addr} \
         is not a server of this mesh, or only one side of the connection uses TLS"
    )]
    Tls {
        /// The peer's address.
        addr: String,
        /// What the TLS layer said.
        reason: String,
    },
    /// A TLS certificate, key or CA given to us cannot be used.
    #[error("{0}")]
    TlsConfig(String),
    /// The address could not be parsed or bound.
    #[error("bad address {0}")]
    Address(String),
    /// Socket-level failure while setting up a server.
    #[error("I/O error: {0}")]
    Io(String),
}

impl RpcError {
    /// Classifies a tonic status returned by `addr`.
    pub fn from_status(addr: &str, s: &tonic::Status) -> Self {
        if let Some(reason) = tls::failure(s) {
            return RpcError::Tls {
                addr: addr.to_string(),
                reason,
            };
        }
        match s.code() {
            tonic::Code::Unauthenticated => RpcError::Auth(format!("{addr}: {}", s.message())),
            tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => {
                RpcError::ConnectionLost {
                    addr: addr.to_string(),
                    reason: s.message().to_string(),
                }
            }
            _ => RpcError::Status {
                addr: addr.to_string(),
                status: format!("{:?}: {}", s.code(), s.message()),
            },
        }
    }
}
