//! PIPE-2: the worker's end of a pipe (PIPE-1), read by whichever of the worker's
//! threads is idle: one thread wake-up per relayed call, not two.
//!
//! Why: at 1,024 procs on a host's few CPUs a call's cost is mostly the wake-ups of the
//! processes it reaches. With the runtime reading the pipe, a call woke the worker's
//! runtime thread (read, queue) and then the actor's thread (run, reply). Here the
//! socket is watched by no runtime: each sync actor's lane thread waits on its lane's
//! eventfd *and* on the pipe, which it holds with `EPOLLEXCLUSIVE`, and so does one
//! thread of the pipe's own, registered last. The kernel wakes the first of them that
//! is waiting (an exclusive waiter that is busy is passed over, and finds the socket
//! ready, if still unread, on its next wait), so a call to an idle actor wakes that
//! actor's thread, which reads the call, queues it as the runtime did (fencing,
//! XFER-2's prefetch) and runs it; a call that arrives while every actor is busy wakes
//! the pipe's thread, which only queues it. Calls to other lanes are queued by the
//! reader and wake their lane as before.
//!
//! Order (ORDER-1): one reader at a time (`reader`'s lock covers the read and the
//! queueing), so calls are queued in the order they were written. A lane opened after
//! the pipe puts itself before the pipe's thread (it registers, then the pipe's thread
//! registers again: the kernel keeps exclusive waiters in registration order).
//!
//! `MONARCH_PIPE_LANES=0` in the worker's environment leaves the reading to the pipe's
//! thread (the A/B knob).

use super::auth::TokenCheck;
use super::inbox::{Inbox, Incoming, Kind, Lane, Sink};
use super::pipe::{self, PipeWriter};
use super::server::fenced;
use crate::proto::v1::{Calls, Replies};
use crate::sync::{lock, unpoison};
use bytes::BytesMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an opened pipe has to present the token.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// Whether lane threads read pipes (`MONARCH_PIPE_LANES=0` says no).
pub fn lanes_read() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MONARCH_PIPE_LANES").map_or(true, |v| v != "0"))
}

/// A new epoll instance.
pub(crate) fn epoll() -> std::io::Result<OwnedFd> {
    // SAFETY: epoll_create1 has no memory-safety preconditions; we check the result.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `fd` for reading in `ep`, reported with `data`; `exclusive`: as one of the
/// waiters of which the kernel wakes only the first that waits.
pub(crate) fn watch(ep: RawFd, fd: RawFd, data: u64, exclusive: bool) {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32
            | if exclusive {
                libc::EPOLLEXCLUSIVE as u32
            } else {
                0
            },
        u64: data,
    };
    // SAFETY: registers a descriptor we hold in an epoll instance we hold.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
}

/// Stops watching `fd` in `ep` (nothing if it was not watched).
pub(crate) fn unwatch(ep: RawFd, fd: RawFd) {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: as in `watch`.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut ev) };
}

/// Waits up to `ms` (-1: with no limit) on `ep`; the data of what is ready.
pub(crate) fn wait(ep: RawFd, ms: i32) -> Vec<u64> {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
    // SAFETY: epoll_wait fills at most 4 entries of a live array of 4.
    let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, ms) };
    evs[..n.max(0) as usize].iter().map(|e| e.u64).collect()
}

/// The worker's end of one agent's pipe.
pub(crate) struct PipeIn {
    /// Its number among the worker's pipes (what the lanes' epolls report; never 0).
    pub(crate) id: u64,
    stream: Arc<UnixStream>,
    /// Bytes read and not yet a whole frame; the lock of the one reader at a time.
    reader: Mutex<BytesMut>,
    ended: AtomicBool,
    writer: Arc<PipeWriter>,
    /// The mesh token, for XFER-2's prefetch.
    token: Arc<str>,
    /// The pipe's own thread's epoll: the pipe, last of its exclusive waiters.
    ep: OwnedFd,
}

impl PipeIn {
    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Makes the lane with epoll `ep` a waiter of the pipe, the last before the pipe's
    /// own thread (which registers again behind it).
    pub(crate) fn watch_from(&self, ep: RawFd) {
        watch(ep, self.fd(), self.id, true);
        self.rewatch();
    }

    /// Puts the pipe's own thread last among the pipe's waiters again (after a lane
    /// registered), so that an idle lane is woken before it.
    pub(crate) fn rewatch(&self) {
        unwatch(self.ep.as_raw_fd(), self.fd());
        // (a socket ready meanwhile is reported at once: no call is left unread)
        watch(self.ep.as_raw_fd(), self.fd(), self.id, true);
    }

    /// Ends the pipe in both directions: its thread and the agent see the end. (Its
    /// caller also has the lanes forget it: an ended socket is always readable.)
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        // SAFETY: shuts down a socket `stream` holds open.
        unsafe { libc::shutdown(self.fd(), libc::SHUT_RDWR) };
    }

    /// Reads what the socket has, and queues its whole frames' calls in `inbox`: how
    /// many. Ends the pipe (and forgets it) at the end of the stream, a malformed or
    /// oversized frame, or a read error; never blocks.
    pub(crate) fn read(&self, inbox: &Inbox) -> u64 {
        let mut buf = lock(&self.reader);
        let mut queued = 0;
        if self.ended.load(Ordering::SeqCst) {
            return 0;
        }
        if !self.queue_frames(&mut buf, inbox, &mut queued) {
            self.close(inbox);
            return queued;
        }
        loop {
            let room = buf.capacity() - buf.len();
            let ok = match pipe::read_into(self.fd(), &mut buf) {
                Ok(0) => false,
                Ok(n) => {
                    let ok = self.queue_frames(&mut buf, inbox, &mut queued);
                    // A read short of the room took all the socket had: what comes
                    // later is reported by the waits (level-triggered), so no second
                    // read to hear `EAGAIN` (a system call per call).
                    if ok && n < room {
                        return queued;
                    }
                    ok
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return queued,
                Err(e) => e.kind() == std::io::ErrorKind::Interrupted,
            };
            if !ok {
                self.close(inbox);
                return queued;
            }
        }
    }

    fn close(&self, inbox: &Inbox) {
        inbox.forget_pipe(self.id);
        self.end(); // (if it was not in the list yet)
    }

    /// Queues the calls of every whole frame in `buf`; false for a bad frame (a
    /// malformed one ends the pipe: the agent's calls on it fail as lost).
    fn queue_frames(&self, buf: &mut BytesMut, inbox: &Inbox, queued: &mut u64) -> bool {
        loop {
            let frame = match pipe::take_frame(buf) {
                Ok(Some(f)) => f,
                Ok(None) => return true,
                Err(_) => return false,
            };
            let Ok(batch) = <Calls as prost::Message>::decode(frame) else {
                return false;
            };
            for c in batch.calls {
                inbox.received.fetch_add(1, Ordering::Relaxed);
                if let Err(m) = inbox.admit(c.epoch) {
                    if !c.oneway {
                        self.writer.send_reply(fenced(c.call_id, m));
                    }
                    continue;
                }
                let sink = (!c.oneway).then(|| Sink::Pipe(self.writer.clone(), c.call_id));
                // (XFER-2; nothing for a message with no buffers by reference)
                crate::transfer::prefetch(&c.payload, &c.buffers, self.token.as_bytes());
                inbox.push(Incoming::of(c), sink);
                *queued += 1;
            }
            if let Some(ping) = batch.ping {
                // PIPE-3: answered here, as the `Ping` RPC answers.
                inbox.pipe_pings.fetch_add(1, Ordering::Relaxed);
                self.writer.send(pipe::frame(&Replies {
                    replies: Vec::new(),
                    pong: Some(inbox.pong(&ping)),
                }));
            }
        }
    }
}

/// Serves a pipe an agent opened (`stream`, of this user: checked) on a thread of its
/// own: the token first (within [`HELLO_WITHIN`]), then calls, read by that thread or
/// an idle lane's (see the module doc) until the pipe or the worker ends.
pub(crate) fn serve(stream: UnixStream, inbox: Arc<Inbox>, auth: TokenCheck, token: Arc<str>) {
    let run = move || {
        let Ok(ep) = epoll() else { return };
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let stream = Arc::new(stream);
        let mut buf = BytesMut::with_capacity(64 * 1024);
        if !hello(&stream, &mut buf, &auth) {
            return; // (not the mesh's agent: closed unanswered)
        }
        let fd: pipe::Fd = stream.clone();
        let p = Arc::new(PipeIn {
            // (its number among the pipes opened with the token: never 0)
            id: inbox.pipes.fetch_add(1, Ordering::Relaxed) + 1,
            writer: PipeWriter::new(fd),
            stream,
            reader: Mutex::new(buf),
            ended: AtomicBool::new(false),
            token,
            ep,
        });
        inbox.add_pipe(p.clone());
        // (frames that came with the token are in the buffer already: queue them)
        p.read(&inbox);
        while !p.ended.load(Ordering::SeqCst) {
            if !wait(p.ep.as_raw_fd(), -1).is_empty() {
                p.read(&inbox);
            }
        }
    };
    let spawned = std::thread::Builder::new()
        .name("monarch-pipe".into())
        .spawn(run);
    drop(spawned); // (no thread: the stream is dropped with the closure, closing it)
}

/// Reads the first frame within [`HELLO_WITHIN`]: whether it is the mesh token. What
/// came after it stays in `buf`.
fn hello(stream: &UnixStream, buf: &mut BytesMut, auth: &TokenCheck) -> bool {
    let until = Instant::now() + HELLO_WITHIN;
    loop {
        match pipe::take_frame(buf) {
            Ok(Some(hello)) => return auth.accepts(&hello),
            Ok(None) => {}
            Err(_) => return false,
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one valid pollfd that lives for the call.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
        match pipe::read_into(stream.as_raw_fd(), buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return false,
        }
    }
}

/// The pipes of an inbox (PIPE-2, PIPE-3).
impl Inbox {
    /// [`Lane::take_wait`] on `lane`, reading the pipes that wake it (PIPE-2). A lane
    /// woken by calls that were all for other lanes steps back behind the pipe's other
    /// readers (but before the pipe's own thread), so that the lane those calls are
    /// for is woken first next time: with several sync actors on a worker, the one
    /// being called soon reads its own calls.
    pub fn take_wait(&self, lane: &Lane, timeout: Option<Duration>) -> Vec<Incoming> {
        let pipe = |id: u64| lock(&self.pipe_list).iter().find(|p| p.id == id).cloned();
        let (items, read) = lane.wait_then_take(
            timeout,
            |id| {
                if let Some(p) = pipe(id) {
                    p.read(self);
                }
            },
            |id| {
                let pipes = lock(&self.pipe_list);
                if let Some(p) = pipes.iter().find(|p| p.id == id) {
                    unwatch(lane.ep.as_raw_fd(), p.fd());
                    p.watch_from(lane.ep.as_raw_fd());
                }
            },
        );
        if read {
            let calls = items.iter().filter(|i| i.kind == Kind::Call).count();
            self.lane_reads.fetch_add(calls as u64, Ordering::Relaxed);
        }
        items
    }

    /// How many pings were answered on pipes (PIPE-3).
    pub fn pipe_pings(&self) -> u64 {
        self.pipe_pings.load(Ordering::Relaxed)
    }

    /// How many calls lane threads took that they had read from a pipe themselves
    /// (PIPE-2): calls that cost their worker one wake-up.
    pub fn read_by_lanes(&self) -> u64 {
        self.lane_reads.load(Ordering::Relaxed)
    }

    /// Starts reading pipe `p` (PIPE-2): the lanes that read pipes first, its own
    /// thread last.
    pub(crate) fn add_pipe(&self, p: Arc<PipeIn>) {
        let mut pipes = lock(&self.pipe_list);
        if lanes_read() {
            for lane in self.reading_lanes() {
                watch(lane.ep.as_raw_fd(), p.fd(), p.id, true);
            }
        }
        p.rewatch();
        pipes.push(p);
    }

    /// Ends pipe `id` and stops the lanes watching it (an ended socket is always
    /// readable); nothing if it is gone already.
    pub(crate) fn forget_pipe(&self, id: u64) {
        let mut pipes = lock(&self.pipe_list);
        let Some(at) = pipes.iter().position(|p| p.id == id) else {
            return;
        };
        let p = pipes.remove(at);
        for lane in self.reading_lanes() {
            unwatch(lane.ep.as_raw_fd(), p.fd());
        }
        p.end();
    }

    /// The open lanes that read pipes (all but [`LANE_LOOP`]).
    fn reading_lanes(&self) -> Vec<Arc<Lane>> {
        let lanes = unpoison(self.lanes.read());
        lanes.iter().skip(1).flatten().cloned().collect()
    }
}
