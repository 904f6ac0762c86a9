//! A lane of the inbox (INBOX-1, INBOX-3): one queue, the eventfd that says it is
//! non-empty, and the epoll its thread waits on (the eventfd, and the worker's pipes
//! if it reads them: PIPE-2).

use super::inbox::Incoming;
use super::pipe_in;
use super::RpcError;
use crate::sync::lock;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

thread_local! {
    /// PIPE-2: the lane this thread reads the pipe for: what it queues there needs no signal.
    static READING_FOR: std::cell::Cell<*const Lane> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// One queue and the eventfd that says it is non-empty (INBOX-1).
pub struct Lane {
    /// Items not yet taken by the dispatcher.
    queue: Mutex<VecDeque<Incoming>>,
    efd: OwnedFd,
    /// Set by [`Lane::wake`] (its thread has jobs to look at, or is to stop), read by
    /// a thread that serves calls between them ([`Lane::take_woken`]).
    woken: AtomicBool,
    /// What its thread waits on: `efd` (reported as 0), and the worker's pipes if it
    /// reads them (PIPE-2: reported by their ids).
    pub(super) ep: OwnedFd,
}

impl Lane {
    pub(super) fn new() -> Result<Self, RpcError> {
        let io = |e: std::io::Error| RpcError::Io(e.to_string());
        // SAFETY: eventfd has no memory-safety preconditions; we check the result.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ep = pipe_in::epoll().map_err(io)?;
        pipe_in::watch(ep.as_raw_fd(), efd.as_raw_fd(), 0, false);
        Ok(Lane {
            queue: Mutex::new(VecDeque::new()),
            efd,
            woken: AtomicBool::new(false),
            ep,
        })
    }

    /// Queues `item`, and signals the eventfd if the queue was empty (INBOX-1), unless
    /// this thread is reading the pipe for this lane and takes it next (PIPE-2).
    pub(super) fn push(&self, item: Incoming) {
        let was_empty = {
            let mut q = lock(&self.queue);
            let was_empty = q.is_empty();
            q.push_back(item);
            was_empty
        };
        if was_empty && !READING_FOR.with(|r| std::ptr::eq(r.get(), self)) {
            self.signal();
        }
    }

    /// Makes a waiter on this lane return (with whatever is queued, maybe nothing).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd. A full counter
        // (EAGAIN) still leaves it readable, which is all INBOX-1 needs.
        unsafe {
            libc::write(
                self.efd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }

    /// Makes a waiter on this lane return as [`Lane::signal`] does, and says why: its
    /// thread is wanted outside the lane (LANE-2: a job, its stop, an interrupt).
    pub fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        self.signal();
    }

    /// Whether [`Lane::wake`] was called since the last time this was asked.
    pub fn take_woken(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }

    /// The eventfd to wait on (INBOX-1).
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Like [`Lane::take`], but first waits up to `timeout` (None: with no limit) for
    /// an item (or a [`Lane::signal`]) if there is none. Blocks: call it without the GIL.
    ///
    /// LANE-1: a signal sent before the call (a job submitted while the thread was
    /// still looking at its jobs) is not lost: it makes the call return at once,
    /// maybe empty, so the thread looks at its jobs again.
    pub fn take_wait(&self, timeout: Option<Duration>) -> Vec<Incoming> {
        self.wait_then_take(timeout, |_| {}, |_| {}).0
    }

    /// [`Lane::take_wait`], reading the pipe with id `p` by `read_pipe(p)` when it is
    /// what woke the thread (PIPE-2); a pipe's calls for other lanes do not end the
    /// wait, and after them `elsewhere(p)` (the lane steps back among the pipe's
    /// readers). Also whether the items came with a pipe this thread read.
    pub(super) fn wait_then_take(
        &self,
        timeout: Option<Duration>,
        read_pipe: impl Fn(u64),
        elsewhere: impl Fn(u64),
    ) -> (Vec<Incoming>, bool) {
        let until = timeout.map(|t| Instant::now() + t);
        let mut read = Vec::new();
        // Whether the last wait said the eventfd is not set: what this thread then
        // queued from the pipe is taken without reading the eventfd (a signal sent
        // since stays set, and the next wait returns at once for it).
        let mut efd_clear = false;
        loop {
            if efd_clear {
                let items: Vec<Incoming> = lock(&self.queue).drain(..).collect();
                if !items.is_empty() {
                    return (items, !read.is_empty());
                }
            } else if !lock(&self.queue).is_empty() {
                return (self.take(), !read.is_empty());
            }
            // (nothing queued: a signal is seen by the wait, which reports the eventfd)
            for p in read.drain(..) {
                elsewhere(p);
            }
            let ms = until.map_or(-1, |u| {
                let left = u.saturating_duration_since(Instant::now());
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            });
            let ready = pipe_in::wait(self.ep.as_raw_fd(), ms);
            READING_FOR.with(|r| r.set(self));
            for &p in ready.iter().filter(|&&p| p != 0) {
                read_pipe(p);
                read.push(p);
            }
            READING_FOR.with(|r| r.set(std::ptr::null())); // (what it queued: taken above)
            if ready.is_empty() || ready.contains(&0) {
                // (the time is up, or a signal or an item came)
                return (self.take(), !read.is_empty());
            }
            efd_clear = true;
        }
    }

    /// Takes every queued item and clears the eventfd.
    pub fn take(&self) -> Vec<Incoming> {
        let mut buf: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking eventfd.
        unsafe {
            libc::read(
                self.efd.as_raw_fd(),
                &mut buf as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        lock(&self.queue).drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::v1::Call;
    use std::io::Read;
    use std::sync::mpsc;
    use std::sync::Arc;

    #[test]
    fn a_signal_sent_before_the_wait_is_not_lost() {
        // LANE-1: a lane thread looks at its jobs, finds none, and only then waits; a
        // job submitted in between signals before the wait begins. The wait must
        // return (its thread then finds the job), not sleep on with the job queued.
        let lane = Arc::new(Lane::new().unwrap());
        lane.signal();
        assert_eq!(
            waited(&lane),
            Ok(0),
            "the wait slept on through a signal sent before it"
        );
        // With nothing sent since, a wait blocks until a signal comes.
        let (tx, rx) = mpsc::channel();
        let waiter = lane.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiter.take_wait(None).len());
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        lane.signal();
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(0));
    }

    #[test]
    fn a_wake_ends_the_wait_and_is_told_once_and_an_item_is_not_a_wake() {
        // LANE-2: a thread serving calls returns to its jobs only when woken: an item
        // pushed must not say so, a wake must say so once.
        let lane = Arc::new(Lane::new().unwrap());
        lane.push(Incoming::of(Call::default()));
        assert_eq!(lane.take_wait(None).len(), 1);
        assert!(!lane.take_woken(), "an item read as a wake");
        lane.wake();
        assert_eq!(waited(&lane), Ok(0), "a wake did not end the wait");
        assert!(lane.take_woken(), "a wake was not told");
        assert!(!lane.take_woken(), "a wake was told twice");
    }

    #[test]
    fn a_signal_sent_while_its_thread_reads_the_pipe_ends_the_next_wait() {
        // PIPE-2: a wait that the pipe alone woke takes what its thread queued from it
        // without reading the eventfd (a system call per call); a signal another thread
        // sent meanwhile (a job, a stop) must then end the next wait at once.
        use std::io::Write;
        let lane = Arc::new(Lane::new().unwrap());
        let (mut agent, worker) = std::os::unix::net::UnixStream::pair().unwrap();
        worker.set_nonblocking(true).unwrap();
        pipe_in::watch(lane.ep.as_raw_fd(), worker.as_raw_fd(), 7, false);
        agent.write_all(b"x").unwrap();
        let read_pipe = |p: u64| {
            assert_eq!(p, 7);
            let mut byte = [0u8; 1];
            assert_eq!((&worker).read(&mut byte).unwrap(), 1);
            lock(&lane.queue).push_back(Incoming::of(Call::default()));
            lane.signal(); // (as another thread would, while this one reads)
        };
        let (items, read) = lane.wait_then_take(None, read_pipe, |_| {});
        assert_eq!((items.len(), read), (1, true));
        assert_eq!(
            waited(&lane),
            Ok(0),
            "a signal sent during the read did not end the next wait"
        );
    }

    /// How many items a `take_wait` on `lane` in another thread returned, if it
    /// returned within 30 s (else it is signalled, to let its thread go).
    fn waited(lane: &Arc<Lane>) -> Result<usize, mpsc::RecvTimeoutError> {
        let (tx, rx) = mpsc::channel();
        let waiter = lane.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiter.take_wait(None).len());
        });
        let got = rx.recv_timeout(Duration::from_secs(30));
        if got.is_err() {
            lane.signal();
        }
        got
    }
}
