//! RESUME-1 end to end, without Python: a client talks to a worker through a TCP
//! proxy on loopback that can stall every byte (a partition: nothing is refused,
//! nothing arrives) and heal, or close for good (the worker's host refusing).

use bytes::Bytes;
use monarch_kernel_native::proto::v1::ReplyKind;
use monarch_kernel_native::rpc::client::{reply_kind, WorkerConn};
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::RpcError;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod common;

use common::{behind_proxy, runtime, target, wait_ran, Behind, Proxy};

#[test]
fn calls_across_a_partition_wait_then_complete_once_each() {
    let rt = runtime();
    let Behind {
        host,
        runs,
        gate,
        proxy,
        conn,
    } = behind_proxy(&rt);

    // `a` arrives and runs; the link is cut before its reply can come back.
    let a = Bytes::from_static(b"a");
    let slot_a = conn.call(&target(&a), 0).1.unwrap();
    wait_ran(&runs, &a);
    proxy.set_cut(true);
    gate.store(true, Ordering::SeqCst); // a's reply is made while nothing gets through
                                        // `b` is sent into the partition.
    let b = Bytes::from_static(b"b");
    let slot_b = conn.call(&target(&b), 0).1.unwrap();
    // Longer than the keepalive (1 s + 3 s): the client drops the connection.
    std::thread::sleep(Duration::from_secs(6));
    assert!(!slot_a.is_done(), "call a ended during the partition");
    assert!(!slot_b.is_done(), "call b ended during the partition");
    assert!(conn.lost().is_none(), "{:?}", conn.lost());
    proxy.set_cut(false);

    for (slot, p) in [(slot_a, &a), (slot_b, &b)] {
        let r = slot
            .wait(Some(Duration::from_secs(30)))
            .expect("no reply after the partition");
        let r = r.unwrap_or_else(|e| panic!("call {p:?} failed: {e}"));
        assert_eq!(reply_kind(&r), ReplyKind::Result);
        assert_eq!(&r.payload, p);
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.get(&a), Some(&1), "{runs:?}");
    assert_eq!(runs.get(&b), Some(&1), "{runs:?}");
    // The worker forgets a reply once the client says it has it (RESUME-1).
    let c = Bytes::from_static(b"c");
    let slot_c = conn.call(&target(&c), 0).1.unwrap();
    assert!(slot_c.wait(Some(Duration::from_secs(30))).unwrap().is_ok());
    let d = Bytes::from_static(b"d");
    let slot_d = conn.call(&target(&d), 0).1.unwrap();
    assert!(slot_d.wait(Some(Duration::from_secs(30))).unwrap().is_ok());
    // The server reads a message's acknowledgements after it has queued the message's
    // calls (processed first, an acknowledgement of a call the same message sends
    // again would let it run twice), so `d` can be answered before the server reads
    // that `c` arrived: on a loaded machine the count is briefly 2.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while host.inbox.remembered() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(host.inbox.remembered() <= 1, "{}", host.inbox.remembered());
    proxy.task.abort();
}

#[test]
fn a_call_to_a_worker_that_is_gone_after_a_break_fails_at_once() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let proxy = Proxy::start(&rt, host.addr.clone());
    let conn = WorkerConn::open(rt.handle(), &proxy.addr, "tok").unwrap();
    let p = Bytes::from_static(b"x");
    let pending = conn.call(&target(&p), 0).1.unwrap();
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    assert!(!lane.take_wait(Some(Duration::from_secs(10))).is_empty());
    // The process is gone without ending its streams: they break, the port refuses.
    proxy.kill();
    let out = pending.wait(Some(Duration::from_secs(20)));
    assert!(out.is_some(), "the call waits on a worker that is gone");
    let err = out.unwrap().unwrap_err();
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(conn.lost().is_some());
}

#[test]
fn a_new_process_at_the_address_fails_the_calls_and_never_runs_them() {
    let rt = runtime();
    let first = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let proxy = Proxy::start(&rt, first.addr.clone());
    let conn = WorkerConn::open(rt.handle(), &proxy.addr, "tok").unwrap();
    let p = Bytes::from_static(b"x");
    let pending = conn.call(&target(&p), 0).1.unwrap();
    let lane = first.inbox.lane(LANE_LOOP).unwrap();
    assert!(!lane.take_wait(Some(Duration::from_secs(10))).is_empty());
    // A partition; when it heals, another worker answers behind the same address.
    proxy.set_cut(true);
    let second = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    *proxy.upstream.lock().unwrap() = second.addr.clone();
    proxy.close_connections(); // the first is gone: its connections with it
    std::thread::sleep(Duration::from_secs(6));
    proxy.set_cut(false);
    let err = match pending.wait(Some(Duration::from_secs(30))) {
        Some(Err(e)) => e,
        other => panic!("the call did not fail as lost: {other:?}"),
    };
    assert!(matches!(err, RpcError::ConnectionLost { .. }), "{err}");
    assert!(err.to_string().contains("another process"), "{err}");
    let lane2 = second.inbox.lane(LANE_LOOP).unwrap();
    assert!(lane2.take().is_empty(), "the new process ran the call");
    proxy.task.abort();
    drop(first);
}

#[test]
fn a_spawn_across_a_partition_runs_once_and_its_answer_comes_after() {
    let rt = runtime();
    let Behind {
        runs,
        gate,
        proxy,
        conn,
        ..
    } = behind_proxy(&rt);
    let spec = Bytes::from_static(b"class, args");
    let slot = conn.spawn_actor(rt.handle(), "a", spec.clone(), vec![], "");
    wait_ran(&runs, &spec);
    proxy.set_cut(true);
    gate.store(true, Ordering::SeqCst); // it runs while nothing gets through
    std::thread::sleep(Duration::from_secs(6)); // longer than the keepalive
    assert!(!slot.is_done(), "the spawn ended during the partition");
    proxy.set_cut(false);
    let r = slot
        .wait(Some(Duration::from_secs(30)))
        .expect("no answer after the partition");
    assert_eq!(reply_kind(&r.unwrap()), ReplyKind::Result);
    assert_eq!(runs.lock().unwrap().get(&spec), Some(&1));
    proxy.task.abort();
}
