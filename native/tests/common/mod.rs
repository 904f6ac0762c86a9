//! What the native integration tests share: a runtime, a thread that plays the
//! dispatcher (echoes what it takes from the inbox, or counts and gates its runs), a
//! call to echo, and a TCP proxy on loopback that can stall its link (a partition).
// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use bytes::Bytes;
use monarch_kernel_native::proto::v1::{CallCommand, ReplyKind};
use monarch_kernel_native::rpc::client::Target;
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn echo_dispatcher(host: &WorkerHost, n: usize) -> std::thread::JoinHandle<()> {
    let inbox = host.inbox.clone();
    std::thread::spawn(move || {
        let lane = inbox.lane(LANE_LOOP).unwrap();
        let mut done = 0;
        while done < n {
            for item in lane.take_wait(Some(Duration::from_secs(5))) {
                inbox.reply(item.token, ReplyKind::Result, item.payload.clone(), vec![]);
                done += 1;
            }
        }
    })
}

pub fn target<'a>(payload: &'a Bytes) -> Target<'a> {
    Target {
        actor: "echo",
        method: "ping",
        payload,
        buffers: &[],
        oneway: false,
        dims: &[],
        sizes: &[],
        origin: "",
        command: CallCommand::Endpoint,
    }
}

/// A loopback proxy to `upstream` whose link can be cut (bytes stall both ways, new
/// connections hang) and healed.
pub struct Proxy {
    pub addr: String,
    cut: Arc<AtomicBool>,
    /// Set: every connection closes, and the port refuses (the worker's process gone).
    dead: Arc<AtomicBool>,
    /// Bumped: the connections made before close (their server went away).
    generation: Arc<std::sync::atomic::AtomicU64>,
    /// Where new connections go.
    pub upstream: Arc<Mutex<String>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub fn start(rt: &tokio::runtime::Runtime, upstream: String) -> Proxy {
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let upstream = Arc::new(Mutex::new(upstream));
        let dead = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (c2, u2, d2, g2) = (
            cut.clone(),
            upstream.clone(),
            dead.clone(),
            generation.clone(),
        );
        let task = rt.spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let (cut, upstream, dead) = (c2.clone(), u2.clone(), d2.clone());
                let generation = g2.clone();
                tokio::spawn(async move {
                    while cut.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let to = upstream.lock().unwrap().clone();
                    let Ok(up) = TcpStream::connect(&to).await else {
                        return;
                    };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let born = generation.load(Ordering::SeqCst);
                    let ends = Ends {
                        dead,
                        generation,
                        born,
                    };
                    tokio::spawn(pump(dr, uw, cut.clone(), ends.clone()));
                    tokio::spawn(pump(ur, dw, cut, ends));
                });
            }
        });
        Proxy {
            addr,
            cut,
            dead,
            generation,
            upstream,
            task,
        }
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Closes the connections made so far, as a server that went away does.
    pub fn close_connections(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Closes every connection and the port, as a worker's process that exits does.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}

/// When a proxied connection ends: the proxy is killed, or it closes the connections
/// of `born`'s generation.
#[derive(Clone)]
struct Ends {
    dead: Arc<AtomicBool>,
    generation: Arc<std::sync::atomic::AtomicU64>,
    born: u64,
}

impl Ends {
    fn now(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || self.generation.load(Ordering::SeqCst) != self.born
    }
}

/// Copies `from` to `to`, holding every byte while the link is cut; returns (closing
/// both) once its connection [`Ends`].
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
    ends: Ends,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = async { while !ends.now() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            } } => return,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A dispatcher that runs each call it takes (counting runs by payload), replying
/// after `delay` and only once `gate` is open.
pub fn counting_dispatcher(
    host: &WorkerHost,
    runs: Arc<Mutex<HashMap<Bytes, usize>>>,
    gate: Arc<AtomicBool>,
) {
    let inbox = host.inbox.clone();
    std::thread::spawn(move || {
        let Some(lane) = inbox.lane(LANE_LOOP) else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            for item in lane.take_wait(Some(Duration::from_millis(100))) {
                *runs
                    .lock()
                    .unwrap()
                    .entry(item.payload.clone())
                    .or_default() += 1;
                while !gate.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                inbox.reply(item.token, ReplyKind::Result, item.payload.clone(), vec![]);
            }
        }
    });
}

/// How many times each payload ran (the [`counting_dispatcher`]'s count).
pub type Runs = Arc<Mutex<HashMap<Bytes, usize>>>;

/// A worker behind a [`Proxy`], with a [`counting_dispatcher`] whose replies wait
/// for `gate`, and a connection to it through the proxy.
pub struct Behind {
    pub host: WorkerHost,
    pub runs: Runs,
    pub gate: Arc<AtomicBool>,
    pub proxy: Proxy,
    pub conn: monarch_kernel_native::rpc::client::WorkerConn,
}

/// A [`Behind`] on `rt`, the mesh token "tok".
pub fn behind_proxy(rt: &tokio::runtime::Runtime) -> Behind {
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let runs: Runs = Arc::default();
    let gate = Arc::new(AtomicBool::new(false));
    counting_dispatcher(&host, runs.clone(), gate.clone());
    let proxy = Proxy::start(rt, host.addr.clone());
    let conn =
        monarch_kernel_native::rpc::client::WorkerConn::open(rt.handle(), &proxy.addr, "tok")
            .unwrap();
    Behind {
        host,
        runs,
        gate,
        proxy,
        conn,
    }
}

/// Waits until `payload` has run (or fails the test after 20 s).
pub fn wait_ran(runs: &Runs, payload: &Bytes) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !runs.lock().unwrap().contains_key(payload) {
        assert!(Instant::now() < deadline, "{payload:?} never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
}
