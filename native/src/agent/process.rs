//! Worker processes: how the agent starts them, captures their output and sees them
//! exit.
//!
//! Each worker gets a listening socket bound here (`MONARCH_LISTEN_FD`), so its
//! address is known before it runs; its own session (never the controller's process
//! group, which Jupyter signals); AGENT-1's death signal and stdin pipe; the mesh
//! token as the first line on stdin (never in argv or the environment); and, as the
//! second, the mesh's TLS identity as JSON ([`tls_line`]; TLS-3).

use super::template::{self, Exit, Template};
use crate::agent::marks::classify;
use crate::proto::v1::{
    agent_event, log_line::Kind, AgentEvent, LogLine, SpawnWorkersRequest, WorkerInfo, WorkerState,
};
use crate::rpc::tls::ServerIdentity;
use crate::sync::lock;
use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::broadcast;

/// Lines of output kept in memory per rank.
pub const RING_LINES: usize = 2000;

struct Record {
    info: WorkerInfo,
    /// AGENT-1: the write end of the worker's stdin; dropping it (or the agent dying)
    /// tells the worker to exit.
    stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    /// The last [`RING_LINES`] lines of output.
    ring: VecDeque<LogLine>,
}

/// The worker processes of one agent.
pub struct Workers {
    mesh: String,
    /// What each worker reads first on its stdin: the mesh token line, then the TLS
    /// line ([`tls_line`]).
    stdin_head: String,
    /// The mesh token: the relay's connections to the workers are keyed by it.
    token: String,
    log_dir: PathBuf,
    host: String,
    /// The address workers listen on (`AgentConfig::bind_host`).
    bind_host: String,
    /// Shared with the per-worker output and exit tasks.
    records: Arc<Mutex<Vec<Record>>>,
    /// The command the workers were started with (for respawn).
    spec: Mutex<Option<SpawnWorkersRequest>>,
    /// FORK-1: the templates started, one per command. Each lives as long as the
    /// workers it forked (they die with it) or until `stop_all`.
    templates: Mutex<Vec<Arc<Template>>>,
    /// FORK-1: a template failed here, so workers start by `exec` from now on.
    no_template: std::sync::atomic::AtomicBool,
}

/// A started worker, until it exits: a child of the agent (`exec`) or of its
/// template (FORK-1).
enum Running {
    Exec(tokio::process::Child),
    Forked(tokio::sync::oneshot::Receiver<Exit>),
}

impl Running {
    async fn wait(self) -> Exit {
        match self {
            Running::Exec(mut child) => match child.wait().await {
                Ok(st) => Exit {
                    code: st.code().unwrap_or(-1),
                    signal: st.signal().unwrap_or(0),
                },
                Err(_) => Exit {
                    code: -1,
                    signal: 0,
                },
            },
            Running::Forked(rx) => rx.await.unwrap_or(Exit {
                code: -1,
                signal: libc::SIGKILL,
            }),
        }
    }
}

type Pipes = (
    Option<Box<dyn AsyncWrite + Send + Unpin>>,
    Option<Box<dyn AsyncRead + Send + Unpin>>,
    Option<Box<dyn AsyncRead + Send + Unpin>>,
);

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Starts a worker line's origin tag (`ORIGIN_START origin ORIGIN_END text`).
pub const ORIGIN_START: u8 = 0x1e;
/// Ends a worker line's origin tag.
pub const ORIGIN_END: u8 = 0x1f;

/// Longest origin tag the agent accepts (a notebook message id is 32 to 40 bytes).
const MAX_ORIGIN: usize = 128;

/// Splits a worker's output line into its origin tag (`\x1e ORIGIN \x1f` at the
/// start, written by the worker while it serves a call) and the text. An untagged or
/// malformed line is all text.
pub fn split_origin(line: &[u8]) -> (String, &[u8]) {
    if line.first() == Some(&ORIGIN_START) {
        let end = line
            .iter()
            .take(MAX_ORIGIN + 2)
            .position(|&b| b == ORIGIN_END);
        if let Some(end) = end {
            let origin = &line[1..end];
            if origin.iter().all(|b| b.is_ascii_graphic()) {
                return (
                    String::from_utf8_lossy(origin).into_owned(),
                    &line[end + 1..],
                );
            }
        }
    }
    (String::new(), line)
}

/// The second line of a worker's stdin (TLS-3): one JSON object, `{"ca": PEM, "cert":
/// PEM, "key": PEM}` with what the mesh has (`{}` without TLS), so the worker reads
/// it the same way either way.
pub fn tls_line(ca: Option<&str>, id: Option<&ServerIdentity>) -> String {
    let mut fields = Vec::new();
    if let Some(ca) = ca {
        fields.push(format!("\"ca\":{}", json_string(ca)));
    }
    if let Some(id) = id {
        fields.push(format!("\"cert\":{}", json_string(&id.cert_pem)));
        fields.push(format!("\"key\":{}", json_string(&id.key_pem)));
    }
    format!("{{{}}}", fields.join(","))
}

/// `s` as a JSON string literal (one line: newlines and other controls escaped).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What every process the agent starts gets (a worker, or its template: FORK-1): the
/// controller's folder `cwd` where this host has it (another host may not), a session
/// of its own, AGENT-1's death signal, and `fd` kept open across exec (std sets
/// CLOEXEC on every descriptor it makes).
pub fn own_session_keeping(cmd: &mut tokio::process::Command, fd: std::os::fd::RawFd, cwd: &str) {
    if !cwd.is_empty() && std::path::Path::new(cwd).is_dir() {
        cmd.current_dir(cwd);
    }
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (setsid, prctl, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let flags = libc::fcntl(fd, libc::F_GETFD);
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
}

/// The state letter of process `pid` as the kernel sees it ("R", "S", "T", ...), or
/// "" if unreadable: its main thread's, except that a process any of whose threads is
/// running (or waiting for a CPU) is "R" (AGENT-4): a worker's endpoints run on
/// threads of their own while its main thread sleeps, and a busy worker is not a
/// hung one.
fn proc_state(pid: u32) -> String {
    let main = state_letter(&format!("/proc/{pid}/stat"));
    if matches!(main.as_str(), "" | "R" | "T" | "t" | "Z" | "X") {
        return main;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return main;
    };
    let running = tasks
        .flatten()
        .any(|t| state_letter(&format!("{}/stat", t.path().display())) == "R");
    if running {
        "R".to_string()
    } else {
        main
    }
}

/// The state letter of a `stat` file of /proc, or "" if unreadable.
fn state_letter(path: &str) -> String {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return String::new();
    };
    // The command name is in parentheses and may contain spaces: the state follows
    // the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

impl Workers {
    /// No workers yet. `tls` is the line [`tls_line`] makes.
    pub fn new(
        mesh: String,
        token: String,
        log_dir: PathBuf,
        bind_host: String,
        tls: String,
    ) -> Self {
        Workers {
            mesh,
            stdin_head: format!("{token}\n{tls}\n"),
            token,
            log_dir,
            host: hostname(),
            bind_host,
            records: Arc::new(Mutex::new(Vec::new())),
            spec: Mutex::new(None),
            templates: Mutex::new(Vec::new()),
            no_template: Default::default(),
        }
    }

    /// Starts `req.count` workers, ranked after those that exist. Must run inside the
    /// runtime.
    pub async fn spawn(
        &self,
        req: &SpawnWorkersRequest,
        events: broadcast::Sender<AgentEvent>,
    ) -> std::io::Result<Vec<WorkerInfo>> {
        let first = match lock(&self.records).iter().map(|r| r.info.rank + 1).max() {
            Some(next) => next,
            None => req.first_rank,
        };
        *lock(&self.spec) = Some(req.clone());
        let mut out = Vec::new();
        for rank in first..first + req.count {
            out.push(self.spawn_one(rank, req, events.clone()).await?);
        }
        Ok(out)
    }

    /// Restarts the exited workers `ranks` with the command that started them; a rank
    /// still running, or unknown, is an error and nothing is restarted.
    pub async fn respawn(
        &self,
        ranks: &[u32],
        events: broadcast::Sender<AgentEvent>,
    ) -> Result<Vec<WorkerInfo>, String> {
        let spec = lock(&self.spec).clone();
        let Some(spec) = spec else {
            return Err("no workers were ever started".into());
        };
        for &rank in ranks {
            match lock(&self.records).iter().find(|r| r.info.rank == rank) {
                None => return Err(format!("there is no rank {rank}")),
                Some(r) if r.info.state != WorkerState::Exited as i32 => {
                    return Err(format!("rank {rank} is still running (pid {})", r.info.pid))
                }
                Some(_) => {}
            }
        }
        let mut out = Vec::new();
        for &rank in ranks {
            let info = self
                .spawn_one(rank, &spec, events.clone())
                .await
                .map_err(|e| e.to_string())?;
            out.push(info);
        }
        Ok(out)
    }

    /// The environment every worker of this agent gets besides the command's own.
    fn common_env(&self, req: &SpawnWorkersRequest) -> [(&'static str, String); 2] {
        [
            ("MONARCH_MESH", self.mesh.clone()),
            // The transfer engine listens where the worker does (unless set).
            (
                "MONARCH_TRANSFER_HOST",
                req.env
                    .get("MONARCH_TRANSFER_HOST")
                    .unwrap_or(&self.bind_host)
                    .clone(),
            ),
        ]
    }

    /// FORK-1: the template that forks the workers of `req`, started if need be; none
    /// if they cannot be forked or a template failed here before.
    fn template_for(&self, req: &SpawnWorkersRequest) -> Option<Arc<Template>> {
        use std::sync::atomic::Ordering::Relaxed;
        if !template::forkable(req) || self.no_template.load(Relaxed) {
            return None;
        }
        let mut all = lock(&self.templates);
        if let Some(t) = all.iter().find(|t| t.serves(req)) {
            return Some(t.clone());
        }
        match Template::start(req, &self.common_env(req)) {
            Ok(t) => {
                let t = Arc::new(t);
                all.push(t.clone());
                Some(t)
            }
            Err(e) => {
                self.no_fork(&e);
                None
            }
        }
    }

    fn no_fork(&self, why: &std::io::Error) {
        eprintln!(
            "monarch agent: workers start by exec from now on: the worker template failed ({why})"
        );
        // The templates stay: the workers they forked live while they do.
        self.no_template
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts the worker of `rank` on `listener`: forked from the template (FORK-1),
    /// or by `exec`.
    async fn start(
        &self,
        rank: u32,
        req: &SpawnWorkersRequest,
        listener: &std::net::TcpListener,
    ) -> std::io::Result<(u32, Pipes, Running)> {
        let fd = listener.as_raw_fd();
        if let Some(t) = self.template_for(req) {
            match t.fork(rank, fd).await {
                Ok(f) => {
                    let pipes: Pipes = (
                        Some(Box::new(f.stdin)),
                        Some(Box::new(f.stdout)),
                        Some(Box::new(f.stderr)),
                    );
                    return Ok((f.pid, pipes, Running::Forked(f.exit)));
                }
                Err(e) => self.no_fork(&e),
            }
        }
        let mut cmd = tokio::process::Command::new(&req.executable);
        cmd.args(&req.args)
            .envs(&req.env)
            .envs(self.common_env(req))
            .env("MONARCH_LISTEN_FD", fd.to_string())
            .env("MONARCH_RANK", rank.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        own_session_keeping(&mut cmd, fd, &req.cwd);
        let mut child = cmd.spawn()?;
        let pipes: Pipes = (
            child
                .stdin
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncWrite + Send + Unpin>),
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncRead + Send + Unpin>),
        );
        Ok((child.id().unwrap_or(0), pipes, Running::Exec(child)))
    }

    async fn spawn_one(
        &self,
        rank: u32,
        req: &SpawnWorkersRequest,
        events: broadcast::Sender<AgentEvent>,
    ) -> std::io::Result<WorkerInfo> {
        let listener = std::net::TcpListener::bind((self.bind_host.as_str(), 0))?;
        let addr = listener.local_addr()?.to_string();
        let (pid, (mut stdin, stdout, stderr), running) = self.start(rank, req, &listener).await?;
        drop(listener);

        let mut info = WorkerInfo {
            rank,
            pid,
            addr,
            state: WorkerState::Running as i32,
            exit_code: 0,
            signal: 0,
            host: self.host.clone(),
            ..Default::default()
        };
        if let Some(s) = stdin.as_mut() {
            // The pipe is empty and far larger than these two lines (a few KiB): this
            // never waits.
            let _ = s.write_all(self.stdin_head.as_bytes()).await;
        }
        {
            let mut recs = lock(&self.records);
            match recs.iter_mut().find(|r| r.info.rank == rank) {
                Some(old) => {
                    // A restart: the output so far stays in the ring.
                    info.restarts = old.info.restarts + 1;
                    old.info = info.clone();
                    old.stdin = stdin;
                }
                None => recs.push(Record {
                    info: info.clone(),
                    stdin,
                    ring: VecDeque::new(),
                }),
            }
        }
        let log_path = self.log_dir.join(format!("rank-{rank}.log"));
        if let Some(out) = stdout {
            self.capture(rank, pid, "stdout", out, log_path.clone(), events.clone());
        }
        if let Some(err) = stderr {
            self.capture(rank, pid, "stderr", err, log_path, events.clone());
        }
        let records = self.records.clone();
        let oom = super::oom::OomWatch::start(pid);
        let token = self.token.clone();
        tokio::spawn(async move {
            let exit = running.wait().await;
            let killed = exit.signal == libc::SIGKILL;
            let cause = if killed {
                tokio::task::spawn_blocking(move || oom.cause(pid))
                    .await
                    .unwrap_or_default()
            } else {
                String::new()
            };
            let info = {
                let mut recs = lock(&records);
                let Some(rec) = recs
                    .iter_mut()
                    .find(|r| r.info.rank == rank && r.info.pid == pid)
                else {
                    return;
                };
                rec.info.state = WorkerState::Exited as i32;
                rec.info.exit_code = exit.code;
                rec.info.signal = exit.signal;
                rec.info.exit_cause = cause;
                rec.stdin = None;
                rec.info.clone()
            };
            // The relay's calls to it fail now, not when its address refuses: a child
            // it forked may still hold its listening socket (RESUME-1, CLIENT-1).
            let gone = crate::rpc::RpcError::ConnectionLost {
                addr: info.addr.clone(),
                reason: format!("its worker (pid {pid}) exited"),
            };
            crate::rpc::client::WorkerConn::abandon_relayed_at(&info.addr, &token, gone);
            let _ = events.send(AgentEvent {
                event: Some(agent_event::Event::WorkerExited(info)),
            });
        });
        Ok(info)
    }

    fn capture<R: AsyncRead + Unpin + Send + 'static>(
        &self,
        rank: u32,
        pid: u32,
        stream: &'static str,
        pipe: R,
        path: PathBuf,
        events: broadcast::Sender<AgentEvent>,
    ) {
        let records = self.records.clone();
        tokio::spawn(async move {
            // Readable by its owner only: it holds what the worker printed.
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .ok();
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let (origin, body) = split_origin(&buf);
                let (kind, payload) = classify(body.strip_suffix(b"\n").unwrap_or(body));
                let is_text = kind == Kind::Text;
                if let (Some(f), true) = (file.as_mut(), is_text) {
                    let _ = f.write_all(body);
                }
                let line = LogLine {
                    rank,
                    stream: stream.to_string(),
                    text: String::from_utf8_lossy(payload).into_owned(),
                    origin,
                    time_us: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_micros() as u64),
                    pid,
                    kind: kind as i32,
                };
                if is_text {
                    let mut recs = lock(&records);
                    if let Some(rec) = recs.iter_mut().find(|r| r.info.rank == rank) {
                        if rec.ring.len() == RING_LINES {
                            rec.ring.pop_front();
                        }
                        rec.ring.push_back(line.clone());
                    }
                }
                let _ = events.send(AgentEvent {
                    event: Some(agent_event::Event::Log(line)),
                });
            }
        });
    }

    /// Each running worker: its proc rank, address and pid.
    pub fn running(&self) -> Vec<(u32, String, u32)> {
        lock(&self.records)
            .iter()
            .filter(|r| r.info.state == WorkerState::Running as i32)
            .map(|r| (r.info.rank, r.info.addr.clone(), r.info.pid))
            .collect()
    }

    /// The address of the running worker of proc rank `proc`.
    pub fn addr_of(&self, proc: u32) -> Option<String> {
        lock(&self.records)
            .iter()
            .find(|r| r.info.rank == proc && r.info.state == WorkerState::Running as i32)
            .map(|r| r.info.addr.clone())
    }

    /// Every worker, alive or not, with the kernel's view of each running one.
    pub fn list(&self) -> Vec<WorkerInfo> {
        let mut out: Vec<WorkerInfo> = lock(&self.records).iter().map(|r| r.info.clone()).collect();
        for w in &mut out {
            if w.state == WorkerState::Running as i32 {
                w.proc_state = proc_state(w.pid);
            }
        }
        out
    }

    /// The last `tail` lines of `rank` (every rank if `None`), oldest first.
    pub fn logs(&self, rank: Option<u32>, tail: usize) -> Vec<LogLine> {
        let recs = lock(&self.records);
        let mut out = Vec::new();
        for r in recs
            .iter()
            .filter(|r| rank.is_none_or(|k| k == r.info.rank))
        {
            let skip = r.ring.len().saturating_sub(tail);
            out.extend(r.ring.iter().skip(skip).cloned());
        }
        // Every rank's: in the order they were printed (read), not rank by rank.
        out.sort_by_key(|l| l.time_us);
        out
    }

    fn running_pids(&self) -> Vec<i32> {
        lock(&self.records)
            .iter()
            .filter(|r| r.info.state == WorkerState::Running as i32)
            .map(|r| r.info.pid as i32)
            .collect()
    }

    /// SIGTERM every worker's process group, SIGKILL what is left after `grace`, and
    /// wait (briefly) for the exits to be recorded.
    pub async fn stop_all(&self, grace: Duration) {
        for pid in self.running_pids() {
            // SAFETY: kill has no memory-safety preconditions. Each worker leads its
            // own session, so -pid is its process group.
            unsafe { libc::kill(-pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        while !self.running_pids().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for pid in self.running_pids() {
            // SAFETY: as above.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.running_pids().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // FORK-1: their templates go with them (started again by the next spawn).
        lock(&self.templates).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::{split_origin, tls_line};
    use crate::rpc::tls::ServerIdentity;

    #[test]
    fn the_tls_line_is_one_line_of_json_and_empty_without_tls() {
        assert_eq!(tls_line(None, None), "{}");
        let id = ServerIdentity {
            cert_pem: "-----BEGIN\nA\"B\\C\n".into(),
            key_pem: "K\tEY".into(),
        };
        assert_eq!(
            tls_line(Some("CA\n"), Some(&id)),
            r#"{"ca":"CA\n","cert":"-----BEGIN\nA\"B\\C\n","key":"K\u0009EY"}"#
        );
    }

    #[test]
    fn an_origin_tag_is_split_off_and_anything_else_is_text() {
        assert_eq!(
            split_origin(b"\x1ecell-1\x1fhello\n"),
            ("cell-1".into(), &b"hello\n"[..])
        );
        assert_eq!(split_origin(b"plain\n"), (String::new(), &b"plain\n"[..]));
        assert_eq!(
            split_origin(b"\x1eno end\n"),
            (String::new(), &b"\x1eno end\n"[..])
        );
        assert_eq!(
            split_origin(b"\x1ebad tag\x1fx"),
            (String::new(), &b"\x1ebad tag\x1fx"[..])
        );
        let long = [&[0x1e][..], &[b'a'; 200], &[0x1f], b"x"].concat();
        assert_eq!(split_origin(&long).0, "");
    }
}
