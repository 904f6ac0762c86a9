//! The Worker service and its client end to end, without Python: a thread plays the
//! dispatcher (takes from the inbox, replies).

use bytes::Bytes;
use monarch_kernel_native::proto::v1::ReplyKind;
use monarch_kernel_native::rpc::client::{reply_kind, WorkerConn};
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::RpcError;
use std::time::Duration;

mod common;

use common::{echo_dispatcher, runtime, target};

#[test]
fn calls_come_back_matched_to_their_replies() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let t = echo_dispatcher(&host, 50);
    let conn = WorkerConn::open(rt.handle(), &host.addr, "tok").unwrap();
    let payloads: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("msg-{i}"))).collect();
    let slots: Vec<_> = payloads
        .iter()
        .map(|p| conn.call(&target(p), 0).1.unwrap())
        .collect();
    for (p, s) in payloads.iter().zip(slots) {
        let r = s.wait(Some(Duration::from_secs(10))).unwrap().unwrap();
        assert_eq!(reply_kind(&r), ReplyKind::Result);
        assert_eq!(&r.payload, p);
    }
    t.join().unwrap();
}

#[test]
fn a_wrong_token_is_rejected_and_never_reaches_the_inbox() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "right").unwrap();
    let conn = WorkerConn::open(rt.handle(), &host.addr, "wrong").unwrap();
    let p = Bytes::from_static(b"x");
    let slot = conn.call(&target(&p), 0).1.unwrap();
    let out = slot.wait(Some(Duration::from_secs(10))).unwrap();
    assert!(matches!(out, Err(RpcError::Auth(_))), "{out:?}");
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    assert!(lane.take().is_empty());
}

#[test]
fn a_lost_server_fails_pending_and_later_calls() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let conn = WorkerConn::open(rt.handle(), &host.addr, "tok").unwrap();
    let p = Bytes::from_static(b"x");
    let pending = conn.call(&target(&p), 0).1.unwrap();
    // Wait until the call is queued, then stop the server without replying.
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    assert!(!lane.take_wait(Some(Duration::from_secs(10))).is_empty());
    host.shutdown();
    drop(host);
    let out = pending.wait(Some(Duration::from_secs(10)));
    assert!(
        out.is_some(),
        "the pending call hung after the server went away"
    );
    assert!(out.unwrap().is_err());
}

#[test]
fn an_empty_token_is_refused() {
    let rt = runtime();
    assert!(WorkerHost::bind(rt.handle(), "127.0.0.1:0", "").is_err());
    assert!(WorkerConn::open(rt.handle(), "127.0.0.1:1", "").is_err());
}

#[test]
fn an_older_epoch_is_fenced_and_epoch_zero_never_is() {
    use monarch_kernel_native::rpc::client::epoch_cell;
    use std::sync::atomic::Ordering;
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "fence-tok").unwrap();
    // One new-controller call, one peer call (epoch 0), then the old controller's.
    let t = echo_dispatcher(&host, 2);
    let conn = WorkerConn::open(rt.handle(), &host.addr, "fence-tok").unwrap();
    let p = Bytes::from_static(b"x");
    let cell = epoch_cell("fence-tok");
    let call = |epoch: u64| {
        cell.store(epoch, Ordering::SeqCst);
        let slot = conn.call(&target(&p), 0).1.unwrap();
        slot.wait(Some(Duration::from_secs(10))).unwrap().unwrap()
    };
    assert_eq!(reply_kind(&call(2)), ReplyKind::Result);
    assert_eq!(reply_kind(&call(0)), ReplyKind::Result);
    let fenced = call(1);
    assert_eq!(reply_kind(&fenced), ReplyKind::Fenced);
    let text = String::from_utf8_lossy(&fenced.payload).to_string();
    assert!(
        text.contains("epoch 1") && text.contains("epoch 2"),
        "{text}"
    );
    assert_eq!(host.inbox.epoch(), 2);
    t.join().unwrap();
    // A ping at a newer epoch raises the worker's.
    cell.store(5, Ordering::SeqCst);
    let (_, seen) = rt.block_on(conn.ping()).unwrap();
    assert_eq!(seen, 5);
}

#[test]
fn a_port_message_arrives_as_its_own_kind_with_typed_fields_and_is_answered() {
    use monarch_kernel_native::proto::v1::PortMessage;
    use monarch_kernel_native::rpc::inbox::Kind;
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    // Even with an actor routed to a lane of its own, a port message goes to the loop
    // lane: it is no call of an actor.
    let own = host.inbox.open_lane().unwrap();
    host.inbox.route("", Some(own));
    let conn = WorkerConn::open(rt.handle(), &host.addr, "tok").unwrap();
    let value = Bytes::from_static(b"the value alone");
    let header = PortMessage {
        port: 7,
        rank: Some(3),
        is_exception: true,
    };
    let (_, slot) = conn.send_port(header, &value, &[], "cell-1");
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    let items = lane.take_wait(Some(Duration::from_secs(10)));
    assert_eq!(items.len(), 1);
    let it = &items[0];
    assert_eq!(it.kind, Kind::Port);
    assert_eq!(it.port, Some(header));
    assert_eq!(it.payload, value);
    assert_eq!(it.origin, "cell-1");
    assert!(it.actor.is_empty() && it.method.is_empty());
    assert!(host.inbox.lane(own).unwrap().take().is_empty());
    // PORT-2: the receiver's refusal reaches the sender as the message's reply.
    let why = Bytes::from_static(b"port 7 is closed");
    host.inbox
        .reply(it.token, ReplyKind::Rejected, why.clone(), vec![]);
    let r = slot.wait(Some(Duration::from_secs(10))).unwrap().unwrap();
    assert_eq!(reply_kind(&r), ReplyKind::Rejected);
    assert_eq!(r.payload, why);
}

#[test]
fn port_messages_and_calls_on_one_connection_arrive_in_the_order_sent() {
    use monarch_kernel_native::proto::v1::PortMessage;
    use monarch_kernel_native::rpc::inbox::Kind;
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let conn = WorkerConn::open(rt.handle(), &host.addr, "tok").unwrap();
    let payloads: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("m-{i}"))).collect();
    let slots: Vec<_> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i % 2 == 0 {
                let port = PortMessage {
                    port: 1,
                    rank: None,
                    is_exception: false,
                };
                conn.send_port(port, p, &[], "").1
            } else {
                conn.call(&target(p), 0).1.unwrap()
            }
        })
        .collect();
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    let mut got = Vec::new();
    while got.len() < payloads.len() {
        let items = lane.take_wait(Some(Duration::from_secs(10)));
        assert!(
            !items.is_empty(),
            "only {} of the messages arrived",
            got.len()
        );
        for it in items {
            let kind = if got.len() % 2 == 0 {
                Kind::Port
            } else {
                Kind::Call
            };
            assert_eq!(it.kind, kind);
            host.inbox
                .reply(it.token, ReplyKind::Result, Bytes::new(), vec![]);
            got.push(it.payload);
        }
    }
    assert_eq!(got, payloads);
    for s in slots {
        let r = s.wait(Some(Duration::from_secs(10))).unwrap().unwrap();
        assert_eq!(reply_kind(&r), ReplyKind::Result);
    }
}

#[test]
fn a_connection_opens_with_its_first_call_not_before() {
    // LINK-1: a controller names every worker of a mesh, but calls most of them through
    // their agents: a connection nobody calls on costs no TCP, TLS or stream.
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let conn = WorkerConn::open(rt.handle(), &addr, "tok").unwrap();
    let accept =
        |within| rt.block_on(async { tokio::time::timeout(within, listener.accept()).await });
    let quiet = accept(Duration::from_millis(500));
    assert!(quiet.is_err(), "the connection opened before any call");
    let p = Bytes::from_static(b"x");
    let _slot = conn.call(&target(&p), 0).1.unwrap();
    let opened = accept(Duration::from_secs(10));
    assert!(opened.is_ok(), "the first call did not open the connection");
}

#[test]
fn a_spawn_and_a_stop_sent_on_the_stream_reach_the_inbox_as_such() {
    // SPAWN-1: a spawn or a stop takes a call's path, and the worker queues it as the
    // spawn or stop it is, with its payload, in order with the calls before it.
    use monarch_kernel_native::proto::v1::CallCommand;
    use monarch_kernel_native::rpc::inbox::Kind;
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok").unwrap();
    let conn = WorkerConn::open(rt.handle(), &host.addr, "tok").unwrap();
    let p = Bytes::from_static(b"class and args");
    let mut sent = Vec::new();
    for command in [CallCommand::Spawn, CallCommand::Endpoint, CallCommand::Stop] {
        let mut t = target(&p);
        t.command = command;
        sent.push(conn.call(&t, 0).1.unwrap());
    }
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(lane.take_wait(Some(Duration::from_secs(10))));
    }
    let kinds: Vec<Kind> = got.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, [Kind::Spawn, Kind::Call, Kind::Stop]);
    assert_eq!(got[0].actor, "echo");
    assert_eq!(got[0].payload, p);
    for item in &got {
        host.inbox
            .reply(item.token, ReplyKind::Result, Bytes::new(), vec![]);
    }
    for s in sent {
        let r = s.wait(Some(Duration::from_secs(10))).unwrap().unwrap();
        assert_eq!(reply_kind(&r), ReplyKind::Result);
    }
}
