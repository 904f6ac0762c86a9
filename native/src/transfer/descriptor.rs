//! The descriptor: what travels in a message in place of a registered buffer, and
//! its wire form. It names the buffer (engine address, registration id, length),
//! where it lives (boot id, pid namespace, pid, address: for a direct read) and the
//! mesh it belongs to (token id). Decoding never panics: anything malformed is an
//! error.

use super::frame::MAC_LEN;
use super::XferError;

/// Where a registered buffer is, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// The sender's boot id (hosts differ when these differ).
    pub host: [u8; 16],
    /// The sender's pid and network namespaces (as `Host` has them: a buffer is read
    /// directly only within both).
    pub namespaces: u64,
    /// The sender's pid.
    pub pid: u32,
    /// The sender's engine, `HOST:PORT`.
    pub addr: String,
    /// Registration id.
    pub id: u64,
    /// Address of the buffer in the sender.
    pub ptr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// SHA-256 of the mesh token it is registered under.
    pub token_id: [u8; MAC_LEN],
}

const DESC_MAGIC: &[u8; 4] = b"MKXD";
const DESC_VERSION: u8 = 1;

impl Descriptor {
    /// The wire form (what travels in place of the buffer).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.addr.len());
        out.extend_from_slice(DESC_MAGIC);
        out.push(DESC_VERSION);
        out.extend_from_slice(&self.host);
        out.extend_from_slice(&self.namespaces.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.ptr.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.token_id);
        out.push(self.addr.len() as u8);
        out.extend_from_slice(self.addr.as_bytes());
        out
    }

    /// Parses the wire form; anything malformed is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Descriptor, XferError> {
        let bad = || XferError::Invalid("malformed transfer descriptor".into());
        const FIXED: usize = 4 + 1 + 16 + 8 + 4 + 8 + 8 + 8 + MAC_LEN + 1;
        if b.len() < FIXED || &b[..4] != DESC_MAGIC || b[4] != DESC_VERSION {
            return Err(bad());
        }
        let mut at = 5;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let host: [u8; 16] = take(16).try_into().map_err(|_| bad())?;
        let namespaces = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let pid = u32::from_le_bytes(take(4).try_into().map_err(|_| bad())?);
        let id = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let ptr = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let len = u64::from_le_bytes(take(8).try_into().map_err(|_| bad())?);
        let token_id: [u8; MAC_LEN] = take(MAC_LEN).try_into().map_err(|_| bad())?;
        let alen = take(1)[0] as usize;
        if b.len() != FIXED + alen {
            return Err(bad());
        }
        let addr = std::str::from_utf8(&b[FIXED..])
            .map_err(|_| bad())?
            .to_string();
        Ok(Descriptor {
            host,
            namespaces,
            pid,
            addr,
            id,
            ptr,
            len,
            token_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine;
    use super::super::registry::register_vec;
    use super::*;

    #[test]
    fn descriptors_round_trip_and_garbage_is_refused() {
        let d = register_vec(vec![1, 2, 3], b"tok", 1);
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert!(Descriptor::decode(b"junk").is_err());
        let mut w = d.encode();
        w.push(0);
        assert!(Descriptor::decode(&w).is_err());
        assert!(engine().unwrap().drop_id(d.id));
    }
}
