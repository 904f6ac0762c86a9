//! RESUME-5 without Python: with a resume limit (a worker's), calls to a peer that
//! stays unreachable fail as lost once the limit passes. Its own test binary: the
//! limit is the process's.

use bytes::Bytes;
use monarch_kernel_native::rpc::client::set_resume_limit;
use monarch_kernel_native::rpc::RpcError;
use std::time::Duration;

mod common;

use common::{behind_proxy, runtime, target, Behind};

#[test]
fn with_a_limit_calls_to_a_peer_unreachable_longer_fail_as_lost() {
    set_resume_limit(Some(Duration::from_secs(2)));
    let rt = runtime();
    let Behind { proxy, conn, .. } = behind_proxy(&rt);
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
