//! XFER-2 on the receiving side: the buffers of a message are pulled as it arrives
//! (a call, on the worker; a reply, on the caller), before it waits its turn, so
//! that the sender's memory is read at once and its registrations end: the sender
//! waits for that before it goes on, so what a message carries is what its buffers
//! held when it was sent. What was pulled waits here, by descriptor, until the
//! message is unpickled ([`take_message`]) or dropped unread ([`discard_message`]).

use super::{engine, recv, streams, Descriptor};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How a message whose buffers went through the engine starts (exported to Python
/// as `MESSAGE_HEADER`, which `_buffers.HEADER` is), then a little-endian u32 count and that many u32 indices of
/// the buffers that are descriptors.
pub const HEADER: &[u8; 4] = b"\x00MKX";

/// The descriptor indices of a message's `payload`, if it has [`HEADER`].
fn header_indices(payload: &[u8]) -> Option<Vec<usize>> {
    let rest = payload.strip_prefix(HEADER.as_slice())?;
    let count = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let list = rest.get(4..4usize.checked_add(count.checked_mul(4)?)?)?;
    Some(
        list.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
            .collect(),
    )
}

/// Buffers pulled when their message arrived, by descriptor, until taken.
type Prefetched = HashMap<Vec<u8>, (Instant, recv::Region)>;

fn prefetched() -> &'static Mutex<Prefetched> {
    static P: OnceLock<Mutex<Prefetched>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How long a pulled buffer waits for its message to be unpickled (as long as a
/// sender keeps a registration).
const PREFETCH_KEEP: Duration = Duration::from_secs(300);

/// XFER-2: pulls the buffers of a message as it arrives (a call, on the worker; a
/// reply, on the caller), before it waits its turn, so that the sender's memory is
/// read at once and its registrations end: the sender waits for that before it
/// goes on (`Engine::wait_until`), so what a message carries is what its buffers held
/// when it was sent. Blocking; errors are left for the unpickler to meet again.
pub fn prefetch(payload: &[u8], buffers: &[bytes::Bytes], token: &[u8]) {
    let Some(indices) = header_indices(payload) else {
        return;
    };
    let Ok(e) = engine() else {
        return; // no engine here: the unpickler meets the error again and reports it
    };
    let streams = streams();
    for i in indices {
        let Some(raw) = buffers.get(i) else { continue };
        let Ok(d) = Descriptor::decode(raw) else {
            continue;
        };
        if let Ok(region) = e.fetch_new(&d, token, streams) {
            let now = Instant::now();
            let mut p = lock(prefetched());
            p.retain(|_, (at, _)| now.duration_since(*at) < PREFETCH_KEEP);
            p.insert(raw.to_vec(), (now, region));
        }
    }
}

/// How many pulled buffers wait for their message to be taken (tests, stats).
pub fn prefetched_count() -> usize {
    lock(prefetched()).len()
}

/// The buffer [`prefetch`] pulled for descriptor `desc`, if it did.
pub fn take_prefetched(desc: &[u8]) -> Option<recv::Region> {
    lock(prefetched()).remove(desc).map(|(_, r)| r)
}

/// For each buffer of a message: the region [`prefetch`] pulled for it, taken out of
/// the table (so that it lives with the message from now on), or `None`.
pub fn take_message(payload: &[u8], buffers: &[bytes::Bytes]) -> Vec<Option<recv::Region>> {
    let mut out: Vec<Option<recv::Region>> = buffers.iter().map(|_| None).collect();
    for i in header_indices(payload).unwrap_or_default() {
        if let (Some(slot), Some(raw)) = (out.get_mut(i), buffers.get(i)) {
            *slot = take_prefetched(raw);
        }
    }
    out
}

/// Frees what [`prefetch`] pulled for a message that will never be unpickled (a
/// reply nobody waits for).
pub fn discard_message(payload: &[u8], buffers: &[bytes::Bytes]) {
    drop(take_message(payload, buffers));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_indices_are_read_and_truncated_headers_refused() {
        let mut p = HEADER.to_vec();
        p.extend(2u32.to_le_bytes());
        p.extend(1u32.to_le_bytes());
        p.extend(3u32.to_le_bytes());
        assert_eq!(header_indices(&p), Some(vec![1, 3]));
        assert_eq!(header_indices(&p[..p.len() - 1]), None);
        let mut huge = HEADER.to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        assert_eq!(header_indices(&huge), None);
        assert_eq!(header_indices(b"\x80\x05plain pickle"), None);
        assert!(take_prefetched(b"nothing was pulled for this").is_none());
    }
}
