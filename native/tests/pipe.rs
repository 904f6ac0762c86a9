//! PIPE-1 end to end, without Python: a relay's connection to a worker of its host
//! takes the worker's pipe (a local Unix socket), its calls and replies go there, and a
//! pipe that is not the mesh's agent's, or breaks, never runs a call or hangs one.

use bytes::Bytes;
use monarch_kernel_native::proto::v1::{Call, Calls, ReplyKind};
use monarch_kernel_native::rpc::client::{reply_kind, Target, WorkerConn};
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::pipe;
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::RpcError;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::Duration;

mod common;

use common::{echo_dispatcher, runtime, target};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

/// A raw connection to the pipe of the worker at `addr`.
fn raw_pipe(addr: &str) -> UnixStream {
    let name = SocketAddr::from_abstract_name(pipe::name_of(addr)).unwrap();
    let s = UnixStream::connect_addr(&name).unwrap();
    s.set_read_timeout(WAIT).unwrap();
    s
}

fn one_call(call_id: u64) -> Bytes {
    pipe::frame(&Calls {
        calls: vec![Call {
            call_id,
            actor: "echo".into(),
            method: "ping".into(),
            payload: Bytes::from_static(b"x"),
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Whether the peer closed `s` (reads the end of the stream, with nothing before it;
/// or a reset: the peer closed with what was sent to it unread).
fn closed(s: &mut UnixStream) -> bool {
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn a_relays_calls_to_a_worker_go_on_its_pipe_and_come_back_matched() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "pipe-tok").unwrap();
    let t = echo_dispatcher(&host, 20);
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "pipe-tok").unwrap();
    let payloads: Vec<Bytes> = (0..20).map(|i| Bytes::from(format!("m{i}"))).collect();
    let slots: Vec<_> = payloads
        .iter()
        .map(|p| conn.call(&target(p), 0).1.unwrap())
        .collect();
    for (p, s) in payloads.iter().zip(slots) {
        let r = s.wait(WAIT).unwrap().unwrap();
        assert_eq!(reply_kind(&r), ReplyKind::Result);
        assert_eq!(&r.payload, p);
    }
    t.join().unwrap();
    assert_eq!(
        host.inbox.pipes(),
        1,
        "the relay's calls did not take the pipe"
    );
}

#[test]
fn a_pipe_without_the_mesh_token_is_closed_and_its_calls_never_run() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "right").unwrap();
    for hello in ["Bearer wrong", "", "right"] {
        let mut s = raw_pipe(&host.addr);
        s.write_all(&pipe::frame_bytes(hello.as_bytes())).unwrap();
        let _ = s.write_all(&one_call(1)); // (may find it closed already)
        assert!(
            closed(&mut s),
            "a pipe that presented {hello:?} stayed open"
        );
    }
    assert!(host.inbox.lane(LANE_LOOP).unwrap().take().is_empty());
    assert_eq!(host.inbox.pipes(), 0);
}

#[test]
fn a_malformed_or_oversized_frame_ends_that_pipe_only() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok2").unwrap();
    let hello = pipe::frame_bytes(b"Bearer tok2");
    // Not a `Calls` message.
    let mut s = raw_pipe(&host.addr);
    s.write_all(&hello).unwrap();
    s.write_all(&pipe::frame_bytes(&[0xff; 16])).unwrap();
    assert!(closed(&mut s), "a malformed frame left the pipe open");
    // A length over the limit: closed before anything that size is read or allocated.
    let mut s = raw_pipe(&host.addr);
    s.write_all(&hello).unwrap();
    s.write_all(&((pipe::MAX_FRAME as u32) + 1).to_le_bytes())
        .unwrap();
    assert!(closed(&mut s), "an oversized frame left the pipe open");
    assert!(host.inbox.lane(LANE_LOOP).unwrap().take().is_empty());
    // The worker goes on: a relay's calls still come back.
    let t = echo_dispatcher(&host, 1);
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok2").unwrap();
    let p = Bytes::from_static(b"after");
    let r = conn.call(&target(&p), 0).1.unwrap().wait(WAIT).unwrap();
    assert_eq!(r.unwrap().payload, p);
    t.join().unwrap();
}

#[test]
fn calls_waiting_on_a_pipe_fail_as_lost_once_when_the_worker_ends() {
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok3").unwrap();
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok3").unwrap();
    let p = Bytes::from_static(b"x");
    let pending = conn.call(&target(&p), 0).1.unwrap();
    // Queued at the worker, never answered; then the worker ends.
    let lane = host.inbox.lane(LANE_LOOP).unwrap();
    assert_eq!(lane.take_wait(WAIT).len(), 1);
    host.shutdown();
    match pending.wait(WAIT) {
        Some(Err(RpcError::ConnectionLost { reason, .. })) => {
            assert!(reason.contains("pipe"), "{reason}")
        }
        other => panic!("the call waiting on the pipe ended as {other:?}"),
    }
    // A later call on the lost connection fails at once too (CLIENT-1).
    let later = conn.call(&target(&p), 0).1.unwrap();
    assert!(matches!(later.wait(WAIT), Some(Err(_))));
}

#[test]
fn a_reply_larger_than_the_socket_buffer_arrives_whole_after_the_queued_ones() {
    // The worker's reply goes out with a non-blocking send from the replying thread;
    // one the socket cannot take at once waits for the blocking pool, and later ones
    // queue behind it, in order.
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok4").unwrap();
    let inbox = host.inbox.clone();
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok4").unwrap();
    let big = Bytes::from(vec![7u8; 8 << 20]);
    let p = Bytes::from_static(b"x");
    let slots: Vec<_> = (0..4)
        .map(|_| conn.call(&target(&p), 0).1.unwrap())
        .collect();
    let lane = inbox.lane(LANE_LOOP).unwrap();
    let mut items = Vec::new();
    while items.len() < 4 {
        items.extend(lane.take_wait(WAIT));
    }
    for (i, it) in items.iter().enumerate() {
        let payload = if i == 1 {
            big.clone()
        } else {
            Bytes::from(format!("r{i}"))
        };
        inbox.reply(it.token, ReplyKind::Result, payload, vec![]);
    }
    for (i, s) in slots.iter().enumerate() {
        let r = s.wait(WAIT).unwrap().unwrap();
        if i == 1 {
            assert_eq!(r.payload.len(), big.len());
            assert!(r.payload.iter().all(|b| *b == 7));
        } else {
            assert_eq!(r.payload, Bytes::from(format!("r{i}")));
        }
    }
}

#[test]
fn a_pipe_name_taken_by_another_user_never_gets_the_token() {
    // Any user of a host may bind an abstract name; one that took the worker's pipe
    // name before it must not receive the agent's token: the agent sees the socket's
    // owner (SO_PEERCRED) and keeps gRPC. Needs root (to run the squatter as nobody).
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to run a process as another user");
        return;
    }
    use std::os::unix::process::CommandExt;
    let rt = runtime();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let squat = format!(
        "import socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind('\\0' + {name:?})\n\
         s.listen()\n\
         print('ready', flush=True)\n\
         s.settimeout(5)\n\
         try:\n    c, _ = s.accept(); c.settimeout(2); print(repr(c.recv(4096)), flush=True)\n\
         except OSError: print('none', flush=True)\n",
        name = pipe::name_of(&addr)
    );
    let mut child = std::process::Command::new("python3")
        .args(["-c", &squat])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the squatter");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // The worker cannot take its name, so it serves no pipe; its gRPC goes on.
    let host = WorkerHost::serve(rt.handle(), listener, "secret-tok", None).unwrap();
    let t = echo_dispatcher(&host, 1);
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "secret-tok").unwrap();
    let p = Bytes::from_static(b"via grpc");
    let r = conn.call(&target(&p), 0).1.unwrap().wait(WAIT).unwrap();
    assert_eq!(r.unwrap().payload, p);
    t.join().unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = child.wait();
    assert!(
        !line.contains("secret-tok"),
        "the squatter got the token: {line}"
    );
    assert_eq!(line.trim(), "b''", "the agent sent the squatter {line}");
}

/// Answers `n` items of `lane` (taken with the inbox's `take_wait`, which reads the
/// pipes that wake it: PIPE-2) with their payloads, in the order taken.
fn lane_dispatcher(
    host: &WorkerHost,
    lane: usize,
    n: usize,
) -> std::thread::JoinHandle<Vec<Bytes>> {
    let inbox = host.inbox.clone();
    std::thread::spawn(move || {
        let l = inbox.lane(lane).unwrap();
        let mut seen = Vec::new();
        while seen.len() < n {
            for item in inbox.take_wait(&l, WAIT) {
                inbox.reply(item.token, ReplyKind::Result, item.payload.clone(), vec![]);
                seen.push(item.payload);
            }
        }
        seen
    })
}

#[test]
fn an_idle_actors_thread_reads_its_calls_from_the_pipe_itself_in_order() {
    // PIPE-2: a call to an actor whose thread waits is read by that thread (one
    // wake-up), not by the pipe's own thread; for a lane opened before the pipe, and
    // for one opened after it (which must put itself before the pipe's thread).
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok6").unwrap();
    let before = host.inbox.open_lane().unwrap();
    host.inbox.route("echo", Some(before));
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok6").unwrap();
    for (round, lane) in [(0, before), (1, usize::MAX)] {
        let lane = if lane == usize::MAX {
            // A new lane for the actor, opened with the pipe open already.
            let after = host.inbox.open_lane().unwrap();
            host.inbox.route("echo", Some(after));
            after
        } else {
            lane
        };
        let read_before = host.inbox.read_by_lanes();
        let t = lane_dispatcher(&host, lane, 10);
        let sent: Vec<Bytes> = (0..10)
            .map(|i| Bytes::from(format!("r{round}c{i}")))
            .collect();
        for p in &sent {
            // (a pause, so that the actor's thread is waiting when the call comes)
            std::thread::sleep(Duration::from_millis(30));
            let r = conn.call(&target(p), 0).1.unwrap().wait(WAIT).unwrap();
            assert_eq!(&r.unwrap().payload, p);
        }
        assert_eq!(
            t.join().unwrap(),
            sent,
            "round {round}: calls taken out of order"
        );
        let by_lane = host.inbox.read_by_lanes() - read_before;
        assert!(
            by_lane > 0,
            "round {round}: no call of 10 was read by the waiting actor's thread"
        );
    }
    // Calls sent at once are queued in the order they were sent, whichever of the
    // waiting threads reads them.
    let lane = host.inbox.open_lane().unwrap();
    host.inbox.route("echo", Some(lane));
    let t = lane_dispatcher(&host, lane, 50);
    let sent: Vec<Bytes> = (0..50).map(|i| Bytes::from(format!("burst{i}"))).collect();
    let slots: Vec<_> = sent
        .iter()
        .map(|p| conn.call(&target(p), 0).1.unwrap())
        .collect();
    for (p, s) in sent.iter().zip(slots) {
        assert_eq!(&s.wait(WAIT).unwrap().unwrap().payload, p);
    }
    assert_eq!(t.join().unwrap(), sent);
    assert_eq!(host.inbox.pipes(), 1);
}

#[test]
fn with_two_actors_the_one_called_soon_reads_its_own_calls() {
    // PIPE-2: the kernel wakes the first waiting lane; a lane woken by calls that were
    // not for it steps back, so the lane of the actor being called comes first.
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok8").unwrap();
    let other = host.inbox.open_lane().unwrap(); // (opened first: first in line)
    let echo = host.inbox.open_lane().unwrap();
    host.inbox.route("echo", Some(echo));
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok8").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let idle = {
        let (inbox, stop) = (host.inbox.clone(), stop.clone());
        std::thread::spawn(move || {
            let l = inbox.lane(other).unwrap();
            let mut got = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                got += inbox.take_wait(&l, Some(Duration::from_millis(100))).len();
            }
            got
        })
    };
    let t = lane_dispatcher(&host, echo, 10);
    let sent: Vec<Bytes> = (0..10).map(|i| Bytes::from(format!("two{i}"))).collect();
    for p in &sent {
        std::thread::sleep(Duration::from_millis(30));
        let r = conn.call(&target(p), 0).1.unwrap().wait(WAIT).unwrap();
        assert_eq!(&r.unwrap().payload, p);
    }
    assert_eq!(t.join().unwrap(), sent);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        idle.join().unwrap(),
        0,
        "the other actor's lane took a call"
    );
    assert!(
        host.inbox.read_by_lanes() > 0,
        "no call of 10 was read by the called actor's own thread"
    );
}

#[test]
fn a_call_to_one_actor_is_read_while_another_actors_thread_is_busy() {
    // PIPE-2: an actor's thread that runs a long call does not read the pipe; the
    // pipe's own thread reads the calls meanwhile, so a call to another actor of the
    // worker never waits behind the long one.
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok9").unwrap();
    let busy = host.inbox.open_lane().unwrap();
    host.inbox.route("echo", Some(busy));
    // ("other": an actor of the routing lane, which never reads the pipe)
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok9").unwrap();
    let (took_tx, took_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let long = {
        let inbox = host.inbox.clone();
        std::thread::spawn(move || {
            let l = inbox.lane(busy).unwrap();
            let mut items = Vec::new();
            while items.is_empty() {
                items = inbox.take_wait(&l, WAIT);
            }
            let _ = took_tx.send(());
            // (busy: not waiting on its lane or the pipe until released)
            let _ = release_rx.recv_timeout(Duration::from_secs(60));
            for it in items {
                inbox.reply(it.token, ReplyKind::Result, it.payload.clone(), vec![]);
            }
        })
    };
    let t = echo_dispatcher(&host, 1);
    let a = Bytes::from_static(b"long");
    let slow = conn.call(&target(&a), 0).1.unwrap();
    took_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let b = Bytes::from_static(b"meanwhile");
    let quick = conn
        .call(
            &Target {
                actor: "other",
                ..target(&b)
            },
            0,
        )
        .1
        .unwrap();
    let r = quick.wait(WAIT);
    let _ = release_tx.send(());
    assert_eq!(
        r.expect("the other actor's call waited behind the long one")
            .unwrap()
            .payload,
        b
    );
    assert_eq!(slow.wait(WAIT).unwrap().unwrap().payload, a);
    long.join().unwrap();
    t.join().unwrap();
}

#[test]
fn a_relays_call_is_on_the_pipe_when_its_send_returns() {
    // PIPE-1: the relaying thread writes the call itself (no task between it and the
    // socket): the worker could read it the moment `forward` returned.
    let rt = runtime();
    let addr = format!("127.0.0.1:{}", 40000 + std::process::id() % 20000);
    let name = SocketAddr::from_abstract_name(pipe::name_of(&addr)).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&name).unwrap();
    let conn = WorkerConn::relayed(rt.handle(), &addr, "tok-now").unwrap();
    let (mut s, _) = listener.accept().unwrap();
    let call = Call {
        call_id: 11,
        actor: "echo".into(),
        method: "ping".into(),
        payload: Bytes::from_static(b"now"),
        rank: 5,
        ..Default::default()
    };
    let slot = conn
        .forward_ref(&call)
        .expect("a call that expects a reply has a slot");
    s.set_nonblocking(true).unwrap();
    let mut got = vec![0u8; 4096];
    let n = s
        .read(&mut got)
        .expect("nothing on the pipe when forward returned");
    let hello = pipe::frame_bytes(b"Bearer tok-now");
    let framed = pipe::frame(&Calls {
        calls: vec![call],
        ..Default::default()
    });
    assert_eq!(&got[..n], [hello, framed].concat().as_slice());
    drop(s); // the worker ends: the call waiting fails as lost
    assert!(matches!(
        slot.wait(WAIT),
        Some(Err(RpcError::ConnectionLost { .. }))
    ));
}
