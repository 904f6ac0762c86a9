//! The connection task: runs a connection's one `Messages` stream, opens it again after
//! every break and resends what still waits (RESUME-1, RESUME-2, RESUME-5), and
//! completes the slots of the replies it reads.

use super::failure::{backoff, failure, never_connected};
use super::pending::{fail_all, Pending};
use super::service::Client;
use crate::proto::v1::{Call, Calls, Reply, ReplyKind};
use crate::rpc::batch::Batched;
use crate::rpc::resume::{CALLER_HEADER, INCARNATION_HEADER, KNEW_HEADER, STREAM_HEADER};
use crate::rpc::slot::Slot;
use crate::rpc::RpcError;
use crate::sync::lock;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// RESUME-5: how long a connection tries to resume a broken stream before its calls
/// fail as lost, in milliseconds; 0: for as long as it takes (the default: a
/// controller's supervision abandons what it declares lost). Workers set one.
static RESUME_LIMIT_MS: AtomicU64 = AtomicU64::new(0);

/// Sets [`RESUME_LIMIT_MS`] for this process's connections (`None`: no limit).
pub fn set_resume_limit(limit: Option<Duration>) {
    let ms = limit.map_or(0, |d| (d.as_millis() as u64).max(1));
    RESUME_LIMIT_MS.store(ms, Ordering::Relaxed);
}

/// What the connection task needs to run and resume the `Messages` stream.
pub(super) struct Link {
    pub(super) addr: String,
    pub(super) client: Client,
    pub(super) pending: Arc<Mutex<Pending>>,
    pub(super) answered: Arc<AtomicBool>,
    pub(super) plaintext: bool,
    pub(super) prefetch: bool,
    pub(super) token: Arc<str>,
    /// This connection's caller id (RESUME-1).
    pub(super) caller: u64,
    pub(super) abandoned: Arc<Notify>,
    /// LINK-1: the stream opens with the first call, not with the connection.
    pub(super) lazy: bool,
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
    /// The call that opened a lazy connection (LINK-1), sent first on its first stream.
    first: Option<Call>,
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
    pub(super) async fn run(self, mut rx: mpsc::UnboundedReceiver<Call>) {
        let mut s = StreamState::default();
        if self.lazy {
            // LINK-1: nothing is opened (no TCP, TLS or stream) until a call goes on
            // this connection: a controller names every worker of a mesh, but its calls
            // to 1,024 procs on 64 hosts go through their hosts' relays (RELAY-1).
            let first = tokio::select! {
                m = rx.recv() => m,
                _ = self.abandoned.notified() => None,
            };
            let Some(first) = first else { return };
            s.first = Some(first);
        }
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
        // A resumed stream's first message says what the caller still waits for: every
        // call it sends again, listed when they are taken to be sent (below), not when
        // the message is made. A reply that comes in between (the server, woken, may
        // answer a call on this stream at once) must not take its call off the list:
        // the server would forget the call, then run the copy sent again (RESUME-1).
        let waiting: Arc<Mutex<Option<Vec<u64>>>> = Arc::default();
        let first_waiting = waiting.clone();
        let out = Batched::new(grx, move |calls| {
            let waiting = lock(&first_waiting).take();
            Calls {
                calls,
                received: std::mem::take(&mut lock(&p).received),
                resync: waiting.is_some(),
                waiting: waiting.unwrap_or_default(),
                ping: None,
            }
        });
        let mut req = tonic::Request::new(out);
        if let Ok(v) = format!("{:x}", self.caller).parse() {
            req.metadata_mut().insert(CALLER_HEADER, v);
        }
        if let Ok(v) = format!("{:x}", st.streams).parse() {
            req.metadata_mut().insert(STREAM_HEADER, v);
        }
        let mut c = self.client.clone();
        // Whether calls went out on this stream before its answer.
        let mut sent = false;
        if let Some(call) = st.first.take() {
            let _ = gtx.send(call);
            sent = true;
        }
        let opening = c.messages(req);
        tokio::pin!(opening);
        // A lazy connection's first stream sends calls as they come, with its opening
        // (LINK-1: a worker's first call waits for nothing); a stream opened with its
        // connection (a relay's) or a resumed one only once the server has answered,
        // so that one that breaks first carried nothing: its calls go on the next one,
        // whatever process answers it (RESUME-2 decides only for calls that went out).
        let resp = loop {
            tokio::select! {
                r = &mut opening => break r,
                m = rx.recv(), if !resuming && self.lazy => match m {
                    Some(call) => {
                        let _ = gtx.send(call);
                        sent = true;
                    }
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
                st.maybe_delivered |= sent && !never_connected(&s);
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
            let resend = lock(&self.pending).to_resend();
            // (before anything goes to `gtx`: the first message carries the list)
            *lock(&waiting) = Some(resend.iter().map(|m| m.call_id).collect());
            for m in resend {
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
        super::calls::REPLY_BATCHES.fetch_add(1, Ordering::Relaxed);
        super::calls::REPLIES.fetch_add(replies.len() as u64, Ordering::Relaxed);
        // (the table locked once per batch: a relay's batch has a host's replies)
        let slots: Vec<Option<Arc<Slot>>> = {
            let mut pending = lock(&self.pending);
            replies
                .iter()
                .map(|r| pending.take(r.call_id, r.proc))
                .collect()
        };
        for (reply, slot) in replies.into_iter().zip(slots) {
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
