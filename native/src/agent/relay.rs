//! The agent as a relay of fanned-out calls: it serves the `Relay` service
//! (worker.proto), delivers each call to the workers of its host that the call names
//! (`Call.fan_out`) and sends their replies back on the caller's stream, each marked
//! with its worker's proc rank.
//!
//! RELAY-1: a controller that calls many procs across hosts sends one message per
//! host, not per proc, to that host's `Relay`; each reply reaches the caller as from
//! the worker itself (the same call id, kind and payload; a worker lost on the way is
//! a `REPLY_KIND_LOST` reply, which the caller's client turns into the connection loss
//! a direct call would have seen). The relay reads nothing of a call but its
//! deliveries: the worker checks the caller's epoch and pulls the call's buffers
//! itself. A caller whose connection to the relay broke resumes it (RESUME-1,
//! `rpc/resume.rs`); the relay's own connections to its workers resume the same way.
//!
//! TREE-1: a delivery that names another relay (`Delivery.relay`, a host of this
//! one's group) is forwarded to it, in one message per relay with the deliveries
//! that name it, on this agent's connection to it (`WorkerConn::branch`, RESUME-1 as
//! any other); its replies come back here as its workers' and go on to the caller
//! under the caller's call id. A relay it cannot reach answers LOST for each of its
//! procs, so a call never waits on a broken branch.

use super::Agent;
use crate::proto::v1::relay_server;
use crate::proto::v1::{Calls, CancelReply, CancelRequest, Replies, Reply, ReplyKind};
use crate::rpc::batch::Batched;
use crate::rpc::client::WorkerConn;
use crate::rpc::resume::{self, Admit, Callers};
use crate::rpc::slot::Slot;
use crate::sync::lock;
use bytes::Bytes;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Where one delivery of a relayed call went: its proc rank, the connection (to its
/// worker, or to another relay: TREE-1) and the call's id on that connection.
type Leg = (u32, Arc<WorkerConn>, u64);

/// Calls in flight through the relay: for each call id, where its deliveries went and
/// how many replies are still to come (so that a cancel reaches them).
type InFlight = Arc<Mutex<HashMap<u64, (usize, Vec<Leg>)>>>;

/// The relay service of one agent.
pub struct Relay {
    agent: Arc<Agent>,
    in_flight: InFlight,
    /// Its callers and the deliveries they wait for (RESUME-1): a controller whose
    /// connection to this host broke resumes here.
    callers: Arc<Callers>,
}

impl Relay {
    /// The relay of `agent`'s workers.
    pub fn new(agent: Arc<Agent>) -> Self {
        Relay {
            agent,
            in_flight: Arc::default(),
            callers: Arc::default(),
        }
    }
}

fn refusal(call_id: u64, kind: ReplyKind, proc: Option<u32>, why: String) -> Reply {
    Reply {
        call_id,
        kind: kind as i32,
        payload: Bytes::from(why),
        buffers: Vec::new(),
        proc,
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<Replies, Status>> + Send>>;

/// Why a call that names no worker is refused.
const ONLY: &str = "a host agent relays fanned-out calls only; send this to the worker";

#[tonic::async_trait]
impl relay_server::Relay for Relay {
    type MessagesStream = ReplyStream;

    async fn messages(
        &self,
        req: Request<Streaming<Calls>>,
    ) -> Result<Response<Self::MessagesStream>, Status> {
        let caller = match resume::caller_of(&req) {
            0 => resume::random_id(),
            id => id,
        };
        let seq = resume::stream_of(&req);
        let mut calls = req.into_inner();
        let (tx, rx) = mpsc::unbounded_channel::<Reply>();
        let (agent, in_flight) = (self.agent.clone(), self.in_flight.clone());
        let callers = self.callers.clone();
        let Some((stream, knew)) = callers.attach(caller, seq, tx.clone()) else {
            return Err(resume::superseded());
        };
        let rt = tokio::runtime::Handle::current();
        tokio::spawn(async move {
            let to = To {
                callers: &callers,
                caller,
                stream,
                tx: &tx,
            };
            while let Some(Ok(batch)) = calls.next().await {
                callers.resync(caller, stream, &batch);
                for call in batch.calls {
                    deliver(&rt, &agent, &in_flight, call, &to);
                }
                callers.received(caller, &batch.received);
            }
            callers.detach(caller, stream);
        });
        Ok(self.callers.tag(
            Response::new(Box::pin(Batched::new(rx, |replies| {
                Ok(Replies {
                    replies,
                    pong: None,
                })
            }))),
            knew,
        ))
    }

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        let r = req.into_inner();
        let legs: Vec<Leg> = lock(&self.in_flight)
            .get(&r.call_id)
            .map(|(_, legs)| {
                legs.iter()
                    .filter(|(p, _, _)| r.proc.is_none_or(|want| want == *p))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let rt = tokio::runtime::Handle::current();
        for (proc, c, id) in &legs {
            // A worker runs the call once; another relay (TREE-1) runs it for many.
            let only = (*id != r.call_id).then_some(*proc);
            c.cancel_as(&rt, *id, r.epoch, only);
        }
        Ok(Response::new(CancelReply {
            found: !legs.is_empty(),
        }))
    }
}

/// Where a caller's replies go: through its remembered calls (RESUME-1), or straight
/// on its stream for what is not remembered (a refusal of the whole call).
struct To<'a> {
    callers: &'a Arc<Callers>,
    caller: u64,
    /// The caller's stream the calls are read from.
    stream: u64,
    tx: &'a mpsc::UnboundedSender<Reply>,
}

/// Delivers `call` to each worker it names; replies go to its caller as they come.
fn deliver(
    rt: &tokio::runtime::Handle,
    agent: &Agent,
    in_flight: &InFlight,
    mut call: crate::proto::v1::Call,
    to: &To<'_>,
) {
    let (call_id, oneway) = (call.call_id, call.oneway);
    let deliveries = std::mem::take(&mut call.fan_out);
    if deliveries.is_empty() {
        if !oneway {
            let _ = to
                .tx
                .send(refusal(call_id, ReplyKind::Rejected, None, ONLY.into()));
        }
        return;
    }
    if !oneway {
        let procs: Vec<Option<u32>> = deliveries.iter().map(|d| Some(d.proc)).collect();
        match to
            .callers
            .admit(to.caller, to.stream, call_id, &procs, call.resent)
        {
            Admit::Run => {}
            Admit::Known | Admit::Stale => return,
            Admit::Forgotten => {
                for p in procs {
                    let _ = to.tx.send(resume::forgotten(call_id, p));
                }
                return;
            }
        }
    }
    // A delivery is a new call to its worker (RESUME-1 is per connection).
    call.resent = false;
    let (callers, caller) = (to.callers.clone(), to.caller);
    let mut targets = Vec::new();
    let mut branches: Vec<(String, Vec<crate::proto::v1::Delivery>)> = Vec::new();
    for mut d in deliveries {
        if !d.relay.is_empty() {
            let relay = std::mem::take(&mut d.relay);
            match branches.iter_mut().find(|(r, _)| *r == relay) {
                Some((_, ds)) => ds.push(d),
                None => branches.push((relay, vec![d])),
            }
            continue;
        }
        let conn = match agent.workers.addr_of(d.proc) {
            None => Err(format!(
                "this host has no running worker of proc {}",
                d.proc
            )),
            Some(addr) => WorkerConn::relayed(rt, &addr, agent.token()).map_err(|e| e.to_string()),
        };
        match conn {
            Ok(c) => targets.push((d.proc, d.rank, c)),
            Err(why) if !oneway => {
                callers.reply(caller, refusal(call_id, ReplyKind::Lost, Some(d.proc), why));
            }
            Err(_) => {}
        }
    }
    // Each leg, and the slot its reply completes (none for a broadcast).
    let mut legs: Vec<(Leg, Option<Arc<Slot>>)> = Vec::new();
    for (relay, ds) in branches {
        let procs: Vec<u32> = ds.iter().map(|d| d.proc).collect();
        let conn = match WorkerConn::branch(rt, &relay, agent.token()) {
            Ok(c) => c,
            Err(e) if !oneway => {
                for p in procs {
                    let why = format!("the relay of its host ({relay}) cannot be reached: {e}");
                    callers.reply(caller, refusal(call_id, ReplyKind::Lost, Some(p), why));
                }
                continue;
            }
            Err(_) => continue,
        };
        let mut part = call.clone();
        part.fan_out = ds;
        let (id, slots) = conn.forward_fanned(part);
        if oneway {
            continue;
        }
        for (p, slot) in procs.into_iter().zip(slots) {
            legs.push(((p, conn.clone(), id), Some(slot)));
        }
    }
    for (proc, rank, conn) in targets {
        let mut one = call.clone();
        one.rank = rank;
        let slot = conn.forward(one);
        legs.push(((proc, conn, call_id), slot));
    }
    if oneway || legs.is_empty() {
        return;
    }
    {
        // Before any reply can come back to the caller: each one counts down its
        // call's entry.
        let kept = legs.iter().map(|(leg, _)| leg.clone()).collect();
        lock(in_flight).insert(call_id, (legs.len(), kept));
    }
    for ((proc, _, _), slot) in legs {
        let Some(slot) = slot else { continue };
        let (callers, slot2, in_flight) = (callers.clone(), slot.clone(), in_flight.clone());
        slot.on_done(Box::new(move || {
            let reply = match slot2.outcome() {
                Some(Ok(mut r)) => {
                    r.call_id = call_id;
                    r.proc = Some(proc);
                    r
                }
                Some(Err(e)) => refusal(call_id, ReplyKind::Lost, Some(proc), e.to_string()),
                None => return,
            };
            callers.reply(caller, reply);
            let mut map = lock(&in_flight);
            if let Some((left, _)) = map.get_mut(&call_id) {
                *left -= 1;
                if *left == 0 {
                    map.remove(&call_id);
                }
            }
        }));
    }
}
