//! The transfer engine: the data plane. Buffers are *registered* where they live; a
//! small [`Descriptor`] travels in the gRPC message; the receiver pulls the bytes
//! straight into memory it allocated, with no Python involved.
//!
//! - On one host (same boot id and pid namespace) the receiver reads the sender's
//!   memory with `process_vm_readv`: one copy. Where the kernel forbids it (Yama,
//!   no CAP_SYS_PTRACE), it falls back to TCP.
//! - Otherwise, TCP: the range is split over several connections (`streams`), each
//!   writing straight into its part of the destination.
//!
//! XFER-1: a registration lives until its readers have released it (or it expires,
//! for readers that died), and its memory stays valid while it is registered; a
//! receiver confirms with `Release` after a local read, so data read from a buffer
//! released meanwhile is reported, never used.
//! XFER-2: every connection starts with a handshake proving knowledge of the mesh
//! token (HMAC-SHA256 over a fresh nonce, so a recorded handshake cannot be
//! replayed); frames are checked ([`frame`]) before anything is allocated or read,
//! and a bad frame closes the connection and is counted.

pub mod frame;
pub mod recv;

use frame::{Request, Status, MAC_LEN};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

type HmacSha256 = Hmac<Sha256>;

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
}

/// Where a registered buffer is, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The sender's boot id (hosts differ when these differ).
    pub host: [u8; 16],
    /// The sender's pid namespace (pids mean something only within one).
    pub pidns: u64,
    /// The sender's pid.
    pub pid: u32,
    /// The sender's engine, `HOST:PORT`.
    pub addr: String,
    /// Registration id.
    pub id: u64,
    /// Address of the buffer in the sender.
    pub ptr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// SHA-256 of the mesh token it is registered under.
    pub token_id: [u8; MAC_LEN],
}

const DESC_MAGIC: &[u8; 4] = b"MKXD";
const DESC_VERSION: u8 = 1;

impl Descriptor {
    /// The wire form (what travels in place of the buffer).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.addr.len());
        out.extend_from_slice(DESC_MAGIC);
        out.push(DESC_VERSION);
        out.extend_from_slice(&self.host);
        out.extend_from_slice(&self.pidns.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.ptr.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.token_id);
        out.push(self.addr.len() as u8);
        out.extend_from_slice(self.addr.as_bytes());
        out
    }

    /// Parses the wire form; anything malformed is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Descriptor, XferError> {
        let bad = || XferError::Invalid("malformed transfer descriptor".into());
        const FIXED: usize = 4 + 1 + 16 + 8 + 4 + 8 + 8 + 8 + MAC_LEN + 1;
        if b.len() < FIXED || &b[..4] != DESC_MAGIC || b[4] != DESC_VERSION {
            return Err(bad());
        }
        let mut at = 5;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let host: [u8; 16] = take(16).try_into().map_err(|_| bad())?;
        let pidns = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let pid = u32::from_le_bytes(take(4).try_into().map_err(|_| bad())?);
        let id = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let ptr = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let len = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let token_id: [u8; MAC_LEN] = take(MAC_LEN).try_into().map_err(|_| bad())?;
        let alen = take(1)[0] as usize;
        if b.len() != FIXED + alen {
            return Err(bad());
        }
        let addr = std::str::from_utf8(&b[FIXED..])
            .map_err(|_| bad())?
            .to_string();
        Ok(Descriptor {
            host,
            pidns,
            pid,
            addr,
            id,
            ptr,
            len,
            token_id,
        })
    }

    /// True if the buffer lives in a process this one can read directly.
    fn is_local(&self) -> bool {
        let me = engine();
        self.host == me.host && self.pidns == me.pidns
    }
}

/// SHA-256 of a token: how registrations and handshakes name a mesh.
pub fn token_id(token: &[u8]) -> [u8; MAC_LEN] {
    Sha256::digest(token).into()
}

fn mac(token: &[u8], nonce: &[u8]) -> [u8; MAC_LEN] {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes any key length");
    m.update(nonce);
    m.finalize().into_bytes().into()
}

/// `readers` of a registration behind an explicit handle (a Python `TransferBuffer`):
/// reads do not count it down; one `Release` (the handle's `drop()`) ends it.
pub const HANDLE: u32 = u32::MAX;

/// A registered buffer. `_keep` owns whatever keeps `ptr..ptr+len` valid.
struct Entry {
    ptr: usize,
    len: usize,
    writable: bool,
    token_id: [u8; MAC_LEN],
    /// Releases still expected; 0 means "until dropped".
    readers: std::sync::atomic::AtomicU32,
    expires: Option<Instant>,
    _keep: Box<dyn Send + Sync>,
}

/// Counters, for tests and `make bench`.
#[derive(Default)]
pub struct Stats {
    /// Frames refused as malformed or out of range.
    pub rejected_frames: AtomicU64,
    /// Handshakes that failed.
    pub denied: AtomicU64,
    /// Reads served over TCP (bytes).
    pub bytes_sent: AtomicU64,
    /// Reads done with process_vm_readv (bytes).
    pub bytes_local: AtomicU64,
    /// Reads done over TCP by this process (bytes).
    pub bytes_tcp: AtomicU64,
}

/// Idle authenticated connections, by peer address and token id.
type ConnPool = HashMap<(String, [u8; MAC_LEN]), Vec<TcpStream>>;

/// This process's engine.
pub struct Engine {
    addr: String,
    host: [u8; 16],
    pidns: u64,
    table: Mutex<HashMap<u64, Arc<Entry>>>,
    /// Notified whenever registrations end ([`Engine::wait_gone`]).
    ended: std::sync::Condvar,
    tokens: Mutex<HashMap<[u8; MAC_LEN], Vec<u8>>>,
    next_id: AtomicU64,
    pool: Mutex<ConnPool>,
    /// Counters.
    pub stats: Stats,
}

fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = text.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
    }
    out
}

fn pidns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

fn nonce() -> [u8; MAC_LEN] {
    let mut n = [0u8; MAC_LEN];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut n);
    }
    n
}

/// `MONARCH_TRANSFER_TCP=1`: use the TCP path even on one host (to measure or test
/// it; read once per process).
fn force_tcp() -> bool {
    static FORCE: OnceLock<bool> = OnceLock::new();
    *FORCE.get_or_init(|| std::env::var("MONARCH_TRANSFER_TCP").is_ok_and(|v| v == "1"))
}

/// This process's engine, started (listening) on first use. The listening address
/// is `MONARCH_TRANSFER_HOST` (default 127.0.0.1) on a free port.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    static STARTED: OnceLock<()> = OnceLock::new();
    let e = ENGINE.get_or_init(|| {
        let host = std::env::var("MONARCH_TRANSFER_HOST").unwrap_or_else(|_| "127.0.0.1".into());
        let listener =
            TcpListener::bind((host.as_str(), 0)).expect("the transfer engine cannot listen");
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let first = u64::from_le_bytes(nonce()[..8].try_into().unwrap_or([1; 8])) >> 16;
        LISTENER.set(Mutex::new(Some(listener))).ok();
        Engine {
            addr,
            host: boot_id(),
            pidns: pidns(),
            table: Mutex::new(HashMap::new()),
            ended: std::sync::Condvar::new(),
            tokens: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(first.max(1)),
            pool: Mutex::new(HashMap::new()),
            stats: Stats::default(),
        }
    });
    STARTED.get_or_init(|| {
        let l = LISTENER
            .get()
            .and_then(|m| m.lock().ok().and_then(|mut g| g.take()));
        if let Some(l) = l {
            std::thread::Builder::new()
                .name("monarch-xfer-accept".into())
                .spawn(move || serve(l))
                .expect("cannot start the transfer engine");
        }
    });
    e
}

static LISTENER: OnceLock<Mutex<Option<TcpListener>>> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// `HOST:PORT` of this engine.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Registers `len` bytes at `ptr`, kept valid by `keep` until the registration
    /// ends: after `readers` releases (0: only [`Engine::drop_id`]), or `ttl`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and, if `writable`, writable) while `keep`
    /// lives.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn register(
        &self,
        ptr: usize,
        len: usize,
        writable: bool,
        token: &[u8],
        readers: u32,
        ttl: Option<Duration>,
        keep: Box<dyn Send + Sync>,
    ) -> Descriptor {
        self.sweep();
        let tid = token_id(token);
        lock(&self.tokens)
            .entry(tid)
            .or_insert_with(|| token.to_vec());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            ptr,
            len,
            writable,
            token_id: tid,
            readers: std::sync::atomic::AtomicU32::new(readers),
            expires: ttl.map(|t| Instant::now() + t),
            _keep: keep,
        };
        lock(&self.table).insert(id, Arc::new(entry));
        Descriptor {
            host: self.host,
            pidns: self.pidns,
            pid: std::process::id(),
            addr: self.addr.clone(),
            id,
            ptr: ptr as u64,
            len: len as u64,
            token_id: tid,
        }
    }

    /// Ends registration `id` now. True if it was registered.
    pub fn drop_id(&self, id: u64) -> bool {
        let e = lock(&self.table).remove(&id);
        self.ended.notify_all();
        e.is_some() // dropped here, outside the lock
    }

    /// Waits until none of `ids` is registered (each was read by all its readers,
    /// dropped or expired), at most `timeout`. True if they all ended.
    pub fn wait_gone(&self, ids: &[u64], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut t = lock(&self.table);
        while ids.iter().any(|i| t.contains_key(i)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            t = self
                .ended
                .wait_timeout(t, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// How many registrations are live.
    pub fn registered(&self) -> usize {
        self.sweep();
        lock(&self.table).len()
    }

    fn sweep(&self) {
        let now = Instant::now();
        let gone: Vec<Arc<Entry>> = {
            let mut t = lock(&self.table);
            let ids: Vec<u64> = t
                .iter()
                .filter(|(_, e)| e.expires.is_some_and(|x| x <= now))
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter().filter_map(|id| t.remove(&id)).collect()
        };
        if !gone.is_empty() {
            self.ended.notify_all();
        }
        drop(gone);
    }

    fn release(&self, id: u64, tid: &[u8; MAC_LEN]) -> Status {
        let gone = {
            let mut t = lock(&self.table);
            let Some(e) = t.get(&id) else {
                return Status::Unknown;
            };
            if &e.token_id != tid {
                return Status::Denied;
            }
            let left = e.readers.load(Ordering::SeqCst);
            if left == 0 {
                return Status::Ok; // lives until dropped
            }
            if left == HANDLE {
                return match t.remove(&id) {
                    Some(gone) => {
                        drop(t);
                        self.ended.notify_all();
                        drop(gone);
                        Status::Ok
                    }
                    None => Status::Unknown,
                };
            }
            if e.readers.fetch_sub(1, Ordering::SeqCst) > 1 {
                return Status::Ok;
            }
            t.remove(&id)
        };
        self.ended.notify_all();
        drop(gone); // the keep-alive goes outside the lock (it may take the GIL)
        Status::Ok
    }

    fn lookup(&self, id: u64, tid: &[u8; MAC_LEN]) -> Result<Arc<Entry>, Status> {
        let t = lock(&self.table);
        match t.get(&id) {
            None => Err(Status::Unknown),
            Some(e) if &e.token_id != tid => Err(Status::Denied),
            Some(e) => Ok(e.clone()),
        }
    }
}

// -- server ------------------------------------------------------------------------

fn serve(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let _ = std::thread::Builder::new()
            .name("monarch-xfer-conn".into())
            .spawn(move || {
                let _ = handle(conn);
            });
    }
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Result<Request, frame::FrameError>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = match frame::check_len(u32::from_le_bytes(len)) {
        Ok(n) => n,
        Err(e) => return Ok(Err(e)),
    };
    let mut body = [0u8; frame::MAX_FRAME];
    s.read_exact(&mut body[..len])?;
    Ok(frame::decode(&body[..len]))
}

fn reply(s: &mut TcpStream, status: Status, msg: &str) -> std::io::Result<()> {
    let msg = &msg.as_bytes()[..msg.len().min(512)];
    s.write_all(&frame::status_header(status, msg.len() as u64))?;
    s.write_all(msg)
}

fn handle(mut s: TcpStream) -> std::io::Result<()> {
    let e = engine();
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let n = nonce();
    s.write_all(&n)?;
    // XFER-2: the first frame must prove the token.
    let tid = match read_frame(&mut s)? {
        Ok(Request::Hello { token_id, mac: m }) => {
            let token = lock(&e.tokens).get(&token_id).cloned();
            let ok = token.is_some_and(|t| {
                use subtle::ConstantTimeEq;
                mac(&t, &n).ct_eq(&m).into()
            });
            if !ok {
                e.stats.denied.fetch_add(1, Ordering::Relaxed);
                return reply(&mut s, Status::Denied, "handshake failed: wrong mesh token");
            }
            reply(&mut s, Status::Ok, "")?;
            token_id
        }
        Ok(_) | Err(_) => {
            e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            return reply(
                &mut s,
                Status::Denied,
                "the first frame must be a handshake",
            );
        }
    };
    s.set_read_timeout(None)?;
    loop {
        let req = match read_frame(&mut s) {
            Ok(Ok(r)) => r,
            Ok(Err(err)) => {
                e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                return reply(&mut s, Status::Malformed, &err.to_string());
            }
            Err(_) => return Ok(()), // the peer went away
        };
        match req {
            Request::Hello { .. } => {
                e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                return reply(&mut s, Status::Malformed, "a second handshake");
            }
            Request::Release { id } => {
                let st = e.release(id, &tid);
                reply(&mut s, st, "")?;
            }
            Request::Read { id, offset, len } | Request::Write { id, offset, len } => {
                let write = matches!(req, Request::Write { .. });
                let entry = match e.lookup(id, &tid) {
                    Ok(x) => x,
                    Err(st) => {
                        if write {
                            return reply(&mut s, st, "no such buffer"); // its bytes follow: close
                        }
                        reply(&mut s, st, "no such buffer")?;
                        continue;
                    }
                };
                let end = offset.checked_add(len);
                if end.is_none_or(|x| x > entry.len as u64) || (write && !entry.writable) {
                    e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
                    let what = if write && !entry.writable {
                        "the buffer is read-only"
                    } else {
                        "range outside the buffer"
                    };
                    return reply(&mut s, Status::OutOfRange, what);
                }
                let (off, n) = (offset as usize, len as usize);
                if write {
                    // SAFETY: range checked above; `entry` keeps the memory alive and
                    // it was registered writable.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut((entry.ptr + off) as *mut u8, n) };
                    s.read_exact(dst)?;
                    reply(&mut s, Status::Ok, "")?;
                } else {
                    s.write_all(&frame::status_header(Status::Ok, len))?;
                    // SAFETY: range checked above; `entry` keeps the memory alive.
                    let src =
                        unsafe { std::slice::from_raw_parts((entry.ptr + off) as *const u8, n) };
                    s.write_all(src)?;
                    e.stats.bytes_sent.fetch_add(len, Ordering::Relaxed);
                }
            }
        }
    }
}

// -- client ------------------------------------------------------------------------

fn io_err(addr: &str, e: impl std::fmt::Display) -> XferError {
    XferError::Io {
        addr: addr.to_string(),
        reason: e.to_string(),
    }
}

fn read_status(s: &mut TcpStream, addr: &str) -> Result<(Status, u64), XferError> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).map_err(|e| io_err(addr, e))?;
    let st = Status::from_u8(h[0]).ok_or_else(|| io_err(addr, "bad status byte"))?;
    let len = u64::from_le_bytes(h[1..].try_into().unwrap_or([0; 8]));
    Ok((st, len))
}

fn refused(s: &mut TcpStream, addr: &str, st: Status, len: u64) -> XferError {
    let mut msg = vec![0u8; (len as usize).min(512)];
    let _ = s.read_exact(&mut msg);
    XferError::Refused {
        addr: addr.to_string(),
        what: format!("{st:?}: {}", String::from_utf8_lossy(&msg)),
    }
}

impl Engine {
    fn connect(&self, addr: &str, token: &[u8]) -> Result<TcpStream, XferError> {
        let tid = token_id(token);
        if let Some(s) = lock(&self.pool)
            .get_mut(&(addr.to_string(), tid))
            .and_then(Vec::pop)
        {
            return Ok(s);
        }
        let mut s = TcpStream::connect(addr).map_err(|e| io_err(addr, e))?;
        s.set_nodelay(true).map_err(|e| io_err(addr, e))?;
        let mut n = [0u8; MAC_LEN];
        s.read_exact(&mut n).map_err(|e| io_err(addr, e))?;
        let hello = frame::encode(&Request::Hello {
            token_id: tid,
            mac: mac(token, &n),
        });
        s.write_all(&hello).map_err(|e| io_err(addr, e))?;
        match read_status(&mut s, addr)? {
            (Status::Ok, _) => Ok(s),
            (st, len) => Err(refused(&mut s, addr, st, len)),
        }
    }

    fn put_back(&self, addr: &str, token: &[u8], s: TcpStream) {
        let mut pool = lock(&self.pool);
        let v = pool.entry((addr.to_string(), token_id(token))).or_default();
        if v.len() < 16 {
            v.push(s);
        }
    }

    fn read_range(
        &self,
        d: &Descriptor,
        token: &[u8],
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), XferError> {
        let mut s = self.connect(&d.addr, token)?;
        let req = frame::encode(&Request::Read {
            id: d.id,
            offset,
            len: dst.len() as u64,
        });
        s.write_all(&req).map_err(|e| io_err(&d.addr, e))?;
        match read_status(&mut s, &d.addr)? {
            (Status::Ok, n) if n == dst.len() as u64 => {
                s.read_exact(dst).map_err(|e| io_err(&d.addr, e))?;
                self.put_back(&d.addr, token, s);
                Ok(())
            }
            (Status::Ok, n) => Err(io_err(
                &d.addr,
                format!("sent {n} bytes, not {}", dst.len()),
            )),
            (st, len) => Err(refused(&mut s, &d.addr, st, len)),
        }
    }

    fn request(
        &self,
        d: &Descriptor,
        token: &[u8],
        req: Request,
        body: &[u8],
    ) -> Result<(), XferError> {
        let mut s = self.connect(&d.addr, token)?;
        s.write_all(&frame::encode(&req))
            .map_err(|e| io_err(&d.addr, e))?;
        s.write_all(body).map_err(|e| io_err(&d.addr, e))?;
        match read_status(&mut s, &d.addr)? {
            (Status::Ok, _) => {
                self.put_back(&d.addr, token, s);
                Ok(())
            }
            (st, len) => Err(refused(&mut s, &d.addr, st, len)),
        }
    }

    /// Reads the whole buffer `d` into `dst` (exactly `d.len` bytes), then releases
    /// it (XFER-1). Blocking; call without the GIL.
    pub fn fetch(
        &self,
        d: &Descriptor,
        token: &[u8],
        dst: &mut [u8],
        streams: usize,
    ) -> Result<(), XferError> {
        self.fetch_as(d, token, dst, streams, false)
    }

    /// [`Engine::fetch`] into new memory: a pooled [`recv::Region`] of `d.len` bytes.
    pub fn fetch_new(
        &self,
        d: &Descriptor,
        token: &[u8],
        streams: usize,
    ) -> Result<recv::Region, XferError> {
        let region = recv::Region::new(d.len as usize).map_err(|e| XferError::Io {
            addr: d.addr.clone(),
            reason: format!("cannot allocate {} bytes: {e}", d.len),
        })?;
        // SAFETY: the region is ours, `len` bytes long.
        let dst = unsafe { std::slice::from_raw_parts_mut(region.ptr(), region.len()) };
        self.fetch(d, token, dst, streams)?;
        Ok(region)
    }

    /// [`Engine::fetch`]; with `handle`, the registration is an explicit handle's
    /// ([`HANDLE`]) and is confirmed, not released, after the read.
    pub fn fetch_as(
        &self,
        d: &Descriptor,
        token: &[u8],
        dst: &mut [u8],
        streams: usize,
        handle: bool,
    ) -> Result<(), XferError> {
        if dst.len() as u64 != d.len {
            return Err(XferError::Invalid(format!(
                "destination has {} bytes, the buffer {}",
                dst.len(),
                d.len
            )));
        }
        if d.token_id != token_id(token) {
            return Err(XferError::Invalid(
                "the buffer belongs to another mesh".into(),
            ));
        }
        let local = d.is_local() && !force_tcp() && vm_read_parallel(d.pid, d.ptr, dst).is_ok();
        if local {
            self.stats.bytes_local.fetch_add(d.len, Ordering::Relaxed);
        } else {
            self.fetch_tcp(d, token, dst, streams)?;
            self.stats.bytes_tcp.fetch_add(d.len, Ordering::Relaxed);
        }
        // Confirms the registration was alive throughout a local read (a handle's
        // registration is confirmed by a zero-length read instead: it must stay).
        let confirm = if handle {
            Request::Read {
                id: d.id,
                offset: 0,
                len: 0,
            }
        } else {
            Request::Release { id: d.id }
        };
        match self.request(d, token, confirm, &[]) {
            Ok(()) => Ok(()),
            Err(e) if local => Err(XferError::Invalid(format!(
                "the buffer is no longer there: it was dropped (by its owner or a holder) \
                 or its sender let go of it during the transfer ({e})"
            ))),
            Err(_) => Ok(()), // the TCP read itself was served from a live registration
        }
    }

    fn fetch_tcp(
        &self,
        d: &Descriptor,
        token: &[u8],
        dst: &mut [u8],
        streams: usize,
    ) -> Result<(), XferError> {
        const MIN_CHUNK: usize = 4 << 20;
        let n = streams
            .clamp(1, 32)
            .min(dst.len().div_ceil(MIN_CHUNK).max(1));
        if n == 1 {
            return self.read_range(d, token, 0, dst);
        }
        in_parts(dst, n, |offset, part| {
            self.read_range(d, token, offset as u64, part)
        })
        .unwrap_or_else(|| Err(XferError::Invalid("a transfer thread panicked".into())))
    }

    /// Writes `src` into the (writable) buffer `d` at `offset`.
    pub fn write_into(
        &self,
        d: &Descriptor,
        token: &[u8],
        offset: u64,
        src: &[u8],
    ) -> Result<(), XferError> {
        if offset
            .checked_add(src.len() as u64)
            .is_none_or(|e| e > d.len)
        {
            return Err(XferError::Invalid(
                "the write falls outside the buffer".into(),
            ));
        }
        let req = Request::Write {
            id: d.id,
            offset,
            len: src.len() as u64,
        };
        self.request(d, token, req, src)
    }

    /// Ends the registration `d` at its owner (any process of the mesh may).
    pub fn release_remote(&self, d: &Descriptor, token: &[u8]) -> Result<(), XferError> {
        self.request(d, token, Request::Release { id: d.id }, &[])
    }
}

/// How a message whose buffers went through the engine starts (Python's
/// `_buffers.HEADER`), then a little-endian u32 count and that many u32 indices of
/// the buffers that are descriptors.
pub const HEADER: &[u8; 4] = b"\x00MKX";

/// The descriptor indices of a message's `payload`, if it has [`HEADER`].
fn header_indices(payload: &[u8]) -> Option<Vec<usize>> {
    let rest = payload.strip_prefix(HEADER.as_slice())?;
    let count = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let list = rest.get(4..4usize.checked_add(count.checked_mul(4)?)?)?;
    Some(
        list.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect(),
    )
}

/// Buffers pulled when their message arrived, by descriptor, until taken.
type Prefetched = HashMap<Vec<u8>, (Instant, recv::Region)>;

fn prefetched() -> &'static Mutex<Prefetched> {
    static P: OnceLock<Mutex<Prefetched>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How long a pulled buffer waits for its message to be unpickled (as long as a
/// sender keeps a registration).
const PREFETCH_KEEP: Duration = Duration::from_secs(300);

/// XFER-2: pulls the buffers of a message as it arrives (a call, on the worker; a
/// reply, on the caller), before it waits its turn, so that the sender's memory is
/// read at once and its registrations end: the sender waits for that before it
/// goes on (`Engine::wait_gone`), so what a message carries is what its buffers held
/// when it was sent. Blocking; errors are left for the unpickler to meet again.
pub fn prefetch(payload: &[u8], buffers: &[bytes::Bytes], token: &[u8]) {
    let Some(indices) = header_indices(payload) else {
        return;
    };
    let streams = std::env::var("MONARCH_TRANSFER_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4usize);
    for i in indices {
        let Some(raw) = buffers.get(i) else { continue };
        let Ok(d) = Descriptor::decode(raw) else {
            continue;
        };
        if let Ok(region) = engine().fetch_new(&d, token, streams) {
            let now = Instant::now();
            let mut p = lock(prefetched());
            p.retain(|_, (at, _)| now.duration_since(*at) < PREFETCH_KEEP);
            p.insert(raw.to_vec(), (now, region));
        }
    }
}

/// How many pulled buffers wait for their message to be taken (tests, stats).
pub fn prefetched_count() -> usize {
    lock(prefetched()).len()
}

/// The buffer [`prefetch`] pulled for descriptor `desc`, if it did.
pub fn take_prefetched(desc: &[u8]) -> Option<recv::Region> {
    lock(prefetched()).remove(desc).map(|(_, r)| r)
}

/// For each buffer of a message: the region [`prefetch`] pulled for it, taken out of
/// the table (so that it lives with the message from now on), or `None`.
pub fn take_message(payload: &[u8], buffers: &[bytes::Bytes]) -> Vec<Option<recv::Region>> {
    let mut out: Vec<Option<recv::Region>> = buffers.iter().map(|_| None).collect();
    for i in header_indices(payload).unwrap_or_default() {
        if let (Some(slot), Some(raw)) = (out.get_mut(i), buffers.get(i)) {
            *slot = take_prefetched(raw);
        }
    }
    out
}

/// Frees what [`prefetch`] pulled for a message that will never be unpickled (a
/// reply nobody waits for).
pub fn discard_message(payload: &[u8], buffers: &[bytes::Bytes]) {
    drop(take_message(payload, buffers));
}

/// Runs `f(offset, part)` for `parts` consecutive parts of `dst`, each on its own
/// thread; the first error, or `None` if a thread panicked.
fn in_parts<E: Send>(
    dst: &mut [u8],
    parts: usize,
    f: impl Fn(usize, &mut [u8]) -> Result<(), E> + Sync,
) -> Option<Result<(), E>> {
    let chunk = dst.len().div_ceil(parts.max(1)).max(1);
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = dst
            .chunks_mut(chunk)
            .enumerate()
            .map(|(i, part)| scope.spawn(move || f(i * chunk, part)))
            .collect();
        let mut out = Ok(());
        for h in handles {
            match h.join() {
                Err(_) => return None,
                Ok(Err(e)) if out.is_ok() => out = Err(e),
                Ok(_) => {}
            }
        }
        Some(out)
    })
}

/// [`vm_read`] split over a few threads for large buffers (the copy is memory
/// bound; on a machine with several cores one thread does not saturate it).
fn vm_read_parallel(pid: u32, ptr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    const MIN_PART: usize = 8 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    let parts = threads.min(dst.len() / MIN_PART).max(1);
    if parts == 1 {
        return vm_read(pid, ptr, dst);
    }
    in_parts(dst, parts, |offset, part| {
        vm_read(pid, ptr + offset as u64, part)
    })
    .unwrap_or_else(|| Err(std::io::Error::other("a copy thread panicked")))
}

/// One copy from another process's memory (`process_vm_readv`), in as many calls as
/// the kernel needs.
fn vm_read(pid: u32, ptr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr() as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (ptr as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` is our own writable slice; the kernel checks `remote`.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::other("process_vm_readv made no progress"));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register_vec(data: Vec<u8>, token: &[u8], readers: u32) -> Descriptor {
        let (ptr, len) = (data.as_ptr() as usize, data.len());
        // SAFETY: the Vec is moved into the keep-alive; its heap buffer does not move.
        unsafe { engine().register(ptr, len, false, token, readers, None, Box::new(data)) }
    }

    #[test]
    fn header_indices_are_read_and_truncated_headers_refused() {
        let mut p = HEADER.to_vec();
        p.extend(2u32.to_le_bytes());
        p.extend(1u32.to_le_bytes());
        p.extend(3u32.to_le_bytes());
        assert_eq!(header_indices(&p), Some(vec![1, 3]));
        assert_eq!(header_indices(&p[..p.len() - 1]), None);
        let mut huge = HEADER.to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        assert_eq!(header_indices(&huge), None);
        assert_eq!(header_indices(b"\x80\x05plain pickle"), None);
        assert!(take_prefetched(b"nothing was pulled for this").is_none());
    }

    #[test]
    fn descriptors_round_trip_and_garbage_is_refused() {
        let d = register_vec(vec![1, 2, 3], b"tok", 1);
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert!(Descriptor::decode(b"junk").is_err());
        let mut w = d.encode();
        w.push(0);
        assert!(Descriptor::decode(&w).is_err());
        assert!(engine().drop_id(d.id));
    }

    #[test]
    fn a_fetch_reads_the_bytes_and_releases_the_registration() {
        let data: Vec<u8> = (0..(9 << 20)).map(|i| (i % 251) as u8).collect();
        let want = data.clone();
        let d = register_vec(data, b"tok-a", 1);
        let mut dst = vec![0u8; want.len()];
        engine().fetch(&d, b"tok-a", &mut dst, 4).unwrap();
        assert_eq!(dst, want);
        assert!(!engine().drop_id(d.id), "released after its one reader");
    }

    #[test]
    fn tcp_reads_in_parallel_streams_and_a_wrong_token_is_denied() {
        let data: Vec<u8> = (0..(9 << 20)).map(|i| (i % 253) as u8).collect();
        let want = data.clone();
        let d = register_vec(data, b"tok-b", 0);
        let mut dst = vec![0u8; want.len()];
        engine().fetch_tcp(&d, b"tok-b", &mut dst, 3).unwrap();
        assert_eq!(dst, want);
        let mut other = vec![0u8; want.len()];
        assert!(engine().fetch(&d, b"wrong", &mut other, 1).is_err());
        let err = engine().connect(&d.addr, b"never-registered").unwrap_err();
        assert!(err.to_string().contains("wrong mesh token"), "{err}");
        assert!(engine().drop_id(d.id));
    }
}
