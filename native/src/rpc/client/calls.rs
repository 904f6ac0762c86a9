//! Endpoint calls: the message one call sends, to one worker or fanned out by a relay
//! (a host agent) to several workers of its host, and the slots their replies complete;
//! port messages, which take the same path as a call of their own kind.

use super::pending::fail_all;
use super::WorkerConn;
use crate::proto::v1::{Call, CallCommand, Delivery, PortMessage};
use crate::rpc::resume;
use crate::rpc::slot::Slot;
use crate::rpc::{RpcError, MAX_MESSAGE_BYTES};
use crate::sync::lock;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Call messages this process has sent (a fanned-out call is one): `calls_sent()`.
pub static CALLS_SENT: AtomicU64 = AtomicU64::new(0);

/// Reply messages (batches) this process's call connections have received, and the
/// replies in them: `replies_received()`.
pub static REPLY_BATCHES: AtomicU64 = AtomicU64::new(0);
/// See [`REPLY_BATCHES`].
pub static REPLIES: AtomicU64 = AtomicU64::new(0);

/// Call ids: unique within this process, and from a random start, so that the ids
/// of two callers (controllers, or workers calling through one relay) do not meet
/// (RESUME-1 tells calls apart by caller and id; a pid would repeat across hosts).
fn next_call_id() -> u64 {
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU64::new(resume::random_id() >> 1))
        .fetch_add(1, Ordering::Relaxed)
}

impl WorkerConn {
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
    /// workers `deliveries` names (proc rank, index within the called mesh, and the
    /// relay of their host when it is another one: TREE-1, 1 + its index in `vias`).
    /// Returns the call id and,
    /// unless `oneway`, one slot per delivery, in order.
    pub fn call_fanned(
        &self,
        target: &Target<'_>,
        deliveries: Vec<Delivery>,
        vias: Vec<String>,
    ) -> (u64, Vec<Arc<Slot>>) {
        let mut msg = self.message(target, next_call_id(), 0, deliveries);
        msg.vias = vias;
        self.send_fanned(msg)
    }

    /// TREE-1, in a relay: sends `msg` (another caller's call: its payload, epoch and
    /// origin kept) to the relay at the other end for the deliveries it names, under
    /// a call id of this connection. The id and the slots, as [`call_fanned`](Self::call_fanned).
    pub fn forward_fanned(&self, mut msg: Call) -> (u64, Vec<Arc<Slot>>) {
        msg.call_id = next_call_id();
        msg.resent = false;
        self.send_fanned(msg)
    }

    fn send_fanned(&self, msg: Call) -> (u64, Vec<Arc<Slot>>) {
        let (call_id, oneway) = (msg.call_id, msg.oneway);
        let n = msg.fan_out.len();
        let done = |err: RpcError| {
            let slots = if oneway {
                Vec::new()
            } else {
                (0..n).map(|_| Slot::done_with(Err(err.clone()))).collect()
            };
            (call_id, slots)
        };
        if let Err(err) = Self::fits(&msg) {
            return done(err);
        }
        let slots: Vec<Arc<Slot>> = if oneway {
            Vec::new()
        } else {
            (0..n).map(|_| Slot::new()).collect()
        };
        if !oneway {
            let mut p = lock(&self.pending);
            if let Some(err) = p.lost.clone() {
                drop(p);
                return done(err);
            }
            let by_proc = msg
                .fan_out
                .iter()
                .map(|d| d.proc)
                .zip(slots.iter().cloned())
                .collect();
            p.fanned.insert(call_id, (by_proc, msg.clone()));
        }
        self.send(msg);
        (call_id, slots)
    }

    /// Sends a message for the port `port` of the worker server at the other end
    /// (`port` also carries the sender's rank and whether the value is an exception;
    /// `payload` and `buffers` are the value alone). It goes on the stream as a call
    /// does, in order with the calls sent before it, and its reply is the
    /// receiver's acknowledgement or refusal. Returns the call id and that slot.
    pub fn send_port(
        &self,
        port: PortMessage,
        payload: &Bytes,
        buffers: &[Bytes],
        origin: &str,
    ) -> (u64, Arc<Slot>) {
        let call_id = next_call_id();
        let msg = Call {
            call_id,
            actor: String::new(),
            method: String::new(),
            payload: payload.clone(),
            buffers: buffers.to_vec(),
            oneway: false,
            rank: 0,
            dims: Vec::new(),
            sizes: Vec::new(),
            epoch: self.epoch(),
            origin: origin.to_string(),
            fan_out: Vec::new(),
            resent: false,
            port: Some(port),
            command: CallCommand::Endpoint as i32,
            vias: Vec::new(),
        };
        if let Err(err) = Self::fits(&msg) {
            return (call_id, Slot::done_with(Err(err)));
        }
        (call_id, self.awaited(msg))
    }

    /// Sends `msg` as it is (its id, epoch and origin kept: also a relay's delivery
    /// to one worker). The slot its reply completes, unless `oneway`.
    pub fn forward(&self, msg: Call) -> Option<Arc<Slot>> {
        if msg.oneway {
            self.send(msg);
            return None;
        }
        Some(self.awaited(msg))
    }

    /// [`forward`](Self::forward) of a borrowed `msg`: on a worker's pipe it is written
    /// from the borrow (PIPE-1: a pipe never resumes, so no copy is kept either);
    /// elsewhere a copy is sent.
    pub fn forward_ref(&self, msg: &Call) -> Option<Arc<Slot>> {
        if self.pipe.is_none() {
            return self.forward(msg.clone());
        }
        let slot = match msg.oneway {
            true => None,
            false => match self.waiting(msg) {
                Ok(slot) => Some(slot),
                Err(lost) => return Some(lost),
            },
        };
        self.send_ref(msg);
        slot
    }

    /// Sends `msg`, which expects a reply, and returns the slot the reply completes
    /// (done at once with the loss if the connection is lost).
    fn awaited(&self, msg: Call) -> Arc<Slot> {
        match self.waiting(&msg) {
            Ok(slot) => {
                self.send(msg);
                slot
            }
            Err(lost) => lost,
        }
    }

    /// The slot `msg`'s reply completes, entered among the calls waiting with what a
    /// resumed stream sends again (nothing on a pipe, which never resumes); `Err`: the
    /// connection is lost, and that slot is done with the loss.
    fn waiting(&self, msg: &Call) -> Result<Arc<Slot>, Arc<Slot>> {
        let slot = Slot::new();
        let mut p = lock(&self.pending);
        if let Some(err) = &p.lost {
            return Err(Slot::done_with(Err(err.clone())));
        }
        let kept = match self.pipe {
            Some(_) => Call::default(),
            None => msg.clone(),
        };
        p.calls.insert(msg.call_id, (slot.clone(), kept));
        Ok(slot)
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
            command,
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
            port: None,
            command: command as i32,
            vias: Vec::new(),
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

    /// Sends a borrowed `msg`: on a worker's pipe, written from the borrow (PIPE-1; the
    /// pipe's end fails the calls waiting on it); elsewhere, a copy goes as [`send`](Self::send)'s.
    fn send_ref(&self, msg: &Call) {
        let Some(pipe) = &self.pipe else {
            return self.send(msg.clone());
        };
        CALLS_SENT.fetch_add(1, Ordering::Relaxed);
        pipe.send_call(msg);
    }

    fn send(&self, msg: Call) {
        if self.pipe.is_some() {
            return self.send_ref(&msg);
        }
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
    /// What it does: call an endpoint, or spawn or stop actor `actor` (SPAWN-1).
    pub command: CallCommand,
}
