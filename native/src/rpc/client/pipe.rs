//! The agent's end of a pipe to a worker of its host (PIPE-1, `rpc/pipe.rs`): the task
//! that writes a relayed connection's calls as `Calls` frames, and the one that reads
//! the worker's `Replies` frames and completes their slots. A pipe that ends fails
//! every call still waiting on it as lost (CLIENT-1): it is never resumed, so nothing
//! is sent twice.

use super::pending::{fail_all, Pending};
use crate::proto::v1::{Call, Calls, Replies};
use crate::rpc::pipe::{self, PipeWriter};
use crate::rpc::RpcError;
use crate::sync::lock;
use prost::Message;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};

/// The pipe of the worker serving at `addr`, connected (a local socket: this does not
/// wait), or `None` if there is none to connect to (then the connection keeps gRPC).
pub(super) fn connect(addr: &str) -> Option<std::os::unix::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    if !pipe::enabled() {
        return None;
    }
    let name = std::os::unix::net::SocketAddr::from_abstract_name(pipe::name_of(addr)).ok()?;
    let s = std::os::unix::net::UnixStream::connect_addr(&name).ok()?;
    if !pipe::same_user(s.as_raw_fd()) {
        eprintln!(
            "monarch agent: the pipe name of the worker at {addr} is held by another user: \
             its calls stay on gRPC"
        );
        return None;
    }
    Some(s)
}

/// Runs the pipe `stream` for a relayed connection: calls from `rx` go out, replies
/// complete `pending`'s slots, until the pipe ends or nobody holds the connection.
pub(super) fn run(
    rt: &Handle,
    stream: std::os::unix::net::UnixStream,
    addr: String,
    token: &str,
    rx: mpsc::UnboundedReceiver<Call>,
    pending: Arc<Mutex<Pending>>,
    abandoned: Arc<Notify>,
) {
    let _guard = rt.enter();
    let sock = match pipe::socket(stream) {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("its pipe cannot be used: {e}");
            fail_all(&pending, RpcError::ConnectionLost { addr, reason });
            return;
        }
    };
    let writer = PipeWriter::new(sock.clone());
    // (the token was checked when the connection's client was made)
    let hello = crate::rpc::auth::bearer(token).unwrap_or_default();
    writer.send(pipe::frame_bytes(hello.as_bytes()));
    rt.spawn(write_calls(writer, rx, abandoned));
    rt.spawn(read_replies(pipe::FrameReader::new(sock), addr, pending));
}

/// Sends what `rx` brings, each batch queued at once as one frame.
async fn write_calls(
    writer: Arc<PipeWriter>,
    mut rx: mpsc::UnboundedReceiver<Call>,
    abandoned: Arc<Notify>,
) {
    let mut calls = Vec::new();
    loop {
        tokio::select! {
            n = rx.recv_many(&mut calls, crate::rpc::batch::MAX_BATCH) => {
                if n == 0 {
                    return; // nobody holds the connection: the worker sees the pipe end
                }
            }
            _ = abandoned.notified() => return,
        }
        let batch = Calls {
            calls: std::mem::take(&mut calls),
            ..Default::default()
        };
        writer.send(pipe::frame(&batch));
    }
}

/// Completes the slots of the replies the worker sends; when the pipe ends, fails
/// what still waits.
async fn read_replies(mut rd: pipe::FrameReader, addr: String, pending: Arc<Mutex<Pending>>) {
    let reason = loop {
        let frame = match rd.next().await {
            Ok(Some(f)) => f,
            Ok(None) => {
                break "the worker closed its pipe (it ended, or refused the token)".to_string()
            }
            Err(e) => break format!("its pipe broke: {e}"),
        };
        let Ok(batch) = Replies::decode(frame) else {
            break "the worker sent a malformed frame on its pipe".to_string();
        };
        for r in batch.replies {
            let slot = {
                let mut p = lock(&pending);
                let slot = p.take(r.call_id, None);
                p.received.clear(); // (acknowledgements are RESUME-1's; a pipe never resumes)
                slot
            };
            if let Some(slot) = slot {
                slot.complete(Ok(r));
            }
        }
    };
    fail_all(&pending, RpcError::ConnectionLost { addr, reason });
}
