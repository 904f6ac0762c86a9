//! The registration table (XFER-1): which buffers of this process others may read
//! or write, under which mesh token, and until when. A registration ends when its
//! readers have all released it, when its owner drops it, or when it expires (for
//! readers that died); its entry owns whatever keeps the memory valid, and is
//! dropped outside the table's lock (the keep-alive may take the GIL).

use super::frame::{Status, MAC_LEN};
use super::{auth, Descriptor, Engine};
use crate::sync::{lock, unpoison};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `readers` of a registration behind an explicit handle (a Python `TransferBuffer`):
/// reads do not count it down; one `Release` (the handle's `drop()`) ends it.
pub const HANDLE: u32 = u32::MAX;

/// A registered buffer. `_keep` owns whatever keeps `ptr..ptr+len` valid.
pub(super) struct Entry {
    pub ptr: usize,
    pub len: usize,
    pub writable: bool,
    token_id: [u8; MAC_LEN],
    /// Its token is its own (a handle's capability, XFER-6): forgotten with it.
    own_token: bool,
    /// Releases still expected; 0 means "until dropped".
    readers: AtomicU32,
    expires: Option<Instant>,
    _keep: Box<dyn Send + Sync>,
}

/// How [`Engine::wait_until`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// None of the registrations is left.
    Gone,
    /// `stop()` said to give up.
    Stopped,
    /// The time ran out.
    TimedOut,
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
    /// Connections closed at once because [`super::server::MAX_CONNECTIONS`] were open.
    pub refused_connections: AtomicU64,
}

impl Engine {
    /// Registers `len` bytes at `ptr`, kept valid by `keep` until the registration
    /// ends: after `readers` releases (0: only [`Engine::drop_id`]), or `ttl`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and, if `writable`, writable) while `keep`
    /// lives.
    /// `own_token`: `token` is this registration's alone (a handle's capability,
    /// XFER-6), and the engine forgets it when the registration ends.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn register(
        &self,
        ptr: usize,
        len: usize,
        writable: bool,
        token: &[u8],
        own_token: bool,
        readers: u32,
        ttl: Option<Duration>,
        keep: Box<dyn Send + Sync>,
    ) -> Descriptor {
        self.sweep();
        let tid = auth::token_id(token);
        lock(&self.tokens)
            .entry(tid)
            .or_insert_with(|| token.to_vec());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            ptr,
            len,
            writable,
            token_id: tid,
            own_token,
            readers: AtomicU32::new(readers),
            expires: ttl.map(|t| Instant::now() + t),
            _keep: keep,
        };
        lock(&self.table).insert(id, Arc::new(entry));
        Descriptor {
            host: self.host.boot_id,
            namespaces: self.host.namespaces,
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
        if let Some(e) = &e {
            self.forget_own_token(e);
        }
        e.is_some() // dropped here, outside the lock
    }

    /// Forgets the token of an ended registration whose token was its own.
    fn forget_own_token(&self, e: &Entry) {
        if e.own_token {
            lock(&self.tokens).remove(&e.token_id);
        }
    }

    /// Waits until none of `ids` is registered (each was read by all its readers,
    /// dropped or expired), at most `timeout`. True if they all ended.
    pub fn wait_gone(&self, ids: &[u64], timeout: Duration) -> bool {
        self.wait_until(ids, timeout, || false) == Waited::Gone
    }

    /// Waits until none of `ids` is registered, or `stop()` says to give up, or
    /// `timeout` passes. `stop` is asked first, then again whenever registrations
    /// end or [`Engine::wake`] is called; it runs under the table's lock, so it must
    /// not touch the registrations.
    pub fn wait_until(&self, ids: &[u64], timeout: Duration, stop: impl Fn() -> bool) -> Waited {
        let deadline = Instant::now().checked_add(timeout);
        let mut t = lock(&self.table);
        loop {
            if !ids.iter().any(|i| t.contains_key(i)) {
                return Waited::Gone;
            }
            if stop() {
                return Waited::Stopped;
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Waited::TimedOut;
            }
            t = unpoison(self.ended.wait_timeout(t, left)).0;
        }
    }

    /// Makes every [`Engine::wait_until`] ask its `stop()` again (what it waits
    /// for besides registrations may have happened: a call ended).
    pub fn wake(&self) {
        // Taking the lock: a waiter between its check and its wait holds it, so it
        // cannot miss this.
        let _t = lock(&self.table);
        self.ended.notify_all();
    }

    /// How many registrations are live.
    pub fn registered(&self) -> usize {
        self.sweep();
        lock(&self.table).len()
    }

    /// Ends the registrations whose time is up (their readers died).
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
        for e in &gone {
            self.forget_own_token(e);
        }
        drop(gone);
    }

    /// One reader of `id` is done (a handle's registration: it ends).
    pub(super) fn release(&self, id: u64, tid: &[u8; MAC_LEN]) -> Status {
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
                        self.forget_own_token(&gone);
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
        if let Some(e) = &gone {
            self.forget_own_token(e);
        }
        drop(gone); // the keep-alive goes outside the lock (it may take the GIL)
        Status::Ok
    }

    /// Registration `id`, if it is registered under the token `tid`.
    pub(super) fn lookup(&self, id: u64, tid: &[u8; MAC_LEN]) -> Result<Arc<Entry>, Status> {
        let t = lock(&self.table);
        match t.get(&id) {
            None => Err(Status::Unknown),
            Some(e) if &e.token_id != tid => Err(Status::Denied),
            Some(e) => Ok(e.clone()),
        }
    }

    /// The token registrations named `tid` were made under, if any.
    pub(super) fn token(&self, tid: &[u8; MAC_LEN]) -> Option<Vec<u8>> {
        lock(&self.tokens).get(tid).cloned()
    }
}

/// Registers a vector's bytes (for tests).
#[cfg(test)]
pub(super) fn register_vec(data: Vec<u8>, token: &[u8], readers: u32) -> Descriptor {
    let (ptr, len) = (data.as_ptr() as usize, data.len());
    // SAFETY: the Vec is moved into the keep-alive; its heap buffer does not move.
    unsafe {
        super::engine().unwrap().register(
            ptr,
            len,
            false,
            token,
            false,
            readers,
            None,
            Box::new(data),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_wait_ends_when_its_registrations_end_or_when_woken_to_stop() {
        let e = super::super::engine().unwrap();
        let d = register_vec(vec![0; 8], b"tok-wait", 0);
        let quick = Duration::from_millis(20);
        assert_eq!(e.wait_until(&[d.id], quick, || false), Waited::TimedOut);
        let stop = Arc::new(AtomicBool::new(false));
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                e.wait_until(&[d.id], Duration::from_secs(600), || {
                    stop.load(Ordering::SeqCst)
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::SeqCst);
        e.wake();
        assert_eq!(waiter.join().unwrap(), Waited::Stopped);
        let waiter = std::thread::spawn(move || e.wait_until(&[d.id], Duration::MAX, || false));
        std::thread::sleep(Duration::from_millis(50));
        assert!(e.drop_id(d.id));
        assert_eq!(waiter.join().unwrap(), Waited::Gone);
        assert!(e.wait_gone(&[d.id], Duration::ZERO));
    }

    fn register_own(token: &[u8]) -> Descriptor {
        let data = vec![7u8; 8];
        let (ptr, len) = (data.as_ptr() as usize, data.len());
        // SAFETY: the Vec is moved into the keep-alive; its heap buffer does not move.
        unsafe {
            super::super::engine().unwrap().register(
                ptr,
                len,
                false,
                token,
                true,
                HANDLE,
                None,
                Box::new(data),
            )
        }
    }

    #[test]
    fn a_handles_own_token_is_forgotten_when_it_ends_and_a_meshs_is_kept() {
        let e = super::super::engine().unwrap();
        let mesh = register_vec(vec![0; 8], b"tok-mesh-kept", 0);
        assert!(e.drop_id(mesh.id));
        assert!(
            e.token(&mesh.token_id).is_some(),
            "a mesh's token outlives its registrations"
        );
        let dropped = register_own(b"cap-dropped");
        assert_eq!(
            e.token(&dropped.token_id).as_deref(),
            Some(&b"cap-dropped"[..])
        );
        assert!(e.drop_id(dropped.id));
        assert!(e.token(&dropped.token_id).is_none(), "dropped by its owner");
        let released = register_own(b"cap-released");
        assert_eq!(e.release(released.id, &released.token_id), Status::Ok);
        assert!(
            e.token(&released.token_id).is_none(),
            "released by a holder"
        );
    }
}
