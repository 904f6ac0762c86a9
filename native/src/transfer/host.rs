//! Where this process runs, and so which buffers it may read directly: a buffer is
//! local when its process runs under the same kernel (boot id), in the same pid
//! namespace (its pid means the same process here) and in the same network
//! namespace (a process in another one counts as another host, as the test cluster's
//! hosts are: they exercise the TCP path). `MONARCH_TRANSFER_TCP=1` turns direct
//! reads off.

use super::Descriptor;
use std::sync::OnceLock;

/// This process's place: what descriptors carry and are compared with.
pub(super) struct Host {
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: [u8; 16],
    /// This process's pid and network namespaces (their inodes, combined).
    pub namespaces: u64,
}

impl Host {
    /// This process's host.
    pub fn this() -> Host {
        Host {
            boot_id: boot_id(),
            namespaces: namespaces(),
        }
    }

    /// True if the buffer `d` names lives in a process this one can read directly.
    pub fn holds(&self, d: &Descriptor) -> bool {
        d.host == self.boot_id && d.namespaces == self.namespaces
    }
}

fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: String = text.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = hex
            .get(2 * i..2 * i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or(0);
    }
    out
}

fn namespaces() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let ino = |ns: &str| {
        std::fs::metadata(format!("/proc/self/ns/{ns}"))
            .map(|m| m.ino())
            .unwrap_or(0)
    };
    ino("pid") ^ ino("net").rotate_left(32)
}

/// `MONARCH_TRANSFER_TCP=1`: use the TCP path even on one host (to measure or test
/// it; read once per process).
pub(super) fn force_tcp() -> bool {
    static FORCE: OnceLock<bool> = OnceLock::new();
    *FORCE.get_or_init(|| std::env::var("MONARCH_TRANSFER_TCP").is_ok_and(|v| v == "1"))
}
