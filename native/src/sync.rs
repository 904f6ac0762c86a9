//! Poison-tolerant locking, the one policy for every `std::sync` lock of the crate.
//!
//! A lock is poisoned when a thread panicked while holding it. Here that is no reason
//! to stop: the tables and flags behind the crate's locks are kept consistent between
//! statements, so a holder's panic leaves them usable, and the panic itself is reported
//! where it happened. Failing every later caller instead would turn one bug into a dead
//! connection, agent or runtime, so a poisoned lock is used as it is.
//!
//! [`lock`] is a function rather than an extension method so that call sites read
//! `lock(&self.pending)`, naming the field they lock, like the local helpers it
//! replaces; [`unpoison`] is the same policy for the other lock results (a `RwLock`'s
//! guards, a `Condvar`'s waits).

use std::sync::{LockResult, Mutex, MutexGuard};

/// Locks `m`, going on with the data if a holder panicked (see the module doc).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoison(m.lock())
}

/// The guard (or guard and wait result) of a lock operation, poisoned or not: the one
/// place poisoning is tolerated (see the module doc).
pub(crate) fn unpoison<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, RwLock};
    use std::time::Duration;

    /// `value` after a thread panicked while `hold` had it locked.
    fn poisoned<T: Send + Sync + 'static>(value: T, hold: fn(&T)) -> Arc<T> {
        let shared = Arc::new(value);
        let s = shared.clone();
        let _ = std::thread::spawn(move || hold(&s)).join();
        shared
    }

    #[test]
    fn a_mutex_poisoned_by_a_panicking_holder_still_locks_with_its_data() {
        let m = poisoned(Mutex::new(7), |m| {
            let _g = m.lock();
            panic!("a holder panics");
        });
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
        *lock(&m) = 8;
        assert_eq!(*lock(&m), 8);
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let rw = poisoned(RwLock::new(1), |rw| {
            let _g = rw.write();
            panic!("a holder panics");
        });
        assert!(rw.is_poisoned());
        *unpoison(rw.write()) += 1;
        assert_eq!(*unpoison(rw.read()), 2);
    }

    #[test]
    fn a_wait_on_a_poisoned_mutex_returns_its_guard() {
        let m = poisoned(Mutex::new(false), |m| {
            let _g = m.lock();
            panic!("a holder panics");
        });
        let cv = Condvar::new();
        let (g, timeout) = unpoison(cv.wait_timeout(lock(&m), Duration::from_millis(1)));
        assert!(timeout.timed_out());
        assert!(!*g);
    }
}
