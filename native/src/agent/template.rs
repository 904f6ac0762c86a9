//! FORK-1: workers forked from a template process, one per agent and command.
//!
//! A worker that starts by `exec` imports the runtime again (about 100 ms of CPU
//! each); 16 of them on each of 64 hosts, on a busy machine, is most of a mesh's
//! bring-up. So the agent starts one template process per command (the workers'
//! own, `python -m monarch_kernel.worker`, with `MONARCH_TEMPLATE_FD` set, so that a
//! forked worker's command line is an exec'd one's), which imports what every worker
//! imports and starts no thread, and asks it to fork each worker: a message on a `SOCK_SEQPACKET`
//! pair carries the rank and, as `SCM_RIGHTS`, the worker's listening socket and the
//! child's ends of its stdin, stdout and stderr pipes. The template answers with the
//! child's pid, reaps its children and sends each one's exit status.
//!
//! The worker it forks is the one `exec` would start: its own session, the same pipes
//! (AGENT-1: EOF on stdin makes it exit), the same environment and folder. AGENT-1
//! still holds: the template dies with the agent (`PR_SET_PDEATHSIG`) and each child
//! with the template; a template that ends takes its children with it, and each is
//! reported as exited. A template that cannot start or answer is not used again by
//! this agent: workers start by `exec` instead (`MONARCH_WORKER_FORK=0` in the
//! workers' environment asks for that from the start).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::proto::v1::SpawnWorkersRequest;
use crate::sync::lock;

/// How a worker ended: its exit code (-1 if killed) and the signal that killed it (0
/// if none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, -1 if a signal ended it.
    pub code: i32,
    /// The signal that ended it, 0 if none.
    pub signal: i32,
}

/// How long the template may take to fork one worker (it imports nothing per fork).
const FORK_REPLY: Duration = Duration::from_secs(60);

/// The arguments of the worker command that a template can fork.
pub const WORKER_ARGS: [&str; 2] = ["-m", "monarch_kernel.worker"];

/// Whether the workers of `req` may be forked from a template (FORK-1).
pub fn forkable(req: &SpawnWorkersRequest) -> bool {
    req.args == WORKER_ARGS && req.env.get("MONARCH_WORKER_FORK").map(String::as_str) != Some("0")
}

/// What identifies a command: workers of another command need another template.
pub fn key_of(req: &SpawnWorkersRequest) -> String {
    let mut env: Vec<_> = req.env.iter().collect();
    env.sort();
    format!("{}\0{:?}\0{:?}\0{}", req.executable, req.args, env, req.cwd)
}

#[derive(Default)]
struct Waiting {
    /// Senders of the pids still to come, in the order the forks were asked for.
    pids: VecDeque<oneshot::Sender<io::Result<u32>>>,
    /// Who waits for each child's exit.
    exits: HashMap<u32, oneshot::Sender<Exit>>,
    /// Exits that came before anyone waited for them.
    early: HashMap<u32, Exit>,
    /// The template is gone: nothing more will come.
    closed: bool,
}

/// A running template process.
pub struct Template {
    key: String,
    sock: OwnedFd,
    waiting: Arc<Mutex<Waiting>>,
    /// The template itself (killed when this is dropped).
    _child: tokio::process::Child,
}

/// A worker forked by a template.
pub struct Forked {
    /// Its process id.
    pub pid: u32,
    /// The write end of its stdin.
    pub stdin: tokio::net::unix::pipe::Sender,
    /// The read end of its stdout.
    pub stdout: tokio::net::unix::pipe::Receiver,
    /// The read end of its stderr.
    pub stderr: tokio::net::unix::pipe::Receiver,
    /// Its exit, when the template reports it.
    pub exit: oneshot::Receiver<Exit>,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends `data` on `sock` with `fds` attached (`SCM_RIGHTS`).
fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE / CMSG_LEN are arithmetic.
    let (space, len) = unsafe { (libc::CMSG_SPACE(bytes as u32), libc::CMSG_LEN(bytes as u32)) };
    // u64s: the control buffer must be aligned for cmsghdr.
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below,
    // which outlive the sendmsg call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The value of `"name": N` in a one-line JSON object the template wrote.
fn field(text: &str, name: &str) -> Option<i64> {
    let at = text.find(&format!("\"{name}\":"))? + name.len() + 3;
    let rest = text[at..].trim_start();
    let end = rest
        .find(|c: char| !(c == '-' || c.is_ascii_digit()))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Reads the template's messages until it ends: pids in answer to forks, and exits.
fn read_replies(sock: RawFd, waiting: Arc<Mutex<Waiting>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: recv writes at most buf.len() bytes into buf.
        let n = unsafe { libc::recv(sock, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n as usize]);
        let mut w = lock(&waiting);
        if let Some(pid) = field(&text, "pid") {
            if let Some(tx) = w.pids.pop_front() {
                let _ = tx.send(Ok(pid as u32));
            }
        } else if let Some(pid) = field(&text, "exit") {
            let exit = Exit {
                code: field(&text, "code").unwrap_or(-1) as i32,
                signal: field(&text, "signal").unwrap_or(0) as i32,
            };
            match w.exits.remove(&(pid as u32)) {
                Some(tx) => {
                    let _ = tx.send(exit);
                }
                None => {
                    w.early.insert(pid as u32, exit);
                }
            }
        }
    }
    // The template is gone, and its children with it (PR_SET_PDEATHSIG).
    let mut w = lock(&waiting);
    w.closed = true;
    for tx in w.pids.drain(..) {
        let _ = tx.send(Err(io::Error::other("the worker template process ended")));
    }
    let killed = Exit {
        code: -1,
        signal: libc::SIGKILL,
    };
    for (_, tx) in w.exits.drain() {
        let _ = tx.send(killed);
    }
}

impl Template {
    /// Starts the template for the workers of `req`, with `env` added to theirs.
    pub fn start(req: &SpawnWorkersRequest, env: &[(&str, String)]) -> io::Result<Template> {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into fds.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both are fresh descriptors owned by nothing else.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let fd = theirs.as_raw_fd();
        let mut cmd = tokio::process::Command::new(&req.executable);
        cmd.args(&req.args)
            .envs(&req.env)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("MONARCH_TEMPLATE_FD", fd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        super::process::own_session_keeping(&mut cmd, fd, &req.cwd);
        let child = cmd.spawn()?;
        drop(theirs);
        let waiting: Arc<Mutex<Waiting>> = Arc::default();
        // The reader holds its own descriptor: its number stays this socket's until
        // the template ends (dropping the template kills it, which ends the reader).
        let (reader, w2) = (ours.try_clone()?, waiting.clone());
        std::thread::Builder::new()
            .name("monarch-template".into())
            .spawn(move || read_replies(reader.as_raw_fd(), w2))?;
        Ok(Template {
            key: key_of(req),
            sock: ours,
            waiting,
            _child: child,
        })
    }

    /// Whether this template forks the workers of `req`.
    pub fn serves(&self, req: &SpawnWorkersRequest) -> bool {
        self.key == key_of(req) && !lock(&self.waiting).closed
    }

    /// Forks the worker of `rank` listening on `listen_fd`.
    pub async fn fork(&self, rank: u32, listen_fd: RawFd) -> io::Result<Forked> {
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let (tx, rx) = oneshot::channel();
        {
            // The order of the pids that come back is the order of the asks: send
            // under the lock that queues the sender.
            let mut w = lock(&self.waiting);
            if w.closed {
                return Err(io::Error::other("the worker template process ended"));
            }
            let msg = format!("{{\"rank\": {rank}}}");
            let fds = [
                listen_fd,
                stdin_r.as_raw_fd(),
                stdout_w.as_raw_fd(),
                stderr_w.as_raw_fd(),
            ];
            send_with_fds(self.sock.as_raw_fd(), msg.as_bytes(), &fds)?;
            w.pids.push_back(tx);
        }
        drop((stdin_r, stdout_w, stderr_w));
        let pid = match tokio::time::timeout(FORK_REPLY, rx).await {
            Ok(Ok(pid)) => pid?,
            Ok(Err(_)) => return Err(io::Error::other("the worker template process ended")),
            Err(_) => return Err(io::Error::other("the worker template did not fork in time")),
        };
        let (etx, erx) = oneshot::channel();
        {
            let mut w = lock(&self.waiting);
            match w.early.remove(&pid) {
                Some(exit) => {
                    let _ = etx.send(exit);
                }
                None if w.closed => {
                    let _ = etx.send(Exit {
                        code: -1,
                        signal: libc::SIGKILL,
                    });
                }
                None => {
                    w.exits.insert(pid, etx);
                }
            }
        }
        Ok(Forked {
            pid,
            stdin: tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w)?,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r)?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r)?,
            exit: erx,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_templates_messages_are_read_by_field() {
        let m = r#"{"exit": 41, "code": -1, "signal": 9}"#;
        assert_eq!(field(m, "exit"), Some(41));
        assert_eq!(field(m, "code"), Some(-1));
        assert_eq!(field(m, "signal"), Some(9));
        assert_eq!(field(r#"{"pid": 7}"#, "pid"), Some(7));
        assert_eq!(field(r#"{"pid": 7}"#, "exit"), None);
    }

    #[test]
    fn only_the_plain_worker_command_is_forked_and_fork_0_opts_out() {
        let mut req = SpawnWorkersRequest {
            args: WORKER_ARGS.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert!(forkable(&req));
        req.env.insert("MONARCH_WORKER_FORK".into(), "0".into());
        assert!(!forkable(&req));
        req.env.clear();
        req.args.push("--other".into());
        assert!(!forkable(&req));
    }
}
