//! The gRPC control plane: token authentication ([`auth`]), the completion slots that
//! carry replies to waiting threads ([`slot`]), the `Worker` service ([`server`]) and
//! its one client ([`client`]).

pub mod auth;
pub mod batch;
pub mod client;
pub mod server;
pub mod slot;

/// Largest gRPC message in either direction (payload plus out-of-band buffers).
/// Larger values must go through the data plane.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

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
