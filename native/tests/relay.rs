//! The relay of fanned-out calls end to end, without Python: a host agent serving the
//! `Relay` service (RELAY-1) to workers it starts, which are this test binary
//! ([`relay_test_worker`]) answering each call with what it ran; clients that call
//! them through the relay, across a partition of the link to it (RESUME-1), and by
//! the fan-out's paths (ORDER-1).

use bytes::Bytes;
use monarch_kernel_native::agent::{self, AgentConfig, AgentHandle};
use monarch_kernel_native::proto::v1::host_agent_client::HostAgentClient;
use monarch_kernel_native::proto::v1::{Delivery, ReplyKind, SpawnWorkersRequest, WorkerInfo};
use monarch_kernel_native::rpc::client::{reply_kind, Fanout, Target, WorkerConn};
use monarch_kernel_native::rpc::inbox::{Kind, LANE_LOOP};
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::slot::Slot;
use monarch_kernel_native::rpc::RpcError;
use std::io::{BufRead, Read};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{runtime, target, Proxy};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));
/// How late a worker answers a call that names it `late<proc>`.
const LATE: Duration = Duration::from_secs(2);

/// Not a test: the worker process an agent of these tests starts (the agent passes
/// its listening socket in `MONARCH_LISTEN_FD` and the token on stdin). It answers
/// each call with `"proc:rank:n:payload"` (`n`: the calls it has run so far,
/// broadcasts and this one included), a second late if the payload is `slow`, two
/// seconds late if it names this proc as `late<proc>`, as an exception if it names
/// it as `fail<proc>`, and exits when its stdin closes, as a worker does (AGENT-1).
#[test]
#[ignore = "the worker process of the other tests, started by their agent"]
fn relay_test_worker() {
    use std::os::fd::FromRawFd;
    let Some(fd) = std::env::var("MONARCH_LISTEN_FD")
        .ok()
        .and_then(|v| v.parse().ok())
    else {
        return;
    };
    let proc: u32 = std::env::var("MONARCH_RANK").unwrap().parse().unwrap();
    let mut stdin = std::io::stdin().lock();
    let mut token = String::new();
    stdin.read_line(&mut token).unwrap();
    // SAFETY: the agent passed this descriptor, a listening socket, for this process.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    let rt = runtime();
    let host = WorkerHost::serve(rt.handle(), listener, token.trim(), None).unwrap();
    let inbox = host.inbox.clone();
    std::thread::spawn(move || {
        let lane = inbox.lane(LANE_LOOP).unwrap();
        let mut n = 0;
        loop {
            for item in lane.take_wait(Some(Duration::from_secs(1))) {
                if item.kind != Kind::Call {
                    continue;
                }
                n += 1;
                if item.token == 0 {
                    continue; // a broadcast: no reply
                }
                let payload = String::from_utf8_lossy(&item.payload);
                if payload == "slow" {
                    std::thread::sleep(Duration::from_secs(1));
                }
                if payload.contains(&format!("late{proc}")) {
                    std::thread::sleep(LATE);
                }
                let kind = if payload.contains(&format!("fail{proc}")) {
                    ReplyKind::Exception
                } else {
                    ReplyKind::Result
                };
                let reply = format!("{proc}:{}:{n}:{payload}", item.rank);
                inbox.reply(item.token, kind, Bytes::from(reply), vec![]);
            }
        }
    });
    let _ = stdin.read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// An agent with `workers` workers of [`relay_test_worker`].
struct Host {
    handle: AgentHandle,
    workers: Vec<WorkerInfo>,
    token: &'static str,
    _logs: tempfile::TempDir,
}

/// Deliveries to workers of the host whose relay is the call's `vias[via - 1]`
/// (TREE-1; 0: the relay's own host): (proc, rank).
fn via(via: u32, procs: &[(u32, u32)]) -> Vec<Delivery> {
    procs
        .iter()
        .map(|&(proc, rank)| Delivery { proc, rank, via })
        .collect()
}

impl Host {
    /// An agent whose workers' proc ranks start at `first`.
    fn start_at(
        rt: &tokio::runtime::Runtime,
        token: &'static str,
        workers: u32,
        first: u32,
    ) -> Host {
        Self::start_holding(rt, token, workers, first, agent::relay::HOLD)
    }

    /// An agent whose relay holds a call's results up to `hold` (GATHER-1).
    fn start_holding(
        rt: &tokio::runtime::Runtime,
        token: &'static str,
        workers: u32,
        first: u32,
        hold: Duration,
    ) -> Host {
        let logs = tempfile::tempdir().unwrap();
        let cfg = AgentConfig {
            name: "relay-test".into(),
            token: token.into(),
            log_dir: logs.path().to_path_buf(),
            idle_timeout: Duration::from_secs(120),
            first_attach_timeout: Duration::from_secs(120),
            meta: String::new(),
            bind_host: "127.0.0.1".into(),
            tls: None,
            tls_ca: None,
            relay_hold: hold,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let handle = agent::start(rt.handle(), cfg, listener).unwrap();
        let exe = std::env::current_exe().unwrap();
        let req = SpawnWorkersRequest {
            count: workers,
            first_rank: first,
            executable: exe.to_string_lossy().into_owned(),
            args: ["relay_test_worker", "--exact", "--ignored", "--nocapture"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        };
        let addr = handle.addr.clone();
        let workers = rt.block_on(async move {
            let mut c = HostAgentClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            let mut req = tonic::Request::new(req);
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            c.spawn_workers(req).await.unwrap().into_inner().workers
        });
        Host {
            handle,
            workers,
            token,
            _logs: logs,
        }
    }

    fn stop(self, rt: &tokio::runtime::Runtime) {
        let agent = self.handle.agent.clone();
        rt.block_on(agent.stop_all("test"));
        self.handle.wait(rt.handle());
    }
}

/// A reply's payload, as text; panics on a failed call.
fn text(slot: &Arc<Slot>) -> String {
    let r = slot.wait(WAIT).expect("no reply").expect("the call failed");
    assert_eq!(reply_kind(&r), ReplyKind::Result);
    String::from_utf8(r.payload.to_vec()).unwrap()
}

#[test]
fn a_call_through_the_relay_reaches_each_worker_and_each_reply_comes_back_as_its_own() {
    let rt = runtime();
    let host = Host::start_at(&rt, "relay-test-token-1", 2, 0);
    let procs: Vec<u32> = host.workers.iter().map(|w| w.rank).collect();
    assert_eq!(procs, [0, 1]);
    let relay = WorkerConn::relay(rt.handle(), &host.handle.addr, host.token).unwrap();
    let x = Bytes::from_static(b"x");
    let (_, slots) = relay.call_fanned(&target(&x), via(0, &[(0, 5), (1, 6)]), Vec::new());
    let got: Vec<String> = slots.iter().map(text).collect();
    assert_eq!(got, ["0:5:1:x", "1:6:1:x"]);
    // A call that names no worker is refused, and the connection goes on.
    let (_, slot) = relay.call(&target(&x), 0);
    let r = slot.unwrap().wait(WAIT).unwrap().unwrap();
    assert_eq!(reply_kind(&r), ReplyKind::Rejected);
    // A worker the host does not have is lost, as a direct call to it would be.
    let (_, slots) = relay.call_fanned(&target(&x), via(0, &[(1, 0), (9, 1)]), Vec::new());
    assert_eq!(text(&slots[0]), "1:0:2:x");
    match slots[1].wait(WAIT).unwrap() {
        Err(RpcError::ConnectionLost { addr, reason }) => {
            assert!(addr.starts_with("proc 9 (through "), "{addr}");
            assert!(reason.contains("no running worker of proc 9"), "{reason}");
        }
        other => panic!("{:?}", other.map(|r| r.payload)),
    }
    assert!(relay.lost().is_none());
    host.stop(&rt);
}

#[test]
fn a_relay_forwards_the_deliveries_of_another_host_to_its_relay_and_returns_their_replies() {
    // TREE-1: one message to host A's relay reaches A's workers and B's, and each
    // reply comes back under the caller's call id, marked with its proc.
    let rt = runtime();
    let token = "relay-test-token-tree";
    let a = Host::start_at(&rt, token, 2, 0);
    let b = Host::start_at(&rt, token, 2, 2);
    let relay = WorkerConn::relay(rt.handle(), &a.handle.addr, token).unwrap();
    let x = Bytes::from_static(b"x");
    let vias = vec![b.handle.addr.clone()];
    let mut ds = via(0, &[(0, 0), (1, 1)]);
    ds.extend(via(1, &[(2, 2), (3, 3)]));
    let (_, slots) = relay.call_fanned(&target(&x), ds.clone(), vias.clone());
    let got: Vec<String> = slots.iter().map(text).collect();
    assert_eq!(got, ["0:0:1:x", "1:1:1:x", "2:2:1:x", "3:3:1:x"]);
    // A proc B does not have is lost; the others answer.
    let (_, slots) = relay.call_fanned(&target(&x), via(1, &[(3, 0), (7, 1)]), vias.clone());
    assert_eq!(text(&slots[0]), "3:0:2:x");
    assert!(matches!(
        slots[1].wait(WAIT).unwrap(),
        Err(RpcError::ConnectionLost { .. })
    ));
    // A delivery that names no relay of the call is refused, as malformed; the
    // others answer.
    let mut bad = via(2, &[(2, 0)]);
    bad.extend(via(1, &[(3, 1)]));
    let (_, slots) = relay.call_fanned(&target(&x), bad, vias.clone());
    let refused = slots[0].wait(WAIT).unwrap().unwrap();
    assert_eq!(refused.kind, ReplyKind::Rejected as i32);
    let why = String::from_utf8_lossy(&refused.payload).to_string();
    assert!(why.contains("names relay 2 of 1"), "{why}");
    assert_eq!(text(&slots[1]), "3:1:3:x");
    // B's agent gone: its procs' deliveries fail as lost, fast; A's still answer.
    b.stop(&rt);
    let (_, slots) = relay.call_fanned(&target(&x), ds, vias);
    assert_eq!(text(&slots[0]), "0:0:2:x");
    assert_eq!(text(&slots[1]), "1:1:2:x");
    for s in &slots[2..] {
        assert!(matches!(
            s.wait(WAIT).unwrap(),
            Err(RpcError::ConnectionLost { .. })
        ));
    }
    assert!(relay.lost().is_none());
    a.stop(&rt);
}

/// Whether `slot` has completed (without waiting).
fn done(slot: &Arc<Slot>) -> bool {
    slot.wait(Some(Duration::ZERO)).is_some()
}

#[test]
fn a_relay_sends_a_calls_results_back_together_and_a_failure_at_once() {
    // GATHER-1, with a hold longer than the test: results wait for the call's last.
    let rt = runtime();
    let token = "relay-test-token-gather";
    let host = Host::start_holding(&rt, token, 3, 0, Duration::from_secs(600));
    let relay = WorkerConn::relay(rt.handle(), &host.handle.addr, token).unwrap();
    let all = via(0, &[(0, 0), (1, 1), (2, 2)]);
    // Procs 1 and 2 answer at once, proc 0 late: all three come back together.
    let late = Bytes::from_static(b"late0");
    let (_, slots) = relay.call_fanned(&target(&late), all.clone(), Vec::new());
    assert!(
        slots[1].wait(Some(LATE / 2)).is_none(),
        "a result came back before the call's last"
    );
    assert_eq!(text(&slots[0]), "0:0:1:late0");
    assert!(done(&slots[1]) && done(&slots[2]), "the results came apart");
    assert_eq!(text(&slots[2]), "2:2:1:late0");
    // An exception goes back at once, with the results held before it; the late
    // result follows alone.
    let fail = Bytes::from_static(b"late0fail1");
    let (_, slots) = relay.call_fanned(&target(&fail), all, Vec::new());
    let r = slots[1].wait(WAIT).unwrap().unwrap();
    assert_eq!(reply_kind(&r), ReplyKind::Exception);
    assert!(
        !done(&slots[0]),
        "the late proc answered before the failure came back"
    );
    // (proc 2's result was held until the failure came, or came with it)
    assert_eq!(text(&slots[2]), "2:2:2:late0fail1");
    assert_eq!(text(&slots[0]), "0:0:2:late0fail1");
    host.stop(&rt);
}

#[test]
fn a_result_a_relay_holds_goes_back_within_the_hold_while_the_call_runs_on() {
    // GATHER-1: a slow rank does not keep the other results from the caller.
    let rt = runtime();
    let token = "relay-test-token-hold";
    let host = Host::start_holding(&rt, token, 2, 0, Duration::from_millis(100));
    let relay = WorkerConn::relay(rt.handle(), &host.handle.addr, token).unwrap();
    let late = Bytes::from_static(b"late0");
    let (_, slots) = relay.call_fanned(&target(&late), via(0, &[(0, 0), (1, 1)]), Vec::new());
    assert_eq!(text(&slots[1]), "1:1:1:late0");
    assert!(!done(&slots[0]), "the result waited for the late proc");
    assert_eq!(text(&slots[0]), "0:0:1:late0");
    host.stop(&rt);
}

#[test]
fn a_call_whose_results_all_came_leaves_no_send_of_them_due() {
    // GATHER-1: the send due within the hold ends when the call's last reply sends
    // what was held; it would otherwise live (and wake its relay) for the whole hold.
    let rt = runtime();
    let token = "relay-test-token-hold-ends";
    let host = Host::start_holding(&rt, token, 2, 0, Duration::from_secs(600));
    let relay = WorkerConn::relay(rt.handle(), &host.handle.addr, token).unwrap();
    let all = via(0, &[(0, 0), (1, 1)]);
    let (_, slots) = relay.call_fanned(
        &target(&Bytes::from_static(b"warm")),
        all.clone(),
        Vec::new(),
    );
    assert_eq!(text(&slots[1]), "1:1:1:warm");
    let alive = || rt.metrics().num_alive_tasks();
    let before = alive();
    // Proc 1 answers at once, its result is held, and the send of it falls due in 600 s.
    let (_, slots) = relay.call_fanned(&target(&Bytes::from_static(b"late0")), all, Vec::new());
    assert_eq!(text(&slots[0]), "0:0:2:late0");
    assert_eq!(text(&slots[1]), "1:1:2:late0");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive() > before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        alive() <= before,
        "{} tasks alive after the call, {before} before it: its held results' send is still due",
        alive()
    );
    host.stop(&rt);
}

#[test]
fn the_agent_serves_the_relay_and_not_the_worker_service() {
    let rt = runtime();
    let host = Host::start_at(&rt, "relay-test-token-2", 1, 0);
    // What only a worker serves is refused on a relay's connection, before it is sent.
    let relay = WorkerConn::relay(rt.handle(), &host.handle.addr, host.token).unwrap();
    let err = rt.block_on(relay.ping()).unwrap_err();
    assert!(
        err.to_string().contains("relays fanned-out calls only"),
        "{err}"
    );
    // A client that takes the agent for a worker: its calls fail, nothing waits.
    let conn = WorkerConn::get(rt.handle(), &host.handle.addr, host.token).unwrap();
    let x = Bytes::from_static(b"x");
    let (_, slot) = conn.call(&target(&x), 0);
    assert!(slot.unwrap().wait(WAIT).unwrap().is_err());
    host.stop(&rt);
}

#[test]
fn calls_through_a_partitioned_relay_wait_then_complete_once_each() {
    let rt = runtime();
    let host = Host::start_at(&rt, "relay-test-token-3", 2, 0);
    let proxy = Proxy::start(&rt, host.handle.addr.clone());
    let relay = WorkerConn::relay(rt.handle(), &proxy.addr, host.token).unwrap();
    let call = |p: &'static [u8]| {
        relay
            .call_fanned(
                &target(&Bytes::from_static(p)),
                via(0, &[(0, 0), (1, 1)]),
                Vec::new(),
            )
            .1
    };
    let a = call(b"a");
    assert_eq!(
        a.iter().map(text).collect::<Vec<_>>(),
        ["0:0:1:a", "1:1:1:a"]
    );
    proxy.set_cut(true);
    let b = call(b"b");
    // Longer than the keepalive (1 s + 3 s): the client drops the connection.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        b.iter().all(|s| !s.is_done()),
        "a call ended during the partition"
    );
    assert!(relay.lost().is_none(), "{:?}", relay.lost());
    proxy.set_cut(false);
    assert_eq!(
        b.iter().map(text).collect::<Vec<_>>(),
        ["0:0:2:b", "1:1:2:b"]
    );
    // Each ran once: the next is each worker's third.
    let c = call(b"c");
    assert_eq!(
        c.iter().map(text).collect::<Vec<_>>(),
        ["0:0:3:c", "1:1:3:c"]
    );
    host.stop(&rt);
}

#[test]
fn the_fan_out_keeps_each_workers_calls_in_the_order_sent_whichever_path_each_takes() {
    let rt = runtime();
    let host = Host::start_at(&rt, "relay-test-token-4", 2, 0);
    let token = host.token;
    let fanout = Fanout::new(token, &[(host.handle.addr.clone(), 0, 2)]);
    let conns: Vec<Arc<WorkerConn>> = host
        .workers
        .iter()
        .map(|w| WorkerConn::get(rt.handle(), &w.addr, token).unwrap())
        .collect();
    let (x, slow) = (Bytes::from_static(b"x"), Bytes::from_static(b"slow"));
    let t = target(&x);
    let broadcast = Target { oneway: true, ..t };
    let send = |t: &Target<'_>, procs: &[u32]| {
        let conns: Vec<_> = procs.iter().map(|&p| conns[p as usize].clone()).collect();
        fanout.send(rt.handle(), t, &conns, procs, procs).unwrap()
    };
    // One proc of the host: direct; both: one message to the relay.
    let one = send(&t, &[0]);
    assert!(one[0].relayed.is_none());
    assert_eq!(text(&one[0].slot), "0:0:1:x");
    let both = send(&target(&slow), &[0, 1]);
    assert_eq!(both[0].call_id, both[1].call_id);
    let relayed: Vec<_> = both
        .iter()
        .map(|s| {
            s.relayed
                .as_ref()
                .map(|(i, p)| (conns[*i].addr().to_string(), *p))
                .unwrap()
        })
        .collect();
    let addrs = host.workers.iter().map(|w| w.addr.clone());
    assert_eq!(relayed, addrs.zip([0, 1]).collect::<Vec<_>>());
    // While those run: a call to proc 0 alone stays on the relay behind them, a
    // broadcast goes through the relay, and so does every call until one after it is
    // answered. Each worker counts what it ran: in the order sent.
    let mut sent = vec![send(&t, &[0])];
    assert!(send(&broadcast, &[0, 1]).is_empty());
    sent.push(send(&t, &[0]));
    sent.push(send(&t, &[0, 1]));
    sent.push(send(&t, &[0]));
    assert!(sent.iter().flatten().all(|s| s.relayed.is_some()));
    let got: Vec<String> = sent.iter().flatten().map(|s| text(&s.slot)).collect();
    assert_eq!(got, ["0:0:3:x", "0:0:5:x", "0:0:6:x", "1:1:3:x", "0:0:7:x"]);
    let got: Vec<String> = both.iter().map(|s| text(&s.slot)).collect();
    assert_eq!(got, ["0:0:2:slow", "1:1:1:slow"]);
    // Everything answered: direct again.
    let last = send(&t, &[0]);
    assert!(last[0].relayed.is_none());
    assert_eq!(text(&last[0].slot), "0:0:8:x");
    // A broadcast while a direct call to proc 0 runs: proc 0's copy goes direct,
    // behind that call, and holds proc 0 there for the next call to both; proc 1's
    // goes through the relay.
    let running = send(&target(&slow), &[0]);
    assert!(running[0].relayed.is_none());
    assert!(send(&broadcast, &[0, 1]).is_empty());
    let after = send(&t, &[0, 1]);
    assert!(after[0].relayed.is_none() && after[1].relayed.is_some());
    assert_eq!(text(&running[0].slot), "0:0:9:slow");
    let got: Vec<String> = after.iter().map(|s| text(&s.slot)).collect();
    assert_eq!(got, ["0:0:11:x", "1:1:5:x"]);
    host.stop(&rt);
}

#[test]
fn a_relay_cut_before_its_first_answer_sends_its_calls_once_it_heals() {
    // A relay's stream opens with its connection; when the link stalls before the
    // relay's first answer (a loaded host: the agent not yet scheduled) and the
    // keepalive drops it, the relay never knew this caller. Calls must not have gone
    // out on that stream, so that they can be sent on the next one and run once, not
    // fail as possibly delivered to another process.
    let rt = runtime();
    let host = Host::start_at(&rt, "relay-test-token-9", 2, 0);
    let proxy = Proxy::start(&rt, host.handle.addr.clone());
    proxy.set_cut(true);
    let relay = WorkerConn::relay(rt.handle(), &proxy.addr, host.token).unwrap();
    let b = relay
        .call_fanned(
            &target(&Bytes::from_static(b"b")),
            via(0, &[(0, 0), (1, 1)]),
            Vec::new(),
        )
        .1;
    // Longer than the keepalive (1 s + 3 s): the client drops the connection.
    std::thread::sleep(Duration::from_secs(6));
    assert!(b.iter().all(|s| !s.is_done()), "a call ended while cut");
    proxy.set_cut(false);
    assert_eq!(
        b.iter().map(text).collect::<Vec<_>>(),
        ["0:0:1:b", "1:1:1:b"],
        "the calls did not run once each after the link healed"
    );
    host.stop(&rt);
}
