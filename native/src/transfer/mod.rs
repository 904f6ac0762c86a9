//! The transfer engine: the data plane. Buffers are *registered* where they live; a
//! small [`Descriptor`] travels in the gRPC message; the receiver pulls the bytes
//! straight into memory it allocated, with no Python involved.
//!
//! - On one host (same boot id and pid namespace) the receiver reads the sender's
//!   memory with `process_vm_readv`: one copy. Where the kernel forbids it (Yama, no
//!   CAP_SYS_PTRACE), it falls back to TCP.
//! - Otherwise, TCP: the range is split over several connections (`streams`), each
//!   writing straight into its part of the destination.
//!
//! XFER-1: a registration lives until its readers have released it (or it expires,
//! for readers that died), and its memory stays valid while it is registered; a
//! receiver confirms with `Release` after a local read, so data read from a buffer
//! released meanwhile is reported, never used.
//! XFER-2: a message carries its buffers as they were when it was sent: the receiver
//! pulls them as the message arrives ([`prefetch`]), and the sender waits for its
//! registrations to end before it goes on.
//! XFER-3: every connection starts with a handshake proving knowledge of the mesh
//! token (HMAC-SHA256 over a fresh nonce, so a recorded handshake cannot be
//! replayed; without a fresh nonce there is no handshake, never a predictable
//! one); frames are checked ([`frame`]) before anything is allocated or read, and a
//! bad frame closes the connection and is counted.
//!
//! One concern per module: `descriptor` (what travels), `auth` (the handshake,
//! XFER-3), `host` (locality), `registry` (registrations, XFER-1), `server` and
//! `client` (TCP), `local` (`process_vm_readv`), `prefetch` (XFER-2), [`frame`]
//! (control frames) and [`recv`] (the memory transfers land in).

mod auth;
mod client;
mod descriptor;
pub mod frame;
mod host;
mod local;
mod prefetch;
pub mod recv;
mod registry;
mod server;

pub use auth::token_id;
pub use client::{streams, DEFAULT_STREAMS, STREAMS_ENV};
pub use descriptor::Descriptor;
pub use prefetch::{
    discard_message, prefetch, prefetched_count, take_message, take_prefetched, HEADER,
};
pub use registry::{Stats, Waited, HANDLE};
pub use server::{open_connections, HANDSHAKE_WINDOW, MAX_CONNECTIONS};

use crate::sync::lock;
use frame::MAC_LEN;
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

/// Errors of the data plane.
#[derive(Debug, Clone, thiserror::Error)]
pub enum XferError {
    /// Connecting, reading or writing failed (the peer died, the network broke).
    #[error("transfer from {addr} failed: {reason}")]
    Io {
        /// The sender's engine.
        addr: String,
        /// What happened.
        reason: String,
    },
    /// The peer answered with an error status.
    #[error("transfer from {addr} refused: {what}")]
    Refused {
        /// The sender's engine.
        addr: String,
        /// Why.
        what: String,
    },
    /// The descriptor or the destination is unusable.
    #[error("{0}")]
    Invalid(String),
    /// No fresh nonce for a handshake (XFER-3): the random source cannot be read.
    #[error(
        "the transfer engine cannot make a handshake nonce: {0}; \
         the process needs a readable /dev/urandom"
    )]
    NoNonce(String),
    /// This process's engine cannot start; it is tried again on next use.
    #[error("the transfer engine cannot {what}: {reason}; {next}")]
    Setup {
        /// What it could not do.
        what: String,
        /// The system's reason.
        reason: String,
        /// What to do about it.
        next: &'static str,
    },
}

/// This process's engine.
pub struct Engine {
    /// `HOST:PORT` of the listener: what descriptors tell readers to connect to.
    addr: String,
    /// Where this process runs: decides which descriptors are read directly.
    host: host::Host,
    /// The registrations, by id (XFER-1); each entry keeps its memory valid.
    table: Mutex<HashMap<u64, Arc<registry::Entry>>>,
    /// Notified whenever registrations end (or [`Engine::wake`]), for waiters.
    ended: std::sync::Condvar,
    /// Tokens registrations were made under, by token id: the handshake (XFER-3)
    /// checks a peer's MAC against them.
    tokens: Mutex<HashMap<[u8; MAC_LEN], Vec<u8>>>,
    /// The next registration id (the start is random: ids of two runs differ).
    next_id: AtomicU64,
    /// Idle authenticated connections to other engines, reused by later reads.
    pool: Mutex<client::ConnPool>,
    /// Counters.
    pub stats: Stats,
}

/// Where the engine listens (an address of this host; a free port is picked).
const HOST_ENV: &str = "MONARCH_TRANSFER_HOST";
const DEFAULT_HOST: &str = "127.0.0.1";

/// This process's engine, started (listening) on first use, on `MONARCH_TRANSFER_HOST`
/// (default 127.0.0.1) and a free port.
///
/// A failure to start is not cached: the next call tries again. What makes it fail
/// (a `MONARCH_TRANSFER_HOST` that is not an address of this host, no file
/// descriptors or threads left, no random source) can be fixed while the process
/// lives, and a kernel should not need a restart for that; a failed try costs one
/// `bind`, and only while there is no engine.
pub fn engine() -> Result<&'static Engine, XferError> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    /// One start at a time, so that a process makes one listener.
    static STARTING: Mutex<()> = Mutex::new(());
    if let Some(e) = ENGINE.get() {
        return Ok(e);
    }
    let _one = lock(&STARTING);
    if let Some(e) = ENGINE.get() {
        return Ok(e);
    }
    let host = std::env::var(HOST_ENV).unwrap_or_else(|_| DEFAULT_HOST.into());
    let (engine, listener) = Engine::start(&host)?;
    // The accept thread starts before the engine is published, so that a failure
    // leaves nothing half made; it serves once it is handed the engine.
    let (tx, rx) = std::sync::mpsc::sync_channel::<&'static Engine>(1);
    std::thread::Builder::new()
        .name("monarch-xfer-accept".into())
        .spawn(move || {
            if let Ok(e) = rx.recv() {
                server::serve(e, listener);
            }
        })
        .map_err(|e| XferError::Setup {
            what: "start its accept thread".into(),
            reason: e.to_string(),
            next: "the process is out of threads or memory; free some, then try again",
        })?;
    let e = ENGINE.get_or_init(|| engine);
    let _ = tx.send(e);
    Ok(e)
}

impl Engine {
    /// A new engine listening on `host` (on a free port), and its listener.
    fn start(host: &str) -> Result<(Engine, TcpListener), XferError> {
        let setup = |what: String, e: std::io::Error| XferError::Setup {
            what,
            reason: e.to_string(),
            next: "set MONARCH_TRANSFER_HOST to an address of this host (it is 127.0.0.1 \
                   unless set) and check that the process may open sockets, then try again",
        };
        let listener =
            TcpListener::bind((host, 0)).map_err(|e| setup(format!("listen on {host}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| setup(format!("tell where it listens on {host}"), e))?
            .to_string();
        // No random source, no handshake (XFER-3): an engine would refuse every peer.
        let n = auth::nonce()?;
        // Not a secret: a random start only keeps the ids of two runs apart.
        let first = u64::from_le_bytes([n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]]) >> 16;
        let engine = Engine {
            addr,
            host: host::Host::this(),
            table: Mutex::new(HashMap::new()),
            ended: std::sync::Condvar::new(),
            tokens: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(first.max(1)),
            pool: Mutex::new(HashMap::new()),
            stats: Stats::default(),
        };
        Ok((engine, listener))
    }

    /// `HOST:PORT` of this engine.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_that_cannot_listen_says_where_and_what_to_do() {
        // 192.0.2.1 (TEST-NET-1) is no address of this host.
        let Err(err) = Engine::start("192.0.2.1") else {
            panic!("listened on an address that is not this host's")
        };
        let msg = err.to_string();
        assert!(matches!(err, XferError::Setup { .. }), "{err:?}");
        assert!(msg.contains("cannot listen on 192.0.2.1"), "{msg}");
        assert!(msg.contains("MONARCH_TRANSFER_HOST"), "{msg}");
        assert!(
            engine().is_ok(),
            "the process's own engine starts on 127.0.0.1"
        );
    }
}
