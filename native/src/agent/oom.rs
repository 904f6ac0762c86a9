//! Why a worker was killed, when the kernel's out-of-memory killer did it.
//!
//! AGENT-3: a worker killed by SIGKILL is labelled out-of-memory where the kernel says
//! so: a record of its log (`/dev/kmsg`) written by the kernel itself (facility 0:
//! user space cannot write those) that names the pid ("Killed process PID"), logged
//! after the worker started and by the time it was reaped, and, where the kernel's
//! `oom-kill:` record names the task's memory cgroup, in the worker's cgroup or below
//! it. A pid is the worker's only while it runs, so an older record of the same pid
//! (pid reuse), a line someone wrote to the log, or a kill in another cgroup (another
//! container sharing the kernel's log) is not taken for its death. Where the log
//! cannot be read (`kernel.dmesg_restrict`, no privilege), a rise of the `oom_kill`
//! counter of the worker's memory cgroup since it started says "probably". Nothing
//! else is guessed: a SIGKILL with neither is reported as a plain SIGKILL.
//!
//! "After the worker started" is told by the log's sequence numbers, not its
//! timestamps: the agent reads the log when it starts a worker and again when it
//! reaps it, and a record's sequence number places it exactly between the two. The
//! timestamps are the kernel's own clock, which NTP does not slew as it slews the
//! agent's, so the two drift apart by seconds a day.

use crate::sync::lock;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Mutex, OnceLock};

/// What a worker's death is matched against: where the kernel log stood when it
/// started, its memory cgroup, and that cgroup's `oom_kill` count then.
#[derive(Clone, Debug, Default)]
pub struct OomWatch {
    /// The sequence number of the last kernel log record read before the worker
    /// started (`None`: none read yet; every record read later is newer). Unset
    /// where the log cannot be read.
    since: Option<Option<u64>>,
    /// The worker's memory cgroup, as this process sees it.
    cgroup: Option<String>,
    counter: Option<(std::path::PathBuf, u64)>,
}

impl OomWatch {
    /// Reads where the kernel log stands and `pid`'s memory cgroup now (just after
    /// it started).
    pub fn start(pid: u32) -> Self {
        let since = with_log(|log| {
            log.read_new();
            log.last_seq
        });
        let counter = memory_events(pid).and_then(|p| oom_kills(&p).map(|n| (p, n)));
        OomWatch {
            since,
            cgroup: memory_cgroup(pid),
            counter,
        }
    }

    /// Why `pid` (this watch's worker, just reaped after SIGKILL) was killed, in words,
    /// if the kernel's OOM killer did it; empty otherwise.
    pub fn cause(&self, pid: u32) -> String {
        if let Some(since) = self.since {
            let found = with_log(|log| {
                log.read_new();
                log.kill_of(pid, since, self.cgroup.as_deref()).cloned()
            });
            if let Some(found) = found {
                return match found {
                    Some(kill) => format!(
                        "out of memory: the kernel's OOM killer ended it ({}; kernel log)",
                        kill.scope()
                    ),
                    None => String::new(),
                };
            }
        }
        match &self.counter {
            Some((path, before)) if oom_kills(path).is_some_and(|now| now > *before) => format!(
                "probably out of memory: {} counted an OOM kill (the kernel log is not readable here)",
                path.display()
            ),
            _ => String::new(),
        }
    }
}

/// The kernel log of this process (one agent: one reader), opened at its end on first
/// use; `None` where it cannot be read.
static LOG: OnceLock<Option<Mutex<KernelLog>>> = OnceLock::new();

/// Runs `f` on the kernel log; `None` where it cannot be read.
fn with_log<T>(f: impl FnOnce(&mut KernelLog) -> T) -> Option<T> {
    let log = LOG
        .get_or_init(|| KernelLog::open().map(Mutex::new))
        .as_ref()?;
    let mut log = lock(log);
    Some(f(&mut log))
}

/// A kernel log record of an OOM kill.
#[derive(Clone, Debug, PartialEq)]
struct Kill {
    seq: u64,
    pid: u32,
    /// The killed task's memory cgroup, from the `oom-kill:` record before it.
    memcg: Option<String>,
    /// Whether its memory cgroup's limit, not the host's memory, was reached.
    cgroup_limit: bool,
}

impl Kill {
    fn scope(&self) -> &'static str {
        if self.cgroup_limit {
            "its memory cgroup reached its limit"
        } else {
            "the host ran out of memory"
        }
    }
}

/// Kill records kept: a worker is reaped moments after its kill, and a record of
/// this many kills back is long gone by then.
const KEPT: usize = 1024;

/// The OOM kills the kernel logged since this reader opened the log.
struct KernelLog {
    file: Option<std::fs::File>,
    /// The sequence number of the last record read.
    last_seq: Option<u64>,
    kills: std::collections::VecDeque<Kill>,
    /// The memory cgroup of each pid the last `oom-kill:` records named.
    memcgs: std::collections::VecDeque<(u32, String)>,
}

impl KernelLog {
    /// The log, positioned after its last record: older records are never read.
    fn open() -> Option<Self> {
        use std::io::Seek;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        file.seek(std::io::SeekFrom::End(0)).ok()?;
        let mut log = Self::empty();
        log.file = Some(file);
        Some(log)
    }

    fn empty() -> Self {
        KernelLog {
            file: None,
            last_seq: None,
            kills: Default::default(),
            memcgs: Default::default(),
        }
    }

    /// Reads the records written since the last read.
    fn read_new(&mut self) {
        let Some(mut file) = self.file.take() else {
            return;
        };
        let mut buf = vec![0u8; 16 * 1024];
        // One record per read; EPIPE means records were overwritten meanwhile: go on.
        for _ in 0..100_000 {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.take(&buf[..n]),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break, // EAGAIN: nothing more for now
            }
        }
        self.file = Some(file);
    }

    /// Takes one record (`PRIORITY,SEQ,TIMESTAMP,FLAGS;MESSAGE\n`, then continuation
    /// lines).
    fn take(&mut self, rec: &[u8]) {
        let rec = String::from_utf8_lossy(rec);
        let Some((head, text)) = rec.split_once(';') else {
            return;
        };
        let mut fields = head.split(',');
        let prio: Option<u32> = fields.next().and_then(|f| f.parse().ok());
        let Some(seq) = fields.next().and_then(|f| f.parse::<u64>().ok()) else {
            return;
        };
        self.last_seq = Some(seq);
        // Facility 0 is the kernel's: a line written to /dev/kmsg from user space gets
        // another (LOG_USER unless it names one), so it is never taken for a kill.
        if prio.is_none_or(|p| p >> 3 != 0) {
            return;
        }
        let text = text.lines().next().unwrap_or("");
        if let Some(rest) = text.strip_prefix("oom-kill:") {
            let field = |name: &str| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            };
            if let (Some(memcg), Some(pid)) = (
                field("task_memcg"),
                field("pid").and_then(|p| p.parse().ok()),
            ) {
                push_bounded(&mut self.memcgs, (pid, memcg.to_string()));
            }
        } else if let Some(pid) = killed_pid(text) {
            let memcg = self
                .memcgs
                .iter()
                .rev()
                .find(|(p, _)| *p == pid)
                .map(|(_, m)| m.clone());
            let kill = Kill {
                seq,
                pid,
                memcg,
                cgroup_limit: text.contains("Memory cgroup out of memory"),
            };
            push_bounded(&mut self.kills, kill);
        }
    }

    /// The kill of `pid` logged after `since` (the record read last before the worker
    /// started) in `cgroup` or below it, where its record names one.
    fn kill_of(&self, pid: u32, since: Option<u64>, cgroup: Option<&str>) -> Option<&Kill> {
        self.kills.iter().rev().find(|k| {
            k.pid == pid
                && since.is_none_or(|s| k.seq > s)
                && match (&k.memcg, cgroup) {
                    (Some(memcg), Some(own)) => within(memcg, own),
                    _ => true,
                }
        })
    }
}

fn push_bounded<T>(q: &mut std::collections::VecDeque<T>, item: T) {
    if q.len() == KEPT {
        q.pop_front();
    }
    q.push_back(item);
}

/// The pid a "... Killed process PID (NAME) ..." message names.
fn killed_pid(text: &str) -> Option<u32> {
    let rest = &text[text.find("Killed process ")? + "Killed process ".len()..];
    let (pid, after) = rest.split_once(' ')?;
    after.starts_with('(').then(|| pid.parse().ok()).flatten()
}

/// Whether the memory cgroup `memcg` (as the kernel log names it, from the root of
/// the hierarchy) is `own` (as this process sees it, perhaps from a cgroup
/// namespace's root) or below it: `own`'s path is a run of `memcg`'s, and the root
/// (unknown here) matches any.
fn within(memcg: &str, own: &str) -> bool {
    let own: Vec<&str> = own.split('/').filter(|c| !c.is_empty()).collect();
    let memcg: Vec<&str> = memcg.split('/').filter(|c| !c.is_empty()).collect();
    own.is_empty() || memcg.windows(own.len()).any(|w| w == own.as_slice())
}

/// `pid`'s memory cgroup as this process sees it: cgroup v1's memory hierarchy, or
/// the v2 one.
fn memory_cgroup(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    v1.or_else(|| {
        text.lines()
            .find_map(|l| l.strip_prefix("0::").map(String::from))
    })
}

/// The file that counts OOM kills in `pid`'s memory cgroup (v2 `memory.events`, or v1
/// `memory.oom_control`).
fn memory_events(pid: u32) -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let p = std::path::Path::new("/sys/fs/cgroup/memory")
                .join(path.trim_start_matches('/'))
                .join("memory.oom_control");
            if p.exists() {
                return Some(p);
            }
        }
    }
    let v2 = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .map(|root| {
            std::path::Path::new(root)
                .join(v2.trim_start_matches('/'))
                .join("memory.events")
        })
        .find(|p| p.exists())
}

/// The `oom_kill N` count in a `memory.events` or `memory.oom_control` file.
fn oom_kills(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_either_cgroup_file_format() {
        let dir = std::env::temp_dir().join(format!("oom-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v2 = dir.join("memory.events");
        std::fs::write(&v2, "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n").unwrap();
        assert_eq!(oom_kills(&v2), Some(2));
        let v1 = dir.join("memory.oom_control");
        std::fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n").unwrap();
        assert_eq!(oom_kills(&v1), Some(7));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_living_process_has_no_oom_cause() {
        let me = std::process::id();
        assert_eq!(OomWatch::start(me).cause(me), "");
    }

    /// The records the kernel writes for a kill in a memory cgroup (seen on Linux 6.18).
    fn kernel_kill(log: &mut KernelLog, seq: u64, pid: u32, memcg: &str) {
        log.take(
            format!(
                "6,{seq},748338171,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),\
                 cpuset=/,mems_allowed=0,oom_memcg={memcg},task_memcg={memcg},task=python,\
                 pid={pid},uid=0\n"
            )
            .as_bytes(),
        );
        log.take(
            format!(
                "3,{},748338209,-;Memory cgroup out of memory: Killed process {pid} (python) \
                 total-vm:1008292kB, anon-rss:330960kB, file-rss:15596kB, shmem-rss:0kB, \
                 UID:0 pgtables:784kB oom_score_adj:0\n",
                seq + 1
            )
            .as_bytes(),
        );
    }

    #[test]
    fn a_kernel_kill_after_the_start_in_the_workers_cgroup_is_its_death() {
        let mut log = KernelLog::empty();
        log.take(b"6,10,100,-;something else\n");
        let since = log.last_seq;
        kernel_kill(&mut log, 20, 4242, "/process_api/abc/monarch-test-oom-1");
        let kill = log.kill_of(4242, since, Some("/process_api/abc")).unwrap();
        assert!(kill.cgroup_limit);
        assert_eq!(kill.scope(), "its memory cgroup reached its limit");
        // Seen from a cgroup namespace: the worker's path is the end of the kernel's.
        assert!(log
            .kill_of(4242, since, Some("/monarch-test-oom-1"))
            .is_some());
        assert!(log.kill_of(4242, since, Some("/")).is_some());
        assert!(log.kill_of(4242, since, None).is_some());
        assert!(log.kill_of(4243, since, None).is_none());
    }

    #[test]
    fn an_older_kill_of_the_same_pid_is_not_the_workers() {
        let mut log = KernelLog::empty();
        kernel_kill(&mut log, 20, 4242, "/a");
        let since = log.last_seq; // the worker starts after that kill: pid reuse
        log.take(b"6,30,100,-;something else\n");
        assert!(log.kill_of(4242, since, Some("/a")).is_none());
        kernel_kill(&mut log, 40, 4242, "/a"); // its own
        assert_eq!(log.kill_of(4242, since, Some("/a")).unwrap().seq, 41);
    }

    #[test]
    fn a_kill_in_another_cgroup_is_another_containers() {
        let mut log = KernelLog::empty();
        kernel_kill(&mut log, 20, 4242, "/process_api/other/monarch-test-oom-7");
        assert!(log.kill_of(4242, None, Some("/process_api/mine")).is_none());
    }

    #[test]
    fn a_line_written_to_the_log_from_user_space_is_never_a_kill() {
        let mut log = KernelLog::empty();
        // What `echo "Out of memory: Killed process 4242 (python)" > /dev/kmsg` gives
        // (LOG_USER), also with a level of its own, or the kernel's facility asked for.
        for prio in ["12", "11", "14"] {
            log.take(
                format!("{prio},5,100,-;Out of memory: Killed process 4242 (python)\n").as_bytes(),
            );
        }
        assert_eq!(log.last_seq, Some(5));
        assert!(log.kill_of(4242, None, None).is_none());
        log.take(b"3,6,100,-;Out of memory: Killed process 4242 (python) total-vm:1kB\n");
        let kill = log.kill_of(4242, None, None).unwrap();
        assert_eq!(
            (kill.memcg.as_deref(), kill.scope()),
            (None, "the host ran out of memory")
        );
    }

    #[test]
    fn only_a_killed_process_line_names_a_pid() {
        assert_eq!(
            killed_pid("Out of memory: Killed process 12 (python) x"),
            Some(12)
        );
        assert_eq!(killed_pid("Killed process 12(python)"), None);
        assert_eq!(killed_pid("Killed process x (python)"), None);
        assert_eq!(killed_pid("oom_reaper: reaped process 12 (python)"), None);
    }
}
