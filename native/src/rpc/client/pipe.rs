//! The agent's end of a pipe to a worker of its host (PIPE-1, `rpc/pipe.rs`): a relayed
//! connection's calls written as `Calls` frames by the thread that sends them, and the
//! task that reads the worker's `Replies` frames and completes their slots. A pipe that
//! ends fails every call still waiting on it as lost (CLIENT-1): it is never resumed,
//! so nothing is sent twice. A heartbeat's ping goes on the pipe too (PIPE-3, [`Pipe`]).

use super::pending::{fail_all, Pending};
use crate::proto::v1::{Call, Calls, PingReply, PingRequest, Replies};
use crate::rpc::pipe::{self, PipeWriter};
use crate::rpc::RpcError;
use crate::sync::lock;
use prost::Message;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};

/// The agent's end of a worker's pipe, as its connection uses it: each call goes out
/// on it at once, from the thread that sends it (PIPE-1: no task between, no copy), and
/// the heartbeat's pings.
///
/// PIPE-3: the pings of a pipe's connection, answered on the pipe by the worker's
/// reading thread (its runtime is not woken, nor is Python), as the `Ping` RPC
/// answers: an idle worker's heartbeat costs it one thread wake-up, not a gRPC request.
///
/// PIPE-4: a worker that sent replies within the last [`HEARD_WITHIN`] is answered for
/// from its last pong (its pid, and its epoch, when that is at least the ping's) for up
/// to [`PONG_KEPT`]: a busy worker's replies show it answers, and its heartbeat does
/// not wake it between calls. A newer epoch, or a silent worker, goes on the pipe.
pub struct Pipe {
    writer: Arc<PipeWriter>,
    state: Mutex<PingState>,
}

#[derive(Default)]
struct PingState {
    last: u64,
    waiting: HashMap<u64, oneshot::Sender<PingReply>>,
    /// The pipe has ended: pings take gRPC.
    ended: bool,
    /// PIPE-4: the worker's last pong on the pipe, and when it came.
    pong: Option<(PingReply, Instant)>,
    /// PIPE-4: when the worker's last replies came.
    heard: Option<Instant>,
}

/// PIPE-4: how recent a worker's replies must be for its last pong to answer a ping
/// (the heartbeat's period).
pub const HEARD_WITHIN: Duration = Duration::from_secs(1);
/// PIPE-4: how long a pong may answer for the worker: beyond it, a ping goes on the
/// pipe however busy the worker is (an epoch raised by another path is seen then).
pub const PONG_KEPT: Duration = Duration::from_secs(5);

impl PingState {
    /// PIPE-4: the answer to a ping carrying `epoch` at `now` without asking the
    /// worker, if its replies and its last pong are recent enough.
    fn answers_for(&self, epoch: u64, now: Instant) -> Option<PingReply> {
        let (pong, at) = self.pong.as_ref()?;
        let heard = self.heard?;
        let fresh = now.saturating_duration_since(heard) < HEARD_WITHIN
            && now.saturating_duration_since(*at) < PONG_KEPT;
        (fresh && pong.epoch >= epoch).then_some(*pong)
    }
}

/// Forgets a ping whose caller stopped waiting (a timeout): a hung worker's pings do
/// not pile up.
struct Waiting<'a>(&'a Pipe, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).waiting.remove(&self.1);
    }
}

impl Pipe {
    /// Writes `call` on the pipe now, as a `Calls` frame made from it (PIPE-1).
    pub(super) fn send_call(&self, call: &Call) {
        self.writer.send(calls_frame(call));
    }

    /// Pings the worker on the pipe, carrying `epoch`: its answer, or `None` if the
    /// pipe has ended (or ends before the answer).
    pub(super) async fn ping(&self, epoch: u64) -> Option<PingReply> {
        let (nonce, rx) = {
            let mut st = lock(&self.state);
            if st.ended {
                return None;
            }
            if let Some(pong) = st.answers_for(epoch, Instant::now()) {
                return Some(pong); // PIPE-4
            }
            st.last += 1;
            let nonce = st.last;
            let (tx, rx) = oneshot::channel();
            st.waiting.insert(nonce, tx);
            (nonce, rx)
        };
        let _forget = Waiting(self, nonce);
        let ping = Calls {
            ping: Some(PingRequest { nonce, epoch }),
            ..Default::default()
        };
        self.writer.send(pipe::frame(&ping));
        rx.await.ok()
    }

    fn answer(&self, pong: PingReply) {
        let tx = {
            let mut st = lock(&self.state);
            st.pong = Some((pong, Instant::now()));
            st.waiting.remove(&pong.nonce)
        };
        if let Some(tx) = tx {
            let _ = tx.send(pong);
        }
    }

    /// The worker sent replies (PIPE-4).
    fn heard(&self) {
        lock(&self.state).heard = Some(Instant::now());
    }

    fn end(&self) {
        let mut st = lock(&self.state);
        st.ended = true;
        st.waiting.clear();
    }
}

/// A `Calls` message holding `call` alone, as one frame ([`pipe::frame`]'s), encoded
/// from the borrowed call (`calls` is the message's field 1).
fn calls_frame(call: &Call) -> bytes::Bytes {
    use prost::encoding::message;
    let len = message::encoded_len(1, call);
    let mut buf = bytes::BytesMut::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    message::encode(1, call, &mut buf);
    buf.freeze()
}

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

/// Runs the pipe `stream` for a relayed connection: replies complete `pending`'s
/// slots until the pipe ends. Returns the connection's [`Pipe`], on which its calls go
/// ([`Pipe::send_call`]), or `None` if the pipe could not be used (its calls failed).
/// `rx` brings no call: its end (nobody holds the connection) or `abandoned` ends the
/// writing half.
pub(super) fn run(
    rt: &Handle,
    stream: std::os::unix::net::UnixStream,
    addr: String,
    token: &str,
    rx: mpsc::UnboundedReceiver<Call>,
    pending: Arc<Mutex<Pending>>,
    abandoned: Arc<Notify>,
) -> Option<Arc<Pipe>> {
    let _guard = rt.enter();
    let sock = match pipe::socket(stream) {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("its pipe cannot be used: {e}");
            fail_all(&pending, RpcError::ConnectionLost { addr, reason });
            return None;
        }
    };
    let writer = PipeWriter::new(sock.clone());
    // (the token was checked when the connection's client was made)
    let hello = crate::rpc::auth::bearer(token).unwrap_or_default();
    writer.send(pipe::frame_bytes(hello.as_bytes()));
    let conn_pipe = Arc::new(Pipe {
        writer: writer.clone(),
        state: Mutex::default(),
    });
    rt.spawn(hold_writer(writer, rx, abandoned));
    let rd = pipe::FrameReader::new(sock);
    rt.spawn(read_replies(rd, addr, pending, conn_pipe.clone()));
    Some(conn_pipe)
}

/// Holds the pipe's writing half until nobody holds the connection (`rx`, which
/// brings no call, ends) or its calls are abandoned.
async fn hold_writer(
    writer: Arc<PipeWriter>,
    mut rx: mpsc::UnboundedReceiver<Call>,
    abandoned: Arc<Notify>,
) {
    tokio::select! {
        _ = async { while rx.recv().await.is_some() {} } => {}
        _ = abandoned.notified() => {}
    }
    drop(writer);
}

/// Completes the slots of the replies the worker sends; when the pipe ends, fails
/// what still waits.
async fn read_replies(
    mut rd: pipe::FrameReader,
    addr: String,
    pending: Arc<Mutex<Pending>>,
    pings: Arc<Pipe>,
) {
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
        if !batch.replies.is_empty() {
            pings.heard();
        }
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
        if let Some(pong) = batch.pong {
            pings.answer(pong);
        }
    };
    pings.end();
    fail_all(&pending, RpcError::ConnectionLost { addr, reason });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_framed_from_a_borrow_is_the_frame_of_a_calls_message_holding_it() {
        let call = Call {
            call_id: 7,
            actor: "echo".into(),
            method: "ping".into(),
            payload: bytes::Bytes::from_static(b"x"),
            rank: 3,
            dims: vec!["hosts".into(), "procs".into()],
            sizes: vec![64, 16],
            origin: "cell 1".into(),
            ..Default::default()
        };
        let whole = pipe::frame(&Calls {
            calls: vec![call.clone()],
            ..Default::default()
        });
        assert_eq!(calls_frame(&call), whole);
    }

    #[test]
    fn a_pong_answers_only_while_replies_are_recent_the_pong_young_and_its_epoch_enough() {
        let t0 = Instant::now();
        let pong = PingReply {
            nonce: 1,
            pid: 42,
            epoch: 5,
        };
        let st = PingState {
            pong: Some((pong, t0)),
            heard: Some(t0),
            ..Default::default()
        };
        let at = |d: Duration| t0 + d;
        assert_eq!(
            st.answers_for(5, at(Duration::ZERO)).map(|p| p.pid),
            Some(42)
        );
        assert!(st.answers_for(4, at(Duration::from_millis(900))).is_some());
        assert!(
            st.answers_for(6, t0).is_none(),
            "a newer epoch must reach the worker"
        );
        assert!(
            st.answers_for(5, at(HEARD_WITHIN)).is_none(),
            "a worker silent for the heartbeat's period must be asked"
        );
        let busy = PingState {
            heard: Some(at(PONG_KEPT)),
            ..st
        };
        assert!(
            busy.answers_for(5, at(PONG_KEPT)).is_none(),
            "a pong older than PONG_KEPT answered"
        );
        let never = PingState {
            heard: None,
            pong: busy.pong,
            ..Default::default()
        };
        assert!(
            never.answers_for(0, t0).is_none(),
            "a worker never heard from was answered for"
        );
    }
}
