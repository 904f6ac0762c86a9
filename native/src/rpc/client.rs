//! The one client of the `Worker` service. A [`WorkerConn`] is one HTTP/2 connection
//! to one worker with one long-lived `Messages` stream on it; calls are matched to
//! replies by call id and complete [`Slot`]s.
//!
//! CLIENT-1: once a connection is lost, every pending call on it fails with
//! [`RpcError::ConnectionLost`] and so does every later call: nothing waits forever
//! on a dead worker. A connection is lost when the worker is known to be gone: its
//! address refuses connections, it closed the stream, it is another process than the
//! one the connection opened to, or the server refused the caller (its token, TLS).
//! RESUME-1 (`resume.rs`): any other break (a partition, a stopped process, a
//! dropped keepalive) is not a loss: the connection opens the stream again, with
//! backoff, for as long as it takes, and sends every call still waiting again
//! (marked `resent`); the worker runs each call once and answers it once more if its
//! reply was lost on the way. Such calls wait, and fail only when the worker is
//! declared gone ([`WorkerConn::abandon`]: supervision when its agent reports its exit
//! or its host lost, the agent for the calls it relays when the worker exits). CLIENT-2: one
//! connection per (address, token) per process, so actor meshes unpickled many times
//! share it. CLIENT-3: a lost connection is never used for a new command:
//! [`WorkerConn::current`] opens the next one to the same worker.
//!
//! A connection is TLS when this process knows the mesh's CA (TLS-2, `tls.rs`); the
//! choice is made once, when it opens, so calls cost the same as before.

use super::auth::TokenAttach;
use super::batch::Batched;
use super::resume::{self, CALLER_HEADER, INCARNATION_HEADER, KNEW_HEADER};
use super::slot::{Outcome, Slot};
use super::{RpcError, MAX_MESSAGE_BYTES};
use crate::proto::v1::worker_client::WorkerClient;
use crate::proto::v1::{
    Call, Calls, CancelRequest, Delivery, PingRequest, Received, Reply, ReplyKind,
    SpawnActorRequest, StatsReply, StatsRequest, StopActorRequest,
};
use crate::sync::lock;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

type Client = WorkerClient<InterceptedService<Channel, TokenAttach>>;

/// Calls waiting for replies, and whether the connection is gone (CLIENT-1).
#[derive(Default)]
struct Pending {
    /// Each call with the message it went as, to send again on a resumed stream.
    calls: HashMap<u64, (Arc<Slot>, Call)>,
    /// Calls fanned out by a relay (a host agent): one slot per worker, by proc.
    fanned: HashMap<u64, (HashMap<u32, Arc<Slot>>, Call)>,
    lost: Option<RpcError>,
    /// Replies received since the last message went out: the next one says so, and
    /// the worker forgets them (RESUME-1).
    received: Vec<Received>,
}

impl Pending {
    /// The slot a reply completes (a fanned-out call's by the proc it names).
    fn take(&mut self, call_id: u64, proc: Option<u32>) -> Option<Arc<Slot>> {
        self.received.push(Received { call_id, proc });
        let Some(proc) = proc else {
            return self.calls.remove(&call_id).map(|(slot, _)| slot);
        };
        let (slots, _) = self.fanned.get_mut(&call_id)?;
        let slot = slots.remove(&proc);
        if slots.is_empty() {
            self.fanned.remove(&call_id);
        }
        slot
    }

    /// Every call still waiting, in the order sent, marked as sent again (RESUME-1).
    fn to_resend(&self) -> Vec<Call> {
        let mut msgs: Vec<Call> = self
            .calls
            .values()
            .map(|(_, m)| m)
            .chain(self.fanned.values().map(|(_, m)| m))
            .cloned()
            .collect();
        msgs.sort_by_key(|m| m.call_id);
        for m in &mut msgs {
            m.resent = true;
        }
        msgs
    }
}

/// A connection to one worker.
pub struct WorkerConn {
    addr: String,
    token: String,
    client: Client,
    /// Outgoing calls, written to the `Messages` stream by the runtime.
    tx: mpsc::UnboundedSender<Call>,
    /// Shared with the task that reads replies.
    pending: Arc<Mutex<Pending>>,
    /// The epoch this process's commands carry (fencing, see worker.proto); 0 until
    /// this process attaches as the mesh's controller. Shared by every connection
    /// with the same token, reopened ones included ([`epoch_cell`]).
    epoch: Arc<AtomicU64>,
    /// The mesh CA it checks the worker against (TLS-2); None: plaintext.
    ca: Option<Arc<str>>,
    /// Set once the worker has answered on it: a failure before that, on a
    /// plaintext connection, may be a TLS server's refusal ([`error_of`]).
    answered: Arc<AtomicBool>,
    /// Wakes the connection task when the calls are abandoned ([`WorkerConn::abandon`]).
    abandoned: Arc<Notify>,
}

/// [`RpcError::from_status`] for a connection: a plaintext one that fails before the
/// worker ever answered on it is checked for a TLS server behind it, so that lacking
/// the mesh's CA is told as such and not as a lost worker (TLS-2).
async fn error_of(addr: &str, s: &tonic::Status, plaintext_unanswered: bool) -> RpcError {
    use std::error::Error;
    let err = RpcError::from_status(addr, s);
    // A status the transport made (it has a cause), not one the worker sent.
    if plaintext_unanswered
        && s.source().is_some()
        && super::tls::speaks_tls(addr, super::tls::PROBE_TIMEOUT).await
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

/// The epoch cell of the mesh with `token` in this process (FENCE-3: one per mesh, so
/// a connection reopened after a loss, or to a restarted worker, carries it too).
pub fn epoch_cell(token: &str) -> Arc<AtomicU64> {
    static CELLS: OnceLock<Mutex<HashMap<String, Arc<AtomicU64>>>> = OnceLock::new();
    let cells = CELLS.get_or_init(Default::default);
    let mut map = lock(cells);
    map.entry(token.to_string())
        .or_insert_with(|| Arc::new(AtomicU64::new(0)))
        .clone()
}

/// Call messages this process has sent (a fanned-out call is one): `calls_sent()`.
pub static CALLS_SENT: AtomicU64 = AtomicU64::new(0);

/// Call ids: unique within this process, and from a random start, so that the ids
/// of two callers (controllers, or workers calling through one relay) do not meet
/// (RESUME-1 tells calls apart by caller and id; a pid would repeat across hosts).
fn next_call_id() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(resume::random_id() >> 1))
        .fetch_add(1, Ordering::Relaxed)
}

/// Fails every pending call with the *first* cause of the loss (a later failure,
/// such as the send that finds the connection task gone, is a consequence of it).
fn fail_all(pending: &Mutex<Pending>, err: RpcError) {
    let (calls, fanned, cause) = {
        let mut p = lock(pending);
        let cause = p.lost.get_or_insert(err).clone();
        (
            std::mem::take(&mut p.calls),
            std::mem::take(&mut p.fanned),
            cause,
        )
    };
    let fanned = fanned.into_values().flat_map(|(m, _)| m.into_values());
    for slot in calls.into_values().map(|(s, _)| s).chain(fanned) {
        slot.complete(Err(cause.clone()));
    }
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
fn never_connected(s: &tonic::Status) -> bool {
    has_cause(s, |e| e.downcast_ref::<tonic::ConnectError>().is_some())
}

/// What a failed RPC of a connection means: its error, and whether it is a loss
/// (CLIENT-1) rather than a break that resuming mends (RESUME-1). `answered`: whether
/// the worker ever answered on it ([`error_of`]).
async fn failure(
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

/// RESUME-5: how long a connection tries to resume a broken stream before its calls
/// fail as lost, in milliseconds; 0: for as long as it takes (the default: a
/// controller's supervision abandons what it declares lost). Workers set one.
static RESUME_LIMIT_MS: AtomicU64 = AtomicU64::new(0);

/// Sets [`RESUME_LIMIT_MS`] for this process's connections (`None`: no limit).
pub fn set_resume_limit(limit: Option<Duration>) {
    let ms = limit.map_or(0, |d| (d.as_millis() as u64).max(1));
    RESUME_LIMIT_MS.store(ms, Ordering::Relaxed);
}

/// How long to wait before opening the stream again after `attempt` failed tries: the
/// first at once (a dead worker's refusal is then known without delay).
fn backoff(attempt: u32) -> Duration {
    match attempt {
        0 => Duration::ZERO,
        n => Duration::from_millis((50u64 << n.min(5)).min(1000)),
    }
}

/// What the connection task needs to run and resume the `Messages` stream.
struct Link {
    addr: String,
    client: Client,
    pending: Arc<Mutex<Pending>>,
    answered: Arc<AtomicBool>,
    plaintext: bool,
    prefetch: bool,
    token: Arc<str>,
    /// This connection's caller id (RESUME-1).
    caller: u64,
    abandoned: Arc<Notify>,
}

/// What the connection task keeps from one stream to the next.
#[derive(Default)]
struct StreamState {
    /// Streams opened so far: from the second on, each resumes (RESUME-1).
    streams: u32,
    /// The worker's incarnation, from the first stream that answered (RESUME-2).
    incarnation: Option<String>,
    /// Calls sent again on this stream while still on their way to `rx`: when they
    /// come out of it, they are not sent a second time.
    resent: HashSet<u64>,
    /// Whether this stream's worker answered (a resume after it starts at once).
    answered_now: bool,
    /// Whether calls may have reached a server that never said who it is (a stream
    /// that broke after connecting, before its answer's headers).
    maybe_delivered: bool,
}

/// How one stream ended.
enum Ended {
    /// Open it again (RESUME-1).
    Broken,
    /// The connection is lost (CLIENT-1), or nobody holds it any more.
    Done,
}

impl Link {
    /// Runs the `Messages` stream, opening it again after every break, until the
    /// connection is lost or dropped.
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Call>) {
        let mut s = StreamState::default();
        let mut attempt = 0u32;
        let mut broken_since: Option<std::time::Instant> = None;
        loop {
            if lock(&self.pending).lost.is_some() || rx.is_closed() {
                return; // (closed: nobody holds the connection, nobody waits on it)
            }
            match self.stream(&mut rx, &mut s).await {
                Ended::Done => return,
                Ended::Broken => {}
            }
            if s.answered_now {
                attempt = 0; // it was up: the next try goes at once
                broken_since = None;
            }
            let since = *broken_since.get_or_insert_with(std::time::Instant::now);
            let limit = RESUME_LIMIT_MS.load(Ordering::Relaxed);
            if limit > 0 && since.elapsed() >= Duration::from_millis(limit) {
                let reason = format!(
                    "it could not be reached for {:.0} s (RESUME-5); the calls may have run there",
                    since.elapsed().as_secs_f64()
                );
                let addr = self.addr.clone();
                fail_all(&self.pending, RpcError::ConnectionLost { addr, reason });
                return;
            }
            s.streams += 1;
            let wait = backoff(attempt);
            attempt += 1;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.abandoned.notified() => return,
            }
        }
    }

    /// One `Messages` stream: opened (with the calls still waiting sent again when it
    /// resumes an earlier one), then replies read until it ends.
    async fn stream(&self, rx: &mut mpsc::UnboundedReceiver<Call>, st: &mut StreamState) -> Ended {
        let resuming = st.streams > 0;
        st.answered_now = false;
        let (gtx, grx) = mpsc::unbounded_channel::<Call>();
        let p = self.pending.clone();
        // A resumed stream's first message says what the caller still waits for.
        let mut resync = resuming;
        let out = Batched::new(grx, move |calls| {
            let mut p = lock(&p);
            let waiting = if std::mem::take(&mut resync) {
                Some(p.calls.keys().chain(p.fanned.keys()).copied().collect())
            } else {
                None
            };
            Calls {
                calls,
                received: std::mem::take(&mut p.received),
                resync: waiting.is_some(),
                waiting: waiting.unwrap_or_default(),
            }
        });
        let mut req = tonic::Request::new(out);
        if let Ok(v) = format!("{:x}", self.caller).parse() {
            req.metadata_mut().insert(CALLER_HEADER, v);
        }
        let mut c = self.client.clone();
        let opening = c.messages(req);
        tokio::pin!(opening);
        // A first stream sends calls as they come, with its opening; a resumed one only
        // once the worker is known to be the same process (RESUME-2).
        let resp = loop {
            tokio::select! {
                r = &mut opening => break r,
                m = rx.recv(), if !resuming => match m {
                    Some(call) => { let _ = gtx.send(call); }
                    None => return Ended::Done,
                },
                _ = self.abandoned.notified() => return Ended::Done,
            }
        };
        let mut inbound = match resp {
            Ok(r) => {
                self.answered.store(true, Ordering::Relaxed);
                st.answered_now = true;
                let theirs = r
                    .metadata()
                    .get(INCARNATION_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let knew = r.metadata().get(KNEW_HEADER).is_some();
                let other = match (st.incarnation.as_deref(), theirs.as_deref()) {
                    (Some(was), Some(now)) => was != now,
                    // The earlier streams never said who they reached: where they
                    // may have reached one, only a server that knows this caller is it.
                    (None, _) => st.maybe_delivered && !knew,
                    (Some(_), None) => false,
                };
                if other {
                    let reason = if st.incarnation.is_some() {
                        "the worker there now is another process: the one these calls went \
                         to is gone"
                    } else {
                        "the worker there now does not know this connection: it is another \
                         process than the one these calls may have reached, so they are not \
                         sent again"
                    };
                    let err = RpcError::ConnectionLost {
                        addr: self.addr.clone(),
                        reason: reason.into(),
                    };
                    fail_all(&self.pending, err);
                    return Ended::Done;
                }
                st.incarnation = theirs.or(st.incarnation.take());
                r.into_inner()
            }
            Err(s) => {
                st.maybe_delivered |= !never_connected(&s);
                return self.broke(&s).await;
            }
        };
        if resuming {
            // What an earlier stream carried goes again, in the order sent, then what
            // none has yet; a call still on its way to `rx` was taken with the first
            // and is not sent twice (ORDER-1 holds: broadcasts come only from `rx`).
            let mut queued = Vec::new();
            while let Ok(c) = rx.try_recv() {
                queued.push(c);
            }
            let not_yet: HashSet<u64> = queued.iter().map(|c| c.call_id).collect();
            st.resent.clear();
            for m in lock(&self.pending).to_resend() {
                if !not_yet.contains(&m.call_id) {
                    st.resent.insert(m.call_id);
                    let _ = gtx.send(m);
                }
            }
            for c in queued {
                let _ = gtx.send(c);
            }
        }
        loop {
            tokio::select! {
                m = rx.recv() => match m {
                    Some(call) => {
                        if st.resent.is_empty() || !st.resent.remove(&call.call_id) {
                            let _ = gtx.send(call);
                        }
                    }
                    None => return Ended::Done,
                },
                r = inbound.message() => match r {
                    Ok(Some(batch)) => self.replies(batch.replies),
                    Ok(None) => {
                        let reason = "the worker closed the stream".to_string();
                        let err = RpcError::ConnectionLost {
                            addr: self.addr.clone(),
                            reason,
                        };
                        fail_all(&self.pending, err);
                        return Ended::Done;
                    }
                    Err(s) => return self.broke(&s).await,
                },
                _ = self.abandoned.notified() => return Ended::Done,
            }
        }
    }

    /// A stream failed with `s`: a loss fails every call (CLIENT-1), a break resumes.
    async fn broke(&self, s: &tonic::Status) -> Ended {
        let (err, loss) = failure(&self.addr, s, self.plaintext, &self.answered).await;
        if loss {
            fail_all(&self.pending, err);
            return Ended::Done;
        }
        Ended::Broken
    }

    /// Completes the slots of a batch of replies.
    fn replies(&self, replies: Vec<Reply>) {
        for reply in replies {
            let slot = lock(&self.pending).take(reply.call_id, reply.proc);
            let Some(slot) = slot else { continue };
            if reply.kind == ReplyKind::Lost as i32 {
                // (fan-out) the relay lost the worker, as a direct call would have; or
                // the worker forgot a resent call (RESUME-2).
                let addr = match reply.proc {
                    Some(proc) => format!("proc {proc} (through {})", self.addr),
                    None => self.addr.clone(),
                };
                slot.complete(Err(RpcError::ConnectionLost {
                    addr,
                    reason: String::from_utf8_lossy(&reply.payload).into_owned(),
                }));
                continue;
            }
            if !self.prefetch || !reply.payload.starts_with(crate::transfer::HEADER) {
                slot.complete(Ok(reply));
                continue;
            }
            // XFER-2: the reply's buffers now, not when it is unpickled.
            let t = self.token.clone();
            tokio::task::spawn_blocking(move || {
                crate::transfer::prefetch(&reply.payload, &reply.buffers, t.as_bytes());
                let (payload, buffers) = (reply.payload.clone(), reply.buffers.clone());
                slot.complete(Ok(reply));
                if Arc::strong_count(&slot) == 1 {
                    // Nobody holds the call any more: nobody will unpickle it.
                    crate::transfer::discard_message(&payload, &buffers);
                }
            });
        }
    }
}

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
            let same_ca = match (&c.ca, super::tls::mesh_ca(token)) {
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
        let ca = super::tls::mesh_ca(token);
        let scheme = if ca.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| RpcError::Address(format!("{addr}: {e}")))?;
        if let Some(ca) = &ca {
            super::tls::install_provider();
            endpoint = endpoint
                .tls_config(super::tls::client_config(ca))
                .map_err(|e| RpcError::TlsConfig(format!("the mesh's CA cannot be used: {e}")))?;
        }
        let endpoint = endpoint
            .tcp_nodelay(true)
            .initial_stream_window_size(super::STREAM_WINDOW)
            .initial_connection_window_size(super::CONNECTION_WINDOW)
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

    /// This connection unless it is lost (a broken one resumes: RESUME-1), else this
    /// process's next one to the same worker (CLIENT-3); commands already sent on a
    /// lost one have failed (CLIENT-1).
    pub fn current(self: &Arc<Self>, rt: &Handle) -> Result<Arc<WorkerConn>, RpcError> {
        if self.lost().is_none() {
            return Ok(self.clone());
        }
        Self::get(rt, &self.addr, &self.token)
    }

    /// The epoch commands carry.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether it talks TLS (TLS-2).
    pub fn is_tls(&self) -> bool {
        self.ca.is_some()
    }

    /// The worker's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether a failure now is to be checked for a TLS server ([`error_of`]).
    fn plaintext_unanswered(&self) -> bool {
        self.ca.is_none() && !self.answered.load(Ordering::Relaxed)
    }

    /// Why the connection is gone, if it is.
    pub fn lost(&self) -> Option<RpcError> {
        lock(&self.pending).lost.clone()
    }

    /// Fails every call waiting on this connection with `err` and stops resuming it
    /// (CLIENT-1): the worker is declared gone (its host lost, its job ended) while
    /// it cannot be reached to tell.
    pub fn abandon(&self, err: RpcError) {
        fail_all(&self.pending, err);
        self.abandoned.notify_one();
    }

    /// Sends an endpoint call. Returns the call id and, unless `oneway`, the slot
    /// its reply completes.
    pub fn call(&self, target: &Target<'_>, rank: u32) -> (u64, Option<Arc<Slot>>) {
        let call_id = next_call_id();
        let msg = self.message(target, call_id, rank, Vec::new());
        if let Err(err) = Self::fits(&msg) {
            return (call_id, (!msg.oneway).then(|| Slot::done_with(Err(err))));
        }
        (call_id, self.forward(msg))
    }

    /// Sends one endpoint call to a relay (a host agent) that delivers it to the
    /// workers `deliveries` (proc rank, index within the called mesh) of its host.
    /// Returns the call id and, unless `oneway`, one slot per delivery, in order.
    pub fn call_fanned(
        &self,
        target: &Target<'_>,
        deliveries: &[(u32, u32)],
    ) -> (u64, Vec<Arc<Slot>>) {
        let call_id = next_call_id();
        let fan_out = deliveries
            .iter()
            .map(|&(proc, rank)| Delivery { proc, rank })
            .collect();
        let msg = self.message(target, call_id, 0, fan_out);
        let oneway = msg.oneway;
        let done = |err: RpcError| {
            let slots = if oneway {
                Vec::new()
            } else {
                deliveries
                    .iter()
                    .map(|_| Slot::done_with(Err(err.clone())))
                    .collect()
            };
            (call_id, slots)
        };
        if let Err(err) = Self::fits(&msg) {
            return done(err);
        }
        let slots: Vec<Arc<Slot>> = if oneway {
            Vec::new()
        } else {
            deliveries.iter().map(|_| Slot::new()).collect()
        };
        if !oneway {
            let mut p = lock(&self.pending);
            if let Some(err) = p.lost.clone() {
                drop(p);
                return done(err);
            }
            let by_proc = deliveries
                .iter()
                .map(|d| d.0)
                .zip(slots.iter().cloned())
                .collect();
            p.fanned.insert(call_id, (by_proc, msg.clone()));
        }
        self.send(msg);
        (call_id, slots)
    }

    /// Sends `msg` as it is (its id, epoch and origin kept: also a relay's delivery
    /// to one worker). The slot its reply completes, unless `oneway`.
    pub fn forward(&self, msg: Call) -> Option<Arc<Slot>> {
        let slot = if msg.oneway {
            None
        } else {
            let slot = Slot::new();
            let mut p = lock(&self.pending);
            if let Some(err) = &p.lost {
                return Some(Slot::done_with(Err(err.clone())));
            }
            p.calls.insert(msg.call_id, (slot.clone(), msg.clone()));
            Some(slot)
        };
        self.send(msg);
        slot
    }

    fn message(
        &self,
        target: &Target<'_>,
        call_id: u64,
        rank: u32,
        fan_out: Vec<Delivery>,
    ) -> Call {
        let Target {
            actor,
            method,
            payload,
            buffers,
            oneway,
            dims,
            sizes,
            origin,
        } = *target;
        Call {
            call_id,
            actor: actor.to_string(),
            method: method.to_string(),
            payload: payload.clone(),
            buffers: buffers.to_vec(),
            oneway,
            rank,
            dims: dims.to_vec(),
            sizes: sizes.to_vec(),
            epoch: self.epoch(),
            origin: origin.to_string(),
            fan_out,
            resent: false,
        }
    }

    fn fits(msg: &Call) -> Result<(), RpcError> {
        let size = msg.payload.len() + msg.buffers.iter().map(Bytes::len).sum::<usize>();
        if size > MAX_MESSAGE_BYTES {
            return Err(RpcError::TooLarge {
                size,
                limit: MAX_MESSAGE_BYTES,
            });
        }
        Ok(())
    }

    fn send(&self, msg: Call) {
        CALLS_SENT.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(msg).is_err() {
            // The task that owned the stream has ended, and records why (the first
            // cause: a refused token, the peer gone) just after it drops the stream:
            // give it a moment, so the call fails with that cause.
            let deadline = std::time::Instant::now() + Duration::from_millis(200);
            while lock(&self.pending).lost.is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let err = RpcError::ConnectionLost {
                addr: self.addr.clone(),
                reason: "the connection task ended".into(),
            };
            fail_all(&self.pending, err);
        }
    }

    /// Runs a unary RPC on the runtime and completes a slot with its reply. A break
    /// that is not a loss (CLIENT-1) sends it again, with backoff, for as long as it
    /// takes: `f` makes each copy, with the same request id, which the worker runs
    /// once (RESUME-4); a loss, or the calls' abandon, fails it.
    fn unary<F, Fut>(&self, rt: &Handle, f: F) -> Arc<Slot>
    where
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<tonic::Response<Reply>, tonic::Status>> + Send,
    {
        let slot = Slot::new();
        let (s2, client, addr) = (slot.clone(), self.client.clone(), self.addr.clone());
        let (answered, plaintext) = (self.answered.clone(), self.ca.is_none());
        let (pending, abandoned) = (self.pending.clone(), self.abandoned.clone());
        rt.spawn(async move {
            let mut attempt = 0;
            let outcome: Outcome = loop {
                let err = match f(client.clone()).await {
                    Ok(r) => {
                        answered.store(true, Ordering::Relaxed);
                        break Ok(r.into_inner());
                    }
                    Err(s) => match failure(&addr, &s, plaintext, &answered).await {
                        (err, true) => break Err(err),
                        (err, false) => err,
                    },
                };
                if let Some(lost) = lock(&pending).lost.clone() {
                    break Err(lost);
                }
                let wait = backoff(attempt).max(Duration::from_millis(50));
                attempt += 1;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = abandoned.notified() => {
                        abandoned.notify_one(); // (for the connection task too)
                        break Err(lock(&pending).lost.clone().unwrap_or(err));
                    }
                }
            };
            s2.complete(outcome);
        });
        slot
    }

    /// Creates (or replaces) actor `name` from a pickled (class, args, kwargs).
    pub fn spawn_actor(
        &self,
        rt: &Handle,
        name: &str,
        payload: Bytes,
        buffers: Vec<Bytes>,
        origin: &str,
    ) -> Arc<Slot> {
        let req = SpawnActorRequest {
            name: name.to_string(),
            payload,
            buffers,
            epoch: self.epoch(),
            origin: origin.to_string(),
            request_id: resume::random_id(),
        };
        self.unary(rt, move |mut c| {
            let req = req.clone();
            async move { c.spawn_actor(req).await }
        })
    }

    /// Stops actor `name`.
    pub fn stop_actor(&self, rt: &Handle, name: &str) -> Arc<Slot> {
        let req = StopActorRequest {
            name: name.to_string(),
            epoch: self.epoch(),
            request_id: resume::random_id(),
        };
        self.unary(rt, move |mut c| {
            let req = req.clone();
            async move { c.stop_actor(req).await }
        })
    }

    /// Asks the worker to cancel `call_id` (fire and forget); through a relay, only
    /// its delivery to `proc`.
    pub fn cancel(&self, rt: &Handle, call_id: u64, proc: Option<u32>) {
        self.cancel_as(rt, call_id, self.epoch(), proc);
    }

    /// [`WorkerConn::cancel`] carrying another caller's `epoch` (a relay's).
    pub fn cancel_as(&self, rt: &Handle, call_id: u64, epoch: u64, proc: Option<u32>) {
        let mut c = self.client.clone();
        rt.spawn(async move {
            let _ = c
                .cancel(CancelRequest {
                    call_id,
                    epoch,
                    proc,
                })
                .await;
        });
    }

    /// Round trip through the worker's runtime (not its Python); carries this
    /// process's epoch, so a controller that has just attached fences older ones.
    /// Returns the worker's pid and the highest epoch it has seen.
    pub async fn ping(&self) -> Result<(u32, u64), RpcError> {
        let mut c = self.client.clone();
        let epoch = self.epoch();
        match c.ping(PingRequest { nonce: 1, epoch }).await {
            Ok(r) => {
                self.answered.store(true, Ordering::Relaxed);
                let r = r.into_inner();
                Ok((r.pid, r.epoch))
            }
            Err(s) => Err(error_of(&self.addr, &s, self.plaintext_unanswered()).await),
        }
    }

    /// The worker's counters.
    pub async fn stats(&self) -> Result<StatsReply, RpcError> {
        let mut c = self.client.clone();
        match c.stats(StatsRequest {}).await {
            Ok(r) => {
                self.answered.store(true, Ordering::Relaxed);
                Ok(r.into_inner())
            }
            Err(s) => Err(error_of(&self.addr, &s, self.plaintext_unanswered()).await),
        }
    }
}

/// What one endpoint call sends, the same for every rank it goes to.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// Actor name.
    pub actor: &'a str,
    /// Endpoint name.
    pub method: &'a str,
    /// Pickled arguments.
    pub payload: &'a Bytes,
    /// Out-of-band buffers.
    pub buffers: &'a [Bytes],
    /// No reply (broadcast).
    pub oneway: bool,
    /// Dims of the called mesh.
    pub dims: &'a [String],
    /// Sizes of the called mesh.
    pub sizes: &'a [u32],
    /// Where the call comes from (output routing; may be empty).
    pub origin: &'a str,
}

/// A reply's kind, from its wire value.
pub fn reply_kind(r: &Reply) -> ReplyKind {
    ReplyKind::try_from(r.kind).unwrap_or(ReplyKind::Unspecified)
}
