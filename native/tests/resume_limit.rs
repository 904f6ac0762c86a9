//! RESUME-5 without Python: with a resume limit (a worker's), calls to a peer that
//! stays unreachable fail as lost once the limit passes. Its own test binary: the
//! limit is the process's.

use bytes::Bytes;
use monarch_kernel_native::rpc::client::{set_resume_limit, WorkerConn};
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::RpcError;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{counting_dispatcher, runtime, target, Proxy};

#[test]
fn with_a_limit_calls_to_a_peer_unreachable_longer_fail_as_lost() {
    set_resume_limit(Some(Duration::from_secs(2)));
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    counting_dispatcher(&host, runs, Arc::new(AtomicBool::new(false)));
    let proxy = Proxy::start(&rt, host.addr.clone());
    let conn = WorkerConn::open(rt.handle(), &proxy.addr, "tok").unwrap();
    let p = Bytes::from_static(b"x");
    let slot = conn.call(&target(&p), 0).1.unwrap();
    std::thread::sleep(Duration::from_millis(300));
    proxy.set_cut(true);
    let out = slot.wait(Some(Duration::from_secs(60)));
    proxy.set_cut(false);
    let err = match out {
        Some(Err(e)) => e,
        other => panic!("the call did not fail: {other:?}"),
    };
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(err.to_string().contains("could not be reached"), "{err}");
    assert!(conn.lost().is_some());
    proxy.task.abort();
}
