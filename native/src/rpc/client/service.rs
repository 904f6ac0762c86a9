//! The service a connection speaks: a worker's `Worker`, or a host agent's `Relay`
//! (RELAY-1). Both carry the same messages; `Relay` has only `Messages` and `Cancel`,
//! so the RPCs only a worker serves answer `unimplemented` on a relay's connection, as
//! the agent would.
//!
//! An enum of the two generated clients rather than a connection generic over its
//! client: the stream task, the unary RPCs and the connection tables stay one
//! non-generic code path, and the cost is one `match` per RPC, not per call (calls
//! go on the one `Messages` stream).

use crate::proto::v1::relay_client::RelayClient;
use crate::proto::v1::worker_client::WorkerClient;
use crate::proto::v1::{
    Calls, CancelReply, CancelRequest, PingReply, PingRequest, Replies, Reply, SpawnActorRequest,
    StatsReply, StatsRequest, StopActorRequest,
};
use crate::rpc::auth::TokenAttach;
use crate::rpc::MAX_MESSAGE_BYTES;
use tonic::codec::Streaming;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{IntoStreamingRequest, Response, Status};

/// The channel every client sends on: the mesh token attached to every request.
type Authed = InterceptedService<Channel, TokenAttach>;

/// The generated client of the service a connection speaks.
#[derive(Clone)]
pub(super) enum Client {
    /// A worker's `Worker` service.
    Worker(WorkerClient<Authed>),
    /// A host agent's `Relay` service.
    Relay(RelayClient<Authed>),
}

/// Why a relay refuses what only a worker serves.
const NOT_A_RELAY_RPC: &str = "a host agent relays fanned-out calls only; send this to the worker";

impl Client {
    /// The client of `Relay` (`relay`) or `Worker` on `channel`, with the control
    /// plane's message limit both ways.
    pub(super) fn new(channel: Channel, attach: TokenAttach, relay: bool) -> Self {
        if relay {
            Client::Relay(
                RelayClient::with_interceptor(channel, attach)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
        } else {
            Client::Worker(
                WorkerClient::with_interceptor(channel, attach)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            )
        }
    }

    /// The `Messages` stream.
    pub(super) async fn messages(
        &mut self,
        req: impl IntoStreamingRequest<Message = Calls>,
    ) -> Result<Response<Streaming<Replies>>, Status> {
        match self {
            Client::Worker(c) => c.messages(req).await,
            Client::Relay(c) => c.messages(req).await,
        }
    }

    /// `Cancel`.
    pub(super) async fn cancel(
        &mut self,
        req: CancelRequest,
    ) -> Result<Response<CancelReply>, Status> {
        match self {
            Client::Worker(c) => c.cancel(req).await,
            Client::Relay(c) => c.cancel(req).await,
        }
    }

    /// The `Worker` client, for what only a worker serves.
    fn worker(&mut self) -> Result<&mut WorkerClient<Authed>, Status> {
        match self {
            Client::Worker(c) => Ok(c),
            Client::Relay(_) => Err(Status::unimplemented(NOT_A_RELAY_RPC)),
        }
    }

    /// `SpawnActor` (a worker's only).
    pub(super) async fn spawn_actor(
        &mut self,
        req: SpawnActorRequest,
    ) -> Result<Response<Reply>, Status> {
        self.worker()?.spawn_actor(req).await
    }

    /// `StopActor` (a worker's only).
    pub(super) async fn stop_actor(
        &mut self,
        req: StopActorRequest,
    ) -> Result<Response<Reply>, Status> {
        self.worker()?.stop_actor(req).await
    }

    /// `Ping` (a worker's only).
    pub(super) async fn ping(&mut self, req: PingRequest) -> Result<Response<PingReply>, Status> {
        self.worker()?.ping(req).await
    }

    /// `Stats` (a worker's only).
    pub(super) async fn stats(
        &mut self,
        req: StatsRequest,
    ) -> Result<Response<StatsReply>, Status> {
        self.worker()?.stats(req).await
    }
}
