//! The unary RPCs of a connection: spawning and stopping actors (sent again across
//! breaks, run once: RESUME-4), cancelling a call, and the runtime's ping and stats.

use super::failure::{backoff, error_of, failure};
use super::service::Client;
use super::WorkerConn;
use crate::proto::v1::{
    CancelRequest, PingRequest, Reply, SpawnActorRequest, StatsReply, StatsRequest,
    StopActorRequest,
};
use crate::rpc::resume;
use crate::rpc::slot::{Outcome, Slot};
use crate::rpc::RpcError;
use crate::sync::lock;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;

impl WorkerConn {
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
        self.ping_as(self.epoch()).await
    }

    /// [`ping`](Self::ping) carrying `epoch` (an agent's, on its controller's behalf).
    pub async fn ping_as(&self, epoch: u64) -> Result<(u32, u64), RpcError> {
        // PIPE-3: on the worker's pipe while it lasts (the worker's runtime is not
        // woken); a pipe that has ended leaves the ping to gRPC, which says why.
        if let Some(pipe) = &self.pipe {
            if let Some(r) = pipe.ping(epoch).await {
                self.answered.store(true, Ordering::Relaxed);
                return Ok((r.pid, r.epoch));
            }
        }
        let mut c = self.client.clone();
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
