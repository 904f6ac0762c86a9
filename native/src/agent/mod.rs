//! The host agent: a daemon (one per host and mesh) that owns the worker processes.
//!
//! It spawns workers ([`process`]), captures their output to per-rank log files and a
//! ring buffer, reports their exits to `Watch` streams, and stops them on `Shutdown`
//! or when no controller has been attached for the idle timeout.
//!
//! AGENT-1: workers never outlive the agent: each is started with
//! `PR_SET_PDEATHSIG = SIGKILL` and holds a pipe from the agent on its stdin whose
//! EOF makes it exit. AGENT-2: an open `Watch` stream is a controller's lease; the
//! idle clock runs only while there is none.
//!
//! Given the mesh's TLS identity, the agent serves TLS and hands the identity to each
//! worker it starts, on the worker's stdin (TLS-1, TLS-3; `rpc/tls.rs`).

pub mod marks;
pub mod oom;
pub mod process;
pub mod relay;
pub mod template;
pub mod usage;

use crate::proto::v1::agent_event;
use crate::proto::v1::host_agent_server::{HostAgent, HostAgentServer};
use crate::proto::v1::{
    ActorRecord, AgentEvent, AgentPingReply, AgentPingRequest, AttachReply, AttachRequest,
    ForgetActorRequest, ListWorkersReply, ListWorkersRequest, LogsReply, LogsRequest,
    PingWorkersReply, PingWorkersRequest, RecordActorReply, RespawnWorkersRequest, ShutdownReply,
    ShutdownRequest, SpawnWorkersReply, SpawnWorkersRequest, Stopping, WatchRequest, WorkerPing,
    WorkerState,
};
use crate::rpc::auth::TokenCheck;
use crate::rpc::tls::ServerIdentity;
use crate::sync::lock;
use process::Workers;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch, Notify};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Events (log lines, exits) buffered for a watcher that is behind; past that it is
/// told how many it missed (`dropped`), never left to guess. About 64K lines.
const EVENTS_BUFFERED: usize = 1 << 16;

/// Errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The token is unusable (AUTH-2).
    #[error("{0}")]
    Token(#[from] crate::rpc::auth::TokenError),
    /// Binding, spawning or log files.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS identity cannot be used.
    #[error("{0}")]
    Tls(String),
}

/// How an agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The mesh's name.
    pub name: String,
    /// The mesh's secret token.
    pub token: String,
    /// Where per-rank log files go.
    pub log_dir: PathBuf,
    /// Stop after this long with no controller attached (AGENT-2).
    pub idle_timeout: Duration,
    /// How long to wait for the first controller to attach.
    pub first_attach_timeout: Duration,
    /// Opaque to the agent: the creating controller's description of the mesh (JSON),
    /// handed to every controller that attaches.
    pub meta: String,
    /// The address of this host that the agent and its workers listen on (127.0.0.1
    /// on a single host; the address the controller reaches this host by otherwise).
    pub bind_host: String,
    /// The mesh's server certificate and key: the agent and its workers serve TLS
    /// with them (TLS-1); None: plaintext.
    pub tls: Option<ServerIdentity>,
    /// The mesh's CA, handed to the workers, whose own calls to the mesh's other
    /// workers check them against it (TLS-2).
    pub tls_ca: Option<String>,
    /// The longest the relay holds a call's result to send it back with the call's
    /// others (GATHER-1, `relay::hold_from_env`); zero: each reply goes as it comes.
    pub relay_hold: Duration,
}

/// State shared by the service and its background tasks.
pub struct Agent {
    cfg: AgentConfig,
    /// The worker processes.
    pub workers: Workers,
    /// Worker exits and log lines, fanned out to `Watch` streams.
    events: broadcast::Sender<AgentEvent>,
    /// Open `Watch` streams (AGENT-2).
    watchers: AtomicUsize,
    /// When the last watcher left (or the agent started).
    detached_since: Mutex<Option<Instant>>,
    /// Set once any controller has attached.
    ever_attached: Mutex<bool>,
    /// What the controller that attached last said of itself (OWNER-1).
    owner: Mutex<String>,
    /// Flips to true once when the agent must stop; ends `Watch` streams and the server.
    stopping: watch::Sender<bool>,
    /// The mesh's epoch (fencing, see agent.proto).
    epoch: AtomicU64,
    /// How the live actor meshes were spawned, oldest first.
    actors: Mutex<Vec<ActorRecord>>,
    /// The outcome of each recent `SpawnWorkers` by request id, oldest first (sent
    /// again after a broken connection, it starts nothing more).
    spawns: Mutex<VecDeque<(String, SpawnOutcome)>>,
    /// What the workers use, read when asked (VIEW-2).
    meter: usage::Meter,
}

/// A `SpawnWorkers` run: its workers, or why it failed; None while it runs.
type SpawnOutcome = watch::Receiver<Option<Result<Vec<crate::proto::v1::WorkerInfo>, String>>>;

/// Request ids of `SpawnWorkers` remembered (a mesh spawns once per host, and again
/// only to grow).
const SPAWNS_KEPT: usize = 64;

/// Decrements the watcher count when a `Watch` stream is dropped (AGENT-2).
struct Lease(Arc<Agent>);

impl Drop for Lease {
    fn drop(&mut self) {
        if self.0.watchers.fetch_sub(1, Ordering::SeqCst) == 1 {
            *lock(&self.0.detached_since) = Some(Instant::now());
        }
    }
}

impl Agent {
    /// Tells the watchers why (`by`), stops every worker, then lets the server end.
    pub async fn stop_all(&self, by: &str) {
        let _ = self.events.send(AgentEvent {
            event: Some(agent_event::Event::Stopping(Stopping {
                by: by.to_string(),
            })),
        });
        self.workers.stop_all(Duration::from_secs(2)).await;
        self.stopping.send_replace(true);
    }

    /// True once the agent has begun to stop (its workers are stopped).
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves once the agent is stopping.
    pub async fn stopped(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The mesh token (the relay's connections to the workers carry it).
    pub fn token(&self) -> &str {
        &self.cfg.token
    }

    /// See [`AgentConfig::relay_hold`].
    pub fn relay_hold(&self) -> Duration {
        self.cfg.relay_hold
    }

    /// FENCE-2: admits a command that changes the mesh from a controller at `epoch`.
    fn admit(&self, epoch: u64) -> Result<(), Status> {
        let current = self.epoch.load(Ordering::SeqCst);
        if epoch != 0 && epoch < current {
            return Err(Status::failed_precondition(format!(
                "mesh {:?}: this controller attached at epoch {epoch}, but another controller \
                 has attached since (epoch {current}) and owns the mesh now",
                self.cfg.name
            )));
        }
        Ok(())
    }

    /// How long until the idle timeout stops the mesh; None while a controller is
    /// attached (AGENT-2).
    fn idle_left(&self) -> Option<Duration> {
        if self.watchers.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = (*lock(&self.detached_since))?;
        let limit = if *lock(&self.ever_attached) {
            self.cfg.idle_timeout
        } else {
            self.cfg.first_attach_timeout.max(self.cfg.idle_timeout)
        };
        Some(limit.saturating_sub(since.elapsed()))
    }

    fn idle_expired(&self) -> bool {
        self.idle_left().is_some_and(|left| left.is_zero())
    }
}

#[derive(Clone)]
struct Service(Arc<Agent>);

type EventStream = Pin<Box<dyn Stream<Item = Result<AgentEvent, Status>> + Send>>;

#[tonic::async_trait]
impl HostAgent for Service {
    async fn spawn_workers(
        &self,
        req: Request<SpawnWorkersRequest>,
    ) -> Result<Response<SpawnWorkersReply>, Status> {
        let r = req.into_inner();
        self.0.admit(r.epoch)?;
        // In a task of its own, once per request id: a caller whose connection broke
        // (and so its handler was dropped) finds the same run when it asks again. A
        // request without an id is not remembered.
        let mut outcome = {
            let mut spawns = lock(&self.0.spawns);
            let known = spawns
                .iter()
                .find(|(id, _)| !id.is_empty() && *id == r.request_id);
            match known {
                Some((_, rx)) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    let agent = self.0.clone();
                    let req = r.clone();
                    tokio::spawn(async move {
                        let got = agent.workers.spawn(&req, agent.events.clone()).await;
                        let _ = tx.send(Some(got.map_err(|e| e.to_string())));
                    });
                    if !r.request_id.is_empty() {
                        if spawns.len() == SPAWNS_KEPT {
                            spawns.pop_front();
                        }
                        spawns.push_back((r.request_id.clone(), rx.clone()));
                    }
                    rx
                }
            }
        };
        // (None: the run's task ended without an outcome, the runtime stopping)
        let got = outcome
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|v| v.clone());
        match got {
            Some(Ok(workers)) => Ok(Response::new(SpawnWorkersReply { workers })),
            Some(Err(e)) => Err(Status::internal(format!("cannot start workers: {e}"))),
            None => Err(Status::unavailable("the agent is stopping")),
        }
    }

    async fn list_workers(
        &self,
        _req: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersReply>, Status> {
        Ok(Response::new(ListWorkersReply {
            workers: self.0.workers.list(),
        }))
    }

    async fn logs(&self, req: Request<LogsRequest>) -> Result<Response<LogsReply>, Status> {
        let r = req.into_inner();
        let rank = u32::try_from(r.rank).ok();
        Ok(Response::new(LogsReply {
            lines: self.0.workers.logs(rank, r.tail as usize),
        }))
    }

    type WatchStream = EventStream;

    async fn watch(&self, _req: Request<WatchRequest>) -> Result<Response<EventStream>, Status> {
        let agent = self.0.clone();
        agent.watchers.fetch_add(1, Ordering::SeqCst);
        *lock(&agent.ever_attached) = true;
        let lease = Lease(agent.clone());
        let mut events = agent.events.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        // Forwards events until the controller goes (its stream is dropped, so `tx`
        // closes) or the agent stops; the lease ends with this task (AGENT-2).
        tokio::spawn(async move {
            let _lease = lease;
            loop {
                tokio::select! {
                    ev = events.recv() => match ev {
                        Ok(ev) => if tx.send(Ok(ev)).await.is_err() { return },
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            // Never silent: say how many went, and send the exits
                            // again (a controller treats a repeated exit as known).
                            let mut again = vec![AgentEvent { event: Some(agent_event::Event::Dropped(n)) }];
                            again.extend(agent.workers.list().into_iter()
                                .filter(|w| w.state == WorkerState::Exited as i32)
                                .map(|w| AgentEvent { event: Some(agent_event::Event::WorkerExited(w)) }));
                            for ev in again {
                                if tx.send(Ok(ev)).await.is_err() { return }
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                    _ = tx.closed() => return,
                    _ = agent.stopped() => return,
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn shutdown(
        &self,
        req: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownReply>, Status> {
        let epoch = req.into_inner().epoch;
        self.0.admit(epoch)?;
        self.0
            .stop_all(if epoch == 0 {
                "administrator"
            } else {
                "controller"
            })
            .await;
        Ok(Response::new(ShutdownReply {}))
    }

    async fn ping_workers(
        &self,
        req: Request<PingWorkersRequest>,
    ) -> Result<Response<PingWorkersReply>, Status> {
        let r = req.into_inner();
        let limit = Duration::from_millis(u64::from(r.timeout_ms.clamp(10, 60_000)));
        let rt = tokio::runtime::Handle::current();
        let token = self.0.token().to_string();
        let running = self.0.workers.running();
        if r.usage {
            let pids: Vec<u32> = running.iter().map(|w| w.2).collect();
            self.0.meter.keep_only(&pids);
        }
        let tasks: Vec<_> = running
            .into_iter()
            .map(|(rank, addr, pid)| {
                let conn = crate::rpc::client::WorkerConn::relayed(&rt, &addr, &token);
                let agent = self.0.clone();
                tokio::spawn(async move {
                    let mut ping = WorkerPing {
                        rank,
                        ..Default::default()
                    };
                    let got = match conn {
                        Ok(c) => tokio::time::timeout(limit, c.ping_as(r.epoch)).await,
                        Err(e) => Ok(Err(e)),
                    };
                    match got {
                        Ok(Ok((pid, epoch))) => {
                            ping.answered = true;
                            ping.pid = pid;
                            ping.epoch = epoch;
                        }
                        Ok(Err(e)) => ping.error = e.to_string(),
                        Err(_) => {}
                    }
                    if let Some((cpu, rss)) = r.usage.then(|| agent.meter.measure(pid)).flatten() {
                        (ping.measured, ping.cpu, ping.rss) = (true, cpu, rss);
                    }
                    ping
                })
            })
            .collect();
        let mut pings = Vec::with_capacity(tasks.len());
        for t in tasks {
            if let Ok(p) = t.await {
                pings.push(p);
            }
        }
        Ok(Response::new(PingWorkersReply { pings }))
    }

    async fn ping(
        &self,
        _req: Request<AgentPingRequest>,
    ) -> Result<Response<AgentPingReply>, Status> {
        Ok(Response::new(AgentPingReply {
            pid: std::process::id(),
            name: self.0.cfg.name.clone(),
            epoch: self.0.epoch.load(Ordering::SeqCst),
            watchers: self.0.watchers.load(Ordering::SeqCst) as u32,
            idle_left_ms: self
                .0
                .idle_left()
                .map_or(0, |d| (d.as_millis() as u64).max(1)),
            owner: lock(&self.0.owner).clone(),
        }))
    }

    async fn attach(&self, req: Request<AttachRequest>) -> Result<Response<AttachReply>, Status> {
        let a = &self.0;
        let r = req.into_inner();
        let at_least = r.at_least;
        let before = a
            .epoch
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                Some((e + 1).max(at_least))
            })
            .unwrap_or_default();
        let epoch = (before + 1).max(at_least);
        *lock(&a.owner) = r.owner;
        Ok(Response::new(AttachReply {
            epoch,
            name: a.cfg.name.clone(),
            meta: a.cfg.meta.clone(),
            workers: a.workers.list(),
            actors: lock(&a.actors).clone(),
        }))
    }

    async fn record_actor(
        &self,
        req: Request<ActorRecord>,
    ) -> Result<Response<RecordActorReply>, Status> {
        let r = req.into_inner();
        self.0.admit(r.epoch)?;
        let mut actors = lock(&self.0.actors);
        actors.retain(|a| a.name != r.name);
        actors.push(r);
        Ok(Response::new(RecordActorReply {}))
    }

    async fn forget_actor(
        &self,
        req: Request<ForgetActorRequest>,
    ) -> Result<Response<RecordActorReply>, Status> {
        let r = req.into_inner();
        self.0.admit(r.epoch)?;
        lock(&self.0.actors).retain(|a| a.name != r.name);
        Ok(Response::new(RecordActorReply {}))
    }

    async fn respawn_workers(
        &self,
        req: Request<RespawnWorkersRequest>,
    ) -> Result<Response<SpawnWorkersReply>, Status> {
        let r = req.into_inner();
        self.0.admit(r.epoch)?;
        let workers = self
            .0
            .workers
            .respawn(&r.ranks, self.0.events.clone())
            .await
            .map_err(|e| Status::failed_precondition(format!("cannot restart workers: {e}")))?;
        Ok(Response::new(SpawnWorkersReply { workers }))
    }
}

/// A started agent.
pub struct AgentHandle {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The shared state.
    pub agent: Arc<Agent>,
    done: Arc<Notify>,
}

impl AgentHandle {
    /// Blocks until the agent has stopped (its workers are gone).
    pub fn wait(&self, rt: &tokio::runtime::Handle) {
        let done = self.done.clone();
        rt.block_on(async move { done.notified().await });
    }
}

/// Starts an agent serving on `listener`.
pub fn start(
    rt: &tokio::runtime::Handle,
    cfg: AgentConfig,
    listener: std::net::TcpListener,
) -> Result<AgentHandle, AgentError> {
    let auth = TokenCheck::new(&cfg.token)?;
    let mut builder =
        crate::rpc::server_builder_with(cfg.tls.as_ref(), crate::rpc::Keepalive::Watchful)
            .map_err(|e| AgentError::Tls(e.to_string()))?;
    // Any connection this process opens to the mesh's workers checks them too (TLS-2).
    crate::rpc::tls::set_mesh_ca(&cfg.token, cfg.tls_ca.as_deref())
        .map_err(|e| AgentError::Tls(e.to_string()))?;
    std::fs::create_dir_all(&cfg.log_dir)?;
    let addr = listener.local_addr()?.to_string();
    listener.set_nonblocking(true)?;
    let (events, _) = broadcast::channel(EVENTS_BUFFERED);
    let agent = Arc::new(Agent {
        workers: Workers::new(
            cfg.name.clone(),
            cfg.token.clone(),
            cfg.log_dir.clone(),
            cfg.bind_host.clone(),
            process::tls_line(cfg.tls_ca.as_deref(), cfg.tls.as_ref()),
        ),
        cfg,
        events,
        watchers: AtomicUsize::new(0),
        detached_since: Mutex::new(Some(Instant::now())),
        ever_attached: Mutex::new(false),
        owner: Mutex::new(String::new()),
        stopping: watch::channel(false).0,
        epoch: AtomicU64::new(0),
        actors: Mutex::new(Vec::new()),
        spawns: Mutex::new(VecDeque::new()),
        meter: usage::Meter::default(),
    });
    let svc = tonic::service::interceptor::InterceptedService::new(
        // Records carry constructor arguments: the same limit as actor messages
        // (tonic's default is 4 MiB).
        HostAgentServer::new(Service(agent.clone()))
            .max_decoding_message_size(crate::rpc::MAX_MESSAGE_BYTES),
        auth.clone(),
    );
    // RELAY-1: the same port serves the Relay service, the relay of fanned-out calls.
    let relay = tonic::service::interceptor::InterceptedService::new(
        crate::proto::v1::relay_server::RelayServer::new(relay::Relay::new(agent.clone()))
            .max_decoding_message_size(crate::rpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::rpc::MAX_MESSAGE_BYTES),
        auth,
    );
    let done = Arc::new(Notify::new());
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (a2, done2) = (agent.clone(), done.clone());
    rt.spawn(async move {
        let a3 = a2.clone();
        // The idle clock (AGENT-2).
        let idle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if a3.idle_expired() {
                    a3.stop_all("idle timeout").await;
                    return;
                }
            }
        });
        let (a4, a5) = (a2.clone(), a2.clone());
        let server = builder
            .add_service(svc)
            .add_service(relay)
            .serve_with_incoming_shutdown(crate::rpc::incoming(listener), async move {
                a4.stopped().await;
                // Let the Shutdown reply reach its caller before the server goes.
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        // A client that never closes its connection must not keep the agent alive.
        tokio::select! {
            _ = server => {}
            _ = async move { a5.stopped().await; tokio::time::sleep(Duration::from_secs(2)).await } => {}
        }
        idle.abort();
        done2.notify_one();
    });
    Ok(AgentHandle { addr, agent, done })
}
