//! Completion slots: how a reply produced on a runtime thread reaches a waiting
//! thread (a blocking `wait`) or a callback (an asyncio future).
//!
//! SLOT-1: a slot completes exactly once; later completions are ignored, so a reply
//! racing a connection loss cannot be seen twice.

use super::RpcError;
use crate::proto::v1::Reply;
use crate::sync::{lock, unpoison};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a call ends with.
pub type Outcome = Result<Reply, RpcError>;

/// A function run once when the slot completes, on the completing thread.
pub type Callback = Box<dyn FnOnce() + Send>;

enum State {
    /// The callbacks to run, and the bells to ring, when it completes (a bell in a
    /// field of its own: most slots have one, and no `Vec` is made for it).
    Pending(Vec<Callback>, Option<Arc<Bell>>, Vec<Arc<Bell>>),
    Done(Outcome),
}

/// Counts the completions of a set of slots for one waiter ([`Bell::wait`]): woken
/// once every slot is done or one has failed (a fail-fast wait on the slots of a call
/// to 1,024 procs), with no callback made, boxed and run per slot.
pub struct Bell {
    slots: usize,
    done: AtomicUsize,
    failed: AtomicBool,
    lock: Mutex<()>,
    rung: Condvar,
}

impl Bell {
    /// A bell for `slots` slots, each to be watched by [`Slot::ring_when_done`].
    pub fn new(slots: usize) -> Arc<Bell> {
        Arc::new(Bell {
            slots,
            done: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            lock: Mutex::new(()),
            rung: Condvar::new(),
        })
    }

    fn ring(&self, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::SeqCst);
        }
        let done = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if failed || done >= self.slots {
            // (under the lock: a waiter that saw it unsettled is waiting by now)
            let _held = lock(&self.lock);
            self.rung.notify_all();
        }
    }

    /// Whether every slot is done or one has failed.
    pub fn settled(&self) -> bool {
        self.failed.load(Ordering::SeqCst) || self.done.load(Ordering::SeqCst) >= self.slots
    }

    /// Waits up to `timeout` until [`settled`](Self::settled); whether it is.
    pub fn wait(&self, timeout: Duration) -> bool {
        let held = lock(&self.lock);
        if self.settled() {
            return true;
        }
        drop(unpoison(self.rung.wait_timeout(held, timeout)));
        self.settled()
    }
}

/// One pending call's result.
pub struct Slot {
    /// Guards the state; held only for short, non-blocking sections.
    state: Mutex<State>,
    /// Wakes threads blocked in [`Slot::wait`].
    ready: Condvar,
    /// How many threads are blocked in [`Slot::wait`] (counted under `state`): a
    /// slot nobody waits on completes without a wake-up call into the kernel (most
    /// slots of a call to 1,024 procs are read once every reply is in).
    waiters: AtomicUsize,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            state: Mutex::new(State::Pending(Vec::new(), None, Vec::new())),
            ready: Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }
}

impl Slot {
    /// A new pending slot.
    pub fn new() -> Arc<Self> {
        Arc::new(Slot::default())
    }

    /// A slot that is already complete.
    pub fn done_with(outcome: Outcome) -> Arc<Self> {
        let s = Slot::new();
        s.complete(outcome);
        s
    }

    /// Completes the slot (SLOT-1), then runs the callbacks outside the lock.
    pub fn complete(&self, outcome: Outcome) {
        let failed = outcome.is_err();
        let (callbacks, bell, bells) = {
            let mut st = lock(&self.state);
            match &mut *st {
                State::Done(_) => return,
                State::Pending(cbs, bell, bells) => {
                    let taken = (std::mem::take(cbs), bell.take(), std::mem::take(bells));
                    *st = State::Done(outcome);
                    taken
                }
            }
        };
        // (a waiter counts itself before it releases the lock to wait, and the state
        // was set under that lock: one that waits is counted here)
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.ready.notify_all();
        }
        for bell in bell.into_iter().chain(bells) {
            bell.ring(failed);
        }
        for cb in callbacks {
            cb();
        }
    }

    /// The outcome if complete, without waiting.
    pub fn outcome(&self) -> Option<Outcome> {
        self.peek(|o| o.cloned())
    }

    /// `f` of the outcome (None while pending), under the slot's lock: keep it short.
    pub fn peek<R>(&self, f: impl FnOnce(Option<&Outcome>) -> R) -> R {
        match &*lock(&self.state) {
            State::Done(o) => f(Some(o)),
            State::Pending(..) => f(None),
        }
    }

    /// True once complete.
    pub fn is_done(&self) -> bool {
        self.peek(|o| o.is_some())
    }

    /// Runs `cb` when the slot completes (at once, on this thread, if it already has).
    pub fn on_done(&self, cb: Callback) {
        let mut st = lock(&self.state);
        match &mut *st {
            State::Pending(cbs, ..) => cbs.push(cb),
            State::Done(_) => {
                drop(st);
                cb();
            }
        }
    }

    /// Rings `bell` when the slot completes (at once if it already has), saying
    /// whether it failed.
    pub fn ring_when_done(&self, bell: &Arc<Bell>) {
        let mut st = lock(&self.state);
        match &mut *st {
            State::Pending(_, watch @ None, _) => *watch = Some(bell.clone()),
            State::Pending(_, Some(_), more) => more.push(bell.clone()),
            State::Done(o) => {
                let failed = o.is_err();
                drop(st);
                bell.ring(failed);
            }
        }
    }

    /// Waits up to `timeout` (forever if `None`); `None` if still pending then.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Outcome> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = lock(&self.state);
        loop {
            if let State::Done(o) = &*st {
                return Some(o.clone());
            }
            let wait = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    Some(d - now)
                }
            };
            self.waiters.fetch_add(1, Ordering::SeqCst);
            st = match wait {
                None => unpoison(self.ready.wait(st)),
                Some(t) => unpoison(self.ready.wait_timeout(st, t)).0,
            };
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn completes_once_and_wakes_waiters() {
        let s = Slot::new();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.wait(None));
        s.complete(Ok(Reply {
            call_id: 7,
            ..Default::default()
        }));
        s.complete(Err(RpcError::Io("late".into())));
        let got = t.join().unwrap().unwrap().unwrap();
        assert_eq!(got.call_id, 7);
    }

    #[test]
    fn wait_times_out_while_pending() {
        let s = Slot::new();
        assert!(s.wait(Some(Duration::from_millis(10))).is_none());
        assert!(!s.is_done());
    }

    #[test]
    fn callbacks_run_once_whether_added_before_or_after() {
        let n = Arc::new(AtomicUsize::new(0));
        let s = Slot::new();
        let n1 = n.clone();
        s.on_done(Box::new(move || {
            n1.fetch_add(1, Ordering::SeqCst);
        }));
        s.complete(Err(RpcError::Io("x".into())));
        let n2 = n.clone();
        s.on_done(Box::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_bell_rings_when_all_are_done_or_at_once_when_one_fails() {
        let (a, b, c) = (Slot::new(), Slot::new(), Slot::new());
        let bell = Bell::new(3);
        let other = Bell::new(1); // a second waiter on `a`
        a.ring_when_done(&bell);
        a.ring_when_done(&other);
        b.complete(Ok(Reply::default()));
        b.ring_when_done(&bell); // done before it was watched
        c.ring_when_done(&bell);
        assert!(!bell.wait(Duration::from_millis(5)));
        a.complete(Ok(Reply::default()));
        assert!(other.settled());
        assert!(!bell.settled());
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c2.complete(Ok(Reply::default()));
        });
        assert!(bell.wait(Duration::from_secs(60)));
        t.join().unwrap();

        let (d, e) = (Slot::new(), Slot::new());
        let bell = Bell::new(2);
        d.ring_when_done(&bell);
        e.ring_when_done(&bell);
        e.complete(Err(RpcError::Io("gone".into())));
        assert!(
            bell.settled(),
            "a failure settles it while the other is pending"
        );
        assert!(!d.is_done());
    }
}
