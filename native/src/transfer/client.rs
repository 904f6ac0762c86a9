//! The engine's reading side: connections to other engines (authenticated once,
//! XFER-3, then pooled), reads of a whole buffer or a range, over one or several
//! parallel TCP streams or directly on one host, writes into a writable buffer, and
//! releases (XFER-1: a reader confirms after a direct read that the registration
//! was alive throughout).
//!
//! XFER-5: a range read whose connection breaks after it was made (a pooled one the
//! peer closed meanwhile, a reset after a partition) is restarted on a new
//! connection, up to [`RESTARTS`] times; one that cannot connect, or that the peer
//! refuses, fails at once. A read or write waits for its peer up to
//! [`super::server::STALL_LIMIT`], so a partition shorter than that is ridden out
//! and a peer gone for good ends the wait.

use super::frame::{self, Request, Status, MAC_LEN};
use super::{auth, host, local, recv, Descriptor, Engine, XferError};
use crate::sync::lock;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;

/// The environment variable that sets how many parallel TCP streams one transfer
/// across hosts uses (read by the prefetch here and by Python's `_buffers`).
pub const STREAMS_ENV: &str = "MONARCH_TRANSFER_STREAMS";
/// Parallel TCP streams per transfer where [`STREAMS_ENV`] does not say.
pub const DEFAULT_STREAMS: usize = 4;

/// Parallel TCP streams per transfer: [`STREAMS_ENV`], else [`DEFAULT_STREAMS`].
pub fn streams() -> usize {
    std::env::var(STREAMS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_STREAMS)
}

/// How many times a range read is restarted after its connection broke (XFER-5).
const RESTARTS: u32 = 3;
/// How long a new connection may take to open.
const CONNECT_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Idle authenticated connections, by peer address and token id.
pub(super) type ConnPool = HashMap<(String, [u8; MAC_LEN]), Vec<TcpStream>>;

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
    /// An authenticated connection to the engine at `addr`: a pooled one, or a new
    /// one after the handshake (XFER-3).
    pub(super) fn connect(&self, addr: &str, token: &[u8]) -> Result<TcpStream, XferError> {
        let tid = auth::token_id(token);
        if let Some(s) = lock(&self.pool)
            .get_mut(&(addr.to_string(), tid))
            .and_then(Vec::pop)
        {
            return Ok(s);
        }
        let sock: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| XferError::Invalid(format!("bad engine address {addr}: {e}")))?;
        let mut s =
            TcpStream::connect_timeout(&sock, CONNECT_LIMIT).map_err(|e| io_err(addr, e))?;
        s.set_nodelay(true).map_err(|e| io_err(addr, e))?;
        let stall = Some(super::server::STALL_LIMIT);
        s.set_read_timeout(stall).map_err(|e| io_err(addr, e))?;
        s.set_write_timeout(stall).map_err(|e| io_err(addr, e))?;
        let mut n = [0u8; MAC_LEN];
        s.read_exact(&mut n)
            .map_err(|e| io_err(addr, format!("no handshake nonce from the engine: {e}")))?;
        let hello = frame::encode(&auth::hello(token, &n));
        s.write_all(&hello).map_err(|e| io_err(addr, e))?;
        match read_status(&mut s, addr)? {
            (Status::Ok, _) => Ok(s),
            (st, len) => Err(refused(&mut s, addr, st, len)),
        }
    }

    fn put_back(&self, addr: &str, token: &[u8], s: TcpStream) {
        let mut pool = lock(&self.pool);
        let v = pool
            .entry((addr.to_string(), auth::token_id(token)))
            .or_default();
        if v.len() < 16 {
            v.push(s);
        }
    }

    /// Reads `dst.len()` bytes of `d` from `offset`, restarting on a new connection
    /// when the one it used breaks (XFER-5).
    fn read_range(
        &self,
        d: &Descriptor,
        token: &[u8],
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), XferError> {
        let mut restarts = 0;
        loop {
            let s = self.connect(&d.addr, token)?;
            match self.read_range_on(s, d, token, offset, dst) {
                Err(XferError::Io { .. }) if restarts < RESTARTS => {
                    restarts += 1;
                    // Its idle siblings broke with it, most likely (a partition, a restart).
                    lock(&self.pool).remove(&(d.addr.clone(), auth::token_id(token)));
                    std::thread::sleep(std::time::Duration::from_millis(100 << restarts));
                }
                done => return done,
            }
        }
    }

    fn read_range_on(
        &self,
        mut s: TcpStream,
        d: &Descriptor,
        token: &[u8],
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), XferError> {
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
    /// ([`super::HANDLE`]) and is confirmed, not released, after the read.
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
        if d.token_id != auth::token_id(token) {
            return Err(XferError::Invalid(
                "the buffer belongs to another mesh".into(),
            ));
        }
        let local = self.host.holds(d)
            && !host::force_tcp()
            && local::vm_read_parallel(d.pid, d.ptr, dst).is_ok();
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

/// Runs `f(offset, part)` for `parts` consecutive parts of `dst`, each on its own
/// thread; the first error, or `None` if a thread panicked.
pub(super) fn in_parts<E: Send>(
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

#[cfg(test)]
mod tests {
    use super::super::engine;
    use super::super::registry::register_vec;

    #[test]
    fn a_fetch_reads_the_bytes_and_releases_the_registration() {
        let data: Vec<u8> = (0..(9 << 20)).map(|i| (i % 251) as u8).collect();
        let want = data.clone();
        let d = register_vec(data, b"tok-a", 1);
        let mut dst = vec![0u8; want.len()];
        engine().unwrap().fetch(&d, b"tok-a", &mut dst, 4).unwrap();
        assert_eq!(dst, want);
        assert!(
            !engine().unwrap().drop_id(d.id),
            "released after its one reader"
        );
    }

    #[test]
    fn tcp_reads_in_parallel_streams_and_a_wrong_token_is_denied() {
        let data: Vec<u8> = (0..(9 << 20)).map(|i| (i % 253) as u8).collect();
        let want = data.clone();
        let d = register_vec(data, b"tok-b", 0);
        let mut dst = vec![0u8; want.len()];
        engine()
            .unwrap()
            .fetch_tcp(&d, b"tok-b", &mut dst, 3)
            .unwrap();
        assert_eq!(dst, want);
        let mut other = vec![0u8; want.len()];
        assert!(engine()
            .unwrap()
            .fetch(&d, b"wrong", &mut other, 1)
            .is_err());
        let err = engine()
            .unwrap()
            .connect(&d.addr, b"never-registered")
            .unwrap_err();
        assert!(err.to_string().contains("wrong mesh token"), "{err}");
        assert!(engine().unwrap().drop_id(d.id));
    }

    #[test]
    fn a_read_on_a_pooled_connection_that_broke_restarts_on_a_new_one() {
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 241) as u8).collect();
        let want = data.clone();
        let d = register_vec(data, b"tok-restart", 0);
        let e = engine().unwrap();
        let mut dst = vec![0u8; want.len()];
        e.fetch_tcp(&d, b"tok-restart", &mut dst, 1).unwrap(); // pools its connection
        let key = (d.addr.clone(), super::auth::token_id(b"tok-restart"));
        let pooled = super::lock(&e.pool).get(&key).map_or(0, Vec::len);
        assert!(pooled > 0, "nothing was pooled");
        for s in super::lock(&e.pool).get(&key).into_iter().flatten() {
            s.shutdown(std::net::Shutdown::Both).unwrap(); // broken while idle
        }
        let mut again = vec![0u8; want.len()];
        e.fetch_tcp(&d, b"tok-restart", &mut again, 1).unwrap();
        assert_eq!(again, want);
        assert!(e.drop_id(d.id));
    }
}
