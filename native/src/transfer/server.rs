//! The engine's TCP side: one thread accepts, one thread per connection serves it.
//! At most [`MAX_CONNECTIONS`] are served at once (more are closed at once, and
//! counted), and a peer has [`HANDSHAKE_WINDOW`] to prove the token: idle or
//! unauthenticated connections cannot pile up threads.
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
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if OPEN.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            OPEN.fetch_sub(1, Ordering::AcqRel);
            e.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
            drop(conn); // closed at once: the peer sees a reset, not a hang
            continue;
        }
        let served = Served;
        let spawned = std::thread::Builder::new()
            .name("monarch-xfer-conn".into())
            .spawn(move || {
                let _served = served;
                let _ = handle(e, conn);
            });
        drop(spawned);
    }
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
/// connection). The token id the peer proved, or `None` once it was refused (and
/// told why).
///
/// Without a nonce (the random source failed) the handshake fails closed: the peer
/// gets a placeholder where the nonce goes, so that it sends its `Hello` and reads
/// the answer, which is always a refusal saying why.
fn handshake(
    e: &Engine,
    s: &mut TcpStream,
    nonce: Result<[u8; MAC_LEN], XferError>,
) -> std::io::Result<Option<[u8; MAC_LEN]>> {
    let n = match nonce {
        Ok(n) => n,
        Err(why) => {
            e.stats.denied.fetch_add(1, Ordering::Relaxed);
            s.write_all(&[0; MAC_LEN])?;
            let _ = read_frame(s)?;
            reply(s, Status::Denied, &why.to_string())?;
            return Ok(None);
        }
    };
    s.write_all(&n)?;
    match read_frame(s)? {
        Ok(Request::Hello { token_id, mac }) => {
            let ok = e
                .token(&token_id)
                .is_some_and(|t| auth::verify(&t, &n, &mac));
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

fn handle(e: &Engine, mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(HANDSHAKE_WINDOW))?;
    let Some(tid) = handshake(e, &mut s, auth::nonce())? else {
        return Ok(());
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
            let why = XferError::NoNonce("cannot read /dev/urandom: gone".into());
            handshake(engine().unwrap(), &mut s, Err(why)).unwrap()
        });
        let err = e.connect(&addr, b"tok-nonce").unwrap_err();
        assert_eq!(server.join().unwrap(), None);
        let msg = err.to_string();
        assert!(msg.contains("Denied") && msg.contains("nonce"), "{msg}");
        assert!(msg.contains("/dev/urandom: gone"), "{msg}");
        assert!(e.stats.denied.load(Ordering::Relaxed) > denied);
    }
}
