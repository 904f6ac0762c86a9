//! What each worker uses, read by its host's agent from /proc (VIEW-2): CPU since the
//! agent's last reading of that process and resident memory, one answer per host
//! (`PingWorkers` with `usage`), so that a view of 1,024 ranks costs 64 messages and
//! no worker any Python.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// The last reading of each process's CPU time, to give a rate at the next one.
#[derive(Default)]
pub struct Meter {
    last: Mutex<HashMap<u32, (u64, Instant)>>,
}

/// A process's CPU time in clock ticks (user + system) and resident pages, from its
/// `stat` and `statm` files; None if it cannot be read (it exited).
fn read(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ticks_of(&stat).zip(
        std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok(),
    )
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the name in
/// parentheses may hold spaces, so fields count from its closing one).
fn ticks_of(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

impl Meter {
    /// Process `pid`'s CPU use in percent of one core since this meter's last reading
    /// of it (0 at the first), and its resident memory in bytes.
    pub fn measure(&self, pid: u32) -> Option<(f64, u64)> {
        let (ticks, pages) = read(pid)?;
        let now = Instant::now();
        // SAFETY: sysconf only reads configuration values.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK).max(1) as f64,
                libc::sysconf(libc::_SC_PAGESIZE).max(1) as u64,
            )
        };
        let mut last = lock(&self.last);
        let cpu = match last.insert(pid, (ticks, now)) {
            Some((t, at)) if ticks >= t => {
                let secs = now.duration_since(at).as_secs_f64().max(1e-3);
                100.0 * (ticks - t) as f64 / hz / secs
            }
            _ => 0.0,
        };
        Some((cpu, pages * page))
    }

    /// Forgets the processes not in `alive` (exited workers).
    pub fn keep_only(&self, alive: &[u32]) {
        lock(&self.last).retain(|pid, _| alive.contains(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ticks_are_counted_after_a_name_with_spaces_and_parentheses() {
        let line = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 120 30 0 0 20 0 1 0";
        assert_eq!(ticks_of(line), Some(150));
        assert_eq!(ticks_of("garbage"), None);
    }

    #[test]
    fn this_process_is_measured_and_its_rate_follows_the_cpu_it_uses() {
        let m = Meter::default();
        let me = std::process::id();
        let (first, rss) = m.measure(me).expect("this process can be read");
        assert_eq!(first, 0.0);
        assert!(rss > 1 << 20, "{rss}");
        let end = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < end {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let (busy, _) = m.measure(me).unwrap();
        assert!(busy > 20.0, "a busy loop measured {busy}%");
        m.keep_only(&[]);
        assert_eq!(m.measure(me).unwrap().0, 0.0);
        assert!(m.measure(u32::MAX).is_none());
    }
}
