//! The node runtime: the one tokio runtime of this process.
//!
//! Every subsystem (servers, clients, the agent) runs its tasks here. It is created on
//! first use and shut down once, from Python's atexit with the GIL released
//! ([`shutdown`]). NODE-1: no code in this crate creates a second runtime.

use crate::sync::lock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};

/// Owns the runtime so that [`shutdown`] can take it; `None` once shut down.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);
/// A cheap handle for spawning, set together with `RUNTIME`.
static HANDLE: OnceLock<Handle> = OnceLock::new();

/// How many threads run the runtime's tasks (NODE-2): 2 unless the process said
/// otherwise before its first use.
static THREADS: AtomicUsize = AtomicUsize::new(2);

/// NODE-2: sets how many threads run the runtime's tasks; only before its first use
/// (false after: the runtime keeps the threads it started with). A worker and an
/// agent take one: their tasks are a few connections' I/O, and with two, a message
/// that one thread reads often wakes the other to run its task (more switches per
/// call, on CPUs that a host's procs share). A controller keeps two.
pub fn set_threads(n: usize) -> bool {
    if HANDLE.get().is_some() {
        return false;
    }
    THREADS.store(n.max(1), Ordering::SeqCst);
    true
}

/// The handle of this process's runtime, creating the runtime on first use.
pub fn handle() -> &'static Handle {
    HANDLE.get_or_init(|| {
        let workers = THREADS.load(Ordering::SeqCst);
        let started = AtomicUsize::new(0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            // The runtime starts its task threads as it is built, before any thread of
            // its blocking pool: those are named apart, so a process's task threads can
            // be counted (NODE-2) and their CPU read apart.
            .thread_name_fn(move || {
                if started.fetch_add(1, Ordering::SeqCst) < workers {
                    "monarch-node".into()
                } else {
                    "monarch-block".into()
                }
            })
            .enable_all()
            .build()
            .expect("cannot start the tokio runtime (out of threads or file descriptors?)");
        let handle = rt.handle().clone();
        *lock(&RUNTIME) = Some(rt);
        handle
    })
}

/// Stops the runtime, giving running tasks `grace` to finish. Later calls do nothing.
pub fn shutdown(grace: Duration) {
    let rt = lock(&RUNTIME).take();
    if let Some(rt) = rt {
        rt.shutdown_timeout(grace);
    }
}
