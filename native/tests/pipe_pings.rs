//! PIPE-3 and PIPE-4 end to end, without Python: a heartbeat's ping to a worker whose
//! agent holds its pipe goes on the pipe and is answered there, or, while the worker's
//! replies keep coming, by the agent from its last pong.

use bytes::Bytes;
use monarch_kernel_native::proto::v1::ReplyKind;
use monarch_kernel_native::rpc::client::WorkerConn;
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use std::time::Duration;

mod common;

use common::{runtime, target};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

#[test]
fn a_relays_ping_goes_on_the_pipe_raises_the_epoch_and_never_reaches_the_dispatcher() {
    // PIPE-3: the heartbeat's ping to a worker whose agent holds its pipe is answered
    // on the pipe by the thread that reads it, as the `Ping` RPC answers.
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok7").unwrap();
    let lane = host.inbox.open_lane().unwrap();
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok7").unwrap();
    // An idle actor's thread waits on its lane (and the pipe) meanwhile: a ping is
    // answered without anything for it to run.
    let inbox = host.inbox.clone();
    let waiter = std::thread::spawn(move || {
        let l = inbox.lane(lane).unwrap();
        inbox.take_wait(&l, Some(Duration::from_millis(1500))).len()
    });
    let (pid, epoch) = rt.block_on(conn.ping_as(5)).unwrap();
    assert_eq!((pid, epoch), (std::process::id(), 5));
    let (_, epoch) = rt.block_on(conn.ping_as(3)).unwrap();
    assert_eq!(
        epoch, 5,
        "a ping answers the highest epoch the worker has seen"
    );
    assert_eq!(
        host.inbox.pipe_pings(),
        2,
        "the pings did not take the pipe"
    );
    assert_eq!(waiter.join().unwrap(), 0, "a ping reached the dispatcher");
    // The worker ends: a ping fails (by gRPC, which says why), and never hangs.
    host.shutdown();
    let after =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), conn.ping_as(5)).await });
    assert!(matches!(after, Ok(Err(_))), "{after:?}");
}

#[test]
fn a_worker_that_just_replied_is_answered_for_from_its_last_pong_until_it_falls_silent() {
    // PIPE-4: a busy worker's heartbeat does not wake it; a newer epoch, or a worker
    // silent for the heartbeat's period, still goes on the pipe.
    let rt = runtime();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tok9").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = {
        let (inbox, stop) = (host.inbox.clone(), stop.clone());
        std::thread::spawn(move || {
            let lane = inbox.lane(LANE_LOOP).unwrap();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for item in lane.take_wait(Some(Duration::from_millis(100))) {
                    inbox.reply(item.token, ReplyKind::Result, item.payload.clone(), vec![]);
                }
            }
        })
    };
    let conn = WorkerConn::relayed(rt.handle(), &host.addr, "tok9").unwrap();
    let payload = Bytes::from_static(b"busy");
    let call = || {
        let r = conn
            .call(&target(&payload), 0)
            .1
            .unwrap()
            .wait(WAIT)
            .unwrap();
        assert_eq!(r.unwrap().payload, payload);
    };
    // A ping carrying `epoch` answers the worker's `epoch`, and the pipe has carried
    // `asked` pings so far.
    let ping = |epoch: u64, answers: u64, asked: u64, why: &str| {
        let got = rt.block_on(conn.ping_as(epoch)).unwrap();
        assert_eq!(got, (std::process::id(), answers));
        assert_eq!(host.inbox.pipe_pings(), asked, "{why}");
    };
    ping(5, 5, 1, "a worker never heard from was not asked");
    call();
    ping(
        5,
        5,
        1,
        "a worker that had just replied was woken by the heartbeat",
    );
    ping(
        2,
        5,
        1,
        "a worker that had just replied was woken by the heartbeat",
    );
    // A newer epoch must reach the worker (FENCE-1: it becomes the worker's).
    ping(7, 7, 2, "a newer epoch was answered from memory");
    call();
    ping(
        7,
        7,
        2,
        "a worker that had just replied was woken by the heartbeat",
    );
    // Silent for longer than the heartbeat's period: the worker is asked again.
    std::thread::sleep(Duration::from_millis(1300));
    ping(7, 7, 3, "a silent worker was answered for");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    serving.join().unwrap();
}
