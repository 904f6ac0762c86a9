//! The one client of the `Worker` and `Relay` services. A [`WorkerConn`] is one HTTP/2
//! connection to one worker, or to one host agent's relay of fanned-out calls
//! (RELAY-1), with one long-lived `Messages` stream on it; calls are matched to
//! replies by call id and complete [`Slot`](super::slot::Slot)s. Both services carry
//! the same messages, so one connection type speaks either: its `Peer` says which,
//! and its `service::Client` sends each RPC to that service.
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
//!
//! The pieces, one concern a file: the connection tables and opening (`pool.rs`), the
//! service a connection speaks (`service.rs`), the calls waiting for replies
//! (`pending.rs`), the task that runs and resumes the `Messages` stream (`link.rs`), or,
//! for a relay's connection to a worker of its host, the tasks of its pipe (`pipe.rs`,
//! PIPE-1),
//! what a failed RPC means (`failure.rs`), endpoint calls and their fan-out through a
//! relay (`calls.rs`), which path each call to a worker takes (`order.rs`, ORDER-1) and
//! a call to procs across hosts sent by those paths (`fanout.rs`), and the unary RPCs
//! (`unary.rs`). Beside them, a controller's `Watch` stream on a host agent
//! (`agent.rs`, WATCH-1) and its heartbeat, the `HostAgent` RPCs made here.

mod agent;
mod calls;
mod failure;
mod fanout;
mod link;
mod order;
mod pending;
mod pipe;
mod pool;
mod service;
mod unary;

pub use agent::{ping_workers, AgentConn, AgentWatch, WatchItem};
pub use calls::{Target, CALLS_SENT, REPLIES, REPLY_BATCHES};
pub use fanout::{Fanout, Sent};
pub use link::set_resume_limit;

use super::RpcError;
use crate::proto::v1::{Call, Reply, ReplyKind};
use crate::sync::lock;
use pending::{fail_all, Pending};
use service::Client;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};

/// What a connection is to: which service it speaks, what it does with replies, and
/// which of this process's tables shares it (CLIENT-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// A worker, for this process's own calls (`Worker`); replies' buffers are pulled
    /// as they arrive (XFER-2).
    Worker,
    /// A host agent's relay of fanned-out calls (`Relay`, RELAY-1); replies' buffers
    /// are pulled as a worker's are.
    Relay,
    /// A worker, for the relay of its host's agent (`Worker`): replies pass on
    /// untouched, their buffers are not pulled here.
    Relayed,
    /// Another host agent's relay, for a relay that forwards a call to its subtree
    /// (`Relay`, TREE-1): replies pass on untouched, as `Relayed`.
    Branch,
}

/// A connection to one worker, or to one host agent's relay (its `Peer`).
pub struct WorkerConn {
    addr: String,
    token: String,
    /// What it is to; a connection lost is opened again as the same (CLIENT-3).
    peer: Peer,
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
    /// plaintext connection, may be a TLS server's refusal ([`error_of`](failure::error_of)).
    answered: Arc<AtomicBool>,
    /// Wakes the connection task when the calls are abandoned ([`WorkerConn::abandon`]).
    abandoned: Arc<Notify>,
    /// The worker's pipe, when a relay's calls take one (PIPE-1): its calls and its
    /// pings (PIPE-3) go there.
    pipe: Option<Arc<pipe::Pipe>>,
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

/// SUPERVISE-2: the meshes (by token) whose workers this process's supervision
/// watches through their hosts' agents (a heartbeat per host every second). This
/// process's own connections to their workers then ping every 15 s, not every
/// second ([`crate::rpc::Keepalive::Relaxed`]): 1,024 connections pinged every second
/// were half of an idle controller's CPU (TREE-1's scale), and a silent peer is
/// noticed by the agents' heartbeats instead.
fn agent_watched() -> &'static Mutex<HashSet<String>> {
    static TOKENS: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    TOKENS.get_or_init(Default::default)
}

/// Marks the mesh with `token` as watched by agents' heartbeats ([`agent_watched`]):
/// connections to its workers opened from now on ping every 15 s.
pub fn watch_through_agents(token: &str) {
    lock(agent_watched()).insert(token.to_string());
}

fn watched_through_agents(token: &str) -> bool {
    lock(agent_watched()).contains(token)
}

impl WorkerConn {
    /// This connection unless it is lost (a broken one resumes: RESUME-1), else this
    /// process's next one to the same worker (CLIENT-3); commands already sent on a
    /// lost one have failed (CLIENT-1).
    pub fn current(self: &Arc<Self>, rt: &Handle) -> Result<Arc<WorkerConn>, RpcError> {
        if self.lost().is_none() {
            return Ok(self.clone());
        }
        Self::shared(self.peer, rt, &self.addr, &self.token)
    }

    /// The epoch commands carry.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Whether it talks TLS (TLS-2).
    pub fn is_tls(&self) -> bool {
        self.ca.is_some()
    }

    /// The worker's (or relay's) address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether a failure now is to be checked for a TLS server ([`error_of`](failure::error_of)).
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
}

/// A reply's kind, from its wire value.
pub fn reply_kind(r: &Reply) -> ReplyKind {
    ReplyKind::try_from(r.kind).unwrap_or(ReplyKind::Unspecified)
}
