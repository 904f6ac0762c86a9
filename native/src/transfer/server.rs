//! The engine's TCP side: one thread accepts; XFER-4: a connection holds a thread
//! only while it is served. Between requests it waits on the node runtime's reactor
//! (no thread of its own), and each request (a read, a write, a release: one frame
//! and its bytes) is served on a thread of the runtime's blocking pool, which keeps
//! threads for the next ones. At most [`MAX_CONNECTIONS`] are open at once (more are
//! closed at once, and counted), a peer has [`HANDSHAKE_WINDOW`] to prove the token,
//! and a request whose peer stops sending or reading for [`STALL_LIMIT`] ends its
//! connection: neither idle nor stalled connections pile up threads.
//! A connection starts with the handshake (XFER-3), then carries `Read`, `Write`
//! and `Release` requests against the registrations ([`Engine::lookup`],
//! [`Engine::release`]); every frame is checked before anything is read or
//! allocated, and a bad one closes the connection and is counted in the stats.

use super::frame::{self, Request, Status, MAC_LEN};
use super::{auth, Engine, XferError};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Connections served at once; a busy mesh needs a few per peer (parallel streams).
pub const MAX_CONNECTIONS: usize = 256;
/// How long a new connection may take to complete the handshake.
pub const HANDSHAKE_WINDOW: Duration = Duration::from_secs(5);
/// How long one read or write within a request may wait for its peer (a partition of
/// a minute or two is ridden out; a peer gone for good frees the thread).
pub const STALL_LIMIT: Duration = Duration::from_secs(180);

/// Connections being served now.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Ends one served connection's count when its thread ends, however it ends.
struct Served;

impl Drop for Served {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Accepts connections for `e` for as long as the process lives.
pub(super) fn serve(e: &'static Engine, listener: TcpListener) {
    let rt = crate::node::handle();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if OPEN.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            OPEN.fetch_sub(1, Ordering::AcqRel);
            e.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            drop(conn); // closed at once: the peer sees a reset, not a hang
            continue;
        }
        let served = Served;
        rt.spawn(async move {
            let _served = served;
            let _ = connection(e, conn).await;
        });
    }
}

/// Serves one connection (XFER-4): the handshake, then each request on a blocking
/// thread, waiting for the next on the reactor.
async fn connection(e: &'static Engine, conn: TcpStream) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    conn.set_read_timeout(Some(HANDSHAKE_WINDOW))?;
    conn.set_write_timeout(Some(HANDSHAKE_WINDOW))?;
    let nonce = auth::nonce();
    (&conn).write_all(&nonce_bytes(&nonce))?; // a few bytes into an empty buffer
    let Ok(conn) = idle(conn, Some(HANDSHAKE_WINDOW)).await? else {
        return Ok(()); // no handshake in time
    };
    let (conn, tid) = blocking(move || {
        let mut conn = conn;
        let tid = handshake(e, &mut conn, &nonce);
        (conn, tid)
    })
    .await?;
    let Some(tid) = tid? else {
        return Ok(());
    };
    conn.set_read_timeout(Some(STALL_LIMIT))?;
    conn.set_write_timeout(Some(STALL_LIMIT))?;
    let mut conn = conn;
    loop {
        let Ok(ready) = idle(conn, None).await? else {
            return Ok(());
        };
        let (back, more) = blocking(move || {
            let mut conn = ready;
            let more = request(e, &mut conn, &tid);
            (conn, more)
        })
        .await?;
        if !more? {
            return Ok(());
        }
        conn = back;
    }
}

/// Waits, with no thread, until `conn` has bytes to read (or is closed), up to
/// `limit`: then it is handed back in blocking mode; `Err(())` if the limit passed.
async fn idle(conn: TcpStream, limit: Option<Duration>) -> std::io::Result<Result<TcpStream, ()>> {
    conn.set_nonblocking(true)?;
    let waiting = tokio::net::TcpStream::from_std(conn)?;
    let ready = match limit {
        None => Some(waiting.readable().await),
        Some(t) => tokio::time::timeout(t, waiting.readable()).await.ok(),
    };
    let Some(ready) = ready else {
        return Ok(Err(()));
    };
    ready?;
    let conn = waiting.into_std()?;
    conn.set_nonblocking(false)?;
    Ok(Ok(conn))
}

/// Runs `f` on the runtime's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Connections the engine serves now (for its stats).
pub fn open_connections() -> usize {
    OPEN.load(Ordering::Acquire)
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

/// XFER-3: the first frame must prove the token, over `nonce` (fresh for this
/// connection), which [`connection`] sent first. The token id the peer proved, or
/// `None` once it was refused (and told why).
///
/// Without a nonce (the random source failed) the handshake fails closed: the peer
/// got a placeholder where the nonce goes, so that it sends its `Hello` and reads
/// the answer, which is always a refusal saying why.
fn handshake(
    e: &Engine,
    s: &mut TcpStream,
    nonce: &Result<[u8; MAC_LEN], XferError>,
) -> std::io::Result<Option<[u8; MAC_LEN]>> {
    let n = match nonce {
        Ok(n) => n,
        Err(why) => {
            e.stats.denied.fetch_add(1, Ordering::Relaxed);
            let _ = read_frame(s)?;
            reply(s, Status::Denied, &why.to_string())?;
            return Ok(None);
        }
    };
    match read_frame(s)? {
        Ok(Request::Hello { token_id, mac }) => {
            let ok = e
                .token(&token_id)
                .is_some_and(|t| auth::verify(&t, n, &mac));
            if !ok {
                e.stats.denied.fetch_add(1, Ordering::Relaxed);
                reply(s, Status::Denied, "handshake failed: wrong mesh token")?;
                return Ok(None);
            }
            reply(s, Status::Ok, "")?;
            Ok(Some(token_id))
        }
        Ok(_) | Err(_) => {
            e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            reply(s, Status::Denied, "the first frame must be a handshake")?;
            Ok(None)
        }
    }
}

/// The nonce a connection starts with (or a placeholder where there is none, see
/// [`handshake`]).
fn nonce_bytes(nonce: &Result<[u8; MAC_LEN], XferError>) -> [u8; MAC_LEN] {
    nonce.as_ref().copied().unwrap_or([0; MAC_LEN])
}

/// Serves one request of the connection whose peer proved token `tid`; whether the
/// connection goes on (a malformed frame, a refused write or a peer gone end it).
fn request(e: &Engine, s: &mut TcpStream, tid: &[u8; MAC_LEN]) -> std::io::Result<bool> {
    let req = match read_frame(s) {
        Ok(Ok(r)) => r,
        Ok(Err(err)) => {
            e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            reply(s, Status::Malformed, &err.to_string())?;
            return Ok(false);
        }
        Err(_) => return Ok(false), // the peer went away
    };
    match req {
        Request::Hello { .. } => {
            e.stats.rejected_frames.fetch_add(1, Ordering::Relaxed);
            reply(s, Status::Malformed, "a second handshake")?;
            return Ok(false);
        }
        Request::Release { id } => {
            let st = e.release(id, tid);
            reply(s, st, "")?;
        }
        Request::Read { id, offset, len } | Request::Write { id, offset, len } => {
            let write = matches!(req, Request::Write { .. });
            let entry = match e.lookup(id, tid) {
                Ok(x) => x,
                Err(st) => {
                    reply(s, st, "no such buffer")?;
                    return Ok(!write); // a write's bytes follow: close
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
                reply(s, Status::OutOfRange, what)?;
                return Ok(false);
            }
            let (off, n) = (offset as usize, len as usize);
            if write {
                // SAFETY: range checked above; `entry` keeps the memory alive and
                // it was registered writable.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut((entry.ptr + off) as *mut u8, n) };
                s.read_exact(dst)?;
                reply(s, Status::Ok, "")?;
            } else {
                s.write_all(&frame::status_header(Status::Ok, len))?;
                // SAFETY: range checked above; `entry` keeps the memory alive.
                let src = unsafe { std::slice::from_raw_parts((entry.ptr + off) as *const u8, n) };
                s.write_all(src)?;
                e.stats.bytes_sent.fetch_add(len, Ordering::Relaxed);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::engine;
    use super::*;

    #[test]
    fn without_a_nonce_the_handshake_is_refused_on_both_sides_saying_why() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let e = engine().unwrap();
        let denied = e.stats.denied.load(Ordering::Relaxed);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let why = Err(XferError::NoNonce("cannot read /dev/urandom: gone".into()));
            s.write_all(&nonce_bytes(&why)).unwrap();
            handshake(engine().unwrap(), &mut s, &why).unwrap()
        });
        let err = e.connect(&addr, b"tok-nonce").unwrap_err();
        assert_eq!(server.join().unwrap(), None);
        let msg = err.to_string();
        assert!(msg.contains("Denied") && msg.contains("nonce"), "{msg}");
        assert!(msg.contains("/dev/urandom: gone"), "{msg}");
        assert!(e.stats.denied.load(Ordering::Relaxed) > denied);
    }

    fn threads() -> usize {
        std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
    }

    #[test]
    fn idle_connections_hold_no_thread_of_their_own() {
        let e = engine().unwrap();
        let d = super::super::registry::register_vec(vec![7u8; 1024], b"tok-idle", 0);
        let mut dst = vec![0u8; 1024];
        e.fetch(&d, b"tok-idle", &mut dst, 1).unwrap(); // the runtime and its pool start
        let before = threads();
        // 100 authenticated and 100 that never send their handshake, all idle.
        let mut idle: Vec<TcpStream> = (0..100)
            .map(|_| e.connect(&d.addr, b"tok-idle").unwrap())
            .collect();
        for _ in 0..100 {
            let mut s = TcpStream::connect(&d.addr).unwrap();
            let mut nonce = [0u8; MAC_LEN];
            s.read_exact(&mut nonce).unwrap(); // served: it waits for the handshake
            idle.push(s);
        }
        std::thread::sleep(Duration::from_millis(300));
        let during = threads();
        assert!(
            during < before + 50,
            "200 idle connections took {} threads",
            during.saturating_sub(before)
        );
        // Each still answers when it has a request.
        let mut again = vec![0u8; 1024];
        e.fetch(&d, b"tok-idle", &mut again, 1).unwrap();
        assert_eq!(again, dst);
        drop(idle);
        assert!(e.drop_id(d.id));
    }
}
