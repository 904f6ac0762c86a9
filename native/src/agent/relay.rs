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
//! TREE-1: a delivery that names another relay (`Delivery.via`, a host of this
//! one's group) is forwarded to it, in one message per relay with the deliveries
//! that name it, on this agent's connection to it (`WorkerConn::branch`, RESUME-1 as
//! any other); its replies come back here as its workers' and go on to the caller
//! under the caller's call id. A relay it cannot reach answers LOST for each of its
//! procs, so a call never waits on a broken branch.
//!
//! GATHER-1: a relay sends a call's replies back together. It holds each result until
//! every delivery of the call has answered, and then sends them all at once, so a
//! call's replies cost the caller (and each relay on the way back) one message per
//! host or group, not one per reply that happened to come alone. A reply that is not
//! a result (an exception, a refusal, a lost worker) goes at once with those held, so
//! a failure still fails the call fast; and no result is held longer than the agent's
//! hold ([`HOLD`], `AgentConfig::relay_hold`; zero sends each reply as it comes), so a
//! slow rank does not keep its host's other answers from a caller that streams them.

use super::Agent;
use crate::ids::IdMap;
use crate::proto::v1::relay_server;
use crate::proto::v1::{Calls, CancelReply, CancelRequest, Replies, Reply, ReplyKind};
use crate::rpc::batch::Batched;
use crate::rpc::client::WorkerConn;
use crate::rpc::resume::{self, Admit, Callers};
use crate::rpc::slot::Slot;
use crate::sync::lock;
use bytes::Bytes;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Where one delivery of a relayed call went: its proc rank, the connection (to its
/// worker, or to another relay: TREE-1) and the call's id on that connection.
type Leg = (u32, Arc<WorkerConn>, u64);

/// The longest a relay holds a result back to send it with the call's others
/// (GATHER-1), unless `MONARCH_RELAY_HOLD_MS` says otherwise ([`hold_from_env`]).
pub const HOLD: Duration = Duration::from_millis(20);

/// The agent's hold (`AgentConfig::relay_hold`): `MONARCH_RELAY_HOLD_MS` in the
/// environment (0: none is held, each reply goes as it comes), else [`HOLD`].
pub fn hold_from_env() -> Duration {
    std::env::var("MONARCH_RELAY_HOLD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(HOLD, Duration::from_millis)
}

/// A call in flight through the relay.
struct Flight {
    /// Replies still to come.
    left: usize,
    /// Where its deliveries went (so that a cancel reaches them).
    legs: Vec<Leg>,
    /// Results held to go back together (GATHER-1).
    held: Vec<Reply>,
    /// The send of what is held that is due within the hold, if one is: ended when
    /// the call's last reply sends everything first, so that a call whose replies all
    /// came within the hold wakes its relay for nothing more.
    timer: Option<tokio::task::AbortHandle>,
}

/// Calls in flight through the relay, by call id.
type InFlight = Arc<Mutex<IdMap<u64, Flight>>>;

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
            .map(|f| {
                f.legs
                    .iter()
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
    // TREE-1: the deliveries this relay forwards, by the relay each names (`via`).
    let vias = std::mem::take(&mut call.vias);
    let mut branches: Vec<Vec<crate::proto::v1::Delivery>> = vec![Vec::new(); vias.len()];
    for mut d in deliveries {
        if d.via != 0 {
            match branches.get_mut(d.via as usize - 1) {
                Some(ds) => {
                    d.via = 0; // (a worker of the host it goes to)
                    ds.push(d);
                }
                None if !oneway => {
                    let why = format!(
                        "a malformed call: its delivery names relay {} of {}",
                        d.via,
                        vias.len()
                    );
                    callers.reply(
                        caller,
                        refusal(call_id, ReplyKind::Rejected, Some(d.proc), why),
                    );
                }
                None => {}
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
    for (relay, ds) in vias.into_iter().zip(branches) {
        if ds.is_empty() {
            continue;
        }
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
        call.rank = rank; // (each delivery's own; a pipe's is written from the borrow)
        let slot = conn.forward_ref(&call);
        legs.push(((proc, conn, call_id), slot));
    }
    if oneway || legs.is_empty() {
        return;
    }
    {
        // Before any reply can come back to the caller: each one counts down its
        // call's entry.
        let flight = Flight {
            left: legs.len(),
            legs: legs.iter().map(|(leg, _)| leg.clone()).collect(),
            held: Vec::new(),
            timer: None,
        };
        lock(in_flight).insert(call_id, flight);
    }
    for ((proc, _, _), slot) in legs {
        let Some(slot) = slot else { continue };
        let (callers, slot2, in_flight) = (callers.clone(), slot.clone(), in_flight.clone());
        let (rt, hold) = (rt.clone(), agent.relay_hold());
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
            let to = Held {
                rt: &rt,
                in_flight: &in_flight,
                callers: &callers,
                caller,
                hold,
            };
            let out = to.gathered(call_id, reply);
            callers.reply_all(caller, out);
        }));
    }
}

/// Where a relayed call's replies are held (GATHER-1) and whom they go to.
struct Held<'a> {
    rt: &'a tokio::runtime::Handle,
    in_flight: &'a InFlight,
    callers: &'a Arc<Callers>,
    caller: u64,
    /// The longest a result is held.
    hold: Duration,
}

impl Held<'_> {
    /// What goes back to the caller now that `reply` came for `call_id`: every reply
    /// held so far with it once the call has no reply left to come or `reply` is not
    /// a result; else nothing, and `reply` is held (sent within the hold at the latest).
    fn gathered(&self, call_id: u64, reply: Reply) -> Vec<Reply> {
        let mut map = lock(self.in_flight);
        let Some(f) = map.get_mut(&call_id) else {
            return vec![reply];
        };
        f.left -= 1;
        let urgent = reply.kind != ReplyKind::Result as i32;
        f.held.push(reply);
        if f.left == 0 {
            let f = map
                .remove(&call_id)
                .expect("(looked up above, under the same lock)");
            if let Some(timer) = f.timer {
                timer.abort();
            }
            return f.held;
        }
        if urgent || self.hold.is_zero() {
            return std::mem::take(&mut f.held);
        }
        if f.timer.is_none() {
            let (in_flight, callers) = (self.in_flight.clone(), self.callers.clone());
            let (caller, hold) = (self.caller, self.hold);
            let timer = self.rt.spawn(async move {
                tokio::time::sleep(hold).await;
                let out = match lock(&in_flight).get_mut(&call_id) {
                    Some(f) => {
                        f.timer = None;
                        std::mem::take(&mut f.held)
                    }
                    None => Vec::new(),
                };
                callers.reply_all(caller, out);
            });
            f.timer = Some(timer.abort_handle());
        }
        Vec::new()
    }
}
