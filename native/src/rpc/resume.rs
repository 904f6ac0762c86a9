//! What a server of the `Messages` stream remembers of its callers' calls, so that a
//! caller whose connection broke (a partition, a stopped process, a dropped
//! keepalive) can open it again and lose nothing (RESUME-1, worker.proto "Resuming").
//!
//! RESUME-1: each call a server admits is remembered, by caller id and call id (and
//! proc, for a relay), from its arrival until the caller says it received the reply;
//! a reply goes to the caller's newest stream. A resent call is run only if it never
//! arrived: answered, its reply is sent again; running, its reply goes to the new
//! stream when it comes; one the server never received runs now (its caller is known,
//! and a caller's calls are remembered until received, so an unknown call id of a
//! known caller never arrived). RESUME-2: a resent call of a caller the server has
//! forgotten is answered `REPLY_KIND_LOST` and never run, so no call runs twice,
//! whatever the server forgot (a new process at the same address is caught by its
//! client, from the incarnation it answers with, before anything is resent).
//! RESUME-3: a caller with no stream open for [`FORGET_AFTER`] is forgotten (its
//! remembered replies freed; its id kept in a bounded list for RESUME-2).
//! RESUME-4: a unary request (a spawn, a stop) sent again with its request id after
//! its connection broke runs once: every copy gets that one run's reply
//! ([`Requests`]; the last [`REQUESTS_KEPT`] ids are remembered).

use crate::ids::IdMap;
use crate::proto::v1::{Calls, Received, Reply, ReplyKind};
use crate::sync::lock;
use bytes::Bytes;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

/// The request metadata that names the caller (a [`WorkerConn`](super::client::WorkerConn)).
pub const CALLER_HEADER: &str = "x-monarch-caller";
/// The request metadata that numbers a caller's streams, in the order the caller opened
/// them (RESUME-1): a stream the server reads late, after a newer one of its caller
/// (an attempt the caller gave up on, or the broken stream's last messages), is stale
/// whatever order the server happens to accept them in.
pub const STREAM_HEADER: &str = "x-monarch-stream";
/// The response metadata that names the server's process (its incarnation).
pub const INCARNATION_HEADER: &str = "x-monarch-incarnation";
/// The response metadata that says the server knew the caller before this stream
/// ("1"): it is the process the caller's earlier streams reached (RESUME-2).
pub const KNEW_HEADER: &str = "x-monarch-knew";

/// RESUME-3: how long a caller with no stream is remembered. A partition longer than
/// this ends its calls with `REPLY_KIND_LOST` (never a second run).
pub const FORGET_AFTER: Duration = Duration::from_secs(30 * 60);

/// The proc key of a call that is not fanned out (a worker's own calls).
const DIRECT: u32 = u32::MAX;

/// How many forgotten callers are kept (RESUME-2): a caller forgotten longer ago
/// than that many others is taken for a new one.
const FORGOTTEN_KEPT: usize = 4096;

/// A random 64-bit id: unique, not secret (caller ids, incarnations).
pub fn random_id() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.finish().max(1)
}

enum Entry {
    Running,
    Done(Reply),
}

/// One caller: where its replies go now, and its calls not yet received.
struct Caller {
    /// The newest stream's sender; None while it is closed (no stream open).
    tx: Option<UnboundedSender<Reply>>,
    /// The newest stream's number: only its calls are admitted, even once it has
    /// closed (a message of an older stream read then is stale, not new).
    newest: u64,
    /// Calls admitted and not yet received, by (call id, proc).
    calls: IdMap<(u64, u32), Entry>,
    /// Since when no stream has been open (RESUME-3).
    idle_since: Option<Instant>,
}

/// What to do with an arriving call.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// New: run it.
    Run,
    /// Known (a resent call that arrived before): done here, nothing to run.
    Known,
    /// A resent call this server does not know: answer `REPLY_KIND_LOST` (RESUME-2).
    Forgotten,
    /// From a stream that is no longer the caller's newest: dropped (the caller sends
    /// everything it waits for again on the newest, RESUME-1).
    Stale,
}

/// The callers of one server (RESUME-1).
pub struct Callers {
    map: Mutex<Table>,
    streams: AtomicU64,
    /// The server's incarnation, told to its callers: another server at the same
    /// address (a restarted process) has another (RESUME-2).
    incarnation: u64,
}

impl Default for Callers {
    fn default() -> Self {
        Callers {
            map: Mutex::default(),
            streams: AtomicU64::new(0),
            incarnation: random_id(),
        }
    }
}

#[derive(Default)]
struct Table {
    callers: HashMap<u64, Caller>,
    /// Callers forgotten (RESUME-3), oldest first, and as a set (RESUME-2).
    forgotten: std::collections::VecDeque<u64>,
    forgotten_set: std::collections::HashSet<u64>,
}

impl Table {
    /// RESUME-3: forgets the callers with no stream for [`FORGET_AFTER`].
    fn sweep(&mut self) {
        let stale: Vec<u64> = self
            .callers
            .iter()
            .filter(|(_, c)| c.idle_since.is_some_and(|i| i.elapsed() >= FORGET_AFTER))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            self.callers.remove(&id);
            self.forgotten.push_back(id);
            self.forgotten_set.insert(id);
            if self.forgotten.len() > FORGOTTEN_KEPT {
                if let Some(old) = self.forgotten.pop_front() {
                    self.forgotten_set.remove(&old);
                }
            }
        }
    }
}

fn key(call_id: u64, proc: Option<u32>) -> (u64, u32) {
    (call_id, proc.unwrap_or(DIRECT))
}

impl Callers {
    /// A new stream of `caller`, numbered `seq` by the caller ([`STREAM_HEADER`];
    /// None: the server numbers it): its replies go to `tx` from now on. Returns the
    /// stream's number, for [`Callers::admit`] and [`Callers::detach`], and whether
    /// the caller was known here before; None if the caller has opened a newer stream
    /// already (this one is an older attempt read late: nothing of it is taken).
    pub fn attach(
        &self,
        caller: u64,
        seq: Option<u64>,
        tx: UnboundedSender<Reply>,
    ) -> Option<(u64, bool)> {
        let n = seq.unwrap_or_else(|| self.streams.fetch_add(1, Ordering::Relaxed) + 1);
        let mut t = lock(&self.map);
        t.sweep();
        let knew = t.callers.contains_key(&caller);
        let c = t.callers.entry(caller).or_insert_with(|| Caller {
            tx: None,
            newest: n,
            calls: IdMap::default(),
            idle_since: None,
        });
        if knew && n < c.newest {
            return None;
        }
        c.newest = n;
        c.tx = Some(tx);
        c.idle_since = None;
        Some((n, knew))
    }

    /// Stream `n` of `caller` ended; if it was the newest, replies wait for the next.
    pub fn detach(&self, caller: u64, n: u64) {
        let mut t = lock(&self.map);
        t.sweep();
        let Some(c) = t.callers.get_mut(&caller) else {
            return;
        };
        if c.newest == n && c.tx.is_some() {
            c.tx = None;
            c.idle_since = Some(Instant::now());
        }
    }

    /// The first message of a resumed stream says which calls the caller still
    /// waits for (`waiting`): every other one is forgotten (its reply was received,
    /// though the message saying so was lost with the old stream; or the caller gave
    /// up on it). A reply still to come for a forgotten call is sent, not kept. The
    /// list of a stale stream (`stream` not the newest) is out of date: ignored. A call
    /// sent again in the same message is kept whatever the list says (a client that
    /// made its list late, after the call's reply came, must not have it run twice).
    pub fn resync(&self, caller: u64, stream: u64, batch: &Calls) {
        if !batch.resync {
            return;
        }
        let resent = batch.calls.iter().filter(|c| c.resent).map(|c| c.call_id);
        let keep: std::collections::HashSet<u64> =
            batch.waiting.iter().copied().chain(resent).collect();
        let mut t = lock(&self.map);
        if let Some(c) = t.callers.get_mut(&caller) {
            if c.newest == stream {
                c.calls.retain(|(id, _), _| keep.contains(id));
            }
        }
    }

    /// Admits call `call_id` of `caller`, read from its stream `stream`, for `procs`
    /// (None: a direct call). A known call's replies that are done are sent again on
    /// the caller's stream.
    pub fn admit(
        &self,
        caller: u64,
        stream: u64,
        call_id: u64,
        procs: &[Option<u32>],
        resent: bool,
    ) -> Admit {
        let mut t = lock(&self.map);
        let forgotten = t.forgotten_set.contains(&caller);
        let Some(c) = t.callers.get_mut(&caller) else {
            return Admit::Run; // (a stream's calls can be read before its attach: none here)
        };
        if stream != c.newest {
            return Admit::Stale;
        }
        if Self::replay(c, call_id, procs) {
            return Admit::Known;
        }
        if resent && forgotten {
            return Admit::Forgotten;
        }
        for p in procs {
            c.calls.insert(key(call_id, *p), Entry::Running);
        }
        Admit::Run
    }

    /// Whether `caller` sent `call_id` before; if so, its replies that are done go
    /// again on its stream (one still running answers there when it ends).
    pub fn known(&self, caller: u64, call_id: u64, procs: &[Option<u32>]) -> bool {
        let mut t = lock(&self.map);
        t.callers
            .get_mut(&caller)
            .is_some_and(|c| Self::replay(c, call_id, procs))
    }

    fn replay(c: &mut Caller, call_id: u64, procs: &[Option<u32>]) -> bool {
        if !procs
            .iter()
            .any(|p| c.calls.contains_key(&key(call_id, *p)))
        {
            return false;
        }
        if let Some(tx) = &c.tx {
            for p in procs {
                if let Some(Entry::Done(r)) = c.calls.get(&key(call_id, *p)) {
                    let _ = tx.send(r.clone());
                }
            }
        }
        true
    }

    /// `reply` for a call of `caller`: remembered until received, and sent on the
    /// caller's newest stream.
    pub fn reply(&self, caller: u64, reply: Reply) {
        self.reply_all(caller, [reply]);
    }

    /// [`reply`](Self::reply) for each of `replies`, under one lock, in order.
    pub fn reply_all(&self, caller: u64, replies: impl IntoIterator<Item = Reply>) {
        let mut replies = replies.into_iter().peekable();
        if replies.peek().is_none() {
            return;
        }
        let mut t = lock(&self.map);
        let Some(c) = t.callers.get_mut(&caller) else {
            return; // forgotten (RESUME-3): nobody waits for it
        };
        for reply in replies {
            if let MapEntry::Occupied(mut e) = c.calls.entry(key(reply.call_id, reply.proc)) {
                e.insert(Entry::Done(reply.clone()));
            }
            if let Some(tx) = &c.tx {
                let _ = tx.send(reply);
            }
        }
    }

    /// `caller` received these replies: forget them.
    pub fn received(&self, caller: u64, got: &[Received]) {
        if got.is_empty() {
            return;
        }
        let mut t = lock(&self.map);
        let Some(c) = t.callers.get_mut(&caller) else {
            return;
        };
        for r in got {
            if let MapEntry::Occupied(e) = c.calls.entry(key(r.call_id, r.proc)) {
                if matches!(e.get(), Entry::Done(_)) {
                    e.remove();
                }
            }
        }
    }

    /// Calls remembered, across callers (running or answered, not yet received).
    pub fn remembered(&self) -> usize {
        lock(&self.map)
            .callers
            .values()
            .map(|c| c.calls.len())
            .sum()
    }
}

/// How many unary requests' replies a server remembers (RESUME-4).
pub const REQUESTS_KEPT: usize = 1024;

/// A unary request's reply, once its one run has made it (RESUME-4).
type Answer = watch::Receiver<Option<Reply>>;

/// Unary requests by id, with their reply once there is one (RESUME-4).
#[derive(Default)]
pub struct Requests {
    /// The requests, and their ids oldest first (the oldest is forgotten first).
    map: Mutex<(HashMap<u64, Answer>, std::collections::VecDeque<u64>)>,
}

/// What to do with an arriving unary request.
pub enum Begin {
    /// New: run it, and send its reply here.
    Run(watch::Sender<Option<Reply>>),
    /// Seen before: its reply comes (or came) here.
    Wait(watch::Receiver<Option<Reply>>),
}

impl Requests {
    /// Request `id` arrives.
    pub fn begin(&self, id: u64) -> Begin {
        let mut m = lock(&self.map);
        let (map, order) = &mut *m;
        if let Some(rx) = map.get(&id) {
            return Begin::Wait(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        map.insert(id, rx);
        order.push_back(id);
        if order.len() > REQUESTS_KEPT {
            // The oldest answered one (one still running stays: a copy may come).
            if let Some(i) = order
                .iter()
                .position(|o| map.get(o).is_none_or(|r| r.borrow().is_some()))
            {
                if let Some(old) = order.remove(i) {
                    map.remove(&old);
                }
            }
        }
        Begin::Run(tx)
    }
}

/// The reply a [`Begin::Wait`] or a run's receiver gets; None if the run ended
/// without one (the server stopped).
pub async fn reply_of(mut rx: watch::Receiver<Option<Reply>>) -> Option<Reply> {
    rx.wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|r| r.clone())
}

/// The answer to a stream opened after a newer one of its caller ([`Callers::attach`]):
/// the caller gave it up already; nothing of it is taken.
pub fn superseded() -> tonic::Status {
    tonic::Status::aborted(
        "a newer stream of this caller is open: this one is not taken (RESUME-1)",
    )
}

/// The answer to a resent call the server does not know (RESUME-2).
pub fn forgotten(call_id: u64, proc: Option<u32>) -> Reply {
    Reply {
        call_id,
        kind: ReplyKind::Lost as i32,
        payload: Bytes::from(
            "the server forgot this caller after a long silence (RESUME-3), so it cannot tell \
             whether this call, sent again after its connection broke, ran before the break; \
             it did not run it again",
        ),
        buffers: Vec::new(),
        proc,
    }
}

/// The caller id a request names (0: none, so nothing is resumed).
pub fn caller_of<T>(req: &tonic::Request<T>) -> u64 {
    hex_header(req, CALLER_HEADER).unwrap_or(0)
}

/// The number the caller gave this stream ([`STREAM_HEADER`]), if it gave one.
pub fn stream_of<T>(req: &tonic::Request<T>) -> Option<u64> {
    hex_header(req, STREAM_HEADER)
}

fn hex_header<T>(req: &tonic::Request<T>, name: &str) -> Option<u64> {
    req.metadata()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| u64::from_str_radix(s, 16).ok())
}

impl Callers {
    /// Adds the server's incarnation, and whether it `knew` the caller, to a
    /// `Messages` response (RESUME-1, RESUME-2).
    pub fn tag<T>(&self, mut resp: tonic::Response<T>, knew: bool) -> tonic::Response<T> {
        if let Ok(v) = format!("{:x}", self.incarnation).parse() {
            resp.metadata_mut().insert(INCARNATION_HEADER, v);
        }
        if knew {
            resp.metadata_mut().insert(
                KNEW_HEADER,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn reply(call_id: u64, proc: Option<u32>) -> Reply {
        Reply {
            call_id,
            kind: ReplyKind::Result as i32,
            proc,
            ..Default::default()
        }
    }

    fn got(call_id: u64, proc: Option<u32>) -> Received {
        Received { call_id, proc }
    }

    #[test]
    fn a_resent_call_runs_once_and_its_reply_comes_again_on_the_new_stream() {
        let c = Callers::default();
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (s1, _) = c.attach(7, None, tx1).unwrap();
        assert_eq!(c.admit(7, s1, 1, &[None], false), Admit::Run);
        assert_eq!(c.admit(7, s1, 2, &[None], false), Admit::Run);
        c.detach(7, s1); // the connection broke
        c.reply(7, reply(1, None)); // answered while nobody listened
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        let (s2, _) = c.attach(7, None, tx2).unwrap();
        assert_eq!(c.admit(7, s2, 1, &[None], true), Admit::Known);
        assert_eq!(rx2.try_recv().unwrap().call_id, 1);
        assert_eq!(c.admit(7, s2, 2, &[None], true), Admit::Known); // still running
        c.reply(7, reply(2, None));
        assert_eq!(rx2.try_recv().unwrap().call_id, 2);
        assert!(rx1.try_recv().is_err());
        c.received(7, &[got(1, None), got(2, None)]);
        assert_eq!(c.remembered(), 0);
    }

    #[test]
    fn a_resent_call_that_never_arrived_runs_once() {
        let c = Callers::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let (s, _) = c.attach(7, None, tx).unwrap();
        assert_eq!(c.admit(7, s, 5, &[None], true), Admit::Run);
        assert_eq!(c.admit(7, s, 5, &[None], true), Admit::Known);
        assert_eq!(c.admit(7, s, 6, &[None], false), Admit::Run);
        assert_eq!(c.admit(7, s, 6, &[None], false), Admit::Known);
    }

    #[test]
    fn a_call_read_late_from_an_older_stream_is_not_run() {
        let c = Callers::default();
        let (tx1, _rx1) = mpsc::unbounded_channel();
        let (s1, _) = c.attach(7, None, tx1).unwrap();
        let (tx2, _rx2) = mpsc::unbounded_channel();
        let (s2, _) = c.attach(7, None, tx2).unwrap(); // the caller resumed before the old stream ended
        assert_eq!(c.admit(7, s2, 3, &[None], true), Admit::Run);
        c.reply(7, reply(3, None));
        c.received(7, &[got(3, None)]);
        assert_eq!(c.admit(7, s1, 3, &[None], false), Admit::Stale);
        assert_eq!(c.remembered(), 0);
    }

    #[test]
    fn a_resync_forgets_what_the_caller_no_longer_waits_for() {
        let c = Callers::default();
        let (tx1, _rx1) = mpsc::unbounded_channel();
        let (s1, _) = c.attach(7, None, tx1).unwrap();
        for id in 1..=3 {
            assert_eq!(c.admit(7, s1, id, &[None], false), Admit::Run);
            c.reply(7, reply(id, None));
        }
        // The message saying 1 and 2 were received was lost with the stream.
        let (tx2, _rx2) = mpsc::unbounded_channel();
        let (s2, _) = c.attach(7, None, tx2).unwrap();
        c.resync(7, s1, &resync_of(&[])); // (an older stream's list is out of date: ignored)
        assert_eq!(c.remembered(), 3);
        c.resync(7, s2, &resync_of(&[3]));
        assert_eq!(c.remembered(), 1);
    }

    fn resync_of(waiting: &[u64]) -> Calls {
        Calls {
            resync: true,
            waiting: waiting.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_call_sent_again_with_a_resync_that_omits_it_stays_known() {
        // The client listed what it waits for after the call's reply came on the new
        // stream, and sent the call again in the same message: it must not run again.
        let c = Callers::default();
        let (tx0, _rx0) = mpsc::unbounded_channel();
        let (s0, _) = c.attach(7, Some(0), tx0).unwrap();
        assert_eq!(c.admit(7, s0, 5, &[None], false), Admit::Run);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (s1, _) = c.attach(7, Some(1), tx1).unwrap();
        c.reply(7, reply(5, None)); // answered on the new stream at once
        assert_eq!(rx1.try_recv().unwrap().call_id, 5);
        let mut batch = resync_of(&[]);
        batch.calls.push(crate::proto::v1::Call {
            call_id: 5,
            resent: true,
            ..Default::default()
        });
        c.resync(7, s1, &batch);
        assert_eq!(c.admit(7, s1, 5, &[None], true), Admit::Known);
    }

    #[test]
    fn a_call_read_from_an_older_stream_after_the_newest_closed_is_not_run() {
        // The broken stream's last call is read only after its caller resumed on a
        // newer stream, got the reply there, said so, and that stream closed too.
        let c = Callers::default();
        let (tx0, _rx0) = mpsc::unbounded_channel();
        let (s0, _) = c.attach(7, Some(0), tx0).unwrap();
        let (tx1, _rx1) = mpsc::unbounded_channel();
        let (s1, _) = c.attach(7, Some(1), tx1).unwrap();
        assert_eq!(c.admit(7, s1, 3, &[None], true), Admit::Run);
        c.reply(7, reply(3, None));
        c.received(7, &[got(3, None)]);
        c.detach(7, s1);
        assert_eq!(c.admit(7, s0, 3, &[None], false), Admit::Stale);
        assert_eq!(c.remembered(), 0);
    }

    #[test]
    fn an_attempt_accepted_after_a_newer_stream_of_its_caller_takes_nothing() {
        // The server accepts its connections in any order after a stop: the caller's
        // numbers, not the server's order, say which stream is the newest.
        let c = Callers::default();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        let (s2, _) = c.attach(7, Some(2), tx2).unwrap();
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        assert!(c.attach(7, Some(1), tx1).is_none());
        c.detach(7, 1); // (the given-up attempt ends: the newest is still open)
        assert_eq!(c.admit(7, s2, 4, &[None], true), Admit::Run);
        c.reply(7, reply(4, None));
        assert_eq!(rx2.try_recv().unwrap().call_id, 4);
        assert!(rx1.try_recv().is_err());
    }

    #[test]
    fn a_resent_call_of_a_forgotten_caller_never_runs() {
        let c = Callers::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let (s, _) = c.attach(4, None, tx).unwrap();
        assert_eq!(c.admit(4, s, 1, &[None], false), Admit::Run);
        c.detach(4, s);
        {
            let mut t = lock(&c.map);
            let idle = t.callers.get_mut(&4).unwrap();
            idle.idle_since = Instant::now().checked_sub(FORGET_AFTER);
        }
        let (tx, _rx) = mpsc::unbounded_channel();
        let _ = c.attach(5, None, tx).unwrap(); // any attach forgets the stale
        assert_eq!(c.remembered(), 0);
        let (tx, _rx) = mpsc::unbounded_channel();
        let (s, _) = c.attach(4, None, tx).unwrap(); // it comes back
        assert_eq!(c.admit(4, s, 1, &[None], true), Admit::Forgotten);
        assert_eq!(c.admit(4, s, 2, &[None], false), Admit::Run); // new calls run
        assert_eq!(c.admit(4, s, 2, &[None], true), Admit::Known);
    }

    #[test]
    fn a_fanned_call_is_remembered_per_proc() {
        let c = Callers::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (s, _) = c.attach(3, None, tx).unwrap();
        assert_eq!(c.admit(3, s, 9, &[Some(0), Some(1)], false), Admit::Run);
        c.reply(3, reply(9, Some(1)));
        assert_eq!(rx.try_recv().unwrap().proc, Some(1));
        c.received(3, &[got(9, Some(1))]);
        assert_eq!(c.remembered(), 1); // proc 0 still runs
        assert_eq!(c.admit(3, s, 9, &[Some(0), Some(1)], true), Admit::Known);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_known_call_is_answered_again_and_an_unknown_one_is_not_taken_for_it() {
        let c = Callers::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (s, _) = c.attach(1, None, tx).unwrap();
        assert!(!c.known(1, 5, &[None]));
        assert_eq!(c.admit(1, s, 5, &[None], false), Admit::Run);
        c.reply(1, reply(5, None));
        assert_eq!(rx.try_recv().unwrap().call_id, 5);
        assert!(c.known(1, 5, &[None])); // (a fenced resend: answered as it ran)
        assert_eq!(rx.try_recv().unwrap().call_id, 5);
        assert!(!c.known(2, 5, &[None]));
    }

    #[tokio::test]
    async fn a_request_sent_again_waits_for_the_one_run_and_gets_its_reply() {
        let r = Requests::default();
        let Begin::Run(done) = r.begin(9) else {
            panic!("a new request must run")
        };
        let Begin::Wait(again) = r.begin(9) else {
            panic!("a request seen before must not run again")
        };
        done.send(Some(reply(9, None))).unwrap();
        assert_eq!(reply_of(again).await.unwrap().call_id, 9);
        assert!(matches!(r.begin(10), Begin::Run(_)));
    }
}
