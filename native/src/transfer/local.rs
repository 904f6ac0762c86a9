//! Direct reads on one host: one copy from the sender's memory with
//! `process_vm_readv`, split over a few threads for large buffers. The kernel may
//! refuse (Yama's ptrace scope, no CAP_SYS_PTRACE): the caller then uses TCP.

use super::client::in_parts;

/// [`vm_read`] split over a few threads for large buffers (the copy is memory
/// bound; on a machine with several cores one thread does not saturate it).
pub(super) fn vm_read_parallel(pid: u32, ptr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    const MIN_PART: usize = 8 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    let parts = threads.min(dst.len() / MIN_PART).max(1);
    if parts == 1 {
        return vm_read(pid, ptr, dst);
    }
    in_parts(dst, parts, |offset, part| {
        vm_read(pid, ptr + offset as u64, part)
    })
    .unwrap_or_else(|| Err(std::io::Error::other("a copy thread panicked")))
}

/// One copy from another process's memory (`process_vm_readv`), in as many calls as
/// the kernel needs.
fn vm_read(pid: u32, ptr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr() as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (ptr as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` is our own writable slice; the kernel checks `remote`.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::other("process_vm_readv made no progress"));
        }
        done += n as usize;
    }
    Ok(())
}
