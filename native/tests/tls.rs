//! TLS of the control plane end to end, without Python (TLS-1, TLS-2): a worker and an
//! agent serving a mesh's identity, clients with and without its CA.
//!
//! The CA a process checks a mesh against is kept by token, process-wide: each test
//! uses tokens of its own (the tests of this file run in parallel threads).

use bytes::Bytes;
use monarch_kernel_native::agent::{self, AgentConfig};
use monarch_kernel_native::proto::v1::host_agent_client::HostAgentClient;
use monarch_kernel_native::proto::v1::{AgentPingRequest, ReplyKind};
use monarch_kernel_native::rpc::client::{reply_kind, WorkerConn};
use monarch_kernel_native::rpc::inbox::LANE_LOOP;
use monarch_kernel_native::rpc::server::WorkerHost;
use monarch_kernel_native::rpc::tls::{self, MeshIdentity, DOMAIN};
use monarch_kernel_native::rpc::RpcError;
use std::time::Duration;

mod common;

use common::{echo_dispatcher, runtime, target};

/// How long a call that must fail at once may take (generous for a busy machine;
/// a handshake that fails takes milliseconds).
const AT_ONCE: Duration = Duration::from_secs(5);

/// A call on a new connection from this process to `addr`: its outcome, which must
/// come within [`AT_ONCE`] (TLS-2: a failed handshake fails the call, never a hang).
fn call_once(rt: &tokio::runtime::Runtime, addr: &str, token: &str) -> Result<Bytes, RpcError> {
    let conn = WorkerConn::open(rt.handle(), addr, token).unwrap();
    let p = Bytes::from_static(b"over tls");
    let slot = conn.call(&target(&p), 0).1.unwrap();
    let out = slot
        .wait(Some(AT_ONCE))
        .expect("the call hung instead of failing");
    out.map(|r| r.payload)
}

#[test]
fn a_tls_worker_answers_a_client_that_has_its_mesh_ca() {
    let rt = runtime();
    let id = MeshIdentity::generate().unwrap();
    let host =
        WorkerHost::bind_with(rt.handle(), "127.0.0.1:0", "tls-ok", Some(&id.server)).unwrap();
    assert!(host.tls);
    let t = echo_dispatcher(&host, 1);
    tls::set_mesh_ca("tls-ok", Some(&id.ca_pem)).unwrap();
    let conn = WorkerConn::get(rt.handle(), &host.addr, "tls-ok").unwrap();
    assert!(conn.is_tls());
    let p = Bytes::from_static(b"over tls");
    let r = conn.call(&target(&p), 0).1.unwrap();
    let r = r.wait(Some(Duration::from_secs(10))).unwrap().unwrap();
    assert_eq!(reply_kind(&r), ReplyKind::Result);
    assert_eq!(r.payload, p);
    assert!(rt.block_on(conn.ping()).is_ok());
    t.join().unwrap();
}

#[test]
fn a_client_with_another_meshs_ca_fails_fast_with_a_tls_error() {
    let rt = runtime();
    let (ours, theirs) = (
        MeshIdentity::generate().unwrap(),
        MeshIdentity::generate().unwrap(),
    );
    let host =
        WorkerHost::bind_with(rt.handle(), "127.0.0.1:0", "tls-other", Some(&ours.server)).unwrap();
    tls::set_mesh_ca("tls-other", Some(&theirs.ca_pem)).unwrap();
    let out = call_once(&rt, &host.addr, "tls-other");
    match out {
        Err(RpcError::Tls { addr, reason }) => {
            assert_eq!(addr, host.addr);
            assert!(reason.to_lowercase().contains("certificate"), "{reason}");
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // Nothing reached the worker.
    assert!(host.inbox.lane(LANE_LOOP).unwrap().take().is_empty());
}

#[test]
fn a_plaintext_client_to_a_tls_worker_fails_fast_with_a_tls_error() {
    let rt = runtime();
    let id = MeshIdentity::generate().unwrap();
    let host = WorkerHost::bind_with(
        rt.handle(),
        "127.0.0.1:0",
        "tls-plain-client",
        Some(&id.server),
    )
    .unwrap();
    // This process has no CA for the mesh: it speaks plaintext.
    let out = call_once(&rt, &host.addr, "tls-plain-client");
    let err = out.expect_err("a plaintext call reached a TLS server");
    let text = err.to_string();
    assert!(text.contains(&host.addr), "{text}");
    assert!(matches!(err, RpcError::Tls { .. }), "{err:?}");
    assert!(host.inbox.lane(LANE_LOOP).unwrap().take().is_empty());
}

#[test]
fn a_tls_client_to_a_plaintext_worker_fails_fast_with_a_tls_error() {
    let rt = runtime();
    let id = MeshIdentity::generate().unwrap();
    let host = WorkerHost::bind(rt.handle(), "127.0.0.1:0", "tls-plain-server").unwrap();
    assert!(!host.tls);
    tls::set_mesh_ca("tls-plain-server", Some(&id.ca_pem)).unwrap();
    let out = call_once(&rt, &host.addr, "tls-plain-server");
    match out {
        Err(RpcError::Tls { addr, .. }) => assert_eq!(addr, host.addr),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    assert!(host.inbox.lane(LANE_LOOP).unwrap().take().is_empty());
}

#[test]
fn a_connection_opened_before_the_mesh_ca_was_known_is_replaced_by_a_tls_one() {
    let rt = runtime();
    let id = MeshIdentity::generate().unwrap();
    let host =
        WorkerHost::bind_with(rt.handle(), "127.0.0.1:0", "tls-late", Some(&id.server)).unwrap();
    let plain = WorkerConn::get(rt.handle(), &host.addr, "tls-late").unwrap();
    assert!(!plain.is_tls());
    tls::set_mesh_ca("tls-late", Some(&id.ca_pem)).unwrap();
    let t = echo_dispatcher(&host, 1);
    let conn = WorkerConn::get(rt.handle(), &host.addr, "tls-late").unwrap();
    assert!(conn.is_tls());
    let p = Bytes::from_static(b"late");
    let r = conn.call(&target(&p), 0).1.unwrap();
    assert_eq!(
        r.wait(Some(Duration::from_secs(10)))
            .unwrap()
            .unwrap()
            .payload,
        p
    );
    t.join().unwrap();
}

#[test]
fn an_agent_with_tls_answers_a_client_with_its_mesh_ca_and_no_other() {
    use tonic::transport::Endpoint;
    let rt = runtime();
    let id = MeshIdentity::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = AgentConfig {
        name: "tls-agent".into(),
        token: "tls-agent-token".into(),
        log_dir: dir.path().to_path_buf(),
        idle_timeout: Duration::from_secs(60),
        first_attach_timeout: Duration::from_secs(60),
        meta: String::new(),
        bind_host: "127.0.0.1".into(),
        tls: Some(id.server.clone()),
        tls_ca: Some(id.ca_pem.clone()),
        relay_hold: agent::relay::HOLD,
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let handle = agent::start(rt.handle(), cfg, listener).unwrap();
    let ping = |ca: Option<&str>| {
        let addr = handle.addr.clone();
        let ca = ca.map(str::to_string);
        rt.block_on(async move {
            let mut ep = Endpoint::from_shared(match ca {
                Some(_) => format!("https://{addr}"),
                None => format!("http://{addr}"),
            })
            .unwrap()
            .connect_timeout(AT_ONCE);
            if let Some(ca) = &ca {
                tls::install_provider();
                ep = ep.tls_config(tls::client_config(ca)).unwrap();
            }
            let channel = ep.connect().await.map_err(|e| {
                tls::failure(&e).unwrap_or_else(|| format!("not a TLS failure: {e:?}"))
            })?;
            let mut client = HostAgentClient::new(channel);
            let mut req = tonic::Request::new(AgentPingRequest {});
            req.metadata_mut()
                .insert("authorization", "Bearer tls-agent-token".parse().unwrap());
            tokio::time::timeout(AT_ONCE, client.ping(req))
                .await
                .map_err(|_| "the ping hung".to_string())?
                .map(|r| r.into_inner().name)
                .map_err(|s| format!("{s:?}"))
        })
    };
    assert_eq!(ping(Some(&id.ca_pem)).unwrap(), "tls-agent");
    let other = MeshIdentity::generate().unwrap();
    let refused = ping(Some(&other.ca_pem)).unwrap_err();
    assert!(refused.to_lowercase().contains("certificate"), "{refused}");
    assert!(ping(None).is_err());
    let agent = handle.agent.clone();
    rt.block_on(agent.stop_all("test"));
    handle.wait(rt.handle());
    assert_eq!(DOMAIN, "monarch-mesh.invalid");
}
