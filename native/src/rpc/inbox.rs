//! The inbox between the `Worker` service and the Python dispatcher: lanes of queued
//! spawns, stops, calls, port messages and cancels, an actor's calls routed to a lane of
//! its own, commands admitted by epoch (fencing), and the replies.
//!
//! INBOX-1: a lane's eventfd is readable whenever its queue is non-empty (but while its
//! own thread queues what it read from the pipe, and takes it next), so a dispatcher
//! thread waits on it (`take_wait`, with the GIL released) and never polls.
//! INBOX-2: each queued item that expects an answer holds a reply token; answering a
//! token whose caller has gone is not an error (the reply is dropped).

pub use super::lane::Lane;
use super::pipe_in::{self, PipeIn};
use super::resume::{Callers, Requests};
use super::RpcError;
use crate::proto::v1::{Call, CallCommand, PingReply, PingRequest, PortMessage, Reply, ReplyKind};
use crate::sync::{lock, unpoison};
use bytes::Bytes;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::{oneshot, watch};

/// What an inbox item asks the dispatcher to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Create or replace an actor.
    Spawn = 1,
    /// Stop an actor.
    Stop = 2,
    /// Run an endpoint.
    Call = 3,
    /// Cancel the call with `call_id`.
    Cancel = 4,
    /// A message for a port of this process (`Incoming::port` says which); never
    /// routed to an actor's lane.
    Port = 5,
}

/// One item for the dispatcher.
#[derive(Debug)]
pub struct Incoming {
    /// Reply token for [`Inbox::reply`]; 0 when no reply is expected.
    pub token: u64,
    /// What to do.
    pub kind: Kind,
    /// The caller's call id (calls and cancels).
    pub call_id: u64,
    /// Actor name.
    pub actor: String,
    /// Endpoint name (calls).
    pub method: String,
    /// Pickled arguments.
    pub payload: Bytes,
    /// Out-of-band pickle buffers.
    pub buffers: Vec<Bytes>,
    /// Index within the called mesh (calls).
    pub rank: u32,
    /// Dims of the called mesh (calls).
    pub dims: Vec<String>,
    /// Sizes of the called mesh (calls).
    pub sizes: Vec<u32>,
    /// Where the call comes from (calls, port messages and spawns; may be empty).
    pub origin: String,
    /// Which port, the sender's rank and whether it is an exception ([`Kind::Port`]
    /// only; the payload is then the value alone).
    pub port: Option<PortMessage>,
}

impl Incoming {
    /// A call (of a `Messages` stream or a pipe) as the dispatcher takes it.
    pub(crate) fn of(c: Call) -> Incoming {
        let kind = match (&c.port, c.command()) {
            (Some(_), _) => Kind::Port,
            (None, CallCommand::Endpoint) => Kind::Call,
            (None, CallCommand::Spawn) => Kind::Spawn, // SPAWN-1
            (None, CallCommand::Stop) => Kind::Stop,
        };
        Incoming {
            token: 0,
            kind,
            call_id: c.call_id,
            actor: c.actor,
            method: c.method,
            payload: c.payload,
            buffers: c.buffers,
            rank: c.rank,
            dims: c.dims,
            sizes: c.sizes,
            origin: c.origin,
            port: c.port,
        }
    }
}

/// Where a reply goes.
pub(crate) enum Sink {
    /// Back on the newest `Messages` stream of a caller (by its id), tagged with the
    /// caller's call id (RESUME-1).
    Stream(u64, u64),
    /// As the answer of a unary RPC.
    Unary(oneshot::Sender<Reply>),
    /// On the pipe of the agent that relayed the call (PIPE-1), with the caller's call
    /// id, written by the thread that replies.
    Pipe(Arc<super::pipe::PipeWriter>, u64),
}

/// The lane of everything not routed elsewhere: async actors, spawns, stops, cancels.
pub const LANE_LOOP: usize = 0;

/// The queues between the gRPC service and the Python dispatcher.
///
/// INBOX-3: calls to an actor routed to a lane of its own (by [`Inbox::route`]) wake
/// only the thread that runs that actor, so a call costs one thread wake-up in Python;
/// everything else goes to [`LANE_LOOP`], which the dispatcher's routing thread waits on.
pub struct Inbox {
    /// Lane 0 is [`LANE_LOOP`]; closed lanes are `None`.
    pub(super) lanes: RwLock<Vec<Option<Arc<Lane>>>>,
    /// Which lane each actor's calls go to; absent means [`LANE_LOOP`].
    routes: Mutex<HashMap<String, usize>>,
    /// Reply sinks by token (INBOX-2).
    sinks: Mutex<HashMap<u64, Sink>>,
    /// The `Messages` streams' callers and what they wait for (RESUME-1).
    pub(crate) callers: Callers,
    /// Spawns and stops by request id (RESUME-4).
    pub(crate) requests: Requests,
    next_token: AtomicU64,
    /// Calls received, for `Stats`.
    pub(crate) received: AtomicU64,
    /// Pipes opened to this worker with the mesh token (PIPE-1).
    pub(crate) pipes: AtomicU64,
    /// The pipes open to this worker (PIPE-2).
    pub(super) pipe_list: Mutex<Vec<Arc<PipeIn>>>,
    /// Calls that lane threads read from pipes for themselves (PIPE-2), for tests.
    pub(super) lane_reads: AtomicU64,
    /// Pings answered on pipes (PIPE-3).
    pub(crate) pipe_pings: AtomicU64,
    /// The highest controller epoch seen (fencing, see worker.proto).
    epoch: AtomicU64,
    /// Flips to true once, on shutdown: ends every `Messages` stream, so callers see
    /// the connection end instead of waiting for replies that will not come.
    pub(crate) stopping: watch::Sender<bool>,
}

impl Inbox {
    pub(crate) async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Stops the server: ends the streams and drops every pending reply sink.
    pub(crate) fn close(&self) {
        self.stopping.send_replace(true);
        lock(&self.sinks).clear();
        let ids: Vec<u64> = lock(&self.pipe_list).iter().map(|p| p.id).collect();
        for id in ids {
            self.forget_pipe(id);
        }
    }

    pub(crate) fn new() -> Result<Arc<Self>, RpcError> {
        Ok(Arc::new(Inbox {
            stopping: watch::channel(false).0,
            lanes: RwLock::new(vec![Some(Arc::new(Lane::new()?))]),
            routes: Mutex::new(HashMap::new()),
            sinks: Mutex::new(HashMap::new()),
            callers: Callers::default(),
            requests: Requests::default(),
            next_token: AtomicU64::new(1),
            received: AtomicU64::new(0),
            pipes: AtomicU64::new(0),
            pipe_list: Mutex::new(Vec::new()),
            lane_reads: AtomicU64::new(0),
            pipe_pings: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
        }))
    }

    /// The lane with index `lane`, unless closed or unknown.
    pub fn lane(&self, lane: usize) -> Option<Arc<Lane>> {
        let lanes = unpoison(self.lanes.read());
        lanes.get(lane).cloned().flatten()
    }

    /// Opens a new lane; returns its index. It reads the worker's pipes (PIPE-2),
    /// before their own threads.
    pub fn open_lane(&self) -> Result<usize, RpcError> {
        let lane = Arc::new(Lane::new()?);
        let pipes = lock(&self.pipe_list);
        if pipe_in::lanes_read() {
            for p in pipes.iter() {
                p.watch_from(lane.ep.as_raw_fd());
            }
        }
        let mut lanes = unpoison(self.lanes.write());
        lanes.push(Some(lane));
        Ok(lanes.len() - 1)
    }

    /// Closes `lane` (never [`LANE_LOOP`]); its queued items are returned.
    pub fn close_lane(&self, lane: usize) -> Vec<Incoming> {
        if lane == LANE_LOOP {
            return Vec::new();
        }
        let pipes = lock(&self.pipe_list);
        let closed = {
            let mut lanes = unpoison(self.lanes.write());
            lanes.get_mut(lane).and_then(Option::take)
        };
        let Some(closed) = closed else {
            return Vec::new();
        };
        for p in pipes.iter() {
            pipe_in::unwatch(closed.ep.as_raw_fd(), p.fd());
        }
        closed.take()
    }

    /// Sends later calls to `actor` to `lane`, or back to [`LANE_LOOP`] if `None`.
    pub fn route(&self, actor: &str, lane: Option<usize>) {
        let mut r = lock(&self.routes);
        match lane {
            Some(l) => {
                r.insert(actor.to_string(), l);
            }
            None => {
                r.remove(actor);
            }
        }
    }

    pub(crate) fn push(&self, item: Incoming, sink: Option<Sink>) {
        let mut item = item;
        if let Some(sink) = sink {
            let token = self.next_token.fetch_add(1, Ordering::Relaxed);
            item.token = token;
            lock(&self.sinks).insert(token, sink);
        }
        let routed = if item.kind == Kind::Call {
            let r = lock(&self.routes);
            r.get(&item.actor).copied().unwrap_or(LANE_LOOP)
        } else {
            LANE_LOOP
        };
        let Some(lane) = self.lane(routed).or_else(|| self.lane(LANE_LOOP)) else {
            return;
        };
        lane.push(item);
    }

    /// Answers the item that carried `token` (INBOX-2).
    pub fn reply(&self, token: u64, kind: ReplyKind, payload: Bytes, buffers: Vec<Bytes>) {
        let sink = lock(&self.sinks).remove(&token);
        let mut reply = Reply {
            call_id: 0,
            kind: kind as i32,
            payload,
            buffers,
            proc: None,
        };
        match sink {
            Some(Sink::Stream(caller, call_id)) => {
                reply.call_id = call_id;
                self.callers.reply(caller, reply);
            }
            Some(Sink::Unary(tx)) => {
                let _ = tx.send(reply);
            }
            Some(Sink::Pipe(pipe, call_id)) => {
                reply.call_id = call_id;
                pipe.send_reply(reply);
            }
            None => {}
        }
    }

    /// Admits a command from a controller at `epoch` (FENCE-1): a newer epoch becomes
    /// the worker's; an older one is refused with the message to send back. Epoch 0
    /// (peers inside the mesh) is always admitted.
    pub fn admit(&self, epoch: u64) -> Result<(), String> {
        if epoch == 0 {
            return Ok(());
        }
        let current = self.epoch.fetch_max(epoch, Ordering::SeqCst).max(epoch);
        if epoch < current {
            return Err(format!(
                "this controller attached at epoch {epoch}, but another controller has attached \
                 since (epoch {current}) and owns the mesh now"
            ));
        }
        Ok(())
    }

    /// How many pipes (PIPE-1) have been opened to this worker with the mesh token.
    pub fn pipes(&self) -> u64 {
        self.pipes.load(Ordering::Relaxed)
    }

    /// The answer to `ping` (the `Ping` RPC's, and a pipe's: PIPE-3): a newer epoch
    /// becomes the worker's first (FENCE-1), then this process and its epoch.
    pub fn pong(&self, ping: &PingRequest) -> PingReply {
        let _ = self.admit(ping.epoch);
        PingReply {
            nonce: ping.nonce,
            pid: std::process::id(),
            epoch: self.epoch(),
        }
    }

    /// The highest controller epoch seen.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Calls its callers have not yet said they received (RESUME-1).
    pub fn remembered(&self) -> usize {
        self.callers.remembered()
    }

    /// Items answered by nobody yet (in flight).
    pub fn in_flight(&self) -> usize {
        lock(&self.sinks).len()
    }
}
