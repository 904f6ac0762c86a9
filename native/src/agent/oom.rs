//! Why a worker was killed, when the kernel's out-of-memory killer did it.
//!
//! AGENT-3: a worker killed by SIGKILL is labelled out-of-memory where the kernel says
//! so: its log (`/dev/kmsg`, "Killed process PID") names the pid exactly; where the
//! log cannot be read (`kernel.dmesg_restrict`, no privilege), a rise of the `oom_kill`
//! counter of the worker's memory cgroup since it started says "probably". Nothing
//! else is guessed: a SIGKILL with neither is reported as a plain SIGKILL.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// The worker's memory cgroup and its `oom_kill` count when it started.
#[derive(Clone, Debug, Default)]
pub struct OomWatch {
    counter: Option<(std::path::PathBuf, u64)>,
}

impl OomWatch {
    /// Reads `pid`'s memory cgroup counter now (just after it started).
    pub fn start(pid: u32) -> Self {
        let counter = memory_events(pid).and_then(|p| oom_kills(&p).map(|n| (p, n)));
        OomWatch { counter }
    }

    /// Why `pid` (this watch's worker, just reaped after SIGKILL) was killed, in words,
    /// if the kernel's OOM killer did it; empty otherwise.
    pub fn cause(&self, pid: u32) -> String {
        if let Some(line) = kernel_log_kill(pid) {
            let scope = if line.contains("Memory cgroup out of memory") {
                "its memory cgroup reached its limit"
            } else {
                "the host ran out of memory"
            };
            return format!(
                "out of memory: the kernel's OOM killer ended it ({scope}; kernel log)"
            );
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

/// The kernel log's "Killed process PID (" line, if it has one.
fn kernel_log_kill(pid: u32) -> Option<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .ok()?;
    let needle = format!("Killed process {pid} (");
    let mut buf = vec![0u8; 16 * 1024];
    let mut found = None;
    // One record per read; EPIPE means records were overwritten meanwhile: go on.
    for _ in 0..100_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                if rec.contains(&needle) {
                    found = Some(rec.into_owned());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    found
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
}
