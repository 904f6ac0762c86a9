//! The `Worker` gRPC service: receives spawns, stops, calls, port messages (a `Call`
//! with its `port` set: [`Kind::Port`]) and cancels, and queues them in an [`Inbox`]
//! (`inbox.rs`) for the process's Python dispatcher, which answers through
//! [`Inbox::reply`].

use super::inbox::{Inbox, Incoming, Kind};

use super::auth::TokenCheck;
use super::batch::Batched;
use super::inbox::Sink;
use super::pipe;
use super::resume::{self, Admit, Begin};
use super::tls::ServerIdentity;
use super::{RpcError, MAX_MESSAGE_BYTES};
use crate::proto::v1::worker_server::{Worker, WorkerServer};
use crate::proto::v1::{Call, Replies};
use crate::proto::v1::{
    Calls, CancelReply, CancelRequest, PingReply, PingRequest, Reply, ReplyKind, SpawnActorRequest,
    StatsReply, StatsRequest, StopActorRequest,
};
use bytes::Bytes;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

struct Service {
    inbox: Arc<Inbox>,
    auth: TokenCheck,
    /// The mesh token: buffers of arriving calls are pulled with it (XFER-2).
    token: Arc<str>,
}

pub(crate) fn fenced(call_id: u64, message: String) -> Reply {
    Reply {
        call_id,
        kind: ReplyKind::Fenced as i32,
        payload: Bytes::from(message),
        buffers: Vec::new(),
        proc: None,
    }
}

impl Service {
    /// A spawn or a stop; one with a request id runs once however often it comes
    /// (RESUME-4): the run goes on, and is remembered, whether or not its caller waits.
    async fn unary(
        &self,
        epoch: u64,
        request_id: u64,
        item: Incoming,
    ) -> Result<Response<Reply>, Status> {
        let stopped = || Status::unavailable("the worker's dispatcher stopped");
        let run = if request_id == 0 {
            None
        } else {
            match self.inbox.requests.begin(request_id) {
                Begin::Wait(rx) => {
                    return resume::reply_of(rx)
                        .await
                        .map(Response::new)
                        .ok_or_else(stopped)
                }
                Begin::Run(done) => Some(done),
            }
        };
        if let Err(m) = self.inbox.admit(epoch) {
            let reply = fenced(0, m);
            if let Some(done) = run {
                let _ = done.send(Some(reply.clone()));
            }
            return Ok(Response::new(reply));
        }
        let (tx, rx) = oneshot::channel();
        self.inbox.push(item, Some(Sink::Unary(tx)));
        let Some(done) = run else {
            return rx.await.map(Response::new).map_err(|_| stopped());
        };
        let waiting = done.subscribe();
        tokio::spawn(async move {
            if let Ok(reply) = rx.await {
                let _ = done.send(Some(reply));
            }
        });
        resume::reply_of(waiting)
            .await
            .map(Response::new)
            .ok_or_else(stopped)
    }
}

fn item(kind: Kind, call_id: u64, actor: String) -> Incoming {
    Incoming {
        token: 0,
        kind,
        call_id,
        actor,
        method: String::new(),
        payload: Bytes::new(),
        buffers: Vec::new(),
        rank: 0,
        dims: Vec::new(),
        sizes: Vec::new(),
        origin: String::new(),
        port: None,
    }
}

/// Queues an admitted call `c` for the dispatcher, its reply to `sink`: first, if it
/// carries buffers by reference, pulls them, in arrival order (XFER-2).
async fn queue_call(inbox: &Inbox, token: &Arc<str>, c: Call, sink: Option<Sink>) {
    if c.payload.starts_with(crate::transfer::HEADER) {
        let (p, b, t) = (c.payload.clone(), c.buffers.clone(), token.clone());
        let _ =
            tokio::task::spawn_blocking(move || crate::transfer::prefetch(&p, &b, t.as_bytes()))
                .await;
    }
    inbox.push(Incoming::of(c), sink);
}

/// PIPE-1: serves the pipes of the agent of this host on the abstract socket named
/// after `addr` (none if that name is taken or the socket cannot be made: the agent
/// then keeps gRPC). Each pipe: the token first, then calls, queued as the `Messages`
/// stream's are; replies go back on it from the thread that makes them.
fn serve_pipes(
    rt: &tokio::runtime::Handle,
    inbox: &Arc<Inbox>,
    auth: &TokenCheck,
    addr: &str,
    token: &Arc<str>,
) {
    use std::os::linux::net::SocketAddrExt;
    let Ok(name) = std::os::unix::net::SocketAddr::from_abstract_name(pipe::name_of(addr)) else {
        return;
    };
    let listener = match std::os::unix::net::UnixListener::bind_addr(&name) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("monarch worker: relayed calls stay on gRPC: no pipe at {addr}: {e}");
            return;
        }
    };
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let _guard = rt.enter();
    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
        return;
    };
    let (inbox, auth, token) = (inbox.clone(), auth.clone(), token.clone());
    rt.spawn(async move {
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                _ = inbox.stopped() => return,
            };
            let Ok((stream, _)) = conn else { continue };
            if !pipe::same_user(std::os::fd::AsRawFd::as_raw_fd(&stream)) {
                continue; // (another user's process: closed unread)
            }
            let Ok(stream) = stream.into_std() else {
                continue;
            };
            super::pipe_in::serve(stream, inbox.clone(), auth.clone(), token.clone());
        }
    });
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<Replies, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for Service {
    async fn spawn_actor(
        &self,
        req: Request<SpawnActorRequest>,
    ) -> Result<Response<Reply>, Status> {
        let r = req.into_inner();
        let mut it = item(Kind::Spawn, 0, r.name);
        it.payload = r.payload;
        it.buffers = r.buffers;
        it.origin = r.origin;
        self.unary(r.epoch, r.request_id, it).await
    }

    async fn stop_actor(&self, req: Request<StopActorRequest>) -> Result<Response<Reply>, Status> {
        let r = req.into_inner();
        self.unary(r.epoch, r.request_id, item(Kind::Stop, 0, r.name))
            .await
    }

    type MessagesStream = ReplyStream;

    async fn messages(
        &self,
        req: Request<Streaming<Calls>>,
    ) -> Result<Response<Self::MessagesStream>, Status> {
        // RESUME-1: a caller that names itself can resume; one that does not gets an
        // id of its own stream (never resumed).
        let caller = match resume::caller_of(&req) {
            0 => resume::random_id(),
            id => id,
        };
        let seq = resume::stream_of(&req);
        let mut calls = req.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let inbox = self.inbox.clone();
        let token = self.token.clone();
        let Some((stream, knew)) = inbox.callers.attach(caller, seq, tx.clone()) else {
            return Err(resume::superseded());
        };
        tokio::spawn(async move {
            loop {
                let batch = tokio::select! {
                    b = calls.next() => match b {
                        Some(Ok(b)) => b,
                        _ => break,
                    },
                    _ = inbox.stopped() => break,
                };
                inbox.callers.resync(caller, stream, &batch);
                for c in batch.calls {
                    inbox.received.fetch_add(1, Ordering::Relaxed);
                    if let Err(m) = inbox.admit(c.epoch) {
                        // A resent call admitted before the fence is answered as it ran.
                        let ran = c.resent && inbox.callers.known(caller, c.call_id, &[None]);
                        if !c.oneway && !ran {
                            let _ = tx.send(fenced(c.call_id, m));
                        }
                        continue;
                    }
                    if !c.oneway {
                        match inbox
                            .callers
                            .admit(caller, stream, c.call_id, &[None], c.resent)
                        {
                            Admit::Run => {}
                            Admit::Known | Admit::Stale => continue,
                            Admit::Forgotten => {
                                let _ = tx.send(resume::forgotten(c.call_id, None));
                                continue;
                            }
                        }
                    }
                    let sink = (!c.oneway).then_some(Sink::Stream(caller, c.call_id));
                    queue_call(&inbox, &token, c, sink).await;
                }
                // (after the calls: an acknowledgement never runs ahead of a call)
                inbox.callers.received(caller, &batch.received);
            }
            inbox.callers.detach(caller, stream);
        });
        let replies = Batched::new(rx, |replies| {
            Ok(Replies {
                replies,
                pong: None,
            })
        });
        Ok(self
            .inbox
            .callers
            .tag(Response::new(Box::pin(replies)), knew))
    }

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        let r = req.into_inner();
        if self.inbox.admit(r.epoch).is_err() {
            return Ok(Response::new(CancelReply { found: false }));
        }
        self.inbox
            .push(item(Kind::Cancel, r.call_id, String::new()), None);
        Ok(Response::new(CancelReply { found: true }))
    }

    async fn ping(&self, req: Request<PingRequest>) -> Result<Response<PingReply>, Status> {
        Ok(Response::new(self.inbox.pong(&req.into_inner())))
    }

    async fn stats(&self, _req: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        Ok(Response::new(StatsReply {
            pid: std::process::id(),
            calls_received: self.inbox.received.load(Ordering::Relaxed),
            calls_in_flight: self.inbox.in_flight() as u64,
            rejected_auth: self.auth.rejected(),
        }))
    }
}

/// A running `Worker` server.
pub struct WorkerHost {
    /// The queue the dispatcher drains.
    pub inbox: Arc<Inbox>,
    /// The bound address, `127.0.0.1:PORT`.
    pub addr: String,
    /// Whether it serves TLS (TLS-1).
    pub tls: bool,
}

impl WorkerHost {
    /// Serves on an already-bound listener (the host agent binds it and passes the
    /// descriptor to the worker, so it knows the address before the worker starts);
    /// with `tls`, TLS only, presenting that certificate (TLS-1).
    pub fn serve(
        rt: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
        token: &str,
        tls: Option<&ServerIdentity>,
    ) -> Result<Self, RpcError> {
        let mut builder = super::server_builder_with(tls, super::Keepalive::Relaxed)?;
        let auth = TokenCheck::new(token).map_err(|e| RpcError::Auth(e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| RpcError::Io(e.to_string()))?
            .to_string();
        listener
            .set_nonblocking(true)
            .map_err(|e| RpcError::Io(e.to_string()))?;
        let inbox = Inbox::new()?;
        let svc = WorkerServer::new(Service {
            inbox: inbox.clone(),
            auth: auth.clone(),
            token: Arc::from(token),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let token: Arc<str> = Arc::from(token);
        serve_pipes(rt, &inbox, &auth, &addr, &token);
        let svc = tonic::service::interceptor::InterceptedService::new(svc, auth);
        let stopping = inbox.clone();
        let _guard = rt.enter();
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(|e| RpcError::Io(e.to_string()))?;
        rt.spawn(async move {
            let incoming = super::incoming(listener);
            let _ = builder
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async move { stopping.stopped().await })
                .await;
        });
        Ok(WorkerHost {
            inbox,
            addr,
            tls: tls.is_some(),
        })
    }

    /// Binds `addr` (for example `127.0.0.1:0`) and serves there, in plaintext.
    pub fn bind(rt: &tokio::runtime::Handle, addr: &str, token: &str) -> Result<Self, RpcError> {
        Self::bind_with(rt, addr, token, None)
    }

    /// Binds `addr` and serves there, TLS with `tls` when given.
    pub fn bind_with(
        rt: &tokio::runtime::Handle,
        addr: &str,
        token: &str,
        tls: Option<&ServerIdentity>,
    ) -> Result<Self, RpcError> {
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| RpcError::Address(format!("{addr}: {e}")))?;
        Self::serve(rt, l, token, tls)
    }

    /// Stops serving: open streams end, pending calls' callers see the connection end.
    pub fn shutdown(&self) {
        self.inbox.close();
    }
}
