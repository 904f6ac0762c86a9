//! Memory that transfers land in: anonymous mappings with transparent huge pages,
//! kept in a pool when released, so a steady stream of same-sized transfers (an
//! echo, a training step) writes into memory whose pages are already there.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Mappings are sized in multiples of this (a huge page).
const GRAIN: usize = 2 << 20;
/// Most bytes the pool keeps (MONARCH_TRANSFER_POOL_BYTES, default 2 GiB).
fn pool_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("MONARCH_TRANSFER_POOL_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2 << 30)
    })
}

struct Pool {
    free: HashMap<usize, Vec<usize>>, // capacity -> addresses
    bytes: usize,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        Mutex::new(Pool {
            free: HashMap::new(),
            bytes: 0,
        })
    })
}

/// A region of `len` bytes (capacity rounded up to [`GRAIN`]).
pub struct Region {
    ptr: usize,
    len: usize,
    cap: usize,
}

impl Region {
    /// A region for `len` bytes: from the pool if one fits exactly, else fresh.
    pub fn new(len: usize) -> std::io::Result<Region> {
        let cap = len.div_ceil(GRAIN).max(1) * GRAIN;
        if let Some(ptr) = {
            let mut p = lock(pool());
            let got = p.free.get_mut(&cap).and_then(Vec::pop);
            if got.is_some() {
                p.bytes -= cap;
            }
            got
        } {
            return Ok(Region { ptr, len, cap });
        }
        // SAFETY: an anonymous private mapping; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: advice on our own mapping; failure only means no huge pages.
        unsafe { libc::madvise(ptr, cap, libc::MADV_HUGEPAGE) };
        Ok(Region {
            ptr: ptr as usize,
            len,
            cap,
        })
    }

    /// Start of the region.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        {
            let mut p = lock(pool());
            if p.bytes + self.cap <= pool_limit() {
                p.bytes += self.cap;
                p.free.entry(self.cap).or_default().push(self.ptr);
                return;
            }
        }
        // SAFETY: the mapping is ours and nothing refers to it any more.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.cap) };
    }
}
