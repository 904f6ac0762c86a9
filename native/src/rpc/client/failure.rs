//! What a failed RPC of a connection means: a loss (CLIENT-1), which fails its calls, or
//! a break that resuming mends (RESUME-1); and how soon to try again after a break.

use crate::rpc::RpcError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// [`RpcError::from_status`] for a connection: a plaintext one that fails before the
/// worker ever answered on it is checked for a TLS server behind it, so that lacking
/// the mesh's CA is told as such and not as a lost worker (TLS-2).
pub(super) async fn error_of(
    addr: &str,
    s: &tonic::Status,
    plaintext_unanswered: bool,
) -> RpcError {
    use std::error::Error;
    let err = RpcError::from_status(addr, s);
    // A status the transport made (it has a cause), not one the worker sent.
    if plaintext_unanswered
        && s.source().is_some()
        && crate::rpc::tls::speaks_tls(addr, crate::rpc::tls::PROBE_TIMEOUT).await
    {
        return RpcError::Tls {
            addr: addr.to_string(),
            reason: "the server speaks TLS, and this process does not have the mesh's CA \
                     (its connections to the mesh are plaintext)"
                .into(),
        };
    }
    err
}

/// Whether any cause of `s` (the transport's errors below the status) is `pred`'s.
fn has_cause(s: &tonic::Status, pred: impl Fn(&(dyn std::error::Error + 'static)) -> bool) -> bool {
    use std::error::Error;
    let mut cause: Option<&(dyn Error + 'static)> = s.source();
    while let Some(e) = cause {
        if pred(e) {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Whether the connection was refused: nothing listens there (the worker is gone), as
/// opposed to a peer that does not answer.
fn refused(s: &tonic::Status) -> bool {
    has_cause(s, |e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// Whether `s` failed before a connection was made: nothing sent on it arrived.
pub(super) fn never_connected(s: &tonic::Status) -> bool {
    has_cause(s, |e| e.downcast_ref::<tonic::ConnectError>().is_some())
}

/// What a failed RPC of a connection means: its error, and whether it is a loss
/// (CLIENT-1) rather than a break that resuming mends (RESUME-1). `answered`: whether
/// the worker ever answered on it ([`error_of`]).
pub(super) async fn failure(
    addr: &str,
    s: &tonic::Status,
    plaintext: bool,
    answered: &AtomicBool,
) -> (RpcError, bool) {
    let unanswered = plaintext && !answered.load(Ordering::Relaxed);
    let err = error_of(addr, s, unanswered).await;
    let loss = is_loss(s, &err);
    (err, loss)
}

/// Whether a failed stream means the worker is gone or refuses this caller
/// (CLIENT-1), rather than a break that resuming mends (RESUME-1).
fn is_loss(s: &tonic::Status, err: &RpcError) -> bool {
    use std::error::Error;
    match err {
        RpcError::Auth(_) | RpcError::Tls { .. } | RpcError::TlsConfig(_) => return true,
        _ if s.source().is_none() => return true, // the worker said so (its dispatcher stopped)
        _ => {}
    }
    refused(s)
}

/// How long to wait before opening the stream again after `attempt` failed tries: the
/// first at once (a dead worker's refusal is then known without delay).
pub(super) fn backoff(attempt: u32) -> Duration {
    match attempt {
        0 => Duration::ZERO,
        n => Duration::from_millis((50u64 << n.min(5)).min(1000)),
    }
}
