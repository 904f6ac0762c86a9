//! What the native integration tests share: a runtime, a thread that plays the
//! dispatcher (echoes what it takes from the inbox), and a call to echo.
// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use bytes::Bytes;
use monarch_kernel_native::proto::v1::ReplyKind;
use monarch_kernel_native::rpc::client::Target;
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use std::time::Duration;

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn echo_dispatcher(host: &WorkerHost, n: usize) -> std::thread::JoinHandle<()> {
    let inbox = host.inbox.clone();
    std::thread::spawn(move || {
        let lane = inbox.lane(LANE_LOOP).unwrap();
        let mut done = 0;
        while done < n {
            for item in lane.take_wait(Duration::from_secs(5)) {
                inbox.reply(item.token, ReplyKind::Result, item.payload.clone(), vec![]);
                done += 1;
            }
        }
    })
}

pub fn target<'a>(payload: &'a Bytes) -> Target<'a> {
    Target {
        actor: "echo",
        method: "ping",
        payload,
        buffers: &[],
        oneway: false,
        dims: &[],
        sizes: &[],
        origin: "",
    }
}
