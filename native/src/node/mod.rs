//! The node runtime: the one tokio runtime of this process.
//!
//! Every subsystem (servers, clients, the agent) runs its tasks here. It is created on
//! first use and shut down once, from Python's atexit with the GIL released
//! ([`shutdown`]). NODE-1: no code in this crate creates a second runtime.

use crate::sync::lock;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::{Handle, Runtime};

/// Owns the runtime so that [`shutdown`] can take it; `None` once shut down.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);
/// A cheap handle for spawning, set together with `RUNTIME`.
static HANDLE: OnceLock<Handle> = OnceLock::new();

/// The handle of this process's runtime, creating the runtime on first use.
pub fn handle() -> &'static Handle {
    HANDLE.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("monarch-node")
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
